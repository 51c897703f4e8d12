"""Sweeps of the six collectives, timed and checked element by element, in nccl-tests' terms. Source: nccl-tests
``src/common.cu`` (size = max(send, recv) bytes of one rank; count = ``paramcount``; the time reduced over ranks by
``Allreduce``), ``GetBw`` in ``src/<collective>.cu`` and ``doc/PERFORMANCE.md``: GB/s = 1e9 B/s, t = the slowest rank's
mean time, algbw = S / t, busbw = algbw x ``bus_factor``. ``send_recv`` is a ring (r sends to r+1), as
``sendrecv_perf``. Inputs ``(k + r) % m`` use a modulus (:func:`modulus`) small enough that every partial sum is exact
in the element type, so comparisons are exact (0 ulp). The pure functions use no torch."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from .support import Unsupported, unsupported_reason

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")

# Element size in bytes, and the largest L such that every integer 0..L is exact.
DTYPES = {"float32": (4, 2 ** 24), "float64": (8, 2 ** 53), "bfloat16": (2, 2 ** 8), "float16": (2, 2 ** 11)}

MAX_MODULUS = 251  # a prime below 256: the pattern does not line up with power-of-2 sizes

# S carries the factor nranks (the count column is per rank / per peer).
PER_RANK_COUNT = ("all_gather", "reduce_scatter", "all_to_all")
REDUCING = ("all_reduce", "reduce_scatter")
SENTINEL = -1  # initial value of receive buffers; never a result (results are >= 0)
CORRUPT_VALUE = -2  # TEST-ONLY fault: what the corrupted element is set to


def typesize(dtype: str) -> int:
    """Bytes per element of ``dtype``; ValueError if unknown."""
    if dtype not in DTYPES:
        raise ValueError("unsupported dtype {!r} (one of {})".format(dtype, ", ".join(DTYPES)))
    return DTYPES[dtype][0]


def _check_name(name: str) -> None:
    if name not in COLLECTIVES:
        raise ValueError("unknown collective {!r} (one of {})".format(name, ", ".join(COLLECTIVES)))


def count_and_size(name: str, size_bytes: int, dtype: str, nranks: int) -> tuple[int, int]:
    """``(count, size_bytes)`` rounded down as nccl-tests does (0: no row; all_gather 1001 B float32 x4: (62, 992))."""
    _check_name(name)
    ts = typesize(dtype)
    if size_bytes < 1 or nranks < 1:
        raise ValueError(f"size_bytes and nranks must be >= 1, got {size_bytes!r}, {nranks!r}")
    per = ts * nranks if name in PER_RANK_COUNT else ts
    count = size_bytes // per
    return count, count * per


def bus_factor(name: str, nranks: int) -> float:
    """busbw / algbw of ``name`` over ``nranks`` ranks (nccl-tests ``GetBw``); ValueError on bad arguments."""
    _check_name(name)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks!r}")
    if name == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if name in PER_RANK_COUNT:
        return (nranks - 1) / nranks
    return 1.0


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """``size_bytes / time`` in GB/s (1e9 B/s); 0.0 when there is no time."""
    if time_us <= 0:
        return 0.0
    return size_bytes / (time_us * 1e-6) / 1e9


def modulus(dtype: str, nranks: int, reducing: bool) -> int:
    """The pattern modulus: ``nranks x (m - 1)`` exact in ``dtype`` (bfloat16: 129 on 2 ranks, 2 on 256); ValueError."""
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
    return (index + rank) % m


def sum_over_ranks(s, nranks: int, m: int):
    """``sum((s + q) % m for q in range(nranks))`` in closed form, on ints or integer tensors."""
    a, b = divmod(nranks, m)
    excess = s + b - m
    excess = excess.clamp(min=0) if hasattr(excess, "clamp") else max(excess, 0)
    return a * (m * (m - 1) // 2) + b * s + b * (b - 1) // 2 - m * excess


def send_length(name: str, count: int, nranks: int) -> int:
    _check_name(name)
    return count * nranks if name in ("reduce_scatter", "all_to_all") else count


def recv_length(name: str, count: int, nranks: int) -> int:
    _check_name(name)
    return count * nranks if name in ("all_gather", "all_to_all") else count


def expected_value(name: str, index: int, rank: int, nranks: int, count: int, m: int) -> int:
    """Exact element ``index`` of rank ``rank``'s receive buffer after ``name`` (broadcast root 0)."""
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


