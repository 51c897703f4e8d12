"""Publish certified images by digest with their certificate; pull only what is certified."""
