"""FSDP2 training check (``fully_shard``) against a single-process reference.

Fully sharded data parallel: every Linear layer and the root of a small MLP are wrapped
with ``fully_shard`` (``torch.distributed.fsdp``; ``torch.distributed._composable.fsdp``
on torch 2.4-2.5), so each rank stores 1/world of every parameter; the forward
all-gathers the shards and the backward reduce-scatters the averaged gradients. Rank r
trains on slice r of the global batch (mean-squared error, SGD lr ``training.LR``). The
reference, on every rank with no process group, trains a copy of the same initial model
on the whole global batch: the mean of the slice means is the global mean, so the
gradients are the same up to float32 summation order (tolerance: ``training``). The
final parameters are gathered with ``full_tensor()`` and compared element by element.
"""

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
    """TEST-ONLY: add ``delta`` to the first element of this rank's local shard of the
    model's first parameter (a DTensor after sharding; nothing when the shard is empty)."""
    p = next(model.parameters())
    local = p.to_local() if hasattr(p, "to_local") else p
    with torch.no_grad():
        if local.numel():
            local.view(-1)[0] += delta


def run_fsdp_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                   batch: int = DEFAULT_BATCH, faults=()) -> dict[str, Any]:
    """Train the MLP under FSDP2 for ``steps`` steps of ``batch`` samples per rank.

    Args:
        seed: init seed on every rank (``torch.manual_seed``); data seed ``seed + 1``.
        device: ``"cpu"`` or ``"cuda:<i>"``; faults: parsed ``profile_faults``
            (``fsdp-shard-perturb`` is used).

    Returns ``training.result`` plus ``batch_per_rank`` and ``global_batch``.

    Raises:
        support.Unsupported: this torch has no ``fully_shard``.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    fully_shard = training.resolve("FSDP2 fully_shard", _fully_shard)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = training.mlp(torch, list(SIZES))
    reference = copy.deepcopy(model).to(device)
    model = model.to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if training.fault_hits(faults, "fsdp-shard-perturb", rank):
        perturb_first_shard(torch, model, SHARD_DELTA)
    data = [(x.to(device), y.to(device))
            for x, y in training.batches(torch, seed, steps, batch * world, SIZES[0], SIZES[-1])]
    opt = torch.optim.SGD(model.parameters(), lr=training.LR)

    def train():
        losses = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            sl = slice(rank * batch, (rank + 1) * batch)
            loss = F.mse_loss(model(x[sl]), y[sl])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    local_losses, wall = training.timed(torch, device, train)
    ref_losses = training.train_reference(torch, reference, data, F.mse_loss)
    got = [training.local_tensor(p) for p in model.parameters()]
    want = [p.detach().cpu() for p in reference.parameters()]
    ok, diff = training.compare_params(torch, got, want)
    ok, diff, wall = training.agree(torch, dist, device, ok, diff, wall)
    losses = training.mean_over_ranks(torch, dist, device, local_losses)
    return training.result(
        training.describe("mlp", list(SIZES), training.n_params(reference)), losses, ref_losses,
        ok, diff, steps * batch * world, wall, batch_per_rank=batch, global_batch=batch * world)
