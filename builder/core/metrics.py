"""Prometheus text exposition (format 0.0.4) for node_exporter's textfile collector: one gauge per sample, ``envbuild_``
names, written atomically (the collector reads only ``*.prom``; the temporary file ends ``.tmp``)."""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .files import write_atomic
from .inputs import one_line

if TYPE_CHECKING:
    from .certificate import Certificate

#: Gauge names and their help lines (docs/operating.md lists them for dashboards).
HELP = {
    "envbuild_certify_passed": "1 when the certification passed, else 0",
    "envbuild_certify_exit_code": "exit code of the certification's verdict",
    "envbuild_busbw_gbps": "bus bandwidth per collective, dtype and message size, GB/s",
    "envbuild_busbw_floor_gbps": "the busbw floor of the run at its gate size, GB/s",
    "envbuild_scaling_efficiency": "DDP throughput at N ranks over N times one rank",
    "envbuild_certificate_age_seconds": "seconds since the certificate was finished",
    "envbuild_gate_passed": "1 when the gate passed (exit 0 or 1), else 0",
    "envbuild_gate_exit_code": "exit code of the gate",
    "envbuild_doctor_exit_code": "exit code of doctor",
    "envbuild_check_status": "a check's status: 0 pass or skip, 1 warn, 2 fail, 3 unknown",
    "envbuild_gpu_health_value": "a GPU health reading that crossed its threshold",
    "envbuild_last_run_timestamp_seconds": "when this file was written, Unix seconds",
}
#: Value of each check status (the exit code it contributes).
STATUS_VALUE = {"pass": 0, "skip": 0, "warn": 1, "fail": 2, "unknown": 3}

Sample = tuple[str, Mapping[str, str], float]


def _label(value: object) -> str:
    return one_line(value, 200).replace("\\", "\\\\").replace('"', '\\"')


def render(samples: Iterable[Sample]) -> bytes:
    """The exposition text of ``samples`` grouped by name (HELP/TYPE once each); NaN/inf dropped."""
    by_name: dict[str, list[str]] = {}
    for name, labels, value in samples:
        if not math.isfinite(value):
            continue
        lab = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()) if v is not None)
        by_name.setdefault(name, []).append(f"{name}{{{lab}}} {float(value)!r}" if lab else f"{name} {float(value)!r}")
    out = []
    for name, lines in by_name.items():
        out += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", *dict.fromkeys(lines)]
    return ("\n".join(out) + "\n").encode()


def write(path: str | os.PathLike[str], samples: Iterable[Sample], now: float) -> None:
    """``samples`` and the run's timestamp written atomically to ``path`` (exit 3 when it cannot be)."""
    write_atomic(path, render([*samples, ("envbuild_last_run_timestamp_seconds", {}, now)]))


def age_s(stamp: str | None, now: float) -> float:
    """Seconds from the ISO ``stamp`` to ``now`` (NaN when unknown: the sample is dropped)."""
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return math.nan
    return now - then.timestamp() if then.tzinfo else math.nan


def check_samples(node: str, checks: Iterable[tuple[str, str]], **labels: str) -> list[Sample]:
    """``envbuild_check_status`` of each ``(check, status)``."""
    return [("envbuild_check_status", {"node": node, "check": c, **labels}, STATUS_VALUE.get(s, 3)) for c, s in checks]


def health_samples(findings: Iterable[Mapping[str, str]]) -> list[Sample]:
    """``envbuild_gpu_health_value`` of each numeric finding (``node``, ``where``, ``what``, ``value``)."""
    out: list[Sample] = []
    for f in findings:
        try:
            value = float(str(f.get("value", "")).split()[0])
        except (ValueError, IndexError):
            continue
        out.append(("envbuild_gpu_health_value", {"node": f.get("node", ""), "check": f.get("what", ""),
                                                  "gpu": f.get("where", "")}, value))
    return out


def certificate_samples(cert: Certificate, now: float) -> list[Sample]:
    """A certify run's verdict, busbw per collective/dtype/size, scaling efficiency and age."""
    run = {"run": cert.run_id, "image": cert.image.ref}
    out: list[Sample] = [("envbuild_certify_passed", run, float(cert.verdict.passed)),
                         ("envbuild_certify_exit_code", run, cert.verdict.exit_code),
                         ("envbuild_certificate_age_seconds", run, age_s(cert.finished_at, now))]
    for name, rows in cert.collectives.items():
        out += [("envbuild_busbw_gbps", {**run, "check": name, "dtype": r.type, "size": str(r.size_bytes)},
                 r.busbw_gbps) for r in (rows if isinstance(rows, list) else [])]
    if cert.settings.min_busbw_gbps is not None:
        out.append(("envbuild_busbw_floor_gbps", {**run, "size": str(cert.settings.busbw_size)},
                    cert.settings.min_busbw_gbps))
    if cert.scaling is not None and cert.scaling.efficiency is not None:
        out.append(("envbuild_scaling_efficiency", run, cert.scaling.efficiency))
    return out
