"""All-reduce (sum) sweep: timing in nccl-tests' terms plus an exact correctness check.

The pure functions here (bandwidth formulas, the input pattern and its expected sum,
the table row) use no torch; :func:`run_sweep` imports torch lazily.

Formulas (nccl-tests ``doc/PERFORMANCE.md``; ``GetBw`` in ``src/all_reduce.cu``), with
GB/s = 1e9 bytes/s:

- ``algbw = S / t`` where S is the buffer size in bytes (count x element size);
- ``busbw = algbw x 2(n-1)/n`` for all-reduce over n ranks; 0 when n == 1.
"""

from __future__ import annotations

import time
from typing import Any

# Element sizes in bytes of the dtypes the sweep accepts. Both hold every integer of the
# correctness pattern exactly: the largest sum is n*250 + n(n-1)/2, below 2**24
# (float32's exact-integer limit) for n <= 5500 ranks.
DTYPE_SIZES = {"float32": 4, "float64": 8}

PATTERN_MODULUS = 251  # element i of rank r holds (i % 251) + r


def busbw_factor(nranks: int) -> float:
    """Bus-bandwidth factor of all-reduce: ``2(n-1)/n``; 0.0 for one rank.

    Source: nccl-tests doc/PERFORMANCE.md, ``GetBw`` in src/all_reduce.cu.
    E.g. n=2 -> 1.0, n=8 -> 1.75.

    Raises:
        ValueError: nranks < 1.
    """
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks!r}")
    if nranks == 1:
        return 0.0
    return 2.0 * (nranks - 1) / nranks


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): ``size_bytes / (time_us * 1e-6) / 1e9``.

    Source: nccl-tests doc/PERFORMANCE.md. 0.0 when time_us <= 0 (no measurement).
    """
    if time_us <= 0:
        return 0.0
    return size_bytes / (time_us * 1e-6) / 1e9


def busbw_gbps(algbw: float, nranks: int) -> float:
    """Bus bandwidth in GB/s of an all-reduce: ``algbw * busbw_factor(nranks)``."""
    return algbw * busbw_factor(nranks)


def pattern_value(index: int, rank: int) -> int:
    """Input of the correctness check: rank ``rank`` puts ``(index % 251) + rank`` at ``index``."""
    return index % PATTERN_MODULUS + rank


def expected_sum(index: int, nranks: int) -> int:
    """Exact all-reduce sum at ``index`` over ranks 0..n-1: ``n*(index % 251) + n(n-1)/2``."""
    return nranks * (index % PATTERN_MODULUS) + nranks * (nranks - 1) // 2


def element_count(size_bytes: int, dtype: str) -> int:
    """Elements in a buffer of ``size_bytes`` bytes of ``dtype``.

    Raises:
        ValueError: unknown dtype, or size not a positive multiple of the element size.
    """
    if dtype not in DTYPE_SIZES:
        raise ValueError("unsupported dtype {!r} (one of {})".format(dtype, ", ".join(DTYPE_SIZES)))
    elem = DTYPE_SIZES[dtype]
    if size_bytes < elem or size_bytes % elem:
        raise ValueError(
            f"size {size_bytes:d} bytes is not a positive multiple of the {dtype} element size ({elem:d} bytes)"
        )
    return size_bytes // elem


def summarize(size_bytes: int, dtype: str, rank_time_us: list[float],
              wrong_by_rank: list[int]) -> dict[str, Any]:
    """One sweep entry of the rank-result schema from gathered per-rank figures.

    Args:
        size_bytes: buffer size in bytes.
        dtype: element type name, a key of ``DTYPE_SIZES``.
        rank_time_us: mean microseconds per all-reduce on each rank, index = rank.
        wrong_by_rank: elements differing from the exact sum on each rank.

    ``time_us`` is the max over ranks (the collective ends with the slowest rank);
    algbw/busbw follow from it (see the module docstring). ``wrong`` is filled by the
    caller with its own rank's count (the sum over ranks is ``sum(wrong_by_rank)``).
    """
    n = len(rank_time_us)
    t = max(rank_time_us)
    alg = algbw_gbps(size_bytes, t)
    return {
        "size_bytes": size_bytes,
        "count": element_count(size_bytes, dtype),
        "type": dtype,
        "redop": "sum",
        "time_us": t,
        "rank_time_us": list(rank_time_us),
        "algbw_gbps": alg,
        "busbw_gbps": busbw_gbps(alg, n),
        "wrong": None,
        "wrong_by_rank": list(wrong_by_rank),
    }


HEADER = "# {!s:>12} {!s:>12} {!s:>8} {!s:>6} {!s:>11} {!s:>12} {!s:>12} {!s:>8}".format(
    "size(B)", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong")


def format_row(entry: dict[str, Any]) -> str:
    """nccl-tests-like table row for one sweep entry; ``#wrong`` is the sum over ranks."""
    return "  {:12d} {:12d} {!s:>8} {!s:>6} {:11.2f} {:12.3f} {:12.3f} {:8d}".format(
        entry["size_bytes"], entry["count"], entry["type"], entry["redop"],
        entry["time_us"], entry["algbw_gbps"], entry["busbw_gbps"],
        sum(entry["wrong_by_rank"]))


