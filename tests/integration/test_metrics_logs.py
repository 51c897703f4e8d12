"""Metrics and logs with Debian's real parts, all on free loopback ports: ``gate --metrics-file``
read by prometheus-node-exporter's textfile collector and scraped by a prometheus server (asserted
through its HTTP API), and ``gate --syslog`` received by rsyslog (imudp) into a file read back."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gate_units import gate
from test_gpu_health import GPU1, fake_lib, gpu_node  # noqa: F401 - fake_lib is a fixture

from fixtures_nodes import run_envbuild

pytest_plugins = ["fixtures_nodes"]

HOST = socket.gethostname()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """This host's node report, what the gate compares with here (no certify run needed)."""
    proc = run_envbuild("probe", "--host")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path_factory.mktemp("reference") / "host.json"
    path.write_text(proc.stdout)
    return path


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(probe, timeout_s: float = 60.0):
    """``probe()`` until it returns something true (exceptions count as not yet); that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = probe()
            if value:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s")
        time.sleep(0.5)


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture
def prometheus(tmp_path) -> Iterator[tuple[Path, str]]:
    """``(textfile folder, query URL)``: node_exporter reading the folder, prometheus scraping it every second."""
    folder, ne_port, prom_port = tmp_path / "textfile", free_port(), free_port()
    folder.mkdir()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: node\n    static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]\n")
    procs = [_start(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ne_port}",
                     "--collector.disable-defaults", "--collector.textfile",
                     f"--collector.textfile.directory={folder}"], tmp_path / "node-exporter.log"),
             _start(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                     f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                    tmp_path / "prometheus.log")]
    try:
        yield folder, f"http://127.0.0.1:{prom_port}/api/v1/query"
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def query(url: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode({'query': expr})}", timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def test_gate_passed_reaches_prometheus_through_the_textfile_collector(prometheus, reference, test_session_id):
    folder, url = prometheus
    cert = reference
    prom = folder / "envbuild-gate.prom"
    expr = f'envbuild_gate_passed{{node="{HOST}"}}'
    failed = gate("--against", str(cert), "--no-history", "--checks", "shm", "--min-shm", "100000g",
                  "--metrics-file", str(prom), session=test_session_id)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert subprocess.run(["promtool", "check", "metrics"], input=prom.read_bytes()).returncode == 0
    assert wait_for(lambda: [r["value"][1] for r in query(url, expr)] == ["0"])
    passed = gate("--against", str(cert), "--no-history", "--checks", "shm", "--metrics-file", str(prom),
                  session=test_session_id)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert subprocess.run(["promtool", "check", "metrics"], input=prom.read_bytes()).returncode == 0
    assert wait_for(lambda: [r["value"][1] for r in query(url, expr)] == ["1"])
    status = query(url, f'envbuild_check_status{{node="{HOST}",check="shm"}}')
    assert [r["value"][1] for r in status] == ["0"]


def test_gate_events_reach_rsyslog_as_rfc5424_with_structured_data(tmp_path, reference, test_session_id):
    cert = reference
    port, out = free_port(socket.SOCK_DGRAM), tmp_path / "received.log"
    (tmp_path / "rsyslog.conf").write_text(
        f'global(workDirectory="{tmp_path}")\nmodule(load="imudp")\n'
        f'input(type="imudp" address="127.0.0.1" port="{port}")\n'
        'template(name="sd" type="string" string="%app-name% %msgid% %structured-data% %msg%\\n")\n'
        f'*.* action(type="omfile" file="{out}" template="sd")\n')
    rsyslog = _start(["rsyslogd", "-n", "-f", str(tmp_path / "rsyslog.conf"), "-i", str(tmp_path / "rsyslog.pid")],
                     tmp_path / "rsyslogd.log")
    try:
        wait_for(lambda: subprocess.run(["ss", "-Huln", f"sport = :{port}"], capture_output=True).stdout)
        log = tmp_path / "events.jsonl"
        proc = gate("--against", str(cert), "--no-history", "--checks", "shm", "--min-shm", "100000g",
                    "--syslog", f"127.0.0.1:{port}", "--log-json", str(log), session=test_session_id)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = wait_for(lambda: [ln for ln in out.read_text().splitlines() if "run-end" in ln] and
                         out.read_text().splitlines())
    finally:
        rsyslog.terminate()
        rsyslog.wait(timeout=30)
    end = next(ln for ln in lines if ln.startswith("envbuild run-end "))
    assert end.startswith(f'envbuild run-end [envbuild@32473 node="{HOST}"] ')
    msg = json.loads(end.split("] ", 1)[1])
    assert (msg["event"], msg["level"], msg["node"], msg["msg"]) == ("run-end", "error", HOST, "gate: exit 2")
    finding = json.loads(next(ln for ln in lines if " finding " in ln).split("] ", 1)[1])
    assert finding["msg"].startswith(f"fail: shm: {HOST}: /dev/shm is ")
    assert [json.loads(ln) for ln in log.read_text().splitlines()] == [
        json.loads(ln.split("] ", 1)[1]) for ln in lines if ln.startswith("envbuild ")]


def test_doctor_metrics_carry_the_gpu_health_reading_of_the_sick_gpu(torch_image, nodes_factory, fake_lib, tmp_path):
    sick = gpu_node(nodes_factory, torch_image, "node-0", fake_lib, FAKE_NVML_ECC_DBE_VOL_1="3")
    healthy = gpu_node(nodes_factory, torch_image, "node-1", fake_lib)
    prom = tmp_path / "doctor.prom"
    proc = run_envbuild("doctor", "--container", sick.name, "--checks", "gpu-health", "--metrics-file", str(prom))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = prom.read_text().splitlines()
    assert (f'envbuild_gpu_health_value{{check="volatile double-bit ECC errors",gpu="{GPU1}",'
            f'node="{sick.name}"}} 3.0') in lines
    assert f'envbuild_check_status{{check="gpu-health",node="{HOST}"}} 2.0' in lines
    assert subprocess.run(["promtool", "check", "metrics"], input=prom.read_bytes()).returncode == 0
    # the passing twin: no reading, the check passes
    proc = run_envbuild("doctor", "--container", healthy.name, "--checks", "gpu-health", "--metrics-file", str(prom))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = prom.read_text().splitlines()
    assert f'envbuild_check_status{{check="gpu-health",node="{HOST}"}} 0.0' in lines
    assert not [ln for ln in lines if ln.startswith("envbuild_gpu_health_value")]


def test_a_metrics_file_that_cannot_be_written_exits_3_after_the_gate_lines(reference, tmp_path, test_session_id):
    cert = reference
    (tmp_path / "dir.prom").mkdir()
    proc = gate("--against", str(cert), "--no-history", "--checks", "shm", "--metrics-file",
                str(tmp_path / "dir.prom"), session=test_session_id)
    assert proc.returncode == 3
    assert proc.stdout.splitlines()[-1] == f"gate: {HOST} against {cert}: 0 failed, 0 warnings -> exit 0"
    assert proc.stderr.splitlines() == [f"error: {tmp_path / 'dir.prom'}: is a directory, not a regular file: "
                                        "envbuild writes only regular files, never through a symlink "
                                        "(remove it or give another path)"]
