"""Render a lock into a Dockerfile and an Apptainer/Singularity definition.
"""
