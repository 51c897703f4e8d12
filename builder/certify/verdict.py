"""The verdict of a certification run, from what the ranks reported (:func:`judge`)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any

from builder.certify import nccl_log
from builder.core.certificate import RunSettings, SocketSetting, Verdict
from builder.core.documents import NodeReport, RankResult
from builder.core.errors import ExitCode, FailureClass, next_step
from builder.core.inputs import one_line, show
from builder.core.netif import match_nccl_ifname
from builder.image import probecheck
from builder.launchers.base import SOCKET_VARS, LaunchResult, LaunchSpec
from builder.launchers.output import check_result
from builder.launchers.progress import name_hangs, ranks_text
from builder.recipe.model import Lock

#: Facts that must be identical on every rank: (name, getter of the probe).
_SAME_EVERYWHERE: tuple[tuple[str, Callable[[NodeReport], Any]], ...] = (
    ("torch", lambda p: p.torch and p.torch.version),
    ("loaded NCCL", lambda p: p.nccl.loaded and p.nccl.loaded.version),
    ("python", lambda p: p.python.version),
    ("glibc", lambda p: p.glibc),
    ("OS", lambda p: f"{p.os.id} {p.os.version_id}"),
)


def signal_text(code: int) -> str:
    """How a process ended, for a status: ``-9`` (torchrun's way) or ``137`` (a container's: 128 + N) -> ``"killed by
    SIGKILL (exit 137)"``; the watchdog's ``124`` -> ``"ended by its watchdog at the deadline (exit 124)"``; else
    ``"exited with N"``."""
    from builder.agent.bench.node import EXIT_DEADLINE

    n = -code if code < 0 else code - 128 if 128 < code <= 128 + 64 else None
    if n is not None:
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = f"signal {n}"
        return f"killed by {name} (exit {128 + n})"
    if code == EXIT_DEADLINE:
        return f"ended by its watchdog at the deadline (exit {code})"
    return f"exited with {code}"


def oom_text(launch: LaunchResult, node: int) -> str | None:
    """``"killed by the kernel's OOM killer (memory limit N bytes)"`` when the engine saw an
    OOM kill in ``node`` (``LaunchResult.oom_killed``), else None."""
    if node not in launch.oom_killed:
        return None
    limit = launch.oom_killed[node]
    return "killed by the kernel's OOM killer (" + (f"memory limit {limit} bytes)" if limit > 0 else
                                                    "no memory limit: the host's memory ran out)")


def check_results(launch: LaunchResult, spec: LaunchSpec) -> None:
    """Refuse (in place) every rank result of ``launch`` that is not of this run: another schema, rank, world size or
    run id, or a document that breaks the :class:`~builder.core.documents.RankResult` model
    (:func:`~builder.launchers.output.check_result`): it moves to ``rank_problems`` (named there), whatever launcher
    read it. A launcher that handed plain documents gets them as models."""
    for rank, doc in sorted(launch.rank_results.items()):
        result, why = check_result(doc, rank, "result", run_id=spec.run_id, world_size=spec.world_size)
        if result is None:
            del launch.rank_results[rank]
            launch.rank_problems[rank] = why or "refused"
            if rank not in launch.missing_ranks:
                launch.missing_ranks = sorted([*launch.missing_ranks, rank])
        else:
            launch.rank_results[rank] = result


def reference_rank(results: Mapping[int, RankResult]) -> int | None:
    """The rank whose tables the certificate shows: the lowest that reported (0 normally)."""
    return min(results) if results else None


# --------------------------------------------------------------------------- (1) missing ranks


def _missing_reason(rank: int, s: RunSettings, launch: LaunchResult, node: int) -> tuple[str, bool]:
    """(failure line, could-not-check?) for a rank without a result (not timed out: those
    are named by :func:`~builder.launchers.progress.name_hangs`)."""
    if rank in launch.rank_problems:
        return f"rank {rank}: {one_line(launch.rank_problems[rank], 400)}", True
    code, oom = launch.rank_exit_codes.get(rank), oom_text(launch, node)
    if code is not None:
        return f"rank {rank} {oom if oom and code in (-9, 137) else signal_text(code)}", False
    if launch.timed_out:
        limit = launch.deadline_s if launch.deadline_s is not None else s.timeout_s
        return f"rank {rank} did not finish within {limit:g} s (timeout)", True
    ncode = launch.node_exit_codes.get(node)
    if ncode is None and launch.killed_after_s is not None:
        return (f"rank {rank} did not finish: killed {launch.killed_after_s:g} s after another "
                "node failed"), False
    if ncode not in (None, 0):
        return f"rank {rank} wrote no result: node {node} {oom or signal_text(ncode)}", False
    return f"rank {rank} wrote no result (node {node} exited with {ncode})", False


def _missing_ranks(s: RunSettings, launch: LaunchResult) -> tuple[list[str], bool, bool]:
    """``(failure lines, could-not-check?, definite?)`` for the ranks without a result;
    timed-out ranks named by :func:`~builder.launchers.progress.name_hangs`, the hung ones first."""
    results = launch.rank_results
    missing = [r for r in range(s.world_size) if r not in results]
    stuck = [r for r in missing if launch.timed_out and r not in launch.rank_problems
             and r not in launch.rank_exit_codes]
    limit = launch.deadline_s if launch.deadline_s is not None else s.timeout_s
    hangs = name_hangs(launch.progress, stuck, limit) if stuck else {}
    lines, unknown, definite = [], False, False
    for r in sorted(hangs, key=lambda r: (not hangs[r][1], r)):
        lines.append(hangs[r][0])
        unknown = True
    for r in missing:
        if r in hangs:
            continue
        line, could_not = _missing_reason(r, s, launch, s.node_of_rank(r))
        lines.append(line)
        unknown |= could_not
        definite |= not could_not
    return lines, unknown, definite


# --------------------------------------------------------------------------- (1b)-(5) checks


def _check_reports(s: RunSettings, results: Mapping[int, RankResult]) -> tuple[list[str], list[str]]:
    """(1b) ``(failures, warnings)``: each result's world size and backend; its own errors."""
    failures, warnings = [], []
    for rank, doc in sorted(results.items()):
        if doc.world_size != s.world_size:
            failures.append(f"rank {rank}: world size {show(doc.world_size, 40)}, expected {s.world_size}")
        if doc.backend != s.backend:
            failures.append(f"rank {rank}: ran backend {show(doc.backend, 40)}, expected {s.backend}")
        for err in doc.errors[:20]:
            warnings.append(f"rank {rank}: {one_line(err, 300)}")
    return failures, warnings


