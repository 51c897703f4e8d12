"""Certify an image: run probe + bench on N simulated nodes, judge, write a certificate.

:func:`certify` reads the image's labels (``envbuild.lock`` holds the whole lock, including
the ``certify`` settings; it must hash to ``envbuild.lock-hash``), resolves the settings
(:func:`resolve_settings`: the lock's, overridden by the arguments), runs the ranks through
a launcher (default
:class:`builder.launchers.local.LocalDockerLauncher`), judges the rank results
(:func:`judge`), builds the certificate (:func:`build_certificate`, schema
``envbuild.certificate/1``) and writes it atomically to
``<images_dir>/<recipe>/certificates/<recipe>-<lockhash12>-<UTC stamp>.json``
(:func:`write_certificate`), for failing verdicts as well: that is the record.

The verdict (``{"passed", "exit_code", "failures", "warnings"}``) checks:

1. every rank of the world (N x max(G, 1)) reported; a missing rank is named with why
   (``"rank 1 exited with 3"``, ``"rank 1 did not finish within 60 s (timeout)"``);
2. the all-reduce result was exact (``wrong == 0``) at every size on every rank;
3. after the DDP steps, every rank held identical parameters;
4. every rank's probe matches the lock (:func:`builder.image.probecheck.compare_probe_to_lock`),
   and all ranks loaded the same torch, NCCL, Python, glibc and OS;
5. the busbw floor: ``min_busbw_gbps`` at ``busbw_size`` (largest size when null). It
   gates nccl runs with the recipe's threshold, and gloo runs ONLY when given explicitly
   (``--min-busbw``): CPU figures on shared cores are noise, reported but not gated. A
   failing floor names the slowest rank at that size.

Exit code: 0 passed; 2 a check failed (including a rank that crashed); 3 could not check
(ranks missing because of the timeout, unreadable result files) when no check failed
outright. Warnings do not fail the verdict. The launcher's notes on the run as a whole
(``LaunchResult.notes``, e.g. a Slurm job's final state and the tail of its log) come first
among the failures of a failing verdict, else among the warnings; they never change the
exit code.

Everything the launch creates carries ``envbuild=1`` and ``envbuild.run=<run id>`` plus the
``labels`` argument and, for tests and CI, the labels in ``$ENVBUILD_EXTRA_LABELS``
(``key=value,...``; see :mod:`builder.launchers.local`).

The nccl backend is binding: it is refused (exit 2, nothing started) when no GPU is
visible (``gpus_per_node`` 0, or an engine without an NVIDIA runtime) unless the backend
is overridden to gloo; the certificate records the backend used and the recipe's.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import re
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from builder import __version__
from builder.recipe.lock import lock_hash, read_lock_text
from builder.image import engine
from builder.image import probecheck
from builder.certify import nccl_log
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.paths import image_dir
from builder.core.inputs import one_line, show
from builder.launchers.base import PROGRESS_PREFIX, RESULT_PREFIX, SILENT_AFTER_S, SOCKET_IFNAME_RE, SOCKET_VARS, STOPPED_STATES, LaunchResult, LaunchSpec, Launcher, result_problem, socket_env

CERT_SCHEMA = "envbuild.certificate/1"

#: Defaults for settings missing from the lock's ``certify`` section.
DEFAULTS = {
    "backend": "gloo",
    "nodes": 2,
    "gpus_per_node": 0,
    "port": 29500,
    "shm_size": "256m",
    "timeout_s": 300,
    "allreduce": {"sizes": [8, 1024, 65536, 1048576, 4194304], "iters": 10, "warmup": 2},
    "ddp": {"steps": 3, "batch_size": 8, "image_size": 64},
    "thresholds": {"min_busbw_gbps": None, "busbw_size": None},
}

#: Element size of the all-reduce dtype the bench uses by default (float32).
ELEMENT_BYTES = 4

#: Lines of each node's log kept in the certificate when the verdict fails.
LOG_TAIL_LINES = 40

#: Lines of a failing node's log shown under a failing verdict when none looks like an error.
LOG_SHOW_LINES = 5

#: A Python exception line (``OverflowError: ...``), also prefixed by torch (``[rank0]: ...``);
#: torchrun's own ``ChildFailedError`` wraps the real cause and is skipped.
_ERROR_LINE_RE = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)(?::.*)?$")

#: Labels copied into the certificate (``envbuild.lock`` is stored parsed, as ``lock``).
LABEL_PREFIXES = ("envbuild.", "org.opencontainers.image.")


# --------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """The resolved settings of one certification (lock's, overridden by arguments).

    ``min_busbw_gbps`` is the floor actually applied (None: busbw not gated);
    ``busbw_source`` says where it came from (``"argument"``, ``"recipe"`` or None);
    ``recipe_min_busbw_gbps`` is the recipe's threshold, applied or not.
    """

    recipe: str
    recipe_backend: str
    backend: str
    nodes: int
    gpus_per_node: int
    port: int
    shm_size: Optional[str]
    timeout_s: float
    sizes: list[int]
    iters: int
    warmup: int
    ddp_steps: int
    ddp_batch: int
    ddp_image_size: int
    min_busbw_gbps: Optional[float]
    busbw_size: int
    busbw_source: Optional[str]
    recipe_min_busbw_gbps: Optional[float]
    warnings: list[str] = field(default_factory=list)

    @property
    def nproc_per_node(self) -> int:
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def bench_args(self) -> list[str]:
        """Arguments of ``python3 -m bench`` after ``--out``."""
        return [
            "--backend", self.backend,
            "--sizes", ",".join(str(s) for s in self.sizes),
            "--iters", str(self.iters),
            "--warmup", str(self.warmup),
            "--ddp-steps", str(self.ddp_steps),
            "--ddp-batch", str(self.ddp_batch),
            "--ddp-image-size", str(self.ddp_image_size),
            "--pg-timeout-s", f"{float(self.timeout_s):g}",
        ]


def _usage(message: str, field_: str, value: object) -> EnvbuildError:
    return EnvbuildError(message, field=field_, value=value, exit_code=ExitCode.USAGE)


def _pick(arg, section: Mapping, key: str, default):
    if arg is not None:
        return arg
    val = section.get(key) if isinstance(section, Mapping) else None
    return default if val is None else val


def resolve_settings(
    lock: Mapping[str, Any],
    *,
    gpu_visible: bool,
    nodes: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    backend: Optional[str] = None,
    port: Optional[int] = None,
    timeout_s: Optional[float] = None,
    min_busbw_gbps: Optional[float] = None,
    busbw_size: Optional[int] = None,
    shm_size: Optional[str] = None,
    sizes: Optional[Sequence[int]] = None,
    iters: Optional[int] = None,
    warmup: Optional[int] = None,
    ddp_steps: Optional[int] = None,
    ddp_batch: Optional[int] = None,
    ddp_image_size: Optional[int] = None,
    recipe_backend: Optional[str] = None,
) -> Settings:
    """Resolve the settings: ``lock["certify"]`` (else :data:`DEFAULTS`), overridden by
    the arguments that are not None.

    Args:
        gpu_visible: whether the engine can give containers GPUs (NVIDIA runtime).
        recipe_backend: the recipe's backend when the lock has none (the
            ``envbuild.backend`` label).

    Raises:
        EnvbuildError: (exit 2) nccl without a visible GPU ("recipe backend nccl needs
            GPUs; none visible: pass --backend gloo to certify on CPUs"), or GPUs asked
            for on an engine without any; (exit 64) a value out of range.
    """
    c = lock.get("certify") or {}
    ar = c.get("allreduce") or {}
    dd = c.get("ddp") or {}
    th = c.get("thresholds") or {}
    warnings: list[str] = []

    rec_backend = c.get("backend") or recipe_backend or DEFAULTS["backend"]
    used = backend or rec_backend
    if used not in ("gloo", "nccl"):
        raise _usage("is not a backend (gloo or nccl)", "backend", used)
    nodes = int(_pick(nodes, c, "nodes", DEFAULTS["nodes"]))
    if gpus_per_node is None:
        gpus = int(_pick(None, c, "gpus_per_node", DEFAULTS["gpus_per_node"]))
        if used == "gloo" and backend is not None and gpus > 0 and not gpu_visible:
            # certifying a GPU recipe on CPUs with --backend gloo: one process per node
            warnings.append(f"no GPU visible: certifying on CPUs (recipe asks for {gpus} GPU(s) per node)")
            gpus = 0
    else:
        gpus = int(gpus_per_node)
    port = int(_pick(port, c, "port", DEFAULTS["port"]))
    timeout = float(_pick(timeout_s, c, "timeout_s", DEFAULTS["timeout_s"]))
    shm = _pick(shm_size, c, "shm_size", DEFAULTS["shm_size"])
    sizes_l = [int(s) for s in (sizes if sizes is not None else (ar.get("sizes") or DEFAULTS["allreduce"]["sizes"]))]
    iters = int(_pick(iters, ar, "iters", DEFAULTS["allreduce"]["iters"]))
    warmup = int(_pick(warmup, ar, "warmup", DEFAULTS["allreduce"]["warmup"]))
    steps = int(_pick(ddp_steps, dd, "steps", DEFAULTS["ddp"]["steps"]))
    batch = int(_pick(ddp_batch, dd, "batch_size", DEFAULTS["ddp"]["batch_size"]))
    image_size = int(_pick(ddp_image_size, dd, "image_size", DEFAULTS["ddp"]["image_size"]))

    if nodes < 1:
        raise _usage("must be >= 1", "nodes", nodes)
    if gpus < 0:
        raise _usage("must be >= 0", "gpus_per_node", gpus)
    if not 1 <= port <= 65535:
        raise _usage("is not a TCP port", "port", port)
    if not timeout > 0:
        raise _usage("must be > 0", "timeout_s", timeout)
    if not sizes_l or any(s < ELEMENT_BYTES or s % ELEMENT_BYTES for s in sizes_l):
        raise _usage(f"sizes must be positive multiples of {ELEMENT_BYTES} bytes", "sizes", sizes_l)
    if min_busbw_gbps is not None and not min_busbw_gbps >= 0:
        raise _usage("must be >= 0", "min_busbw_gbps", min_busbw_gbps)

    if used == "nccl" and (gpus == 0 or not gpu_visible):
        why = "gpus_per_node is 0" if gpus == 0 else "the Docker engine has no NVIDIA runtime"
        who = "backend nccl" if backend else "recipe backend nccl"
        raise EnvbuildError(f"{who} needs GPUs; none visible: pass --backend gloo to certify on CPUs ({why})")
    if gpus > 0 and not gpu_visible:
        raise EnvbuildError(
            f"{gpus} GPU(s) per node asked for; none visible (the Docker engine has no NVIDIA "
            "runtime): pass --gpus-per-node 0 --backend gloo to certify on CPUs"
        )

    recipe_floor = th.get("min_busbw_gbps")
    gate_size = int(busbw_size or th.get("busbw_size") or max(sizes_l))
    if min_busbw_gbps is not None:
        floor, source = float(min_busbw_gbps), "argument"
    elif used == "nccl" and recipe_floor is not None:
        floor, source = float(recipe_floor), "recipe"
    else:
        floor, source = None, None
        if recipe_floor is not None:
            warnings.append(
                f"recipe busbw floor {recipe_floor:g} GB/s not applied on {used} (CPU figures "
                "are noise); pass --min-busbw to gate"
            )
    if floor is not None and gate_size not in sizes_l:
        sizes_l = sorted([*sizes_l, gate_size])

    return Settings(
        recipe=str(lock.get("recipe") or "unknown"),
        recipe_backend=rec_backend,
        backend=used,
        nodes=nodes,
        gpus_per_node=gpus,
        port=port,
        shm_size=shm,
        timeout_s=timeout,
        sizes=sizes_l,
        iters=iters,
        warmup=warmup,
        ddp_steps=steps,
        ddp_batch=batch,
        ddp_image_size=image_size,
        min_busbw_gbps=floor,
        busbw_size=gate_size,
        busbw_source=source,
        recipe_min_busbw_gbps=None if recipe_floor is None else float(recipe_floor),
        warnings=warnings,
    )


def gpu_runtime_visible(client) -> bool:
    """Whether the engine can hand GPUs to containers: an ``nvidia`` runtime in
    ``docker info``, or the NVIDIA container hook on this machine's PATH."""
    try:
        info = client.info()
    except Exception:  # noqa: BLE001 - treated as no GPU
        return False
    if "nvidia" in (info.get("Runtimes") or {}) or info.get("DefaultRuntime") == "nvidia":
        return True
    return bool(shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-container-cli"))


# --------------------------------------------------------------------------- socket settings

#: Where the socket interface setting of a run came from (``socket.source`` of the
#: certificate): the image's own ``ENV``, the ``--socket-ifname`` option, or neither
#: (``default``: unset; NCCL and gloo choose: NCCL the first interface not ``lo`` or
#: ``docker*``, gloo the address of the hostname).
SOCKET_SOURCES = ("image", "--socket-ifname", "default")


def check_socket_ifname(value: Optional[str]) -> Optional[str]:
    """``value`` when it is a valid ``--socket-ifname`` (None passes): NCCL's syntax,
    an optional ``^`` and ``=`` then a comma list of interface names (at most 15
    characters each, ``[A-Za-z0-9_.:-]``; :data:`~builder.launchers.base.SOCKET_IFNAME_RE`).

    Raises:
        EnvbuildError: (exit 64) anything else, e.g. ``'eth0\\n'``, ``'eth0;rm'``, ``''``.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not SOCKET_IFNAME_RE.fullmatch(value):
        raise _usage("is not a network interface name list ([^][=]NAME[,NAME...], names of at "
                     "most 15 characters [A-Za-z0-9_.:-])", "socket_ifname", value)
    return value


def socket_settings(image_env: Mapping[str, str], override: Optional[str]) -> dict:
    """The socket interface setting a run uses and where it comes from.

    Returns:
        ``{"source": "image"|"--socket-ifname"|"default", "override": str|None,
        "GLOO_SOCKET_IFNAME": str|None, "NCCL_SOCKET_IFNAME": str|None}``: with an
        override, the values it sets (:func:`~builder.launchers.base.socket_env`); else the
        image's ``ENV`` values (``source`` ``image`` when it sets either), else None.
    """
    if override is not None:
        return {"source": "--socket-ifname", "override": override, **socket_env(override)}
    values = {k: image_env.get(k) for k in SOCKET_VARS}
    source = "image" if any(v is not None for v in values.values()) else "default"
    return {"source": source, "override": None, **values}


def _selected(var: str, value: Optional[str], ifaces: Mapping[str, bool]) -> Optional[list[str]]:
    """The interfaces of ``ifaces`` a socket variable selects; None when it is unset (the
    library chooses). GLOO_SOCKET_IFNAME: exact names (used when longer than one
    character); NCCL_SOCKET_IFNAME: NCCL's prefix syntax (:func:`builder.core.netif.match_nccl_ifname`)."""
    if var == "GLOO_SOCKET_IFNAME":
        if value is None or len(value) <= 1:
            return None
        return [n for n in value.split(",") if n in ifaces]
    if not value:
        return None
    from builder.core.netif import match_nccl_ifname

    return match_nccl_ifname(value, sorted(ifaces))


def socket_findings(s: "Settings", launch: LaunchResult, sock: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` about the socket settings the ranks ran with.

    A failure when the run has more than one node and the variable of the backend
    (``GLOO_SOCKET_IFNAME`` for gloo, ``NCCL_SOCKET_IFNAME`` for nccl), as the ranks saw
    it (their ``start`` progress line; else the setting), selects only loopback
    interfaces of a rank: the ranks cannot reach each other then. It is reported only
    for a failing run (certification judges what really happened). A warning for each
    rank that saw another value than the setting (e.g. an entrypoint changed it).
    """
    var = "GLOO_SOCKET_IFNAME" if s.backend == "gloo" else "NCCL_SOCKET_IFNAME"
    where = {"image": "from the image's ENV", "--socket-ifname": "from --socket-ifname",
             "default": "unset"}[sock.get("source", "default")]
    warnings = []
    loop: dict[str, list[int]] = {}
    for r in sorted(set(launch.socket_seen) | set(launch.interfaces_seen)):
        seen = (launch.socket_seen.get(r) or {})
        for k in SOCKET_VARS:
            if r in launch.socket_seen and seen.get(k) != sock.get(k):
                warnings.append(f"rank {r} ran with {k}={show(seen.get(k), 60)}, not "
                                f"{show(sock.get(k), 60)} ({where})")
        value = seen.get(var) if r in launch.socket_seen else sock.get(var)
        ifaces = launch.interfaces_seen.get(r) or {}
        picked = _selected(var, value, ifaces)
        if picked and all(ifaces.get(n) for n in picked):
            loop.setdefault(value, []).append(r)
    failures = []
    if s.nodes > 1:
        for value, ranks in sorted(loop.items()):
            failures.append(
                f"{var}={one_line(value, 80)} ({where}) selects only the loopback interface on "
                f"{_ranks_text(ranks)}: ranks on {s.nodes} nodes cannot reach each other over it; "
                "set it to the nodes' network interface (or leave it unset) in the image, or pass "
                "--socket-ifname IF")
    return failures, warnings


# --------------------------------------------------------------------------- image


def read_image(client, image: str) -> tuple[dict[str, str], dict]:
    """``(labels, lock)`` of ``image``: the label ``envbuild.lock`` read with bounds and
    checked with the recipe's schema (:func:`builder.recipe.lock.read_lock_text`), then against
    its hash label (:func:`lock_from_labels`).

    Raises:
        EnvbuildError: (exit 2) no such image; a lock label over 1 MiB, not bounded JSON or
            breaking the schema (``IMAGE: label envbuild.lock: certify.nodes: 'abc' must be
            an integer in 1..1024``); see :func:`lock_from_labels`.
    """
    labels = engine.image_labels(client, image)
    if labels.get("envbuild.lock"):
        read_lock_text(labels["envbuild.lock"], f"{image}: label envbuild.lock")
    return labels, lock_from_labels(labels, image)


def lock_from_labels(labels: Mapping[str, str], image: str) -> dict:
    """The lock in the labels of ``image``: ``envbuild.lock`` parsed, checked against
    ``envbuild.lock-hash`` (:func:`builder.recipe.lock.lock_hash` of the parsed lock, as the
    renderer wrote it), so that an image rebuilt with an edited lock label is refused.

    Raises:
        EnvbuildError: (exit 2) not built by envbuild (no ``envbuild.lock`` /
            ``envbuild.lock-hash`` label); the lock label is not a JSON object; its hash
            differs from ``envbuild.lock-hash``.
    """
    missing = [k for k in ("envbuild.lock", "envbuild.lock-hash") if not labels.get(k)]
    if missing:
        raise EnvbuildError(
            f"was not built by envbuild (no {' / '.join(missing)} label); build it with "
            "`envbuild build RECIPE`",
            field="image",
            value=image,
        )
    try:
        lock = json.loads(labels["envbuild.lock"])
    except json.JSONDecodeError as e:
        lock, err = None, e
    else:
        err = None
    if not isinstance(lock, dict):
        raise EnvbuildError(f"label envbuild.lock is not a JSON object ({err or type(lock).__name__})",
                            field="image", value=image)
    actual, said = lock_hash(lock), labels["envbuild.lock-hash"]
    if actual != said:
        raise EnvbuildError(
            f"label envbuild.lock was changed after the build: it hashes to {actual}, label "
            f"envbuild.lock-hash says {said}; rebuild the image with `envbuild build RECIPE`",
            field="image", value=image)
    return lock


# --------------------------------------------------------------------------- probe vs lock


def compare_probe_to_lock(probe: Mapping, lock: Mapping) -> list[str]:
    """Differences between a probe document and the lock, one line each ([] = match);
    :func:`builder.image.probecheck.compare_probe_to_lock`."""
    return list(probecheck.compare_probe_to_lock(dict(probe), dict(lock)))


#: Facts that must be identical on every rank: (name, getter).
_SAME_EVERYWHERE = (
    ("torch", lambda p: (p.get("torch") or {}).get("version")),
    ("loaded NCCL", lambda p: ((p.get("nccl") or {}).get("loaded") or {}).get("version")),
    ("python", lambda p: (p.get("python") or {}).get("version")),
    ("glibc", lambda p: p.get("glibc")),
    ("OS", lambda p: "{} {}".format((p.get("os") or {}).get("id"), (p.get("os") or {}).get("version_id"))),
)


# --------------------------------------------------------------------------- judging


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def signal_text(code: int) -> str:
    """How a process ended, for a status: ``-9`` (torchrun's way) or ``137`` (a
    container's: 128 + N) -> ``"killed by SIGKILL (exit 137)"``; the watchdog's
    ``124`` -> ``"ended by its watchdog at the deadline (exit 124)"``; else
    ``"exited with N"``."""
    from builder.agent.bench.node import EXIT_DEADLINE

    n = -code if code < 0 else code - 128 if 128 < code <= 128 + 64 else None
    if n is not None:
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = f"signal {n}"
        return f"killed by {name} (exit {128 + n})"
    if code == EXIT_DEADLINE:
        return f"ended by its watchdog at the deadline (exit {code})"
    return f"exited with {code}"


def _phase_text(state: Mapping[str, Any]) -> str:
    detail = state.get("detail")
    return one_line(f"{state.get('phase')} {detail}" if detail else str(state.get("phase")), 80)


def hang_reasons(s: "Settings", launch: LaunchResult, stuck: Sequence[int]) -> dict[int, tuple[str, bool]]:
    """For the ranks ``stuck`` at the deadline (no result, no exit status, no problem):
    ``{rank: (failure line, hung?)}`` from the progress the ranks printed
    (``launch.progress``, :class:`~builder.launchers.base.ProgressTracker`).

    The rule: a rank is **hung** (it stopped making progress) when its heartbeat stopped
    (no progress line for more than :data:`~builder.launchers.base.SILENT_AFTER_S` s at
    the deadline: frozen, gone, or never started) or says it is stopped (process state
    ``T``: SIGSTOP), or when it is alive but outside any collective (computing or
    sleeping instead of reaching the next collective). The other
    stuck ranks are alive inside a collective: **blocked, waiting** for the hung ones. When
    no rank is hung by that rule but some got further than others, the ranks furthest
    behind (the lowest phase number) are the hung ones; when all are in the same phase,
    none is singled out (e.g. a network that joins no rank to another).
    """
    limit = launch.deadline_s if launch.deadline_s is not None else s.timeout_s
    head = {r: f"rank {r} did not finish within {limit:g} s (timeout)" for r in stuck}
    prog = {r: launch.progress.get(r) for r in stuck}
    if not launch.progress:  # a launcher that reads no progress lines
        return {r: (head[r], False) for r in stuck}
    silent = {r for r, p in prog.items() if p is None or p.get("silent_s", 0) > SILENT_AFTER_S
              or p.get("state") in STOPPED_STATES}
    idle = {r for r, p in prog.items() if r not in silent and not p.get("collective")}
    hung = silent | idle
    if not hung:
        seqs = {r: p["seq"] for r, p in prog.items()}
        ahead = [p["seq"] for r, p in launch.progress.items() if r not in stuck] + list(seqs.values())
        lowest = min(seqs.values())
        if max(ahead) > lowest:
            hung = {r for r, q in seqs.items() if q == lowest}
    out: dict[int, tuple[str, bool]] = {}
    for r in stuck:
        p = prog[r]
        if r in silent:
            why = ("hung: never reported progress" if p is None else
                   f"hung: stopped by a signal (process state {p['state']}) in {_phase_text(p)}"
                   if p.get("state") in STOPPED_STATES else
                   f"hung: no heartbeat for {p['silent_s']:g} s (frozen or gone); last in {_phase_text(p)}")
        elif r in idle:
            why = (f"hung: stopped making progress in {_phase_text(p)} for {p['in_phase_s']:g} s "
                   "(alive, outside any collective)")
        elif r in hung:
            further = sorted(x for x in launch.progress if x not in hung)
            why = (f"hung: stopped making progress in {_phase_text(p)} for {p['in_phase_s']:g} s; "
                   f"{_ranks_text(further)} got further")
        elif hung:
            why = f"blocked in {_phase_text(p)}, waiting for {_ranks_text(hung)}"
        else:
            why = f"blocked in {_phase_text(p)} for {p['in_phase_s']:g} s (no rank got further)"
        out[r] = (f"{head[r]}: {why}", r in hung)
    return out


def _missing_reason(rank: int, s: Settings, launch: LaunchResult, node: int) -> tuple[str, bool]:
    """(failure line, could-not-check?) for a rank without a result (not timed out: those
    are :func:`hang_reasons`)."""
    if rank in launch.rank_problems:
        return f"rank {rank}: {one_line(launch.rank_problems[rank], 400)}", True
    code = launch.rank_exit_codes.get(rank)
    if code is not None:
        return f"rank {rank} {signal_text(code)}", False
    if launch.timed_out:
        limit = launch.deadline_s if launch.deadline_s is not None else s.timeout_s
        return f"rank {rank} did not finish within {limit:g} s (timeout)", True
    ncode = launch.node_exit_codes.get(node)
    if ncode is None and launch.killed_after_s is not None:
        return (f"rank {rank} did not finish: killed {launch.killed_after_s:g} s after another "
                "node failed"), False
    if ncode not in (None, 0):
        return f"rank {rank} wrote no result: node {node} {signal_text(ncode)}", False
    return f"rank {rank} wrote no result (node {node} exited with {ncode})", False


def _missing_ranks(s: "Settings", launch: LaunchResult) -> tuple[list[str], bool, bool]:
    """``(failure lines, could-not-check?, definite?)`` for the ranks without a result;
    timed-out ranks named by :func:`hang_reasons`, the hung ones first."""
    results = launch.rank_results
    missing = [r for r in range(s.world_size) if r not in results]
    stuck = [r for r in missing if launch.timed_out and r not in launch.rank_problems
             and r not in launch.rank_exit_codes]
    hangs = hang_reasons(s, launch, stuck) if stuck else {}
    lines, unknown, definite = [], False, False
    for r in sorted(hangs, key=lambda r: (not hangs[r][1], r)):
        lines.append(hangs[r][0])
        unknown = True
    for r in missing:
        if r in hangs:
            continue
        line, could_not = _missing_reason(r, s, launch, r // s.nproc_per_node)
        lines.append(line)
        unknown |= could_not
        definite |= not could_not
    return lines, unknown, definite


def check_results(launch: LaunchResult, spec: LaunchSpec) -> None:
    """Refuse (in place) every rank result of ``launch`` that is not of this run: another
    schema, rank, world size or run id (:func:`~builder.launchers.base.result_problem`):
    it moves to ``rank_problems`` (named there), whatever launcher read it."""
    for rank, doc in sorted(launch.rank_results.items()):
        why = result_problem(doc, rank, "result", run_id=spec.run_id, world_size=spec.world_size)
        if why:
            del launch.rank_results[rank]
            launch.rank_problems[rank] = why
            if rank not in launch.missing_ranks:
                launch.missing_ranks = sorted([*launch.missing_ranks, rank])


def reference_rank(results: Mapping[int, dict]) -> Optional[int]:
    """The rank whose tables the certificate shows: the lowest that reported (0 normally)."""
    return min(results) if results else None


def _check_reports(s: "Settings", results: Mapping[int, dict]) -> tuple[list[str], list[str]]:
    """(1b) ``(failures, warnings)``: each result's world size and backend; its own errors."""
    failures, warnings = [], []
    for rank, doc in sorted(results.items()):
        if doc.get("world_size") != s.world_size:
            failures.append(f"rank {rank}: world size {show(doc.get('world_size'), 40)}, expected {s.world_size}")
        if doc.get("backend") != s.backend:
            failures.append(f"rank {rank}: ran backend {show(doc.get('backend'), 40)}, expected {s.backend}")
        for err in (doc.get("errors") or [])[:20]:
            warnings.append(f"rank {rank}: {one_line(err, 300)}")
    return failures, warnings


def _check_allreduce(s: "Settings", results: Mapping[int, dict]) -> list[str]:
    """(2) exact all-reduce on every rank at every size."""
    failures = []
    for rank, doc in sorted(results.items()):
        bad = [(e.get("size_bytes"), e.get("wrong")) for e in doc.get("allreduce") or [] if e.get("wrong")]
        if bad:
            where = ", ".join(f"{size} B ({n} wrong element{'s' if n != 1 else ''})" for size, n in bad)
            failures.append(f"rank {rank}: all-reduce sum wrong at {where}")
        measured = {e.get("size_bytes") for e in doc.get("allreduce") or []}
        lacking = [x for x in s.sizes if x not in measured]
        if lacking:
            failures.append(f"rank {rank}: no all-reduce result at {', '.join(map(str, lacking))} B")
    return failures


def _check_ddp(s: "Settings", results: Mapping[int, dict]) -> list[str]:
    """(3) DDP: identical parameters everywhere."""
    if s.ddp_steps <= 0:
        return []
    failures = []
    mismatched: set[int] = set()
    for rank, doc in sorted(results.items()):
        ddp = doc.get("ddp")
        if not ddp:
            failures.append(f"rank {rank}: no DDP result")
            continue
        if not ddp.get("params_identical", False):
            mismatched.update(ddp.get("mismatched_ranks") or [])
            if not ddp.get("mismatched_ranks"):
                mismatched.add(rank)
    checks = {r: (d.get("ddp") or {}).get("param_checksum") for r, d in results.items() if d.get("ddp")}
    if len(set(checks.values())) > 1 and not mismatched:
        mismatched.update(r for r, c in checks.items() if c != checks[min(checks)])
    if mismatched:
        failures.append(
            f"DDP parameters differ after {s.ddp_steps} step(s): {_ranks_text(mismatched)} "
            + ("differs" if len(mismatched) == 1 else "differ") + " from the others"
        )
    return failures


def _check_probes(results: Mapping[int, dict], lock: Mapping[str, Any]) -> list[str]:
    """(4) every probe matches the lock, and the ranks agree."""
    failures = []
    probes = {}
    for rank, doc in sorted(results.items()):
        probe = doc.get("probe")
        if not isinstance(probe, dict):
            errs = "; ".join(one_line(e, 200) for e in doc.get("errors") or [] if "probe" in str(e))
            failures.append(f"rank {rank}: {errs or 'probe failed: no probe document'}")
            continue
        probes[rank] = probe
        for d in compare_probe_to_lock(probe, lock):
            failures.append(f"rank {rank}: image differs from the lock: {one_line(d, 300)}")
    for name, get in _SAME_EVERYWHERE:
        values = {r: get(p) for r, p in probes.items()}
        if len(set(map(str, values.values()))) > 1:
            failures.append(f"ranks differ in {name}: "
                            + ", ".join(f"rank {r} {one_line(v, 60)}" for r, v in sorted(values.items())))
    return failures


def _check_busbw(s: "Settings", results: Mapping[int, dict]) -> list[str]:
    """(5) the busbw floor at the gate size."""
    ref = reference_rank(results)
    if s.min_busbw_gbps is None or ref is None:
        return []
    entry = next((e for e in results[ref].get("allreduce") or [] if e.get("size_bytes") == s.busbw_size), None)
    if entry is None:
        return [f"no all-reduce measurement at the gate size {s.busbw_size} B"]
    if entry.get("busbw_gbps", 0.0) >= s.min_busbw_gbps:
        return []
    times = entry.get("rank_time_us") or []
    slow = max(range(len(times)), key=lambda i: times[i]) if times else ref
    slow_t = f" ({times[slow]:.1f} us)" if times else ""
    return [f"all-reduce busbw {entry.get('busbw_gbps', 0.0):.4g} GB/s at {s.busbw_size} B is below "
            f"the floor of {s.min_busbw_gbps:g} GB/s ({s.busbw_source}); slowest rank {slow}{slow_t}"]


def judge(s: Settings, launch: LaunchResult, lock: Mapping[str, Any],
          sock: Optional[Mapping[str, Any]] = None) -> dict:
    """Judge a launch; returns the verdict ``{"passed", "exit_code", "failures", "warnings"}``.

    See the module doc for the checks and exit codes. ``sock``: the run's socket setting
    (:func:`socket_settings`; None: not known), for :func:`socket_findings`. Every line
    is one line (text from the ranks and launchers is escaped and cut).
    """
    results = launch.rank_results
    failures, cannot_check, definite = _missing_ranks(s, launch)  # (1) every rank reported
    found, warnings = _check_reports(s, results)
    warnings[:0] = s.warnings
    if launch.timed_out and not launch.missing_ranks:
        warnings.append(f"a node was still running after {s.timeout_s:g} s although every rank "
                        "reported; it was killed")
    for check in (_check_allreduce(s, results), _check_ddp(s, results), _check_probes(results, lock),
                  _check_busbw(s, results)):
        found += check
    failures += found
    definite |= bool(found)

    # NCCL transports: reported, not gated
    if s.backend == "nccl" and s.world_size > 1:
        transports = nccl_log.transports_by_rank(launch.node_logs.values())
        lacking = [r for r in sorted(results) if r not in transports]
        if lacking:
            warnings.append(f"no NCCL transport lines (NCCL_DEBUG=INFO) for {_ranks_text(lacking)}")
    warnings += [f"cleanup: {one_line(err, 400)}" for err in launch.cleanup_errors]
    warnings += [one_line(line, 400) for line in launch.removed_stale]
    # the socket settings the ranks ran with: explain a failing run
    if sock is not None:
        sock_fail, sock_warn = socket_findings(s, launch, sock)
        warnings.extend(sock_warn)
        if failures and sock_fail:
            failures[:0] = sock_fail
            definite = True
    # the launcher's view of the whole run (e.g. the Slurm job's state): explains failures
    notes = [one_line(n, 1000) for n in launch.notes]
    if failures:
        failures[:0] = notes
    else:
        warnings.extend(notes)

    if not failures:
        code = ExitCode.OK
    elif definite or not cannot_check:
        code = ExitCode.CHECK_FAILED
    else:
        code = ExitCode.UNREACHABLE
    return {"passed": not failures, "exit_code": int(code), "failures": failures, "warnings": warnings}


# --------------------------------------------------------------------------- certificate


def _label_subset(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(labels.items())
            if k.startswith(LABEL_PREFIXES) and k != "envbuild.lock"}


def _allreduce_table(results: Mapping[int, dict], world: int) -> list[dict]:
    ref = reference_rank(results)
    if ref is None:
        return []
    rows = []
    for e in results[ref].get("allreduce") or []:
        size = e.get("size_bytes")
        by_rank = list(e.get("wrong_by_rank") or [None] * world)
        by_rank += [None] * (world - len(by_rank))
        for r, doc in results.items():  # each rank's own count wins over the gathered one
            own = next((x for x in doc.get("allreduce") or [] if x.get("size_bytes") == size), None)
            if own is not None and r < world:
                by_rank[r] = own.get("wrong")
        rows.append({
            "size_bytes": size,
            "count": e.get("count"),
            "type": e.get("type"),
            "redop": e.get("redop"),
            "time_us": e.get("time_us"),
            "algbw_gbps": e.get("algbw_gbps"),
            "busbw_gbps": e.get("busbw_gbps"),
            "wrong": sum(x for x in by_rank if x),
            "wrong_by_rank": by_rank,
            "rank_time_us": e.get("rank_time_us"),
        })
    return rows


def _ddp_table(results: Mapping[int, dict]) -> Optional[dict]:
    docs = {r: d["ddp"] for r, d in sorted(results.items()) if d.get("ddp")}
    if not docs:
        return None
    first = docs[min(docs)]
    mismatched = sorted({m for d in docs.values() for m in d.get("mismatched_ranks") or []})
    return {
        "model": first.get("model"),
        "source": first.get("source"),
        "steps": first.get("steps"),
        "batch_size": first.get("batch_size"),
        "image_size": first.get("image_size"),
        "params_identical": all(d.get("params_identical") for d in docs.values()),
        "mismatched_ranks": mismatched,
        "ranks": {
            str(r): {
                "images_per_s": d.get("images_per_s"),
                "wall_s": d.get("wall_s"),
                "final_loss": d.get("final_loss"),
                "param_checksum": d.get("param_checksum"),
            }
            for r, d in docs.items()
        },
    }


def _log_tail(text: str) -> list[str]:
    """The last :data:`LOG_TAIL_LINES` lines of a node log that are not envbuild's own
    progress or result lines, each one escaped line."""
    lines, in_block = [], False
    for line in (text or "").splitlines():
        if line.startswith("@@envbuild-result-"):  # the k8s launcher's result blocks
            in_block = line.startswith("@@envbuild-result-begin")
            continue
        if not in_block and not line.startswith((PROGRESS_PREFIX, RESULT_PREFIX)):
            lines.append(line)
    return [one_line(line, 2000) for line in lines[-LOG_TAIL_LINES:]]


def _nccl_sections(s: "Settings", launch: LaunchResult) -> tuple[Optional[dict], Optional[dict]]:
    """``(transports, nccl)`` of the certificate from the NCCL INFO lines (None on gloo)."""
    if s.backend != "nccl":
        return None, None
    parsed = nccl_log.parse(launch.node_logs.values())
    transports = {str(r): parsed.transports.get(r) for r in range(s.world_size)}
    nccl = {
        "networks": {str(r): v for r, v in parsed.networks.items()},
        "ib_devices": {str(r): v for r, v in parsed.ib_devices.items()},
        "versions": {str(r): v for r, v in parsed.versions.items()},
    }
    return transports, nccl


def _rank_entries(s: "Settings", launch: LaunchResult, lock: Mapping[str, Any]) -> dict:
    """``ranks`` of the certificate: per rank, what it reported or why it did not."""
    ranks = {}
    for r in range(s.world_size):
        doc = launch.rank_results.get(r)
        entry = {"node": r // s.nproc_per_node, "reported": doc is not None}
        if doc is not None:
            entry.update(hostname=doc.get("hostname"), device=doc.get("device"),
                         elapsed_s=doc.get("elapsed_s"), errors=doc.get("errors") or [],
                         fault=doc.get("fault"))
            probe = doc.get("probe")
            entry["lock_mismatches"] = compare_probe_to_lock(probe, lock) if probe else None
        else:
            entry["exit_code"] = launch.rank_exit_codes.get(r)
            if r in launch.rank_problems:
                entry["problem"] = one_line(launch.rank_problems[r], 400)
        if r in launch.progress:
            entry["last_progress"] = dict(launch.progress[r])
        ranks[str(r)] = entry
    return ranks


def build_certificate(
    *,
    image_ref: str,
    image_id: Optional[str],
    repo_digests: Sequence[str],
    labels: Mapping[str, str],
    lock: Mapping[str, Any],
    settings: Settings,
    launch: LaunchResult,
    verdict: dict,
    run_id: str,
    host: Mapping[str, Any],
    sock: Optional[Mapping[str, Any]] = None,
    image_env: Optional[Mapping[str, str]] = None,
) -> dict:
    """The certificate document (schema ``envbuild.certificate/1``); plain JSON data.

    ``cuda_requirement`` (issue 11) records what the certified image needs of a node's
    driver, from the image's own config (``image_env``, its ``Env``): the torch variant's
    CUDA (the lock's) and ``NVIDIA_REQUIRE_CUDA``/``NVIDIA_DISABLE_REQUIRE`` (None when
    unset); absent when ``image_env`` is not given.

    Per-rank maps are keyed by the rank as a string (JSON object keys). ``socket``
    records the interface setting used (:func:`socket_settings`: ``source`` ``image``,
    ``--socket-ifname`` or ``default``) and ``seen_by_ranks``, what each rank saw.
    ``ranks.<r>.last_progress`` is the rank's last progress when the launch gave up.
    """
    s = settings
    results = launch.rank_results
    world = s.world_size
    transports, nccl = _nccl_sections(s, launch)
    nodes = {}
    for n in range(s.nodes):
        nodes[str(n)] = {"name": f"node-{n}", "exit_code": launch.node_exit_codes.get(n)}
        if not verdict["passed"]:
            nodes[str(n)]["log_tail"] = _log_tail(launch.node_logs.get(n) or "")
    socket_doc = None
    if sock is not None:
        socket_doc = {**dict(sock), "seen_by_ranks": {str(r): dict(v) for r, v in sorted(launch.socket_seen.items())}}

    return {
        "schema": CERT_SCHEMA,
        "envbuild_version": __version__,
        "run_id": run_id,
        "image": {
            "ref": image_ref,
            "id": image_id,
            "repo_digests": list(repo_digests),
            "labels": _label_subset(labels),
        },
        "recipe": labels.get("envbuild.recipe") or lock.get("recipe"),
        "lock_hash": labels.get("envbuild.lock-hash"),
        "lock": dict(lock),
        **({"cuda_requirement": cuda_requirement(lock, image_env, image_ref)} if image_env is not None else {}),
        "base_used": labels.get("envbuild.base.used"),
        "backend": {"used": s.backend, "recipe": s.recipe_backend},
        "world_size": world,
        "nodes": s.nodes,
        "gpus_per_node": s.gpus_per_node,
        "nproc_per_node": s.nproc_per_node,
        "settings": {
            "port": s.port, "shm_size": s.shm_size, "timeout_s": s.timeout_s,
            "allreduce": {"sizes": list(s.sizes), "iters": s.iters, "warmup": s.warmup},
            "ddp": {"steps": s.ddp_steps, "batch_size": s.ddp_batch, "image_size": s.ddp_image_size},
        },
        "socket": socket_doc,
        "thresholds": {
            "min_busbw_gbps": s.min_busbw_gbps,
            "busbw_size": s.busbw_size,
            "source": s.busbw_source,
            "recipe_min_busbw_gbps": s.recipe_min_busbw_gbps,
        },
        "probe": {str(r): d.get("probe") for r, d in sorted(results.items())},
        "allreduce": _allreduce_table(results, world),
        "ddp": _ddp_table(results),
        "transports": transports,
        "nccl": nccl,
        "ranks": _rank_entries(s, launch, lock),
        "node_status": nodes,
        "timed_out": launch.timed_out,
        "verdict": verdict,
        "started_at": launch.started_at,
        "finished_at": launch.finished_at,
        "host": dict(host),
    }


def cuda_requirement(lock: Mapping[str, Any], image_env: Mapping[str, str], image_ref: str) -> dict:
    """``{"torch_cuda", "nvidia_require_cuda", "nvidia_disable_require", "source"}``: the
    certified image's CUDA requirement (see :func:`build_certificate`)."""
    return {"torch_cuda": lock.get("cuda"), "nvidia_require_cuda": image_env.get("NVIDIA_REQUIRE_CUDA"),
            "nvidia_disable_require": image_env.get("NVIDIA_DISABLE_REQUIRE"),
            "source": f"config Env of image {image_ref}"}


def certificate_path(images_dir: str | os.PathLike, cert: Mapping[str, Any]) -> Path:
    """``<images_dir>/<recipe>/certificates/<recipe>-<lockhash12>-<UTC stamp>-<run id>.json``.

    The stamp is ``finished_at`` as ``YYYYmmddTHHMMSSZ``; the hash is the lock hash
    without ``sha256:``, first 12 hex digits; the run id makes the name unique per run
    (:func:`write_certificate` adds ``-2``, ``-3``... should it still be taken).
    Characters outside ``[A-Za-z0-9._-]`` in any part become ``_``. Files that belong to
    the certificate (e.g. a report) take the stem of the path written.
    """
    def part(value: object, limit: int) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", str(value))[:limit].lstrip(".") or "_"

    recipe = part(cert.get("recipe") or "unknown", 64)
    h = part(str(cert.get("lock_hash") or "").split(":", 1)[-1][:12] or "nohash", 12)
    stamp = part("".join(ch for ch in str(cert.get("finished_at") or _utc_iso()) if ch.isalnum()), 20)
    run = part(cert.get("run_id") or "norun", 40)
    return image_dir(images_dir, recipe).certificates / f"{recipe}-{h}-{stamp}-{run}.json"


class CertificateNotWritten(Unreachable):
    """The certificate could not be written (exit 3): a full disk, a read-only or
    missing folder. ``certificate`` holds the document, so that the verdict can still
    be shown; ``path`` the file that was being written."""

    def __init__(self, message: str, *, certificate: Mapping[str, Any], path: Path) -> None:
        self.certificate = certificate
        self.path = path
        super().__init__(message, file=str(path))


#: Most ``-N`` suffixes tried for one certificate name.
MAX_NAME_TRIES = 1000


def write_certificate(cert: Mapping[str, Any], images_dir: str | os.PathLike) -> Path:
    """Create the certificate file at :func:`certificate_path`, exclusively: it is written
    to a temporary file in the same folder (fsync'd), then hard-linked to its name, which
    fails when the name exists (``os.link`` never replaces), so no certificate ever
    overwrites another; a taken name gets ``-2``, ``-3``... The temporary file is removed
    in every case. Returns the path.

    Raises:
        CertificateNotWritten: (exit 3) the folder cannot be made or the file not
            written (e.g. ``No space left on device``), naming the file; nothing
            half-written remains.
    """
    path = certificate_path(images_dir, cert)
    data = (json.dumps(cert, indent=2, sort_keys=False) + "\n").encode()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        stem = path.stem
        for n in range(1, MAX_NAME_TRIES + 1):
            target = path if n == 1 else path.with_name(f"{stem}-{n}.json")
            try:
                os.link(tmp, target)
            except FileExistsError:
                continue
            return target
        raise OSError(errno.EEXIST, f"{MAX_NAME_TRIES} certificates of this name exist")
    except OSError as e:
        raise CertificateNotWritten(f"cannot write the certificate: {e.strerror or e}",
                                    certificate=cert, path=path) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _utc_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _host_info(client) -> dict:
    try:
        version = client.version().get("Version")
    except Exception:  # noqa: BLE001 - informational only
        version = None
    return {"hostname": socket.gethostname(), "docker_server_version": version}


# --------------------------------------------------------------------------- certify


def certify(
    client,
    image: str,
    *,
    nodes: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    backend: Optional[str] = None,
    port: Optional[int] = None,
    timeout_s: Optional[float] = None,
    min_busbw_gbps: Optional[float] = None,
    images_dir: str | os.PathLike = Path("images"),
    console=None,
    busbw_size: Optional[int] = None,
    shm_size: Optional[str] = None,
    sizes: Optional[Sequence[int]] = None,
    iters: Optional[int] = None,
    warmup: Optional[int] = None,
    ddp_steps: Optional[int] = None,
    ddp_batch: Optional[int] = None,
    ddp_image_size: Optional[int] = None,
    labels: Optional[Mapping[str, str]] = None,
    extra_env: Optional[Mapping[str, str]] = None,
    launcher: Optional[Launcher] = None,
    run_id: Optional[str] = None,
    gpu_visible: Optional[bool] = None,
    socket_ifname: Optional[str] = None,
) -> tuple[dict, Path]:
    """Certify ``image``: launch, judge, write the certificate (also when it fails).

    Args:
        client: a connected docker client (:func:`builder.image.engine.connect`).
        image: the image (name:tag or ID); must carry envbuild's labels.
        nodes, gpus_per_node, backend, port, timeout_s, min_busbw_gbps: override the
            lock's ``certify`` settings (None: the lock's). ``min_busbw_gbps`` given here
            gates on gloo too.
        images_dir: where ``<recipe>/certificates/`` lives.
        console: a rich Console for progress (None: quiet).
        busbw_size, shm_size, sizes, iters, warmup, ddp_steps, ddp_batch, ddp_image_size:
            further overrides (tests keep runs short with them).
        labels: extra labels on everything the launch creates (tests add their session).
        extra_env: extra environment for every node. TEST-ONLY (e.g.
            ``{"ENVBUILD_BENCH_FAULT": "allreduce-corrupt@1"}``); not a CLI option.
        launcher: the launcher (default: the local Docker one).
        run_id: the run id (default: :func:`builder.image.engine.new_run_id`).
        gpu_visible: skip the GPU detection (default: :func:`gpu_runtime_visible`).
        socket_ifname: ``--socket-ifname``: sets ``GLOO_SOCKET_IFNAME`` and
            ``NCCL_SOCKET_IFNAME`` on the nodes (:func:`check_socket_ifname`); None: the
            image's own settings (its ``ENV``) are certified as they are.

    Returns:
        ``(certificate, path written)``.

    Raises:
        EnvbuildError: (exit 2) no such image, not an envbuild image, nccl without GPUs
            (nothing is started then); (exit 3) the engine failed; (exit 64) bad values.
        CertificateNotWritten: (exit 3) the run was judged but its certificate could not
            be written; the error carries the certificate.
        KeyboardInterrupt: after the launcher removed everything it started.
    """
    check_socket_ifname(socket_ifname)
    image_labels, lock = read_image(client, image)
    image_env = engine.image_env(client, image)
    sock = socket_settings(image_env, socket_ifname)
    if gpu_visible is None:
        gpu_visible = gpu_runtime_visible(client)
    s = resolve_settings(
        lock, gpu_visible=gpu_visible, nodes=nodes, gpus_per_node=gpus_per_node, backend=backend,
        port=port, timeout_s=timeout_s, min_busbw_gbps=min_busbw_gbps, busbw_size=busbw_size,
        shm_size=shm_size, sizes=sizes, iters=iters, warmup=warmup, ddp_steps=ddp_steps,
        ddp_batch=ddp_batch, ddp_image_size=ddp_image_size,
        recipe_backend=image_labels.get("envbuild.backend"),
    )
    try:
        img = client.images.get(image)
        image_id, digests = img.id, list(img.attrs.get("RepoDigests") or [])
    except Exception:  # noqa: BLE001 - read_image just found it; informational
        image_id, digests = None, []
    run_id = run_id or engine.new_run_id()
    spec = LaunchSpec(image=image, nodes=s.nodes, gpus_per_node=s.gpus_per_node, backend=s.backend, port=s.port,
                      shm_size=s.shm_size, timeout_s=s.timeout_s, bench_args=s.bench_args(),
                      env=dict(extra_env or {}), run_id=run_id, labels=dict(labels or {}),
                      socket_ifname=socket_ifname)
    if launcher is None:
        from builder.launchers.local import LocalDockerLauncher

        launcher = LocalDockerLauncher(client)
    launch = _launch(launcher, spec, s, console)
    check_results(launch, spec)
    verdict = judge(s, launch, lock, sock)
    cert = build_certificate(
        image_ref=image, image_id=image_id, repo_digests=digests, labels=image_labels, lock=lock,
        settings=s, launch=launch, verdict=verdict, run_id=run_id, host=_host_info(client), sock=sock,
        image_env=image_env,
    )
    path = write_certificate(cert, images_dir)
    return cert, path


def _launch(launcher: Launcher, spec: LaunchSpec, s: "Settings", console) -> LaunchResult:
    """Run the launcher, with a status line on ``console`` (None: quiet)."""
    head = (f"certify {spec.image}: run {spec.run_id}, {s.nodes} node(s) x {s.nproc_per_node} rank(s), "
            f"backend {s.backend}" + (f" (recipe: {s.recipe_backend})" if s.backend != s.recipe_backend else ""))
    if console is None:
        return launcher.run(spec)
    console.print(head, markup=False, highlight=False, soft_wrap=True)
    with console.status(head) as status:
        return launcher.run(spec, on_progress=lambda msg: status.update(msg))


# --------------------------------------------------------------------------- table


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def log_excerpt(tail: Sequence[str]) -> list[str]:
    """The lines of a node's log tail worth showing: the last Python exception line
    (``OverflowError: ...``; not torchrun's ``ChildFailedError`` wrapper), else the last
    :data:`LOG_SHOW_LINES` non-blank lines."""
    lines = [line.rstrip() for line in tail if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE_RE.match(line.strip()) and "ChildFailedError" not in line:
            return [line.strip()]
    return lines[-LOG_SHOW_LINES:]


def failing_nodes(cert: Mapping[str, Any]) -> list[int]:
    """Nodes that exited non-zero or host a rank that did not report, in order."""
    status = cert.get("node_status") or {}
    bad = {int(n) for n, v in status.items() if v.get("exit_code") not in (None, 0)}
    bad |= {int(r.get("node")) for r in (cert.get("ranks") or {}).values()
            if not r.get("reported") and r.get("node") is not None}
    return sorted(bad)


def print_table(cert: Mapping[str, Any], console, path: Optional[str | os.PathLike] = None,
                written: bool = True) -> None:
    """Print the certificate: the all-reduce table (nccl-tests columns), DDP images/s per
    rank, NCCL transports, and the verdict with its reasons (rich tables). A failing
    verdict is followed by each failing node's log excerpt (:func:`log_excerpt`) and where
    its full tail is (``node_status.<n>.log_tail`` of the certificate at ``path``; not
    said when the certificate was not ``written``)."""
    from rich.table import Table
    from rich.text import Text

    b = cert.get("backend") or {}
    console.print(
        f"{cert.get('image', {}).get('ref')}: recipe {cert.get('recipe')}, lock "
        f"{str(cert.get('lock_hash') or '').split(':')[-1][:12]}, backend {b.get('used')}"
        + (f" (recipe: {b.get('recipe')})" if b.get("used") != b.get("recipe") else "")
        + f", {cert.get('nodes')} node(s) x {cert.get('nproc_per_node')} = world {cert.get('world_size')}",
        markup=False, highlight=False, soft_wrap=True,
    )
    th = cert.get("thresholds") or {}
    t = Table(title="all-reduce (sum)", title_justify="left")
    for col in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
        t.add_column(col, justify="right")
    for row in cert.get("allreduce") or []:
        gate = th.get("min_busbw_gbps") is not None and row.get("size_bytes") == th.get("busbw_size")
        t.add_row(
            str(row.get("size_bytes")), str(row.get("count")), str(row.get("type")),
            _fmt(row.get("time_us"), ".2f"), _fmt(row.get("algbw_gbps"), ".3f"),
            Text(_fmt(row.get("busbw_gbps"), ".3f") + (" *" if gate else "")),
            Text(str(row.get("wrong")), style="red" if row.get("wrong") else ""),
        )
    console.print(t)
    if th.get("min_busbw_gbps") is not None:
        console.print(f"* gate: busbw >= {th['min_busbw_gbps']:g} GB/s at {th.get('busbw_size')} B "
                      f"({th.get('source')})", markup=False, highlight=False)
    ddp = cert.get("ddp")
    if ddp:
        d = Table(title=f"DDP {ddp.get('model')} ({ddp.get('source')}): {ddp.get('steps')} step(s) x "
                        f"{ddp.get('batch_size')} images {ddp.get('image_size')}px", title_justify="left")
        for col in ("rank", "images/s", "param checksum", "identical"):
            d.add_column(col, justify="right" if col != "param checksum" else "left")
        mism = set(ddp.get("mismatched_ranks") or [])
        for r, v in sorted((ddp.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
            d.add_row(r, _fmt(v.get("images_per_s"), ".2f"), str(v.get("param_checksum") or "-")[:16],
                      Text("no", style="red") if int(r) in mism else Text("yes"))
        console.print(d)
    tr = cert.get("transports")
    if tr:
        n = Table(title="NCCL transports", title_justify="left")
        n.add_column("rank", justify="right")
        n.add_column("transports")
        n.add_column("network")
        nets = (cert.get("nccl") or {}).get("networks") or {}
        for r, v in sorted(tr.items(), key=lambda kv: int(kv[0])):
            n.add_row(r, ", ".join(v) if v else "-", nets.get(r, "-"))
        console.print(n)
    v = cert.get("verdict") or {}
    if v.get("passed"):
        console.print(Text("verdict: PASSED", style="bold green"))
    else:
        console.print(Text(f"verdict: FAILED (exit {v.get('exit_code')})", style="bold red"))
    for f in v.get("failures") or []:
        console.print(Text("  fail: ", style="red") + Text(f), soft_wrap=True)
    for w in v.get("warnings") or []:
        console.print(Text("  warning: ", style="yellow") + Text(w), soft_wrap=True)
    if v.get("passed"):
        return
    where = f"the certificate {path}" if path is not None else "the certificate"
    for n in failing_nodes(cert):
        excerpt = log_excerpt(((cert.get("node_status") or {}).get(str(n)) or {}).get("log_tail") or [])
        if not excerpt:
            continue
        if len(excerpt) == 1:
            console.print(Text(f"  node {n} log: ", style="red") + Text(excerpt[0]), soft_wrap=True)
        else:
            console.print(Text(f"  node {n} log (last {len(excerpt)} lines):", style="red"), soft_wrap=True)
            for line in excerpt:
                console.print(Text(f"    {line}"), soft_wrap=True)
        if written:
            console.print(Text(f"  (full tail: node_status.{n}.log_tail in {where})"), soft_wrap=True)
