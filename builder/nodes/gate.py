"""``envbuild gate``: is this node still what was certified? Run at job start (a Slurm
Prolog, a Kubernetes DaemonSet), on the node itself."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from builder.agent import payload
from builder.core import inputs, process, retention
from builder.core.clock import utc_stamp
from builder.core.documents import NodeReport
from builder.core.errors import EnvbuildError, ExitCode, FailureClass, Unreachable, UsageError, with_step
from builder.core.files import write_atomic
from builder.core.inputs import one_line
from builder.core.model import Model, convert

from . import report as nodereport
from .doctor import base as doctor_base
from .doctor.agent_output import GpuHealth
from .doctor.gpu_health import check_host_health, check_job_end
from .doctor.gpu_processes import check_gpu_processes
from .doctor.gpu_uuid import check_gpu_uuid
from .doctor.interface import interface_check, report_interface_problems
from .doctor.shm import check_shm
from .doctor.stale_containers import check_stale_containers
from .reference import Reference, load_reference
from .report import Node
from .sources.base import PROBE_MODULE, ProcessRunning, payload_archive, report_from_output
from .verify import DEFAULT_MAX_AGE_S, VerifyResult, verify
from .verify.result import FAIL, UNKNOWN, WARN

#: The fast local checks, in order (doctor's names).
GATE_CHECKS = ("shm", "gpu-uuid", "gpu-processes", "interface", "stale-containers", "gpu-health")
#: Seconds the host probe may take.
PROBE_TIMEOUT_S = 120.0
#: Seconds scontrol may take.
SCONTROL_TIMEOUT_S = 30.0
#: Characters of the drain reason after ``envbuild gate: ``.
REASON_CHARS = 200
#: Characters of a value in the drain reason's head.
KEY_VALUE_CHARS = 16
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_JOB_RE = re.compile(r"[0-9]{1,12}")
_PINNED_RE = re.compile(r"(?:.+@)?sha256:[0-9a-f]{64}")
_STATUS_LEVEL = {doctor_base.FAIL: FAIL, doctor_base.WARN: WARN, doctor_base.UNKNOWN: UNKNOWN}
_LEVEL_CODE = {FAIL: ExitCode.CHECK_FAILED, WARN: ExitCode.WARNINGS, UNKNOWN: ExitCode.UNREACHABLE}


@dataclass
class GateOptions:
    """One gate run (the command line of ``envbuild gate``)."""

    against: str
    image: str | None = None
    drain: bool = False
    epilog: bool = False
    resume: bool = False
    node: str | None = None
    history: str | None = None
    keep_history: bool = True
    max_age_s: float = DEFAULT_MAX_AGE_S
    checks: tuple[str, ...] = GATE_CHECKS
    min_shm_bytes: int = doctor_base.DEFAULT_MIN_SHM
    stale_after_s: float = doctor_base.DEFAULT_STALE_AFTER_S
    stale_labels: tuple[str, ...] = ()
    health: doctor_base.HealthOptions = field(default_factory=doctor_base.HealthOptions)
    python: str = field(default_factory=lambda: sys.executable or "python3")
    client: Any = None


class GateCheck(Model, frozen=True):
    """One local check: doctor's name, status, one-line finding, and class and next step when it is not passing."""

    name: str
    status: str
    message: str
    cls: FailureClass | None = None
    next_step: str | None = None


class GateResult(Model, frozen=True):
    """What ``envbuild gate --json`` prints (schema ``envbuild.gate/1``)."""

    schema: str
    node: str
    exit_code: int
    lines: list[str]
    verify: VerifyResult
    checks: list[GateCheck]
    history: str | None
    drained: str | None
    resumed: str | None = None


def check_node_name(text: str) -> str:
    """``text`` if it is a Slurm node name (letters, digits, ``_ . -``); else exit 64."""
    if not isinstance(text, str) or _NODE_RE.fullmatch(text) is None:
        raise UsageError("is not a Slurm node name (letters, digits, _ . -)", field="--node", value=text)
    return text


def history_dir(environ: dict[str, str] | None = None, uid: int | None = None) -> Path:
    """The default history folder: ``/var/lib/envbuild/gate`` as root, else under ``$XDG_STATE_HOME``."""
    env = os.environ if environ is None else environ
    if (os.geteuid() if uid is None else uid) == 0:
        return Path("/var/lib/envbuild/gate")
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(base) / "envbuild" / "gate"


