"""The engine-free tests of tests/integration/test_probe.py: builder/agent/probe/: run as the agent payload on stdin (`python3 -c BOOTSTRAP probe`, as
docker exec, ssh and srun run it) in subprocesses,
against a real NCCL library from the nvidia-nccl-cu12 2.27.3 wheel (no GPU needed: its
ncclGetVersion answers 22703), plus the pure parsing helpers with literal inputs."""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.agent import payload
from builder.agent.probe import nccl, nvml, osinfo


def base_env(**extra):
    """A minimal environment: no NCCL_/TORCH_/... variables leaking in from the host."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def run_probe_stdin(env, python=sys.executable):
    """`python -c BOOTSTRAP probe` with the payload archive on stdin; returns the parsed
    JSON document."""
    proc = subprocess.run(payload.command(python, "probe"), input=payload.archive(), capture_output=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def nccl_entry(found, path):
    matches = [f for f in found if f["path"] == str(path)]
    assert len(matches) == 1, found
    return matches[0]


# --- the whole document, run the way images run it -------------------------------------

def test_stdin_run_on_host_without_torch():
    env = base_env(NCCL_DEBUG="INFO", GLOO_SOCKET_IFNAME="eth0", TORCH_DISTRIBUTED_DEBUG="DETAIL",
                   CUDA_VISIBLE_DEVICES="0,1", NVIDIA_VISIBLE_DEVICES="all",
                   NCCLX="no", MY_NCCL_DEBUG="no", HOME="/tmp")
    doc = run_probe_stdin(env)
    assert list(doc) == ["schema", "scope", "probed_at", "hostname", "kernel", "os", "glibc", "python", "torch",
                         "nccl", "gpus", "driver", "env", "cuda_runtime", "container", "image", "network",
                         "shm", "gpu_processes", "errors"]
    assert doc["schema"] == "envbuild.probe/1"
    assert doc["scope"] is None  # not said: no --host, no --image
    assert doc["cuda_runtime"] == {"loaded": []}  # no torch here, so no libcudart mapped
    assert doc["nccl"]["net_plugin"] == {"requested": None, "path": None, "realpath": None, "sha256": None,
                                         "name": None, "api": None, "version": None}
    assert doc["python"] == {"version": platform.python_version(), "executable": sys.executable}
    assert doc["kernel"] == platform.release()
    assert doc["glibc"] == platform.libc_ver()[1]
    assert doc["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "GLOO_SOCKET_IFNAME": "eth0",
                          "NCCL_DEBUG": "INFO", "NVIDIA_VISIBLE_DEVICES": "all",
                          "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    assert doc["nccl"]["loaded"] is None
    assert doc["errors"] == []
    if importlib.util.find_spec("torch") is None:
        assert doc["torch"] is None
    if not os.path.exists("/dev/nvidiactl"):
        assert doc["gpus"] == []


def test_os_matches_etc_os_release():
    if not os.path.exists("/etc/os-release"):
        pytest.skip("no /etc/os-release here")
    doc = run_probe_stdin(base_env())
    fields = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines()
                  if "=" in line)
    assert doc["os"]["id"] == fields["ID"].strip('"')
    assert doc["os"]["pretty_name"] == fields["PRETTY_NAME"].strip('"')


def test_source_is_python38_syntax():
    files = payload.files()
    assert "probe/__main__.py" in files and "doctor_agent.py" in files
    for name, data in files.items():  # everything shipped into images and onto nodes
        ast.parse(data, filename=name, feature_version=(3, 8))
    for runner in (payload.BOOTSTRAP, payload.MOUNTED):
        ast.parse(runner, feature_version=(3, 8))


def _python38():
    candidates = [shutil.which("python3.8")]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(root, "versions", "3.8*", "bin", "python3.8")))
    for c in candidates:
        if not c:
            continue
        try:
            out = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == "(3, 8)":
            return c
    return None


def test_runs_under_python38():
    py38 = _python38()
    if py38 is None:
        pytest.skip("no working python3.8 interpreter here")
    doc = run_probe_stdin(base_env(), python=py38)
    assert doc["python"]["version"].startswith("3.8.")
    assert doc["errors"] == []


def test_broken_library_is_an_error_not_a_crash(tmp_path):
    (tmp_path / "libnccl.so.2").write_bytes(b"not an ELF file")
    doc = run_probe_stdin(base_env(LD_LIBRARY_PATH=str(tmp_path)))
    entry = nccl_entry(doc["nccl"]["found"], tmp_path / "libnccl.so.2")
    assert (entry["version"], entry["code"]) == (None, None)
    assert entry["error"].startswith("subprocess exit 1: OSError: ")
    assert any(e.startswith(f"nccl: {tmp_path}/libnccl.so.2: subprocess exit 1") for e in doc["errors"])


# --- pure helpers ---------------------------------------------------------------------

@pytest.mark.parametrize("code, version", [(22703, "2.27.3"), (21903, "2.19.3"),
                                           (2804, "2.8.4"), (2708, "2.7.8"), (23007, "2.30.7")])
def test_nccl_version_from_code(code, version):
    assert nccl.nccl_version_from_code(code) == version


@pytest.mark.parametrize("bad", [0, -1, "22703", True, None, 2.5])
def test_nccl_version_from_code_rejects(bad):
    with pytest.raises(ValueError):
        nccl.nccl_version_from_code(bad)


@pytest.mark.parametrize("name, ok", [("libnccl.so", True), ("libnccl.so.2", True),
                                      ("libnccl.so.2.27.3", True), ("libnccl-net.so", False),
                                      ("libnccl_static.a", False), ("libnccl.so2", False),
                                      ("libnccl-tuner.so.2", False)])
def test_is_nccl_library_name(name, ok):
    assert nccl.is_nccl_library_name(name) is ok


def test_mapped_libraries():
    maps = (
        "55d0c000-55d0d000 r--p 00000000 08:01 131 /usr/bin/python3.11\n"
        "7f00-7f01 r-xp 00000000 08:01 99 /opt/my libs/libnccl.so.2\n"
        "7f01-7f02 r--p 00001000 08:01 99 /opt/my libs/libnccl.so.2\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f03-7f04 rw-p 00000000 00:00 0 [heap]\n"
        "7f04-7f05 r-xp 00000000 08:01 7 /usr/lib/old.so (deleted)\n"
    )
    assert nccl.mapped_libraries(maps) == ["/usr/bin/python3.11", "/opt/my libs/libnccl.so.2",
                                            "/usr/lib/old.so"]


def test_parse_os_release():
    text = '# comment\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n\nBAD LINE\n'
    assert osinfo.parse_os_release(text) == {"id": "ubuntu", "version_id": "24.04",
                                            "pretty_name": "Ubuntu 24.04.1 LTS"}
    assert osinfo.parse_os_release("") == {"id": None, "version_id": None, "pretty_name": None}


@pytest.mark.parametrize("text, version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Wed Feb 26 04:16:00 UTC 2025\n"
     "GCC version:  gcc version 12.2.0\n", "570.124.06"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build\n",
     "580.82.07"),
    ("GCC version:  gcc version 12.2.0\n", None),
])
def test_parse_proc_driver_version(text, version):
    assert nvml.parse_proc_driver_version(text) == version

