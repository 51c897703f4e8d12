"""Cluster nodes: node reports (model) gathered from files, containers, ssh and Slurm, compared by ``verify`` and
checked before a job by ``doctor``.

May import: builder.core, builder.recipe, builder.image, builder.agent (payload only), builder.certify (models).
"""
