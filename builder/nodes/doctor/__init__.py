"""Preflight checks before a multi-node job, one module each, naming the public failure it catches
(``shared/reference/multinode.md``). Statuses follow Meta GCM's health checks, worst wins."""

from __future__ import annotations

from .base import ALL_CHECKS, FAIL, PASS, SKIP, WARN, Options
from .gpu_health import health_options
from .render import render
from .runner import doctor
from .stale_containers import stale_containers

__all__ = ["ALL_CHECKS", "FAIL", "PASS", "SKIP", "WARN", "Options", "doctor", "health_options", "render",
           "stale_containers"]
