"""Tensor-parallel training check (DTensor ``parallelize_module``) against a reference.

A two-layer MLP, Linear(16, H) - Tanh - Linear(H, 8) with H = 32 rounded up to a
multiple of the world size, is split Megatron-style over a 1-D device mesh of all ranks:
the first Linear with ``ColwiseParallel`` (each rank holds H/world output rows), the
second with ``RowwiseParallel`` (the matching input columns; its partial outputs are
summed by an all-reduce). Every rank gets the same whole batch (tensor parallelism
splits the layer, not the data). The reference, on every rank with no process group,
trains a copy of the same initial model on the same batches (mean-squared error, SGD lr
``training.LR``); the final parameters are gathered with ``full_tensor()`` and compared
(tolerance: ``training``).
"""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import SHARD_DELTA

DEFAULT_STEPS = 3
DEFAULT_BATCH = 8  # samples per step (the same on every rank)
IN_DIM, HIDDEN_MIN, OUT_DIM = 16, 32, 8


def hidden_size(world: int) -> int:
    """32 rounded up to a multiple of ``world``: 2 -> 32, 3 -> 33, 64 -> 64."""
    return world * -(-HIDDEN_MIN // world)


def _tp_api():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return init_device_mesh, parallelize_module, ColwiseParallel, RowwiseParallel


def run_tp_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                 batch: int = DEFAULT_BATCH, faults=()) -> dict[str, Any]:
    """Train the MLP tensor-parallel over all ranks for ``steps`` steps.

    Args:
        seed: init seed on every rank; data seed ``seed + 1``.
        device: ``"cpu"`` or ``"cuda:<i>"``; faults: parsed ``profile_faults``
            (``tp-shard-perturb`` is used: this rank's shard of the first weight).

    Returns ``training.result`` plus ``batch`` and ``hidden``.

    Raises:
        support.Unsupported: this torch has no DeviceMesh or tensor-parallel API.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from .train_fsdp import perturb_first_shard

    init_device_mesh, parallelize_module, Colwise, Rowwise = training.resolve(
        "tensor parallel (init_device_mesh, parallelize_module)", _tp_api)
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [IN_DIM, hidden_size(world), OUT_DIM]
    torch.manual_seed(seed)
    model = training.mlp(torch, sizes)
    reference = copy.deepcopy(model).to(device)
    model = model.to(device)
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world,))
    parallelize_module(model, mesh, {"0": Colwise(), "2": Rowwise()})
    if training.fault_hits(faults, "tp-shard-perturb", rank):
        perturb_first_shard(torch, model, SHARD_DELTA)
    data = [(x.to(device), y.to(device))
            for x, y in training.batches(torch, seed, steps, batch, IN_DIM, OUT_DIM)]
    opt = torch.optim.SGD(model.parameters(), lr=training.LR)

    def train():
        losses = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
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
        training.describe("mlp", sizes, training.n_params(reference)), losses, ref_losses, ok,
        diff, steps * batch, wall, batch=batch, hidden=sizes[1])
