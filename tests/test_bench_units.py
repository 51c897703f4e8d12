"""builder/bench pure logic, on the host without torch: nccl-tests bandwidth formulas,
the exact all-reduce pattern, checksum majority, fault specs, options, atomic writes."""

from __future__ import annotations

import ctypes
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from builder.bench import DEFAULT_SIZES, RESULT_SCHEMA, allreduce, ddp, faults
from builder.bench import __main__ as cli

REPO = Path(__file__).resolve().parents[1]


def test_host_imports_do_not_pull_in_torch():
    code = ("import sys; import builder.bench, builder.bench.allreduce, builder.bench.ddp, "
            "builder.bench.faults, builder.bench.__main__; print('torch' in sys.modules)")
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
    assert "%s" % (fault,) == f"{kind}@{rank}"
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
                          "pg_timeout_s": 600.0}
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


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --out"),
    (["--out", "o", "--backend", "mpi"], "invalid choice: 'mpi'"),
    (["--out", "o", "--iters", "0"], "--iters must be >= 1"),
    (["--out", "o", "--sizes", "6"], "--sizes: size 6 bytes is not a positive multiple"),
    (["--out", "o", "--dtype", "float64", "--sizes", "8,12"], "size 12 bytes"),
    (["--out", "o", "--ddp-batch", "1"], "--ddp-batch must be >= 2"),
    (["--out", "o", "--ddp-image-size", "16"], "--ddp-image-size must be >= 32"),
    (["--out", "o", "--sizes", "1k"], "size '1k' is not a positive integer"),
])
def test_usage_errors_exit_64(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 64
    assert message in capsys.readouterr().err


def test_not_under_torchrun_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO / "builder")
    out = subprocess.run([sys.executable, "-m", "bench", "--out", "/nonexistent"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 64
    assert "RANK, WORLD_SIZE and LOCAL_RANK are unset: launch under torchrun" in out.stderr


def test_bad_fault_spec_is_a_usage_error():
    env = dict(os.environ, PYTHONPATH=str(REPO / "builder"), RANK="0", WORLD_SIZE="1",
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
