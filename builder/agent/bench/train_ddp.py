"""DDP training check against a single-process reference (ResNet-18 of ``bench.ddp``).

Data parallel: every rank holds the whole model; rank r trains on slice r of the global
batch and DDP averages the gradients with all-reduce. The reference, on every rank (on
its device) with no process group, starts from the same parameters (same seed) and takes
each step on the SAME global batch split into the same per-rank slices: it runs the
slices one after the other and accumulates ``loss_slice / world`` gradients. Slices, not
one big batch, because BatchNorm (not synchronized under DDP) normalizes each rank's
slice with that slice's statistics; with slices the reference computes the gradient DDP
computes, so any difference is summation order (see ``training`` for the tolerance).
BatchNorm's running statistics are buffers, not parameters, and are not compared.

Optimizer: SGD, lr 0.01, momentum 0.9 (``bench.ddp``'s), cross-entropy loss; data
N(0, 1) images (3, S, S) and uniform labels from a generator seeded ``seed + 1``.

The check trains in float64 by default. ResNet-18 with BatchNorm over a few images per
rank amplifies float32 rounding: at 3 gloo ranks (torch 2.13) the all-reduce's
summation order alone, a 1e-7 relative difference in the first gradient, grows to a
1e-3 difference of some parameters after 3 steps (1.3e-3 at 32x32 images, 4.9e-4 at
64x64; 7e-6 already after 2 steps), which no tolerance tells apart from a bug. In
float64 the same run agrees to 3e-13, so the check is exact about what it certifies: DDP
averages the gradients of all ranks and applies them alike. float32 throughput is
what ``scaling`` measures. On 2 ranks float32 happens to agree bit for bit (a + b
in either order).
"""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import GRAD_DELTA

DEFAULT_STEPS = 3
DEFAULT_BATCH = 4  # images per rank per step (>= 2: BatchNorm)
DEFAULT_IMAGE_SIZE = 32
DEFAULT_DTYPE = "float64"


def make_data(torch, seed: int, steps: int, global_batch: int, image_size: int, classes: int):
    """``steps`` (images, labels) of the global batch, identical on every rank."""
    gen = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(global_batch, 3, image_size, image_size, generator=gen),
             torch.randint(0, classes, (global_batch,), generator=gen)) for _ in range(steps)]


def reference_steps(torch, model, data, world: int, batch: int, lr: float, momentum: float):
    """The single-process reference: per step, the ``world`` slices of ``batch`` images
    one after another, gradients of ``loss / world`` accumulated, then one SGD step.
    Returns the loss of each step (the mean of the slice losses)."""
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for q in range(world):
            sl = slice(q * batch, (q + 1) * batch)
            loss = F.cross_entropy(model(x[sl]), y[sl])
            (loss / world).backward()
            total += loss.item()
        opt.step()
        losses.append(total / world)
    return losses


def _perturb_hook(state, bucket):
    """TEST-ONLY DDP comm hook: +GRAD_DELTA on the bucket's first element, then the
    usual averaging all-reduce."""
    import torch.distributed as dist

    buf = bucket.buffer()
    buf[0] += GRAD_DELTA
    buf.div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda fut: fut.value()[0])


def run_ddp_check(seed: int, device: str, steps: int = DEFAULT_STEPS, batch: int = DEFAULT_BATCH,
                  image_size: int = DEFAULT_IMAGE_SIZE, faults=(),
                  dtype: str = DEFAULT_DTYPE) -> dict[str, Any]:
    """Train ResNet-18 under DDP and compare with the reference; see the module docstring.

    Args:
        seed: model-init seed (``torch.manual_seed``) on every rank; data seed ``seed + 1``.
        device: ``"cpu"`` (gloo) or ``"cuda:<i>"`` (nccl; ``device_ids=[i]``).
        steps >= 1; batch >= 2 images per rank per step; image_size >= 32.
        faults: parsed ``profile_faults`` (``ddp-grad-perturb`` is used).
        dtype: ``"float64"`` (default, see the module docstring) or ``"float32"``.

    Returns ``training.result`` with model ``"resnet18 (torchvision|builtin)"``, plus
    ``dtype``, ``batch_per_rank``, ``global_batch``, ``image_size`` and
    ``reference_wall_s`` (the slowest rank's).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .ddp import LR, MOMENTUM, NUM_CLASSES, build_resnet18

    rank, world = dist.get_rank(), dist.get_world_size()
    tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]
    torch.manual_seed(seed)
    model, source = build_resnet18()
    model = model.to(device=device, dtype=tdtype)
    reference = copy.deepcopy(model)
    cuda = device.startswith("cuda")
    ddp = DDP(model, device_ids=[int(device.split(":")[1])] if cuda else None)
    if training.fault_hits(faults, "ddp-grad-perturb", rank):
        ddp.register_comm_hook(None, _perturb_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    data = [(x.to(device=device, dtype=tdtype), y.to(device))
            for x, y in make_data(torch, seed, steps, batch * world, image_size, NUM_CLASSES)]
    sl = slice(rank * batch, (rank + 1) * batch)
    mine = [(x[sl], y[sl]) for x, y in data]

    def train():
        losses = []
        ddp.train()
        for x, y in mine:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    local_losses, wall = training.timed(torch, device, train)
    ref_losses, ref_wall = training.timed(
        torch, device, lambda: reference_steps(torch, reference, data, world, batch, LR, MOMENTUM))
    got = [training.local_tensor(p) for p in model.parameters()]
    want = [training.local_tensor(p) for p in reference.parameters()]
    ok, diff = training.compare_params(torch, got, want)
    ok, diff, wall = training.agree(torch, dist, device, ok, diff, wall)
    losses = training.mean_over_ranks(torch, dist, device, local_losses)
    ref_wall = training.max_over_ranks(torch, dist, device, [ref_wall])[0]
    return training.result(
        f"resnet18 ({source})", losses, ref_losses, ok, diff, steps * batch * world, wall,
        dtype=dtype, batch_per_rank=batch, global_batch=batch * world, image_size=image_size,
        reference_wall_s=ref_wall)
