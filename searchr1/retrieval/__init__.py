"""searchr1.retrieval"""
