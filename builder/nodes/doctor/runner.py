"""The doctor run: the chosen checks on the gathered nodes, in :data:`~.base.ALL_CHECKS`
order, and the worst status as the exit code."""

from __future__ import annotations

from dataclasses import dataclass

from builder.core.errors import EnvbuildError, ExitCode, Unreachable

from ..report import Node
from ..verify.result import node_summary
from .base import ALL_CHECKS, SKIP, STATUS_CODE, Check, Options
from .gpu_processes import check_gpu_processes
from .gpu_uuid import check_gpu_uuid
from .network import network_checks
from .nodes import check_nodes
from .shm import check_shm
from .stale_containers import check_stale_containers
from .straggler import check_straggler


@dataclass
class DoctorResult:
    """All checks of one run; ``exit_code`` is the worst status (see :mod:`builder.nodes.doctor`)."""

    nodes: list[Node]
    checks: list[Check]
    exit_code: ExitCode

    def check(self, name: str) -> Check:
        """The check called ``name`` (KeyError if it did not run)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict:
        """Machine-readable result, schema ``envbuild.doctor/1``."""
        return {"schema": "envbuild.doctor/1", "exit_code": int(self.exit_code),
                "nodes": [node_summary(n).to_dict() for n in self.nodes],
                "checks": [c.to_json() for c in self.checks]}


def _backend(nodes: list[Node], opts: Options) -> str:
    if opts.backend:
        return opts.backend
    ok = [n.report for n in nodes if n.ok and n.report is not None]
    if ok and all(r.gpus and r.torch and r.torch.cuda_available for r in ok):
        return "nccl"
    return "gloo"


def _nothing_checked(nodes: list[Node], checks: list[Check]) -> str:
    """Why no check looked at anything, in one line."""
    bad = [n for n in nodes if not n.ok]
    if nodes and len(bad) == len(nodes):
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return f"no node answered ({len(nodes)} given): {bad[0].error}{more}"
    reasons = [f"{c.name}: {c.message}" for c in checks if nodes or c.message != "no nodes given"]
    return "; ".join((["no nodes given"] if not nodes else []) + reasons)


def _run_checks(nodes: list[Node], opts: Options, want: set[str], backend: str) -> list[Check]:
    checks: list[Check] = []
    if "nodes" in want or any(not n.ok for n in nodes):
        checks.append(check_nodes(nodes))
    if want & {"port", "interface"}:
        checks.extend(network_checks(nodes, opts, backend))
    if "shm" in want:
        checks.append(check_shm(nodes, opts.min_shm_bytes))
    if "gpu-uuid" in want:
        checks.append(check_gpu_uuid(nodes))
    if "gpu-processes" in want:
        checks.append(check_gpu_processes(nodes))
    if "stale-containers" in want:
        checks.append(check_stale_containers(nodes, opts))
    if "straggler" in want:
        checks.append(check_straggler(nodes, opts, backend))
    return checks


def doctor(nodes: list[Node], opts: Options | None = None) -> DoctorResult:
    """Run the chosen checks on gathered ``nodes`` (see :mod:`builder.nodes.sources`).

    A node that could not be checked is never left out silently: the ``nodes`` check
    runs whenever one did not answer, chosen or not (exit 3).

    Returns:
        A :class:`DoctorResult` with one :class:`~.base.Check` per chosen check, in
        :data:`~.base.ALL_CHECKS` order.

    Raises:
        EnvbuildError: (exit 2) an unknown check name or ``--master`` not among the nodes.
        Unreachable: (exit 3) nothing was checked: no node answered, or every chosen check
            was skipped for lack of (live) nodes or of the data it needs; one line saying so.
    """
    opts = opts or Options()
    unknown = [c for c in opts.checks if c not in ALL_CHECKS]
    if unknown:
        raise EnvbuildError(f"unknown check; choose from {', '.join(ALL_CHECKS)}", field="--checks",
                            value=",".join(unknown))
    checks: list[Check] = []
    want = set(opts.checks)
    if not nodes:  # `envbuild doctor --fix` alone: only the checks of this machine
        checks += [Check(name, SKIP, "no nodes given", checked=False) for name in ALL_CHECKS
                   if name in want and name != "stale-containers"]
        want &= {"stale-containers"}
    checks += _run_checks(nodes, opts, want, _backend(nodes, opts))
    order = {name: i for i, name in enumerate(ALL_CHECKS)}
    checks.sort(key=lambda c: order[c.name])
    if not any(c.checked for c in checks):
        raise Unreachable("doctor checked nothing: " + _nothing_checked(nodes, checks))
    code = max((STATUS_CODE[c.status] for c in checks), default=ExitCode.OK)
    return DoctorResult(nodes, checks, code)
