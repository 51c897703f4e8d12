"""The ``gpu-health`` check against the stand-in ``libnvidia-ml.so.1`` (tests/fixtures/nvml/fake_nvml.c, built
with gcc here): ``probe.health`` run as the node's agent with each test's answers, then judged on the host.
Every check has a failing case and its passing twin; kernel logs and InfiniBand sysfs trees are fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError
from builder.nodes.doctor import FAIL, PASS, SKIP, WARN
from builder.nodes.doctor.gpu_health import health_check, parse
from builder.nodes.doctor.gpu_health_rules import limits
from builder.nodes.sources.base import Completed

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "fixtures" / "nvml" / "fake_nvml.c"
LOGS = ROOT / "tests" / "fixtures" / "nvml" / "kernel-logs"
IB = ROOT / "tests" / "fixtures" / "ib"
GPU0 = "GPU 0 (GPU-00000000-0000-0000-0000-000000000000, 00000000:18:00.0)"
GPU1 = "GPU 1 (GPU-00000000-0000-0000-0000-000000000001, 00000000:19:00.0)"
#: Above the kernel's PID_MAX_LIMIT (4194304): never a running process.
DEAD_PID = "4194999"


def _build(out: Path, *defines: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", *defines, "-o", str(out / "libnvidia-ml.so.1"), str(SOURCE)],
                   check=True)
    return out


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("nvml"))


@pytest.fixture(scope="module")
def old_driver(tmp_path_factory) -> Path:
    """A driver without nvmlDeviceGetRemappedRows and nvmlDeviceGetGpuFabricInfo."""
    return _build(tmp_path_factory.mktemp("nvml-old"), "-DOMIT_REMAP", "-DOMIT_FABRIC")


def agent(lib: Path | None, *args: str, **env: str) -> Completed:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML")}
    run_env.update(env, PYTHONPATH=str(ROOT), LD_LIBRARY_PATH=str(lib) if lib else "")
    args = args if "--kernel-log" in args else (*args, "--kernel-log", str(LOGS / "clean.log"))
    args = args if "--ib-root" in args else (*args, "--ib-root", str(IB / "healthy"))
    p = subprocess.run([sys.executable, "-m", "builder.agent.probe.health", *args], env=run_env, capture_output=True,
                       text=True, timeout=60)
    return Completed(p.returncode, p.stdout, p.stderr)


def judged(lib: Path | None, *args: str, expected: int | None = None, thresholds: str | None = None,
           **env: str):
    return health_check({"n1": parse(agent(lib, *args, **env), "n1")}, limits(thresholds), expected)


def findings(check) -> list[tuple[str, str, str, str, str]]:
    return [(f["status"], f["where"], f["what"], f["value"], f["cls"]) for f in check.data["findings"]]


def test_healthy_node_passes(fake_lib):
    c = judged(fake_lib, expected=2)
    assert (c.status, c.message, c.data) == (PASS, "2 GPUs healthy on 1 node(s)", {"findings": []})


@pytest.mark.parametrize(("env", "expected_finding", "twin"), [
    ({"FAKE_NVML_ECC_DBE_VOL_1": "2"},
     (FAIL, GPU1, "volatile double-bit ECC errors", "2", "hardware"), {"FAKE_NVML_ECC_DBE_VOL_1": "0"}),
    ({"FAKE_NVML_ECC_DBE_AGG_0": "1"},
     (WARN, GPU0, "aggregate double-bit ECC errors", "1", "hardware"), {"FAKE_NVML_ECC_DBE_AGG_0": "0"}),
    ({"FAKE_NVML_ECC_SBE_VOL_0": "1001"},
     (WARN, GPU0, "volatile single-bit ECC errors", "1001", "threshold"), {"FAKE_NVML_ECC_SBE_VOL_0": "1000"}),
    ({"FAKE_NVML_RETIRED_SBE_0": "30", "FAKE_NVML_RETIRED_DBE_0": "30"},
     (FAIL, GPU0, "retired pages", "60", "hardware"), {"FAKE_NVML_RETIRED_SBE_0": "29", "FAKE_NVML_RETIRED_DBE_0": "30"}),
    ({"FAKE_NVML_RETIRED_PENDING_1": "1"},
     (FAIL, GPU1, "page retirements pending", "1", "hardware"), {"FAKE_NVML_RETIRED_PENDING_1": "0"}),
    ({"FAKE_NVML_REMAP_PENDING_0": "1"},
     (FAIL, GPU0, "row remappings pending", "1", "hardware"), {"FAKE_NVML_REMAP_CORR_0": "3"}),
    ({"FAKE_NVML_REMAP_FAILED_0": "1"},
     (FAIL, GPU0, "row remapping failures", "1", "hardware"), {"FAKE_NVML_REMAP_UNC_0": "2"}),
    ({"FAKE_NVML_THROTTLE_0": "0x8"},
     (FAIL, GPU0, "clocks throttled: hw slowdown", "reasons 0x8", "hardware"), {"FAKE_NVML_THROTTLE_0": "0x4"}),
    ({"FAKE_NVML_THROTTLE_0": "0x40"},
     (FAIL, GPU0, "clocks throttled: hw thermal slowdown", "reasons 0x40", "hardware"), {"FAKE_NVML_THROTTLE_0": "0x1"}),
    ({"FAKE_NVML_THROTTLE_1": "0x80"},
     (FAIL, GPU1, "clocks throttled: hw power brake slowdown", "reasons 0x80", "hardware"),
     {"FAKE_NVML_THROTTLE_1": "0x0"}),
    ({"FAKE_NVML_THROTTLE_1": "0x21"},
     (WARN, GPU1, "clocks throttled: sw thermal slowdown", "reasons 0x21", "threshold"), {"FAKE_NVML_THROTTLE_1": "0x5"}),
    ({"FAKE_NVML_TEMP_0": "87"}, (FAIL, GPU0, "temperature", "87 C", "threshold"), {"FAKE_NVML_TEMP_0": "81"}),
    ({"FAKE_NVML_TEMP_0": "82"}, (WARN, GPU0, "temperature", "82 C", "threshold"), {"FAKE_NVML_TEMP_0": "81"}),
    ({"FAKE_NVML_POWER_MW_1": "665001"}, (WARN, GPU1, "power", "665 W", "threshold"), {"FAKE_NVML_POWER_MW_1": "665000"}),
    ({"FAKE_NVML_PCIE_WIDTH_0": "8"},
     (FAIL, GPU0, "PCIe link width", "x8", "hardware"), {"FAKE_NVML_PCIE_WIDTH_0": "16"}),
    ({"FAKE_NVML_PCIE_GEN_0": "3", "FAKE_NVML_THROTTLE_0": "0"},  # busy and below the maximum
     (WARN, GPU0, "PCIe link generation (busy GPU)", "gen3", "hardware"),
     {"FAKE_NVML_PCIE_GEN_0": "1", "FAKE_NVML_THROTTLE_0": "1"}),  # idle: the link saves power
    ({"FAKE_NVML_NVLINK_DOWN_1": "5"},
     (FAIL, GPU1, "NVLink links down", "5", "hardware"), {"FAKE_NVML_NVLINKS": "12"}),
    ({"FAKE_NVML_NVLINK_CRC_0": "101"},
     (WARN, GPU0, "NVLink 0 CRC errors", "101", "network"), {"FAKE_NVML_NVLINK_CRC_0": "100"}),
    ({"FAKE_NVML_NVLINK_REPLAY_1": "500"},
     (WARN, GPU1, "NVLink 0 replay errors", "500", "network"), {"FAKE_NVML_NVLINK_REPLAY_1": "100"}),
    ({"FAKE_NVML_PERSISTENCE_1": "0"},
     (WARN, GPU1, "persistence mode", "disabled", "image"), {"FAKE_NVML_PERSISTENCE_1": "1"}),
    ({"FAKE_NVML_FABRIC_STATE_0": "1"},
     (FAIL, GPU0, "Fabric Manager state", "not started", "image"), {"FAKE_NVML_FABRIC_STATE": "0"}),
    ({"FAKE_NVML_FABRIC_STATE_1": "2"},
     (WARN, GPU1, "Fabric Manager state", "in progress", "image"), {"FAKE_NVML_FABRIC_STATE_1": "3"}),
    ({"FAKE_NVML_FABRIC_STATUS_0": "5"},
     (FAIL, GPU0, "Fabric Manager registration", "nvmlReturn_t 5", "network"), {"FAKE_NVML_FABRIC_STATUS_0": "0"}),
    ({"FAKE_NVML_PROCS": "1", "FAKE_NVML_PID": DEAD_PID},
     (FAIL, GPU0, "held by a process that no longer exists", f"pid {DEAD_PID}", "workload"),
     {"FAKE_NVML_PROCS": "1", "FAKE_NVML_PID": str(os.getpid())}),
    ({"FAKE_NVML_EVENT_XID": "79", "FAKE_NVML_EVENT_GPU": "1"},
     (FAIL, GPU1, "XID 79 (GPU has fallen off the bus) in NVML's events", "79", "hardware"), {"FAKE_NVML_EVENT_XID": "0"}),
    ({"FAKE_NVML_EVENT_XID": "13"},
     (WARN, GPU0, "XID 13 (graphics engine exception) in NVML's events", "13", "workload"), {}),
    ({"FAKE_NVML_EVENT_XID": "999"},
     (WARN, GPU0, "XID 999 (not in the common list) in NVML's events", "999", "hardware"), {}),
])
def test_each_fault_fails_and_its_twin_passes(fake_lib, env, expected_finding, twin):
    c = judged(fake_lib, expected=2, **env)
    assert findings(c) == [expected_finding]
    assert c.status == expected_finding[0]
    assert c.next_step == c.data["findings"][0]["next_step"] and c.next_step.startswith(("drain the node", "fix the node image",
                                                                                "look ", "raise the threshold"))
    assert c.details[0].startswith(f"n1 {expected_finding[1]}: {expected_finding[2]} {expected_finding[3]} (threshold ")
    assert judged(fake_lib, expected=2, **twin).status == PASS


def test_gpu_count_against_the_expected(fake_lib):
    c = judged(fake_lib, expected=4)
    assert c.data["findings"] == [{"status": FAIL, "where": "node", "what": "GPU count", "value": "2",
                                   "threshold": "4 expected", "cls": "hardware", "node": "n1",
                                   "next_step": "drain the node and reboot it"}]
    assert findings(judged(fake_lib, expected=1)) == [(WARN, "node", "GPU count", "2", "image")]
    assert judged(fake_lib, expected=2).status == PASS
    assert judged(fake_lib, expected=None).status == PASS


@pytest.mark.parametrize(("log", "expected_finding"), [
    ("xid79.log", (FAIL, GPU1, "XID 79 (GPU has fallen off the bus) in the kernel log",
                   "NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                   "hardware")),
    ("kmsg-xid94.log", (FAIL, GPU0, "XID 94 (contained ECC error) in the kernel log",
                        "NVRM: Xid (PCI:0000:18:00): 94, pid=2211, name=python, Contained: SM (0x1). RST: No, "
                        "D-RST: No", "hardware")),
])
def test_xids_of_the_kernel_log(fake_lib, log, expected_finding):
    c = judged(fake_lib, "--kernel-log", str(LOGS / log))
    assert findings(c) == [expected_finding]
    assert judged(fake_lib, "--kernel-log", str(LOGS / "clean.log")).status == PASS


def test_repeated_xid_lines_are_one_workload_finding(fake_lib):
    c = judged(fake_lib, "--kernel-log", str(LOGS / "xid13.log"))
    assert [f[:3] + f[4:] for f in findings(c)] == [
        (WARN, GPU0, "XID 13 (graphics engine exception) in the kernel log", "workload")]
    assert c.next_step == "look at the job that ran (an application fault); the GPU stays usable"


def test_unreadable_kernel_log_is_a_note_not_a_failure(fake_lib, tmp_path):
    c = judged(fake_lib, "--kernel-log", str(tmp_path / "missing.log"))
    assert c.status == PASS
    assert c.details == [f"n1: XIDs of the kernel log not read: cannot read {tmp_path / 'missing.log'}: "
                         "No such file or directory"]


@pytest.mark.parametrize(("tree", "expected_finding"), [
    ("down", (FAIL, "mlx5_1 port 1 (InfiniBand)", "port state", "1: DOWN", "network")),
    ("slow", (WARN, "mlx5_1 port 1 (InfiniBand)", "port rate", "200.0 Gb/s", "network")),
])
def test_infiniband_ports_from_sysfs(fake_lib, tree, expected_finding):
    c = judged(fake_lib, "--ib-root", str(IB / tree))
    assert findings(c) == [expected_finding]
    assert c.next_step == "drain the node; check the port's cable, transceiver and switch port"
    assert judged(fake_lib, "--ib-root", str(IB / "healthy")).status == PASS  # 200 Gb/s RoCE beside 400 Gb/s IB


def test_a_failing_nvml_call_warns_and_the_rest_is_still_read(fake_lib):
    c = judged(fake_lib, FAKE_NVML_FAIL="nvmlDeviceGetTemperature", FAKE_NVML_ECC_DBE_VOL_0="1")
    assert findings(c) == [
        (FAIL, GPU0, "volatile double-bit ECC errors", "1", "hardware"),
        (WARN, "NVML", "call failed", "nvml: GPU 0: nvmlDeviceGetTemperature returned nvmlReturn_t 999", "hardware"),
        (WARN, "NVML", "call failed", "nvml: GPU 1: nvmlDeviceGetTemperature returned nvmlReturn_t 999", "hardware")]


def test_nvml_that_cannot_initialise_fails_the_count(fake_lib):
    c = judged(fake_lib, expected=2, FAKE_NVML_FAIL="nvmlInit_v2")
    assert findings(c) == [(FAIL, "node", "GPU count", "0", "hardware"),
                           (WARN, "NVML", "call failed", "nvml: nvmlInit_v2 returned nvmlReturn_t 999", "hardware")]


def test_not_supported_readings_are_not_findings(fake_lib):
    """A GPU without ECC (NVML_ERROR_NOT_SUPPORTED) passes; nothing is invented."""
    c = judged(fake_lib, FAKE_NVML_NOTSUP="nvmlDeviceGetTotalEccErrors", FAKE_NVML_ECC_DBE_VOL="5")
    assert (c.status, c.data) == (PASS, {"findings": []})


def test_a_missing_symbol_is_not_offered(old_driver):
    """An older driver lacks row remapping and fabric info: those are not read, the rest still is."""
    doc = json.loads(agent(old_driver, FAKE_NVML_REMAP_PENDING="1").stdout)
    assert doc["errors"] == [] and "remap_pending" not in doc["gpus"][0] and "fabric_state" not in doc["gpus"][0]
    assert judged(old_driver, FAKE_NVML_REMAP_PENDING="1").status == PASS
    assert findings(judged(old_driver, FAKE_NVML_TEMP_1="90")) == [(FAIL, GPU1, "temperature", "90 C", "threshold")]


def test_a_hanging_nvml_call_is_bounded_by_the_timeout(fake_lib):
    t0 = time.monotonic()
    c = judged(fake_lib, "--timeout-s", "2", FAKE_NVML_HANG="nvmlDeviceGetPowerUsage")
    took = time.monotonic() - t0
    assert findings(c) == [(FAIL, "NVML", "did not answer", "nvml: no answer within 2 s (a hung NVML call)",
                            "hardware")]
    assert c.next_step == "drain the node and reboot it"
    assert took < 20, f"took {took:.1f} s"


def test_no_library_is_skipped_and_expected_gpus_fail(tmp_path):
    c = judged(tmp_path, "--ib-root", str(tmp_path))
    assert (c.status, c.message) == (SKIP, "no GPUs and no InfiniBand/RoCE ports reported")
    assert findings(judged(tmp_path, "--ib-root", str(tmp_path), expected=8)) == [
        (FAIL, "node", "GPU count", "0", "hardware")]


def test_per_sku_overrides(fake_lib, tmp_path):
    over = tmp_path / "thresholds.yaml"
    over.write_text("defaults: {ecc_sbe_volatile_max: 10}\nskus:\n  NVIDIA H200: {temperature_margin_c: 0}\n")
    assert judged(fake_lib, thresholds=str(over), FAKE_NVML_TEMP_0="86").status == PASS
    assert findings(judged(fake_lib, thresholds=str(over), FAKE_NVML_ECC_SBE_VOL_0="11")) == [
        (WARN, GPU0, "volatile single-bit ECC errors", "11", "threshold")]
    assert judged(fake_lib, FAKE_NVML_TEMP_0="86").status == WARN  # the table's 5 C margin


@pytest.mark.parametrize(("text", "error"), [
    ("defaults: {temperature_margin_c: -1}\n", "defaults.temperature_margin_c: -1 is not an integer in 0..200"),
    ("skus:\n  NVIDIA H200: {nope: 1}\n", "skus.NVIDIA H200.nope"),
    ("skus:\n  NVIDIA H200: [1]\n", "skus.NVIDIA H200: [1] is not a mapping of thresholds"),
    ("thresholds: {}\n", "must be a mapping with the keys defaults and skus"),
    ("defaults: {power_ratio_max: yes}\n", "defaults.power_ratio_max"),
])
def test_bad_threshold_files_name_the_file_and_field(tmp_path, text, error):
    over = tmp_path / "t.yaml"
    over.write_text(text)
    with pytest.raises(EnvbuildError) as e:
        limits(str(over))
    assert str(over) in str(e.value) and error in str(e.value)
    assert "\n" not in str(e.value)


def test_hostile_agent_output_is_refused_in_one_line():
    bad = json.dumps({"nvml": "ok", "gpus": [{"index": 0, "name": "x", "uuid": "u", "pci_bus_id": "b",
                                              "ecc_dbe_volatile": -1}], "xids": [], "kernel_log": "k",
                      "kernel_log_error": None, "ib_ports": [], "errors": []})
    with pytest.raises(EnvbuildError) as e:
        parse(Completed(0, bad + "\n", ""), "n1")
    assert e.value.exit_code == 3 and "gpus[0].ecc_dbe_volatile" in str(e.value)


def envbuild(lib: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML")}
    run_env.update(env, PYTHONPATH=str(ROOT), LD_LIBRARY_PATH=str(lib))
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], env=run_env, capture_output=True, text=True,
                          timeout=120)


RESET = "drain the node and reset the GPU (nvidia-smi -r -i INDEX with no process on it)"


def test_gate_runs_gpu_health_and_drains_on_it(fake_lib, tmp_path):
    """``envbuild gate`` on this host with the stand-in library: the host matches its own report, so only
    gpu-health decides; the next step is in the line."""
    report = tmp_path / "node.json"
    report.write_text(envbuild(fake_lib, "probe", "--host").stdout)
    gate = ("gate", "--against", str(report), "--checks", "gpu-health", "--no-history", "--json")
    proc = envbuild(fake_lib, *gate, FAKE_NVML_RETIRED_PENDING_1="1")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2
    assert doc["checks"] == [{"name": "gpu-health", "status": "fail", "message": doc["checks"][0]["message"],
                              "cls": "hardware", "next_step": RESET}]
    assert doc["lines"] == [f"fail: gpu-health: {doc['node']} {GPU1}: page retirements pending 1 (threshold <= "
                            f"0) [hardware] next: {RESET}"]
    proc = envbuild(fake_lib, *gate, "--gpus", "3")
    assert (proc.returncode, json.loads(proc.stdout)["lines"]) == (2, [
        f"fail: gpu-health: {json.loads(proc.stdout)['node']} node: GPU count 2 (threshold 3 expected) [hardware] "
        "next: drain the node and reboot it"])
    proc = envbuild(fake_lib, *gate, "--gpus", "2")  # the passing twin
    assert (proc.returncode, json.loads(proc.stdout)["checks"][0]) == (0, {  # no class, no next step
        "name": "gpu-health", "status": "pass", "message": "2 GPUs healthy on 1 node(s)", "cls": None, "next_step": None})


def test_gate_usage_of_the_health_options(fake_lib, tmp_path):
    for args, text in [(["--gpus", "-1"], "--gpus"), (["--gpus", "x"], "--gpus")]:
        proc = envbuild(fake_lib, "gate", "--against", str(tmp_path / "r.json"), *args)
        assert proc.returncode == 64 and text in proc.stderr
    bad = tmp_path / "t.yaml"
    bad.write_text("defaults: {nope: 1}\n")
    for command in (["gate", "--against", str(tmp_path / "none.json"), "--drain", "--node", "n1"],
                    ["doctor", str(tmp_path / "none.json")]):  # refused before the certificate or a node is read
        proc = envbuild(fake_lib, *command, "--gpu-thresholds", str(bad))
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            f"error: {bad}: defaults.nope: unknown key; allowed keys: ecc_dbe_volatile_max, ecc_dbe_aggregate_max, "
            "ecc_sbe_volatile_max, retired_pages_max, temperature_margin_c, power_ratio_max, nvlink_crc_errors_max, "
            "nvlink_replay_errors_max, ib_rate_min_gbps, persistence_required, memory_held_max_mib"]


@pytest.mark.parametrize(("gpus_per_node", "status"), [(4, "fail"), (2, "pass"), (0, "pass")])
def test_gate_expects_the_certificates_gpu_count(fake_lib, tmp_path, gpus_per_node, status):
    """Without --gpus the certificate's gpus_per_node is the count (0, a CPU certificate: not checked)."""
    cert = json.loads((ROOT / "tests" / "fixtures" / "certificate-profiles.json").read_text())
    path = tmp_path / "cert.json"
    path.write_text(json.dumps({**cert, "gpus_per_node": gpus_per_node}))
    proc = envbuild(fake_lib, "gate", "--against", str(path), "--checks", "gpu-health", "--no-history", "--json")
    [health] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "gpu-health"]
    assert health["status"] == status
    if status == "fail":
        assert health["message"].endswith(" node: GPU count 2 (threshold 4 expected) [hardware] next: drain the node "
                                          "and reboot it")


def test_the_table_names_only_readings_thresholds_classes_and_steps_that_exist():
    from builder.core.errors import NEXT_STEPS, FailureClass
    from builder.nodes.doctor.agent_output import GpuReading
    from builder.nodes.doctor.gpu_health_rules import Thresholds, table

    t = table()
    rows = t["counters"] + list(t["throttle"].values()) + list(t["xids"].values())
    assert {r["next"] for r in rows} <= set(NEXT_STEPS)
    assert {r["class"] for r in rows} <= {c.value for c in FailureClass}
    assert {r["status"] for r in rows} == {FAIL, WARN}
    assert {r["reading"] for r in t["counters"]} <= set(GpuReading.__struct_fields__)
    assert {r["max"] for r in t["counters"] if isinstance(r["max"], str)} <= set(Thresholds.__struct_fields__)
    assert set(t["xids"]) == {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 93, 94, 95, 119, 120}
