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

One module per check (:mod:`.nodes`, :mod:`.port`, :mod:`.interface` with the shared
round of :mod:`.network`, :mod:`.shm`, :mod:`.gpu_uuid`, :mod:`.gpu_processes`,
:mod:`.stale_containers`, :mod:`.straggler`), the run (:mod:`.runner`) and the output
(:mod:`.render`).

Statuses and exit codes follow Meta GCM's health checks, worst wins: pass and skip 0,
warn 1, fail 2, unknown 3. Checks that need live nodes (port, straggler, the reachability
part of interface) are skipped for report files.
"""

from __future__ import annotations

from .base import (
                   ALL_CHECKS,
                   DEFAULT_MIN_SHM,
                   DEFAULT_PORT,
                   DEFAULT_STALE_AFTER_S,
                   DEFAULT_STRAGGLER_RATIO,
                   FAIL,
                   PASS,
                   SKIP,
                   UNKNOWN,
                   WARN,
                   Check,
                   Options,
                   human_bytes,
                   parse_size,
)
from .render import render
from .runner import DoctorResult, doctor
from .stale_containers import stale_containers

__all__ = ["ALL_CHECKS", "DEFAULT_MIN_SHM", "DEFAULT_PORT", "DEFAULT_STALE_AFTER_S", "DEFAULT_STRAGGLER_RATIO",
           "FAIL", "PASS", "SKIP", "UNKNOWN", "WARN", "Check", "DoctorResult", "Options", "doctor", "human_bytes",
           "parse_size", "render", "stale_containers"]
