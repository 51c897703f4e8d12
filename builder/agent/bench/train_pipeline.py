"""Pipeline-parallel check (``torch.distributed.pipelining``): a chain of ``world`` blocks, block r
the stage on rank r, against the whole chain in one process; static example shapes (no numpy)."""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import MESSAGE_DELTA

DEFAULT_STEPS = 3
MICROBATCHES = 4
MICROBATCH_SIZE = 2
WIDTH = 16
SCHEDULES = ("gpipe", "1f1b")


def _pipelining_api():
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    return PipelineStage, {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def _message_fault_hook(torch, drop: bool):
    """TEST-ONLY forward pre-hook: alter one element of the received activation, or zero it."""
    def hook(module, args):
        x = args[0]
        if drop:
            return (x * 0.0,) + tuple(args[1:])
        delta = torch.zeros_like(x)
        delta.view(-1)[0] = MESSAGE_DELTA
        return (x + delta,) + tuple(args[1:])
    return hook


def _step(sched, rank: int, world: int, x, y) -> list[float]:
    losses: list = []
    if world == 1:
        sched.step(x, target=y, losses=losses)
    elif rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    return [float(v.item()) for v in losses]


def run_pipeline_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                       schedule: str = "gpipe", faults=()) -> dict[str, Any]:
    """Train the chain with ``schedule`` (:data:`SCHEDULES`); Unsupported without ``torch.distributed.pipelining``."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    if schedule not in SCHEDULES:
        raise ValueError("unknown pipeline schedule {!r} (one of {})".format(schedule, ", ".join(SCHEDULES)))
    PipelineStage, schedules = training.resolve("torch.distributed.pipelining", _pipelining_api)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    blocks = [training.mlp(torch, [WIDTH, WIDTH]).append(torch.nn.Tanh()) for _ in range(world)]
    reference = torch.nn.Sequential(*copy.deepcopy(blocks)).to(device)
    stage_mod = blocks[rank].to(device)
    for kind, drop in (("pipeline-message-alter", False), ("pipeline-message-drop", True)):
        if training.fault_hits(faults, kind, rank):
            stage_mod.register_forward_pre_hook(_message_fault_hook(torch, drop))
    example_in = torch.zeros(MICROBATCH_SIZE, WIDTH, device=device, requires_grad=rank > 0)
    example_out = torch.zeros(MICROBATCH_SIZE, WIDTH, device=device, requires_grad=True)
    stage = PipelineStage(stage_mod, rank, world, torch.device(device),
                          input_args=(example_in,), output_args=(example_out,))
    sched = schedules[schedule](stage, n_microbatches=MICROBATCHES, loss_fn=F.mse_loss)
    data = [(x.to(device), y.to(device)) for x, y in training.batches(
        torch, seed, steps, MICROBATCHES * MICROBATCH_SIZE, WIDTH, WIDTH)]
    opt = torch.optim.SGD(stage_mod.parameters(), lr=training.LR)

    def train():
        out = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            mb = _step(sched, rank, world, x, y)
            opt.step()
            out.append(sum(mb) / len(mb) if mb else 0.0)
        return out

    local_losses, wall = training.timed(torch, device, train)
    ref_losses = training.train_reference(torch, reference, data, F.mse_loss)
    got = [training.local_tensor(p) for p in stage_mod.parameters()]
    want = [p.detach().cpu() for p in reference[rank].parameters()]
    ok, diff, wall = training.agree(torch, dist, device, got, want, wall)
    # Only the last stage has losses; the others contribute 0 to the sum.
    losses = training.sum_over_ranks(torch, dist, device, local_losses)
    return training.result(
        f"chain of {world:d} x linear {WIDTH:d}-{WIDTH:d} + tanh ({training.n_params(reference):,} parameters)",
        losses, ref_losses, ok, diff, steps * MICROBATCHES * MICROBATCH_SIZE, wall,
        schedule=schedule, stages=world, microbatches=MICROBATCHES, microbatch_size=MICROBATCH_SIZE)
