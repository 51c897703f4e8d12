"""The ``shm`` check: ``/dev/shm`` at least ``--min-shm`` on every node (NVIDIA/nccl#290:
posix_fallocate failed in containers with Docker's 64 MB default)."""

from __future__ import annotations

from ..report import Node
from .base import FAIL, PASS, SKIP, Check, human_bytes, no_answer


def check_shm(nodes: list[Node], min_bytes: int) -> Check:
    none = no_answer("shm", nodes)
    if none:
        return none
    small, unknown = [], []
    ok = [(n, n.report) for n in nodes if n.ok and n.report is not None]
    for n, r in ok:
        size = r.shm.size_bytes if r.shm else None
        if size is None:
            unknown.append(n.name)
        elif size < min_bytes:
            small.append(f"{n.name}: /dev/shm is {human_bytes(size)}, below {human_bytes(min_bytes)}")
    fix = ("give each container --shm-size=1g (recipe certify.shm_size) or --ipc=host; NCCL keeps its "
           "intra-node buffers in /dev/shm (NVIDIA/nccl#290: posix_fallocate failed)")
    if small:
        return Check("shm", FAIL, "; ".join(small), fix, small)
    if unknown:
        return Check("shm", SKIP, f"/dev/shm size not reported by {', '.join(unknown)}", checked=len(unknown) < len(ok))
    return Check("shm", PASS, f"/dev/shm >= {human_bytes(min_bytes)} on every node")
