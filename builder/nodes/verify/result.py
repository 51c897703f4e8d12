"""What ``verify`` found, as the ``envbuild.verify/1`` document (``envbuild verify --json``)."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from builder.core.errors import ExitCode, FailureClass, next_step
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
    """One result line."""

    level: Level
    rule: str
    field: str | None
    message: str
    nodes: list[str] = []
    source: str = ""
    groups: list[Group] = []
    reference: str | None = None
    cls: FailureClass | None = None
    next_step: str | None = None


#: Compared fields that are the fabric's configuration or the hardware; every other one is the image's.
FIELD_CLASS = {"env.NCCL_SOCKET_IFNAME": FailureClass.NETWORK, "env.GLOO_SOCKET_IFNAME": FailureClass.NETWORK,
                "gpu.models": FailureClass.HARDWARE}


def classified(f: Finding) -> Finding:
    """``f`` with its class and next step when it fails or warns (an unknown one checked nothing)."""
    if f.level == UNKNOWN:
        return f
    cls = FailureClass.NETWORK if f.rule == "interface" else FIELD_CLASS.get(f.field or "", FailureClass.IMAGE)
    return msgspec.structs.replace(f, cls=cls, next_step=next_step(cls))


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
    scope: str | None = None
    probed_at: str | None = None


class ReferenceSummary(Model, frozen=True):
    """What the nodes were compared against (``verify --against``)."""

    kind: Literal["certificate", "report", "image"]
    name: str
    made_at: str | None = None
    age_s: float | None = None
    envbuild_version: str | None = None
    recipe: str | None = None
    lock_hash: str | None = None
    image: str | None = None
    cuda_requirement: str | None = None
    passed: bool | None = None


class Change(Model, frozen=True):
    """One field of a node that changed; ``since``: when the latest value was first seen (UTC)."""

    field: str
    before: str | None
    after: str | None
    since: str | None = None


class NodeDrift(Model, frozen=True):
    """A node's history (reports of one host, by ``probed_at``): what changed since the
    reference and since the previous report."""

    node: str
    reports: int
    first_at: str | None
    previous_at: str | None
    latest_at: str | None
    since_reference: list[Change] = []
    since_previous: list[Change] = []


class VerifyResult(Model, frozen=True):
    """Findings: failures, then warnings, then unknowns; within a level the rules' order."""

    schema: Literal["envbuild.verify/1"]
    exit_code: int
    nodes: list[NodeSummary]
    findings: list[Finding]
    reference: ReferenceSummary | None = None
    drift: list[NodeDrift] = []
    notes: list[str] = []

    @property
    def differences(self) -> list[Finding]:
        """The findings that are differing values (must- and should-match): several
        groups, or against a reference any group."""
        return [f for f in self.findings if len(f.groups) > 1 or (f.groups and f.reference is not None)]


def exit_code(findings: list[Finding]) -> ExitCode:
    """The worst level among ``findings``: 0 none, 1 warn, 2 fail, 3 unknown."""
    return max((_LEVEL_CODE[f.level] for f in findings), default=ExitCode.OK)


def node_summary(n: Node) -> NodeSummary:
    """The informational fields of node ``n``."""
    r = n.report
    pick = nccl_interface(r) if r is not None and r.network is not None else None
    loaded = r.nccl.loaded if r is not None else None
    image = r.image if r is not None else None
    return NodeSummary(name=n.name, source=n.source, ok=n.ok, error=str(n.error) if n.error else None,
                       hostname=r.hostname if r else None, address=n.address or (pick.address if pick else None),
                       nccl_interface=pick.name if pick else None, torch=r.torch.version if r and r.torch else None,
                       nccl=loaded.version if loaded else None, driver=r.driver if r else None,
                       gpus=len(r.gpus) if r else 0, image=(image.digest or image.id or image.ref) if image else None,
                       image_ref=image.ref if image else None,
                       runtime=r.container.runtime if r and r.container else None,
                       shm_bytes=r.shm.size_bytes if r and r.shm else None, scope=r.scope if r else None,
                       probed_at=r.probed_at if r else None)

