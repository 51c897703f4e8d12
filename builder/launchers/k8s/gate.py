"""The node gate's objects (``envbuild k8s gate``): a DaemonSet labels a passing node certified and taints a failing one
NoSchedule (untainted once it passes again), so Jobs can select certified nodes; each pod serves its gauges for
Prometheus. Its ConfigMap is named by the hash of code and spec, so that a new certificate rolls the pods."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import UsageError

from . import objects as pod
from . import options as place
from .objects import CodeData, code_data
from .options import Placement, check_labels, check_namespace, require_digest

NAME = "envbuild-gate"
#: Where the gate spec is mounted (a key of the ConfigMap).
SPEC_KEY = "gate-spec.json"
SPEC_PATH = f"{pod.CODE_MOUNT}/{SPEC_KEY}"
#: The node label and taint the gate sets (:mod:`builder.agent.nodegate.kube`).
LABEL = "envbuild.dev/certified"
TAINT = "envbuild.dev/uncertified"
#: The node condition the gate sets (Node Problem Detector convention: ``True`` is the problem).
CONDITION = "EnvbuildUncertified"
CONTAINER = "gate"
DEFAULT_INTERVAL_S = 600
#: The pod's metrics port (``/metrics``), named in the ``prometheus.io/*`` scrape annotations.
METRICS_PORT = 9403
#: The gate's own namespace: rendered as a Namespace enforcing the DaemonSet's Pod Security level.
NAMESPACE = "envbuild-system"


@dataclass(frozen=True)
class GateSpec:
    image: str
    spec: Mapping[str, Any]
    label_value: str
    namespace: str = NAMESPACE
    interval_s: int = DEFAULT_INTERVAL_S
    placement: Placement = field(default_factory=Placement)
    allow_tag: bool = False
    code: Mapping[str, str] | None = None


@dataclass(frozen=True)
class GateContext:
    """:class:`GateSpec` checked, with the ConfigMap's data."""

    gate: GateSpec
    image: str
    labels: dict[str, str]
    code: CodeData
    configmap_name: str
    resources: dict[str, Any]


def gate_context(gate: GateSpec) -> GateContext:
    """EnvbuildError: (exit 2) a tag-only image; (exit 64) a bad namespace, interval, placement or label."""
    image = require_digest(gate.image, gate.allow_tag)
    check_namespace(gate.namespace)
    if not 10 <= gate.interval_s <= 86400:
        raise UsageError("must be 10..86400 seconds", field="--interval", value=gate.interval_s)
    resources = place.resources("gate", gate.placement)
    _pod_spec({}, gate.placement)
    labels = check_labels({"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "envbuild",
                           "envbuild.lock-hash": gate.label_value})
    spec_text = json.dumps(gate.spec, indent=2, sort_keys=True) + "\n"
    base = code_data(gate.code)
    data = {**base.data, SPEC_KEY: spec_text}
    items = [*base.items, {"key": SPEC_KEY, "path": SPEC_KEY}]
    digest = hashlib.sha256((base.sha256 + "\0" + spec_text).encode()).hexdigest()
    code = CodeData(data=dict(sorted(data.items())), items=items, sha256=digest)
    return GateContext(gate=gate, image=image, labels=labels, code=code,
                       configmap_name=f"{NAME}-{digest[:12]}", resources=resources)


def _meta(ctx: GateContext, name: str, namespaced: bool = True) -> dict[str, Any]:
    return pod.metadata(name, ctx.labels, ctx.gate.namespace if namespaced else None)


def service_account(ctx: GateContext) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ctx, NAME)}


def namespace(ctx: GateContext) -> dict[str, Any]:
    """The gate's Namespace, enforcing (and warning, auditing at) the DaemonSet's level."""
    level = place.pss_annotations("restricted")[place.PSS_ANNOTATION]
    meta = _meta(ctx, ctx.gate.namespace, namespaced=False)
    meta["labels"].update({f"pod-security.kubernetes.io/{mode}": level for mode in ("audit", "enforce", "warn")})
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def cluster_role(ctx: GateContext) -> dict[str, Any]:
    """Read and patch nodes (label and taint) and their status (the condition), nothing else."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": _meta(ctx, NAME, namespaced=False),
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                      {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]}


def cluster_role_binding(ctx: GateContext) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": _meta(ctx, NAME, namespaced=False),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ctx.gate.namespace}]}


def configmap(ctx: GateContext) -> dict[str, Any]:
    """The immutable ConfigMap with the in-image code and the gate spec."""
    return pod.code_configmap(ctx.configmap_name, ctx.labels, ctx.gate.namespace, ctx.code)


def _container(ctx: GateContext) -> dict[str, Any]:
    env = [*pod.base_env(), {"name": "ENVBUILD_IMAGE", "value": ctx.image},
           {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
           {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility,compute"}]
    return {
        "name": CONTAINER, "image": ctx.image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "nodegate", SPEC_PATH, "--interval", str(ctx.gate.interval_s),
                    "--metrics-port", str(METRICS_PORT)],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": ctx.resources,
        "securityContext": pod.container_security_context(),
        "volumeMounts": [{"name": pod.CODE_VOLUME, "mountPath": pod.CODE_MOUNT, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod_spec(pod_spec: dict[str, Any], placement: Placement) -> dict[str, Any]:
    """``pod_spec`` placed: :data:`~.options.GATE_TOLERATIONS` unless given (then its own taint first: rechecks it)."""
    own = ([{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}] if placement.tolerations
           else [place.toleration(t) for t in place.GATE_TOLERATIONS])
    place.place(pod_spec, placement, tolerations=own)
    return pod_spec


def daemonset(ctx: GateContext) -> dict[str, Any]:
    """The DaemonSet: one gate pod per node of the placement."""
    selector = {"app.kubernetes.io/name": NAME}
    pod_spec: dict[str, Any] = _pod_spec({
        "serviceAccountName": NAME, "automountServiceAccountToken": True, "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10, "securityContext": pod.pod_security_context(),
    }, ctx.gate.placement)
    pod_spec["containers"] = [_container(ctx)]
    pod_spec["volumes"] = [pod.code_volume(ctx.configmap_name, ctx.code.items), {"name": "tmp", "emptyDir": {}}]
    meta = _meta(ctx, NAME)
    meta["annotations"] = place.pss_annotations("restricted")
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta,
        "spec": {"selector": {"matchLabels": selector},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
                 "template": {"metadata": {"labels": dict(ctx.labels),
                                           "annotations": {**meta["annotations"], **scrape}}, "spec": pod_spec}},
    }
