"""Preflight checks before a multi-node job: each check passes, warns or fails, with a fix.

Checks (``--checks`` picks some; all by default), with the public failure each one
catches (``shared/reference/multinode.md``):

=================  ========================================================================
check              what it does
=================  ========================================================================
nodes              every node answered with a valid report (else: unknown, exit 3)
port               the rendezvous port (29500) on the master is reachable from every node,
                   and a sample of each node's ephemeral range (``ip_local_port_range``:
                   NCCL and gloo connect ranks on random ports) from every other node; a
                   blocked port is named with the host pair (pytorch#79388, #52848,
                   NVIDIA/nccl#388). Real TCP listeners and connects, each bounded in time
interface         the interface NCCL (and gloo, with the gloo backend or
                   ``GLOO_SOCKET_IFNAME``) would pick exists, has an address, is not
                   loopback, and that address is reachable from the peers
                   (NVIDIA/nccl#286, #1581, #1105; pytorch#64926)
shm                ``/dev/shm`` at least ``--min-shm`` (NVIDIA/nccl#290: posix_fallocate
                   failed in containers with Docker's 64 MB default)
gpu-uuid           no GPU UUID on two ranks (NVIDIA/nccl#1241 "Duplicate GPU detected")
gpu-processes      no NVML compute process holding GPU memory (pytorch#5736, #12166)
stale-containers   no leftover containers labelled ``envbuild`` on this engine;
                   ``--fix`` removes them (and only them)
straggler          each node's compute alone (forward/backward, no communication) and an
                   all-reduce between every node pair (Google cluster-health-scanner's
                   pairwise test); a node slower than the median by more than
                   ``--straggler-ratio`` is named (NVIDIA/nccl#349, nccl-tests#106)
=================  ========================================================================

Statuses and exit codes follow Meta GCM's health checks, worst wins: pass and skip 0,
warn 1, fail 2, unknown 3. Checks that need live nodes (port, straggler, the reachability
part of interface) are skipped for report files.
"""

from __future__ import annotations

import datetime
import json
import re
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from builder.core import inputs
from . import verify
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from .gather import Running, agent_source
from builder.core.inputs import one_line
from .report import Int, ListOf, MapOf, Node, Num, Obj, OneOf, Opt, Pattern, Spec, Str, check_shape, get

PASS, WARN, FAIL, SKIP, UNKNOWN = "pass", "warn", "fail", "skip", "unknown"
_STATUS_CODE = {PASS: ExitCode.OK, SKIP: ExitCode.OK, WARN: ExitCode.WARNINGS,
                FAIL: ExitCode.CHECK_FAILED, UNKNOWN: ExitCode.UNREACHABLE}

ALL_CHECKS = ("nodes", "port", "interface", "shm", "gpu-uuid", "gpu-processes",
              "stale-containers", "straggler")

#: torchrun's static rendezvous port (``--master-port`` default).
DEFAULT_PORT = 29500
#: The smallest /dev/shm accepted: Docker's 64 MB default breaks NCCL (NVIDIA/nccl#290).
DEFAULT_MIN_SHM = 256 * 1024 * 1024
#: A node this many times slower than the median is a straggler.
DEFAULT_STRAGGLER_RATIO = 1.5
#: Seconds after which a running envbuild container counts as stale.
DEFAULT_STALE_AFTER_S = 3600.0
#: Seconds a stopped run must have been stopped before it counts as stale (its launcher
#: may still be reading its logs).
STOPPED_GRACE_S = 60.0
#: Seconds the in-node agent may take to start and bind its ports.
AGENT_START_S = 60.0


def human_bytes(n: int | None) -> str:
    """``1048576`` -> ``"1.0 MiB"``; None -> ``"unknown"``."""
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


