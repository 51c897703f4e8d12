"""envbuild verify: every rule on hand-written report files (failing case and passing
twin), unreadable and invalid reports, and two real images that differ in one pinned
package run as two container nodes."""

from __future__ import annotations

import json

import pytest

from builder import nodereport, verify
from builder.gather import from_files
from fixtures_nodes import (  # noqa: F401 - pytest fixtures
    bumped_torch_image,
    finding,
    gpu_report,
    nodes_factory,
    run_envbuild,
    run_json,
    write_reports,
)


def failing(doc: dict) -> list[str]:
    return [f["field"] for f in doc["findings"] if f["level"] == "fail"]


# --- must-match --------------------------------------------------------------------------

def test_loaded_nccl_mismatch_names_the_odd_node(tmp_path):
    paths = write_reports(tmp_path, {
        "n1.json": gpu_report(1, **{"nccl.loaded": {"version": "2.20.5", "code": 22005, "path": "/x/libnccl.so.2"}}),
        "n2.json": gpu_report(2, **{"nccl.loaded": {"version": "2.19.3", "code": 21903, "path": "/x/libnccl.so.2"}}),
        "n3.json": gpu_report(3, **{"nccl.loaded": {"version": "2.19.3", "code": 21903, "path": "/x/libnccl.so.2"}}),
        "n4.json": gpu_report(4, **{"nccl.loaded": {"version": "2.19.3", "code": 21903, "path": "/x/libnccl.so.2"}}),
    })
    code, doc = run_json("verify", *paths)
    assert code == 2
    assert failing(doc) == ["nccl.loaded"]
    f = finding(doc, "must-match", "nccl.loaded")[0]
    assert f["message"] == "nccl.loaded: 2.20.5 on node-1; 2.19.3 on node-2, node-3, node-4"
    assert f["groups"] == [{"value": "2.20.5", "nodes": ["node-1"]},
                           {"value": "2.19.3", "nodes": ["node-2", "node-3", "node-4"]}]
    proc = run_envbuild("verify", *paths)  # the human table says the same
    assert proc.returncode == 2
    assert "nccl.loaded" in proc.stdout and "node-2, node-3, node-4" in proc.stdout
    assert "exit 2" in proc.stdout


def test_identical_reports_pass(tmp_path):
    paths = write_reports(tmp_path, {f"n{i}.json": gpu_report(i) for i in (1, 2, 3)})
    code, doc = run_json("verify", *paths)
    assert (code, doc["findings"]) == (0, [])
    assert [n["name"] for n in doc["nodes"]] == ["node-1", "node-2", "node-3"]
    assert [n["address"] for n in doc["nodes"]] == ["10.0.0.11", "10.0.0.12", "10.0.0.13"]


@pytest.mark.parametrize("field, path, a, b", [
    ("torch.version", "torch.version", "2.8.0+cu128", "2.7.1+cu128"),
    ("torch.cuda", "torch.cuda", "12.8", "12.6"),
    ("torch.cudnn", "torch.cudnn", "91002", "90501"),
    ("python.version", "python.version", "3.12.3", "3.12.7"),
    ("image.digest", "image.digest", "sha256:" + "ab" * 32, "sha256:" + "ef" * 32),
])
def test_each_must_match_field(tmp_path, field, path, a, b):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, **{path: a}), "n2.json": gpu_report(2, **{path: b})})
    code, doc = run_json("verify", *paths)
    assert code == 2
    assert failing(doc) == [field]
    assert finding(doc, "must-match", field)[0]["groups"] == [{"value": a, "nodes": ["node-1"]},
                                                              {"value": b, "nodes": ["node-2"]}]


# --- floor ----------------------------------------------------------------------------------

def test_driver_below_the_floor_fails(tmp_path):
    # torch cu128 needs >= 525.60.13 (CUDA 12 minor-version compatibility), >= 570.26 fully.
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, driver="520.61.05"), "n2.json": gpu_report(2)})
    code, doc = run_json("verify", *paths)
    assert code == 2
    f = finding(doc, "floor", "driver")[0]
    assert (f["level"], f["nodes"]) == ("fail", ["node-1"])
    assert f["message"] == ("driver: 520.61.05 on node-1 is below 525.60.13, the oldest that runs CUDA 12.8 "
                            "(torch 2.8.0+cu128); full support needs >= 570.26")


def test_driver_between_floors_warns(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, driver="565.57.01"),
                                     "n2.json": gpu_report(2, driver="565.57.01")})
    code, doc = run_json("verify", *paths)
    assert code == 1
    assert [(f["rule"], f["level"], f["nodes"]) for f in doc["findings"]] == [
        ("floor", "warn", ["node-1"]), ("floor", "warn", ["node-2"])]