def lock_mismatches(results: Mapping[int, RankResult], lock: Lock | None) -> dict[int, list[str]]:
    """``{rank: differences from the lock}`` of every rank with a probe; {} without a lock."""
    if lock is None:
        return {}
    return {r: probecheck.compare_probe_to_lock(d.probe, lock)
            for r, d in sorted(results.items()) if d.probe is not None}


def _check_probes(results: Mapping[int, RankResult], mismatches: Mapping[int, list[str]]) -> list[str]:
    """(2) every probe matches the lock (``mismatches``; a foreign image has none: the
    reference rank's probe is the reference), and the ranks agree."""
    failures = []
    probes: dict[int, NodeReport] = {}
    for rank, doc in sorted(results.items()):
        if doc.probe is None:
            errs = "; ".join(one_line(e, 200) for e in doc.errors if "probe" in e)
            failures.append(f"rank {rank}: {errs or 'probe failed: no probe document'}")
            continue
        probes[rank] = doc.probe
        for d in mismatches.get(rank, []):
            failures.append(f"rank {rank}: image differs from the lock: {one_line(d, 300)}")
    for name, get in _SAME_EVERYWHERE:
        values = {r: get(p) for r, p in probes.items()}
        if len(set(map(str, values.values()))) > 1:
            failures.append(f"ranks differ in {name}: "
                            + ", ".join(f"rank {r} {one_line(v, 60)}" for r, v in sorted(values.items())))
    return failures


