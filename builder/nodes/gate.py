"""``envbuild gate``: is this node still what was certified? Run at job start (a Slurm
Prolog, a Kubernetes DaemonSet), on the node itself.

Steps (:func:`gate`):

1. probe the host (the payload's probe with ``--host``, a subprocess of this interpreter)
   and, with ``image``, the image too (a throwaway container, GPUs passed when the host has
   some); the in-image report stands for the node then, its driver and GPUs taken from the
   host report when the container saw none;
2. compare it with the reference under verify's rules (:func:`builder.nodes.verify.verify`:
   a host report is compared in its host fields and against the image's CUDA requirement);
3. doctor's fast local checks on the host report (shm, gpu-uuid, gpu-processes, the
   interface from the report alone, stale envbuild containers on this engine when one
   answers);
4. one line per failure and warning; the exit code is the worst of both (0/1/2/3);
5. the report is appended to the history folder (:func:`history_dir`), one file per run,
   ``<folder>/<hostname>/<UTC stamp>-<pid>.json``, the newest :data:`HISTORY_KEEP` kept;
6. with ``drain``, a failure (exit 2) or a node that could not be checked (exit 3) drains it
   in Slurm: ``scontrol update NodeName=N State=DRAIN Reason="envbuild gate: <first line>"``
   (resume with ``scontrol update NodeName=N State=RESUME``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from builder.agent import payload
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.files import write_atomic
from builder.core.inputs import one_line
from builder.core.model import Model

from . import report as nodereport
from .doctor import base as doctor_base
from .doctor.gpu_processes import check_gpu_processes
from .doctor.gpu_uuid import check_gpu_uuid
from .doctor.interface import interface_check, report_interface_problems
from .doctor.shm import check_shm
from .doctor.stale_containers import check_stale_containers
from .reference import Reference, load_reference
from .report import Node, NodeReport
from .sources.base import PROBE_MODULE, ProcessRunning, payload_archive, report_from_output
from .verify import DEFAULT_MAX_AGE_S, VerifyResult, verify
from .verify.result import FAIL, UNKNOWN, WARN

#: The fast local checks, in order (doctor's names).
GATE_CHECKS = ("shm", "gpu-uuid", "gpu-processes", "interface", "stale-containers")
#: History files kept per node (the oldest are removed).
HISTORY_KEEP = 1000
#: Seconds the host probe may take.
PROBE_TIMEOUT_S = 120.0
#: Seconds scontrol may take.
SCONTROL_TIMEOUT_S = 30.0
#: Characters of the drain reason after ``envbuild gate: ``.
REASON_CHARS = 200
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_STATUS_LEVEL = {doctor_base.FAIL: FAIL, doctor_base.WARN: WARN, doctor_base.UNKNOWN: UNKNOWN}
_LEVEL_CODE = {FAIL: ExitCode.CHECK_FAILED, WARN: ExitCode.WARNINGS, UNKNOWN: ExitCode.UNREACHABLE}


@dataclass
class GateOptions:
    """One gate run (the command line of ``envbuild gate``).

    Attributes:
        against: the certificate (or node report, or image) to compare with.
        image: the image jobs run (probed too), or None. drain: drain the Slurm node on a
        failure. node: the Slurm node name (default ``$SLURMD_NODENAME``, else the short
        host name). history: the history folder (None: :func:`history_dir`); keep_history
        False writes none. max_age_s: the certificate's validity. checks: the local checks.
        min_shm_bytes, stale_after_s, stale_labels: as doctor's. python: the interpreter
        that runs the host probe. client: a Docker client (default: connect when needed).
    """

    against: str
    image: str | None = None
    drain: bool = False
    node: str | None = None
    history: str | None = None
    keep_history: bool = True
    max_age_s: float = DEFAULT_MAX_AGE_S
    checks: tuple[str, ...] = GATE_CHECKS
    min_shm_bytes: int = doctor_base.DEFAULT_MIN_SHM
    stale_after_s: float = doctor_base.DEFAULT_STALE_AFTER_S
    stale_labels: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable or "python3")
    client: Any = None


class GateCheck(Model, frozen=True):
    """One local check: doctor's name, status and one-line finding."""

    name: str
    status: str
    message: str


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


