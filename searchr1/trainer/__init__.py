"""searchr1.trainer"""
