"""The engine-free tests of tests/integration/test_verify_against.py: envbuild verify --against REF (issue 11): every node compared with a certificate made by a
real certification of envbuild/cpu-torch2 (its rank probe is the reference), a node report or
an image; each rule with an injected fault and its passing twin; the CUDA requirement as a
hard driver floor; the certificate's validity; drift over a history folder."""

from __future__ import annotations

from fixtures_nodes import gpu_report, run_envbuild, run_json, write_reports

pytest_plugins = ["fixtures_gate", "fixtures_nodes"]  # the certificate, nodes_factory


def messages(doc: dict, level: str) -> list[str]:
    return [f["message"] for f in doc["findings"] if f["level"] == level]


def test_loaded_nccl_difference_against_a_node_report(tmp_path):
    ref = gpu_report(1)
    paths = write_reports(tmp_path, {"ref.json": ref, "same.json": gpu_report(2),
                                     "odd.json": gpu_report(3, **{"nccl.loaded.version": "2.26.2",
                                                                  "nccl.loaded.code": 22602})})
    code, doc = run_json("verify", "--against", paths[0], paths[1])
    assert code == 0, doc["findings"]
    assert doc["reference"]["kind"] == "report"
    code, doc = run_json("verify", "--against", paths[0], paths[2])
    assert code == 2
    assert messages(doc, "fail") == ["nccl.loaded: reference 2.27.3; 2.26.2 on node-3"]


def test_max_age_usage_error():
    proc = run_envbuild("verify", "--against", "x.json", "--max-age", "30 days", "y.json")
    assert proc.returncode == 64
    assert "is not a duration like 30d" in proc.stderr


# --- the NCCL network plugin and CUDA runtime copies -------------------------------------------

PLUGIN = {"requested": None, "path": "/usr/lib/x86_64-linux-gnu/libnccl-net.so",
          "realpath": "/usr/lib/x86_64-linux-gnu/libnccl-net.so.1.11.0", "sha256": "sha256:" + "1a" * 32,
          "name": "AWS Libfabric", "api": "v8", "version": "1.11.0"}


def test_net_plugin_must_match(tmp_path):
    other = dict(PLUGIN, sha256="sha256:" + "2b" * 32, realpath="/usr/lib/x86_64-linux-gnu/libnccl-net.so.1.9.1",
                 version="1.9.1")
    paths = write_reports(tmp_path, {"ref.json": gpu_report(1, **{"nccl.net_plugin": PLUGIN}),
                                     "same.json": gpu_report(2, **{"nccl.net_plugin": PLUGIN}),
                                     "odd.json": gpu_report(3, **{"nccl.net_plugin": other})})
    code, doc = run_json("verify", "--against", paths[0], paths[1])
    assert code == 0, doc["findings"]
    code, doc = run_json("verify", "--against", paths[0], paths[2])
    assert code == 2
    assert [f["field"] for f in doc["findings"] if f["level"] == "fail"] == ["nccl.net_plugin"]
    code, doc = run_json("verify", paths[1], paths[2])  # between nodes too
    assert code == 2
    assert [f["field"] for f in doc["findings"] if f["level"] == "fail"] == ["nccl.net_plugin"]


def test_second_cuda_runtime_warns(tmp_path):
    one = {"loaded": [{"path": "/opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
                       "version": "12.8"}]}
    two = {"loaded": [*one["loaded"], {"path": "/usr/local/cuda/lib64/libcudart.so.12", "version": "12.4"}]}
    paths = write_reports(tmp_path, {"a.json": gpu_report(1, cuda_runtime=one),
                                     "b.json": gpu_report(2, cuda_runtime=two)})
    code, doc = run_json("verify", paths[0])
    assert code == 0, doc["findings"]
    code, doc = run_json("verify", paths[1])
    assert code == 1
    assert [f["rule"] for f in doc["findings"]] == ["cuda-runtime-copies"]

