"""Shared by every stage: the error type and exit codes, bounded input reading, the typed
documents' one mechanism, files written whole, the images-dir layout."""
