"""OCI registries: the one image-reference grammar, documents (descriptors, manifests), a client
on oras-py (auth, manifests, blobs, tags) and the Referrers API with its tag fallback.

May import: builder.core (and oras, docker's credential store, requests, msgspec).
"""
