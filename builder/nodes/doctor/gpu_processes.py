"""The ``gpu-processes`` check: no NVML compute process holding GPU memory (pytorch#5736, #12166)."""

from __future__ import annotations

from ..report import Node
from .base import FAIL, PASS, SKIP, Check, human_bytes, no_answer


def check_gpu_processes(nodes: list[Node]) -> Check:
    none = no_answer("gpu-processes", nodes)
    if none:
        return none
    lines, gpus = [], 0
    for n in nodes:
        if not n.ok or n.report is None:
            continue
        gpus += len(n.report.gpus)
        for p in n.report.gpu_processes or []:
            name = f" ({p.name})" if p.name else ""
            lines.append(f"{n.name} GPU {p.gpu_index} ({p.gpu_uuid}): pid {p.pid}{name} holds "
                         f"{human_bytes(p.used_memory_bytes)}")
    if lines:
        return Check("gpu-processes", FAIL, "; ".join(lines),
                     "stop these processes (a crashed earlier run?); `envbuild doctor --fix` removes stale "
                     "envbuild containers and never kills other processes", lines)
    if not gpus:
        return Check("gpu-processes", SKIP, "no GPUs reported")
    return Check("gpu-processes", PASS, f"no compute processes on {gpus} GPUs")
