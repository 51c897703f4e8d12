"""Image references (the one grammar), the registry client and referrers.
"""