def check_node_name(text: str) -> str:
    """``text`` if it is a Slurm node name (letters, digits, ``_ . -``); else exit 64."""
    if not isinstance(text, str) or _NODE_RE.fullmatch(text) is None:
        raise EnvbuildError("is not a Slurm node name (letters, digits, _ . -)", field="--node", value=text,
                            exit_code=ExitCode.USAGE)
    return text


def history_dir(environ: dict[str, str] | None = None, uid: int | None = None) -> Path:
    """The default history folder: ``/var/lib/envbuild/gate`` as root, else
    ``$XDG_STATE_HOME/envbuild/gate`` (``~/.local/state/envbuild/gate`` when unset)."""
    env = os.environ if environ is None else environ
    if (os.geteuid() if uid is None else uid) == 0:
        return Path("/var/lib/envbuild/gate")
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(base) / "envbuild" / "gate"


def probe_host(python: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[NodeReport, dict]:
    """This host's report (the payload's probe with ``--host``) and its JSON document.

    Raises:
        Unreachable, InvalidReport: (exit 3) the probe failed or printed no valid report.
    """
    run = ProcessRunning(payload.command(python, PROBE_MODULE, ["--host"]), payload_archive(), "host probe")
    out = run.wait(timeout_s)
    report = report_from_output(out, "host probe")
    return report, json.loads(out.stdout)


def probe_image(image: str, host: NodeReport, client: Any) -> tuple[NodeReport, dict]:
    """The report of ``image`` probed on this node (scope ``image``; GPUs passed when the host
    has some; the host's driver and GPUs when the container saw none; the host's network, as
    the probe's container has none) and its document."""
    from builder.image.probecheck import run_probe

    doc = run_probe(client, image, gpus=bool(host.gpus))
    img = client.images.get(image)
    digests = [d.rsplit("@", 1)[1] for d in img.attrs.get("RepoDigests") or [] if isinstance(d, str) and "@" in d]
    doc = {**doc, "scope": "image", "image": {"ref": image, "digest": digests[0] if digests else None, "id": img.id}}
    if not doc.get("driver") and host.driver:
        doc["driver"] = host.driver
        doc["gpus"] = [msgspec.to_builtins(g) for g in host.gpus]
    # the probe's container has no network; a job's container uses the node's (host networking)
    doc["network"] = msgspec.to_builtins(host.network)
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
            out.append(doctor_base.Check("stale-containers", doctor_base.SKIP, "no Docker engine here"))
        else:
            out.append(check_stale_containers(nodes, doctor_base.Options(
                client=client, stale_after_s=opts.stale_after_s, labels=opts.stale_labels)))
    return out


def gate_lines(result: VerifyResult, checks: list[doctor_base.Check]) -> list[str]:
    """One line per failure and warning: the findings (failures first), then the checks."""
    lines = [f"{f.level}: {f.rule}: {one_line(f.message, 600)}" for f in result.findings]
    lines += [f"{c.status}: {c.name}: {one_line(c.message, 600)}" for c in checks if c.status in _STATUS_LEVEL]
    return lines


def exit_code_of(result: VerifyResult, checks: list[doctor_base.Check]) -> int:
    """The worst of verify's exit code and the checks' statuses."""
    codes = [int(result.exit_code)] + [int(_LEVEL_CODE[_STATUS_LEVEL[c.status]]) for c in checks
                                       if c.status in _STATUS_LEVEL]
    return max(codes)


def write_history(folder: Path, hostname: str, doc: dict, keep: int = HISTORY_KEEP) -> Path:
    """Append ``doc`` (a node report) to ``folder/<hostname>/``; the newest ``keep`` files
    stay. Raises OSError (the caller reports it)."""
    node_dir = folder / re.sub(r"[^A-Za-z0-9._-]", "_", hostname)[:128]
    node_dir.mkdir(parents=True, exist_ok=True)
    stamp = re.sub(r"[^0-9TZ]", "", str(doc.get("probed_at") or "")) or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = write_atomic(node_dir / f"{stamp}-{os.getpid()}.json", (json.dumps(doc, indent=2) + "\n").encode())
    old = sorted(p for p in node_dir.glob("*.json") if p.is_file())
    for stale in old[:max(0, len(old) - keep)]:
        stale.unlink(missing_ok=True)
    return path


def slurm_node_name(opts: GateOptions) -> str:
    """The Slurm node name: ``--node``, ``$SLURMD_NODENAME``, else the short host name."""
    return opts.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def drain(node: str, reason: str) -> str:
    """Drain ``node`` with ``scontrol update``; returns the reason given.

    Raises:
        Unreachable: (exit 3) scontrol cannot run, fails or takes over 30 s.
    """
    text = "envbuild gate: " + one_line(reason, REASON_CHARS)
    argv = ["scontrol", "update", f"NodeName={check_node_name(node)}", "State=DRAIN", f"Reason={text}"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unreachable(f"cannot drain {node}: scontrol: {one_line(e, 200)}", field="--drain") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise Unreachable(f"cannot drain {node}: scontrol exited {proc.returncode}: {one_line(last, 200)}",
                          field="--drain")
    return text


@contextlib.contextmanager
def drain_on_error(opts: GateOptions) -> Iterator[None]:
    """With ``opts.drain``: a node that could not be checked at all (an error of exit 3
    escaping :func:`gate`: no certificate, a probe that failed) is drained too, with the
    error as the reason; the error is raised on."""
    try:
        yield
    except EnvbuildError as e:
        if opts.drain and e.exit_code == ExitCode.UNREACHABLE:
            drain(slurm_node_name(opts), f"could not check: {e}")
        raise


def _compared_node(opts: GateOptions, host: NodeReport, host_doc: dict, client: Any) -> tuple[Node, dict]:
    if not opts.image:
        return Node(name=host.hostname or "host", source="host", report=host), host_doc
    if client is None:
        raise Unreachable("no Docker engine answers: cannot probe the image", field="--image", value=opts.image)
    report, doc = probe_image(opts.image, host, client)
    return Node(name=host.hostname or "host", source=f"image {opts.image}", report=report), doc


def gate(opts: GateOptions, reference: Reference | None = None) -> GateResult:
    """Run the gate on this node (see the module docstring).

    Raises:
        EnvbuildError: (exit 3) the reference cannot be read, the host not probed; (exit
            64) a bad node name. Failures of the node itself are in the result.
    """
    if opts.node is not None:
        check_node_name(opts.node)
    ref = reference or load_reference(opts.against)
    host, host_doc = probe_host(opts.python)
    client = _engine(opts) if opts.image or "stale-containers" in opts.checks else None
    node, doc = _compared_node(opts, host, host_doc, client)
    result = verify([node], reference=ref, max_age_s=opts.max_age_s)
    checks = local_checks(Node(name=node.name, source="host", report=host), opts, client)
    lines = gate_lines(result, checks)
    code = exit_code_of(result, checks)
    history = None
    if opts.keep_history:
        try:
            history = str(write_history(Path(opts.history) if opts.history else history_dir(), node.name, doc))
        except OSError as e:
            lines.append(f"warn: history: cannot write {one_line(e, 300)}")
            code = max(code, int(ExitCode.WARNINGS))
    drained = None
    if opts.drain and code >= ExitCode.CHECK_FAILED:
        failing = [line for line in lines if line.startswith(("fail:", "unknown:"))] or lines or ["could not check"]
        drained = drain(slurm_node_name(opts), failing[0])
    return GateResult(schema="envbuild.gate/1", node=node.name, exit_code=code, lines=lines, verify=result,
                      checks=[GateCheck(name=c.name, status=c.status, message=c.message) for c in checks],
                      history=history, drained=drained)
