"""Scaling: the DDP check's step timed at world size 1 (rank 0 alone, in ``new_group([0])`` so DDP's hooks stay in the
step) and at N; efficiency = t1 / tN. 1.0 is perfect weak scaling; CPU ranks sharing cores and memory bandwidth score
below that by construction (that is what it measures)."""

from __future__ import annotations

from typing import Any

from . import training

DEFAULT_STEPS = 3
DEFAULT_WARMUP = 1


def efficiency(throughput_1: float, throughput_n: float, world: int) -> float | None:
    """``throughput_n / (world * throughput_1)``; None when undefined."""
    if throughput_1 <= 0 or world < 1:
        return None
    return throughput_n / (world * throughput_1)


def _timed_steps(torch, ddp, opt, x, y, device: str, warmup: int, steps: int) -> float:
    import torch.nn.functional as F

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()

    ddp.train()
    for _ in range(warmup):
        step()
    _, wall = training.timed(torch, device, lambda: [step() for _ in range(steps)])
    return wall


def run_scaling(seed: int, device: str, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                batch: int = 4, image_size: int = 32) -> dict[str, Any]:
    """Time the DDP step at world size 1 and N; throughputs in images/s, times in s, the same on every rank."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .train_ddp import LR, MOMENTUM, NUM_CLASSES, build_resnet18, make_data

    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = device.startswith("cuda")
    ids = [int(device.split(":")[1])] if cuda else None
    x, y = make_data(torch, seed + rank, 1, batch, image_size, NUM_CLASSES)[0]
    x, y = x.to(device), y.to(device)
    solo = dist.new_group([0])
    torch.manual_seed(seed)
    model, source = build_resnet18()
    model = model.to(device)
    t1 = 0.0
    if rank == 0:
        ddp = DDP(model, device_ids=ids, process_group=solo)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
        t1 = _timed_steps(torch, ddp, opt, x, y, device, warmup, steps)
        del ddp, opt
    dist.barrier()
    ddp = DDP(model, device_ids=ids)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    tn = _timed_steps(torch, ddp, opt, x, y, device, warmup, steps)
    t1, tn = training.max_over_ranks(torch, dist, device, [t1, tn])
    thr1 = steps * batch / t1 if t1 > 0 else 0.0
    thrn = steps * batch * world / tn if tn > 0 else 0.0
    return {"model": f"resnet18 ({source})", "batch_per_rank": batch, "image_size": image_size, "steps": steps,
            "world_size": world, "throughput_1": thr1, "throughput_n": thrn, "time_1_s": t1, "time_n_s": tn,
            "efficiency": efficiency(thr1, thrn, world)}
