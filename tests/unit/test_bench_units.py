"""builder/agent/bench pure logic, on the host without torch: nccl-tests bandwidth formulas,
the exact all-reduce pattern, checksum majority, fault specs, options, atomic writes."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from builder.agent.bench import DEFAULT_SIZES, RESULT_SCHEMA, faults, node, progress
from builder.agent.bench import __main__ as cli

REPO = Path(__file__).resolve().parents[2]


def test_host_imports_do_not_pull_in_torch():
    code = ("import sys; import builder.agent.bench, builder.agent.bench.train_ddp, builder.agent.bench.profiles, "
            "builder.agent.bench.faults, builder.agent.bench.__main__, builder.agent.bench.progress, builder.agent.bench.node; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --- fault specs (test-only) -------------------------------------------------------------

@pytest.mark.parametrize("spec, kind, rank", [("exit@1", "exit", 1),
                                              (" exit@12 ", "exit", 12),
                                              ("sleep@3", "sleep", 3)])
def test_parse_fault(spec, kind, rank):
    fault = faults.parse_fault(spec)
    assert (fault.kind, fault.rank) == (kind, rank)
    assert str(fault) == f"{kind}@{rank}"
    assert "%s" % (fault,) == f"{kind}@{rank}"  # noqa: UP031 - what %-formatting prints
    assert fault.hits(kind, rank) and not fault.hits(kind, rank + 1)
    assert not fault.hits("other", rank)


@pytest.mark.parametrize("spec", [None, "", "   "])
def test_parse_fault_unset(spec):
    assert faults.parse_fault(spec) is None


@pytest.mark.parametrize("spec, message", [
    ("exit", "expected KIND@RANK"),
    ("crash@1", "unknown kind 'crash'"),
    ("allreduce-corrupt@1", "unknown kind 'allreduce-corrupt'"),  # the legacy sweep is gone
    ("exit@-1", "rank '-1' is not a non-negative integer"),
    ("exit@x", "rank 'x' is not a non-negative integer"),
    ("exit@", "rank '' is not a non-negative integer"),
])
def test_parse_fault_rejects(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        faults.parse_fault(spec)


# --- options -----------------------------------------------------------------------------

def test_parse_sizes():
    assert cli.parse_sizes("8,1024, 65536") == [8, 1024, 65536]
    assert cli.parse_sizes("16,,8,") == [16, 8]


@pytest.mark.parametrize("text", ["", ",", "0", "-8", "1k", "8,x"])
def test_parse_sizes_rejects(text):
    with pytest.raises(ValueError):
        cli.parse_sizes(text)


def test_defaults():
    args = cli.parse_args(["--out", "/results"])
    assert vars(args) == {"out": "/results", "backend": None, "sizes": list(DEFAULT_SIZES),
                          "iters": 10, "warmup": 2, "ddp_steps": 3,
                          "ddp_batch": 4, "ddp_image_size": 32, "seed": 0,
                          "pg_timeout_s": 600.0, "heartbeat_s": 2.0, "result_to_stdout": False,
                          "profiles": "ddp", "dtypes": ""}
    assert DEFAULT_SIZES == (8, 128, 2048, 32768, 524288, 8388608)
    assert RESULT_SCHEMA == "envbuild.rank-result/3"


def test_options_parsed():
    args = cli.parse_args(["--out", "o", "--backend", "gloo", "--sizes", "8,16", "--iters", "3",
                           "--warmup", "0", "--ddp-steps", "1",
                           "--ddp-batch", "2", "--ddp-image-size", "32", "--seed", "7",
                           "--pg-timeout-s", "30"])
    assert (args.backend, args.sizes, args.iters, args.warmup, args.ddp_steps,
            args.ddp_batch, args.ddp_image_size, args.seed, args.pg_timeout_s) == \
        ("gloo", [8, 16], 3, 0, 1, 2, 32, 7, 30.0)


def test_profiles_option_normalized():
    args = cli.parse_args(["--out", "o", "--profiles", "tp, ddp,tp", "--dtypes", "float32,bfloat16"])
    assert (args.profiles, args.dtypes) == ("ddp,tp", "float32,bfloat16")
    assert cli.parse_args(["--out", "o", "--profiles", "all"]).profiles == "ddp,fsdp,tp,pipeline,moe"


@pytest.mark.parametrize("argv, message", [
    (["--out", "o", "--profiles", "zero"], "--profiles/--dtypes: unknown profile 'zero'"),
    (["--out", "o", "--profiles", "ddp", "--dtypes", "int8"], "--profiles/--dtypes: unsupported dtype 'int8'"),
])
def test_profiles_option_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 64 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --out"),
    (["--out", "o", "--backend", "mpi"], "invalid choice: 'mpi'"),
    (["--out", "o", "--iters", "0"], "--iters must be >= 1"),
    (["--out", "o", "--ddp-steps", "0"], "--ddp-steps must be >= 1"),
    (["--out", "o", "--ddp-batch", "1"], "--ddp-batch must be >= 2"),
    (["--out", "o", "--ddp-image-size", "16"], "--ddp-image-size must be >= 32"),
    (["--out", "o", "--sizes", "1k"], "size '1k' is not a positive integer"),
    (["--out", "o", "--heartbeat-s", "nan"], "--heartbeat-s must be in 0..3600"),
    (["--out", "o", "--heartbeat-s", "-1"], "--heartbeat-s must be in 0..3600"),
])
def test_usage_errors_exit_64(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 64
    assert message in capsys.readouterr().err


def test_not_under_torchrun_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "builder" / "agent")
    out = subprocess.run([sys.executable, "-m", "bench", "--out", "/nonexistent"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 64
    assert "RANK, WORLD_SIZE and LOCAL_RANK are unset: launch under torchrun" in out.stderr


def test_bad_fault_spec_is_a_usage_error():
    env = dict(os.environ, PYTHONPATH=str(REPO / "builder" / "agent"), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", ENVBUILD_BENCH_FAULT="explode@0")
    out = subprocess.run([sys.executable, "-m", "bench", "--out", "/nonexistent"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 64
    assert "unknown kind 'explode'" in out.stderr


# --- result file -------------------------------------------------------------------------

def test_write_json_atomic(tmp_path):
    path = tmp_path / "rank-0.json"
    path.write_text("old")
    cli.write_json_atomic(str(path), {"rank": 0, "x": [1.5]})
    assert json.loads(path.read_text()) == {"rank": 0, "x": [1.5]}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.json"]


def test_write_json_atomic_failure_leaves_old_file(tmp_path):
    path = tmp_path / "rank-1.json"
    path.write_text('{"old": true}')
    with pytest.raises(ValueError):
        cli.write_json_atomic(str(path), {"t": float("nan")})
    assert path.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-1.json"]


def test_utc_now_iso():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", cli.utc_now_iso())


def test_load_probe_falls_back_to_sibling_file():
    mod = cli.load_probe()
    assert mod.SCHEMA == "envbuild.probe/1"


# --- progress lines and the heartbeat process ---------------------------------------------


def test_phase_lines():
    buf = io.StringIO()
    ticks = iter([10.0, 11.5, 12.25])
    p = progress.Progress(1, "0123456789ab", heartbeat_s=0, writer=progress.Writer(buf), clock=lambda: next(ticks))
    p.phase("init", "process group (gloo)", collective=True)
    p.phase("all-reduce", "8 B", collective=True)
    p.phase("probe")
    assert buf.getvalue().splitlines() == [
        '@@envbuild-progress {"collective": true, "detail": "process group (gloo)", "phase": "init", "rank": 1, '
        '"run": "0123456789ab", "seq": 0, "t": 10.0}',
        '@@envbuild-progress {"collective": true, "detail": "8 B", "phase": "all-reduce", "rank": 1, '
        '"run": "0123456789ab", "seq": 1, "t": 11.5}',
        '@@envbuild-progress {"collective": false, "detail": null, "phase": "probe", "rank": 1, '
        '"run": "0123456789ab", "seq": 2, "t": 12.25}',
    ]
    p.result({"rank": 1, "x": "y"})
    assert buf.getvalue().splitlines()[-1] == '@@envbuild-result {"rank": 1, "x": "y"}'


def test_heartbeat_loop_reports_the_state_and_ends_with_the_rank():
    buf = io.StringIO()
    states = iter(["S", "T", "R", None])
    progress.heartbeat_loop(42, 3, "r", 2.0, progress.Writer(buf), clock=lambda: 5.0, sleep=lambda s: None,
                            getppid=lambda: 42, state_of=lambda pid: next(states))
    assert [json.loads(line.split(" ", 1)[1]) for line in buf.getvalue().splitlines()] == [
        {"beat": 1, "rank": 3, "run": "r", "state": "S", "t": 5.0},
        {"beat": 2, "rank": 3, "run": "r", "state": "T", "t": 5.0},
        {"beat": 3, "rank": 3, "run": "r", "state": "R", "t": 5.0},
    ]  # the 4th look found no rank: the loop ended
    buf2 = io.StringIO()
    progress.heartbeat_loop(42, 3, "r", 2.0, progress.Writer(buf2), sleep=lambda s: None,
                            getppid=lambda: 1, state_of=lambda pid: "S")  # reparented: the rank is gone
    assert buf2.getvalue() == ""


RANK_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from bench import progress
p = progress.Progress(0, "run1", heartbeat_s=0.2)
p.start()
print("child", p.heartbeat_pid, flush=True)
time.sleep(60)
"""


