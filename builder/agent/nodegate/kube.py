"""Label or taint this pod's node through the Kubernetes API, from inside the cluster, with
the standard library only (Python >= 3.8).

In-cluster access as client libraries do it (Kubernetes "Accessing the API from a Pod"): the
API server at ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the service
account's token and CA under :data:`SA_DIR`. The node is read (``GET /api/v1/nodes/NAME``)
and patched with a JSON merge patch (RFC 7386) that carries its ``resourceVersion``, so a
concurrent change makes the API answer 409 Conflict and the patch is made again on the
fresh node (at most :data:`ATTEMPTS` times); other taints are kept. The ServiceAccount needs
``get`` and ``patch`` on ``nodes`` (the ClusterRole ``envbuild k8s gate`` renders).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
LABEL = "envbuild.dev/certified"
TAINT = "envbuild.dev/uncertified"
ATTEMPTS = 5
TIMEOUT_S = 30
#: Largest API answer read, in bytes.
MAX_ANSWER = 16 << 20


class KubeError(Exception):
    """The API refused or could not be reached (one line)."""


def _request(method: str, path: str, body: dict[str, Any] | None = None,
             content_type: str = "application/json") -> dict[str, Any]:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeError("not in a cluster: KUBERNETES_SERVICE_HOST is unset")
    with open(os.path.join(SA_DIR, "token"), encoding="utf-8") as f:
        token = f.read().strip()
    ctx = ssl.create_default_context(cafile=os.path.join(SA_DIR, "ca.crt"))
    netloc = f"[{host}]" if ":" in host else host
    req = urllib.request.Request(f"https://{netloc}:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token, "Accept": "application/json",
                                          "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read(MAX_ANSWER).decode("utf-8"))
    except urllib.error.HTTPError as e:
        raise KubeError(f"{method} {path}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise KubeError(f"{method} {path}: {e}") from None


def node_patch(node: dict[str, Any], label_value: str | None, taint_value: str | None) -> dict[str, Any]:
    """The merge patch that labels (``label_value``) or taints (``taint_value``) ``node``:
    the label set or removed (null), the node's taints without ours plus ours when tainting,
    and the node's ``resourceVersion``."""
    meta = node.get("metadata") or {}
    taints: list[dict[str, Any]] = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT]
    if taint_value is not None:
        taints.append({"key": TAINT, "value": taint_value, "effect": "NoSchedule"})
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": {LABEL: label_value}},
            "spec": {"taints": taints}}


def mark_node(name: str, label_value: str | None, taint_value: str | None) -> None:
    """Label (pass) or taint (fail) node ``name``. Raises KubeError."""
    path = "/api/v1/nodes/" + urllib.parse.quote(name, safe="")
    for _ in range(ATTEMPTS):
        node = _request("GET", path)
        try:
            _request("PATCH", path, node_patch(node, label_value, taint_value), "application/merge-patch+json")
            return
        except KubeError as e:
            if "HTTP 409" not in str(e):
                raise
    raise KubeError(f"PATCH {path}: still in conflict after {ATTEMPTS} attempts")