def _all_gather_scalar(dist, torch, value, dtype, device) -> list:
    world = dist.get_world_size()
    mine = torch.tensor([value], dtype=dtype, device=device)
    out = [torch.zeros(1, dtype=dtype, device=device) for _ in range(world)]
    dist.all_gather(out, mine)
    return [t.item() for t in out]


def run_sweep(sizes: list[int], dtype: str, iters: int, warmup: int, device: str,
              corrupt: bool = False, log=None, progress=None) -> list[dict[str, Any]]:
    """Time and check an all-reduce (sum) at each size on the initialized default group.

    Args:
        sizes: buffer sizes in bytes, each a multiple of the element size.
        dtype: a key of ``DTYPE_SIZES``.
        iters: timed iterations per size (>= 1); warmup: untimed ones before (>= 0).
        device: ``"cpu"`` (gloo) or ``"cuda:<i>"`` (nccl; synchronized around timing).
        corrupt: TEST-ONLY fault: change one result element after each correctness
            all-reduce on this rank.
        log: callable taking one line (rank 0 passes ``print``), or None.
        progress: ``progress(name, detail, collective)`` called as each size begins
            (:meth:`bench.progress.Progress.phase`), or None.

    Returns:
        One dict per size, see :func:`summarize`, with ``wrong`` = this rank's count.

    Timing: zero-filled buffer; warmup, barrier, then ``iters`` back-to-back
    all-reduces; this rank's time is wall time / iters in microseconds. Correctness: a
    fresh buffer with :func:`pattern_value`, one all-reduce, compared exactly (0 ulp)
    with :func:`expected_sum`.
    """
    import torch
    import torch.distributed as dist

    tdtype = getattr(torch, dtype)
    cuda = device.startswith("cuda")
    rank, n = dist.get_rank(), dist.get_world_size()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if log:
        log(HEADER)
    results = []
    for size in sizes:
        if progress:
            progress("all-reduce", f"{size:d} B", True)
        count = element_count(size, dtype)
        buf = torch.zeros(count, dtype=tdtype, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        my_us = (time.perf_counter() - t0) / iters * 1e6
        del buf

        idx = torch.arange(count, dtype=torch.int64, device=device) % PATTERN_MODULUS
        data = (idx + rank).to(tdtype)
        dist.all_reduce(data)
        if corrupt:
            data[-1] += 1
        expected = (idx * n + n * (n - 1) // 2).to(tdtype)
        my_wrong = int((data != expected).sum().item())
        del idx, data, expected

        times = _all_gather_scalar(dist, torch, my_us, torch.float64, device)
        wrongs = [int(w) for w in _all_gather_scalar(dist, torch, my_wrong, torch.int64, device)]
        entry = summarize(size, dtype, times, wrongs)
        entry["wrong"] = my_wrong
        results.append(entry)
        if log:
            log(format_row(entry))
    return results