def _read_lines(proc, want, timeout=20.0):
    import select
    import time

    lines, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout and not want(lines):
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            lines.append(proc.stdout.readline().rstrip("\n"))
    return lines


def test_heartbeat_process_beats_while_the_rank_lives_and_says_when_it_is_stopped():
    """For real: a rank process (SIGSTOPped, then SIGCONTinued, then killed) and its forked
    heartbeat process: beats with state S, then T while stopped, none once it is gone."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(REPO / "builder" / "agent")], stdout=subprocess.PIPE,
                            text=True)
    try:
        lines = _read_lines(proc, lambda ls: sum('"beat"' in x for x in ls) >= 2)
        start = json.loads(lines[0].split(" ", 1)[1])
        assert start["phase"] == "start" and start["seq"] == 0 and "socket" in start and "interfaces" in start
        child = int(next(x for x in lines if x.startswith("child ")).split()[1])
        beats = [json.loads(x.split(" ", 1)[1]) for x in lines if '"beat"' in x]
        assert {b["state"] for b in beats} <= {"S", "R"} and beats[0]["rank"] == 0 and beats[0]["run"] == "run1"
        os.kill(proc.pid, signal.SIGSTOP)
        lines = _read_lines(proc, lambda ls: any('"state": "T"' in x for x in ls))
        assert any('"state": "T"' in x for x in lines), lines
        os.kill(proc.pid, signal.SIGCONT)
        lines = _read_lines(proc, lambda ls: any('"state": "S"' in x for x in ls))
        assert any('"state": "S"' in x for x in lines), lines
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}") and \
            progress.proc_state(child) not in (None, "Z"):
        time.sleep(0.1)
    assert progress.proc_state(child) in (None, "Z")  # the heartbeat process ended with its rank
    proc.stdout.close()


WRITER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from bench import progress
w = progress.Writer(lock_path=sys.argv[2])
for i in range(30):
    w.line(sys.argv[3] * 200000 + str(i))
"""


