"""The engine-free tests of tests/integration/test_verify.py: envbuild verify: every rule on hand-written report files (failing case and passing
twin), unreadable and invalid reports, and two real images that differ in one pinned
package run as two container nodes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jsonschema
import msgspec
import pytest

from builder.core.model import json_schema
from builder.core.netif import match_nccl_ifname
from builder.nodes import report as nodereport
from builder.nodes import verify
from builder.nodes.schemas import schemas
from builder.nodes.sources.files import from_files

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
    assert match_nccl_ifname(spec, names) == picked


def test_nccl_default_pick_skips_docker_and_lo():
    doc = gpu_report(1)
    doc["env"] = {}
    doc["network"]["interfaces"].insert(1, {"name": "docker0", "index": 3, "up": True, "loopback": False,
                                            "mtu": 1500, "addresses": [{"family": "inet", "address": "172.17.0.1",
                                                                        "prefixlen": 16}]})
    assert verify.nccl_interface(nodereport.validate(doc)).name == "eth0"
    doc["network"]["interfaces"] = [i for i in doc["network"]["interfaces"] if i["name"] != "eth0"]
    assert verify.nccl_interface(nodereport.validate(doc)).name == "docker0"


# --- could not check ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ('{"schema": "envbuild.probe/1", "hostname": ', "not valid JSON: Expecting value: line 1 column 44 (char 43)"),
    (json.dumps(gpu_report(3, **{"torch.version": 5})), "torch.version: 5 is not a version (digits, letters, . + _ ! -)"),
    (json.dumps(gpu_report(3, kernel=5)), "kernel: 5 is not a string"),
    (json.dumps(gpu_report(3, driver="570.x")), "driver: '570.x' is not a driver version like 570.124.06"),
    (json.dumps(gpu_report(3, schema="envbuild.probe/9")),
     "schema: 'envbuild.probe/9' is not a node-report schema this envbuild reads (envbuild.probe/1)"),
    (json.dumps({k: v for k, v in gpu_report(3).items() if k != "kernel"}), "kernel: is required"),
    (json.dumps(gpu_report(3, **{"network.interfaces": [{"name": "eth0"}]})),
     "network.interfaces[0].index: is required"),
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
        f"{tmp_path}/missing.json: no such node report",
        f"{tmp_path}/dir.json: is a directory, not a node report",
        f"{tmp_path}/latin1.json: is not UTF-8 text (byte 15)"]


def test_validate_accepts_reports_from_before_issue_3():
    old = {k: v for k, v in gpu_report(1).items()
           if k not in ("container", "image", "network", "shm", "gpu_processes")}
    old["gpus"][0].pop("pci_id")
    report = nodereport.validate(old, "old.json")
    assert (report.container, report.image, report.network, report.shm, report.gpu_processes) == (None,) * 5
    assert report.gpus[0].pci_id is None
    assert msgspec.to_builtins(report.gpus[0]) == {**old["gpus"][0], "pci_id": None}
    nodes = from_files([])
    assert nodes == []


def test_usage_errors_exit_64():
    proc = run_envbuild("verify")
    assert proc.returncode == 64
    assert "give report files" in proc.stderr
    proc = run_envbuild("verify", "x.json", "--nodes", "2")
    assert proc.returncode == 64


# --- bounded reading (issue 8) ------------------------------------------------------------------

def _unknown_messages(doc: dict) -> list[str]:
    return [f["message"] for f in doc["findings"] if f["level"] == "unknown"]


def test_report_over_16_mib_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: refused by its size, never read
        fh.truncate(16 * 1024 * 1024 + 1)
    t0 = time.monotonic()
    code, doc = run_json("verify", str(big), timeout=60)
    assert (code, _unknown_messages(doc)) == (3, [f"{big}: is 16777217 bytes, over the 16777216-byte limit of "
                                                  "a node report"])
    assert time.monotonic() - t0 < 30
    # the passing twin: a valid report padded to exactly the limit is read
    text = json.dumps(gpu_report(1))
    ok = tmp_path / "ok.json"
    ok.write_text(text + " " * (16 * 1024 * 1024 - len(text)))
    code, doc = run_json("verify", str(ok), *write_reports(tmp_path, {"n2.json": gpu_report(2)}), timeout=60)
    assert (code, doc["findings"]) == (0, [])


def test_fifo_device_and_directory_are_refused_without_hanging(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # no writer: opening it for reading would block
    (tmp_path / "dir.json").mkdir()
    good = write_reports(tmp_path, {"n1.json": gpu_report(1)})
    t0 = time.monotonic()
    code, doc = run_json("verify", *good, str(fifo), "/dev/zero", str(tmp_path / "dir.json"), timeout=60)
    assert time.monotonic() - t0 < 30
    assert (code, _unknown_messages(doc)) == (3, [
        f"{fifo}: is not a regular file (a FIFO); give a node report",
        "/dev/zero: is not a regular file (a character device); give a node report",
        f"{tmp_path}/dir.json: is a directory, not a node report"])


@pytest.mark.parametrize("text, message", [
    ("[" * 10000 + "]" * 10000, "not valid JSON: nesting deeper than 64 levels"),
    ('{"schema": "envbuild.probe/1", "x": ' + "[" * 100 + "]" * 100 + "}",
     "not valid JSON: nesting deeper than 64 levels at x[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
     "[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
     "[0][0][0][0][0][0][0][0][0][0][0]"),
    ("1" * 5000, "not valid JSON: an integer of 5000 digits (at most 30)"),
    (json.dumps(gpu_report(3)).replace('"memory_total_bytes": 85520809984', '"memory_total_bytes": ' + "9" * 40),
     "not valid JSON: an integer of 40 digits (at most 30)"),
    (json.dumps(gpu_report(3)).replace('"index": 0', '"index": NaN'),
     "not valid JSON: NaN is not a number (NaN and Infinity are refused)"),
    (json.dumps(gpu_report(3)).replace('"index": 0', '"index": -Infinity'),
     "not valid JSON: -Infinity is not a number (NaN and Infinity are refused)"),
    (json.dumps(gpu_report(3)).replace('"6.8.0-49-generic"', '"6.8\\ud800"'),
     "not valid JSON: kernel: a lone surrogate in a string (not valid Unicode)"),
    (json.dumps(gpu_report(3)).replace('"NCCL_SOCKET_IFNAME"', '"NCCL_\\udfff"'),
     "not valid JSON: env.NCCL_\\udfff: a lone surrogate in a key (not valid Unicode)"),
])
def test_unbounded_json_is_one_line_exit_3(tmp_path, text, message):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "bad.json": text})
    code, doc = run_json("verify", *paths)
    assert (code, _unknown_messages(doc)) == (3, [f"{paths[1]}: {message}"])
    proc = run_envbuild("verify", *paths)  # the human output: the same one line, no traceback
    assert (proc.returncode, proc.stderr) == (3, "")
    assert [line for line in proc.stdout.splitlines() if line.startswith("unknown: ")] == [
        f"unknown: invalid: {paths[1]}: {message}"]


@pytest.mark.parametrize("path, value, message", [
    ("network.ip_local_port_range", [32768, 70000], "network.ip_local_port_range[1]: 70000 is not a port (0..65535)"),
    ("network.ip_local_port_range", [-1, 60999], "network.ip_local_port_range[0]: -1 is not a port (0..65535)"),
    ("network.ip_local_port_range", [60999, 32768],
     "network.ip_local_port_range: [60999, 32768] is not a port range: low > high"),
    ("network.ip_local_port_range", [1, 2, 3],
     "network.ip_local_port_range: [1, 2, 3] is not a list of two ports [low, high]"),
    ("gpu_processes", [{"gpu_index": 0, "gpu_uuid": "GPU-1", "pid": 0, "used_memory_bytes": 1, "name": None}],
     "gpu_processes[0].pid: 0 is not a PID (1..4194304)"),
    ("gpu_processes", [{"gpu_index": 0, "gpu_uuid": "GPU-1", "pid": 1 << 23, "used_memory_bytes": 1, "name": None}],
     "gpu_processes[0].pid: 8388608 is not a PID (1..4194304)"),
    ("shm.size_bytes", -1, "shm.size_bytes: -1 is not a byte count (0..2**63-1)"),
    ("gpus", [gpu_report(1)["gpus"][0]] * 1025, "gpus: has 1025 items, over the limit of 1024"),
    ("kernel", "6" * 4097, "kernel: is 4097 characters long, over the limit of 4096"),
    ("gpus.0.index", True, "gpus[0].index: True is not an index (>= 0)"),
    ("network.interfaces.1.name", "eth0/x", "network.interfaces[1].name: 'eth0/x' is not an interface name "
     "(at most 15 characters, no / : or blank)"),
    ("network.interfaces.1.addresses.0.address", "10.0.0.300",
     "network.interfaces[1].addresses[0].address: '10.0.0.300' is not an IP address"),
    ("hostname", "node 1", "hostname: 'node 1' is not a host name (letters, digits, _ . -)"),
])
def test_bounded_report_fields(tmp_path, path, value, message):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "bad.json": gpu_report(2, **{path: value})})
    code, doc = run_json("verify", *paths)
    assert (code, _unknown_messages(doc)) == (3, [f"{paths[1]}: {message}"])


# --- output: escaped, never markup (issue 8) ------------------------------------------------------

HOSTILE_STRINGS = {"kernel": "[/]", "os.pretty_name": "[bold red]x", "glibc": "\x1b[2J2.39",
                   "env.NCCL_DEBUG": "INFO\u202eOFNI", "errors": ["[/]probe \x1b]0;title\x07 failed"]}


def test_report_strings_print_literally_and_escaped(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, **HOSTILE_STRINGS),
                                     "n2.json": gpu_report(2),
                                     "[red]gone.json": "{"})
    proc = run_envbuild("verify", *paths)
    assert (proc.returncode, proc.stderr) == (3, "")
    out = proc.stdout
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    rows = [" ".join(line.replace("│", " ").split()) for line in out.splitlines()]
    assert "should-match kernel [/] node-1" in rows
    assert "should-match glibc \\x1b[2J2.39 node-1" in rows
    assert "should-match env.NCCL_DEBUG INFO\\u202eOFNI node-1" in rows
    assert ("warn: probe-errors: node-1: probe: [/]probe \\x1b]0;title\\x07 failed [image] next: fix the image (or the "
            "node image) and run again") in rows
    assert f"unknown: invalid: {tmp_path}/[red]gone.json: not valid JSON: Expecting property name enclosed in " \
           "double quotes: line 1 column 2 (char 1)" in " ".join(rows)
    # --json is exact JSON: the raw strings, escaped by JSON itself
    code, doc = run_json("verify", *paths)
    assert code == 3
    assert finding(doc, "should-match", "glibc")[0]["groups"][0] == {"value": "\x1b[2J2.39", "nodes": ["node-1"]}
    assert finding(doc, "should-match", "kernel")[0]["groups"][0] == {"value": "[/]", "nodes": ["node-1"]}
    # the passing twin: the same reports without the hostile strings print the same rows plainly
    plain = write_reports(tmp_path, {"p1.json": gpu_report(1, kernel="6.8.0-50-generic"), "p2.json": gpu_report(2)})
    proc = run_envbuild("verify", *plain)
    assert proc.returncode == 1
    assert "should-match kernel 6.8.0-50-generic node-1" in [" ".join(ln.replace("│", " ").split())
                                                              for ln in proc.stdout.splitlines()]


# --- the published schemas (issue 9) ---------------------------------------------------------------

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize("name", sorted(schemas()))
def test_published_schema_is_current(name):
    model, schema_id, title = schemas()[name]
    path = SCHEMAS / f"{name}.schema.json"
    assert json.loads(path.read_text()) == json_schema(model, schema_id, title), f"{path} is stale: regenerate it"


def test_schemas_hold_what_verify_reads_and_writes(tmp_path):
    node_schema = json.loads((SCHEMAS / "node-report.schema.json").read_text())
    jsonschema.validate(gpu_report(1), node_schema)
    with pytest.raises(jsonschema.ValidationError):  # the fault the model refuses, the schema refuses too
        jsonschema.validate(gpu_report(1, driver="570.x"), node_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(gpu_report(1, **{"network.interfaces.1.name": ".."}), node_schema)
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, kernel="6.8.0-50-generic"), "n2.json": gpu_report(2),
                                     "bad.json": "{"})
    code, doc = run_json("verify", *paths)
    assert code == 3
    jsonschema.validate(doc, json.loads((SCHEMAS / "verify-result.schema.json").read_text()))
    assert msgspec.convert(doc, verify.VerifyResult, strict=True).to_dict() == doc


def test_unknown_report_key_is_refused(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1, **{"gpus.0.vendor": "nvidia"}), "n2.json": gpu_report(2)})
    code, doc = run_json("verify", *paths)
    assert (code, _unknown_messages(doc)) == (3, [f"{paths[0]}: gpus[0].vendor: unknown key; allowed keys: index, "
                                                  "name, uuid, pci_bus_id, memory_total_bytes, pci_id"])



# --- NVIDIA_REQUIRE_CUDA's brand conditions, read from the GPUs' names ---------------------------

REQUIRE_BRAND = "cuda>=12.6 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"


@pytest.mark.parametrize(("gpus", "level"), [
    ((), "warn"),  # no GPU named: the brand is unknown
    (("NVIDIA H100 80GB HBM3",), "warn"),  # an NVIDIA-branded name: unknown
    (("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"), None),  # accepted as brand=tesla
    (("Tesla V100-SXM2-16GB", "Quadro P4000"), "warn"),  # mixed: unknown
    (("NVIDIA GeForce RTX 3090",), "fail"),  # geforcertx: no alternative holds
])
def test_brand_conditions_are_read_from_the_gpu_names(gpus, level):
    from builder.nodes.verify.floor import CudaRequirement, default_floors, requirement_finding

    req = CudaRequirement(torch_cuda="12.6", require=REQUIRE_BRAND, source="env")
    got = requirement_finding("node-1", "535.183.01", req, default_floors(), gpus)
    assert (got.level if got else None) == level
    if level == "warn":
        assert got.message.endswith("accepts it only as brand=tesla,driver>=535,driver<536: a report cannot tell "
                                    "the GPU brand")
    assert requirement_finding("node-1", "560.35.03", req, default_floors(), gpus) is None  # the twin: above the floor


def test_gpu_brand_of_names():
    from builder.nodes.verify.floor import gpu_brand

    assert [gpu_brand(n) for n in (["Tesla T4"], ["Quadro RTX 6000"], ["NVIDIA TITAN RTX"], ["NVIDIA A100-SXM4-80GB"],
                                   [])] == ["tesla", "quadrortx", "titanrtx", None, None]
