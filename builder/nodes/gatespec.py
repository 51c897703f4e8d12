"""The gate spec of the Kubernetes DaemonSet (``envbuild.gate-spec/1``): what the in-pod gate
compares, taken from a reference by the same rules as ``verify``, and each failure's class and next step."""

from __future__ import annotations

import re
from typing import Any

from packaging.version import Version

from builder.core.errors import FailureClass, Unreachable, next_step

from .doctor.base import CHECK_CLASS
from .reference import Reference
from .verify.against import DEFAULT_MAX_AGE_S
from .verify.floor import default_floors, hard_floor
from .verify.result import FIELD_CLASS
from .verify.rules import ENV_MUST_MATCH, MUST_MATCH, env_rule

SPEC_SCHEMA = "envbuild.gate-spec/1"
#: The local checks the in-pod gate runs.
POD_CHECKS = ("gpu-uuid",)
_LOCK_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")


def lock_label(ref: Reference) -> str:
    """Label ``envbuild.dev/certified``: the lock hash's 12 hex or ``unknown``; Unreachable (3): bad hash."""
    value = ref.run.lock_hash if ref.run else None
    if value is None:
        return "unknown"
    if _LOCK_HASH_RE.fullmatch(value) is None:
        raise Unreachable("is not a lock hash (sha256: and 64 hex)", file=ref.name, field="lock_hash", value=value)
    return value[7:19]


def _driver(ref: Reference, floors: dict[str, dict]) -> dict[str, Any]:
    req = ref.requirement
    variant = floors.get(".".join((req.torch_cuda or "").split(".")[:2])) if req.torch_cuda else None
    hard, unless = hard_floor(req, floors)
    lows = [v for v in (variant["minor_compat"] if variant else None, hard) if v]
    fail_below = max(lows, key=Version) if lows else None
    why = []
    if variant:
        why.append(f"torch CUDA {req.torch_cuda}: >= {variant['minor_compat']} runs it, >= {variant['ga']} fully")
    if hard:
        why.append(f"NVIDIA_REQUIRE_CUDA needs >= {hard} ({req.source})")
    return {"fail_below": fail_below, "unless": [[[op, v] for _, op, v in alt] for alt in unless],
            "warn_below": variant["ga"] if variant else None, "why": "; ".join(why)}


def gate_spec(ref: Reference, max_age_s: float = DEFAULT_MAX_AGE_S,
              floors: dict[str, dict] | None = None) -> dict[str, Any]:
    """The gate spec of ``ref``, plain JSON data."""
    floors = default_floors() if floors is None else floors
    rules = [r for r in MUST_MATCH if r.path] + [env_rule(v) for v in ENV_MUST_MATCH]
    fields = []
    for rule in rules:
        want = rule.value(ref.report)
        if rule.name == "nccl.net_plugin":  # compared by its content hash in the pod
            plugin = ref.report.nccl.net_plugin
            if plugin is None:
                continue
            want = plugin.sha256
        fields.append({"field": rule.name, "path": list(rule.path or ()), "want": want})
    run, keys = ref.run, [str(f["field"]) for f in fields] + ["driver", *POD_CHECKS]
    classes = {k: CHECK_CLASS.get(k) or FIELD_CLASS.get(k, FailureClass.IMAGE) for k in keys}
    return {"schema": SPEC_SCHEMA, "certificate": ref.name, "made_at": ref.made_at, "max_age_s": max_age_s,
            "envbuild_version": run.envbuild_version if run else None, "label_value": lock_label(ref),
            "fields": fields, "driver": _driver(ref, floors), "checks": list(POD_CHECKS),
            "next_steps": {k: [str(c), next_step(c)] for k, c in classes.items()}}
