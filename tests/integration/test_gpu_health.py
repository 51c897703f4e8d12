"""``envbuild doctor --checks gpu-health`` on container "nodes" of the torch image: the stand-in
``libnvidia-ml.so.1`` (tests/fixtures/nvml/fake_nvml.c, built here) mounted in each, its answers set by
the container's environment; the agent runs there through the payload, the host judges."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fixtures_nodes import check, run_json

pytest_plugins = ["fixtures_nodes"]  # nodes_factory

ROOT = Path(__file__).resolve().parents[2]
GPU1 = "GPU 1 (GPU-00000000-0000-0000-0000-000000000001, 00000000:19:00.0)"


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nvml")
    out.chmod(0o755)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / "libnvidia-ml.so.1"),
                    str(ROOT / "tests" / "fixtures" / "nvml" / "fake_nvml.c")], check=True)
    return out


def gpu_node(factory, image: str, suffix: str, lib: Path, **answers: str):
    return factory.start(image, suffix, volumes={str(lib): {"bind": "/opt/fake-nvml", "mode": "ro"}},
                         environment={"LD_LIBRARY_PATH": "/opt/fake-nvml", **answers})


def test_doctor_names_the_sick_gpu_of_the_sick_node(torch_image, nodes_factory, fake_lib):
    healthy = gpu_node(nodes_factory, torch_image, "node-0", fake_lib)
    sick = gpu_node(nodes_factory, torch_image, "node-1", fake_lib, FAKE_NVML_ECC_DBE_VOL_1="3")
    code, doc = run_json("doctor", "--container", healthy.name, "--container", sick.name, "--checks", "gpu-health",
                         "--gpus", "2")
    health = check(doc, "gpu-health")
    assert (code, health["status"]) == (2, "fail")
    assert health["data"]["findings"] == [{
        "node": sick.name, "status": "fail", "where": GPU1, "what": "volatile double-bit ECC errors", "value": "3",
        "threshold": "<= 0", "cls": "hardware",
        "next_step": "drain the node and reset the GPU (nvidia-smi -r -i INDEX with no process on it)"}]
    assert (health["fix"], health["cls"], health["next_step"]) == (
        None, "hardware", "drain the node and reset the GPU (nvidia-smi -r -i INDEX with no process on it)")

    # the passing twin: the healthy node alone
    code, doc = run_json("doctor", "--container", healthy.name, "--checks", "gpu-health", "--gpus", "2")
    assert (code, check(doc, "gpu-health")["status"], check(doc, "gpu-health")["message"]) == (
        0, "pass", "2 GPUs healthy on 1 node(s)")
    assert (check(doc, "gpu-health")["cls"], check(doc, "gpu-health")["next_step"]) == (None, None)


def test_doctor_with_a_gpu_health_warning_only_exits_1(torch_image, nodes_factory, fake_lib):
    """Persistence mode off is a warning, not a failure: doctor exits 1 (the exit-code table's
    doctor 1; its 0 twin: the healthy node above)."""
    node = gpu_node(nodes_factory, torch_image, "node-0", fake_lib, FAKE_NVML_PERSISTENCE_1="0")
    code, doc = run_json("doctor", "--container", node.name, "--checks", "gpu-health", "--gpus", "2")
    health = check(doc, "gpu-health")
    assert (code, health["status"]) == (1, "warn"), health
    assert [(f["status"], f["what"], f["value"]) for f in health["data"]["findings"]] == [
        ("warn", "persistence mode", "disabled")]
