"""Metrics (Prometheus text exposition, checked by Debian's real promtool; the in-pod gate's copy
renders the same bytes and serves them over HTTP), the shipped alert rules (promtool check rules /
test rules), and the one event model: its JSON lines against the published schema, its RFC 5424
line, and the log file written only as a regular file."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from builder.agent.nodegate import check as podcheck
from builder.agent.nodegate import metrics as podmetrics
from builder.cli.app import main
from builder.core import events, metrics
from builder.core.certificate import load_certificate
from builder.core.errors import Unreachable

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "envbuild.rules.yml"


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], input=stdin, capture_output=True, timeout=60)


def test_hostile_label_values_are_escaped_and_pass_promtool():
    text = metrics.render([("envbuild_gate_passed", {"node": 'a"b\\c\nd\x1b', "image": "img"}, 1)])
    assert text.decode().splitlines()[2] == 'envbuild_gate_passed{image="img",node="a\\"b\\\\c d\\\\x1b"} 1.0'
    assert promtool("check", "metrics", stdin=text).returncode == 0


def test_promtool_refuses_an_unescaped_label_value():
    raw = b'# HELP envbuild_gate_passed x\n# TYPE envbuild_gate_passed gauge\nenvbuild_gate_passed{node="a"b"} 1\n'
    assert promtool("check", "metrics", stdin=raw).returncode != 0


POD_SPEC = {"fields": [{"field": "torch.version", "path": ["torch", "version"], "want": "2.13.0+cpu"}],
            "checks": ["gpu-uuid"], "made_at": "2026-12-01T12:40:23Z", "max_age_s": 60.0}


def test_the_pod_gate_renders_what_the_host_renders_with_the_same_help():
    assert {k: metrics.HELP[k] for k in podmetrics.HELP} == podmetrics.HELP
    failures, warnings = podcheck.evaluate(POD_SPEC, {"torch": {"version": "2.13.1+cpu"}})
    statuses = podcheck.statuses(POD_SPEC, failures, warnings)
    assert statuses == {"torch.version": 2, "driver": 0, "certificate": 1, "gpu-uuid": 0}
    samples = podmetrics.gate_samples("gpu-1", 'img"\\x', 2, statuses, 86400.0, 1778666409.0)
    text = podmetrics.render(samples)
    assert text == metrics.render(samples)
    lines = text.decode().splitlines()
    assert lines[2] == 'envbuild_gate_passed{image="img\\"\\\\x",node="gpu-1"} 0.0'
    assert 'envbuild_check_status{check="torch.version",image="img\\"\\\\x",node="gpu-1"} 2.0' in lines
    assert lines[-1] == "envbuild_last_run_timestamp_seconds 1778666409.0"
    assert promtool("check", "metrics", stdin=text).returncode == 0
    passing, _ = podcheck.evaluate(POD_SPEC, {"torch": {"version": "2.13.0+cpu"}})
    assert passing == [] and podcheck.statuses(POD_SPEC, passing, [])["torch.version"] == 0


def test_the_pod_gate_serves_its_last_check_only_at_metrics():
    expo = podmetrics.Exposition()
    httpd = expo.serve(0, "127.0.0.1")
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(url + "/metrics", timeout=30)
        expo.body = podmetrics.render(podmetrics.gate_samples("n", "i", 0, {}, 1.0, 2.0))
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert resp.read() == expo.body
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url + "/", timeout=30)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_certificate_metrics_of_a_real_certificate():
    doc = json.loads((ROOT / "tests/fixtures/certificate-allreduce-ddp.json").read_text())
    cert = load_certificate(doc, file="certificate-allreduce-ddp.json")
    text = metrics.render(metrics.certificate_samples(cert, 1778666409.0)).decode()
    run = 'image="envbuild/cpu-torch2:a0d76dd47f23",run="0123456789ab"'
    assert f"envbuild_certify_passed{{{run}}} 1.0" in text.splitlines()
    assert f"envbuild_certificate_age_seconds{{{run}}} 86400.0" in text.splitlines()
    assert f'envbuild_busbw_gbps{{check="all_reduce",dtype="float32",{run},size="1024"}} 0.05' in text.splitlines()
    assert promtool("check", "metrics", stdin=text.encode()).returncode == 0


def test_metrics_file_is_written_whole_and_never_through_a_symlink(tmp_path):
    target = tmp_path / "envbuild.prom"
    metrics.write(target, [("envbuild_doctor_exit_code", {"node": "n1"}, 2)], 1700000000.0)
    assert target.read_text().splitlines()[-1] == "envbuild_last_run_timestamp_seconds 1700000000.0"
    assert [p.name for p in tmp_path.iterdir()] == ["envbuild.prom"]
    link = tmp_path / "link.prom"
    link.symlink_to(target)
    with pytest.raises(Unreachable, match="symlink"):
        metrics.write(link, [], 1.0)


def test_the_alert_rules_pass_promtool_check_and_their_unit_tests():
    assert promtool("check", "rules", str(RULES)).returncode == 0
    res = promtool("test", "rules", str(ROOT / "tests/fixtures/prometheus/envbuild.rules.test.yml"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_broken_alert_rule_fails_its_unit_test(tmp_path):
    (tmp_path / "deploy/prometheus").mkdir(parents=True)
    (tmp_path / "tests/fixtures/prometheus").mkdir(parents=True)
    broken = RULES.read_text().replace("envbuild_gate_passed == 0", "envbuild_gate_passed == 2")
    (tmp_path / "deploy/prometheus/envbuild.rules.yml").write_text(broken)
    test = ROOT / "tests/fixtures/prometheus/envbuild.rules.test.yml"
    (tmp_path / "tests/fixtures/prometheus" / test.name).write_text(test.read_text())
    res = promtool("test", "rules", str(tmp_path / "tests/fixtures/prometheus" / test.name))
    assert res.returncode == 1
    assert b"EnvbuildGateFailed" in res.stdout + res.stderr


def test_event_lines_match_the_published_schema(tmp_path, monkeypatch):
    log = tmp_path / "run.jsonl"
    monkeypatch.setenv("ENVBUILD_LOG_JSON", str(log))
    events.Sinks().emit(events.event("finding", "fail: shm\nbelow", "error", "r1", "gpu01", 3),
                        events.event("run-end", "gate: exit 2", "error", node="gpu01"))
    schema = json.loads((ROOT / "schemas/log-event.schema.json").read_text())
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        jsonschema.validate(line, schema)
    assert {k: v for k, v in lines[0].items() if k != "ts"} == {
        "level": "error", "run": "r1", "node": "gpu01", "rank": 3, "event": "finding", "msg": "fail: shm below"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**lines[1], "level": "debug"}, schema)


def test_syslog_line_is_rfc5424_with_run_and_node_as_structured_data():
    e = events.Event(ts="2026-12-01T21:00:00.000Z", level="warning", run='r"1]', node="gpu01", rank=None,
                     event="finding", msg="warn: x")
    line = events.syslog_line(e, host="h1").decode()
    assert line.startswith(f'<12>1 2026-12-01T21:00:00.000Z h1 envbuild {os.getpid()} finding '
                           '[envbuild@32473 run="r\\"1\\]" node="gpu01"] {"ts":')
    assert json.loads(line.split("] ", 1)[1])["msg"] == "warn: x"


def test_the_log_file_is_refused_when_it_is_a_fifo(tmp_path):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(Unreachable, match="FIFO|fifo"):
        events.Sinks(str(fifo)).emit(events.event("run-end", "x"))


@pytest.mark.parametrize("value", ["host:99999", "host", "ho st:514", "[::1:514"])
def test_a_bad_syslog_address_is_a_usage_error(value, capsys):
    assert main(["gate", "--against", "c.json", "--syslog", value]) == 64
    assert "HOST:PORT" in capsys.readouterr().err