def probe_host(python: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[NodeReport, dict]:
    """This host's report (the payload's probe with ``--host``) and its JSON document.

    Raises Unreachable, InvalidReport: (exit 3) the probe failed or printed no valid report."""
    run = ProcessRunning(payload.command(python, PROBE_MODULE, ["--host"]), payload_archive(), "host probe")
    out = run.wait(timeout_s)
    report = report_from_output(out, "host probe")
    return report, json.loads(out.stdout)


def probe_image(image: str, host: NodeReport, client: Any) -> tuple[NodeReport, dict]:
    """The report of ``image`` probed on this node, and its document. Probed without GPUs, so it is
    kept per image ID; the driver, GPUs and network are the host's, as a job sees them."""
    from builder.image.probecheck import probe_cached

    doc, _ = probe_cached(client, image, timeout_s=PROBE_TIMEOUT_S)
    img = client.image(image)
    digests = img.digests
    doc = {**doc, "scope": "image", "image": {"ref": image, "digest": digests[0] if digests else None, "id": img.id},
           "driver": msgspec.to_builtins(host.driver),
           "gpus": [msgspec.to_builtins(g) for g in host.gpus], "network": msgspec.to_builtins(host.network)}
    doc["errors"] = [e for e in doc.get("errors") or [] if not str(e).startswith("network:")]
    return nodereport.validate(doc, f"probe of {image}"), doc


def _engine(opts: GateOptions) -> Any:
    """A Docker client, or None when no engine answers within 5 s."""
    if opts.client is not None:
        return opts.client
    from builder.image import engine

    try:
        return engine.connect(timeout_s=5)
    except EnvbuildError:
        return None


def local_checks(host: Node, opts: GateOptions, client: Any) -> list[doctor_base.Check]:
    """doctor's fast local checks chosen in ``opts.checks`` on the host node."""
    nodes = [host]
    out: list[doctor_base.Check] = []
    if "shm" in opts.checks:
        out.append(check_shm(nodes, opts.min_shm_bytes))
    if "gpu-uuid" in opts.checks:
        out.append(check_gpu_uuid(nodes))
    if "gpu-processes" in opts.checks:
        out.append(check_gpu_processes(nodes))
    if "interface" in opts.checks:
        problems, _ = report_interface_problems(nodes, "nccl" if host.report and host.report.gpus else "gloo")
        out.append(interface_check(problems, [], True))
    if "stale-containers" in opts.checks:
        if client is None:
            out.append(doctor_base.Check("stale-containers", doctor_base.WARN, "not checked: no Docker engine here"))
        else:
            out.append(check_stale_containers(nodes, doctor_base.Options(
                client=client, stale_after_s=opts.stale_after_s, labels=opts.stale_labels)))
    return out


def gate_lines(result: VerifyResult, checks: list[doctor_base.Check]) -> list[str]:
    """One line per failure and warning: the findings (failures first), then the checks."""
    lines = [with_step(f"{f.level}: {f.rule}: {one_line(f.message, 600)}", f.cls, f.next_step) for f in result.findings]
    return lines + [with_step(f"{c.status}: {c.name}: {one_line(c.message, 600)}", c.cls, c.next_step) for c in checks
                    if c.status in _STATUS_LEVEL]


def _head(name: str, value: object) -> str:
    """``"image.id sha256:4f1e2a..."``: a check's name and value, cut for the drain reason."""
    text = one_line(value, 200) if value is not None else ""
    text = text if len(text) <= KEY_VALUE_CHARS else text[:KEY_VALUE_CHARS - 2] + ".."
    return f"{name} {text}".strip()


def first_failure(result: VerifyResult, checks: list[doctor_base.Check], lines: list[str]) -> tuple[str, str]:
    """``(head, line)`` of the first failure, else of the first node not checked."""
    for level in (FAIL, UNKNOWN):
        for f in result.findings:
            if f.level == level:
                value = next((g.value for g in f.groups if g.value != f.reference), None) if f.reference else None
                return _head(f.field or f.rule, value), f"{f.level}: {f.rule}: {f.message}"
        for c in checks:
            if _STATUS_LEVEL.get(c.status) == level:
                return _head(c.name, None), f"{level}: {c.name}: {c.message}"
    return "gate", lines[0] if lines else "could not check"


def image_check(image: str) -> doctor_base.Check:
    """``warn`` for an image named by a plain tag (a tag moves: the job may run another
    image than the one gated), ``pass`` for ``REF@sha256:...`` or an image ID."""
    if _PINNED_RE.fullmatch(image):
        return doctor_base.Check("image-ref", doctor_base.PASS, f"{one_line(image, 300)} is pinned by digest")
    return doctor_base.Check("image-ref", doctor_base.WARN,
                             f"--image {one_line(image, 300)} is a plain tag, which moves: pin it as "
                             "REF@sha256:DIGEST (or the image ID) in the job and the gate")


def _node_dir(folder: Path, hostname: str) -> Path:
    return folder / re.sub(r"[^A-Za-z0-9._-]", "_", hostname)[:128]


def _job() -> str:
    """Slurm's job ID in a Prolog or Epilog (``$SLURM_JOB_ID``), when it is one."""
    return job if _JOB_RE.fullmatch(job := os.environ.get("SLURM_JOB_ID", "")) else ""


def write_history(folder: Path, hostname: str, doc: dict, health: GpuHealth | None = None) -> Path:
    """Append ``doc`` (a node report) to ``folder/<hostname>/`` and ``health`` (what an Epilog compares with)
    to its ``health/``, named by time and job, both kept to their retention. Raises OSError, EnvbuildError."""
    node_dir = _node_dir(folder, hostname)
    stamp = re.sub(r"[^0-9TZ]", "", str(doc.get("probed_at") or "")) or re.sub(r"[^0-9TZ]", "", utc_stamp())
    name = f"{stamp}-{os.getpid()}" + (f"-job{_job()}" if _job() else "")
    path = write_atomic(node_dir / f"{name}.json", (json.dumps(doc, indent=2) + "\n").encode())
    if health is not None:  # not *.json: verify reads a folder's *.json files as node reports
        write_atomic(node_dir / "health" / f"{name}.health", msgspec.json.encode(health) + b"\n")
    for sub, ext in ((node_dir, ".json"), (node_dir / "health", ".health")):
        retention.remove(p for p in retention.split(sub.glob(f"*{ext}"), "history")[1] if p.stem != name)
    return path


def _job_end(opts: GateOptions, node: str, now: GpuHealth) -> doctor_base.Check:
    """``--epilog``: ``now`` against the readings of this job's Prolog record (else of the newest)."""
    folder = _node_dir(Path(opts.history) if opts.history else history_dir(), node) / "health"
    files = sorted(folder.glob("*.health"))  # by UTC stamp
    pick = ([p for p in files if _job() and p.stem.endswith(f"-job{_job()}")] or files)[-1:]
    before = None
    try:
        for p in pick:
            doc = inputs.read_json(p, inputs.MAX_REPORT_BYTES, "gate history record", ExitCode.UNREACHABLE)
            before = str(p), convert(doc, GpuHealth, file=str(p))
    except EnvbuildError as e:
        return doctor_base.Check("epilog", doctor_base.WARN, f"the Prolog record cannot be read: {e}")
    return check_job_end(node, before, now, opts.health)


def slurm_node_name(opts: GateOptions) -> str:
    """The Slurm node name: ``--node``, ``$SLURMD_NODENAME``, else the short host name."""
    return opts.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def set_state(node: str, state: str, reason: str | None = None) -> None:
    """``scontrol update NodeName=node State=state [Reason=reason]``; a node taking jobs needs no RESUME.
    Raises Unreachable: (exit 3) scontrol cannot run, fails or takes over 30 s."""
    argv = ["scontrol", "update", f"NodeName={check_node_name(node)}", f"State={state}"]
    what, flag = ("drain", "--drain") if state == "DRAIN" else ("resume", "--resume")
    try:
        proc = process.run(argv + ([f"Reason={reason}"] if reason else []), SCONTROL_TIMEOUT_S)
    except Unreachable as e:
        raise Unreachable(f"cannot {what} {node}: {e.message}", field=flag) from None
    last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
    if proc.returncode != 0 and not (state == "RESUME" and "Invalid node state specified" in last):
        raise Unreachable(f"cannot {what} {node}: scontrol exited {proc.returncode}: {one_line(last, 200)}",
                          field=flag)


def drain(node: str, head: str, line: str) -> str:
    """Drain ``node``; returns the reason given (``head`` first). Raises Unreachable (exit 3)."""
    text = one_line(f"{head}: envbuild gate: {line}", REASON_CHARS)
    set_state(node, "DRAIN", text)
    return text


@contextlib.contextmanager
def drain_on_error(opts: GateOptions) -> Iterator[None]:
    """With ``opts.drain``, a node the gate stopped on with an error (not a usage error) is drained
    too, the error as the reason; the error is raised on, naming a drain that failed."""
    try:
        yield
    except EnvbuildError as e:
        if not opts.drain or e.exit_code == ExitCode.USAGE:
            raise
        head = _head(e.field or "error", e.value if isinstance(e.value, (str, int, float)) else e.file)
        try:
            drain(slurm_node_name(opts), head, f"{'fail' if e.exit_code == ExitCode.CHECK_FAILED else 'unknown'}: {e}")
        except Unreachable as d:
            raise EnvbuildError(f"{e}; {d}", exit_code=max(e.exit_code, ExitCode.UNREACHABLE)) from None
        raise


def _compared_node(opts: GateOptions, host: NodeReport, host_doc: dict, client: Any) -> tuple[Node, dict]:
    if not opts.image:
        return Node(name=host.hostname or "host", source="host", report=host), host_doc
    if client is None:
        raise Unreachable("no Docker engine answers: cannot probe the image", field="--image", value=opts.image)
    report, doc = probe_image(opts.image, host, client)
    return Node(name=host.hostname or "host", source=f"image {opts.image}", report=report), doc


def gate(opts: GateOptions, reference: Reference | None = None) -> GateResult:
    """Run the gate on this node.
    Raises EnvbuildError: (exit 3) the reference cannot be read, the host not probed; (exit 64) a bad node name.
    Failures of the node itself are in the result."""
    if opts.node is not None:
        check_node_name(opts.node)
    ref = reference or load_reference(opts.against)
    host, host_doc = probe_host(opts.python)
    client = _engine(opts) if opts.image or "stale-containers" in opts.checks else None
    node, doc = _compared_node(opts, host, host_doc, client)
    result = verify([node], reference=ref, max_age_s=opts.max_age_s)
    checks = local_checks(Node(name=node.name, source="host", report=host), opts, client)
    checks += [image_check(opts.image)] if opts.image else []
    health = None
    if "gpu-health" in opts.checks:
        health_check, health = check_host_health(node.name, opts.python, opts.health,
                                                 ref.run.gpus_per_node if ref.run else None)
        checks.append(health_check)
    checks += [_job_end(opts, node.name, health)] if opts.epilog and health else []  # no reading: gpu-health says
    lines = gate_lines(result, checks)
    code = max([int(result.exit_code)] + [int(_LEVEL_CODE[_STATUS_LEVEL[c.status]]) for c in checks
                                          if c.status in _STATUS_LEVEL])  # the worst of verify's and the checks'
    history = None
    if opts.keep_history and not opts.epilog:  # an Epilog compares with the Prolog's record, and adds none
        try:
            history = str(write_history(Path(opts.history) if opts.history else history_dir(), node.name, doc,
                                        health))
        except (OSError, EnvbuildError) as e:
            lines.append(f"warn: history: cannot write {one_line(e, 300)}")
            code = max(code, int(ExitCode.WARNINGS))
    drained = resumed = None
    try:
        if opts.drain and code >= ExitCode.CHECK_FAILED:
            drained = drain(slurm_node_name(opts), *first_failure(result, checks, lines))
        elif opts.resume:
            set_state(slurm_node_name(opts), "RESUME")
            resumed = slurm_node_name(opts)
    except Unreachable as e:
        lines.append(f"unknown: {'drain' if e.field == '--drain' else 'resume'}: {e}")
        code = int(ExitCode.UNREACHABLE)
    return GateResult(schema="envbuild.gate/1", node=node.name, exit_code=code, lines=lines, verify=result,
                      checks=[GateCheck(name=c.name, status=c.status, message=c.message, cls=c.cls,
                                        next_step=c.next_step) for c in checks],
                      history=history, drained=drained, resumed=resumed)
