"""searchr1.algorithms"""
