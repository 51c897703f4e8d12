"""envbuild k8s gate: the DaemonSet, ServiceAccount, RBAC and ConfigMap rendered from a real
certificate validate against the Kubernetes schemas (and broken twins do not); and in a Docker
stand-in for a cluster (an HTTPS API server in this process holding two Node objects, one container
per node run from the DaemonSet's pod template) a passing node gets the label
``envbuild.dev/certified=<lock hash 12>``, a node that holds another image under the certified tag
gets the taint ``envbuild.dev/uncertified=<reason>:NoSchedule`` and the condition ``EnvbuildUncertified``
(reason its class, message the finding and its next step) and loses both once repaired, and
each pod serves its gauges on the annotated port (checked by promtool)."""

from __future__ import annotations

import copy
import http.server
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from builder.launchers.k8s.options import K8S_VERSIONS

from fixtures_nodes import run_envbuild

pytest_plugins = ["fixtures_gate", "fixtures_nodes"]  # the certificate, bumped_torch_image, nodes_factory

FILES = ["gate-namespace.yaml", "gate-serviceaccount.yaml", "gate-clusterrole.yaml", "gate-clusterrolebinding.yaml",
         "gate-configmap.yaml", "gate-daemonset.yaml"]
TOKEN = "stand-in-token-c11"


def render(certificate_path: Path, image: str, out: Path, *extra: str) -> dict[str, dict]:
    proc = run_envbuild("k8s", "gate", str(certificate_path), "--image", image, "--allow-tag", "--out", str(out),
                        *extra)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    return {name: yaml.safe_load((out / name).read_text()) for name in FILES}


def validate(obj: dict) -> None:
    for version in K8S_VERSIONS:
        assert kubernetes_validate.validate(obj, version, strict=True) == version


