"""Recipes: load the YAML, the strict schema, the compatibility rules and the lock.
"""
