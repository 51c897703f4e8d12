"""The Kubernetes objects of the node gate (``envbuild k8s gate``), as plain dicts of the API.

A DaemonSet runs the gate (:mod:`builder.agent.nodegate`) in the certified image on every
node: it probes the node, compares the probe with the gate spec (rendered from the
certificate by :mod:`builder.nodes.gatespec`) and labels a passing node
``envbuild.dev/certified=<lock hash, 12 hex>`` or taints a failing one
``envbuild.dev/uncertified=<reason>:NoSchedule``; it checks again every ``interval_s``.
Jobs then select certified nodes with ``nodeSelector: {envbuild.dev/certified: <hash>}``.

Objects (one builder each, files in :data:`builder.launchers.k8s.manifests.MODES` ``gate``):
a ServiceAccount; a ClusterRole that may ``get`` and ``patch`` nodes (nothing else) and its
ClusterRoleBinding; an immutable ConfigMap with the in-image code and ``gate-spec.json``
(named by the hash of both, so a new certificate rolls the pods); the DaemonSet. The pods
run under the "restricted" Pod Security Standard, read-only root filesystem, tolerate the
taint they set (a failing node is checked again and untainted once it passes), request no
GPU (``NVIDIA_VISIBLE_DEVICES=all`` lets the NVIDIA runtime show the node's GPUs and driver,
as monitoring DaemonSets such as dcgm-exporter do) and little CPU and memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode

from . import pod
from .code import CodeData, code_data
from .naming import DNS_SUBDOMAIN_RE, check_labels, require_digest

NAME = "envbuild-gate"
#: Where the gate spec is mounted (a key of the ConfigMap).
SPEC_KEY = "gate-spec.json"
SPEC_PATH = f"{pod.CODE_MOUNT}/{SPEC_KEY}"
#: The node label and taint the gate sets (:mod:`builder.agent.nodegate.kube`).
LABEL = "envbuild.dev/certified"
TAINT = "envbuild.dev/uncertified"
CONTAINER = "gate"
DEFAULT_INTERVAL_S = 600


@dataclass(frozen=True)
class GateSpec:
    """What the gate's objects are built from.

    Attributes:
        image: the certified image, by digest (unless ``allow_tag``). spec: the gate spec
        document (:func:`builder.nodes.gatespec.gate_spec`). namespace: of the
        ServiceAccount, ConfigMap and DaemonSet. interval_s: seconds between checks.
        node_selector: which nodes run the gate (default all). label_value: the lock hash,
        12 hex. code: ``{path: text}`` of the in-image code (default: the real one).
    """

    image: str
    spec: Mapping[str, Any]
    label_value: str
    namespace: str = "default"
    interval_s: int = DEFAULT_INTERVAL_S
    node_selector: Mapping[str, str] = field(default_factory=dict)
    allow_tag: bool = False
    code: Mapping[str, str] | None = None


@dataclass(frozen=True)
class GateContext:
    """:class:`GateSpec` checked, with the ConfigMap's data."""

    gate: GateSpec
    image: str
    labels: dict[str, str]
    code: CodeData
    spec_text: str
    configmap_name: str


def gate_context(gate: GateSpec) -> GateContext:
    """Check ``gate`` into a :class:`GateContext`.

    Raises:
        EnvbuildError: (exit 2) a tag-only image; (exit 64) a bad namespace, interval,
            node selector or label value.
    """
    image = require_digest(gate.image, gate.allow_tag)
    if not (DNS_SUBDOMAIN_RE.fullmatch(gate.namespace) and len(gate.namespace) <= 63):
        raise EnvbuildError("is not a Kubernetes namespace name", field="--namespace", value=gate.namespace,
                            exit_code=ExitCode.USAGE)
    if not 10 <= gate.interval_s <= 86400:
        raise EnvbuildError("must be 10..86400 seconds", field="--interval", value=gate.interval_s,
                            exit_code=ExitCode.USAGE)
    check_labels(dict(gate.node_selector))
    labels = check_labels({"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "envbuild",
                           "envbuild.lock-hash": gate.label_value})
    spec_text = json.dumps(gate.spec, indent=2, sort_keys=True) + "\n"
    base = code_data(gate.code)
    data = {**base.data, SPEC_KEY: spec_text}
    items = [*base.items, {"key": SPEC_KEY, "path": SPEC_KEY}]
    digest = hashlib.sha256((base.sha256 + "\0" + spec_text).encode()).hexdigest()
    code = CodeData(data=dict(sorted(data.items())), items=items, sha256=digest)
    return GateContext(gate=gate, image=image, labels=labels, code=code, spec_text=spec_text,
                       configmap_name=f"{NAME}-{digest[:12]}")


def _meta(ctx: GateContext, name: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = ctx.gate.namespace
    meta["labels"] = dict(ctx.labels)
    return meta


def service_account(ctx: GateContext) -> dict[str, Any]:
    """The ServiceAccount the gate pods run as."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ctx, NAME)}


def cluster_role(ctx: GateContext) -> dict[str, Any]:
    """Read and patch nodes (labels and taints), nothing else."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": _meta(ctx, NAME, namespaced=False),
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}


def cluster_role_binding(ctx: GateContext) -> dict[str, Any]:
    """The ClusterRole bound to the ServiceAccount."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": _meta(ctx, NAME, namespaced=False),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ctx.gate.namespace}]}


def configmap(ctx: GateContext) -> dict[str, Any]:
    """The immutable ConfigMap with the in-image code and the gate spec."""
    meta = _meta(ctx, ctx.configmap_name)
    meta["annotations"] = {"envbuild.code-sha256": ctx.code.sha256}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "immutable": True,
            "data": dict(ctx.code.data)}


def _container(ctx: GateContext) -> dict[str, Any]:
    env = [
        {"name": "PYTHONPATH", "value": pod.CODE_MOUNT},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": pod.HOME},
        {"name": "USER", "value": "envbuild"},
        {"name": "ENVBUILD_IMAGE", "value": ctx.image},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility,compute"},
    ]
    return {
        "name": CONTAINER, "image": ctx.image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "nodegate", SPEC_PATH, "--interval", str(ctx.gate.interval_s)],
        "env": env,
        "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": pod.container_security_context(),
        "volumeMounts": [{"name": pod.CODE_VOLUME, "mountPath": pod.CODE_MOUNT, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }


def daemonset(ctx: GateContext) -> dict[str, Any]:
    """The DaemonSet: one gate pod per node (of ``node_selector``), tolerating its own taint."""
    selector = {"app.kubernetes.io/name": NAME}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": NAME, "automountServiceAccountToken": True, "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10, "securityContext": pod.pod_security_context(),
        "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }
    if ctx.gate.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(ctx.gate.node_selector.items()))
    pod_spec["containers"] = [_container(ctx)]
    pod_spec["volumes"] = [
        {"name": pod.CODE_VOLUME, "configMap": {"name": ctx.configmap_name, "defaultMode": pod.FileMode(pod.CODE_MODE),
                                                "items": ctx.code.items}},
        {"name": "tmp", "emptyDir": {}},
    ]
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(ctx, NAME),
        "spec": {"selector": {"matchLabels": selector},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
                 "template": {"metadata": {"labels": dict(ctx.labels)}, "spec": pod_spec}},
    }
