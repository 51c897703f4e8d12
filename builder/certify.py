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
4. every rank's probe matches the lock (:func:`builder.lockcheck.compare_probe_to_lock`),
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

import datetime
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from builder import __version__, compat, engine, lockcheck, nccl_log
from builder.errors import EnvbuildError, ExitCode
from builder.files import write_atomic
from builder.launchers.base import LaunchResult, LaunchSpec, Launcher

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


# --------------------------------------------------------------------------- image


def read_image(client, image: str) -> tuple[dict[str, str], dict]:
    """``(labels, lock)`` of ``image``: the label ``envbuild.lock`` read with bounds and
    checked with the recipe's schema (:func:`builder.compat.read_lock_text`), then against
    its hash label (:func:`lock_from_labels`).

    Raises:
        EnvbuildError: (exit 2) no such image; a lock label over 1 MiB, not bounded JSON or
            breaking the schema (``IMAGE: label envbuild.lock: certify.nodes: 'abc' must be
            an integer in 1..1024``); see :func:`lock_from_labels`.
    """
    labels = engine.image_labels(client, image)
    if labels.get("envbuild.lock"):
        compat.read_lock_text(labels["envbuild.lock"], f"{image}: label envbuild.lock")
    return labels, lock_from_labels(labels, image)


def lock_from_labels(labels: Mapping[str, str], image: str) -> dict:
    """The lock in the labels of ``image``: ``envbuild.lock`` parsed, checked against
    ``envbuild.lock-hash`` (:func:`builder.compat.lock_hash` of the parsed lock, as the
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
    actual, said = compat.lock_hash(lock), labels["envbuild.lock-hash"]
    if actual != said:
        raise EnvbuildError(
            f"label envbuild.lock was changed after the build: it hashes to {actual}, label "
            f"envbuild.lock-hash says {said}; rebuild the image with `envbuild build RECIPE`",
            field="image", value=image)
    return lock


# --------------------------------------------------------------------------- probe vs lock


def compare_probe_to_lock(probe: Mapping, lock: Mapping) -> list[str]:
    """Differences between a probe document and the lock, one line each ([] = match);
    :func:`builder.lockcheck.compare_probe_to_lock`."""
    return list(lockcheck.compare_probe_to_lock(dict(probe), dict(lock)))


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


def _missing_reason(rank: int, s: Settings, launch: LaunchResult, node: int) -> tuple[str, bool]:
    """(failure line, could-not-check?) for a rank without a result."""
    if rank in launch.rank_problems:
        return f"rank {rank}: {launch.rank_problems[rank]}", True
    code = launch.rank_exit_codes.get(rank)
    if code is not None:
        if code < 0:
            return f"rank {rank} was killed by signal {-code}", False
        return f"rank {rank} exited with {code}", False
    if launch.timed_out:
        limit = launch.deadline_s if launch.deadline_s is not None else s.timeout_s
        return f"rank {rank} did not finish within {limit:g} s (timeout)", True
    ncode = launch.node_exit_codes.get(node)
    if ncode is None and launch.killed_after_s is not None:
        return (f"rank {rank} did not finish: killed {launch.killed_after_s:g} s after another "
                "node failed"), False
    if ncode not in (None, 0):
        return f"rank {rank} wrote no result: node {node} exited with {ncode}", False
    return f"rank {rank} wrote no result (node {node} exited with {ncode})", False


def reference_rank(results: Mapping[int, dict]) -> Optional[int]:
    """The rank whose tables the certificate shows: the lowest that reported (0 normally)."""
    return min(results) if results else None


def judge(s: Settings, launch: LaunchResult, lock: Mapping[str, Any]) -> dict:
    """Judge a launch; returns the verdict ``{"passed", "exit_code", "failures", "warnings"}``.

    See the module doc for the checks and exit codes.
    """
    failures: list[str] = []
    warnings: list[str] = list(s.warnings)
    cannot_check = False
    definite = False
    results = launch.rank_results
    world = s.world_size

    # (1) every rank reported
    for rank in range(world):
        if rank in results:
            continue
        line, unknown = _missing_reason(rank, s, launch, rank // s.nproc_per_node)
        failures.append(line)
        cannot_check |= unknown
        definite |= not unknown
    for rank, doc in sorted(results.items()):
        if doc.get("world_size") != world:
            failures.append(f"rank {rank}: world size {doc.get('world_size')}, expected {world}")
            definite = True
        if doc.get("backend") != s.backend:
            failures.append(f"rank {rank}: ran backend {doc.get('backend')}, expected {s.backend}")
            definite = True
        for err in doc.get("errors") or []:
            warnings.append(f"rank {rank}: {err}")
    if launch.timed_out and not launch.missing_ranks:
        warnings.append(f"a node was still running after {s.timeout_s:g} s although every rank "
                        "reported; it was killed")

    # (2) exact all-reduce on every rank at every size
    for rank, doc in sorted(results.items()):
        bad = [(e.get("size_bytes"), e.get("wrong")) for e in doc.get("allreduce") or [] if e.get("wrong")]
        if bad:
            where = ", ".join(f"{size} B ({n} wrong element{'s' if n != 1 else ''})" for size, n in bad)
            failures.append(f"rank {rank}: all-reduce sum wrong at {where}")
            definite = True
        measured = {e.get("size_bytes") for e in doc.get("allreduce") or []}
        lacking = [x for x in s.sizes if x not in measured]
        if lacking:
            failures.append(f"rank {rank}: no all-reduce result at {', '.join(map(str, lacking))} B")
            definite = True

    # (3) DDP: identical parameters everywhere
    if s.ddp_steps > 0:
        mismatched: set[int] = set()
        for rank, doc in sorted(results.items()):
            ddp = doc.get("ddp")
            if not ddp:
                failures.append(f"rank {rank}: no DDP result")
                definite = True
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
            definite = True

    # (4) probe vs lock, and the same everywhere
    probes = {}
    for rank, doc in sorted(results.items()):
        probe = doc.get("probe")
        if not isinstance(probe, dict):
            errs = "; ".join(e for e in doc.get("errors") or [] if "probe" in e)
            failures.append(f"rank {rank}: {errs or 'probe failed: no probe document'}")
            definite = True
            continue
        probes[rank] = probe
        for d in compare_probe_to_lock(probe, lock):
            failures.append(f"rank {rank}: image differs from the lock: {d}")
            definite = True
    for name, get in _SAME_EVERYWHERE:
        values = {r: get(p) for r, p in probes.items()}
        if len(set(map(str, values.values()))) > 1:
            failures.append(f"ranks differ in {name}: "
                            + ", ".join(f"rank {r} {v}" for r, v in sorted(values.items())))
            definite = True

    # (5) busbw floor at the gate size
    ref = reference_rank(results)
    if s.min_busbw_gbps is not None and ref is not None:
        entry = next((e for e in results[ref].get("allreduce") or [] if e.get("size_bytes") == s.busbw_size), None)
        if entry is None:
            failures.append(f"no all-reduce measurement at the gate size {s.busbw_size} B")
            definite = True
        elif entry.get("busbw_gbps", 0.0) < s.min_busbw_gbps:
            times = entry.get("rank_time_us") or []
            slow = max(range(len(times)), key=lambda i: times[i]) if times else ref
            slow_t = f" ({times[slow]:.1f} us)" if times else ""
            failures.append(
                f"all-reduce busbw {entry.get('busbw_gbps', 0.0):.4g} GB/s at {s.busbw_size} B is below "
                f"the floor of {s.min_busbw_gbps:g} GB/s ({s.busbw_source}); slowest rank {slow}{slow_t}"
            )
            definite = True

    # NCCL transports: reported, not gated
    if s.backend == "nccl" and world > 1:
        found = nccl_log.transports_by_rank(launch.node_logs.values())
        lacking = [r for r in sorted(results) if r not in found]
        if lacking:
            warnings.append(f"no NCCL transport lines (NCCL_DEBUG=INFO) for {_ranks_text(lacking)}")
    for err in launch.cleanup_errors:
        warnings.append(f"cleanup: {err}")
    # the launcher's view of the whole run (e.g. the Slurm job's state): explains failures
    if failures:
        failures[:0] = launch.notes
    else:
        warnings.extend(launch.notes)

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
) -> dict:
    """The certificate document (schema ``envbuild.certificate/1``); plain JSON data.

    Per-rank maps are keyed by the rank as a string (JSON object keys).
    """
    s = settings
    results = launch.rank_results
    world = s.world_size
    ranks = {}
    for r in range(world):
        doc = results.get(r)
        node = r // s.nproc_per_node
        entry = {"node": node, "reported": doc is not None}
        if doc is not None:
            entry.update(hostname=doc.get("hostname"), device=doc.get("device"),
                         elapsed_s=doc.get("elapsed_s"), errors=doc.get("errors") or [],
                         fault=doc.get("fault"))
            probe = doc.get("probe")
            entry["lock_mismatches"] = compare_probe_to_lock(probe, lock) if probe else None
        else:
            entry["exit_code"] = launch.rank_exit_codes.get(r)
            if r in launch.rank_problems:
                entry["problem"] = launch.rank_problems[r]
        ranks[str(r)] = entry

    transports = nccl = None
    if s.backend == "nccl":
        parsed = nccl_log.parse(launch.node_logs.values())
        transports = {str(r): parsed.transports.get(r) for r in range(world)}
        nccl = {
            "networks": {str(r): v for r, v in parsed.networks.items()},
            "ib_devices": {str(r): v for r, v in parsed.ib_devices.items()},
            "versions": {str(r): v for r, v in parsed.versions.items()},
        }

    nodes = {}
    for n in range(s.nodes):
        nodes[str(n)] = {"name": f"node-{n}", "exit_code": launch.node_exit_codes.get(n)}
        if not verdict["passed"]:
            tail = (launch.node_logs.get(n) or "").splitlines()[-LOG_TAIL_LINES:]
            nodes[str(n)]["log_tail"] = tail

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
        "ranks": ranks,
        "node_status": nodes,
        "timed_out": launch.timed_out,
        "verdict": verdict,
        "started_at": launch.started_at,
        "finished_at": launch.finished_at,
        "host": dict(host),
    }


def certificate_path(images_dir: str | os.PathLike, cert: Mapping[str, Any]) -> Path:
    """``<images_dir>/<recipe>/certificates/<recipe>-<lockhash12>-<UTC stamp>.json``.

    The stamp is ``finished_at`` as ``YYYYmmddTHHMMSSZ``; the hash is the lock hash
    without ``sha256:``, first 12 hex digits.
    """
    recipe = cert.get("recipe") or "unknown"
    h = str(cert.get("lock_hash") or "").split(":", 1)[-1][:12] or "nohash"
    stamp = "".join(ch for ch in str(cert.get("finished_at") or _utc_iso()) if ch.isalnum())
    return Path(images_dir) / recipe / "certificates" / f"{recipe}-{h}-{stamp}.json"


def write_certificate(cert: Mapping[str, Any], images_dir: str | os.PathLike) -> Path:
    """Write ``cert`` atomically (temporary file in the same folder, then rename) at
    :func:`certificate_path`; a name already taken gets ``-2``, ``-3``... Returns the path."""
    path = certificate_path(images_dir, cert)
    path.parent.mkdir(parents=True, exist_ok=True)
    stem, n = path.stem, 1
    while path.exists():
        n += 1
        path = path.with_name(f"{stem}-{n}.json")
    return write_atomic(path, (json.dumps(cert, indent=2, sort_keys=False) + "\n").encode())


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
) -> tuple[dict, Path]:
    """Certify ``image``: launch, judge, write the certificate (also when it fails).

    Args:
        client: a connected docker client (:func:`builder.engine.connect`).
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
        run_id: the run id (default: :func:`builder.engine.new_run_id`).
        gpu_visible: skip the GPU detection (default: :func:`gpu_runtime_visible`).

    Returns:
        ``(certificate, path written)``.

    Raises:
        EnvbuildError: (exit 2) no such image, not an envbuild image, nccl without GPUs
            (nothing is started then); (exit 3) the engine failed; (exit 64) bad values.
        KeyboardInterrupt: after the launcher removed everything it started.
    """
    image_labels, lock = read_image(client, image)
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
    spec = LaunchSpec(
        image=image,
        nodes=s.nodes,
        gpus_per_node=s.gpus_per_node,
        backend=s.backend,
        port=s.port,
        shm_size=s.shm_size,
        timeout_s=s.timeout_s,
        bench_args=s.bench_args(),
        env=dict(extra_env or {}),
        run_id=run_id,
        labels=dict(labels or {}),
    )
    if launcher is None:
        from builder.launchers.local import LocalDockerLauncher

        launcher = LocalDockerLauncher(client)
    head = (f"certify {image}: run {run_id}, {s.nodes} node(s) x {s.nproc_per_node} rank(s), "
            f"backend {s.backend}" + (f" (recipe: {s.recipe_backend})" if s.backend != s.recipe_backend else ""))
    if console is not None:
        console.print(head, markup=False, highlight=False, soft_wrap=True)
        with console.status(head) as status:
            launch = launcher.run(spec, on_progress=lambda msg: status.update(msg))
    else:
        launch = launcher.run(spec)

    verdict = judge(s, launch, lock)
    cert = build_certificate(
        image_ref=image, image_id=image_id, repo_digests=digests, labels=image_labels, lock=lock,
        settings=s, launch=launch, verdict=verdict, run_id=run_id, host=_host_info(client),
    )
    path = write_certificate(cert, images_dir)
    return cert, path


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


def print_table(cert: Mapping[str, Any], console, path: Optional[str | os.PathLike] = None) -> None:
    """Print the certificate: the all-reduce table (nccl-tests columns), DDP images/s per
    rank, NCCL transports, and the verdict with its reasons (rich tables). A failing
    verdict is followed by each failing node's log excerpt (:func:`log_excerpt`) and where
    its full tail is (``node_status.<n>.log_tail`` of the certificate at ``path``)."""
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
        console.print(Text(f"  (full tail: node_status.{n}.log_tail in {where})"), soft_wrap=True)
