"""The probe's one NVML path (ctypes) against a stand-in ``libnvidia-ml.so.1`` built with gcc
(tests/fixtures/nvml/fake_nvml.c): healthy answers, a failing call, a missing library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "fixtures" / "nvml" / "fake_nvml.c"
PROBE = ("import json, sys; from builder.agent.probe import nvml; e = []; g, d = nvml.gpus_and_driver(e); "
         "p = nvml.gpu_processes(e); json.dump({'gpus': g, 'driver': d, 'procs': p, 'errors': e}, sys.stdout)")


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nvml")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out / "libnvidia-ml.so.1"), str(SOURCE)], check=True)
    return out


def probe(lib_dir: Path | None, **env: str) -> dict:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML")}
    run_env.update(env, PYTHONPATH=str(ROOT))
    run_env["LD_LIBRARY_PATH"] = str(lib_dir) if lib_dir else ""
    out = subprocess.run([sys.executable, "-c", PROBE], env=run_env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_healthy_gpus_driver_and_processes(fake_lib):
    doc = probe(fake_lib, FAKE_NVML_PROCS="2")
    assert doc["driver"] == "570.124.06"
    assert doc["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
         "pci_bus_id": "00000000:18:00.0", "memory_total_bytes": 150754820096, "pci_id": "10de:2335"},
        {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000001",
         "pci_bus_id": "00000000:19:00.0", "memory_total_bytes": 150754820096, "pci_id": "10de:2335"}]
    assert [(p["gpu_index"], p["pid"], p["used_memory_bytes"]) for p in doc["procs"]] == [(0, 4242, 1048576),
                                                                                        (0, 4243, None)]
    assert doc["errors"] == []


@pytest.mark.parametrize(("failing", "error"), [
    ("nvmlInit_v2", "nvml: nvmlInit_v2 returned nvmlReturn_t 999"),
    ("nvmlDeviceGetMemoryInfo", "nvml: nvmlDeviceGetMemoryInfo returned nvmlReturn_t 999"),
    ("nvmlDeviceGetComputeRunningProcesses_v2",
     "nvml: compute processes: nvmlDeviceGetComputeRunningProcesses returned nvmlReturn_t 999"),
])
def test_a_failing_call_is_one_error_and_no_crash(fake_lib, failing, error):
    doc = probe(fake_lib, FAKE_NVML_FAIL=failing)
    assert doc["errors"] == [error]
    assert doc["procs"] == []


def test_no_library_is_no_gpu_and_no_error(tmp_path):
    doc = probe(tmp_path)
    assert (doc["gpus"], doc["procs"], doc["errors"]) == ([], [], [])
