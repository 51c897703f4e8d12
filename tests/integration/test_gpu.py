"""GPU certification (nccl). Marked ``gpu``: deselected by default (``-m 'not gpu'`` in
pyproject.toml); run on a machine with NVIDIA GPUs, the NVIDIA container toolkit and a
reachable registry with ``pytest -m gpu tests/integration/test_gpu.py``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.image import build, engine, site

from certify_helpers import certify_image

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_image():
    client = engine.connect()
    result = build.build(build.BuildOptions(recipe="cuda12-torch2", images_dir=ROOT / "images",
                                            site=site.SiteOptions.detect(), base_mode="pull"), client)
    return client, result


def test_cuda_image_probe_matches_lock(cuda_image):
    _, result = cuda_image
    probe = result.probe
    assert probe["torch"]["version"] == "2.8.0+cu128"
    assert probe["torch"]["cuda"] == "12.8"
    assert probe["torch"]["nccl_compiled"] == "2.27.3"
    assert [f["version"] for f in probe["nccl"]["found"]] == ["2.27.3"]  # one NCCL in the image


def test_certify_nccl_one_node_one_gpu(cuda_image, tmp_path):
    client, result = cuda_image
    cert, _ = certify_image(client, result.tag, nodes=1, gpus_per_node=1, backend="nccl", port=None,
                            timeout_s=600, min_busbw_gbps=None, images_dir=tmp_path, console=None,
                            sizes=[1048576, 134217728])
    assert cert["verdict"]["passed"], cert["verdict"]
    assert cert["backend"]["used"] == "nccl"
    assert cert["probe"]["0"]["nccl"]["loaded"]["version"] == "2.27.3"
    assert cert["transports"]["0"] is not None


def test_nvidia_smi_sees_a_gpu():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    assert out.returncode == 0 and "GPU 0" in out.stdout, out.stderr
