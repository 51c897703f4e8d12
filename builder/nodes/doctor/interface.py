"""The ``interface`` check: the interface NCCL (and gloo) would pick exists, has an address, is
not loopback and is reachable from the peers (NVIDIA/nccl#286, #1581, #1105; pytorch#64926)."""

from __future__ import annotations

from ..report import Node
from ..verify.interfaces import InterfacePick, gloo_interface, nccl_interface, ordered_interfaces
from .base import FAIL, PASS, Check


def interface_picks(n: Node, backend: str) -> list[tuple[str, InterfacePick]]:
    """``[("NCCL", pick), ("gloo", pick)]``: gloo's only with the gloo backend or ``GLOO_SOCKET_IFNAME``."""
    assert n.report is not None
    picks = [("NCCL", nccl_interface(n.report))]
    if backend == "gloo" or n.report.env.get("GLOO_SOCKET_IFNAME"):
        picks.append(("gloo", gloo_interface(n.report)))
    return picks


def other_addresses(n: Node, backend: str, skip_primary: bool) -> list[InterfacePick]:
    """The non-loopback pick addresses; without the node's own when ``skip_primary`` (probed anyway)."""
    out: dict[str, InterfacePick] = {}
    for _, p in interface_picks(n, backend):
        if p.address and not p.loopback and not (skip_primary and p.address == n.address):
            out.setdefault(p.address, p)
    return list(out.values())


def report_interface_problems(ok_nodes: list[Node], backend: str) -> tuple[list[str], int]:
    """``(problems, reports with a network section)`` from the reports alone."""
    problems: list[str] = []
    seen = 0
    for n in ok_nodes:
        if n.report is None or n.report.network is None:
            continue
        seen += 1
        have = ", ".join(i.name for i in ordered_interfaces(n.report)) or "none"
        for label, pick in interface_picks(n, backend):
            if pick.name is None:
                problems.append(f"{n.name}: {pick.reason}: no such interface with an address (it has: {have})")
            elif pick.loopback and len(ok_nodes) > 1:
                problems.append(f"{n.name}: {label} would use loopback {pick.name} ({pick.address}; "
                                f"{pick.reason}): other nodes cannot reach it")
    return problems, seen


def interface_check(if_fail: list[str], reach_fail: list[str], reach_checked: bool) -> Check:
    problems = if_fail + reach_fail
    if problems:
        return Check("interface", FAIL, "; ".join(problems),
                     "set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to an interface every node has and its "
                     "peers can route to, e.g. the cluster network (NVIDIA/nccl#286, #1581; pytorch#64926)",
                     problems)
    tail = "" if reach_checked else " (reachability not checked: needs live nodes)"
    return Check("interface", PASS, "the interfaces NCCL/gloo would pick exist, are not loopback" + tail)
