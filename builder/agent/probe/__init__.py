"""Describe the software and GPUs of this machine or image as one JSON document. Stdlib only (Python >= 3.8): it runs in
any image and on bare hosts. Never raises for a missing component: problems go into ``errors``."""

from __future__ import annotations

from .collect import SCHEMA, collect, main

__all__ = ["SCHEMA", "collect", "main"]