def _check_busbw(s: RunSettings, results: Mapping[int, RankResult]) -> list[str]:
    """(3) the busbw floor at the gate size, on the reference rank's float32 all-reduce rows."""
    ref = reference_rank(results)
    if s.min_busbw_gbps is None or ref is None:
        return []
    prof = results[ref].profiles
    rows = prof.collectives.get("all_reduce") if prof is not None else None
    entry = next((e for e in rows if e.size_bytes == s.busbw_size and e.type == "float32"),
                 None) if isinstance(rows, list) else None
    if entry is None:
        return [f"no all-reduce measurement at the gate size {s.busbw_size} B"]
    if entry.busbw_gbps >= s.min_busbw_gbps:
        return []
    slow = entry.slowest_rank if entry.slowest_rank is not None else ref
    return [f"all-reduce busbw {entry.busbw_gbps:.4g} GB/s at {s.busbw_size} B is below "
            f"the floor of {s.min_busbw_gbps:g} GB/s ({s.busbw_source}); slowest rank {slow} ({entry.time_us:.1f} us)"]


# --------------------------------------------------------------------------- socket settings


def _selected(var: str, value: str | None, ifaces: Mapping[str, bool]) -> list[str] | None:
    """The interfaces of ``ifaces`` a socket variable selects; None when it is unset (the
    library chooses). GLOO_SOCKET_IFNAME: exact names (used when longer than one
    character); NCCL_SOCKET_IFNAME: NCCL's prefix syntax (:func:`builder.core.netif.match_nccl_ifname`)."""
    if var == "GLOO_SOCKET_IFNAME":
        if value is None or len(value) <= 1:
            return None
        return [n for n in value.split(",") if n in ifaces]
    if not value:
        return None
    return match_nccl_ifname(value, sorted(ifaces))


