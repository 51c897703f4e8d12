"""verify's rules, each giving :class:`~.result.Finding` values with their sources (``SRC_*``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from builder.core.documents import NodeReport

from ..report import Node
from .interfaces import gloo_interface, nccl_interface, ordered_interfaces
from .result import FAIL, UNKNOWN, WARN, Finding, Group, Level

#: Environment prefixes compared between nodes (should-match).
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
#: Variables that pick NCCL's transport: a difference is a must-match failure (ranks that
#: pick different networks hang or fail at connect; NCCL ``src/net.cc``/``plugin_open.cc``).
ENV_MUST_MATCH = ("NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_IB_DISABLE")
#: Other variables compared (should-match): which libraries a process loads.
ENV_OTHER = ("LD_LIBRARY_PATH",)
#: Variables torchrun sets for its workers (torch ``distributed/elastic/agent/server/local_elastic_agent.py``): a
#: certified rank has them, a probe at job start does not yet. Not compared against a reference (``--against``), where
#: one side is a rank and the other a probe; between nodes they are compared as any other.
TORCHRUN_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING",)

SRC_NCCL_MISMATCH = "NVIDIA/nccl src/init.cc (>= 2.23.4), NVIDIA/nccl#1267, #1328"
SRC_CONFIGCHECK = "Google cluster-health-scanner configcheck"
SRC_IFNAME = "NCCL src/misc/socket.cc; PyTorch ProcessGroupGloo; NVIDIA/nccl#286, #1581"
SRC_COPIES = "compat.md gotcha 3; pytorch#116977"
SRC_PLUGIN = ("NCCL src/net.cc, src/plugin/plugin_open.cc (NCCL_NET_PLUGIN, libnccl-net.so); "
              "cluster-health-scanner configcheck (NCCL plugin)")
SRC_CUDART = "one CUDA runtime per process: a wheel's libcudart next to a system one"

Scope = Literal["host", "image"]


def _torch(field: str) -> Callable[[NodeReport], str | None]:
    return lambda r: getattr(r.torch, field) if r.torch else None


def net_plugin_value(r: NodeReport) -> str | None:
    """The NCCL network plugin as compared: ``"libnccl-net.so IBext v8 sha256:0123456789ab"``; None
    when the report does not say (an older probe)."""
    p = r.nccl.net_plugin
    if p is None:
        return None
    if p.path is None:
        return "(none)"
    digest = p.sha256[:19] if p.sha256 else "sha256 unknown"
    return f"{os.path.basename(p.realpath or p.path)} {p.name or '?'} {p.api or '?'} {digest}"


@dataclass(frozen=True)
class Rule:
    """One compared field. ``skip_absent``: nodes without a value are named in a warning instead of
    counting as a different value; ``path``: where the in-pod gate reads it in a probe (None: not there)."""

    name: str
    level: Level
    value: Callable[[NodeReport], str | None]
    source: str
    skip_absent: bool = False
    scope: Scope = "image"
    path: tuple[str, ...] | None = None
    against_level: Level | None = None


MUST_MATCH = (
    Rule("torch.version", FAIL, _torch("version"), "collectives and DDP need one PyTorch release",
         path=("torch", "version")),
    Rule("torch.cuda", FAIL, _torch("cuda"), "torch.version.cuda: the CUDA torch was built with",
         path=("torch", "cuda")),
    Rule("nccl.loaded", FAIL, lambda r: r.nccl.loaded.version if r.nccl.loaded else None, SRC_NCCL_MISMATCH,
         path=("nccl", "loaded", "version")),
    Rule("torch.cudnn", FAIL, _torch("cudnn"), "cuDNN differences change numerics and kernels",
         path=("torch", "cudnn")),
    Rule("python.version", FAIL, lambda r: r.python.version, "pickled objects cross ranks",
         path=("python", "version")),
    Rule("image.digest", FAIL, lambda r: r.image.digest if r.image else None, "one image everywhere",
         skip_absent=True),
    Rule("nccl.net_plugin", FAIL, net_plugin_value, SRC_PLUGIN, skip_absent=True,
         path=("nccl", "net_plugin", "sha256")),
)

SHOULD_MATCH = (
    Rule("driver.branch", WARN, lambda r: r.driver.split(".")[0] if r.driver else None, SRC_CONFIGCHECK, scope="host"),
    Rule("kernel", WARN, lambda r: r.kernel, SRC_CONFIGCHECK, scope="host"),
    Rule("os", WARN, lambda r: f"{r.os.id} {r.os.version_id or ''}".strip() if r.os.id else None, SRC_CONFIGCHECK),
    Rule("glibc", WARN, lambda r: r.glibc, SRC_CONFIGCHECK),
    Rule("torch.nccl_compiled", WARN, _torch("nccl_compiled"), "pytorch#116977"),
    Rule("gpu.models", WARN, lambda r: ", ".join(sorted({g.name for g in r.gpus})) or None, SRC_CONFIGCHECK,
         scope="host"),
    Rule("image.id", WARN, lambda r: r.image.id if r.image else None,
         "the engine's image ID (the digest is unknown for local images); against a reference another "
         "image is one that was never certified", skip_absent=True, against_level=FAIL),
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
        message = f"{rule.name}: " + "; ".join(f"{show(g.value)} on {', '.join(g.nodes)}" for g in groups)
        out.insert(0, Finding(level=rule.level, rule=kind, field=rule.name, message=message,
                              nodes=[n for n, _ in pairs], source=rule.source, groups=groups))
    return out


def env_rule(var: str) -> Rule:
    """The rule of one environment variable: must-match for :data:`ENV_MUST_MATCH`, else should-match."""
    level: Level = FAIL if var in ENV_MUST_MATCH else WARN
    source = (SRC_PLUGIN if var in ENV_MUST_MATCH else
              "which libraries load" if var in ENV_OTHER else
              "NCCL/gloo/torch knobs should agree on every node (configcheck)")
    return Rule(f"env.{var}", level, lambda r: r.env.get(var), source, path=("env", var))


def env_names(reports: Iterable[NodeReport], exclude: Iterable[str] = ()) -> list[str]:
    """The compared variables set in any of ``reports``, sorted, less ``exclude``."""
    skip = set(exclude)
    return sorted({k for r in reports for k in r.env
                   if (k.startswith(ENV_PREFIXES) or k in ENV_OTHER) and k not in skip})


def interface_findings(nodes: list[Node], several: bool) -> list[Finding]:
    """Fail for a socket setting that selects no interface the node has; with ``several`` (the nodes
    of a job) also for a loopback one: the ranks cannot reach each other over it."""
    out = []
    for n, r in _checked(nodes):
        if r.network is None:
            continue
        have = ", ".join(i.name for i in ordered_interfaces(r)) or "none"
        for var, pick in (("NCCL_SOCKET_IFNAME", nccl_interface), ("GLOO_SOCKET_IFNAME", gloo_interface)):
            value = r.env.get(var)
            chosen = pick(r) if value else None
            if chosen is None or (chosen.name is not None and not (several and chosen.loopback)):
                continue
            what = (f"matches no interface with an address (it has: {have})" if chosen.name is None else
                    f"selects the loopback interface {chosen.name} ({chosen.address}): other nodes cannot reach "
                    "it; name the interface the nodes share, or leave it unset")
            out.append(Finding(level=FAIL, rule="interface", field=f"env.{var}",
                               message=f"{var}={value} on {n.name} {what}", nodes=[n.name], source=SRC_IFNAME))
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


def cuda_runtime_findings(nodes: list[Node]) -> list[Finding]:
    """Warn for every node whose probe mapped more than one CUDA runtime library."""
    out = []
    for n, r in _checked(nodes):
        loaded = r.cuda_runtime.loaded if r.cuda_runtime else []
        if len({os.path.realpath(lib.path) for lib in loaded}) > 1:
            libs = "; ".join(f"{lib.path} ({lib.version or 'version unknown'})" for lib in loaded)
            out.append(Finding(level=WARN, rule="cuda-runtime-copies", field="cuda_runtime.loaded",
                               message=f"{n.name} loads {len(loaded)} CUDA runtimes: {libs}",
                               nodes=[n.name], source=SRC_CUDART))
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
