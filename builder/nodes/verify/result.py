"""What ``verify`` found, as the ``envbuild.verify/1`` document (``envbuild verify --json``;
JSON Schema: ``schemas/verify-result.schema.json``)::

    {"schema": "envbuild.verify/1",
     "exit_code": 0 | 1 | 2 | 3,
     "nodes": [{"name", "source", "ok", "error", "hostname", "address", "nccl_interface",
                "torch", "nccl", "driver", "gpus", "image", "image_ref", "runtime",
                "shm_bytes"}, ...],
     "findings": [{"level": "fail" | "warn" | "unknown", "rule", "field", "message",
                   "nodes": [str], "source", "groups": [{"value", "nodes": [str]}]}, ...]}
"""

from __future__ import annotations

from typing import Final, Literal

from builder.core.errors import ExitCode
from builder.core.model import Model

from ..report import Node
from .interfaces import nccl_interface

Level = Literal["fail", "warn", "unknown"]
FAIL: Final = "fail"
WARN: Final = "warn"
UNKNOWN: Final = "unknown"
_LEVEL_CODE = {FAIL: ExitCode.CHECK_FAILED, WARN: ExitCode.WARNINGS, UNKNOWN: ExitCode.UNREACHABLE}


class Group(Model, frozen=True):
    """Nodes that share one value of a compared field (``value`` None: absent)."""

    value: str | None
    nodes: list[str]


class Finding(Model, frozen=True):
    """One result line.

    Attributes:
        level: ``fail``, ``warn`` or ``unknown`` (exit 2, 1, 3).
        rule: ``must-match``, ``should-match``, ``floor``, ``interface``, ``nccl-copies``,
            ``probe-errors``, ``unreachable`` or ``invalid``.
        field: the report field concerned, e.g. ``"nccl.loaded"`` or ``"env.NCCL_DEBUG"``.
        message: one line, e.g. ``"nccl.loaded: 2.20.5 on node-1; 2.19.3 on node-2"``.
        nodes: the nodes concerned.
        source: the fact behind the rule.
        groups: for differences: one :class:`Group` per value, smallest group first.
    """

    level: Level
    rule: str
    field: str | None
    message: str
    nodes: list[str] = []
    source: str = ""
    groups: list[Group] = []


class NodeSummary(Model, frozen=True):
    """The informational fields of one node (for tables and JSON)."""

    name: str
    source: str
    ok: bool
    error: str | None
    hostname: str | None
    address: str | None
    nccl_interface: str | None
    torch: str | None
    nccl: str | None
    driver: str | None
    gpus: int
    image: str | None
    image_ref: str | None
    runtime: str | None
    shm_bytes: int | None


class VerifyResult(Model, frozen=True):
    """Everything ``verify`` found: the nodes compared (and those that could not be
    checked), the findings (failures first, then warnings, then unknowns; within a level
    the rules' order) and the exit code (see :func:`exit_code`)."""

    schema: Literal["envbuild.verify/1"]
    exit_code: int
    nodes: list[NodeSummary]
    findings: list[Finding]

    @property
    def differences(self) -> list[Finding]:
        """The findings that are differing values (must- and should-match)."""
        return [f for f in self.findings if len(f.groups) > 1]


def exit_code(findings: list[Finding]) -> ExitCode:
    """The worst level among ``findings``: 0 none, 1 warn, 2 fail, 3 unknown."""
    return max((_LEVEL_CODE[f.level] for f in findings), default=ExitCode.OK)


def node_summary(n: Node) -> NodeSummary:
    """The informational fields of node ``n``."""
    r = n.report
    pick = nccl_interface(r) if r is not None and r.network is not None else None
    loaded = r.nccl.loaded if r is not None else None
    image = r.image if r is not None else None
    return NodeSummary(
        name=n.name, source=n.source, ok=n.ok, error=str(n.error) if n.error else None,
        hostname=r.hostname if r else None,
        address=n.address or (pick.address if pick else None),
        nccl_interface=pick.name if pick else None,
        torch=r.torch.version if r and r.torch else None, nccl=loaded.version if loaded else None,
        driver=r.driver if r else None, gpus=len(r.gpus) if r else 0,
        image=(image.digest or image.id or image.ref) if image else None,
        image_ref=image.ref if image else None,
        runtime=r.container.runtime if r and r.container else None,
        shm_bytes=r.shm.size_bytes if r and r.shm else None,
    )

