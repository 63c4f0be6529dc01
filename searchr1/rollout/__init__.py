"""searchr1.rollout"""
