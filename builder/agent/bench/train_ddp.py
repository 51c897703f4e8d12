"""The DDP check: ResNet-18 under DDP against a single-process reference. The reference runs the K distinct slices
(rank r trains on slice r % K, :func:`~bench.training.shard_weights`) one after another (BatchNorm is not synced
under DDP, so each slice has its own statistics) and accumulates each loss times its slice's share of the ranks: its
cost is fixed whatever N. It trains in float64: in float32 summation order alone (1e-7) grows to 1e-3 in some
parameters after 3 steps at 3 ranks, which no tolerance tells from a bug; in float64 it agrees to 3e-13. ``scaling``
measures float32 throughput."""

from __future__ import annotations

import copy
from typing import Any

from . import training
from .profile_faults import GRAD_DELTA

DEFAULT_STEPS = 3
DEFAULT_BATCH = 4  # images per rank per step (>= 2: BatchNorm)
DEFAULT_IMAGE_SIZE = 32
DEFAULT_DTYPE = "float64"
NUM_CLASSES = 1000
LR = 0.01
MOMENTUM = 0.9


def build_resnet18() -> tuple[Any, str]:
    """(model, ``"torchvision"`` | ``"builtin"``): torchvision's ResNet-18 when importable, else ``bench.resnet``."""
    try:
        from torchvision.models import resnet18 as tv_resnet18
    except Exception:  # ImportError, or a torchvision that does not match torch
        from .resnet import resnet18

        return resnet18(num_classes=NUM_CLASSES), "builtin"
    try:
        return tv_resnet18(weights=None, num_classes=NUM_CLASSES), "torchvision"
    except TypeError:  # torchvision < 0.13 has no `weights`
        return tv_resnet18(pretrained=False, num_classes=NUM_CLASSES), "torchvision"


def make_data(torch, seed: int, steps: int, global_batch: int, image_size: int, classes: int):
    gen = torch.Generator().manual_seed(seed + 1)
    return [(torch.randn(global_batch, 3, image_size, image_size, generator=gen),
             torch.randint(0, classes, (global_batch,), generator=gen)) for _ in range(steps)]


def reference_steps(torch, model, data, world: int, batch: int, lr: float, momentum: float):
    """Per step the distinct slices one after another, ``loss x weight`` gradients accumulated, one SGD step."""
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for q, w in enumerate(training.shard_weights(world)):
            sl = slice(q * batch, (q + 1) * batch)
            loss = F.cross_entropy(model(x[sl]), y[sl])
            (loss * w).backward()
            total += loss.item() * w
        opt.step()
        losses.append(total)
    return losses


def _perturb_hook(state, bucket):
    """TEST-ONLY DDP comm hook: +GRAD_DELTA on the bucket's first element, then the usual averaging."""
    import torch.distributed as dist

    buf = bucket.buffer()
    buf[0] += GRAD_DELTA
    buf.div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda fut: fut.value()[0])


def run_ddp_check(seed: int, device: str, steps: int = DEFAULT_STEPS, batch: int = DEFAULT_BATCH,
                  image_size: int = DEFAULT_IMAGE_SIZE, faults=(), dtype: str = DEFAULT_DTYPE) -> dict[str, Any]:
    """Train ResNet-18 under DDP and compare with the reference (``dtype`` float64 or float32)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

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
    data = [(x.to(device=device, dtype=tdtype), y.to(device)) for x,
            y in make_data(torch, seed, steps, batch * len(training.shard_weights(world)), image_size, NUM_CLASSES)]
    sl = training.shard_of(rank, world, batch)
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
    ok, diff, wall = training.agree(torch, dist, device, got, want, wall)
    losses = training.mean_over_ranks(torch, dist, device, local_losses)
    ref_wall = training.max_over_ranks(torch, dist, device, [ref_wall])[0]
    return training.result(f"resnet18 ({source})", losses, ref_losses, ok, diff, steps * batch * world, wall,
                           dtype=dtype, batch_per_rank=batch, global_batch=batch * world, image_size=image_size,
                           reference_wall_s=ref_wall)