def socket_findings(s: RunSettings, launch: LaunchResult, sock: SocketSetting) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` about the socket settings the ranks ran with."""
    var = "GLOO_SOCKET_IFNAME" if s.backend == "gloo" else "NCCL_SOCKET_IFNAME"
    where = {"image": "from the image's ENV", "--socket-ifname": "from --socket-ifname",
             "default": "unset"}[sock.source]
    warnings = []
    loop: dict[str | None, list[int]] = {}
    for r in sorted(set(launch.socket_seen) | set(launch.interfaces_seen)):
        seen = launch.socket_seen.get(r) or {}
        for k in SOCKET_VARS:
            if r in launch.socket_seen and seen.get(k) != sock.get(k):
                warnings.append(f"rank {r} ran with {k}={show(seen.get(k), 60)}, not "
                                f"{show(sock.get(k), 60)} ({where})")
        value = seen.get(var) if r in launch.socket_seen else sock.get(var)
        ifaces = launch.interfaces_seen.get(r) or {}
        picked = _selected(var, value, ifaces)
        if picked and all(ifaces.get(n) for n in picked):
            loop.setdefault(value, []).append(r)
    failures = []
    if s.nodes > 1:
        for value, ranks in sorted(loop.items(), key=lambda kv: str(kv[0])):
            failures.append(
                f"{var}={one_line(value, 80)} ({where}) selects only the loopback interface on "
                f"{ranks_text(ranks)}: ranks on {s.nodes} nodes cannot reach each other over it; "
                "set it to the nodes' network interface (or leave it unset) in the image, or pass "
                "--socket-ifname IF")
    return failures, warnings


# --------------------------------------------------------------------------- the verdict


def _warnings(s: RunSettings, launch: LaunchResult, report_warnings: list[str]) -> list[str]:
    """The warnings of a run: the settings', the ranks' own errors, NCCL transports not
    seen (reported, not gated), cleanup and stale objects removed."""
    warnings = [*s.warnings, *report_warnings]
    if launch.timed_out and not launch.missing_ranks:
        warnings.append(f"a node was still running after {s.timeout_s:g} s although every rank "
                        "reported; it was killed")
    if s.backend == "nccl" and s.world_size > 1:
        transports = nccl_log.transports_by_rank(launch.node_logs.values())
        lacking = [r for r in sorted(launch.rank_results) if r not in transports]
        if lacking:
            warnings.append(f"no NCCL transport lines (NCCL_DEBUG=INFO) for {ranks_text(lacking)}")
    warnings += [f"cleanup: {one_line(err, 400)}" for err in launch.cleanup_errors]
    warnings += [one_line(line, 400) for line in launch.removed_stale]
    return warnings


def judge(s: RunSettings, launch: LaunchResult, lock: Lock | None, sock: SocketSetting | None = None) -> Verdict:
    """Judge a launch. ``lock`` None: a foreign image, whose ranks must all match the reference rank's probe. ``sock``:
    the run's socket setting (:func:`~builder.certify.settings.socket_settings`; None: not known), for
    :func:`socket_findings`."""
    from .profiles import check_profiles

    results = launch.rank_results
    launch.lock_mismatches = lock_mismatches(results, lock)  # once; the certificate shows them
    failures, cannot_check, definite = _missing_ranks(s, launch)  # (1) every rank reported
    found, report_warnings = _check_reports(s, results)
    prof_failures, prof_warnings = check_profiles(s, results)  # (4) the profiles
    report_warnings += prof_warnings
    for check in (_check_probes(results, launch.lock_mismatches), _check_busbw(s, results), prof_failures):
        found += check
    failures += found
    definite |= bool(found)
    warnings = _warnings(s, launch, report_warnings)
    if sock is not None:  # the socket settings the ranks ran with: explain a failing run
        sock_fail, sock_warn = socket_findings(s, launch, sock)
        warnings.extend(sock_warn)
        if failures and sock_fail:
            failures[:0] = sock_fail
            definite = True
    notes = [one_line(n, 1000) for n in launch.notes]  # the launcher's view of the whole run
    if failures:
        failures[:0] = notes
    else:
        warnings.extend(notes)
    cls = classify(s, launch, failures, warnings) if failures else None
    if not failures:
        code = ExitCode.OK
    elif definite or not cannot_check:
        code = ExitCode.CHECK_FAILED
    else:
        code = ExitCode.UNREACHABLE
    return Verdict(passed=not failures, exit_code=int(code), failures=failures, warnings=warnings,
                   failure_class=cls, next_step=cls and next_step(cls))


def classify(s: RunSettings, launch: LaunchResult, failures: list[str], warnings: list[str]) -> FailureClass:
    """The class of a failed run, from what the launch and the checks found (not from text): ``hardware`` a rank killed
    by a signal or the OOM killer; ``image`` a probe off the lock; ``network`` a timeout, a hang, a rank that could not
    report, a socket setting off the run's (failure or warning); ``threshold`` a floor missed with correct results;
    ``workload`` the rest (wrong results, a rank's own error)."""
    from .profiles import check_profiles

    if launch.oom_killed or any(c < 0 or c >= 128 for c in launch.rank_exit_codes.values()):
        return FailureClass.HARDWARE
    if any(launch.lock_mismatches.values()):
        return FailureClass.IMAGE
    if launch.timed_out or launch.rank_problems or any("SOCKET_IFNAME" in f for f in failures + warnings):
        return FailureClass.NETWORK
    results = launch.rank_results
    if len(results) == s.world_size and not launch.rank_exit_codes:
        floors = _check_busbw(s, results) + [f for f in check_profiles(s, results)[0] if f.startswith("scaling")]
        if floors and len(floors) == len(failures):
            return FailureClass.THRESHOLD
    return FailureClass.WORKLOAD