def test_gate_manifests_validate(certificate, torch_image, tmp_path):
    cert, path = certificate
    objs = render(path, torch_image, tmp_path / "m", "--node-selector", "nvidia.com/gpu.present=true")
    for obj in objs.values():
        validate(obj)
    assert objs["gate-clusterrole.yaml"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert objs["gate-namespace.yaml"]["metadata"]["name"] == "envbuild-system"
    ds = objs["gate-daemonset.yaml"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "envbuild-gate"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"},
                                  {"operator": "Exists", "effect": "NoExecute"}]
    assert pod["containers"][0]["image"] == torch_image
    assert pod["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 9403, "protocol": "TCP"}]
    scrape_annotations = {k: v for k, v in ds["spec"]["template"]["metadata"]["annotations"].items()
                          if k.startswith("prometheus.io/")}
    assert scrape_annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9403",
                                  "prometheus.io/path": "/metrics"}
    spec = json.loads(objs["gate-configmap.yaml"]["data"]["gate-spec.json"])
    assert spec["label_value"] == cert["lock_hash"].split(":")[-1][:12]


@pytest.mark.parametrize("what", ["DaemonSet: misspelt field", "DaemonSet: no selector",
                                  "ClusterRole: verbs as a string", "ClusterRoleBinding: no roleRef"])
def test_broken_gate_manifests_do_not_validate(certificate, torch_image, tmp_path, what):
    _, path = certificate
    objs = render(path, torch_image, tmp_path / "m")
    ds, role, binding = (copy.deepcopy(objs[f]) for f in ("gate-daemonset.yaml", "gate-clusterrole.yaml",
                                                            "gate-clusterrolebinding.yaml"))
    obj = {"DaemonSet: misspelt field": lambda: ds["spec"].__setitem__("updateStrategie", {}) or ds,
           "DaemonSet: no selector": lambda: ds["spec"].pop("selector") and ds,
           "ClusterRole: verbs as a string": lambda: role["rules"][0].__setitem__("verbs", "get") or role,
           "ClusterRoleBinding: no roleRef": lambda: binding.pop("roleRef") and binding}[what]()
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(obj)


def test_k8s_gate_refuses_a_tag_without_allow_tag(certificate, torch_image, tmp_path):
    _, path = certificate
    proc = run_envbuild("k8s", "gate", str(path), "--image", torch_image, "--out", str(tmp_path / "m"))
    assert proc.returncode == 2  # as k8s render: the image check of builder.launchers.k8s.options
    assert "use REPO@sha256:<digest> (or --allow-tag on a development cluster)" in proc.stderr
    assert not (tmp_path / "m").exists()


# --------------------------------------------------------------------------- the stand-in


class ApiServer:
    """The part of the Kubernetes API the gate uses: ``GET`` and merge-``PATCH`` of
    ``/api/v1/nodes/NAME`` with a bearer token, ``resourceVersion`` checked (409 Conflict), and
    the strategic merge ``PATCH`` of its ``/status`` (conditions merged by type)."""

    def __init__(self, host: str, certfile: Path, keyfile: Path, nodes: list[str]) -> None:
        self.nodes = {n: {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": n, "resourceVersion": "1", "labels": {}}, "spec": {}} for n in nodes}
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _node(self) -> str | None:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._answer(401, {"kind": "Status", "code": 401})
                    return None
                name = self.path.removeprefix("/api/v1/nodes/").removesuffix("/status")
                if name not in server.nodes:
                    self._answer(404, {"kind": "Status", "code": 404})
                    return None
                return name

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                name = self._node()
                if name is not None:
                    with server.lock:
                        self._answer(200, server.nodes[name])

            def do_PATCH(self) -> None:  # noqa: N802
                name = self._node()
                if name is None:
                    return
                patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/status"):
                    self._status(name, patch)
                    return
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    self._answer(415, {"kind": "Status", "code": 415})
                    return
                with server.lock:
                    node = server.nodes[name]
                    want = patch.get("metadata", {}).get("resourceVersion")
                    if want is not None and want != node["metadata"]["resourceVersion"]:
                        self._answer(409, {"kind": "Status", "code": 409})
                        return
                    merged = merge_patch(node, patch)
                    merged["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    server.nodes[name] = merged
                    self._answer(200, merged)

            def _status(self, name: str, patch: dict) -> None:
                if self.headers.get("Content-Type") != "application/strategic-merge-patch+json" \
                        or set(patch) != {"status"}:
                    self._answer(415, {"kind": "Status", "code": 415})
                    return
                with server.lock:
                    status = server.nodes[name].setdefault("status", {})
                    conditions = {c["type"]: c for c in status.get("conditions", [])}
                    conditions.update({c["type"]: c for c in patch["status"].get("conditions", [])})
                    status["conditions"] = list(conditions.values())
                    self._answer(200, server.nodes[name])

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certfile, keyfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def node(self, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.nodes[name])


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def run_pod(client: Any, daemonset: dict, configmap: dict, node: str, image: str, api: ApiServer, host: str,
            folder: Path, labels: dict[str, str], network: str) -> Any:
    """The kubelet's part: one container of the DaemonSet's pod template on ``node`` (the
    ConfigMap's items as a read-only folder, the ServiceAccount's token and CA, emptyDirs as
    tmpfs, the pod's user, a read-only root); ``image`` is what the node holds under the tag."""
    pod = daemonset["spec"]["template"]["spec"]
    [c] = pod["containers"]
    mine = Path(tempfile.mkdtemp(prefix=f"pod-{node}-", dir=folder))
    mine.chmod(0o755)
    code = mine / "code"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts, tmpfs = {}, {}
    for m in c["volumeMounts"]:
        v = volumes[m["name"]]
        if "configMap" in v:
            for item in v["configMap"]["items"]:
                p = code / item["path"]
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(configmap["data"][item["key"]])
                p.chmod(v["configMap"]["defaultMode"])
            for d in [code, *code.rglob("*")]:
                if d.is_dir():
                    d.chmod(0o755)
            mounts[str(code)] = {"bind": m["mountPath"], "mode": "ro"}
        else:
            tmpfs[m["mountPath"]] = "mode=1777"
    sa = mine / "sa"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_text((folder / "tls.crt").read_text())
    (sa / "namespace").write_text("default")
    for f in sa.iterdir():
        f.chmod(0o444)
    sa.chmod(0o755)
    mounts[str(sa)] = {"bind": "/var/run/secrets/kubernetes.io/serviceaccount", "mode": "ro"}
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env.update(NODE_NAME=node, KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=str(api.port))
    sec = pod["securityContext"]
    return client.sdk.containers.run(image, c["command"], detach=True, environment=env, volumes=mounts, tmpfs=tmpfs,
                                 user=f"{sec['runAsUser']}:{sec['runAsGroup']}", read_only=True, labels=labels,
                                 cap_drop=["ALL"], security_opt=["no-new-privileges"], network=network,
                                 name=f"envbuild-test-gate-{mine.name}-{os.getpid()}")


def scrape(container: Any, network: str, port: str) -> str:
    """The pod's ``/metrics`` at its address on ``network`` (what Prometheus' pod role scrapes), checked
    by promtool; "" while the first check runs."""
    container.reload()
    ip = container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10) as resp:
            body = resp.read()
    except OSError:
        return ""
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    return body.decode()


def wait_for(check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.5)


def conditions(api: ApiServer, node: str) -> list[dict]:
    return [{k: c[k] for k in ("type", "status", "reason", "message")} for c in api.node(node)["status"]["conditions"]]


def gauges(text: str, node: str, image: str) -> dict[str, str]:
    """The values of ``node``'s gate gauges in a scrape: each by name, check_status by ``check:NAME``."""
    out = {}
    for name in ("envbuild_gate_passed", "envbuild_gate_exit_code"):
        out[name] = next(ln.split(" ")[-1] for ln in text.splitlines()
                         if ln.startswith(f'{name}{{image="{image}",node="{node}"}} '))
    for ln in text.splitlines():
        head, _, rest = ln.partition('envbuild_check_status{check="')
        if not head and rest.endswith(f'",image="{image}",node="{node}"}} {ln.split(" ")[-1]}'):
            out["check:" + rest.split('"')[0]] = ln.split(" ")[-1]
    return out


def test_stand_in_labels_a_passing_node_taints_a_failing_one_until_repaired(
        certificate, torch_image, bumped_torch_image, nodes_factory, docker_client, tmp_path):
    cert, path = certificate
    objs = render(path, torch_image, tmp_path / "m", "--interval", "10")
    port = objs["gate-daemonset.yaml"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    network = nodes_factory.network()
    gateway = docker_client.sdk.networks.get(network).attrs["IPAM"]["Config"][0]["Gateway"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=stand-in", "-addext", f"subjectAltName=IP:{gateway}", "-keyout", str(tmp_path / "tls.key"),
                    "-out", str(tmp_path / "tls.crt")], check=True, capture_output=True, timeout=60)
    api = ApiServer(gateway, tmp_path / "tls.crt", tmp_path / "tls.key", ["node-pass", "node-fail"])
    pods = {}

    def start(node: str, image: str) -> None:
        pods[node] = run_pod(docker_client, objs["gate-daemonset.yaml"], objs["gate-configmap.yaml"], node, image,
                             api, gateway, tmp_path, nodes_factory.labels, network)

    try:
        start("node-pass", torch_image)
        start("node-fail", bumped_torch_image)
        lock12 = cert["lock_hash"].split(":")[-1][:12]
        wait_for(lambda: all(api.node(n).get("status") for n in ("node-pass", "node-fail")))
        assert api.node("node-pass")["metadata"]["labels"] == {"envbuild.dev/certified": lock12}
        assert api.node("node-pass")["spec"]["taints"] == []
        assert api.node("node-fail")["metadata"]["labels"] == {}
        assert api.node("node-fail")["spec"]["taints"] == [
            {"key": "envbuild.dev/uncertified", "value": "torch.version", "effect": "NoSchedule"}]
        log = pods["node-fail"].logs().decode()
        torch = cert["probe"]["0"]["torch"]["version"]
        finding = f"torch.version: certified {torch}, this node 2.13.1+cpu [image] next: fix the image (or the node image) and run again"
        assert f"fail: {finding}\n" in log
        assert {n: conditions(api, n) for n in ("node-pass", "node-fail")} == {
            "node-pass": [{"type": "EnvbuildUncertified", "status": "False", "reason": "Certified",
                           "message": f"matches the certificate of lock {lock12}"}],
            "node-fail": [{"type": "EnvbuildUncertified", "status": "True", "reason": "image", "message": finding}]}
        for node, passed, status in (("node-pass", "1.0", "0.0"), ("node-fail", "0.0", "2.0")):
            wait_for(lambda n=node: scrape(pods[n], network, port))
            got = gauges(scrape(pods[node], network, port), node, torch_image)
            assert (got["envbuild_gate_passed"], got["check:torch.version"], got["check:gpu-uuid"]) == (
                passed, status, "0.0"), got
        # the repair: the certified image pulled again, the pod recreated (kubectl delete pod)
        pods.pop("node-fail").remove(force=True)
        start("node-fail", torch_image)
        # the gate patches the node (label, taints), then its status (the condition)
        wait_for(lambda: api.node("node-fail")["status"]["conditions"][0]["status"] == "False")
        assert api.node("node-fail")["metadata"]["labels"] == {"envbuild.dev/certified": lock12}
        assert api.node("node-fail")["spec"]["taints"] == []
        assert conditions(api, "node-fail") == [{"type": "EnvbuildUncertified", "status": "False",
                                                 "reason": "Certified",
                                                 "message": f"matches the certificate of lock {lock12}"}]
        [cond] = api.node("node-fail")["status"]["conditions"]
        assert cond["lastTransitionTime"] == cond["lastHeartbeatTime"]  # the status changed at this check
        wait_for(lambda: scrape(pods["node-fail"], network, port))
        got = gauges(scrape(pods["node-fail"], network, port), "node-fail", torch_image)
        assert (got["envbuild_gate_passed"], got["envbuild_gate_exit_code"], got["check:torch.version"]) == (
            "1.0", "0.0", "0.0"), got
    finally:
        for p in pods.values():
            p.remove(force=True)
        api.httpd.shutdown()
