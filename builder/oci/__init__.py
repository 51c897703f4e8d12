"""OCI registries: the one image-reference grammar, documents (descriptors, manifests), a client
on oras-py and the Referrers API with its tag fallback."""
