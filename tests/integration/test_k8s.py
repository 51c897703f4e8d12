"""Kubernetes launcher (builder/launchers/k8s/) and `envbuild k8s render`.

Golden files for the rendered manifests (2 nodes x 1 GPU nccl from the cuda12-torch2 lock,
2 CPU nodes gloo from cpu-torch2, and the Kubeflow TrainJob), validation of every rendered
object against the Kubernetes 1.30 OpenAPI schemas offline (kubernetes-validate, strict:
unknown fields are errors) with broken twins that must be rejected, the TrainJob against a
hand-written schema (tests/schemas/), references between the objects, the tag-only image
refused, byte-determinism across processes, `--apply` without a kubeconfig, the in-pod
wrapper script run for real with /bin/sh, and the apply path (create, watch, collect from
logs, delete; also on failure and Ctrl-C) against a scripted API, through the real
`kubernetes` client (dynamic client and watch) against a loopback fake API server, and on a
Docker stand-in for a cluster (tests/k8s_docker.py).

The goldens are rendered with a small stand-in for the in-image code (STUB_CODE), so that
they do not change with every edit of builder/agent/bench; a separate test checks that the real
ConfigMap carries the real files. Regenerate the goldens with

    make golden      (scripts/goldens.py calls regenerate() below)

and review the diff.
"""

from __future__ import annotations

from test_k8s_units import STUB_CODE, launcher  # noqa: F401

from builder.certify import settings as certify_settings
from builder.certify import verdict as certify_verdict
from builder.certify.settings import Overrides
from builder.certify.source import read_image
from builder.launchers.base import LaunchSpec
from builder.launchers.k8s.launcher import K8sLauncher
from builder.launchers.k8s.options import K8sOptions

# --------------------------------------------------------------------------- apply, on a Docker stand-in


def run_on_docker(client, image, labels, extra_env=None):
    """`--apply`'s path (K8sLauncher.run) against tests/k8s_docker.py: the rendered Job,
    Service and ConfigMap run the real bench in the image; checked and judged as certify does."""
    from builder.image import engine

    from k8s_docker import DockerKubeApi

    image_labels, lock = read_image(client, image)
    s = certify_settings.resolve(lock, Overrides(sizes=[8, 1024, 65536], iters=3, warmup=1, timeout_s=120),
                                 gpu_visible=True, recipe_backend=image_labels.get("envbuild.backend"))
    spec = LaunchSpec(image=image, nodes=s.nodes, gpus_per_node=s.gpus_per_node, backend=s.backend, port=s.port,
                      shm_size=s.shm_size, timeout_s=s.timeout_s, bench_args=s.bench_args(),
                      env=dict(extra_env or {}), run_id=engine.new_run_id(),
                      labels={"envbuild.recipe": image_labels["envbuild.recipe"]})
    api = DockerKubeApi(client, labels)
    res = K8sLauncher(K8sOptions(allow_tag=True), api=api, tick_s=0.5, log_every_s=2.0).run(spec)
    left = client.sdk.containers.list(all=True, filters={"label": f"envbuild.run={spec.run_id}"})
    assert left == [] and api.networks == {} and api.dirs == [], "the launcher left something behind"
    certify_verdict.check_results(res, spec)
    return s, spec, res, certify_verdict.judge(s, res, lock).to_dict()


def test_apply_on_docker_stand_in_passes(docker_client, torch_image, test_labels):
    s, spec, res, verdict = run_on_docker(docker_client, torch_image, test_labels)
    assert verdict["failures"] == [] and verdict["passed"] is True, verdict
    assert sorted(res.rank_results) == [0, 1] and res.node_exit_codes == {0: 0, 1: 0}
    assert [res.rank_results[r].hostname for r in (0, 1)] == [f"envbuild-{spec.run_id}-0",
                                                              f"envbuild-{spec.run_id}-1"]
    prof0, prof1 = (res.rank_results[r].profiles for r in (0, 1))
    assert prof0 is not None and prof1 is not None
    rows = prof0.collectives["all_reduce"]
    assert isinstance(rows, list)
    assert [(e.size_bytes, e.type) for e in rows] == [(8, "float32"), (1024, "float32"), (65536, "float32")]
    assert prof1.training["ddp"].reference_match is True
    assert res.rank_results[0].probe.os.id == "debian"
    assert [name for name, _ in res.phases] == ["pods up", "ranks up", "import torch", "init", "profiles", "probe",
                                                "write", "exit", "teardown"]
    assert all(sec >= 0 for _, sec in res.phases) and sum(sec for _, sec in res.phases) > 5.0


def test_apply_on_docker_stand_in_failing_rank(docker_client, torch_image, test_labels):
    _, _, res, verdict = run_on_docker(docker_client, torch_image, test_labels,
                                       extra_env={"ENVBUILD_BENCH_FAULT": "exit@1"})
    assert verdict["passed"] is False and verdict["exit_code"] == 2
    # rank 0 waits for rank 1 in the first collective: either the Job controller stops it,
    # or gloo notices the closed connection first and it exits 1 (a race on 2 busy cores)
    assert verdict["failures"][1:] == ["rank 1 exited with 3"]
    assert verdict["failures"][0] in ("rank 0 did not finish: killed 0 s after another node failed",
                                      "rank 0 exited with 1")
    assert res.node_exit_codes[1] == 1 and res.node_exit_codes[0] in (None, 1)
    assert res.rank_exit_codes[1] == 3



# --------------------------------------------------------------------------- certify --launcher k8s, no kubeconfig


def test_certify_on_k8s_without_kubeconfig_writes_the_manifests_and_names_the_folder(
        docker_client, bootstrap_image, test_labels, registry, namespace, tmp_path):
    """A small labelled image pushed to the test registry (a pod needs a digest); certify
    renders its run into images/<recipe>/certificates/k8s-<run>/ and exits 3 naming it."""
    import os
    import re
    import subprocess
    import sys
    import uuid

    import yaml

    from builder.image.engine import docker_login

    from fixtures_registry import recipe_labels, small_image

    marker = uuid.uuid4().hex[:12]
    repo = f"{registry.host}/{namespace}/k8s"
    image_id = small_image(docker_client, f"{repo}:{marker}", {**recipe_labels("cpu-torch2"), **test_labels}, marker,
                           bootstrap_image)
    try:
        creds = docker_login(registry.host)
        docker_client.sdk.images.push(repo, marker, auth_config={"username": creds.username, "password": creds.password})
        [ref] = [d for d in docker_client.sdk.images.get(image_id).attrs["RepoDigests"] if d.startswith(repo)]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(HOME=str(tmp_path), KUBERNETES_SERVICE_HOST="")
        r = subprocess.run([sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path / "images"),
                            "certify", ref, "--launcher", "k8s"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        docker_client.sdk.images.remove(image_id, force=True)
    assert r.returncode == 3, r.stderr
    m = re.fullmatch(r"error: (\S+/images/cpu-torch2/certificates/k8s-([0-9a-f]{12})): the manifests are in this "
                     r"folder; no kubeconfig \(no \S+/\.kube/config, not in a pod\) to apply them: `kubectl apply -f` "
                     r"the folder where a cluster answers", r.stderr.splitlines()[-1])
    assert m, r.stderr
    folder = tmp_path / "images" / "cpu-torch2" / "certificates" / f"k8s-{m.group(2)}"
    assert m.group(1) == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["configmap.yaml", "job.yaml", "service.yaml"]
    job = yaml.safe_load((folder / "job.yaml").read_text())
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == ref
