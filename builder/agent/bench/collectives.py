"""Sweeps of the six collectives of the parallelism strategies, in nccl-tests' terms.

Collectives (names as in the certificate): ``all_reduce``, ``all_gather``,
``reduce_scatter``, ``broadcast``, ``all_to_all``, ``send_recv`` (a ring of point-to-point
transfers: rank r sends to r+1 and receives from r-1 in one ``batch_isend_irecv``, as
nccl-tests' ``sendrecv_perf`` does). Each is timed over sizes and checked element by
element on predictable inputs (``wrong``: elements that differ from the exact result).

The pure functions (sizes, bandwidth formulas, input pattern and expected values) use no
torch; :func:`run_collective` imports torch lazily.

Columns, as nccl-tests prints them (``src/common.cu``: the size column is
``max(sendBytes, recvBytes)`` of one rank, the count column is ``paramcount``, the count
handed to ``GetBw``):

==================  ===============================  =================================
collective          size_bytes S of one rank         count (elements)
==================  ===============================  =================================
all_reduce          count x typesize                 buffer elements
broadcast           count x typesize                 buffer elements (root 0)
send_recv           count x typesize                 elements sent to the next rank
all_gather          count x typesize x nranks        elements each rank contributes
reduce_scatter      count x typesize x nranks        elements each rank receives
all_to_all          count x typesize x nranks        elements sent to each peer
==================  ===============================  =================================

Bandwidths (``GetBw`` in nccl-tests ``src/all_reduce.cu``, ``all_gather.cu``,
``reduce_scatter.cu``, ``broadcast.cu``, ``alltoall.cu``, ``sendrecv.cu``;
``doc/PERFORMANCE.md``), GB/s = 1e9 B/s, t = the slowest rank's mean time:
``algbw = S / t``; ``busbw = algbw x factor`` with factor ``2(n-1)/n`` for all_reduce,
``(n-1)/n`` for all_gather, reduce_scatter and all_to_all, ``1`` for broadcast and
send_recv (so on one rank busbw is 0 except for broadcast and send_recv, as in
nccl-tests' code).

A requested size is rounded down to a whole count as nccl-tests does (for the collectives
whose S has the factor nranks, to a multiple of ``typesize x nranks``); a size too small
for one element per rank gives no row.

Correctness pattern: element k of rank r's send buffer holds ``(k + r) % m``, with the
modulus ``m`` of :func:`modulus` chosen so that every partial sum of a reduction is an
integer the element type holds exactly (float32: m = 251 up to 67,108 ranks; bfloat16:
m = 129 for 2 ranks, 2 for 256 ranks; beyond 256 ranks a bfloat16 reduction cannot be
checked exactly and is reported unsupported). Receive buffers start at -1, a value no
result has. Comparisons are exact (0 ulp), like nccl-tests for sum.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from .support import Unsupported, unsupported_reason

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
               "send_recv")

# Element size in bytes, and the largest integer L such that every integer 0..L is exact.
DTYPES = {"float32": (4, 2 ** 24), "float64": (8, 2 ** 53), "bfloat16": (2, 2 ** 8),
          "float16": (2, 2 ** 11)}

MAX_MODULUS = 251  # a prime below 256: the pattern does not line up with power-of-2 sizes

# S carries the factor nranks (the count column is per rank / per peer).
PER_RANK_COUNT = ("all_gather", "reduce_scatter", "all_to_all")
REDUCING = ("all_reduce", "reduce_scatter")
SENTINEL = -1  # initial value of receive buffers; never a result (results are >= 0)
CORRUPT_VALUE = -2  # TEST-ONLY fault: what the corrupted element is set to


def typesize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a key of ``DTYPES``). Raises ValueError otherwise."""
    if dtype not in DTYPES:
        raise ValueError("unsupported dtype {!r} (one of {})".format(dtype, ", ".join(DTYPES)))
    return DTYPES[dtype][0]


def _check_name(name: str) -> None:
    if name not in COLLECTIVES:
        raise ValueError("unknown collective {!r} (one of {})".format(name, ", ".join(COLLECTIVES)))


