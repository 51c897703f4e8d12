"""The ``gpu-uuid`` check: no GPU UUID on two ranks (NVIDIA/nccl#1241 "Duplicate GPU detected")."""

from __future__ import annotations

from ..report import Node
from .base import FAIL, PASS, SKIP, Check, no_answer


def check_gpu_uuid(nodes: list[Node]) -> Check:
    none = no_answer("gpu-uuid", nodes)
    if none:
        return none
    seen: dict[str, list[str]] = {}
    for n in nodes:
        if n.ok and n.report is not None:
            for g in n.report.gpus:
                seen.setdefault(g.uuid, []).append(f"{n.name} (GPU {g.index})")
    if not seen:
        return Check("gpu-uuid", SKIP, "no GPUs reported")
    dups = [f"{uuid} on {', '.join(where)}" for uuid, where in seen.items() if len(where) > 1]
    if dups:
        return Check("gpu-uuid", FAIL, "duplicate GPU: " + "; ".join(dups),
                     "give every rank its own GPU (CUDA_VISIBLE_DEVICES, docker --gpus device=N); NCCL "
                     "refuses two ranks on one GPU ('Duplicate GPU detected', NVIDIA/nccl#1241)", dups)
    return Check("gpu-uuid", PASS, f"{len(seen)} GPUs, each UUID on one rank")