_SIZE = re.compile(r"([0-9]{1,15})(\.[0-9]{1,6})?([kmgt]?)(i?b)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Docker-style sizes: ``"256m"`` -> 268435456, ``"1g"``, ``"512k"``, ``"1048576"``,
    ``"1.5GiB"``; the whole value must match (no blank, sign or trailing newline).

    Raises:
        EnvbuildError: (exit 2) not a size.
    """
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise EnvbuildError("is not a size like 256m or 1g", field="--min-shm", value=text)
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(3).lower()]
    whole, frac = int(m.group(1)), m.group(2)
    return whole * mult + (int(float(frac) * mult) if frac else 0)


@dataclass
class Check:
    """One check's outcome.

    Attributes:
        name: one of :data:`ALL_CHECKS`.
        status: ``pass``, ``warn``, ``fail``, ``skip`` or ``unknown``.
        message: one line, e.g. ``"node-1 -> node-0 port 29500/tcp: timeout"``.
        fix: a one-line hint, or None.
        details: further lines (one per node, pair or container).
        data: machine-readable specifics (timings, ports, removed containers).
        checked: False when the check could not look at anything: no node (or no live
            node) answered, or no report carried its data. A run in which no check
            checked anything exits 3 (:func:`doctor`).
    """

    name: str
    status: str
    message: str
    fix: str | None = None
    details: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    checked: bool = True

    def to_json(self) -> dict:
        """JSON-ready form."""
        return {"name": self.name, "status": self.status, "message": self.message,
                "fix": self.fix, "details": list(self.details), "data": self.data}


@dataclass
class Options:
    """Settings of one doctor run (the CLI flags of the same names).

    Attributes:
        checks: which checks to run (default all).
        port: the rendezvous port checked on the master.
        master: the master node's name (default: the first node).
        connect_timeout_s: limit of each TCP connect in the port and interface checks.
        ephemeral_samples: ports sampled from each node's ephemeral range.
        min_shm_bytes: smallest acceptable /dev/shm.
        straggler_ratio: a node slower than ratio x the median is a straggler.
        straggler_iters, straggler_repeats: forward/backward steps per timing (enough
            work to span several 100 ms CFS periods of a CPU-limited container), timings.
        allreduce_bytes, allreduce_iters: bytes per all-reduce and timed all-reduces in
            the pairwise test.
        pair_port_base: first port of the pairwise rendezvous (default ``port + 100``).
        backend: ``gloo`` or ``nccl`` (default: nccl when every node has GPUs).
        agent_timeout_s: limit for the straggler run on each node.
        fix: remove stale envbuild containers.
        stale_after_s: age after which a running envbuild container is stale.
        labels: ``key=value`` filters that limit which containers the stale check sees.
        client: a docker client (default: connect when the stale check runs).
    """

    checks: tuple[str, ...] = ALL_CHECKS
    port: int = DEFAULT_PORT
    master: str | None = None
    connect_timeout_s: float = 3.0
    ephemeral_samples: int = 2
    min_shm_bytes: int = DEFAULT_MIN_SHM
    straggler_ratio: float = DEFAULT_STRAGGLER_RATIO
    straggler_iters: int = 100
    straggler_repeats: int = 5
    allreduce_bytes: int = 4 << 20
    allreduce_iters: int = 20
    pair_port_base: int | None = None
    backend: str | None = None
    agent_timeout_s: float = 180.0
    fix: bool = False
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    labels: tuple[str, ...] = ()
    client: object = None


@dataclass
class DoctorResult:
    """All checks of one run; ``exit_code`` is the worst status (see the module docstring)."""

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
                "nodes": [verify.node_summary(n) for n in self.nodes],
                "checks": [c.to_json() for c in self.checks]}


def _live(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.ok and n.target is not None and n.address]


def _json_line(line: str | None, spec: Spec | None = None, where: str = "agent") -> dict | None:
    """``line`` as a JSON object (bounded: :func:`builder.core.inputs.load_json`), or None
    when it is not one; checked against ``spec`` when given.

    Raises:
        InvalidReport: (exit 3) a JSON object that does not follow ``spec``.
    """
    if not line or not line.lstrip().startswith("{"):
        return None
    try:
        doc = inputs.load_json(line, where, exit_code=ExitCode.UNREACHABLE)
    except EnvbuildError:
        return None
    if not isinstance(doc, dict):
        return None
    return check_shape(doc, spec, f"{where}: agent output") if spec is not None else doc


def _stderr_tail(r: Running) -> str:
    """Why an agent printed nothing: its last stderr line (it is stopped first)."""
    r.kill()
    try:
        done = r.wait(5)
    except EnvbuildError:
        return "agent did not start"
    lines = [l for l in done.stderr.strip().splitlines() if l.strip()]
    return f"agent exited with status {done.rc}: {lines[-1] if lines else 'no output'}"


def _last_json(text: str, spec: Spec | None = None, where: str = "agent") -> dict | None:
    """The last line of ``text`` that is a JSON object, checked against ``spec`` (see
    :func:`_json_line`); None when there is none."""
    for line in reversed(text.strip().splitlines()):
        doc = _json_line(line, spec, where)
        if doc is not None:
            return doc
    return None


# What the agent prints (builder/agent/doctor_agent.py), checked before it is used: the agent
# runs on the node, so its output is as untrusted as a node report.
_SECONDS = Opt(Num(0, 1e9))
_TIMING = Opt(Num(1e-9, 1e9))  # a ratio to the median divides by it: never 0
_PORT_KEY = Pattern(r"[0-9]{1,5}", "a port number")
AGENT_LISTEN = Obj({"ports": MapOf(Str(512), 1024, key=_PORT_KEY),
                    "sample": ListOf(Int(0, 65535, "a port (0..65535)"), 1024)})
AGENT_CONNECT = Obj({"results": MapOf(
    Obj({"status": OneOf("ok", "open", "refused", "timeout", "unreachable", "error"),
         "detail": Str(4096), "seconds": _SECONDS}), 1 << 20,
    key=Pattern(r"[^\x00-\x1f\x7f]{1,2048}", "a probe id"))})
AGENT_COMPUTE = Obj({"compute": Obj({"backend": Str(64), "iters": Int(0, 2**31 - 1),
                                     "seconds": ListOf(Num(0, 1e9), 10000), "best_s": _TIMING})})
AGENT_PAIRS = Obj({"pairs": ListOf(Obj({"peer": Int(0, 65535), "round": Int(0, 65535), "seconds": _TIMING,
                                        "error": Opt(Str(4096))}), 65536),
                   "error?": Str(4096)})


# --------------------------------------------------------------------------- report checks


def check_nodes(nodes: list[Node]) -> Check:
    """``unknown`` naming every node that could not be checked (the first in the
    message), else ``pass``. ``checked`` is False when no node answered."""
    bad = [n for n in nodes if not n.ok]
    if bad:
        return Check("nodes", UNKNOWN, f"{len(bad)} of {len(nodes)} nodes could not be checked: {bad[0].error}",
                     "make the nodes reachable (ssh keys, running containers) and their reports valid",
                     [str(n.error) for n in bad], checked=len(bad) < len(nodes))
    return Check("nodes", PASS, f"{len(nodes)} nodes answered with valid reports")


def _no_answer(name: str, nodes: list[Node]) -> Check | None:
    """``unknown`` (nothing checked) when no node has a valid report, else None."""
    if any(n.ok for n in nodes):
        return None
    return Check(name, UNKNOWN, f"no node answered ({len(nodes)} given): nothing checked", checked=False)


def check_shm(nodes: list[Node], min_bytes: int) -> Check:
    """``fail`` for every node whose /dev/shm is smaller than ``min_bytes``."""
    none = _no_answer("shm", nodes)
    if none:
        return none
    small, unknown = [], []
    for n in (n for n in nodes if n.ok):
        size = get(n.report, "shm.size_bytes")
        if size is None:
            unknown.append(n.name)
        elif size < min_bytes:
            small.append(f"{n.name}: /dev/shm is {human_bytes(size)}, below {human_bytes(min_bytes)}")
    fix = ("give each container --shm-size=1g (recipe certify.shm_size) or --ipc=host; NCCL keeps its "
           "intra-node buffers in /dev/shm (NVIDIA/nccl#290: posix_fallocate failed)")
    if small:
        return Check("shm", FAIL, "; ".join(small), fix, small)
    if unknown:
        return Check("shm", SKIP, f"/dev/shm size not reported by {', '.join(unknown)}",
                     checked=len(unknown) < sum(1 for n in nodes if n.ok))
    return Check("shm", PASS, f"/dev/shm >= {human_bytes(min_bytes)} on every node")


def check_gpu_uuid(nodes: list[Node]) -> Check:
    """``fail`` when one GPU UUID is seen by two ranks (two nodes, or twice on one node)."""
    none = _no_answer("gpu-uuid", nodes)
    if none:
        return none
    seen: dict[str, list[str]] = {}
    for n in (n for n in nodes if n.ok):
        for g in n.report.get("gpus") or []:
            seen.setdefault(g["uuid"], []).append(f"{n.name} (GPU {g['index']})")
    if not seen:
        return Check("gpu-uuid", SKIP, "no GPUs reported")
    dups = [f"{uuid} on {', '.join(where)}" for uuid, where in seen.items() if len(where) > 1]
    if dups:
        return Check("gpu-uuid", FAIL, "duplicate GPU: " + "; ".join(dups),
                     "give every rank its own GPU (CUDA_VISIBLE_DEVICES, docker --gpus device=N); NCCL "
                     "refuses two ranks on one GPU ('Duplicate GPU detected', NVIDIA/nccl#1241)", dups)
    return Check("gpu-uuid", PASS, f"{len(seen)} GPUs, each UUID on one rank")


def check_gpu_processes(nodes: list[Node]) -> Check:
    """``fail`` naming every NVML compute process (node, GPU, PID, memory)."""
    none = _no_answer("gpu-processes", nodes)
    if none:
        return none
    lines, gpus = [], 0
    for n in (n for n in nodes if n.ok):
        gpus += len(n.report.get("gpus") or [])
        for p in n.report.get("gpu_processes") or []:
            name = f" ({p['name']})" if p.get("name") else ""
            lines.append(f"{n.name} GPU {p['gpu_index']} ({p['gpu_uuid']}): pid {p['pid']}{name} holds "
                         f"{human_bytes(p.get('used_memory_bytes'))}")
    if lines:
        return Check("gpu-processes", FAIL, "; ".join(lines),
                     "stop these processes (a crashed earlier run?); `envbuild doctor --fix` removes stale "
                     "envbuild containers and never kills other processes", lines)
    if not gpus:
        return Check("gpu-processes", SKIP, "no GPUs reported")
    return Check("gpu-processes", PASS, f"no compute processes on {gpus} GPUs")


# --------------------------------------------------------------------------- stale containers


def _parse_time(text: str | None) -> datetime.datetime | None:
    if not text or text.startswith("0001-"):
        return None
    text = text.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None


def stale_containers(client, labels: tuple[str, ...] = (), stale_after_s: float = DEFAULT_STALE_AFTER_S,
                     exclude: tuple[str, ...] = (), now: datetime.datetime | None = None) -> list:
    """Containers labelled ``envbuild`` (plus ``labels``) left over from earlier runs.

    Containers are grouped by their ``envbuild.run`` label (one group per container
    without it). A group is stale when its newest container started more than
    ``stale_after_s`` seconds ago, or when none of its containers runs and the last one
    stopped more than ``min(stale_after_s, STOPPED_GRACE_S)`` seconds ago. Containers
    whose ID is in ``exclude`` (the nodes being checked) are never stale.

    Returns:
        docker ``Container`` objects, sorted by name.
    """
    from builder.image.engine import LABEL, RUN_LABEL

    now = now or datetime.datetime.now(datetime.timezone.utc)
    found = client.containers.list(all=True, filters={"label": [LABEL, *labels]})
    groups: dict[str, list] = {}
    for c in found:
        if c.id in exclude:
            continue
        groups.setdefault((c.labels or {}).get(RUN_LABEL) or c.id, []).append(c)
    stale = []
    grace = min(stale_after_s, STOPPED_GRACE_S)
    for members in groups.values():
        states = [c.attrs.get("State") or {} for c in members]
        running = any(s.get("Running") for s in states)
        started = [t for t in (_parse_time(s.get("StartedAt")) for s in states) if t]
        created = [t for t in (_parse_time(c.attrs.get("Created")) for c in members) if t]
        newest = max(started + created, default=None)
        finished = [t for t in (_parse_time(s.get("FinishedAt")) for s in states) if t]
        if newest is not None and (now - newest).total_seconds() > stale_after_s:
            stale.extend(members)
        elif not running:
            last = max(finished + created, default=None)
            if last is None or (now - last).total_seconds() > grace:
                stale.extend(members)
    return sorted(stale, key=lambda c: c.name)


def check_stale_containers(nodes: list[Node], opts: Options) -> Check:
    """``fail`` listing stale envbuild containers on this engine; with ``opts.fix``
    remove them (forced) and ``pass`` listing what was removed. ``skip`` without an engine."""
    import docker.errors

    from builder.image.engine import LABEL, connect

    client = opts.client
    if client is None:
        try:
            client = connect(timeout_s=30)
        except EnvbuildError as e:
            return Check("stale-containers", SKIP, f"no Docker engine here ({e.message.split(';')[0]})",
                         checked=False)
    exclude = tuple(n.target.container_id for n in nodes if getattr(n.target, "container_id", None))
    stale = stale_containers(client, tuple(opts.labels), opts.stale_after_s, exclude)
    scope = f"label {LABEL}" + "".join(f", {l}" for l in opts.labels)
    lines = [f"{c.name} ({c.short_id}, {c.status}, run {(c.labels or {}).get('envbuild.run', '-')})" for c in stale]
    if not stale:
        return Check("stale-containers", PASS, f"no stale containers ({scope})")
    if not opts.fix:
        return Check("stale-containers", FAIL, f"{len(stale)} stale envbuild containers: "
                     + ", ".join(c.name for c in stale),
                     "`envbuild doctor --fix` removes them (only containers labelled envbuild)", lines,
                     {"stale": [c.name for c in stale]})
    removed, failed = [], []
    for c in stale:
        labels = c.labels or {}
        if LABEL not in labels:  # belt and braces: never touch what envbuild did not start
            continue
        try:
            c.remove(force=True)
            removed.append(c.name)
        except docker.errors.NotFound:
            removed.append(c.name)
        except docker.errors.APIError as e:
            failed.append(f"{c.name}: {e.explanation or e}")
    if failed:
        return Check("stale-containers", FAIL, "could not remove: " + "; ".join(failed),
                     "remove them by hand: docker rm -f NAME", lines, {"removed": removed})
    return Check("stale-containers", PASS, f"removed {len(removed)} stale envbuild containers: "
                 + ", ".join(removed), None, lines, {"removed": removed})


# --------------------------------------------------------------------------- port and interface


def _interface_picks(n: Node, backend: str) -> list[tuple[str, dict]]:
    picks = [("NCCL", verify.nccl_interface(n.report))]
    if backend == "gloo" or get(n.report, "env.GLOO_SOCKET_IFNAME"):
        picks.append(("gloo", verify.gloo_interface(n.report)))
    return picks


def _other_addresses(n: Node, backend: str, skip_primary: bool) -> list[dict]:
    """The picks (see :func:`_interface_picks`) with an address that is not loopback,
    one per address; without the one the node is reached at when ``skip_primary`` (the
    ephemeral-port probes reach that one anyway)."""
    out: dict[str, dict] = {}
    for _, p in _interface_picks(n, backend):
        if p["address"] and not p["loopback"] and not (skip_primary and p["address"] == n.address):
            out.setdefault(p["address"], p)
    return list(out.values())


def _port_range(n: Node) -> tuple[int, int]:
    rng = get(n.report, "network.ip_local_port_range") or [32768, 60999]
    return int(rng[0]), int(rng[1])


def _start_all(nodes: list[Node], args_for) -> dict[str, Running | Exception]:
    script = agent_source()

    def start(n: Node):
        try:
            return n.target.start(script, args_for(n))
        except EnvbuildError as e:
            return e

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(start, nodes)))


def _report_interface_problems(ok_nodes: list[Node], backend: str) -> tuple[list[str], int]:
    """From the reports alone: the interface NCCL (and gloo) would pick is missing or
    loopback. Returns (problems, number of reports with a ``network`` section)."""
    problems: list[str] = []
    seen = 0
    for n in ok_nodes:
        if get(n.report, "network") is None:
            continue
        seen += 1
        have = ", ".join(i["name"] for i in verify._ordered_interfaces(n.report)) or "none"
        for label, pick in _interface_picks(n, backend):
            if pick["name"] is None:
                problems.append(f"{n.name}: {pick['reason']}: no such interface with an address (it has: {have})")
            elif pick["loopback"] and len(ok_nodes) > 1:
                problems.append(f"{n.name}: {label} would use loopback {pick['name']} ({pick['address']}; "
                                f"{pick['reason']}): other nodes cannot reach it")
    return problems, seen


def network_checks(nodes: list[Node], opts: Options, backend: str) -> list[Check]:
    """The ``port`` and ``interface`` checks (see the module docstring); one pass of real
    listeners (agent ``listen``) and connects (agent ``connect``) on the live nodes."""
    want_port, want_if = "port" in opts.checks, "interface" in opts.checks
    out: list[Check] = []
    live = _live(nodes)
    if_fail, if_seen = _report_interface_problems([n for n in nodes if n.ok], backend) if want_if else ([], 0)
    if want_if and not if_seen:
        out.append(_no_answer("interface", nodes)
                   or Check("interface", SKIP, "no report has a network section", checked=False))
        want_if = False
        if not want_port:
            return out
    if len(live) < 2:
        if want_port:
            why = "one live node: nothing to connect" if live else "needs live nodes (report files give reports only)"
            out.append(Check("port", SKIP, why, checked=False))
        if want_if:
            out.append(_interface_check(if_fail, [], reach_checked=False))
        return out
    # --- one round of listeners and connects ---
    master = next((n for n in live if n.name == opts.master), live[0])
    if opts.master and master.name != opts.master:
        raise EnvbuildError("is not a live node here", field="--master", value=opts.master)
    deadline = AGENT_START_S + opts.connect_timeout_s + 10

    samples = max(1, opts.ephemeral_samples)

    def expected(n: Node) -> int:
        """Connections n will accept if every peer gets through (see the plan below)."""
        per_peer = samples if want_port else 0
        if want_if:
            per_peer += len(_other_addresses(n, backend, want_port))
        rdzv = len(live) - 1 if (want_port and n is master) else 0
        return per_peer * (len(live) - 1) + rdzv

    def listen_args(n: Node) -> list[str]:
        lo, hi = _port_range(n)
        ports = str(opts.port) if (want_port and n is master) else ""
        return ["listen", "--ports", ports, "--sample", str(samples), "--range", f"{lo}-{hi}",
                "--deadline-s", str(deadline), "--expect-total", str(expected(n))]

    listeners = _start_all(live, listen_args)
    bound: dict[str, dict] = {}
    unknown: list[str] = []
    for n in live:
        r = listeners[n.name]
        try:
            doc = None if isinstance(r, Exception) else _json_line(r.readline(AGENT_START_S), AGENT_LISTEN, n.source)
            why = None
        except EnvbuildError as e:
            doc, why = None, str(e)
            r.kill()
        if doc is None:
            why = why or (str(r) if isinstance(r, Exception) else _stderr_tail(r))
            unknown.append(f"{n.name}: could not listen ({why})")
            continue
        bound[n.name] = doc
    # plan the connects: (id, from-node, host, port, kind, to-node, what)
    plan: dict[str, list[dict]] = {n.name: [] for n in live}
    meta: dict[str, dict] = {}
    if want_port and master.name in bound and bound[master.name]["ports"].get(str(opts.port)) == "listening":
        for n in live:
            if n is not master and n.name in bound:
                tid = f"rdzv:{n.name}"
                plan[n.name].append({"id": tid, "host": master.address, "port": opts.port})
                meta[tid] = {"kind": "rendezvous", "from": n.name, "to": master.name, "port": opts.port,
                             "host": master.address}
    for dst in live:
        if dst.name not in bound:
            continue
        sample = bound[dst.name].get("sample") or []
        picks = _other_addresses(dst, backend, want_port)
        for src in live:
            if src is dst or src.name not in bound:
                continue
            if want_port:
                for port in sample[:samples]:
                    tid = f"eph:{src.name}:{dst.name}:{port}"
                    plan[src.name].append({"id": tid, "host": dst.address, "port": port})
                    meta[tid] = {"kind": "ephemeral", "from": src.name, "to": dst.name, "port": port,
                                 "host": dst.address}
            if want_if and sample:
                for p in picks:
                    tid = f"if:{src.name}:{dst.name}:{p['address']}"
                    plan[src.name].append({"id": tid, "host": p["address"], "port": sample[0]})
                    meta[tid] = {"kind": "interface", "from": src.name, "to": dst.name, "port": sample[0],
                                 "host": p["address"], "iface": p["name"]}
    with_targets = [n for n in live if plan[n.name]]
    connectors = _start_all(with_targets, lambda n: [
        "connect", "--from", n.name, "--targets", json.dumps(plan[n.name]),
        "--timeout-s", str(opts.connect_timeout_s)])
    results: dict[str, dict] = {}
    for n in with_targets:
        r = connectors[n.name]
        try:
            if isinstance(r, Exception):
                raise r
            done = r.wait(AGENT_START_S + opts.connect_timeout_s + 10)
            doc = _last_json(done.stdout, AGENT_CONNECT, n.source)
            if doc is None:
                raise EnvbuildError(f"agent printed no result: {done.stderr.strip()[-200:]}")
            results.update(doc["results"])
        except EnvbuildError as e:
            unknown.append(f"{n.name}: could not connect out ({e})")
    for r in listeners.values():
        if isinstance(r, Running):
            r.kill()
    # --- judge ---
    blocked, short, reach_fail, in_use = [], [], [], []
    if want_port and master.name in bound:
        state = bound[master.name]["ports"].get(str(opts.port))
        if state != "listening":
            in_use.append(f"port {opts.port}/tcp on {master.name}: {state} (another job or a stale rendezvous holds it)")
    for tid, m in meta.items():
        res = results.get(tid)
        if res is None or res["status"] == "ok":
            continue
        line = (f"{m['from']} -> {m['to']} ({m['host']}) port {m['port']}/tcp: {res['status']} "
                f"({res['detail']})")
        if m["kind"] == "interface":
            reach_fail.append(f"{m['to']}'s {m['iface']} address {m['host']} is not reachable from {m['from']}: "
                              f"{res['status']} ({res['detail']})")
        else:
            blocked.append(line if m["kind"] == "rendezvous" else line + " [ephemeral range]")
            short.append(f"{m['from']} -> {m['to']} port {m['port']}/tcp ({res['status']})")
    if want_port:
        if blocked or in_use:
            lo, hi = _port_range(master)
            msg = "; ".join(in_use + ([f"firewall: {', '.join(short)}"] if short else []))
            fix = (f"open TCP {opts.port} (rendezvous) on {master.name} to every node and the ephemeral range "
                   f"{lo}-{hi} between nodes (NCCL and gloo listen on random ports) in iptables/firewalld/"
                   "security groups, or pick a free --master-port (pytorch#79388, NVIDIA/nccl#388)")
            out.append(Check("port", FAIL, msg, fix, in_use + blocked, {"results": results, "plan": meta}))
        elif unknown:
            out.append(Check("port", UNKNOWN, "; ".join(unknown), "check that python3 runs on every node", unknown))
        else:
            n_conn = sum(1 for m in meta.values() if m["kind"] != "interface")
            others = len(live) - 1
            out.append(Check("port", PASS, f"{n_conn} connections ok: rendezvous {master.name}:{opts.port} from "
                             f"{others} other node{'s' if others != 1 else ''}, {samples} ephemeral "
                             f"port{'s' if samples != 1 else ''} of every node from every peer", None, [],
                             {"results": results, "plan": meta}))
    if want_if:
        out.append(_interface_check(if_fail, reach_fail, reach_checked=not unknown))
    return out


def _interface_check(if_fail: list[str], reach_fail: list[str], reach_checked: bool) -> Check:
    problems = if_fail + reach_fail
    if problems:
        return Check("interface", FAIL, "; ".join(problems),
                     "set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to an interface every node has and its "
                     "peers can route to, e.g. the cluster network (NVIDIA/nccl#286, #1581; pytorch#64926)",
                     problems)
    tail = "" if reach_checked else " (reachability not checked: needs live nodes)"
    return Check("interface", PASS, "the interfaces NCCL/gloo would pick exist, are not loopback" + tail)


# --------------------------------------------------------------------------- straggler


def _backend(nodes: list[Node], opts: Options) -> str:
    if opts.backend:
        return opts.backend
    ok = [n for n in nodes if n.ok]
    if ok and all(n.report.get("gpus") and get(n.report, "torch.cuda_available") for n in ok):
        return "nccl"
    return "gloo"


def _run_agent(n: Node, args: list[str], timeout_s: float, key: str, spec: Spec) -> dict:
    """Run the agent on ``n`` to its end; its last JSON line, which must carry ``key``
    and follow ``spec``.

    Raises:
        EnvbuildError: (exit 3) it could not start, timed out or printed no such line.
    """
    done = n.target.run(agent_source(), args, timeout_s)
    doc = _last_json(done.stdout, spec, n.source)
    if doc is None or key not in doc:
        lines = [l for l in done.stderr.strip().splitlines() if l.strip()]
        raise EnvbuildError(f"agent {args[0]} gave no result (exit status {done.rc}): "
                            f"{lines[-1] if lines else 'no output'}", exit_code=ExitCode.UNREACHABLE)
    return doc


def _machine(n: Node) -> str:
    """Nodes with the same key share a machine (containers on this engine): their compute
    is timed one after the other so they do not slow each other down."""
    return getattr(n.target, "machine", None) or n.name


def check_straggler(nodes: list[Node], opts: Options, backend: str) -> Check:
    """Time every live node's compute alone (agent ``compute``: machines in parallel, the
    nodes of one machine one after the other; nodes found slow are timed once more and
    keep their better timing), then every node pair's all-reduce (agent ``pairs``, all
    nodes at once); ``fail`` naming nodes slower than the median by more than
    ``opts.straggler_ratio``, and pairs that failed."""
    live = _live(nodes)
    if len(live) < 2:
        why = "one live node: nothing to compare" if live else "needs live nodes (report files give reports only)"
        return Check("straggler", SKIP, why, checked=False)
    unknown: list[str] = []
    docs: dict[str, dict] = {}
    def time_machine(group: list[Node]) -> None:
        for n in group:
            try:
                doc = _run_agent(n, ["compute", "--backend", backend, "--iters", str(opts.straggler_iters),
                                     "--repeats", str(opts.straggler_repeats)], opts.agent_timeout_s, "compute",
                                 AGENT_COMPUTE)
            except EnvbuildError as e:
                unknown.append(f"{n.name}: {e}")
                continue
            old = docs.get(n.name, {}).get("compute")
            if old and old.get("best_s") and (doc["compute"].get("best_s") or 0) > old["best_s"]:
                doc = {"compute": old}  # a second look keeps the better timing
            docs[n.name] = doc

    def time_all(chosen: list[Node]) -> None:
        groups: dict[str, list[Node]] = {}
        for n in chosen:
            groups.setdefault(_machine(n), []).append(n)
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(groups)))) as pool:
            list(pool.map(time_machine, groups.values()))

    time_all(live)
    # Timings too slow are taken again once (a busy moment is not a straggler), as the
    # cluster-health-scanner re-tests failing nodes before naming them.
    best = {name: d["compute"]["best_s"] for name, d in docs.items() if d["compute"].get("best_s")}
    if len(best) >= 2:
        ref = statistics.median_low(sorted(best.values()))
        again = [n for n in live if best.get(n.name, 0) > opts.straggler_ratio * ref]
        if again:
            time_all(again)
    base = opts.pair_port_base or opts.port + 100
    addrs = ",".join(n.address for n in live)
    index = {n.name: i for i, n in enumerate(live)}
    runs = _start_all(live, lambda n: [
        "pairs", "--index", str(index[n.name]), "--addrs", addrs, "--port-base", str(base),
        "--backend", backend, "--iters", str(opts.allreduce_iters), "--size", str(opts.allreduce_bytes),
        "--timeout-s", str(max(30.0, opts.agent_timeout_s / 2))])
    for n in live:
        r = runs[n.name]
        try:
            if isinstance(r, Exception):
                raise r
            done = r.wait(opts.agent_timeout_s)
            doc = _last_json(done.stdout, AGENT_PAIRS, n.source)
            if doc is None or "pairs" not in doc:
                raise EnvbuildError(f"agent pairs gave no result (exit status {done.rc}): "
                                    f"{done.stderr.strip()[-200:]}")
            docs.setdefault(n.name, {}).update(doc)
        except EnvbuildError as e:
            unknown.append(f"{n.name}: {e}")
    ratio = opts.straggler_ratio
    details: list[str] = []
    slow: list[str] = []
    data: dict = {"ratio": ratio, "backend": backend, "compute": {}, "pairs": []}
    compute = {name: d["compute"]["best_s"] for name, d in docs.items() if (d.get("compute") or {}).get("best_s")}
    data["compute"] = compute
    if len(compute) >= 2:
        ref = statistics.median_low(sorted(compute.values()))
        for name, t in compute.items():
            details.append(f"{name}: compute {t:.3f} s ({t / ref:.2f}x the median, "
                           f"{opts.straggler_iters} forward/backward steps, {docs[name]['compute']['backend']})")
            if t > ratio * ref:
                slow.append(f"{name} computes {t / ref:.1f}x slower than the median ({t:.3f} s vs {ref:.3f} s)")
    # pairs: the slower of the two ends' timings
    names = [n.name for n in live]
    position = {name: i for i, name in enumerate(names)}
    pair_t: dict[tuple[str, str], float | None] = {}
    pair_err: dict[tuple[str, str], str] = {}
    for name, d in docs.items():
        for p in d.get("pairs") or []:
            if not 0 <= p["peer"] < len(names) or names[p["peer"]] == name:
                continue  # a peer index the run never gave: not a pair of this run
            key = tuple(sorted((name, names[p["peer"]]), key=position.__getitem__))
            if p.get("error"):
                pair_err.setdefault(key, p["error"])
            elif p.get("seconds") is not None:
                pair_t[key] = max(pair_t.get(key) or 0.0, p["seconds"])
    failed_pairs = [f"all-reduce {a} <-> {b} failed: {e}" for (a, b), e in pair_err.items()]
    data["pairs"] = [{"nodes": list(k), "seconds": v, "error": pair_err.get(k)} for k, v in pair_t.items()] + \
        [{"nodes": list(k), "seconds": None, "error": e} for k, e in pair_err.items() if k not in pair_t]
    if pair_t:
        ref = statistics.median_low(sorted(pair_t.values()))
        for (a, b), t in sorted(pair_t.items(), key=lambda kv: -kv[1]):
            details.append(f"pair {a} <-> {b}: all-reduce {t:.3f} s ({t / ref:.2f}x the median, "
                           f"{opts.allreduce_iters} x {human_bytes(opts.allreduce_bytes)}, {backend})")
        best: dict[str, float] = {}
        for (a, b), t in pair_t.items():
            for x in (a, b):
                best[x] = min(best.get(x, t), t)
        if len(best) >= 3:  # with two nodes one pair cannot say which node is slow
            node_ref = statistics.median_low(sorted(best.values()))
            for name, t in best.items():
                if t > ratio * node_ref:
                    slow.append(f"{name}'s fastest all-reduce pair is {t / node_ref:.1f}x slower than the median "
                                f"node's ({t:.3f} s vs {node_ref:.3f} s)")
    details.extend(sorted({f"pairs: {d['error']}" for d in docs.values() if d.get("error")}))
    fix = ("check the named nodes: CPU/GPU clocks and thermal throttling, cgroup CPU limits (--cpus), other "
           "jobs on the node, NIC link speed (NVIDIA/nccl#349, nccl-tests#106)")
    if slow or failed_pairs:
        return Check("straggler", FAIL, "straggler: " + "; ".join(slow + failed_pairs), fix,
                     slow + failed_pairs + details, data)
    if unknown:
        return Check("straggler", UNKNOWN, "; ".join(unknown), "check that python3 (and torch) run on every node",
                     unknown + details, data)
    return Check("straggler", PASS, f"no node slower than {ratio:g}x the median ({len(docs)} nodes, "
                 f"{len(pair_t)} pairs)", None, details, data)


# --------------------------------------------------------------------------- the run


def doctor(nodes: list[Node], opts: Options | None = None) -> DoctorResult:
    """Run the chosen checks on gathered ``nodes`` (see :mod:`builder.nodes.gather`).

    A node that could not be checked is never left out silently: the ``nodes`` check
    runs whenever one did not answer, chosen or not (exit 3).

    Returns:
        A :class:`DoctorResult` with one :class:`Check` per chosen check, in
        :data:`ALL_CHECKS` order.

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
    backend = _backend(nodes, opts)
    checks: list[Check] = []
    want = set(opts.checks)
    if not nodes:  # `envbuild doctor --fix` alone: only the checks of this machine
        checks += [Check(name, SKIP, "no nodes given", checked=False) for name in ALL_CHECKS
                   if name in want and name != "stale-containers"]
        want &= {"stale-containers"}
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
    order = {name: i for i, name in enumerate(ALL_CHECKS)}
    checks.sort(key=lambda c: order[c.name])
    if not any(c.checked for c in checks):
        raise Unreachable("doctor checked nothing: " + _nothing_checked(nodes, checks))
    code = max((_STATUS_CODE[c.status] for c in checks), default=ExitCode.OK)
    return DoctorResult(nodes, checks, code)


