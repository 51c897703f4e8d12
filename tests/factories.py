"""One factory for the documents the tests build: node reports (``envbuild.probe/1``, the
shape of :class:`builder.nodes.report.NodeReport`) and rank results (``envbuild.rank-result/3``,
:class:`builder.core.documents.RankResult`). Tests say only what differs from a passing
document; no test writes one of these documents by hand.

- :func:`node_report` / :func:`gpu_report`: a complete report of a GPU node (H100, cu128) or,
  with ``base=CPU_REPORT``, of a cpu-torch2 node; ``changes`` are dotted paths.
- :func:`rank_result`: the model's defaults (``RankResult(schema, rank, world_size)``) filled
  with what a passing gloo rank of the bench writes (exact all-reduce at ``sizes``, identical
  DDP parameters, the rank's probe), then the fields given replaced.

The base documents are checked against their models on first use (a model change fails here,
once, naming the field); the changes are applied after the check, so a test can build the
invalid documents its fault twins need. Plain JSON data comes back (dicts, lists).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from builder.core.documents import RESULT_SCHEMA, NodeReport, RankResult
from builder.core.model import convert

# --------------------------------------------------------------------------- node reports

#: A complete ``envbuild.probe/1`` report of a GPU node, written by hand (values as NVML,
#: torch and the kernel report them on an H100 node with the cu128 wheel).
GPU_REPORT: dict[str, Any] = {
    "schema": "envbuild.probe/1",
    "hostname": "node-1",
    "kernel": "6.8.0-49-generic",
    "os": {"id": "ubuntu", "version_id": "24.04", "pretty_name": "Ubuntu 24.04.1 LTS"},
    "glibc": "2.39",
    "python": {"version": "3.12.3", "executable": "/opt/venv/bin/python3"},
    "torch": {"version": "2.8.0+cu128", "cuda": "12.8", "cuda_available": True, "cudnn": "91002",
              "nccl_compiled": "2.27.3"},
    "nccl": {
        "loaded": {"version": "2.27.3", "code": 22703,
                   "path": "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"},
        "found": [{"path": "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
                   "realpath": "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
                   "version": "2.27.3", "code": 22703, "error": None}],
        "pip_packages": {"nvidia-nccl-cu12": "2.27.3"},
    },
    "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d01",
              "pci_bus_id": "00000000:18:00.0", "memory_total_bytes": 85520809984, "pci_id": "10de:2330"}],
    "driver": "570.124.06",
    "env": {"NCCL_SOCKET_IFNAME": "eth0"},
    "container": {"runtime": "docker", "version": "27.3.1", "installed": {}},
    "image": {"ref": "registry.example/envbuild/cuda12-torch2@sha256:" + "ab" * 32,
              "digest": "sha256:" + "ab" * 32, "id": "sha256:" + "cd" * 32},
    "network": {
        "interfaces": [
            {"name": "lo", "index": 1, "up": True, "loopback": True, "mtu": 65536,
             "addresses": [{"family": "inet", "address": "127.0.0.1", "prefixlen": 8}]},
            {"name": "eth0", "index": 2, "up": True, "loopback": False, "mtu": 9000,
             "addresses": [{"family": "inet", "address": "10.0.0.11", "prefixlen": 24}]},
        ],
        "default_route_interface": "eth0",
        "hostname_addresses": ["10.0.0.11"],
        "ip_local_port_range": [32768, 60999],
    },
    "shm": {"path": "/dev/shm", "size_bytes": 1073741824, "free_bytes": 1073741824},
    "gpu_processes": [],
    "errors": [],
}

#: A complete ``envbuild.probe/1`` report of a cpu-torch2 node (Debian 12, Python 3.11.2,
#: torch 2.13.0+cpu, no GPU), as the in-image probe writes it.
CPU_REPORT: dict[str, Any] = {
    "schema": "envbuild.probe/1",
    "hostname": "node-0",
    "kernel": "6.1.0-28-amd64",
    "os": {"id": "debian", "version_id": "12", "pretty_name": "Debian GNU/Linux 12 (bookworm)"},
    "glibc": "2.36",
    "python": {"version": "3.11.2", "executable": "/opt/venv/bin/python3"},
    "torch": {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "cudnn": None,
              "nccl_compiled": None},
    "nccl": {"loaded": None, "found": [], "pip_packages": {}},
    "gpus": [],
    "driver": None,
    "env": {},
    "errors": [],
}


@functools.cache
def _checked(name: str) -> bool:
    """Check the base document ``name`` against its model once (ManyErrors names the field)."""
    base = {"GPU_REPORT": (GPU_REPORT, NodeReport), "CPU_REPORT": (CPU_REPORT, NodeReport)}[name]
    convert(base[0], base[1], file=f"tests/factories.py:{name}")
    return True


def set_path(doc: dict, path: str, value) -> dict:
    """Set ``doc[a][b][0]...`` for the dotted ``path`` ``"a.b.0"`` (a number indexes a
    list) to ``value``; returns ``doc``."""
    cur = doc
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    if isinstance(cur, list):
        cur[int(parts[-1])] = value
    else:
        cur[parts[-1]] = value
    return doc


def node_report(base: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    """A copy of ``base`` (:data:`GPU_REPORT` by default; :data:`CPU_REPORT`) with ``changes``
    applied: keys are dotted paths (``gpus.0.uuid``), values replace."""
    base = GPU_REPORT if base is None else base
    _checked("CPU_REPORT" if base is CPU_REPORT else "GPU_REPORT")
    doc = copy.deepcopy(base)
    for path, value in changes.items():
        set_path(doc, path, value)
    return doc


def gpu_report(n: int, **changes) -> dict:
    """:data:`GPU_REPORT` for node ``node-n`` (own hostname, address 10.0.0.1n, GPU UUID
    ending in n), then ``changes`` applied: keys are dotted paths (a number indexes a
    list: ``gpus.0.uuid``), values replace."""
    doc = node_report()
    doc["hostname"] = f"node-{n}"
    doc["gpus"][0]["uuid"] = f"GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d{n:02d}"
    doc["network"]["interfaces"][1]["addresses"][0]["address"] = f"10.0.0.{10 + n}"
    doc["network"]["hostname_addresses"] = [f"10.0.0.{10 + n}"]
    for path, value in changes.items():
        set_path(doc, path, value)
    return doc


# --------------------------------------------------------------------------- rank results


def allreduce_entries(rank: int, world: int, sizes=(8, 1024, 65536), *, wrong: int = 0, times=None,
                      busbw: float = 0.05) -> list[dict[str, Any]]:
    """The bench's ``allreduce`` rows of ``rank`` for float32 sums at ``sizes`` (bytes): its
    own ``wrong`` wrong elements (0 = exact), the per-rank times ``times`` in µs (default 100 +
    rank) summarized (min, median, max, slowest), algbw = busbw = ``busbw`` GB/s."""
    times = list(times or [100.0 + r for r in range(world)])
    order = sorted(times)
    n = len(order)
    median = order[n // 2] if n % 2 else (order[n // 2 - 1] + order[n // 2]) / 2
    entries = []
    for size in sizes:
        entries.append({
            "size_bytes": size, "count": size // 4, "type": "float32", "redop": "sum",
            "time_us": max(times), "min_time_us": min(times), "median_time_us": median,
            "slowest_rank": times.index(max(times)),
            "algbw_gbps": busbw, "busbw_gbps": busbw, "wrong": wrong,
            "own_time_us": times[rank] if rank < n else times[-1], "own_wrong": wrong,
        })
    return entries


def profiles_result(rank: int, world: int, sizes=(8, 1024, 65536), *, wrong: int = 0, times=None,
                    busbw: float = 0.05, match: bool = True) -> dict[str, Any]:
    """The bench's ``profiles`` section of the ddp profile: all_reduce and broadcast rows
    (:func:`allreduce_entries`), the DDP check matching its reference when ``match``."""
    rows = allreduce_entries(rank, world, sizes, wrong=wrong, times=times, busbw=busbw)
    losses = [6.9, 6.8, 6.7]
    return {"profiles": ["ddp"], "world_size": world, "backend": "gloo", "device": "cpu",
            "dtypes": ["float32"], "sizes": list(sizes), "iters": 10, "warmup": 2, "seed": 0,
            "collectives": {"all_reduce": rows, "broadcast": allreduce_entries(rank, world, sizes, busbw=busbw)},
            "training": {"ddp": {"reference_match": match, "losses_match": True, "params_match": match,
                                 "tolerance": {"rtol": 1e-5, "atol": 1e-8}, "losses": losses,
                                 "reference_losses": losses, "max_param_diff": 0.0 if match else 0.5,
                                 "samples_per_s": 12.0 + rank, "steps": 3, "model": "resnet18 (builtin)"}},
            "wall_s": {}}


def rank_result(rank: int = 0, world_size: int = 2, **fields: Any) -> dict[str, Any]:
    """A passing ``envbuild.rank-result/3`` of ``rank`` in a gloo run of ``world_size`` ranks:
    the model's defaults, then the bench's fields (run ``0123456789ab``, host ``node-<rank>``,
    the ddp profile exact at 8, 1024 and 65536 bytes (:func:`profiles_result`), the :data:`CPU_REPORT` probe with the
    rank's hostname), then ``fields`` (top-level keys) replaced."""
    doc = RankResult(schema=RESULT_SCHEMA, rank=rank, world_size=world_size).to_dict()
    probe = node_report(CPU_REPORT, hostname=f"node-{rank}")
    doc.update({
        "run_id": "0123456789ab", "local_rank": 0, "node_rank": rank, "hostname": f"node-{rank}",
        "backend": "gloo", "device": "cpu", "options": {},
        "profiles": profiles_result(rank, world_size),
        "probe": probe, "started_at": "2026-05-12T10:00:00.000Z",
        "finished_at": "2026-05-12T10:00:05.000Z", "elapsed_s": 5.0,
    })
    doc.update(fields)
    return doc


def lock_of(certify: dict | None = None, **top: Any):
    """A whole lock: images/cpu-torch2's, with ``top`` fields replaced and its certify section
    ``certify`` over the one default table (as a rendered lock would have it)."""
    import json
    from pathlib import Path

    import msgspec

    from builder.recipe.lock import validate_lock
    from builder.recipe.model import CertifySettings, lock_certify

    doc = json.loads((Path(__file__).resolve().parents[1] / "images" / "cpu-torch2" / "envbuild.lock.json").read_text())
    section = lock_certify(convert(certify or {}, CertifySettings))
    return validate_lock({**doc, **top, "certify": msgspec.to_builtins(section)}, "lock_of")
