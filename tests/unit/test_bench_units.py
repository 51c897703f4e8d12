"""builder/agent/bench pure logic, on the host without torch: nccl-tests bandwidth formulas,
the exact all-reduce pattern, checksum majority, fault specs, options, atomic writes."""

from __future__ import annotations

import ctypes
import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from builder.agent.bench import DEFAULT_SIZES, RESULT_SCHEMA, allreduce, ddp, faults, node, progress
from builder.agent.bench import __main__ as cli

REPO = Path(__file__).resolve().parents[2]


def test_host_imports_do_not_pull_in_torch():
    code = ("import sys; import builder.agent.bench, builder.agent.bench.allreduce, builder.agent.bench.ddp, "
            "builder.agent.bench.faults, builder.agent.bench.__main__, builder.agent.bench.progress, builder.agent.bench.node; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --- nccl-tests formulas (doc/PERFORMANCE.md; GetBw in src/all_reduce.cu) ---------------

@pytest.mark.parametrize("n, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), (16, 1.875)])
def test_busbw_factor(n, factor):
    assert allreduce.busbw_factor(n) == factor


def test_busbw_factor_rejects_no_ranks():
    with pytest.raises(ValueError):
        allreduce.busbw_factor(0)


def test_algbw_and_busbw():
    # 1 GB in 1 s is 1 GB/s; 8 MiB in 10 ms is 0.8388608 GB/s.
    assert allreduce.algbw_gbps(1_000_000_000, 1_000_000.0) == 1.0
    assert allreduce.algbw_gbps(8388608, 10_000.0) == pytest.approx(0.8388608, rel=1e-12)
    assert allreduce.busbw_gbps(100.0, 8) == 175.0  # PERFORMANCE.md: 8 ranks -> x1.75
    assert allreduce.busbw_gbps(100.0, 1) == 0.0
    assert allreduce.algbw_gbps(1024, 0.0) == 0.0


def test_pattern_and_expected_sum():
    assert [allreduce.pattern_value(i, 0) for i in (0, 1, 250, 251, 252)] == [0, 1, 250, 0, 1]
    assert allreduce.pattern_value(250, 3) == 253
    assert allreduce.expected_sum(0, 1) == 0
    assert allreduce.expected_sum(0, 2) == 1
    assert allreduce.expected_sum(250, 2) == 501
    assert allreduce.expected_sum(252, 8) == 36
    for n in (1, 2, 3, 8):
        for i in (0, 7, 250, 251, 1000):
            assert sum(allreduce.pattern_value(i, r) for r in range(n)) == \
                allreduce.expected_sum(i, n)


def test_largest_expected_value_is_exact_in_float32():
    top = allreduce.expected_sum(250, 5500)
    assert top == 16_497_250
    assert top < 2 ** 24
    assert float(ctypes.c_float(top).value) == top


@pytest.mark.parametrize("size, dtype, count", [(8, "float32", 2), (1024, "float32", 256),
                                                (8, "float64", 1), (16777216, "float64", 2097152)])
def test_element_count(size, dtype, count):
    assert allreduce.element_count(size, dtype) == count


@pytest.mark.parametrize("size, dtype", [(2, "float32"), (6, "float32"), (12, "float64"),
                                         (0, "float32"), (8, "float16")])
def test_element_count_rejects(size, dtype):
    with pytest.raises(ValueError):
        allreduce.element_count(size, dtype)


def test_summarize_takes_the_slowest_rank():
    entry = allreduce.summarize(2000, "float32", [10.0, 20.0], [0, 3])
    assert entry == {"size_bytes": 2000, "count": 500, "type": "float32", "redop": "sum",
                     "time_us": 20.0, "rank_time_us": [10.0, 20.0],
                     "algbw_gbps": pytest.approx(0.1), "busbw_gbps": pytest.approx(0.1),
                     "wrong": None, "wrong_by_rank": [0, 3]}
    four = allreduce.summarize(4000, "float32", [40.0, 10.0, 10.0, 10.0], [0, 0, 0, 0])
    assert four["algbw_gbps"] == pytest.approx(0.1)
    assert four["busbw_gbps"] == pytest.approx(0.15)


def test_format_row():
    entry = {"size_bytes": 1048576, "count": 262144, "type": "float32", "redop": "sum",
             "time_us": 1234.5678, "algbw_gbps": 0.849, "busbw_gbps": 0.849,
             "wrong_by_rank": [0, 1]}
    assert allreduce.format_row(entry) == (
        "       1048576       262144  float32    sum     1234.57        0.849        0.849"
        "        1")
    assert allreduce.HEADER.split() == ["#", "size(B)", "count", "type", "redop", "time(us)",
                                        "algbw(GB/s)", "busbw(GB/s)", "#wrong"]


# --- DDP checksum comparison -------------------------------------------------------------

@pytest.mark.parametrize("checksums, ref, mismatched", [
    (["a", "a", "a"], "a", []),
    (["a", "b", "a"], "a", [1]),
    (["x", "y", "y"], "y", [0]),
    (["a", "b"], "a", [1]),                   # tie: rank 0 is the reference
    (["b", "a", "a", "b"], "b", [1, 2]),      # tie
    (["c", "a", "a", "b", "b"], "c", [1, 2, 3, 4]),  # tie, rank 0 outside it
    (["a"], "a", []),
])
def test_reference_and_mismatched(checksums, ref, mismatched):
    assert ddp.reference_checksum(checksums) == ref
    assert ddp.mismatched_ranks(checksums) == mismatched


def test_reference_checksum_rejects_empty():
    with pytest.raises(ValueError):
        ddp.reference_checksum([])


class FakeTensor:
    """Just enough of a CPU tensor for param_checksum: raw bytes behind a pointer."""

    def __init__(self, data: bytes):
        self.buf = ctypes.create_string_buffer(data, len(data))
        self.n = len(data)

    def detach(self):
        return self

    def cpu(self):
        return self

    def contiguous(self):
        return self

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def numel(self):
        return self.n

    def element_size(self):
        return 1


def test_param_checksum_hashes_concatenated_bytes_in_order():
    params = [("w", FakeTensor(b"abc")), ("b", FakeTensor(b"de"))]
    assert ddp.param_checksum(params) == \
        "36bbe50ed96841d10443bcb670d6554f0a34b761be67ec9c4a8ad2c0c44ca42c"  # sha256(b"abcde")
    assert ddp.param_checksum(reversed(params)) != ddp.param_checksum(params)
    assert ddp.param_checksum([]) == \
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256(b"")


# --- fault specs (test-only) -------------------------------------------------------------

@pytest.mark.parametrize("spec, kind, rank", [("exit@1", "exit", 1),
                                              ("allreduce-corrupt@0", "allreduce-corrupt", 0),
                                              (" ddp-perturb@12 ", "ddp-perturb", 12),
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
                          "iters": 20, "warmup": 5, "dtype": "float32", "ddp_steps": 3,
                          "ddp_batch": 8, "ddp_image_size": 64, "seed": 0,
                          "pg_timeout_s": 600.0, "heartbeat_s": 2.0, "result_to_stdout": False,
                          "profiles": "", "dtypes": ""}
    assert DEFAULT_SIZES == (8, 128, 2048, 32768, 524288, 8388608)
    assert RESULT_SCHEMA == "envbuild.rank-result/1"


def test_options_parsed():
    args = cli.parse_args(["--out", "o", "--backend", "gloo", "--sizes", "8,16", "--iters", "3",
                           "--warmup", "0", "--dtype", "float64", "--ddp-steps", "0",
                           "--ddp-batch", "2", "--ddp-image-size", "32", "--seed", "7",
                           "--pg-timeout-s", "30"])
    assert (args.backend, args.sizes, args.iters, args.warmup, args.dtype, args.ddp_steps,
            args.ddp_batch, args.ddp_image_size, args.seed, args.pg_timeout_s) == \
        ("gloo", [8, 16], 3, 0, "float64", 0, 2, 32, 7, 30.0)


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
    (["--out", "o", "--sizes", "6"], "--sizes: size 6 bytes is not a positive multiple"),
    (["--out", "o", "--dtype", "float64", "--sizes", "8,12"], "size 12 bytes"),
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
