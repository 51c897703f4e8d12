"""What every doctor check shares: statuses, :class:`Check`, :class:`Options`, sizes, the in-node agent."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode, FailureClass, next_step

from ..report import Node
from ..sources.base import AGENT_MODULE, Running

PASS, WARN, FAIL, SKIP, UNKNOWN = "pass", "warn", "fail", "skip", "unknown"
STATUS_CODE = {PASS: ExitCode.OK, SKIP: ExitCode.OK, WARN: ExitCode.WARNINGS,
               FAIL: ExitCode.CHECK_FAILED, UNKNOWN: ExitCode.UNREACHABLE}

ALL_CHECKS = ("nodes", "port", "interface", "shm", "gpu-uuid", "gpu-processes", "gpu-health",
              "stale-containers", "straggler")

_N, _W = FailureClass.NETWORK, FailureClass.WORKLOAD
#: The class of each check (doctor's and the gate's) that fails or warns; gpu-health's worst finding names its own.
CHECK_CLASS = {"nodes": _N, "port": _N, "interface": _N, "shm": FailureClass.IMAGE, "gpu-uuid": FailureClass.IMAGE,
               "gpu-processes": _W, "stale-containers": _W, "straggler": FailureClass.HARDWARE,
               "image-ref": FailureClass.IMAGE, "epilog": _W, "gpu-health": FailureClass.HARDWARE}

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
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


@dataclass
class Check:
    """One check's outcome; ``checked`` is False when it could look at nothing (all unchecked: exit 3)."""

    name: str
    status: str
    message: str
    fix: str | None = None
    details: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    checked: bool = True
    cls: FailureClass | None = None
    next_step: str | None = None

    def __post_init__(self) -> None:
        """A failing or warning check gets its class (:data:`CHECK_CLASS`) and that class's next step; others none."""
        if self.status in (FAIL, WARN):
            self.cls = self.cls or CHECK_CLASS[self.name]
            self.next_step = self.next_step or next_step(self.cls)


@dataclass(frozen=True)
class HealthOptions:
    """The ``gpu-health`` check's options (None: not checked, or the agent's default path)."""

    expected_gpus: int | None = None
    thresholds_file: str | None = None
    kernel_log: str | None = None
    ib_root: str | None = None
    nvml_timeout_s: float = 30.0


@dataclass
class Options:
    """Seconds, bytes. ``straggler_iters``: work spanning several 100 ms CFS periods of a CPU-limited container."""

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
    health: HealthOptions = field(default_factory=HealthOptions)
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
    if any(n.ok for n in nodes):
        return None
    return Check(name, UNKNOWN, f"no node answered ({len(nodes)} given): nothing checked", checked=False)


def start_all(nodes: list[Node], args_for: Callable[[Node], list[str]]) -> dict[str, Running | EnvbuildError]:
    """Start the agent on every node at once: ``{node name: Running or the error}``."""
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