def test_driver_above_the_floor_passes(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, driver="575.51.03"),
                                     "n2.json": gpu_report(2, driver="575.57.08")})
    code, doc = run_json("verify", *paths)
    assert (code, doc["findings"]) == (0, [])


# --- should-match, copies, interfaces --------------------------------------------------------

def test_should_match_fields_warn(tmp_path):
    paths = write_reports(tmp_path, {
        "n1.json": gpu_report(1, kernel="6.8.0-49-generic", driver="570.124.06", **{"env.NCCL_DEBUG": "INFO"}),
        "n2.json": gpu_report(2, kernel="6.8.0-51-generic", driver="575.57.08"),
    })
    code, doc = run_json("verify", *paths)
    assert code == 1
    assert {f["field"]: f["message"] for f in doc["findings"]} == {
        "driver.branch": "driver.branch: 570 on node-1; 575 on node-2",
        "kernel": "kernel: 6.8.0-49-generic on node-1; 6.8.0-51-generic on node-2",
        "env.NCCL_DEBUG": "env.NCCL_DEBUG: INFO on node-1; (absent) on node-2",
    }


def test_several_nccl_copies_warn(tmp_path):
    system = {"path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.25.1",
              "realpath": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.25.1", "version": "2.25.1", "code": 22501,
              "error": None}
    two = gpu_report(1)
    two["nccl"]["found"].insert(0, system)
    paths = write_reports(tmp_path, {"n1.json": two, "n2.json": gpu_report(2)})
    code, doc = run_json("verify", *paths)
    assert code == 1
    f = finding(doc, "nccl-copies")
    assert [(x["level"], x["nodes"]) for x in f] == [("warn", ["node-1"])]
    assert f[0]["message"] == (
        "node-1 has 2 NCCL libraries: /usr/lib/x86_64-linux-gnu/libnccl.so.2.25.1 (2.25.1); "
        "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2 (2.27.3); "
        "torch loads /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2")


def test_missing_interface_fails(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, **{"env.NCCL_SOCKET_IFNAME": "eth9"}),
                                     "n2.json": gpu_report(2, **{"env.NCCL_SOCKET_IFNAME": "eth9"})})
    code, doc = run_json("verify", *paths)
    assert code == 2
    assert [f["message"] for f in finding(doc, "interface")] == [
        "NCCL_SOCKET_IFNAME=eth9 on node-1 matches no interface with an address (it has: lo, eth0)",
        "NCCL_SOCKET_IFNAME=eth9 on node-2 matches no interface with an address (it has: lo, eth0)"]


def test_present_interface_passes(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, **{"env.NCCL_SOCKET_IFNAME": "=eth0"}),
                                     "n2.json": gpu_report(2, **{"env.NCCL_SOCKET_IFNAME": "=eth0"})})
    code, doc = run_json("verify", *paths)
    assert (code, doc["findings"]) == (0, [])


@pytest.mark.parametrize("spec, names, picked", [
    ("eth", ["lo", "eth0", "eth1", "ib0"], ["eth0", "eth1"]),
    ("=eth", ["lo", "eth0"], []),
    ("^docker,lo", ["lo", "docker0", "eth0", "ib0"], ["eth0", "ib0"]),
    ("^=eth0", ["lo", "eth0", "eth01"], ["lo", "eth01"]),
    ("ib0:1,eth1", ["eth1", "ib0"], ["eth1", "ib0"]),
    (None, ["lo", "eth0"], ["lo", "eth0"]),
])
def test_nccl_socket_ifname_syntax(spec, names, picked):
    assert verify.match_nccl_ifname(spec, names) == picked


def test_nccl_default_pick_skips_docker_and_lo():
    doc = gpu_report(1)
    doc["env"] = {}
    doc["network"]["interfaces"].insert(1, {"name": "docker0", "index": 3, "up": True, "loopback": False,
                                            "mtu": 1500, "addresses": [{"family": "inet", "address": "172.17.0.1",
                                                                        "prefixlen": 16}]})
    assert verify.nccl_interface(doc)["name"] == "eth0"
    doc["network"]["interfaces"] = [i for i in doc["network"]["interfaces"] if i["name"] != "eth0"]
    assert verify.nccl_interface(doc)["name"] == "docker0"


