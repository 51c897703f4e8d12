"""Certification: settings, run, verdict and certificate.
"""
