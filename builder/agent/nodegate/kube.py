"""Label or taint this pod's node, and set its condition, from inside the cluster (stdlib only).
The merge patch (RFC 7386) carries the node's ``resourceVersion``: a concurrent change answers
409 and the patch is retried on the fresh node."""

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
CONDITION = "EnvbuildUncertified"
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
    """The merge patch that labels or taints ``node`` (the label null when tainting)."""
    meta = node.get("metadata") or {}
    taints: list[dict[str, Any]] = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT]
    if taint_value is not None:
        taints.append({"key": TAINT, "value": taint_value, "effect": "NoSchedule"})
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": {LABEL: label_value}},
            "spec": {"taints": taints}}


def condition_patch(node: dict[str, Any], reason: str, message: str, failed: bool, now: str) -> dict[str, Any]:
    """The strategic merge patch of :data:`CONDITION`; ``lastTransitionTime`` moves only when the status changes."""
    status = "True" if failed else "False"
    old = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION]
    since = old[0].get("lastTransitionTime") if old and old[0].get("status") == status else now
    return {"status": {"conditions": [{"type": CONDITION, "status": status, "reason": reason, "message": message,
                                       "lastHeartbeatTime": now, "lastTransitionTime": since or now}]}}


def mark_node(name: str, label_value: str | None, taint_value: str | None, reason: str, message: str) -> None:
    """Label (pass) or taint (fail) node ``name``, then set its condition (``reason``: the failure's class, or
    ``Certified``); KubeError otherwise."""
    import datetime

    path = "/api/v1/nodes/" + urllib.parse.quote(name, safe="")
    for _ in range(ATTEMPTS):
        node = _request("GET", path)
        try:
            _request("PATCH", path, node_patch(node, label_value, taint_value), "application/merge-patch+json")
        except KubeError as e:
            if "HTTP 409" not in str(e):
                raise
            continue
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = condition_patch(node, reason, message[:1024], taint_value is not None, now)
        _request("PATCH", path + "/status", patch, "application/strategic-merge-patch+json")
        return
    raise KubeError(f"PATCH {path}: still in conflict after {ATTEMPTS} attempts")
