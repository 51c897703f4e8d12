"""The ``gpu-health`` check (DCGM's health watches, NVIDIA's XID catalogue): the node's agent
(``probe.health``) reads; :mod:`.gpu_health_rules` judges."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from builder.agent import payload
from builder.core.errors import EnvbuildError, Unreachable

from ..report import Node
from ..sources.base import Completed, ProcessRunning, exit_status, last_line, payload_archive
from .agent_output import GpuHealth, last_json
from .base import FAIL, PASS, SKIP, UNKNOWN, WARN, Check, HealthOptions, Options, live
from .gpu_health_rules import Finding, Limits, job_findings, judge, limits

HEALTH_MODULE = "probe.health"
#: Seconds the agent may take beyond NVML's own limit (kernel log, sysfs, starting Python).
_SLACK_S = 30.0


def health_options(expected_gpus: int | None, thresholds_file: str | None) -> HealthOptions:
    """The command line's options, the threshold file read now: before anything is contacted, and never a
    reason to drain. Raises EnvbuildError: (exit 2) a bad key or value; (exit 3) an unreadable file."""
    limits(thresholds_file)
    return HealthOptions(expected_gpus=expected_gpus, thresholds_file=thresholds_file)


def agent_args(o: HealthOptions) -> list[str]:
    return (["--timeout-s", f"{o.nvml_timeout_s:g}"] + (["--kernel-log", o.kernel_log] if o.kernel_log else [])
            + (["--ib-root", o.ib_root] if o.ib_root else []))


def parse(done: Completed, where: str) -> GpuHealth:
    """The agent's document. Raises Unreachable, InvalidReport: (exit 3) none printed, or one breaking its model."""
    doc = last_json(done.stdout, GpuHealth, where)
    if doc is None:
        raise Unreachable(f"gpu health agent {exit_status(done.rc)}: {last_line(done.stderr or done.stdout)}",
                          file=where)
    return doc


def health_check(docs: dict[str, GpuHealth | EnvbuildError], lim: Limits, expected: int | None) -> Check:
    """One check over the nodes' readings: the worst finding's status; its next step is the fix."""
    findings: list[tuple[str, Finding]] = []
    unknown, gpus, notes = [], 0, []
    for node, doc in docs.items():
        if isinstance(doc, EnvbuildError):
            unknown.append(f"{node}: {doc}")
            continue
        gpus += len(doc.gpus)
        findings += [(node, f) for f in judge(doc, lim, expected)]
        if doc.kernel_log_error and doc.gpus:
            notes.append(f"{node}: XIDs of the kernel log not read: {doc.kernel_log_error}")
    worst = _worst("gpu-health", findings, unknown + notes)
    if worst:
        return worst
    if unknown:
        return Check("gpu-health", UNKNOWN, "; ".join(unknown[:3]), details=unknown + notes, checked=False)
    if not gpus and not any(not isinstance(d, EnvbuildError) and d.ib_ports for d in docs.values()):
        return Check("gpu-health", SKIP, "no GPUs and no InfiniBand/RoCE ports reported", details=notes)
    return Check("gpu-health", PASS, f"{gpus} GPUs healthy on {len(docs)} node(s)", details=notes,
                 data={"findings": []})


def _worst(name: str, findings: list[tuple[str, Finding]], more: list[str]) -> Check | None:
    """The check of the worst finding (its class and next step), or None when there is none."""
    lines = [f.line(node) for node, f in findings]
    worst = next((s for s in (FAIL, WARN) if any(f.status == s for _, f in findings)), None)
    if worst is None:
        return None
    first = next(f for _, f in findings if f.status == worst)
    return Check(name, worst, "; ".join(lines[:3]) + (f" (+{len(lines) - 3} more)" if len(lines) > 3 else ""),
                 None, lines + more, {"findings": [{"node": node, **f.to_json()} for node, f in findings]},
                 cls=first.cls, next_step=first.next_step)


def check_gpu_health(nodes: list[Node], opts: Options) -> Check:
    """``doctor``: the agent on every live node (report files cannot answer)."""
    o = opts.health
    lim = limits(o.thresholds_file)
    targets = live(nodes)
    if not targets:
        return Check("gpu-health", SKIP, "no live node to read GPU health on (report files)", checked=False)

    def one(n: Node) -> GpuHealth | EnvbuildError:
        assert n.target is not None
        try:
            return parse(n.target.run(HEALTH_MODULE, agent_args(o), o.nvml_timeout_s + _SLACK_S), n.source)
        except EnvbuildError as e:
            return e

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        docs = dict(zip([n.name for n in targets], pool.map(one, targets), strict=True))
    return health_check(docs, lim, o.expected_gpus)


def check_host_health(node: str, python: str, o: HealthOptions, certified_gpus: int | None = None
                      ) -> tuple[Check, GpuHealth | None]:
    """``gate``: this host's GPUs (expected: ``o.expected_gpus``, else the certificate's), readings (None: unread)."""
    lim = limits(o.thresholds_file)
    try:
        run = ProcessRunning(payload.command(python, HEALTH_MODULE, agent_args(o)), payload_archive(), "gpu health")
        doc: GpuHealth | EnvbuildError = parse(run.wait(o.nvml_timeout_s + _SLACK_S), "gpu health")
    except EnvbuildError as e:
        doc = e
    expected = o.expected_gpus if o.expected_gpus is not None else certified_gpus or None
    return health_check({node: doc}, lim, expected), None if isinstance(doc, EnvbuildError) else doc


def check_job_end(node: str, before: tuple[str, GpuHealth] | None, now: GpuHealth, o: HealthOptions) -> Check:
    """``gate --epilog``: what the job left, against ``before`` (the Prolog record's path and readings)."""
    if before is None:
        return Check("epilog", WARN, f"no Prolog record of {node} in the gate history: the job's XIDs, ECC "
                     "errors and GPU memory not compared", "run the gate in the Prolog too (docs/slurm-gate.md)")
    found = job_findings(before[1], now, limits(o.thresholds_file))
    return _worst("epilog", [(node, f) for f in found], [f"compared with {before[0]}"]) or Check(
        "epilog", PASS, f"no new XID, double-bit ECC error or GPU memory held on {len(now.gpus)} GPUs since "
                        f"the Prolog record {before[0]}", data={"findings": []})
