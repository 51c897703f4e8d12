"""The ``straggler`` check: each node's compute alone and an all-reduce per node pair (Google cluster-health-scanner's
pairwise test); a node slower than the median by ``--straggler-ratio`` is named (NVIDIA/nccl#349, nccl-tests#106)."""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor

from builder.core.errors import EnvbuildError, Unreachable

from ..report import Node
from ..sources.base import AGENT_MODULE
from .agent_output import Compute, ComputeTiming, Pairs, last_json
from .base import FAIL, PASS, SKIP, UNKNOWN, Check, Options, human_bytes, live, start_all

FIX = ("check the named nodes: CPU/GPU clocks and thermal throttling, cgroup CPU limits (--cpus), other "
       "jobs on the node, NIC link speed (NVIDIA/nccl#349, nccl-tests#106)")


def _compute_once(n: Node, opts: Options, backend: str) -> ComputeTiming:
    """The agent's ``compute`` on ``n``; EnvbuildError (exit 3) when it gives no result."""
    assert n.target is not None
    args = ["compute", "--backend", backend, "--iters", str(opts.straggler_iters),
            "--repeats", str(opts.straggler_repeats)]
    done = n.target.run(AGENT_MODULE, args, opts.agent_timeout_s)
    doc = last_json(done.stdout, Compute, n.source)
    if doc is None:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise Unreachable(f"agent compute gave no result (exit status {done.rc}): "
                          f"{lines[-1] if lines else 'no output'}")
    return doc.compute


def time_compute(nodes: list[Node], opts: Options, backend: str, timings: dict[str, ComputeTiming],
                 unknown: list[str]) -> None:
    """Time every node's compute into ``timings``; a node timed again keeps its better timing."""
    def time_machine(group: list[Node]) -> None:
        for n in group:
            try:
                timing = _compute_once(n, opts, backend)
            except EnvbuildError as e:
                unknown.append(f"{n.name}: {e}")
                continue
            old = timings.get(n.name)
            if old and old.best_s and (timing.best_s or 0) > old.best_s:
                timing = old  # a second look keeps the better timing
            timings[n.name] = timing

    groups: dict[str, list[Node]] = {}
    for n in nodes:
        groups.setdefault(getattr(n.target, "machine", None) or n.name, []).append(n)  # one at a time per machine
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(groups)))) as pool:
        list(pool.map(time_machine, groups.values()))


