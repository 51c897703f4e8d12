"""What a Kubernetes run is rendered from and where its pods run, checked whole (Kubernetes "Labels and
Selectors" -> "Syntax and character set"), and the Pod Security Standard level each pod needs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from builder.core.errors import EnvbuildError, UsageError
from builder.oci import reference

from ..base import SOCKET_IFNAME_RE, LaunchSpec

_RUN_ID_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
_NAMESPACE_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
#: An RFC 1123 subdomain (object names such as a TrainJob runtime, label key prefixes).
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_run_id(run_id: str) -> str:
    """``run_id``, checked to fit object names. Raises EnvbuildError (exit 64)."""
    if not _RUN_ID_RE.fullmatch(run_id or ""):
        raise UsageError("is not a run id (1 to 40 of [a-z0-9-], alphanumeric at both ends)",
                         field="run_id", value=run_id)
    return run_id


def object_name(run_id: str) -> str:
    """Name of the Job, Service and TrainJob of run ``run_id``: ``envbuild-<run>``."""
    return f"envbuild-{check_run_id(run_id)}"


def configmap_name(run_id: str) -> str:
    """Name of the code ConfigMap of run ``run_id``: ``envbuild-<run>-code``."""
    return f"{object_name(run_id)}-code"


def master_addr(run_id: str, kubeflow: bool = False) -> str:
    """DNS name of node 0 inside the namespace."""
    name = object_name(run_id)
    return f"{name}-node-0-0.{name}" if kubeflow else f"{name}-0.{name}"


def check_labels(labels: Mapping[str, str], what: str = "label") -> dict[str, str]:
    """Check label (or annotation) keys and values; returns them sorted. Raises UsageError (exit 64)."""
    out = {}
    for key, value in sorted(labels.items()):
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN_RE.fullmatch(prefix))) \
                or not _LABEL_NAME_RE.fullmatch(name):
            raise UsageError(f"is not a Kubernetes {what} key", field=what, value=key)
        value = str(value)
        if what == "label" and value and not _LABEL_NAME_RE.fullmatch(value):
            raise UsageError(f"is not a Kubernetes label value (key {key})", field=what, value=value)
        out[key] = value
    return out


def manifest_labels(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of every object (envbuild's win over ``spec.labels``, ``$ENVBUILD_EXTRA_LABELS``); exit 64, 2."""
    from ..base import labels_for

    return check_labels({**labels_for(spec, environ), "app.kubernetes.io/name": "envbuild",
                         "app.kubernetes.io/managed-by": "envbuild"})


def require_digest(text: str, allow_tag: bool = False, candidates: Sequence[str] = ()) -> str:
    """``text`` if it pins a digest; EnvbuildError: (2) no digest, not ``allow_tag``; (64) not a reference."""
    ref = reference.parse(text, field="image")
    if ref.by_digest or allow_tag:
        return text
    hint = f"use {candidates[0]}" if candidates else "push it and use REPO@sha256:<digest>"
    raise EnvbuildError(
        f"is not pinned by digest: pods would run whatever the tag points to then; {hint} "
        "(or --allow-tag on a development cluster)",
        field="image", value=text,
    )


#: Default ``ttlSecondsAfterFinished`` of the Job (seconds): finished Jobs are removed.
DEFAULT_TTL_S = 3600
#: API version of the Kubeflow Trainer v2 TrainJob.
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
#: Default ClusterTrainingRuntime of a TrainJob (ships with Kubeflow Trainer).
DEFAULT_RUNTIME = "torch-distributed"
#: Kubernetes releases whose OpenAPI schemas the manifests are checked against in tests.
K8S_VERSIONS = ("1.30", "1.35")
#: Values of ``spread``.
SPREADS = ("preferred", "required", "none")


@dataclass(frozen=True)
class Placement:
    """Scheduling and resources of the pods (values as the command line gives them)."""

    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()
    node_affinity: tuple[str, ...] = ()
    priority_class: str | None = None


@dataclass(frozen=True)
class K8sOptions:
    """How to render and apply (``rdma``: ``--rdma NAME=N``; ``rdma_network``: ``host`` or secondary; ``namespace``)."""

    kubeflow: bool = False
    runtime: str = DEFAULT_RUNTIME
    allow_tag: bool = False
    ttl_s: int = DEFAULT_TTL_S
    spread: str = "preferred"
    socket_ifname: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    placement: Placement = field(default_factory=Placement)
    namespace: str | None = None
    rdma: str | None = None
    rdma_network: str | None = None


#: The default options (frozen: one object serves every call).
DEFAULT_OPTIONS = K8sOptions()


def check_options(options: K8sOptions) -> None:
    """The options that need no spec, checked before anything is contacted; EnvbuildError (exit 64)."""
    if options.spread not in SPREADS:
        raise UsageError("is not preferred, required or none", field="spread", value=options.spread)
    if not isinstance(options.ttl_s, int) or options.ttl_s < 0:
        raise UsageError("must be >= 0", field="ttl_s", value=options.ttl_s)
    check_ifname(options.socket_ifname)
    if options.kubeflow and not DNS_SUBDOMAIN_RE.fullmatch(options.runtime or ""):
        raise UsageError("is not a runtime name", field="runtime", value=options.runtime)
    if options.namespace is not None:
        check_namespace(options.namespace)
    resources("job", options.placement)
    place({}, options.placement)
    check_rdma(options.rdma, options.rdma_network)


def check_namespace(name: str) -> str:
    """Check a namespace name (an RFC 1123 label); returns it. Raises UsageError (exit 64)."""
    if not (isinstance(name, str) and _NAMESPACE_RE.fullmatch(name)):
        raise UsageError("is not a Kubernetes namespace name", field="--namespace", value=name)
    return name


def check_ifname(value: str | None) -> None:
    """Raises EnvbuildError (exit 64) for a ``socket_ifname`` that is not an interface name list."""
    if value is not None and not SOCKET_IFNAME_RE.fullmatch(value):
        raise UsageError("is not a network interface name list", field="socket_ifname", value=value)

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
    """The container's ``resources``; extended ones (GPUs, RDMA) request = limit (Kubernetes "Schedule GPUs"). Raises
    UsageError (exit 64): a bad key or quantity, a request above its limit, a memory limit below ``shm_limit``."""
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
    """``KEY=V1,V2`` (In) and ``KEY`` (Exists) items as one required node selector term; UsageError (exit 64)."""
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
    """Add the placement to ``pod_spec`` (``tolerations`` first; ``affinity`` merged); UsageError (exit 64)."""
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
    """``(resource, count)`` of ``--rdma NAME=N`` (``rdma/rdma_shared_device_a=1``); UsageError (64)."""
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
