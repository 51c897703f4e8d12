"""Shared by every stage: the error type and exit codes, bounded input reading, the typed
documents' one mechanism, files written whole, the images-dir layout.

May import: the standard library, msgspec, yaml (jinja2 only inside files.template_environment);
nothing of builder outside core.
"""