def run_pairs(nodes: list[Node], opts: Options, backend: str, unknown: list[str]) -> dict[str, Pairs]:
    base = opts.pair_port_base or opts.port + 100
    addrs = ",".join(n.address or "" for n in nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    runs = start_all(nodes, lambda n: [
        "pairs", "--index", str(index[n.name]), "--addrs", addrs, "--port-base", str(base),
        "--backend", backend, "--iters", str(opts.allreduce_iters), "--size", str(opts.allreduce_bytes),
        "--timeout-s", str(max(30.0, opts.agent_timeout_s / 2))])
    out: dict[str, Pairs] = {}
    for n in nodes:
        r = runs[n.name]
        try:
            if isinstance(r, EnvbuildError):
                raise r
            done = r.wait(opts.agent_timeout_s)
            doc = last_json(done.stdout, Pairs, n.source)
            if doc is None:
                raise EnvbuildError(f"agent pairs gave no result (exit status {done.rc}): "
                                    f"{done.stderr.strip()[-200:]}")
            out[n.name] = doc
        except EnvbuildError as e:
            unknown.append(f"{n.name}: {e}")
    return out


def _slow_compute(timings: dict[str, ComputeTiming], opts: Options, details: list[str]) -> list[str]:
    best = {name: t.best_s for name, t in timings.items() if t.best_s}
    slow: list[str] = []
    if len(best) < 2:
        return slow
    ref = statistics.median_low(sorted(best.values()))
    for name, t in best.items():
        details.append(f"{name}: compute {t:.3f} s ({t / ref:.2f}x the median, "
                       f"{opts.straggler_iters} forward/backward steps, {timings[name].backend})")
        if t > opts.straggler_ratio * ref:
            slow.append(f"{name} computes {t / ref:.1f}x slower than the median ({t:.3f} s vs {ref:.3f} s)")
    return slow


def _pair_times(nodes: list[Node], pairs: dict[str, Pairs]) -> tuple[dict, dict]:
    """``({(a, b): the slower end's seconds}, {(a, b): first error})``."""
    names = [n.name for n in nodes]
    position = {name: i for i, name in enumerate(names)}
    times: dict[tuple[str, ...], float] = {}
    errors: dict[tuple[str, ...], str] = {}
    for name, doc in pairs.items():
        for p in doc.pairs:
            if not 0 <= p.peer < len(names) or names[p.peer] == name:
                continue  # a peer index the run never gave: not a pair of this run
            key = tuple(sorted((name, names[p.peer]), key=position.__getitem__))
            if p.error:
                errors.setdefault(key, p.error)
            elif p.seconds is not None:
                times[key] = max(times.get(key) or 0.0, p.seconds)
    return times, errors


def _slow_pairs(times: dict, opts: Options, backend: str, details: list[str]) -> list[str]:
    """Nodes whose fastest pair is over ratio x the median node's (3 nodes or more: two cannot tell)."""
    slow: list[str] = []
    if not times:
        return slow
    ref = statistics.median_low(sorted(times.values()))
    for (a, b), t in sorted(times.items(), key=lambda kv: -kv[1]):
        details.append(f"pair {a} <-> {b}: all-reduce {t:.3f} s ({t / ref:.2f}x the median, "
                       f"{opts.allreduce_iters} x {human_bytes(opts.allreduce_bytes)}, {backend})")
    best: dict[str, float] = {}
    for (a, b), t in times.items():
        for x in (a, b):
            best[x] = min(best.get(x, t), t)
    if len(best) >= 3:
        node_ref = statistics.median_low(sorted(best.values()))
        for name, t in best.items():
            if t > opts.straggler_ratio * node_ref:
                slow.append(f"{name}'s fastest all-reduce pair is {t / node_ref:.1f}x slower than the median "
                            f"node's ({t:.3f} s vs {node_ref:.3f} s)")
    return slow


def check_straggler(nodes: list[Node], opts: Options, backend: str) -> Check:
    """``fail`` naming nodes slower than the median by more than ``opts.straggler_ratio``, and failed pairs."""
    live_nodes = live(nodes)
    if len(live_nodes) < 2:
        why = "one live node: nothing to compare" if live_nodes else "needs live nodes (report files give reports only)"
        return Check("straggler", SKIP, why, checked=False)
    unknown: list[str] = []
    timings: dict[str, ComputeTiming] = {}
    time_compute(live_nodes, opts, backend, timings, unknown)
    # Timings too slow are taken again once (a busy moment is not a straggler), as the
    # cluster-health-scanner re-tests failing nodes before naming them.
    best = {name: t.best_s for name, t in timings.items() if t.best_s}
    if len(best) >= 2:
        ref = statistics.median_low(sorted(best.values()))
        again = [n for n in live_nodes if best.get(n.name, 0) > opts.straggler_ratio * ref]
        if again:
            time_compute(again, opts, backend, timings, unknown)
    pairs = run_pairs(live_nodes, opts, backend, unknown)
    details: list[str] = []
    slow = _slow_compute(timings, opts, details)
    times, errors = _pair_times(live_nodes, pairs)
    failed = [f"all-reduce {a} <-> {b} failed: {e}" for (a, b), e in errors.items()]
    slow += _slow_pairs(times, opts, backend, details)
    details.extend(sorted({f"pairs: {d.error}" for d in pairs.values() if d.error}))
    data = {"ratio": opts.straggler_ratio, "backend": backend,
            "compute": {name: t.best_s for name, t in timings.items() if t.best_s},
            "pairs": [{"nodes": list(k), "seconds": v, "error": errors.get(k)} for k, v in times.items()]
            + [{"nodes": list(k), "seconds": None, "error": e} for k, e in errors.items() if k not in times]}
    if slow or failed:
        return Check("straggler", FAIL, "straggler: " + "; ".join(slow + failed), FIX, slow + failed + details, data)
    if unknown:
        return Check("straggler", UNKNOWN, "; ".join(unknown), "check that python3 (and torch) run on every node",
                     unknown + details, data)
    n_docs = len(set(timings) | set(pairs))
    return Check("straggler", PASS, f"no node slower than {opts.straggler_ratio:g}x the median ({n_docs} nodes, "
                 f"{len(times)} pairs)", None, details, data)
