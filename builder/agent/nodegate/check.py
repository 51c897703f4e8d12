"""The comparison of one probe document with a gate spec: pure, stdlib only."""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

#: A Kubernetes label value: at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label (or taint) value; ``"failed"`` when nothing is left."""
    value = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:63].strip("._-")
    return value if value and _LABEL_VALUE.fullmatch(value) else "failed"


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"570.124.06"`` as ``(570, 124, 6)``; None when it is not dotted numbers."""
    if not isinstance(text, str) or not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6}){0,3}", text):
        return None
    return tuple(int(x) for x in text.split("."))


def _cmp(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    n = max(len(have), len(want))
    a, b = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "=": a == b, "==": a == b}.get(op, False)


def value_at(doc: Any, path: Sequence[str]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _driver(spec: dict[str, Any], driver: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    rule = spec.get("driver") or {}
    have = version_tuple(driver)
    if have is None:
        return [], []
    low, warn = rule.get("fail_below"), rule.get("warn_below")
    fail_below, warn_below = version_tuple(low), version_tuple(warn)
    why = str(rule.get("why") or "")
    if fail_below and _cmp(have, "<", fail_below):
        for alt in rule.get("unless") or []:
            conds = [(op, version_tuple(v)) for op, v in alt]
            if conds and all(v is not None and _cmp(have, op, v) for op, v in conds):
                return [], [f"driver: {driver} is below {low}; accepted only on GPUs of the brand the image "
                            f"names ({why})"]
        return [("driver", f"driver: {driver} is below {low} ({why})")], []
    if warn_below and _cmp(have, "<", warn_below):
        return [], [f"driver: {driver} is below {warn}: minor-version compatibility only ({why})"]
    return [], []


def _local(spec: dict[str, Any], doc: dict[str, Any]) -> list[tuple[str, str]]:
    checks = spec.get("checks") or []
    out: list[tuple[str, str]] = []
    gpus = doc.get("gpus") or []
    if "gpu-uuid" in checks:
        seen: dict[str, int] = {}
        for g in gpus:
            uuid = str(g.get("uuid"))
            seen[uuid] = seen.get(uuid, 0) + 1
        dups = sorted(u for u, n in seen.items() if n > 1)
        if dups:
            out.append(("gpu-uuid", "gpu-uuid: duplicate GPU {}".format(", ".join(dups))))
    if "gpu-processes" in checks:
        procs = doc.get("gpu_processes") or []
        if procs:
            held = ", ".join(f"pid {p.get('pid')} on GPU {p.get('gpu_index')}" for p in procs[:10])
            out.append(("gpu-processes", f"gpu-processes: {len(procs)} compute process(es) hold GPU memory: {held}"))
    return out


def age_s(spec: dict[str, Any], now: datetime.datetime | None = None) -> float | None:
    """Seconds since the certificate's ``made_at``; None when it is not a zoned ISO time."""
    try:
        t = datetime.datetime.fromisoformat(str(spec.get("made_at")).replace("Z", "+00:00"))
        return ((now or datetime.datetime.now(datetime.timezone.utc)) - t).total_seconds()
    except (ValueError, TypeError):
        return None


def age_warnings(spec: dict[str, Any], now: datetime.datetime | None = None) -> list[str]:
    """A warning when the certificate is older than ``max_age_s`` or of unknown age (the host gate's rule)."""
    made, limit, age = spec.get("made_at"), spec.get("max_age_s"), age_s(spec, now)
    if age is None:
        return [f"certificate: no valid made_at ({_shown(made)}): its age is unknown"]
    if isinstance(limit, (int, float)) and age > limit:
        return [f"certificate: made {_shown(made)}, {int(age)} s ago: older than max_age_s {limit:.0f} s; "
                "certify the image again"]
    return []


def statuses(spec: dict[str, Any], failures: list[tuple[str, str]], warnings: list[str]) -> dict[str, int]:
    """Each check's status for the metrics: 0 pass, 1 warn, 2 fail (``builder.core.metrics.STATUS_VALUE``)."""
    names = [str(f.get("field")) for f in spec.get("fields") or []] + ["driver", "certificate"]
    out = dict.fromkeys(names + [str(c) for c in spec.get("checks") or []], 0)
    for line in warnings:
        out[line.split(":")[0]] = 1
    out.update((key, 2) for key, _ in failures)
    return out


def evaluate(spec: dict[str, Any], doc: dict[str, Any],
             now: datetime.datetime | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """``(failures as (reason for the taint, line ending in its class and next step), warnings)`` of probe ``doc``
    under ``spec``."""
    failures: list[tuple[str, str]] = []
    for f in spec.get("fields") or []:
        have = value_at(doc, f.get("path") or [])
        if have != f.get("want"):
            failures.append((str(f.get("field")), "{}: certified {}, this node {}".format(
                f.get("field"), _shown(f.get("want")), _shown(have))))
    fails, warnings = _driver(spec, doc.get("driver"))
    failures += fails + _local(spec, doc)
    warnings += age_warnings(spec, now)
    for err in (doc.get("errors") or [])[:3]:
        warnings.append(f"probe: {str(err)[:300]}")
    steps = spec.get("next_steps") or {}
    return [(k, "{} [{}] next: {}".format(line, *steps[k]) if k in steps else line) for k, line in failures], warnings


def _shown(value: Any) -> str:
    text = "(absent)" if value is None else str(value)
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)[:200]