def test_lines_of_two_ranks_never_interleave(tmp_path):
    """Two processes on one pipe, lines of 200 kB (far over the pipe's atomic 4 kB): each
    line arrives whole, thanks to the shared flock."""
    lock = str(tmp_path / "out.lock")
    r, w = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(REPO / "builder" / "agent"), lock, ch],
                              stdout=w) for ch in "ab"]
    os.close(w)
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    for p in procs:
        assert p.wait(timeout=60) == 0
    assert len(lines) == 60
    for line in lines:
        body, n = line[:200000], line[200000:]
        assert body in ("a" * 200000, "b" * 200000) and n.isdigit(), line[:50]


# --- the node watchdog ---------------------------------------------------------------------

def test_watchdog_passes_the_exit_status_on():
    assert node.run(10, [sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert node.run(10, [sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]) == 137
    assert node.main(["--deadline-s", "10", "--", sys.executable, "-c", "pass"]) == 0


def test_watchdog_kills_the_whole_tree_at_the_deadline(tmp_path):
    """For real: a command whose child starts its own session (as torchrun's workers do)
    and both sleep; at the deadline both are gone and the status is 124."""
    import time

    pidfile = tmp_path / "pids"
    script = ("import os, subprocess, sys, time\n"
              "c = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
              f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
              "time.sleep(300)\n")
    t0 = time.monotonic()
    code = node.run(2.0, [sys.executable, "-c", script])
    assert code == node.EXIT_DEADLINE == 124
    assert 2.0 <= time.monotonic() - t0 < 10
    grandchild = int(pidfile.read_text())
    time.sleep(0.3)
    assert progress.proc_state(grandchild) in (None, "Z")


@pytest.mark.parametrize("argv", [[], ["--deadline-s", "x", "--", "true"], ["--deadline-s", "0", "--", "true"],
                                  ["--deadline-s", "nan", "--", "true"], ["--deadline-s", "5", "true"],
                                  ["--deadline-s", "5", "--"]])
def test_watchdog_usage_errors_exit_64(argv, capsys):
    assert node.main(argv) == 64
    assert capsys.readouterr().err.startswith("python3 -m bench.node: error: ")
