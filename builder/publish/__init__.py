"""Publish and pull by digest with the certificate as an in-toto attestation.
"""
