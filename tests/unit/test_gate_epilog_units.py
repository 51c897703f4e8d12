"""The engine-free tests of tests/integration/test_gate_epilog.py: what ``gate --epilog`` finds a job left
(the stand-in ``libnvidia-ml.so.1``'s answers before and after, read by the real agent), and the
retention of the gate's history, the JSON-lines logs and the certificates (builder/core/retention.py):
each limit with a fault (too many, too old) and its twin."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from test_gpu_health_units import GPU0, GPU1, LOGS, agent, fake_lib  # noqa: F401 - fake_lib: a fixture

from builder.certify.certificate import prune_certificates
from builder.core import retention
from builder.core.errors import UsageError
from builder.core.events import Sinks, event
from builder.nodes.doctor import FAIL, PASS, WARN
from builder.nodes.doctor.base import HealthOptions
from builder.nodes.doctor.gpu_health import check_job_end, parse
from builder.nodes.gate import write_history

from fixtures_nodes import ROOT

DAY = 86400.0


def reading(lib: Path, log: str = "clean.log", **env: str):
    return parse(agent(lib, "--kernel-log", str(LOGS / log), **env), "n1")


def job_end(lib: Path, before: dict, now: dict, before_log: str = "clean.log", now_log: str = "clean.log"):
    return check_job_end("n1", ("prolog.json", reading(lib, before_log, **before)), reading(lib, now_log, **now),
                         HealthOptions())


def rows(check) -> list[tuple[str, str, str, str, str]]:
    return [(f["status"], f["where"], f["what"], f["value"], f["threshold"]) for f in check.data["findings"]]


@pytest.mark.parametrize(("before", "now", "logs", "expected"), [
    ({}, {"FAKE_NVML_ECC_DBE_AGG_1": "2"}, ("clean.log",) * 2,
     (FAIL, GPU1, "aggregate double-bit ECC errors during the job", "2", "0 at the Prolog")),
    ({"FAKE_NVML_ECC_DBE_VOL_0": "1"}, {"FAKE_NVML_ECC_DBE_VOL_0": "3"}, ("clean.log",) * 2,
     (FAIL, GPU0, "volatile double-bit ECC errors during the job", "3", "1 at the Prolog")),
    ({"FAKE_NVML_MEM_USED_0": str(300 << 20)}, {"FAKE_NVML_MEM_USED_0": str(557 << 20)}, ("clean.log",) * 2,
     (FAIL, GPU0, "GPU memory still used after the job", "557 MiB", "<= 300 MiB at the Prolog + 256 MiB")),
    ({}, {}, ("clean.log", "xid79.log"),
     (FAIL, GPU1, "XID 79 (GPU has fallen off the bus) in the kernel log during the job",
      "NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
      "no new XID since the Prolog")),
    ({}, {"FAKE_NVML_EVENT_XID": "13"}, ("clean.log",) * 2,
     (WARN, GPU0, "XID 13 (graphics engine exception) in NVML's events during the job", "13",
      "no new XID since the Prolog")),
])
def test_what_a_job_left_is_found(fake_lib, before, now, logs, expected):
    c = job_end(fake_lib, before, now, *logs)
    assert (c.name, c.status, rows(c)) == ("epilog", expected[0], [expected])
    assert c.details[-1] == "compared with prolog.json"


@pytest.mark.parametrize(("before", "now", "logs"), [
    ({"FAKE_NVML_ECC_DBE_AGG_1": "2"}, {"FAKE_NVML_ECC_DBE_AGG_1": "2"}, ("clean.log",) * 2),  # none new
    ({"FAKE_NVML_MEM_USED_0": str(300 << 20)}, {"FAKE_NVML_MEM_USED_0": str(556 << 20)}, ("clean.log",) * 2),
    ({}, {}, ("xid79.log", "xid79.log")),  # an XID of the kernel log from before the job
])
def test_the_twins_a_job_left_as_it_found(fake_lib, before, now, logs):
    c = job_end(fake_lib, before, now, *logs)
    assert (c.status, c.message) == (PASS, "no new XID, double-bit ECC error or GPU memory held on 2 GPUs since "
                                           "the Prolog record prolog.json")


def test_without_a_prolog_record_the_epilog_warns(fake_lib):
    c = check_job_end("n1", None, reading(fake_lib), HealthOptions())
    assert (c.status, c.message) == (WARN, "no Prolog record of n1 in the gate history: the job's XIDs, ECC errors "
                                           "and GPU memory not compared")


def test_the_epilog_reads_the_record_of_its_own_job(fake_lib, tmp_path, monkeypatch):
    from builder.nodes.gate import GateOptions, _job_end

    hist = tmp_path / "hist"
    for job, env in (("41", {"FAKE_NVML_ECC_DBE_AGG_1": "2"}), ("42", {}), ("43", {"FAKE_NVML_ECC_DBE_AGG_1": "2"})):
        monkeypatch.setenv("SLURM_JOB_ID", job)
        write_history(hist, "n1", {"probed_at": f"2026-12-01T00:00:{job}Z"}, reading(fake_lib, **env))
    opts = GateOptions(against="x", history=str(hist))
    now = reading(fake_lib, FAKE_NVML_ECC_DBE_AGG_1="2")
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # its Prolog saw no error: new ones during the job
    assert _job_end(opts, "n1", now).status == FAIL
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # the twin: its Prolog saw them already
    assert _job_end(opts, "n1", now).status == PASS
    monkeypatch.delenv("SLURM_JOB_ID")  # no job: the newest record (43's)
    assert _job_end(opts, "n1", now).status == PASS
    (hist / "n1" / "health" / sorted(os.listdir(hist / "n1" / "health"))[-1]).write_text("{}")
    c = _job_end(opts, "n1", now)
    assert (c.status, c.message.split(": ")[0]) == (WARN, "the Prolog record cannot be read")


# --- retention ---------------------------------------------------------------------------------------


def test_retention_settings_and_their_refusals(monkeypatch):
    assert retention.limits("history") == (1000, 90 * DAY)
    monkeypatch.setenv("ENVBUILD_KEEP_LOGS", "5")
    monkeypatch.setenv("ENVBUILD_KEEP_LOGS_DAYS", "0.5")
    assert retention.limits("logs") == (5, 0.5 * DAY)
    for var, value in (("ENVBUILD_KEEP_LOGS", "0"), ("ENVBUILD_KEEP_LOGS", "5 "), ("ENVBUILD_KEEP_LOGS_DAYS", "0.0"),
                       ("ENVBUILD_KEEP_LOGS_DAYS", "-1"), ("ENVBUILD_KEEP_LOGS_DAYS", "1e3")):
        monkeypatch.setenv(var, value)
        with pytest.raises(UsageError):
            retention.limits("logs")
        monkeypatch.setenv(var, "5")


def test_a_bad_retention_setting_exits_64_before_the_command_runs(tmp_path):
    exe = ROOT / ".venv" / "bin" / "envbuild"
    proc = subprocess.run([str(exe), "gate", "--against", str(tmp_path / "none.json")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ENVBUILD_KEEP_HISTORY_DAYS": "ninety"})
    assert (proc.returncode, proc.stderr) == (64, "error: ENVBUILD_KEEP_HISTORY_DAYS: 'ninety' must be days, "
                                                  "0.001 to 99999.999\n")


def aged(folder: Path, names_days: dict[str, float], text: str = "{}") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, days in names_days.items():
        (folder / name).write_text(text)
        os.utime(folder / name, (time.time() - days * DAY,) * 2)


def test_history_keeps_at_most_n_reports_none_older_than_d_days(tmp_path, monkeypatch):
    node = tmp_path / "n1"
    aged(node, {"20260101T000000Z-1.json": 100, "20260901T000000Z-1.json": 10, "20261001T000000Z-1.json": 5})
    aged(node / "health", {"20260101T000000Z-1.health": 100})
    new = write_history(tmp_path, "n1", {"probed_at": "2026-12-01T00:00:00Z"})  # too old: the 100-day one goes
    assert sorted(p.name for p in node.glob("*.json")) == ["20260901T000000Z-1.json", "20261001T000000Z-1.json",
                                                           new.name]
    assert list((node / "health").iterdir()) == []
    monkeypatch.setenv("ENVBUILD_KEEP_HISTORY", "2")  # too many: the oldest goes
    newer = write_history(tmp_path, "n1", {"probed_at": "2026-12-02T00:00:00Z"})
    assert sorted(p.name for p in node.glob("*.json")) == sorted([new.name, newer.name])
    monkeypatch.setenv("ENVBUILD_KEEP_HISTORY", "3")  # the twin: within both limits, nothing goes
    last = write_history(tmp_path, "n1", {"probed_at": "2026-12-03T00:00:00Z"})
    assert sorted(p.name for p in node.glob("*.json")) == sorted([new.name, newer.name, last.name])


def lines_of(path: Path) -> list[str]:
    return [json.loads(line)["msg"] for line in path.read_text().splitlines()]


def test_the_json_log_keeps_at_most_n_lines_none_older_than_d_days(tmp_path, monkeypatch):
    log = tmp_path / "logs" / "gate.jsonl"
    sinks = Sinks(str(log))
    old = event("finding", "old").to_dict() | {"ts": "2026-01-01T00:00:00.000Z"}
    log.parent.mkdir()
    log.write_text(json.dumps(old) + "\n")
    sinks.emit(event("finding", "a"), event("finding", "b"))  # too old: the first line goes
    assert lines_of(log) == ["a", "b"]
    monkeypatch.setenv("ENVBUILD_KEEP_LOGS", "3")  # too many: the oldest go
    sinks.emit(event("finding", "c"), event("finding", "d"))
    assert lines_of(log) == ["b", "c", "d"]
    monkeypatch.setenv("ENVBUILD_KEEP_LOGS", "4")  # the twin: within both limits, the file only grows
    inode = log.stat().st_ino
    sinks.emit(event("finding", "e"))
    assert (lines_of(log), log.stat().st_ino) == (["b", "c", "d", "e"], inode)


def test_cut_log_drops_the_cut_first_line_of_a_tail_and_stops_at_a_line_without_ts(monkeypatch):
    monkeypatch.setenv("ENVBUILD_KEEP_LOGS", "10")
    now = time.time()
    assert retention.cut_log(b'rt of a line"}\n{"ts":"2999-01-01T00:00:00.000Z"}\n', partial=True, now=now) == (
        b'{"ts":"2999-01-01T00:00:00.000Z"}\n')
    text = b'not json\n{"ts":"2000-01-01T00:00:00.000Z"}\n'
    assert retention.cut_log(text, now=now) is None  # no ts: it cannot be dated, so it and what follows stay


def cert(passed: bool) -> str:
    return json.dumps({"schema": "envbuild.certificate/2", "verdict": {"passed": passed}})


def test_certificates_keep_at_most_n_none_older_than_d_days_and_the_newest_passing(tmp_path, monkeypatch):
    folder = tmp_path / "certificates"
    aged(folder, {"old-pass.json": 400}, cert(True))
    aged(folder, {"a-fail.json": 3, "b-fail.json": 2, "c-fail.json": 1}, cert(False))
    aged(folder, {"new-fail.json": 0}, cert(False))
    monkeypatch.setenv("ENVBUILD_KEEP_CERTIFICATES", "2")
    prune_certificates(folder / "new-fail.json")  # too many and too old: only the newest passing one is spared
    assert sorted(os.listdir(folder)) == ["c-fail.json", "new-fail.json", "old-pass.json"]
    aged(folder, {"newer-pass.json": 0}, cert(True))
    prune_certificates(folder / "newer-pass.json")  # a newer passing one: the old one goes
    assert sorted(os.listdir(folder)) == ["new-fail.json", "newer-pass.json"]
    monkeypatch.setenv("ENVBUILD_KEEP_CERTIFICATES", "3")  # the twin: within both limits, nothing goes
    aged(folder, {"newest-fail.json": 0}, cert(False))
    prune_certificates(folder / "newest-fail.json")
    assert sorted(os.listdir(folder)) == ["new-fail.json", "newer-pass.json", "newest-fail.json"]



def test_verify_reads_a_history_folder_with_its_gpu_readings(fake_lib, tmp_path):
    from fixtures_nodes import run_envbuild

    doc = json.loads(run_envbuild("probe", "--host").stdout)
    (tmp_path / "ref.json").write_text(json.dumps(doc))
    write_history(tmp_path / "hist", "n1", doc, reading(fake_lib))
    assert [p.suffix for p in sorted((tmp_path / "hist" / "n1").rglob("*.*"))] == [".json", ".health"]
    proc = run_envbuild("verify", "--against", str(tmp_path / "ref.json"), str(tmp_path / "hist"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
