"""`envbuild lock`: resolve the base image digest, pip hashes and apt versions into
images/<recipe>/envbuild.resolved.json, then render again with them.

Modules: base (base digest; the registry client is an argument), pip, apt, lock.

May import: builder.core, builder.recipe, builder.render, builder.image, builder.oci.
"""
