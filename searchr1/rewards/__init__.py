"""searchr1.rewards"""
