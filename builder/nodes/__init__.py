"""Node reports: gathering, verify and doctor.
"""
