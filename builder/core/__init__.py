"""Shared by every stage: the error type and exit codes, bounded input reading, files.
"""
