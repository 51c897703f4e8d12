"""What every doctor check shares: statuses, :class:`Check`, :class:`Options`, sizes, and
starting the in-node agent (:mod:`builder.agent.doctor_agent`) on live nodes."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode

from ..report import Node
from ..sources.base import AGENT_MODULE, Running

PASS, WARN, FAIL, SKIP, UNKNOWN = "pass", "warn", "fail", "skip", "unknown"
STATUS_CODE = {PASS: ExitCode.OK, SKIP: ExitCode.OK, WARN: ExitCode.WARNINGS,
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
            checked anything exits 3 (:func:`builder.nodes.doctor.doctor`).
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
    client: Any = None


def live(nodes: list[Node]) -> list[Node]:
    """The nodes with a valid report, a target to run the agent on, and an address."""
    return [n for n in nodes if n.ok and n.target is not None and n.address]


def port_range(n: Node) -> tuple[int, int]:
    """The node's ephemeral port range (Linux's default 32768-60999 when not reported)."""
    rng = n.report.network.ip_local_port_range if n.report and n.report.network else None
    lo, hi = rng or [32768, 60999]
    return int(lo), int(hi)


def no_answer(name: str, nodes: list[Node]) -> Check | None:
    """``unknown`` (nothing checked) when no node has a valid report, else None."""
    if any(n.ok for n in nodes):
        return None
    return Check(name, UNKNOWN, f"no node answered ({len(nodes)} given): nothing checked", checked=False)


def start_all(nodes: list[Node], args_for: Callable[[Node], list[str]]) -> dict[str, Running | EnvbuildError]:
    """Start the agent on every node at once with ``args_for(node)``: ``{node name:
    Running, or the error that kept it from starting}``."""
    def start(n: Node) -> Running | EnvbuildError:
        assert n.target is not None
        try:
            return n.target.start(AGENT_MODULE, args_for(n))
        except EnvbuildError as e:
            return e

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(start, nodes), strict=True))


def stderr_tail(r: Running) -> str:
    """Why an agent printed nothing: its last stderr line (it is stopped first)."""
    r.kill()
    try:
        done = r.wait(5)
    except EnvbuildError:
        return "agent did not start"
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return f"agent exited with status {done.rc}: {lines[-1] if lines else 'no output'}"
