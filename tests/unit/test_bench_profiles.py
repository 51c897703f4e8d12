"""builder/agent/bench profile logic on the host, without torch: nccl-tests columns and bandwidth
formulas per collective, the exact input pattern and expected results (checked against a
pure-Python simulation of each collective), profile and fault parsing, the tolerance rule,
unsupported-error classification and the scaling efficiency. The same code runs for real
in the image in tests/test_bench_profiles_image.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.agent.bench import collectives as coll
from builder.agent.bench import profile_faults as pf
from builder.agent.bench import profiles, scaling, support, train_tp, training

REPO = Path(__file__).resolve().parents[2]
NEW_MODULES = ("collectives", "profiles", "profile_faults", "training", "support", "scaling",
               "features", "train_ddp", "train_fsdp", "train_tp", "train_pipeline", "train_moe")


def test_host_imports_do_not_pull_in_torch():
    imports = "; ".join(f"import builder.agent.bench.{m}" for m in NEW_MODULES)
    code = f"import sys; {imports}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --- nccl-tests columns (src/common.cu) and GetBw (src/<collective>.cu) --------------------

@pytest.mark.parametrize("name, size, dtype, n, count, actual", [
    ("all_reduce", 1024, "float32", 2, 256, 1024),
    ("all_reduce", 10, "float32", 2, 2, 8),
    ("broadcast", 1024, "bfloat16", 8, 512, 1024),
    ("send_recv", 6, "float32", 2, 1, 4),
    ("all_gather", 1000, "float32", 2, 125, 1000),
    ("all_gather", 1001, "float32", 4, 62, 992),
    ("reduce_scatter", 1048576, "float32", 8, 32768, 1048576),
    ("all_to_all", 1048576, "bfloat16", 3, 174762, 1048572),
    ("all_gather", 8, "float32", 4, 0, 0),   # too small for one element per rank
    ("all_reduce", 3, "float32", 1, 0, 0),
])
def test_count_and_size(name, size, dtype, n, count, actual):
    assert coll.count_and_size(name, size, dtype, n) == (count, actual)


@pytest.mark.parametrize("args", [("gather", 8, "float32", 2), ("all_reduce", 8, "int8", 2),
                                  ("all_reduce", 0, "float32", 2), ("all_reduce", 8, "float32", 0)])
def test_count_and_size_rejects(args):
    with pytest.raises(ValueError):
        coll.count_and_size(*args)


@pytest.mark.parametrize("name, factors", [
    # factor at n = 1, 2, 4, 8 (PERFORMANCE.md "Summary"; GetBw in each src/*.cu)
    ("all_reduce", (0.0, 1.0, 1.5, 1.75)),
    ("all_gather", (0.0, 0.5, 0.75, 0.875)),
    ("reduce_scatter", (0.0, 0.5, 0.75, 0.875)),
    ("all_to_all", (0.0, 0.5, 0.75, 0.875)),
    ("broadcast", (1.0, 1.0, 1.0, 1.0)),
    ("send_recv", (1.0, 1.0, 1.0, 1.0)),
])
def test_bus_factor(name, factors):
    assert tuple(coll.bus_factor(name, n) for n in (1, 2, 4, 8)) == factors


def test_bus_factor_rejects():
    with pytest.raises(ValueError):
        coll.bus_factor("all_reduce", 0)
    with pytest.raises(ValueError):
        coll.bus_factor("reduce", 2)


def test_algbw():
    assert coll.algbw_gbps(1_000_000_000, 1_000_000.0) == 1.0
    assert coll.algbw_gbps(8388608, 10_000.0) == pytest.approx(0.8388608, rel=1e-12)
    assert coll.algbw_gbps(1024, 0.0) == 0.0


def test_rank_stats_min_median_max_slowest_and_total():
    times = [1000.0, 2000.0] + [1500.0] * 6
    assert coll.rank_stats(times, [0, 1, 0, 0, 0, 0, 2, 0]) == [1000.0, 1500.0, 2000.0, 1.0, 3.0]
    assert coll.rank_stats([3.0, 1.0, 2.0, 3.0], [0, 0, 0, 0]) == [1.0, 2.5, 3.0, 0.0, 0.0]  # first of equals
    assert coll.rank_stats([5.0], [7]) == [5.0, 5.0, 5.0, 0.0, 7.0]


def test_a_rank_result_does_not_grow_with_the_world():
    """Each rank reports its own figures and the run's summary: its row is the same size at 2
    ranks and at 65,536 (a per-rank list in every row made the host read N^2)."""
    import json

    def row(world):
        stats = coll.rank_stats([10.0] * world, [0] * world)
        return len(json.dumps(coll.summarize("all_reduce", 250, 1000, "float32", "all_reduce", stats, 10.0, 0, world)))

    assert row(2) == row(65536) == 302


def test_shard_weights_are_the_ranks_share_of_each_slice():
    assert training.shard_weights(1) == [1.0]
    assert training.shard_weights(3) == [1 / 3, 1 / 3, 1 / 3]
    assert training.shard_weights(6) == [2 / 6, 2 / 6, 1 / 6, 1 / 6]
    assert len(training.shard_weights(65536)) == 4 and sum(training.shard_weights(65536)) == 1.0
    assert [training.shard_of(r, 6, 2) for r in (0, 3, 4, 5)] == [slice(0, 2), slice(6, 8), slice(0, 2), slice(2, 4)]


def test_summarize_all_gather_row():
    # 8 ranks, 1 MiB total: algbw = S/t with S = count x 4 x 8; busbw x 7/8.
    row = coll.summarize("all_gather", 32768, 1048576, "float32", "all_gather_single",
                         [1000.0, 1500.0, 2000.0, 1.0, 3.0], 1500.0, 2, 8)
    assert row == {"size_bytes": 1048576, "count": 32768, "type": "float32", "redop": "none",
                   "root": -1, "api": "all_gather_single", "time_us": 2000.0,
                   "min_time_us": 1000.0, "median_time_us": 1500.0, "slowest_rank": 1,
                   "algbw_gbps": pytest.approx(0.524288), "busbw_gbps": pytest.approx(0.458752),
                   "wrong": 3, "own_time_us": 1500.0, "own_wrong": 2}


def test_summarize_all_reduce_and_broadcast_rows():
    ar = coll.summarize("all_reduce", 250, 1000, "bfloat16", "all_reduce", [10.0, 10.0, 10.0, 0.0, 0.0], 10.0, 0, 2)
    assert (ar["redop"], ar["root"], ar["algbw_gbps"], ar["busbw_gbps"], ar["wrong"]) == \
        ("sum", -1, pytest.approx(0.1), pytest.approx(0.1), 0)
    bc = coll.summarize("broadcast", 250, 1000, "float32", "broadcast", [10.0, 10.0, 10.0, 0.0, 0.0], 10.0, 0, 1)
    assert (bc["redop"], bc["root"], bc["busbw_gbps"]) == ("none", 0, pytest.approx(0.1))


def test_format_row():
    row = coll.summarize("reduce_scatter", 131072, 1048576, "float32", "x",
                         coll.rank_stats([1234.5678, 1.0], [1, 0]), 1.0, 0, 2)
    assert coll.format_row("reduce_scatter", row) == (
        "  reduce_scatter      1048576       131072  float32     1234.57        0.849"
        "        0.425        1")
    assert coll.HEADER.split() == ["#", "collective", "size(B)", "count", "type", "time(us)",
                                   "algbw(GB/s)", "busbw(GB/s)", "#wrong"]


# --- the exact pattern -------------------------------------------------------------------

@pytest.mark.parametrize("dtype, n, reducing, m", [
    ("float32", 2, True, 251), ("float32", 67108, True, 251), ("float32", 67109, True, 250),
    ("float32", 100000, True, 168), ("bfloat16", 2, True, 129), ("bfloat16", 3, True, 86),
    ("bfloat16", 256, True, 2), ("bfloat16", 4096, False, 251), ("float16", 8, True, 251),
    ("float16", 16, True, 129),
])
def test_modulus(dtype, n, reducing, m):
    assert coll.modulus(dtype, n, reducing) == m
    if reducing:  # the largest sum is exact in the type
        assert n * (m - 1) <= coll.DTYPES[dtype][1]


def test_modulus_refuses_an_inexact_bfloat16_reduction():
    with pytest.raises(support.Unsupported, match="bfloat16 reduction needs <= 256 ranks, not 257"):
        coll.modulus("bfloat16", 257, True)


@pytest.mark.parametrize("s, n, m", [(s, n, m) for m in (2, 5, 129, 251)
                                     for n in (1, 2, 3, 7, 130, 600) for s in (0, 1, m - 1)])
def test_sum_over_ranks_closed_form(s, n, m):
    assert coll.sum_over_ranks(s, n, m) == sum((s + q) % m for q in range(n))


def test_sum_over_ranks_literals():
    assert coll.sum_over_ranks(3, 2, 5) == 7
    assert coll.sum_over_ranks(4, 2, 5) == 4
    assert coll.sum_over_ranks(250, 2, 251) == 250


def simulate(name, n, count, m):
    """Every rank's receive buffer after ``name``, from the collective's definition."""
    send = [[coll.pattern_value(k, r, m) for k in range(coll.send_length(name, count, n))]
            for r in range(n)]
    if name == "all_reduce":
        return [[sum(send[q][i] for q in range(n)) for i in range(count)] for _ in range(n)]
    if name == "all_gather":
        return [[v for q in range(n) for v in send[q]] for _ in range(n)]
    if name == "reduce_scatter":
        return [[sum(send[q][r * count + i] for q in range(n)) for i in range(count)]
                for r in range(n)]
    if name == "broadcast":
        return [list(send[0]) for _ in range(n)]
    if name == "all_to_all":
        return [[v for q in range(n) for v in send[q][r * count:(r + 1) * count]] for r in range(n)]
    return [list(send[(r - 1) % n]) for r in range(n)]  # send_recv ring


@pytest.mark.parametrize("name", coll.COLLECTIVES)
@pytest.mark.parametrize("n, count, m", [(1, 5, 251), (2, 300, 251), (3, 7, 4), (4, 6, 5)])
def test_expected_value_matches_a_simulation(name, n, count, m):
    got = simulate(name, n, count, m)
    for r in range(n):
        assert len(got[r]) == coll.recv_length(name, count, n)
        assert [coll.expected_value(name, i, r, n, count, m) for i in range(len(got[r]))] == got[r]


def test_expected_value_literals():
    assert coll.expected_value("all_gather", 5, 0, 2, 4, 251) == 2  # block 1, element 1
    assert coll.expected_value("all_to_all", 5, 1, 2, 4, 251) == 6  # rank 1 sent 1*4+1+1
    assert coll.expected_value("send_recv", 3, 0, 4, 8, 251) == 6   # from rank 3
    assert coll.expected_value("reduce_scatter", 0, 1, 2, 4, 251) == 9  # 4 + 5
    assert coll.SENTINEL < 0 and coll.CORRUPT_VALUE < 0 and coll.CORRUPT_VALUE != coll.SENTINEL


# --- what counts as unsupported ----------------------------------------------------------

@pytest.mark.parametrize("exc, reason", [
    (RuntimeError("ProcessGroupGloo does not support reduce_scatter"),
     "RuntimeError: ProcessGroupGloo does not support reduce_scatter"),
    (RuntimeError("Numpy is not available"), "RuntimeError: Numpy is not available"),
    (RuntimeError("\n  Unsupported ScalarType BFloat16\nmore"),
     "RuntimeError: Unsupported ScalarType BFloat16"),
    (NotImplementedError("alltoall_base"), "NotImplementedError: alltoall_base"),
    (RuntimeError("Connection closed by peer [172.17.0.2]:41366"), None),
    (RuntimeError("Timed out waiting 20000ms for recv operation to complete"), None),
    (ValueError("does not support"), None),
])
def test_unsupported_reason(exc, reason):
    assert support.unsupported_reason(exc) == reason


def test_needs_numpy():
    assert support.needs_numpy("RuntimeError: Numpy is not available")
    assert support.needs_numpy("ModuleNotFoundError: No module named 'numpy'")
    assert not support.needs_numpy("RuntimeError: does not support bfloat16")
    assert not support.needs_numpy(None)


def test_guarded_maps_unsupported_and_lets_failures_through():
    def lacks():
        raise support.Unsupported("torch 1.13 has no FSDP2 fully_shard")

    def numpy_missing():
        raise RuntimeError("Numpy is not available")

    def broken():
        raise RuntimeError("Connection closed by peer")

    out = training.guarded(lacks)
    assert out["unsupported"] == "torch 1.13 has no FSDP2 fully_shard" and "needs_numpy" not in out
    out = training.guarded(numpy_missing)
    assert (out["unsupported"], out["needs_numpy"]) == ("RuntimeError: Numpy is not available", True)
    assert out["check_wall_s"] >= 0
    with pytest.raises(RuntimeError, match="Connection closed"):
        training.guarded(broken)


def test_resolve_names_the_missing_api():
    def missing():
        import builder.bench.no_such_module  # noqa: F401

    with pytest.raises(support.Unsupported, match=r"has no FSDP2 fully_shard \(ModuleNotFoundError"):
        training.resolve("FSDP2 fully_shard", missing)
    assert training.resolve("x", lambda: 42) == 42


# --- tolerance and result shape ----------------------------------------------------------

@pytest.mark.parametrize("a, b, ok", [
    (1.0, 1.0, True), (1.0 + 5e-6, 1.0, True), (1.0 + 2e-5, 1.0, False),
    (5e-7, 0.0, True), (2e-6, 0.0, False), (float("nan"), 1.0, False),
    (1.0, float("inf"), False), (7.165467739105225, 7.165467739105225, True),
])
def test_close(a, b, ok):
    assert training.close(a, b) is ok


def test_losses_match():
    assert training.losses_match([1.0, 0.5], [1.0, 0.5 + 1e-7])
    assert not training.losses_match([1.0, 0.5], [1.0, 0.501])
    assert not training.losses_match([1.0], [1.0, 0.5])


def test_result_shape():
    res = training.result("mlp 16-32-8 (808 parameters)", [1.0, 0.5], [1.0, 0.5], True, 1.5e-8,
                          64, 0.5, batch=8)
    assert res == {"reference_match": True, "losses_match": True, "params_match": True,
                   "tolerance": {"rtol": 1e-5, "atol": 1e-6, "rule": training.TOLERANCE["rule"]},
                   "losses": [1.0, 0.5], "reference_losses": [1.0, 0.5], "max_param_diff": 1.5e-8,
                   "samples_per_s": 128.0, "wall_s": 0.5, "steps": 2,
                   "model": "mlp 16-32-8 (808 parameters)", "batch": 8}
    bad = training.result("m", [float("nan")], [1.0], False, float("inf"), 8, 0.0)
    assert (bad["reference_match"], bad["losses"], bad["max_param_diff"], bad["samples_per_s"]) == \
        (False, [None], None, None)
    assert not training.result("m", [1.0], [1.0], False, 1e-3, 8, 1.0)["reference_match"]


def test_describe_and_tp_hidden():
    assert training.describe("mlp", [16, 32, 32, 8], 1832) == "mlp 16-32-32-8 (1,832 parameters)"
    assert [train_tp.hidden_size(w) for w in (1, 2, 3, 5, 64)] == [32, 32, 33, 35, 64]


def test_scaling_efficiency():
    assert scaling.efficiency(10.0, 18.0, 2) == pytest.approx(0.9)
    assert scaling.efficiency(10.0, 40.0, 4) == 1.0
    assert scaling.efficiency(0.0, 40.0, 4) is None


# --- profiles ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, names", [
    ("ddp", ["ddp"]), ("fsdp, ddp,fsdp", ["ddp", "fsdp"]),
    ("all", ["ddp", "fsdp", "tp", "pipeline", "moe"]),
    ("moe,all", ["ddp", "fsdp", "tp", "pipeline", "moe"]), (" pipeline ", ["pipeline"]),
])
def test_parse_profiles(text, names):
    assert profiles.parse_profiles(text) == names


@pytest.mark.parametrize("text, message", [
    ("", "empty profile name in ''"),
    ("ddp,", "empty profile name in 'ddp,'"),
    ("zero", "unknown profile 'zero' (allowed: ddp, fsdp, tp, pipeline, moe, all)"),
    ("DDP", "unknown profile 'DDP'"),
    ("ddp\n", None),  # a final newline is blank around the item: accepted
    ("dd\x1bp", r"unknown profile 'dd\x1bp'"),
    ("ddp;fsdp", "unknown profile 'ddp;fsdp'"),
    ("ddp," * 60, "profile list of 240 characters (at most 200)"),
])
def test_parse_profiles_rejects(text, message):
    if message is None:
        assert profiles.parse_profiles(text) == ["ddp"]
        return
    with pytest.raises(ValueError) as exc:
        profiles.parse_profiles(text)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value) and "\x1b" not in str(exc.value)


def test_parse_profiles_rejects_non_text():
    with pytest.raises(ValueError, match="profiles must be text, got list"):
        profiles.parse_profiles(["ddp"])


def test_profile_table():
    assert profiles.PROFILES == {"ddp": ("all_reduce", "broadcast"),
                                 "fsdp": ("all_gather", "reduce_scatter"),
                                 "tp": ("all_reduce", "all_gather"),
                                 "pipeline": ("send_recv",), "moe": ("all_to_all",)}
    assert profiles.collectives_for(["tp", "ddp"]) == ["all_reduce", "all_gather", "broadcast"]
    assert profiles.collectives_for(profiles.parse_profiles("all")) == list(coll.COLLECTIVES)
    assert profiles.collectives_for(["pipeline"]) == ["send_recv"]
    with pytest.raises(ValueError):
        profiles.collectives_for(["zero"])


def test_default_dtypes():
    assert profiles.default_dtypes("nccl") == ["float32", "bfloat16"]
    assert profiles.default_dtypes("gloo") == ["float32"]


def test_training_line():
    res = training.result("m", [1.0], [1.0], True, 1.49e-08, 8, 0.01)
    assert profiles.training_line("fsdp", res) == \
        "# training fsdp: reference match yes, max param diff 1.49e-08, 800.0 samples/s"
    assert profiles.training_line("tp", {"unsupported": "torch 2.1 has no x"}) == \
        "# training tp: unsupported: torch 2.1 has no x"


# --- fault specs (test-only) -------------------------------------------------------------

def test_parse_faults():
    got = pf.parse_faults(" collective-corrupt:all_gather@1, moe-expert-perturb@0 ,ddp-grad-perturb@12")
    assert got == (pf.ProfileFault("collective-corrupt", "all_gather", 1),
                   pf.ProfileFault("moe-expert-perturb", None, 0),
                   pf.ProfileFault("ddp-grad-perturb", None, 12))
    assert [str(f) for f in got] == ["collective-corrupt:all_gather@1", "moe-expert-perturb@0",
                                     "ddp-grad-perturb@12"]
    assert got[0].hits("collective-corrupt", 1, "all_gather")
    assert got[0].hits("collective-corrupt", 1)
    assert not got[0].hits("collective-corrupt", 1, "all_reduce")
    assert not got[0].hits("collective-corrupt", 0, "all_gather")
    assert training.fault_hits(got, "moe-expert-perturb", 0)
    assert not training.fault_hits(got, "moe-expert-perturb", 1)
    assert not training.fault_hits((), "moe-expert-perturb", 0)


@pytest.mark.parametrize("spec", [None, "", "  "])
def test_parse_faults_unset(spec):
    assert pf.parse_faults(spec) == ()


@pytest.mark.parametrize("kind", pf.KINDS)
def test_every_kind_parses(kind):
    spec = f"{kind}:send_recv@3" if kind in pf.NEEDS_TARGET else f"{kind}@3"
    assert str(pf.parse_faults(spec)[0]) == spec


@pytest.mark.parametrize("spec, message", [
    ("moe-expert-perturb", "item 'moe-expert-perturb' is not KIND[:TARGET]@RANK"),
    ("explode@1", "unknown kind 'explode' (one of collective-corrupt, "),
    ("collective-corrupt@1", "kind collective-corrupt needs a target, one of all_reduce, "),
    ("collective-corrupt:gather@1", "unknown target 'gather' of collective-corrupt"),
    ("moe-expert-perturb:all_reduce@1", "kind moe-expert-perturb takes no target, got 'all_reduce'"),
    ("moe-expert-perturb@-1", "is not KIND[:TARGET]@RANK"),
    ("moe-expert-perturb@1234567", "is not KIND[:TARGET]@RANK"),
    ("moe-expert-perturb@1,", "item '' is not KIND[:TARGET]@RANK"),
    ("moe-expert-perturb@1\n", None),
    ("moe-expert-perturb@1\x00", r"item 'moe-expert-perturb@1\x00' is not"),
    ("tp-shard-perturb@0,tp-shard-perturb@0", "fault 'tp-shard-perturb@0' given twice"),
    (",".join([f"tp-shard-perturb@{i}" for i in range(17)]), "17 faults (at most 16)"),
    ("x" * 1025, "value of 1025 characters (at most 1024)"),
])
def test_parse_faults_rejects(spec, message):
    if message is None:
        assert pf.parse_faults(spec) == (pf.ProfileFault("moe-expert-perturb", None, 1),)
        return
    with pytest.raises(ValueError) as exc:
        pf.parse_faults(spec)
    text = str(exc.value)
    assert text.startswith("ENVBUILD_BENCH_PROFILE_FAULT: ") and message in text
    assert "\n" not in text and "\x00" not in text and len(text) < 400


def test_fault_magnitudes_exceed_the_tolerance_by_far():
    for delta in (pf.GRAD_DELTA, pf.SHARD_DELTA, pf.MESSAGE_DELTA, pf.EXPERT_DELTA):
        assert delta >= 100 * (training.ATOL + training.RTOL)


def test_names_follow_the_field_terms():
    assert coll.COLLECTIVES == ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "all_to_all", "send_recv")
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", k) for k in pf.KINDS)


def test_check_options():
    assert profiles.check_options("tp,ddp", [8], 5, 1, None, "nccl") == \
        (["ddp", "tp"], ["float32", "bfloat16"])
    assert profiles.check_options(["moe"], [8, 1 << 40], 1, 0, ["bfloat16"], "gloo") == \
        (["moe"], ["bfloat16"])
    assert profiles.check_options("all", [8], 1, 0, [], "gloo")[1] == ["float32"]


@pytest.mark.parametrize("kw, message", [
    (dict(profiles="zero"), "unknown profile 'zero'"),
    (dict(dtypes=["float32", "int8"]), "unsupported dtype 'int8'"),
    (dict(dtypes=["float32", "float32"]), "dtype given twice in 'float32,float32'"),
    (dict(sizes=[]), "sizes must be 1 to 64 integers in 1..1099511627776 bytes, got '[]'"),
    (dict(sizes=[0]), "got '[0]'"),
    (dict(sizes=[(1 << 40) + 1]), "got '[1099511627777]'"),
    (dict(sizes=[8.0]), "got '[8.0]'"),
    (dict(sizes=[True]), "got '[True]'"),
    (dict(sizes=list(range(1, 66))), "sizes must be 1 to 64 integers"),
    (dict(iters=0), "iters must be an integer >= 1 and warmup >= 0, got 0, 1"),
    (dict(warmup=-1), "got 5, -1"),
    (dict(iters=2.5), "got 2.5, 1"),
])
def test_check_options_rejects(kw, message):
    args = dict(profiles="ddp", sizes=[8], iters=5, warmup=1, dtypes=None, backend="gloo")
    args.update(kw)
    with pytest.raises(ValueError) as exc:
        profiles.check_options(**args)
    assert message in str(exc.value)
