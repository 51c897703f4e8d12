"""`envbuild lock`: resolve pip hashes, apt versions and the base digest.
"""