def count_and_size(name: str, size_bytes: int, dtype: str, nranks: int) -> tuple[int, int]:
    """(count, size_bytes) of a row for a requested size, in nccl-tests' columns.

    E.g. ``("all_gather", 1000, "float32", 2)`` -> ``(125, 1000)``;
    ``("all_gather", 1001, "float32", 4)`` -> ``(62, 992)`` (rounded down);
    ``("all_reduce", 10, "float32", 2)`` -> ``(2, 8)``. count 0 means no row.

    Raises:
        ValueError: unknown collective or dtype, size_bytes < 1 or nranks < 1.
    """
    _check_name(name)
    ts = typesize(dtype)
    if size_bytes < 1 or nranks < 1:
        raise ValueError(f"size_bytes and nranks must be >= 1, got {size_bytes!r}, {nranks!r}")
    per = ts * nranks if name in PER_RANK_COUNT else ts
    count = size_bytes // per
    return count, count * per


def bus_factor(name: str, nranks: int) -> float:
    """busbw / algbw of ``name`` over ``nranks`` ranks (nccl-tests ``GetBw``).

    E.g. all_reduce: n=2 -> 1.0, n=8 -> 1.75; all_gather n=8 -> 0.875; broadcast -> 1.0.
    Raises ValueError on an unknown name or nranks < 1.
    """
    _check_name(name)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks!r}")
    if name == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if name in PER_RANK_COUNT:
        return (nranks - 1) / nranks
    return 1.0


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """``size_bytes / time`` in GB/s (1e9 B/s); 0.0 when time_us <= 0 (no measurement)."""
    if time_us <= 0:
        return 0.0
    return size_bytes / (time_us * 1e-6) / 1e9


