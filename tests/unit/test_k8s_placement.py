"""The manifests an admin applies (builder/launchers/k8s/options.py, objects.py, gate.py):
requests and limits, node selector, tolerations, node affinity, priority class, namespace and
``--rdma`` on the certify Job, each present and absent; the gate in envbuild-system; every
variant validated against two Kubernetes releases; the Pod Security Standard each pod meets,
checked over its fields by an independent reading of the standard; hostile values refused in
one line; and ``--apply``/``certify --launcher k8s`` without a kubeconfig writing the manifests."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from test_k8s_units import IMAGES, ROOT, STUB_CODE, small_spec, spec_for

from builder.core.errors import ExitCode, Unreachable, UsageError
from builder.launchers.k8s import options as place
from builder.launchers.k8s.gate import GateSpec
from builder.launchers.k8s.launcher import K8sLauncher
from builder.launchers.k8s.manifests import load_objects, render_gate_manifests, render_manifests
from builder.launchers.k8s.options import K8S_VERSIONS, K8sOptions, Placement

GATE_IMAGE = IMAGES["cpu-torch2"]
ALL = Placement(requests={"cpu": "4", "memory": "16Gi"}, limits={"memory": "32Gi", "cpu": "8"},
                node_selector={"nvidia.com/gpu.present": "true"},
                tolerations=("nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute", "*"),
                node_affinity=("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3,NVIDIA-H200", "feature.node/ib"),
                priority_class="ml-high")


def job_of(options: K8sOptions | None = None, recipe: str = "cuda12-torch2") -> dict:
    spec, _ = spec_for(recipe)
    options = options or K8sOptions()
    return next(o for o in load_objects(render_manifests(spec, options, code=STUB_CODE, environ={}))
                if o["kind"] == "Job")


def gate_objects(**kw) -> dict[str, dict]:
    files = render_gate_manifests(GateSpec(image=GATE_IMAGE, spec={}, label_value="0123456789ab", code=STUB_CODE,
                                           **kw))
    return {name: yaml.safe_load(text) for name, text in files.items()}


# --------------------------------------------------------------------------- each option, present and absent


def test_defaults_add_resources_and_nothing_else():
    job = job_of()
    pod = job["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "priorityClassName", "hostNetwork", "dnsPolicy"):
        assert key not in pod, key
    assert list(pod["affinity"]) == ["podAntiAffinity"]
    assert "namespace" not in job["metadata"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"},
                                                 "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"}}
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        "envbuild.dev/pod-security": "restricted",
        "envbuild.dev/pod-security-reason": "non-root, no capabilities, no host namespaces or host paths"}


def test_every_placement_option_lands_in_the_pod():
    job = job_of(K8sOptions(placement=ALL, namespace="ml-certify"))
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == "ml-certify"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
                                  {"operator": "Exists"}]
    assert pod["affinity"]["nodeAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"]},
            {"key": "feature.node/ib", "operator": "Exists"}]}]}}
    assert "podAntiAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "ml-high"
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}


def test_namespace_goes_into_every_object_of_the_run():
    spec, _ = spec_for("cpu-torch2")
    objs = load_objects(render_manifests(spec, K8sOptions(namespace="ml"), code=STUB_CODE, environ={}))
    assert [(o["kind"], o["metadata"]["namespace"]) for o in objs] == [
        ("ConfigMap", "ml"), ("Service", "ml"), ("Job", "ml")]


def test_defaults_scale_with_the_ranks_and_none_removes_a_limit():
    spec, _ = spec_for("cpu-torch2")
    spec = dataclasses.replace(spec, gpus_per_node=4)  # 4 ranks
    job = next(o for o in load_objects(render_manifests(spec, K8sOptions(), code=STUB_CODE, environ={}))
               if o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {  # 4 x 8Gi + the 256Mi of /dev/shm
        "requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "33024Mi", "nvidia.com/gpu": "4"}}
    assert place.resources("job", Placement(limits={"memory": "none"})) == {
        "requests": {"cpu": "1", "memory": "2Gi"}}
    assert place.resources("job", Placement(requests={"cpu": "500m"}), ranks=3) == {
        "requests": {"cpu": "500m", "memory": "6Gi"}, "limits": {"memory": "24Gi"}}
    assert place.resources("job", Placement(), ranks=3, shm_limit="256Mi")["limits"] == {"memory": "24832Mi"}


@pytest.mark.parametrize("given,message", [
    (Placement(requests={"memory": "4Gi"}, limits={"memory": "2Gi"}),
     "--requests memory: '4Gi' is above the memory limit 2Gi"),
    (Placement(requests={"cpu": "2"}, limits={"cpu": "1500m"}), "--requests cpu: '2' is above the cpu limit 1500m"),
    (Placement(limits={"memory": "8Gi"}),
     "--limits memory: '8Gi' is not above /dev/shm's 8Gi (a memory-backed emptyDir counts against it)"),
    (Placement(requests={"gpu": "1"}), "--requests: 'gpu' is not cpu or memory"),
    (Placement(requests={"cpu": "0"}), "--requests cpu: '0' must be > 0"),
])
def test_resource_conflicts_are_refused(given, message):
    with pytest.raises(UsageError) as e:
        place.resources("job", given, shm_limit="8Gi")
    assert str(e.value) == message and e.value.exit_code == ExitCode.USAGE


def test_rdma_with_a_secondary_network():
    job = job_of(K8sOptions(rdma="rdma/rdma_shared_device_a=1", rdma_network="sriov-ib0,ml/sriov-ib1"))
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["requests"]["rdma/rdma_shared_device_a"] == "1"
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]}}
    assert pod["securityContext"] == {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "hostNetwork" not in pod
    ann = job["spec"]["template"]["metadata"]["annotations"]
    assert ann["k8s.v1.cni.cncf.io/networks"] == "sriov-ib0,ml/sriov-ib1"
    assert ann["envbuild.dev/pod-security"] == "privileged"
    assert ann["envbuild.dev/pod-security-reason"].startswith("IPC_LOCK to pin RDMA memory, which neither baseline")
    assert job["metadata"]["annotations"]["envbuild.dev/pod-security"] == "privileged"
    assert "k8s.v1.cni.cncf.io/networks" not in job["metadata"]["annotations"]


def test_rdma_on_the_host_network():
    job = job_of(K8sOptions(rdma="nvidia.com/hostdev=2", rdma_network="host"))
    pod = job["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/hostdev"] == "2"
    assert "k8s.v1.cni.cncf.io/networks" not in job["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("options,message", [
    (K8sOptions(kubeflow=True, rdma="rdma/ib=1"),
     "--rdma: 'rdma/ib=1' is set by the TrainJob's runtime; render the Indexed Job for it"),
    (K8sOptions(kubeflow=True, placement=Placement(priority_class="high")),
     "--priority-class: 'high' is set by the TrainJob's runtime; render the Indexed Job for it"),
    (K8sOptions(rdma_network="host"), "--rdma-network: 'host' goes with --rdma"),
])
def test_option_combinations_are_refused(options, message):
    spec, _ = spec_for("cuda12-torch2")
    with pytest.raises(UsageError) as e:
        render_manifests(spec, options, code=STUB_CODE, environ={})
    assert str(e.value) == message


def test_trainjob_carries_the_placement():
    spec, _ = spec_for("cuda12-torch2")
    placement = dataclasses.replace(ALL, priority_class=None)
    (tj,) = [o for o in load_objects(render_manifests(spec, K8sOptions(kubeflow=True, placement=placement),
                                                      code=STUB_CODE, environ={})) if o["kind"] == "TrainJob"]
    override = tj["spec"]["podTemplateOverrides"][0]["spec"]
    assert override["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert [t.get("key") for t in override["tolerations"]] == ["nvidia.com/gpu", "dedicated", None]
    assert list(override["affinity"]) == ["nodeAffinity"]
    assert tj["spec"]["trainer"]["resourcesPerNode"]["limits"]["cpu"] == "8"


# --------------------------------------------------------------------------- the gate


def test_gate_defaults_namespace_tolerations_rbac_and_resources():
    objs = gate_objects()
    assert list(objs) == ["gate-namespace.yaml", "gate-serviceaccount.yaml", "gate-clusterrole.yaml",
                          "gate-clusterrolebinding.yaml", "gate-configmap.yaml", "gate-daemonset.yaml"]
    ns = objs["gate-namespace.yaml"]
    assert ns["metadata"]["name"] == "envbuild-system"
    assert {k: v for k, v in ns["metadata"]["labels"].items() if k.startswith("pod-security")} == {
        "pod-security.kubernetes.io/audit": "restricted", "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}
    assert {o["metadata"].get("namespace") for n, o in objs.items() if "cluster" not in n and "namespace" not in n} \
        == {"envbuild-system"}
    assert objs["gate-clusterrole.yaml"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert objs["gate-clusterrolebinding.yaml"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "envbuild-gate", "namespace": "envbuild-system"}]
    ds = objs["gate-daemonset.yaml"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"},
                                  {"operator": "Exists", "effect": "NoExecute"}]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "50m", "memory": "256Mi"},
                                                 "limits": {"memory": "1Gi"}}
    assert ds["metadata"]["annotations"]["envbuild.dev/pod-security"] == "restricted"
    for key in ("nodeSelector", "priorityClassName", "affinity"):
        assert key not in pod


def test_gate_placement_keeps_its_own_taint_and_another_namespace_is_not_rendered():
    objs = gate_objects(namespace="ops", placement=Placement(
        tolerations=("nvidia.com/gpu:NoSchedule",), node_selector={"nvidia.com/gpu.present": "true"},
        priority_class="system-node-critical", requests={"cpu": "100m"}, limits={"memory": "2Gi"}))
    assert "gate-namespace.yaml" not in objs
    pod = objs["gate-daemonset.yaml"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "envbuild.dev/uncertified", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                 "limits": {"memory": "2Gi"}}
    assert objs["gate-clusterrolebinding.yaml"]["subjects"][0]["namespace"] == "ops"


# --------------------------------------------------------------------------- two Kubernetes releases


def variants() -> list[tuple[str, dict]]:
    spec, _ = spec_for("cuda12-torch2")
    out = []
    for name, opts in (("default", K8sOptions()), ("all", K8sOptions(placement=ALL, namespace="ml")),
                       ("rdma-multus", K8sOptions(rdma="rdma/ib=1", rdma_network="ib0")),
                       ("rdma-host", K8sOptions(rdma="nvidia.com/hostdev=1", rdma_network="host"))):
        out += [(f"{name}/{o['kind']}", o) for o in load_objects(render_manifests(spec, opts, code=STUB_CODE,
                                                                                  environ={}))]
    for name, kw in (("gate", {}), ("gate-placed", {"placement": ALL})):
        out += [(f"{name}/{o['kind']}", o) for o in gate_objects(**kw).values()]
    return out


def test_two_releases_are_checked():
    assert K8S_VERSIONS == ("1.30", "1.35")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,obj", variants(), ids=lambda v: v if isinstance(v, str) else "")
def test_variants_validate(version, name, obj):
    assert kubernetes_validate.validate(obj, version, strict=True) == version


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("field,value", [("priorityClass", "ml-high"), ("tolerations", {"operator": "Exists"}),
                                         ("hostNetwork", "yes")])
def test_broken_placement_does_not_validate(version, field, value):
    job = job_of(K8sOptions(placement=ALL))
    job["spec"]["template"]["spec"][field] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, version, strict=True)


# --------------------------------------------------------------------------- Pod Security Standards


#: Kubernetes "Pod Security Standards" (v1.30), read independently of the renderer.
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def pss_violations(pod: dict, level: str) -> list[str]:
    """What keeps ``pod`` (a pod spec) from the ``baseline`` or ``restricted`` level."""
    out = [f"{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    sec = pod.get("securityContext") or {}
    out += [f"volume {v['name']}: hostPath" for v in pod.get("volumes", []) if "hostPath" in v]
    for c in pod["containers"]:
        cs = c.get("securityContext") or {}
        caps = cs.get("capabilities") or {}
        out += [f"{c['name']}: privileged"] * bool(cs.get("privileged"))
        out += [f"{c['name']}: capabilities.add {a}" for a in caps.get("add", [])
                if a not in (BASELINE_CAPS if level == "baseline" else {"NET_BIND_SERVICE"})]
        out += [f"{c['name']}: hostPort"] * any(p.get("hostPort") for p in c.get("ports", []))
        if level == "restricted":
            out += [f"{c['name']}: allowPrivilegeEscalation"] * (cs.get("allowPrivilegeEscalation") is not False)
            out += [f"{c['name']}: capabilities.drop ALL"] * ("ALL" not in caps.get("drop", []))
            if cs.get("runAsNonRoot", sec.get("runAsNonRoot")) is not True:
                out.append(f"{c['name']}: runAsNonRoot")
            if cs.get("runAsUser", sec.get("runAsUser")) == 0:
                out.append(f"{c['name']}: runAsUser 0")
            seccomp = (cs.get("seccompProfile") or sec.get("seccompProfile") or {}).get("type")
            out += [f"{c['name']}: seccompProfile"] * (seccomp not in ("RuntimeDefault", "Localhost"))
    if level == "restricted":
        out += [f"volume {v['name']}: type" for v in pod.get("volumes", [])
                if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    return out


def test_certify_job_is_restricted_by_default():
    assert pss_violations(job_of()["spec"]["template"]["spec"], "restricted") == []
    assert pss_violations(job_of(K8sOptions(placement=ALL))["spec"]["template"]["spec"], "restricted") == []
    gate = gate_objects()["gate-daemonset.yaml"]["spec"]["template"]["spec"]
    assert pss_violations(gate, "restricted") == []


@pytest.mark.parametrize("fault,found", [
    (lambda p: p.update(hostNetwork=True), ["hostNetwork"]),
    (lambda p: p["volumes"].append({"name": "logs", "hostPath": {"path": "/var/log"}}),
     ["volume logs: hostPath", "volume logs: type"]),
    (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
     ["node: capabilities.add SYS_ADMIN"]),
    (lambda p: p["securityContext"].update(runAsUser=0), ["node: runAsUser 0"]),
    (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
     ["node: allowPrivilegeEscalation"]),
])
def test_the_reading_of_the_standard_finds_an_injected_fault(fault, found):
    pod = job_of()["spec"]["template"]["spec"]
    fault(pod)
    assert pss_violations(pod, "restricted") == found


def test_rdma_needs_privileged_as_its_annotation_says():
    host = job_of(K8sOptions(rdma="rdma/ib=1", rdma_network="host"))["spec"]["template"]
    multus = job_of(K8sOptions(rdma="rdma/ib=1"))["spec"]["template"]
    assert pss_violations(host["spec"], "baseline") == ["hostNetwork", "node: capabilities.add IPC_LOCK"]
    assert pss_violations(multus["spec"], "baseline") == ["node: capabilities.add IPC_LOCK"]
    assert pss_violations(multus["spec"], "restricted") == ["node: capabilities.add IPC_LOCK", "node: runAsNonRoot",
                                                            "node: runAsUser 0"]
    assert host["metadata"]["annotations"]["envbuild.dev/pod-security"] == "privileged"
    assert multus["metadata"]["annotations"]["envbuild.dev/pod-security"] == "privileged"


# --------------------------------------------------------------------------- hostile values


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "ENVBUILD_EXTRA_LABELS"}
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=120)


HOSTILE = [
    ("--requests", "cpu=1e3", "error: --requests cpu: '1e3' is not a cpu quantity (e.g. 500m, 2)"),
    ("--requests", "gpu=1", "error: --requests: 'gpu' is not cpu or memory"),
    ("--limits", "memory=8GB", "error: --limits memory: '8GB' is not a memory quantity (e.g. 512Mi, 8Gi)"),
    ("--limits", "cpu=1,cpu=2",
     "envbuild k8s render: argument --limits: 'cpu=1,cpu=2' is not KEY=QUANTITY[,KEY=QUANTITY] (each key once)"),
    ("--toleration", "a b:NoSchedule",
     "error: --toleration: 'a b:NoSchedule' is not KEY[=VALUE][:EFFECT] (* for every key; EFFECT NoSchedule, "
     "PreferNoSchedule or NoExecute)"),
    ("--toleration", "*=x", "error: --toleration: '*=x' is not KEY[=VALUE][:EFFECT] (* for every key; EFFECT "
     "NoSchedule, PreferNoSchedule or NoExecute)"),
    ("--toleration", "a..b/k:NoSchedule", "error: toleration: 'a..b/k' is not a Kubernetes toleration key"),
    ("--node-affinity", "zone=a,,b", "error: --node-affinity: 'zone=a,,b' is not KEY or KEY=VALUE[,VALUE]"),
    ("--priority-class", "Bad_Class", "error: --priority-class: 'Bad_Class' is not a PriorityClass name"),
    ("--rdma", "nvidia.com/gpu=1", "error: --rdma: 'nvidia.com/gpu=1' is not an extended resource NAME=COUNT (e.g. "
     "rdma/rdma_shared_device_a=1, nvidia.com/hostdev=1; COUNT 1..99)"),
    ("--rdma", "rdma/ib=0", "error: --rdma: 'rdma/ib=0' is not an extended resource NAME=COUNT (e.g. "
     "rdma/rdma_shared_device_a=1, nvidia.com/hostdev=1; COUNT 1..99)"),
    ("--rdma-network", "host", "error: --rdma-network: 'host' goes with --rdma"),
    ("--toleration", "k\x1b[2J:NoSchedule",
     "envbuild k8s render: argument --toleration: 'k\\x1b[2J:NoSchedule' is not a toleration"),
]


@pytest.mark.parametrize("flag,value,line", HOSTILE, ids=[f"{f}={v!r}" for f, v, _ in HOSTILE])
def test_hostile_values_are_refused_in_one_line(tmp_path, flag, value, line):
    out = tmp_path / "m"
    r = cli("k8s", "render", "cpu-torch2", "--image", IMAGES["cpu-torch2"], "--out", str(out), flag, value)
    assert (r.returncode, r.stderr.splitlines()[-1:]) == (64, [line]), r.stderr
    assert len(r.stderr.splitlines()) <= 2 and "Traceback" not in r.stderr  # argparse adds its usage line
    assert not out.exists()


def test_hostile_gate_values_are_refused_before_the_certificate_is_read(tmp_path):
    r = cli("k8s", "gate", str(tmp_path / "no-such-cert.json"), "--image", GATE_IMAGE, "--out", str(tmp_path / "m"),
            "--toleration", "x:Sometimes")
    assert r.returncode == 64 and r.stderr.splitlines() == [
        "envbuild k8s gate: --toleration: 'x:Sometimes' is not KEY[=VALUE][:EFFECT] (* for every key; "
        "EFFECT NoSchedule, PreferNoSchedule or NoExecute)"]


def test_generated_hostile_placement_is_refused_or_valid():
    """Seeded strings from the characters that matter: each is refused as a usage error, or
    gives a pod that validates strictly."""
    rng = random.Random(20261201)
    alphabet = "aZ9.-_/=:,*\n\x00 \u00e9" + "NoSchedule"
    spec, _ = spec_for("cpu-torch2")
    accepted = 0
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        field = rng.choice(["tolerations", "node_affinity", "priority_class", "requests"])
        value = {"tolerations": (text,), "node_affinity": (text,), "priority_class": text,
                 "requests": {"cpu": text}}[field]
        try:
            files = render_manifests(spec, K8sOptions(placement=Placement(**{field: value})), code=STUB_CODE,
                                     environ={})
        except UsageError as e:
            assert "\n" not in str(e) and e.exit_code == ExitCode.USAGE
            continue
        accepted += 1
        for obj in load_objects(files):
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
    assert 0 < accepted < 300


# --------------------------------------------------------------------------- no kubeconfig


def test_launcher_without_kubeconfig_writes_the_manifests_and_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    lz = K8sLauncher(manifests_dir=str(tmp_path / "certificates"), code=STUB_CODE)
    with pytest.raises(Unreachable) as e:
        lz.run(small_spec())
    folder = tmp_path / "certificates" / "k8s-0123456789ab"
    assert str(e.value) == (f"{folder}: the manifests are in this folder; no kubeconfig (KUBECONFIG='{tmp_path / 'none'}'"
                            " names no file, not in a pod) to apply them: `kubectl apply -f` the folder where a "
                            "cluster answers")
    assert sorted(p.name for p in folder.iterdir()) == ["configmap.yaml", "job.yaml", "service.yaml"]
    assert yaml.safe_load((folder / "job.yaml").read_text())["metadata"]["name"] == "envbuild-0123456789ab"
