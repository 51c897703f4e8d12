"""Audit existing Dockerfiles and Apptainer definitions: parse, extract the stack, judge it with recipe's rules.

May import: core, recipe, oci (the one image-reference grammar)
"""
