"""verify's rules: the fields compared between nodes (must-match, should-match), the driver
floor, NCCL/gloo interfaces, NCCL copies, probe errors and nodes that could not be checked;
each function gives :class:`~.result.Finding` values (the table and sources are in
:mod:`builder.nodes.verify`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion
from packaging.version import Version as _Version

from ..report import Node, NodeReport
from .interfaces import gloo_interface, nccl_interface, ordered_interfaces
from .result import FAIL, UNKNOWN, WARN, Finding, Group, Level

#: Environment prefixes compared between nodes (should-match).
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")

SRC_NCCL_MISMATCH = "NVIDIA/nccl src/init.cc (>= 2.23.4), NVIDIA/nccl#1267, #1328"
SRC_CONFIGCHECK = "Google cluster-health-scanner configcheck"
SRC_DRIVER = "NVIDIA CUDA release notes Table 3; minor-version compatibility guide"
SRC_IFNAME = "NCCL src/misc/socket.cc; PyTorch ProcessGroupGloo; NVIDIA/nccl#286, #1581"
SRC_COPIES = "compat.md gotcha 3; pytorch#116977"


def _driver_branch(r: NodeReport) -> str | None:
    return r.driver.split(".")[0] if r.driver else None


def _gpu_models(r: NodeReport) -> str | None:
    names = sorted({g.name for g in r.gpus})
    return ", ".join(names) if names else None


def _os(r: NodeReport) -> str | None:
    if not r.os.id:
        return None
    return f"{r.os.id} {r.os.version_id or ''}".strip()


def _torch(field: str) -> Callable[[NodeReport], str | None]:
    return lambda r: getattr(r.torch, field) if r.torch else None


@dataclass(frozen=True)
class Rule:
    """One compared field: ``name`` shown in output, ``level`` when values differ
    (``fail``/``warn``), ``value`` extracts it from a report (None: absent), ``source``
    says why it matters, ``skip_absent``: nodes without a value are left out of the
    comparison (a warning names them) instead of counting as a different value."""

    name: str
    level: Level
    value: Callable[[NodeReport], str | None]
    source: str
    skip_absent: bool = False


MUST_MATCH = (
    Rule("torch.version", FAIL, _torch("version"), "collectives and DDP need one PyTorch release"),
    Rule("torch.cuda", FAIL, _torch("cuda"), "torch.version.cuda: the CUDA torch was built with"),
    Rule("nccl.loaded", FAIL, lambda r: r.nccl.loaded.version if r.nccl.loaded else None, SRC_NCCL_MISMATCH),
    Rule("torch.cudnn", FAIL, _torch("cudnn"), "cuDNN differences change numerics and kernels"),
    Rule("python.version", FAIL, lambda r: r.python.version, "pickled objects cross ranks"),
    Rule("image.digest", FAIL, lambda r: r.image.digest if r.image else None, "one image everywhere",
         skip_absent=True),
)

SHOULD_MATCH = (
    Rule("driver.branch", WARN, _driver_branch, SRC_CONFIGCHECK),
    Rule("kernel", WARN, lambda r: r.kernel, SRC_CONFIGCHECK),
    Rule("os", WARN, _os, SRC_CONFIGCHECK),
    Rule("glibc", WARN, lambda r: r.glibc, SRC_CONFIGCHECK),
    Rule("torch.nccl_compiled", WARN, _torch("nccl_compiled"), "pytorch#116977"),
    Rule("gpu.models", WARN, _gpu_models, SRC_CONFIGCHECK),
    Rule("image.id", WARN, lambda r: r.image.id if r.image else None,
         "the engine's image ID (the digest is unknown for local images)", skip_absent=True),
)


def show(value: Any) -> str:
    """A value as shown in output: ``None`` is ``(absent)``."""
    return "(absent)" if value is None else str(value)


def group_values(pairs: list[tuple[str, str | None]]) -> list[Group]:
    """``[(node, value), ...]`` grouped by value, the smallest group first (ties: the
    group whose first node comes first)."""
    groups: dict[str, tuple[str | None, list[str], int]] = {}
    for i, (node, value) in enumerate(pairs):
        key = repr(value)
        if key not in groups:
            groups[key] = (value, [], i)
        groups[key][1].append(node)
    ordered = sorted(groups.values(), key=lambda g: (len(g[1]), g[2]))
    return [Group(value=v, nodes=nodes) for v, nodes, _ in ordered]


def describe_groups(name: str, groups: list[Group]) -> str:
    """``"nccl.loaded: 2.20.5 on node-1; 2.19.3 on node-2, node-3"``."""
    return f"{name}: " + "; ".join(f"{show(g.value)} on {', '.join(g.nodes)}" for g in groups)


def _checked(nodes: list[Node]) -> list[tuple[Node, NodeReport]]:
    """The nodes with a valid report, with it."""
    return [(n, n.report) for n in nodes if n.ok and n.report is not None]


def compare(nodes: list[Node], rule: Rule, kind: str) -> list[Finding]:
    """Apply one :class:`Rule` to the nodes with reports; a finding when values differ."""
    pairs = [(n.name, rule.value(r)) for n, r in _checked(nodes)]
    out = []
    if rule.skip_absent:
        absent = [n for n, v in pairs if v is None]
        pairs = [(n, v) for n, v in pairs if v is not None]
        if absent and pairs:
            out.append(Finding(level=WARN, rule=kind, field=rule.name,
                               message=f"{rule.name}: unknown on {', '.join(absent)}; not compared there",
                               nodes=absent, source=rule.source))
    groups = group_values(pairs)
    if len(groups) > 1:
        out.insert(0, Finding(level=rule.level, rule=kind, field=rule.name,
                              message=describe_groups(rule.name, groups), nodes=[n for n, _ in pairs],
                              source=rule.source, groups=groups))
    return out


def env_findings(nodes: list[Node]) -> list[Finding]:
    """Should-match findings for every ``NCCL_*``, ``GLOO_*``, ``TORCH_*`` variable set on
    some node and not the same (or unset) on another."""
    names = sorted({k for _, r in _checked(nodes) for k in r.env if k.startswith(ENV_PREFIXES)})
    out = []
    for var in names:
        rule = Rule(f"env.{var}", WARN, lambda r, var=var: r.env.get(var),  # type: ignore[misc]
                    "NCCL/gloo/torch knobs should agree on every node (configcheck)")
        out.extend(compare(nodes, rule, "should-match"))
    return out


def _parse_version(text: str) -> _Version | None:
    try:
        return _Version(text)
    except (InvalidVersion, TypeError):
        return None


def _floor_finding(n: Node, r: NodeReport, floors: dict[str, dict]) -> Finding | None:
    """The floor finding of one node whose report has a driver and a CUDA torch."""
    drv, cuda = r.driver, r.torch.cuda if r.torch else None
    if not drv or not cuda:
        return None
    floor = floors.get(".".join(cuda.split(".")[:2]))
    if floor is None:
        return Finding(level=WARN, rule="floor", field="driver",
                       message=f"{n.name}: no driver floor known for CUDA {cuda}", nodes=[n.name], source=SRC_DRIVER)
    have = _parse_version(drv)
    if have is None:
        return None
    torch = r.torch.version if r.torch else None
    if have < _Version(str(floor["minor_compat"])):
        return Finding(level=FAIL, rule="floor", field="driver",
                       message=f"driver: {drv} on {n.name} is below {floor['minor_compat']}, the oldest "
                               f"that runs CUDA {cuda} (torch {torch}); full support needs >= {floor['ga']}",
                       nodes=[n.name], source=SRC_DRIVER)
    if have < _Version(str(floor["ga"])):
        return Finding(level=WARN, rule="floor", field="driver",
                       message=f"driver: {drv} on {n.name} is below {floor['ga']} (CUDA {cuda} GA): minor-version "
                               "compatibility only (no PTX JIT, some APIs fail)", nodes=[n.name], source=SRC_DRIVER)
    return None


def driver_floor_findings(nodes: list[Node], floors: dict[str, dict] | None = None) -> list[Finding]:
    """Floor findings: a node's driver below what its torch's CUDA needs.

    ``floors`` maps CUDA ``"12.8"`` to ``{"ga": "570.26", "minor_compat": "525.60.13"}``
    (default: ``cuda_driver`` of ``builder/recipe/data/compat.yaml``). Below ``minor_compat``:
    fail (CUDA cannot run); below ``ga``: warn (minor-version compatibility only: no PTX
    JIT, some APIs fail). Nodes without a driver or a CUDA torch are not checked.
    """
    if floors is None:
        from builder.recipe.facts import facts

        floors = {cuda: {"ga": row.ga, "minor_compat": row.minor_compat} for cuda, row in facts().cuda_driver.items()}
    found = (_floor_finding(n, r, floors) for n, r in _checked(nodes))
    return [f for f in found if f is not None]


def missing_interface_findings(nodes: list[Node]) -> list[Finding]:
    """Fail for every node whose ``NCCL_SOCKET_IFNAME`` selects no interface with an
    address, or whose ``GLOO_SOCKET_IFNAME`` names one it does not have. Nodes whose
    report has no ``network`` section are not checked."""
    out = []
    for n, r in _checked(nodes):
        if r.network is None:
            continue
        have = ", ".join(i.name for i in ordered_interfaces(r)) or "none"
        for var, pick in (("NCCL_SOCKET_IFNAME", nccl_interface), ("GLOO_SOCKET_IFNAME", gloo_interface)):
            value = r.env.get(var)
            if value and pick(r).name is None:
                out.append(Finding(level=FAIL, rule="interface", field=f"env.{var}",
                                   message=f"{var}={value} on {n.name} matches no interface with an address "
                                           f"(it has: {have})", nodes=[n.name], source=SRC_IFNAME))
    return out


def nccl_copies_findings(nodes: list[Node]) -> list[Finding]:
    """Warn for every node with more than one libnccl file or ``nvidia-nccl-*`` package."""
    out = []
    for n, r in _checked(nodes):
        found, pkgs = r.nccl.found, r.nccl.pip_packages
        loaded = r.nccl.loaded.path if r.nccl.loaded else None
        if len(found) > 1:
            files = "; ".join(f"{f.path} ({f.version or 'version unknown'})" for f in found)
            tail = f"; torch loads {loaded}" if loaded else ""
            out.append(Finding(level=WARN, rule="nccl-copies", field="nccl.found",
                               message=f"{n.name} has {len(found)} NCCL libraries: {files}{tail}",
                               nodes=[n.name], source=SRC_COPIES))
        if len(pkgs) > 1:
            out.append(Finding(level=WARN, rule="nccl-copies", field="nccl.pip_packages",
                               message=f"{n.name} has {len(pkgs)} NCCL packages: "
                                       + ", ".join(f"{k}=={v}" for k, v in pkgs.items()),
                               nodes=[n.name], source=SRC_COPIES))
    return out


def probe_error_findings(nodes: list[Node]) -> list[Finding]:
    """Warn for nodes whose probe listed problems (``errors``), naming the first."""
    out = []
    for n, r in _checked(nodes):
        if r.errors:
            more = f" (+{len(r.errors) - 1} more)" if len(r.errors) > 1 else ""
            out.append(Finding(level=WARN, rule="probe-errors", field="errors",
                               message=f"{n.name}: probe: {r.errors[0]}{more}", nodes=[n.name],
                               source="builder/agent/probe"))
    return out


def unreachable_findings(nodes: list[Node]) -> list[Finding]:
    """``unknown`` for every node that could not be checked, with its one-line reason."""
    out = []
    for n in nodes:
        if n.error is not None:
            rule = "invalid" if type(n.error).__name__ == "InvalidReport" else "unreachable"
            out.append(Finding(level=UNKNOWN, rule=rule, field=n.error.field, message=str(n.error), nodes=[n.name],
                               source="could not check this node"))
    return out
