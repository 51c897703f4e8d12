"""The doctor run: the chosen checks in :data:`~.base.ALL_CHECKS` order; the worst status is the exit code."""

from __future__ import annotations

from dataclasses import dataclass

from builder.core.errors import ExitCode, Unreachable

from ..report import Node
from ..verify.result import node_summary
from .base import ALL_CHECKS, SKIP, STATUS_CODE, Check, Options
from .gpu_health import check_gpu_health
from .gpu_processes import check_gpu_processes
from .gpu_uuid import check_gpu_uuid
from .network import network_checks
from .nodes import check_nodes
from .shm import check_shm
from .stale_containers import check_stale_containers
from .straggler import check_straggler


@dataclass
class DoctorResult:
    nodes: list[Node]
    checks: list[Check]
    exit_code: ExitCode

    def to_json(self) -> dict:
        """Machine-readable result, schema ``envbuild.doctor/1``."""
        return {"schema": "envbuild.doctor/1", "exit_code": int(self.exit_code),
                "nodes": [node_summary(n).to_dict() for n in self.nodes], "checks": [c.to_json() for c in self.checks]}


def _backend(nodes: list[Node], opts: Options) -> str:
    if opts.backend:
        return opts.backend
    ok = [n.report for n in nodes if n.ok and n.report is not None]
    if ok and all(r.gpus and r.torch and r.torch.cuda_available for r in ok):
        return "nccl"
    return "gloo"


def _nothing_checked(nodes: list[Node], checks: list[Check]) -> str:
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
    if "gpu-health" in want:
        checks.append(check_gpu_health(nodes, opts))
    if "stale-containers" in want:
        checks.append(check_stale_containers(nodes, opts))
    if "straggler" in want:
        checks.append(check_straggler(nodes, opts, backend))
    return checks


def doctor(nodes: list[Node], opts: Options | None = None) -> DoctorResult:
    """``opts.checks``: names of :data:`ALL_CHECKS` (the CLI refuses others); ``nodes`` runs whenever one
    did not answer. Raises EnvbuildError (exit 2): unknown ``--master``; Unreachable (exit 3): nothing checked."""
    opts = opts or Options()
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
