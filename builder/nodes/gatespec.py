"""The gate spec of the Kubernetes DaemonSet (schema ``envbuild.gate-spec/1``, read by
:mod:`builder.agent.nodegate` in each pod): what the in-pod gate compares, taken from a
reference by the same rules as ``verify`` (one source of truth for which fields must match
and what they must be).

* ``fields``: every must-match rule with a probe path (:class:`~.verify.rules.Rule`
  ``path``) and the reference's value, and the transport variables
  (:data:`~.verify.rules.ENV_MUST_MATCH`: set or unset, as in the reference);
* ``driver``: ``fail_below`` the higher of the torch variant's minor-version floor and the
  GA driver the image's ``NVIDIA_REQUIRE_CUDA`` needs (its ``brand``/``arch`` alternatives as
  ``unless``: a warning, the brand decides), ``warn_below`` the variant's GA driver;
* ``checks``: ``gpu-uuid`` (duplicate GPUs). ``gpu-processes`` is left out: a DaemonSet checks
  again while jobs run, and a job's own processes are not a fault.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from .reference import Reference
from .verify.against import DEFAULT_MAX_AGE_S
from .verify.floor import default_floors, hard_floor
from .verify.rules import ENV_MUST_MATCH, MUST_MATCH, env_rule

SPEC_SCHEMA = "envbuild.gate-spec/1"
#: The local checks the in-pod gate runs.
POD_CHECKS = ("gpu-uuid",)


def lock_label(ref: Reference) -> str:
    """The value of the node label ``envbuild.dev/certified``: the lock hash, 12 hex
    (``sha256:`` dropped); ``unknown`` when the reference has none."""
    run = ref.run
    value = (run.lock_hash if run else None) or ""
    hexpart = value.split(":", 1)[-1][:12]
    return hexpart if len(hexpart) == 12 and all(c in "0123456789abcdef" for c in hexpart) else "unknown"


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
    """The gate spec of ``ref`` (see the module docstring), plain JSON data."""
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
    run = ref.run
    return {"schema": SPEC_SCHEMA, "certificate": ref.name, "made_at": ref.made_at, "max_age_s": max_age_s,
            "envbuild_version": run.envbuild_version if run else None, "label_value": lock_label(ref),
            "fields": fields, "driver": _driver(ref, floors), "checks": list(POD_CHECKS)}
