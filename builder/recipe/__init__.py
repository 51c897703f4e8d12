"""Recipes: load the YAML into the Recipe model, check it with the compatibility rules into a
Spec, and the recipe stage's documents (Recipe, CertifySettings, Lock, Resolved).

Modules: fields (value types), model (documents), load (file -> Recipe), facts (compat.yaml),
rules/ (compatibility rules, one module per topic), spec (Spec, Finding), lock (lock bytes,
hash, reading a lock back).

May import: builder.core; msgspec, yaml, packaging.
"""