def rank_stats(times: list[float], wrongs: list[int]) -> list[float]:
    """``[min, median, max us, slowest rank, total wrong]`` of a row over ranks (index = rank), reduced as nccl-tests
    ``-a`` does, wrongs summed; an even count's median is the middle two's mean; the slowest is the lowest of equals."""
    order = sorted(times)
    n = len(order)
    median = order[n // 2] if n % 2 else (order[n // 2 - 1] + order[n // 2]) / 2
    slowest = max(range(n), key=lambda r: (times[r], -r))
    return [order[0], median, order[-1], float(slowest), float(sum(wrongs))]


def summarize(name: str, count: int, size_bytes: int, dtype: str, api: str, stats: list[float],
              own_time_us: float, own_wrong: int, nranks: int) -> dict[str, Any]:
    """One row: the run's figures (:func:`rank_stats`; ``time_us`` the slowest rank's) and this rank's own."""
    lo, median, t, slowest, wrong = stats
    alg = algbw_gbps(size_bytes, t)
    return {"size_bytes": size_bytes, "count": count, "type": dtype, "redop": "sum" if name in REDUCING else "none",
            "root": 0 if name == "broadcast" else -1, "api": api, "time_us": t, "min_time_us": lo,
            "median_time_us": median, "slowest_rank": int(slowest), "algbw_gbps": alg,
            "busbw_gbps": alg * bus_factor(name, nranks), "wrong": int(wrong), "own_time_us": own_time_us,
            "own_wrong": int(own_wrong)}


HEADER = "# {!s:<14} {!s:>12} {!s:>12} {!s:>8} {!s:>11} {!s:>12} {!s:>12} {!s:>8}".format(
    "collective", "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
    "#wrong")


def format_row(name: str, row: dict[str, Any]) -> str:
    return "  {!s:<14} {:12d} {:12d} {!s:>8} {:11.2f} {:12.3f} {:12.3f} {:8d}".format(
        name, row["size_bytes"], row["count"], row["type"], row["time_us"],
        row["algbw_gbps"], row["busbw_gbps"], row["wrong"])


# --------------------------------------------------------------------------- in the image


def _periodic(torch, length: int, start: int, m: int, dtype, device, summed_over: int = 0):
    """``length`` values ``(start + j) % m`` (or their sum over ``summed_over`` ranks) from one period."""
    row = (torch.arange(m, dtype=torch.int64, device=device) + start) % m
    if summed_over:
        row = sum_over_ranks(row, summed_over, m)
    row = row.to(dtype)
    reps = -(-length // m)
    return row.repeat(reps)[:length]


def _fill_inputs(torch, name, send, recv, rank, n, count, m):
    send.copy_(_periodic(torch, send.numel(), rank, m, send.dtype, send.device))
    if name == "broadcast" and rank != 0:
        send.fill_(SENTINEL)
    if recv is not send:
        recv.fill_(SENTINEL)


def _count_wrong(torch, name, recv, rank, n, count, m) -> int:
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
        blocks = [(recv[q * count:(q + 1) * count], _periodic(torch, count, q, m, dt, dev)) for q in range(n)]
    else:  # all_to_all
        blocks = [(recv[q * count:(q + 1) * count],
                   _periodic(torch, count, rank * count + q, m, dt, dev)) for q in range(n)]
    return int(sum(int((got != want).sum().item()) for got, want in blocks))


def _candidates(dist, name: str, send, recv, rank: int, n: int):
    """[(api name, callable)], the tensor forms FSDP2 and MoE use first; list forms are fallbacks."""
    def has(attr):
        return getattr(dist, attr, None) is not None

    out = []
    if name == "all_reduce":
        out.append(("all_reduce", lambda: dist.all_reduce(recv)))
    elif name == "broadcast":
        out.append(("broadcast", lambda: dist.broadcast(recv, src=0)))
    elif name == "all_gather":
        # FSDP2's own order: torch 2.13 calls all_gather_single and reduce_scatter_single
        # (fsdp/_fully_shard/_fsdp_collectives.py) and deprecates *_into_tensor/_tensor, which
        # torch <= 2.12's FSDP2 calls
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
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]

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
    """Choose the API on the first size, falling back past unsupported ones."""
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
    """Sweep ``name`` over ``sizes`` (bytes): rows (the run's figures, this rank's own) or ``{"unsupported": reason}``.
    Per size: ``warmup`` runs, a barrier, ``iters`` timed runs, one exact-compared run on patterns; figures reduced once
    at the end. ``corrupt``: the TEST-ONLY fault spoiling this rank's last element."""
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
        mine.append(_time_and_check(torch, dist, name, api, count, dtype, iters, warmup, device, cuda, corrupt))
    stats = _reduce_stats(torch, dist, mine, device)
    rows = []
    for j, (count, size) in enumerate(sizes_counts):
        row = summarize(name, count, size, dtype, api, stats[j], mine[j][0], mine[j][1], n)
        rows.append(row)
        if log:
            log(format_row(name, row))
    return rows


def _reduce_stats(torch, dist, mine: list[tuple[float, int]], device: str) -> list[list[float]]:
    """Per row :func:`rank_stats`: rank 0 gathers (time, wrong) pairs (O(N) there), reduces, broadcasts (O(rows))."""
    n, k = dist.get_world_size(), len(mine)
    flat = torch.tensor([t for t, _ in mine] + [float(w) for _, w in mine], dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(flat) for _ in range(n)] if dist.get_rank() == 0 else None
    dist.gather(flat, gathered, dst=0)
    out = torch.zeros(k * 5, dtype=torch.float64, device=device)
    if gathered is not None:
        table = torch.stack(gathered).cpu().tolist()
        out = torch.tensor([x for j in range(k) for x in rank_stats(
            [table[r][j] for r in range(n)], [int(table[r][k + j]) for r in range(n)])],
            dtype=torch.float64, device=device)
    dist.broadcast(out, src=0)
    values = out.cpu().tolist()
    return [values[5 * j:5 * j + 5] for j in range(k)]


def _time_and_check(torch, dist, name, api, count, dtype, iters, warmup, device, cuda, corrupt) -> tuple[float, int]:
    """(this rank's mean us per run, its wrong elements) at one count: timed as a plain loop (zeroed buffers, warmup,
    barrier, ``iters`` runs), then the exact-compared run, whose fill and compare touch several buffers (before the
    timed loop: up to 1/4 of the bandwidth lost)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    m = modulus(dtype, n, name in REDUCING)
    send, recv = _buffers(torch, name, count, n, getattr(torch, dtype), device)
    op = dict(_candidates(dist, name, send, recv, rank, n))[api]
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
    _fill_inputs(torch, name, send, recv, rank, n, count, m)
    op()
    if corrupt:
        recv.view(-1)[-1] = CORRUPT_VALUE
    return elapsed / iters * 1e6, _count_wrong(torch, name, recv, rank, n, count, m)
