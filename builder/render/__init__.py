"""Render a Spec (and its resolved pins) into a Dockerfile, an Apptainer/Singularity definition
and the lock file, written as one set under images/<recipe>/.

Modules: context (the one context), dockerfile and singularity (a thin class per format),
resolved (reading envbuild.resolved.json), rendered (render, render_for), write (write, stale),
stamp (render stamps: a no-change build knows the rendered files current by hashing its inputs).

May import: builder.core, builder.recipe; jinja2 (lazily, when a template is rendered).
"""
