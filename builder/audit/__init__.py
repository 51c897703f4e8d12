"""Audit the Dockerfiles and Apptainer/Singularity definitions people already have: parse
them, extract the stack (base, CUDA, OS, Python, torch, NCCL...) and judge it with recipe's rules.

May import: core, recipe, oci (the one image-reference grammar)
"""
