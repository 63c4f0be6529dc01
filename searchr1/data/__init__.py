"""searchr1.data"""
