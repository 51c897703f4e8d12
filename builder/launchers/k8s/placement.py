"""Where a pod runs and with what, checked whole, and the Pod Security Standard level it needs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from builder.core.errors import UsageError

from .options import DNS_SUBDOMAIN_RE, Placement, check_labels

#: Requests and limits of each container: the certify Job's per rank (times the ranks of a pod),
#: the gate's per pod; ``--requests``/``--limits`` replace them per key, for the pod. No CPU limit:
#: CFS quotas throttle the timed loops. The default memory limit adds /dev/shm's size (a
#: memory-backed emptyDir counts against it).
RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "job": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
    "gate": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
}
#: The gate's tolerations unless ``--toleration`` is given: every NoSchedule and NoExecute taint
#: (GPU nodes carry ``nvidia.com/gpu`` taints; the gate must also run on nodes it tainted).
GATE_TOLERATIONS = ("*:NoSchedule", "*:NoExecute")
_QUANTITY = {"cpu": re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,3})?)|([0-9]{1,9})m"),
             "memory": re.compile(r"([0-9]{1,15})(|k|M|G|T|Ki|Mi|Gi|Ti)")}
_UNIT = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}"
_TOLERATION_RE = re.compile(rf"(\*|{_KEY})(?:=({_NAME}))?(?::(NoSchedule|PreferNoSchedule|NoExecute))?")
_AFFINITY_RE = re.compile(rf"({_KEY})(?:=({_NAME}(?:,{_NAME}){{0,31}}))?")
_RDMA_RE = re.compile(rf"([a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/{_NAME})=([1-9][0-9]?)")
_NET = r"(?:[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_NETWORKS_RE = re.compile(rf"host|{_NET}(?:,{_NET}){{0,7}}")
#: The Multus annotation naming a pod's secondary networks (k8snetworkplumbingwg spec v1.2).
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
#: The annotations saying which Pod Security Standard level a pod needs, and why.
PSS_ANNOTATION = "envbuild.dev/pod-security"
PSS_REASON_ANNOTATION = "envbuild.dev/pod-security-reason"


def quantity(kind: str, text: str, field: str | None = None) -> Fraction:
    """A CPU (cores) or memory (bytes) quantity's value. Raises UsageError (exit 64)."""
    m = _QUANTITY[kind].fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise UsageError(f"is not a {kind} quantity (e.g. {'500m, 2' if kind == 'cpu' else '512Mi, 8Gi'})",
                         field=field or kind, value=text)
    value = (Fraction(m.group(1)) if m.group(1) else Fraction(int(m.group(2)), 1000)) if kind == "cpu" \
        else Fraction(int(m.group(1)) * _UNIT[m.group(2)])
    if value <= 0:
        raise UsageError("must be > 0", field=field or kind, value=text)
    return value


def _quantity_text(kind: str, value: Fraction) -> str:
    """``value`` as a quantity: whole cores or millicores; bytes in the largest binary unit that divides them."""
    if kind == "cpu":
        return str(int(value)) if value.denominator == 1 else f"{int(value * 1000)}m"
    n = int(value)
    unit = next(u for u in ("Ti", "Gi", "Mi", "Ki", "") if n % _UNIT[u] == 0)
    return f"{n // _UNIT[unit]}{unit}"


