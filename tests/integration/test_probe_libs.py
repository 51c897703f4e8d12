"""The NCCL network plugin in the node report (issue 11), on real parts: a plugin library built
here with gcc (it exports ``ncclNetPlugin_v8`` whose first member is its name), put on
``LD_LIBRARY_PATH`` of a container of the cpu-torch2 image and found by the probe; two nodes
whose ``libnccl-net.so`` differ fail verify's must-match rule, and its twin with the same
plugin on both passes."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from fixtures_nodes import run_json

pytest_plugins = ["fixtures_nodes"]  # nodes_factory

PLUGIN_C = """
typedef struct { const char *name; void *init; } plugin_t;
__attribute__((visibility("default"))) plugin_t ncclNetPlugin_v8 = { "%s", 0 };
"""


def build_plugin(folder: Path, name: str, version: str) -> Path:
    """``folder/libnccl-net.so`` -> ``libnccl-net.so.VERSION``, a plugin named ``name``."""
    folder.mkdir(parents=True)
    src = folder / "plugin.c"
    src.write_text(PLUGIN_C % name)
    lib = folder / f"libnccl-net.so.{version}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    (folder / "libnccl-net.so").symlink_to(lib.name)
    folder.chmod(0o755)
    return lib


def start(nodes_factory, image: str, suffix: str, folder: Path):
    return nodes_factory.start(image, suffix, environment={"LD_LIBRARY_PATH": "/plug"},
                               volumes={str(folder): {"bind": "/plug", "mode": "ro"}})


def test_probe_finds_the_plugin_and_verify_compares_it(torch_image, nodes_factory, tmp_path):
    a = build_plugin(tmp_path / "a", "TestNet", "1.11.0")
    b = build_plugin(tmp_path / "b", "TestNet", "1.9.1")
    (tmp_path / "b" / "plugin.c").write_text("")  # b differs in its bytes (and version)
    start(nodes_factory, torch_image, "n1", tmp_path / "a")
    start(nodes_factory, torch_image, "n2", tmp_path / "a")
    code, doc = run_json("verify", "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert (code, doc["findings"]) == (0, [])  # the twin: one plugin on both nodes
    start(nodes_factory, torch_image, "n3", tmp_path / "b")
    code, doc = run_json("verify", "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "3")
    assert code == 2
    [f] = [f for f in doc["findings"] if f["level"] == "fail"]
    assert f["field"] == "nccl.net_plugin"
    sha_a = "sha256:" + hashlib.sha256(a.read_bytes()).hexdigest()[:12]
    sha_b = "sha256:" + hashlib.sha256(b.read_bytes()).hexdigest()[:12]
    assert sha_a in f["message"] and sha_b in f["message"]
    assert "TestNet" in f["message"] and "v8" in f["message"]