def modulus(dtype: str, nranks: int, reducing: bool) -> int:
    """The pattern modulus m for ``dtype`` on ``nranks`` ranks.

    For a reduction, ``nranks x (m - 1)`` (the largest sum) must be exact in ``dtype``:
    m = min(251, L // nranks + 1) with L from ``DTYPES``. E.g. float32, 2 ranks -> 251;
    bfloat16, 2 ranks -> 129; bfloat16, 256 ranks -> 2. Without reduction: 251 (bfloat16
    holds 0..250 exactly).

    Raises:
        Unsupported: a reduction over more ranks than ``dtype`` can sum exactly
            (bfloat16: more than 256).
        ValueError: unknown dtype, nranks < 1.
    """
    typesize(dtype)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks!r}")
    if not reducing:
        return MAX_MODULUS
    limit = DTYPES[dtype][1]
    if nranks > limit:
        raise Unsupported(f"an exact check of a {dtype} reduction needs <= {limit:d} ranks, not {nranks:d}")
    return min(MAX_MODULUS, limit // nranks + 1)


def pattern_value(index: int, rank: int, m: int) -> int:
    """Element ``index`` of rank ``rank``'s send buffer: ``(index + rank) % m``."""
    return (index + rank) % m


def sum_over_ranks(s, nranks: int, m: int):
    """``sum(((s + q) % m) for q in range(nranks))`` for 0 <= s < m, in closed form.

    Works on ints and on torch integer tensors (element-wise). With nranks = a*m + b:
    a full cycles give ``a * m(m-1)/2``; the remaining b terms are s, s+1, ... wrapping
    at m: ``b*s + b(b-1)/2 - m * max(0, s + b - m)``. E.g. (3, 2, 5) -> 3 + 4 = 7;
    (4, 2, 5) -> 4 + 0 = 4.
    """
    a, b = divmod(nranks, m)
    excess = s + b - m
    excess = excess.clamp(min=0) if hasattr(excess, "clamp") else max(excess, 0)
    return a * (m * (m - 1) // 2) + b * s + b * (b - 1) // 2 - m * excess


def send_length(name: str, count: int, nranks: int) -> int:
    """Elements in one rank's send buffer (all_reduce: the in-place buffer)."""
    _check_name(name)
    return count * nranks if name in ("reduce_scatter", "all_to_all") else count


def recv_length(name: str, count: int, nranks: int) -> int:
    """Elements in one rank's receive buffer (all_reduce, broadcast: in place)."""
    _check_name(name)
    return count * nranks if name in ("all_gather", "all_to_all") else count


def expected_value(name: str, index: int, rank: int, nranks: int, count: int, m: int) -> int:
    """Exact element ``index`` of rank ``rank``'s receive buffer after ``name``.

    all_reduce: sum over q of (i + q) % m. all_gather: block q (i // count) is rank q's
    buffer. reduce_scatter: rank r gets the sum of elements r*count + i. broadcast (root
    0): rank 0's buffer. all_to_all: block q is what rank q sent to r (its block r).
    send_recv: rank r - 1's buffer. E.g. ``("all_gather", 5, 0, 2, 4, 251)`` -> 2.
    """
    q, i = divmod(index, count)
    if name == "all_reduce":
        return sum_over_ranks(index % m, nranks, m)
    if name == "all_gather":
        return pattern_value(i, q, m)
    if name == "reduce_scatter":
        return sum_over_ranks((rank * count + index) % m, nranks, m)
    if name == "broadcast":
        return pattern_value(index, 0, m)
    if name == "all_to_all":
        return pattern_value(rank * count + i, q, m)
    if name == "send_recv":
        return pattern_value(index, (rank - 1) % nranks, m)
    _check_name(name)
    raise AssertionError(name)


def summarize(name: str, count: int, size_bytes: int, dtype: str, api: str,
              rank_time_us: list[float], wrong_by_rank: list[int]) -> dict[str, Any]:
    """One row from gathered per-rank figures (index = rank).

    Returns ``{"size_bytes", "count", "type", "redop": "sum"|"none", "root": 0|-1,
    "api", "time_us" (max over ranks), "rank_time_us", "algbw_gbps", "busbw_gbps",
    "wrong" (sum over ranks), "wrong_by_rank"}``.
    """
    n = len(rank_time_us)
    t = max(rank_time_us)
    alg = algbw_gbps(size_bytes, t)
    return {
        "size_bytes": size_bytes, "count": count, "type": dtype,
        "redop": "sum" if name in REDUCING else "none",
        "root": 0 if name == "broadcast" else -1,
        "api": api, "time_us": t, "rank_time_us": list(rank_time_us),
        "algbw_gbps": alg, "busbw_gbps": alg * bus_factor(name, n),
        "wrong": int(sum(wrong_by_rank)), "wrong_by_rank": [int(w) for w in wrong_by_rank],
    }


HEADER = "# {!s:<14} {!s:>12} {!s:>12} {!s:>8} {!s:>11} {!s:>12} {!s:>12} {!s:>8}".format(
    "collective", "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
    "#wrong")


def format_row(name: str, row: dict[str, Any]) -> str:
    """nccl-tests-like table line for one row (``#wrong`` is the sum over ranks)."""
    return "  {!s:<14} {:12d} {:12d} {!s:>8} {:11.2f} {:12.3f} {:12.3f} {:8d}".format(
        name, row["size_bytes"], row["count"], row["type"], row["time_us"],
        row["algbw_gbps"], row["busbw_gbps"], row["wrong"])


# --------------------------------------------------------------------------- in the image


def _periodic(torch, length: int, start: int, m: int, dtype, device, summed_over: int = 0):
    """Tensor of ``length`` values ``(start + j) % m`` (or, with ``summed_over`` = n, the
    sum of them over n ranks), built from one period of m values (no index tensor of
    the buffer's length)."""
    row = (torch.arange(m, dtype=torch.int64, device=device) + start) % m
    if summed_over:
        row = sum_over_ranks(row, summed_over, m)
    row = row.to(dtype)
    reps = -(-length // m)
    return row.repeat(reps)[:length]


def _fill_inputs(torch, name, send, recv, rank, n, count, m):
    """Pattern into ``send``, SENTINEL into a separate ``recv``."""
    send.copy_(_periodic(torch, send.numel(), rank, m, send.dtype, send.device))
    if name == "broadcast" and rank != 0:
        send.fill_(SENTINEL)
    if recv is not send:
        recv.fill_(SENTINEL)


def _count_wrong(torch, name, recv, rank, n, count, m) -> int:
    """Elements of ``recv`` that differ from :func:`expected_value` (exact compare)."""
    dt, dev = recv.dtype, recv.device
    if name == "all_reduce":
        blocks = [(recv, _periodic(torch, count, 0, m, dt, dev, summed_over=n))]
    elif name == "reduce_scatter":
        blocks = [(recv, _periodic(torch, count, rank * count, m, dt, dev, summed_over=n))]
    elif name == "broadcast":
        blocks = [(recv, _periodic(torch, count, 0, m, dt, dev))]
    elif name == "send_recv":
        blocks = [(recv, _periodic(torch, count, (rank - 1) % n, m, dt, dev))]
    elif name == "all_gather":
        blocks = [(recv[q * count:(q + 1) * count], _periodic(torch, count, q, m, dt, dev))
                  for q in range(n)]
    else:  # all_to_all
        blocks = [(recv[q * count:(q + 1) * count],
                   _periodic(torch, count, rank * count + q, m, dt, dev)) for q in range(n)]
    return int(sum(int((got != want).sum().item()) for got, want in blocks))


def _candidates(dist, name: str, send, recv, rank: int, n: int):
    """[(api name, zero-argument callable running one ``name``)], preferred first.

    The tensor forms FSDP2 and MoE layers use come first; list forms are fallbacks for
    a torch or backend without them. Functions absent from this torch are left out.
    """
    def has(attr):
        return getattr(dist, attr, None) is not None

    out = []
    if name == "all_reduce":
        out.append(("all_reduce", lambda: dist.all_reduce(recv)))
    elif name == "broadcast":
        out.append(("broadcast", lambda: dist.broadcast(recv, src=0)))
    elif name == "all_gather":
        for attr in ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"):
            if has(attr):
                out.append((attr, functools.partial(getattr(dist, attr), recv, send)))
        views = list(recv.chunk(n))
        out.append(("all_gather", lambda: dist.all_gather(views, send)))
    elif name == "reduce_scatter":
        for attr in ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"):
            if has(attr):
                out.append((attr, functools.partial(getattr(dist, attr), recv, send)))
        if has("reduce_scatter"):
            chunks = list(send.chunk(n))
            out.append(("reduce_scatter", lambda: dist.reduce_scatter(recv, chunks)))
    elif name == "all_to_all":
        if has("all_to_all_single"):
            out.append(("all_to_all_single", lambda: dist.all_to_all_single(recv, send)))
        if has("all_to_all"):
            ins, outs = list(send.chunk(n)), list(recv.chunk(n))
            out.append(("all_to_all", lambda: dist.all_to_all(outs, ins)))
    elif name == "send_recv" and has("batch_isend_irecv"):
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % n),
               dist.P2POp(dist.irecv, recv, (rank - 1) % n)]

        def ring():
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        out.append(("batch_isend_irecv", ring))
    return out


def _buffers(torch, name, count, n, tdtype, device):
    send = torch.empty(send_length(name, count, n), dtype=tdtype, device=device)
    if name in ("all_reduce", "broadcast"):
        return send, send
    return send, torch.empty(recv_length(name, count, n), dtype=tdtype, device=device)


def _check_once(torch, dist, name, sizes_counts, dtype, device, chosen):
    """Choose the API on the first size (falling back past unsupported ones)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    m = modulus(dtype, n, name in REDUCING)
    count = sizes_counts[0][0]
    send, recv = _buffers(torch, name, count, n, getattr(torch, dtype), device)
    reasons = []
    for api, op in _candidates(dist, name, send, recv, rank, n):
        _fill_inputs(torch, name, send, recv, rank, n, count, m)
        try:
            op()
        except (RuntimeError, NotImplementedError) as e:
            reason = unsupported_reason(e)
            if reason is None:
                raise
            reasons.append(f"{api}: {reason}")
            continue
        chosen.append(api)
        return
    raise Unsupported("; ".join(reasons) or "torch.distributed has no function for " + name)


def run_collective(name: str, sizes: list[int], dtype: str, iters: int, warmup: int,
                   device: str, corrupt: bool = False, log: Callable | None = None):
    """Sweep ``name`` over ``sizes`` on the initialized default process group.

    Args:
        name: one of ``COLLECTIVES``; sizes: requested sizes in bytes (see
            :func:`count_and_size`); dtype: a key of ``DTYPES``; iters >= 1 timed
            iterations per size, warmup >= 0 untimed ones before them; device ``"cpu"``
            or ``"cuda:<i>"`` (synchronized around the timed loop).
        corrupt: TEST-ONLY fault: this rank sets the last element of its result to
            ``CORRUPT_VALUE`` after each correctness run, so its ``wrong`` is >= 1.
        log: callable taking one line (rank 0 passes ``print``), or None.

    Returns:
        A list of rows (:func:`summarize`), one per size with count >= 1, the same on
        every rank; or ``{"unsupported": reason}`` when the backend lacks the
        collective or dtype (every rank must agree; they run the same torch).

    Per size: pattern inputs, one run, exact compare; then zeroed buffers, ``warmup``
    runs, a barrier, and ``iters`` back-to-back runs timed with ``perf_counter`` (this
    rank's mean). Times and wrong counts of all sizes are gathered at the end in one
    ``all_gather`` of float64 values, outside any timed loop.
    """
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    if name == "send_recv" and n == 1 and dist.get_backend() != "nccl":
        # On one rank the ring sends to itself: NCCL does; gloo fails ("Pair is not
        # connected", torch 2.13), not an unsupported-style message.
        return {"unsupported": f"send_recv on one rank sends to itself, which {dist.get_backend()} does not do"}
    sizes_counts = [count_and_size(name, s, dtype, n) for s in sizes]
    sizes_counts = [(c, s) for c, s in sizes_counts if c >= 1]
    if not sizes_counts:
        return {"unsupported": f"no requested size holds one {dtype} element per rank"}
    chosen: list[str] = []
    try:
        _check_once(torch, dist, name, sizes_counts, dtype, device, chosen)
    except Unsupported as e:
        return {"unsupported": str(e)}
    api = chosen[0]
    cuda = device.startswith("cuda")
    mine = []
    for count, _ in sizes_counts:
        mine.append(_time_and_check(torch, dist, name, api, count, dtype, iters, warmup,
                                    device, cuda, corrupt))
    flat = torch.tensor([t for t, _ in mine] + [float(w) for _, w in mine],
                        dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(flat) for _ in range(n)]
    dist.all_gather(gathered, flat)
    table = [g.cpu().tolist() for g in gathered]
    k = len(mine)
    rows = []
    for j, (count, size) in enumerate(sizes_counts):
        row = summarize(name, count, size, dtype, api, [table[r][j] for r in range(n)],
                        [int(table[r][k + j]) for r in range(n)])
        rows.append(row)
        if log:
            log(format_row(name, row))
    return rows


def _time_and_check(torch, dist, name, api, count, dtype, iters, warmup, device, cuda,
                    corrupt) -> tuple[float, int]:
    """(this rank's mean microseconds per run, this rank's wrong elements) at one count."""
    rank, n = dist.get_rank(), dist.get_world_size()
    m = modulus(dtype, n, name in REDUCING)
    send, recv = _buffers(torch, name, count, n, getattr(torch, dtype), device)
    op = dict(_candidates(dist, name, send, recv, rank, n))[api]
    _fill_inputs(torch, name, send, recv, rank, n, count, m)
    op()
    if corrupt:
        recv.view(-1)[-1] = CORRUPT_VALUE
    wrong = _count_wrong(torch, name, recv, rank, n, count, m)
    send.zero_()
    recv.zero_()
    for _ in range(warmup):
        op()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return elapsed / iters * 1e6, wrong