def resources(kind: str, placement: Placement, ranks: int = 1, shm_limit: str | None = None,
              extended: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The container's ``resources``; extended ones (GPUs, RDMA) request = limit (Kubernetes "Schedule GPUs").
    Raises UsageError (exit 64): a bad key or quantity, a request above its limit, a memory limit
    below ``shm_limit``."""
    out: dict[str, dict[str, str]] = {}
    for part in ("requests", "limits"):
        given = dict(getattr(placement, part))
        bad = sorted(set(given) - set(_QUANTITY))
        if bad:
            raise UsageError("is not cpu or memory", field=f"--{part}", value=bad[0])
        base = {k: quantity(k, v) * ranks for k, v in RESOURCES[kind][part].items()}
        if part == "limits" and shm_limit and "memory" in base:  # the default leaves room for /dev/shm
            base["memory"] += quantity("memory", shm_limit)
        values = {k: _quantity_text(k, v) for k, v in base.items()}
        values.update(given)
        out[part] = {k: v for k, v in sorted(values.items()) if v != "none"}
        for k, v in out[part].items():
            quantity(k, v, f"--{part} {k}")
    for k, limit in out["limits"].items():
        if k in out["requests"] and quantity(k, out["requests"][k]) > quantity(k, limit):
            raise UsageError(f"is above the {k} limit {limit}", field=f"--requests {k}", value=out["requests"][k])
    mem = out["limits"].get("memory")
    if mem and shm_limit and quantity("memory", shm_limit) >= quantity("memory", mem):
        raise UsageError(f"is not above /dev/shm's {shm_limit} (a memory-backed emptyDir counts against it)",
                         field="--limits memory", value=mem)
    for name, count in (extended or {}).items():
        for part_values in out.values() if count else ():
            part_values[name] = str(count)
    return {k: v for k, v in out.items() if v}


def toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE][:EFFECT]`` (``*``: every key) as a toleration. Raises UsageError (exit 64)."""
    m = _TOLERATION_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None or (m.group(1) == "*" and m.group(2) is not None):
        raise UsageError("is not KEY[=VALUE][:EFFECT] (* for every key; EFFECT NoSchedule, PreferNoSchedule "
                         "or NoExecute)", field="--toleration", value=text)
    key, value, effect = m.groups()
    out = {} if key == "*" else {"key": next(iter(check_labels({key: ""}, "toleration")))}
    out.update({"operator": "Equal", "value": value} if value is not None else {"operator": "Exists"})
    if effect:
        out["effect"] = effect
    return out


def node_affinity(items: tuple[str, ...]) -> dict[str, Any] | None:
    """``KEY=V1,V2`` (In) and ``KEY`` (Exists) items as one required node selector term (all
    must hold). Raises UsageError (exit 64)."""
    exprs = []
    for text in items:
        m = _AFFINITY_RE.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise UsageError("is not KEY or KEY=VALUE[,VALUE]", field="--node-affinity", value=text)
        check_labels({m.group(1): ""}, "node affinity")
        exprs.append({"key": m.group(1), "operator": "In", "values": m.group(2).split(",")} if m.group(2)
                     else {"key": m.group(1), "operator": "Exists"})
    if not exprs:
        return None
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}


def place(pod_spec: dict[str, Any], placement: Placement, tolerations: list[dict[str, str]] | None = None,
          affinity: dict[str, Any] | None = None) -> None:
    """Add the placement's fields to ``pod_spec`` (``tolerations``: those to put first;
    ``affinity``: the pod (anti-)affinity to merge). Raises UsageError (exit 64)."""
    if placement.priority_class is not None:
        if not (DNS_SUBDOMAIN_RE.fullmatch(placement.priority_class) and len(placement.priority_class) <= 253):
            raise UsageError("is not a PriorityClass name", field="--priority-class", value=placement.priority_class)
        pod_spec["priorityClassName"] = placement.priority_class
    if placement.node_selector:
        pod_spec["nodeSelector"] = check_labels(dict(placement.node_selector))
    tols = [*(tolerations or []), *(toleration(t) for t in placement.tolerations)]
    if tols:
        pod_spec["tolerations"] = [dict(t) for i, t in enumerate(tols) if t not in tols[:i]]
    nodes = node_affinity(placement.node_affinity)
    merged = {**({"nodeAffinity": nodes} if nodes else {}), **(affinity or {})}
    if merged:
        pod_spec["affinity"] = merged


def check_rdma(resource: str | None, network: str | None) -> tuple[str, int] | None:
    """``(resource name, count)`` of ``--rdma NAME=N`` (an extended resource such as
    ``rdma/rdma_shared_device_a=1`` or ``nvidia.com/hostdev=1``). Raises UsageError (exit 64)."""
    if resource is None:
        if network is not None:
            raise UsageError("goes with --rdma", field="--rdma-network", value=network)
        return None
    m = _RDMA_RE.fullmatch(resource)
    if m is None or m.group(1) == "nvidia.com/gpu" or m.group(1).split("/")[0].endswith("kubernetes.io"):
        raise UsageError("is not an extended resource NAME=COUNT (e.g. rdma/rdma_shared_device_a=1, "
                         "nvidia.com/hostdev=1; COUNT 1..99)", field="--rdma", value=resource)
    if network is not None and not _NETWORKS_RE.fullmatch(network):
        raise UsageError("is not host or a list of network attachment names", field="--rdma-network", value=network)
    return m.group(1), int(m.group(2))


_ROOT = "; as root, since Kubernetes gives a non-root process no added capability"
#: Why each pod needs its level (the annotation :data:`PSS_REASON_ANNOTATION`).
PSS_REASONS = {
    "restricted": "non-root, no capabilities, no host namespaces or host paths",
    "rdma": "IPC_LOCK to pin RDMA memory, which neither baseline nor restricted allows" + _ROOT,
    "rdma-host": "IPC_LOCK to pin RDMA memory and hostNetwork for the RDMA interfaces, which baseline and "
                 "restricted do not allow" + _ROOT,
}


def pss_annotations(reason: str) -> dict[str, str]:
    """The level a pod needs and why (:data:`PSS_REASONS` ``reason``) as its annotations."""
    return {PSS_ANNOTATION: "restricted" if reason == "restricted" else "privileged",
            PSS_REASON_ANNOTATION: PSS_REASONS[reason]}
