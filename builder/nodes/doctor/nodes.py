"""The ``nodes`` check: every node answered with a valid report (else: unknown, exit 3)."""

from __future__ import annotations

from ..report import Node
from .base import PASS, UNKNOWN, Check


def check_nodes(nodes: list[Node]) -> Check:
    bad = [n for n in nodes if not n.ok]
    if bad:
        return Check("nodes", UNKNOWN, f"{len(bad)} of {len(nodes)} nodes could not be checked: {bad[0].error}",
                     "make the nodes reachable (ssh keys, running containers) and their reports valid",
                     [str(n.error) for n in bad], checked=len(bad) < len(nodes))
    return Check("nodes", PASS, f"{len(nodes)} nodes answered with valid reports")
