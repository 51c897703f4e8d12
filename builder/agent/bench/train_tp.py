"""Tensor-parallel check: a two-layer MLP split Megatron-style (``ColwiseParallel`` then ``RowwiseParallel``)
over a 1-D mesh of all ranks, every rank on the whole batch, against a single-process reference."""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import SHARD_DELTA

DEFAULT_STEPS = 3
DEFAULT_BATCH = 8  # samples per step (the same on every rank)
IN_DIM, HIDDEN_MIN, OUT_DIM = 16, 32, 8


def hidden_size(world: int) -> int:
    """32 rounded up to a multiple of ``world``."""
    return world * -(-HIDDEN_MIN // world)


def _tp_api():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return init_device_mesh, parallelize_module, ColwiseParallel, RowwiseParallel


def run_tp_check(seed: int, device: str, steps: int = DEFAULT_STEPS,
                 batch: int = DEFAULT_BATCH, faults=()) -> dict[str, Any]:
    """Train the MLP tensor-parallel; Unsupported when this torch has no DeviceMesh or TP API."""
    import torch
    import torch.distributed as dist

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
    data = [(x.to(device), y.to(device)) for x, y in training.batches(torch, seed, steps, batch, IN_DIM, OUT_DIM)]
    losses, ref_losses, ok, diff, wall = training.run_mse(torch, dist, device, model, reference, data)
    return training.result(training.describe("mlp", sizes, training.n_params(reference)), losses, ref_losses, ok, diff,
                           steps * batch, wall, batch=batch, hidden=sizes[1])