def _nothing_checked(nodes: list[Node], checks: list[Check]) -> str:
    """Why no check looked at anything, in one line."""
    bad = [n for n in nodes if not n.ok]
    if nodes and len(bad) == len(nodes):
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return f"no node answered ({len(nodes)} given): {bad[0].error}{more}"
    reasons = [f"{c.name}: {c.message}" for c in checks if nodes or c.message != "no nodes given"]
    return "; ".join((["no nodes given"] if not nodes else []) + reasons)


#: Characters of one detail line in the human output (the JSON output has it whole).
LINE_LIMIT = 900


def render(result: DoctorResult, console) -> None:
    """Print ``result`` with rich: one row per check (status, finding), then for every
    check that did not pass its details and fix, and a summary line. Every message is
    shown escaped (:func:`builder.nodes.verify.cell`: never rich markup, no raw control
    character), cut to :data:`LINE_LIMIT` characters."""
    from rich.table import Table
    from rich.text import Text

    style = {PASS: "green", SKIP: "dim", WARN: "yellow", FAIL: "red", UNKNOWN: "magenta"}
    t = Table(title=f"doctor: {len(result.nodes)} nodes", title_justify="left", show_edge=False)
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("finding", overflow="fold")
    for c in result.checks:
        t.add_row(verify.cell(c.name), verify.cell(c.status, style=style[c.status]), verify.cell(c.message, LINE_LIMIT))
    console.print(t)
    for c in result.checks:
        if c.status not in (FAIL, WARN, UNKNOWN):
            continue
        console.print(Text.assemble((c.name, style[c.status]), ":"), highlight=False)
        for line in c.details:
            console.print(Text("  " + one_line(line, LINE_LIMIT)), highlight=False, soft_wrap=True)
        if c.fix:
            console.print(Text("  fix: " + one_line(c.fix, LINE_LIMIT)), highlight=False, soft_wrap=True)
    counts = {s: sum(1 for c in result.checks if c.status == s) for s in style}
    console.print(f"doctor: {counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed, "
                  f"{counts[UNKNOWN]} not checked, {counts[SKIP]} skipped -> exit {int(result.exit_code)}",
                  markup=False, highlight=False)
