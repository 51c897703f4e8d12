"""Preflight checks before a multi-node job, one module each, naming the public failure it catches
(``shared/reference/multinode.md``). Statuses follow Meta GCM's health checks, worst wins."""

from __future__ import annotations

from .base import (
                   ALL_CHECKS,
                   DEFAULT_MIN_SHM,
                   DEFAULT_PORT,
                   DEFAULT_STALE_AFTER_S,
                   DEFAULT_STRAGGLER_RATIO,
                   FAIL,
                   PASS,
                   SKIP,
                   UNKNOWN,
                   WARN,
                   Check,
                   HealthOptions,
                   Options,
                   human_bytes,
)
from .gpu_health import health_options
from .render import render
from .runner import DoctorResult, doctor
from .stale_containers import stale_containers

__all__ = ["ALL_CHECKS", "DEFAULT_MIN_SHM", "DEFAULT_PORT", "DEFAULT_STALE_AFTER_S", "DEFAULT_STRAGGLER_RATIO",
           "FAIL", "PASS", "SKIP", "UNKNOWN", "WARN", "Check", "DoctorResult", "HealthOptions", "Options", "doctor",
           "health_options", "human_bytes", "render", "stale_containers"]
