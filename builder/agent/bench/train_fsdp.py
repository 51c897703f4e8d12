"""FSDP2 check (``fully_shard`` on every Linear and the root of a small MLP) against a single-process reference on the K
distinct slices (rank r trains on slice r % K), each slice's mean weighted by its share of the ranks: a fixed cost
whatever N. In float64: the reduce-scatter sums N gradients, whose rounding in float32 ((N - 1) x 6e-8, Higham's bound)
exceeds the tolerance beyond about 160 ranks."""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import SHARD_DELTA

DEFAULT_STEPS = 3
DEFAULT_BATCH = 4  # samples per rank per step
SIZES = (16, 32, 32, 8)


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def perturb_first_shard(torch, model, delta: float) -> None:
    """TEST-ONLY: add ``delta`` to the first element of this rank's shard of the first parameter."""
    p = next(model.parameters())
    local = p.to_local() if hasattr(p, "to_local") else p
    with torch.no_grad():
        if local.numel():
            local.view(-1)[0] += delta


def run_fsdp_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                   batch: int = DEFAULT_BATCH, faults=()) -> dict[str, Any]:
    """Train the MLP under FSDP2; Unsupported when this torch has no ``fully_shard``."""
    import torch
    import torch.distributed as dist

    fully_shard = training.resolve("FSDP2 fully_shard", _fully_shard)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = training.mlp(torch, list(SIZES)).double()
    reference = copy.deepcopy(model).to(device)
    model = model.to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if training.fault_hits(faults, "fsdp-shard-perturb", rank):
        perturb_first_shard(torch, model, SHARD_DELTA)
    weights = training.shard_weights(world)
    data = [(x.to(device).double(), y.to(device).double())
            for x, y in training.batches(torch, seed, steps, batch * len(weights), SIZES[0], SIZES[-1])]
    losses, ref_losses, ok, diff, wall = training.run_mse(
        torch, dist, device, model, reference, data, training.shard_of(rank, world, batch), weights)
    return training.result(training.describe("mlp", list(SIZES), training.n_params(reference)), losses, ref_losses, ok,
                           diff, steps * batch * world, wall, batch_per_rank=batch, global_batch=batch * world)
