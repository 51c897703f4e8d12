"""Publish certified images by digest with their certificate as an in-toto attestation,
and pull only what is certified for this node's hardware.

May import: builder.core, builder.recipe, builder.image, builder.oci, builder.certify (models),
builder.agent (the node probe at pull).
"""