# --- could not check ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ('{"schema": "envbuild.probe/1", "hostname": ', "is not JSON: Expecting value at line 1 column 44"),
    (json.dumps(gpu_report(3, **{"torch.version": 5})), "torch.version: 5 is not a string"),
    (json.dumps(gpu_report(3, driver="570.x")), "driver: '570.x' is not a driver version like 570.124.06"),
    (json.dumps(gpu_report(3, schema="envbuild.probe/9")),
     "schema: 'envbuild.probe/9' is not a node-report schema this envbuild reads (envbuild.probe/1)"),
    (json.dumps({k: v for k, v in gpu_report(3).items() if k != "kernel"}), "kernel: is missing"),
    (json.dumps(gpu_report(3, **{"network.interfaces": [{"name": "eth0"}]})),
     "network.interfaces[0].index: is missing"),
    ("[1, 2]", "'list' is not a JSON object (a node report)"),
])
def test_invalid_report_is_exit_3_and_the_rest_still_compared(tmp_path, text, message):
    paths = write_reports(tmp_path, {
        "n1.json": gpu_report(1, **{"torch.version": "2.7.1+cu128"}),
        "n2.json": gpu_report(2),
        "bad.json": text,
    })
    code, doc = run_json("verify", *paths)
    assert code == 3
    bad = [f for f in doc["findings"] if f["level"] == "unknown"]
    assert [(f["rule"], f["message"]) for f in bad] == [("invalid", f"{paths[2]}: {message}")]
    assert failing(doc) == ["torch.version"]  # the two good nodes were still compared
    proc = run_envbuild("verify", *paths)
    assert proc.returncode == 3
    assert f"{paths[2]}: {message}" in " ".join(proc.stdout.split())


def test_unreadable_report(tmp_path):
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "latin1.json").write_bytes(b'{"hostname": "n\xe9"}')
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1)})
    code, doc = run_json("verify", *paths, str(tmp_path / "missing.json"), str(tmp_path / "dir.json"),
                         str(tmp_path / "latin1.json"))
    assert code == 3
    assert [f["message"] for f in doc["findings"]] == [
        f"{tmp_path}/missing.json: cannot be read: No such file or directory",
        f"{tmp_path}/dir.json: cannot be read: Is a directory",
        f"{tmp_path}/latin1.json: cannot be read: 'utf-8' codec can't decode byte 0xe9 in position 15: "
        "invalid continuation byte"]


def test_validate_accepts_reports_from_before_issue_3():
    old = {k: v for k, v in gpu_report(1).items()
           if k not in ("container", "image", "network", "shm", "gpu_processes")}
    old["gpus"][0].pop("pci_id")
    assert nodereport.validate(old, "old.json") is old
    nodes = from_files([])
    assert nodes == []


def test_usage_errors_exit_64():
    proc = run_envbuild("verify")
    assert proc.returncode == 64
    assert "give report files" in proc.stderr
    proc = run_envbuild("verify", "x.json", "--nodes", "2")
    assert proc.returncode == 64


# --- two real images, two container nodes -------------------------------------------------------

def test_two_images_differing_in_torch(docker_client, torch_image, bumped_torch_image, nodes_factory):
    a = nodes_factory.start(torch_image, "a")
    b = nodes_factory.start(bumped_torch_image, "b")
    code, doc = run_json("verify", "--image", torch_image, "--image", bumped_torch_image,
                         "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert code == 2, doc
    assert failing(doc) == ["torch.version"]
    assert finding(doc, "must-match", "torch.version")[0]["groups"] == [
        {"value": "2.13.0+cpu", "nodes": [a.name]}, {"value": "2.13.1+cpu", "nodes": [b.name]}]
    # the engine knows the images apart too: a warning, not a second failure
    assert [f["field"] for f in doc["findings"] if f["level"] == "warn"] == ["image.id"]
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert (by_name[a.name]["image_ref"], by_name[b.name]["image_ref"]) == (torch_image, bumped_torch_image)
    assert by_name[a.name]["runtime"] == "docker"
    # the same containers named one by one; and the human output
    proc = run_envbuild("verify", "--container", a.name, "--container", b.name)
    assert proc.returncode == 2
    table = proc.stdout.split("fields that differ", 1)[1].splitlines()
    rows = [" ".join(line.replace("│", " ").split()) for line in table]
    assert f"must-match torch.version 2.13.0+cpu {a.name}" in rows
    assert f"2.13.1+cpu {b.name}" in rows


def test_two_containers_of_one_image_match(docker_client, torch_image, nodes_factory):
    nodes_factory.start(torch_image, "a")
    nodes_factory.start(torch_image, "b")
    code, doc = run_json("verify", "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert (code, doc["findings"]) == (0, [])


def test_expected_node_count(docker_client, torch_image, nodes_factory):
    c = nodes_factory.start(torch_image, "a")
    proc = run_envbuild("verify", "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert proc.returncode == 3
    assert f"expected 2 running containers of label envbuild.test-case={nodes_factory.case}, found 1: {c.name}" \
        in " ".join(proc.stderr.split())
