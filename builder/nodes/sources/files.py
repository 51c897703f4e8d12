"""Report files as nodes: one node report per file (``envbuild probe --host > node.json``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .. import report as nodereport
from ..report import InvalidReport, Node


def from_files(paths: Iterable[str | Path]) -> list[Node]:
    """One node per report file, named by the report's hostname (the file name when that
    is missing or repeated), in the order given. Unreadable or invalid files come back
    with ``error`` set."""
    nodes = []
    for p in paths:
        p = str(p)
        try:
            doc = nodereport.load_file(p)
            nodes.append(Node(name=doc.hostname or Path(p).stem, source=p, report=doc))
        except InvalidReport as e:
            nodes.append(Node(name=Path(p).stem, source=p, error=e))
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.name] = counts.get(n.name, 0) + 1
    for n in nodes:
        if counts[n.name] > 1:
            n.name = n.source
    return nodes
