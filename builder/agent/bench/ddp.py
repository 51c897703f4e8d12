"""A few DDP training steps of ResNet-18 on synthetic data, then a parameter checksum.

After every DDP step all replicas must hold bit-identical parameters (gradients are
all-reduced, the optimizer is deterministic); the check gathers a sha256 of every
rank's parameters and compares them exactly.

The pure functions (:func:`reference_checksum`, :func:`mismatched_ranks`) use no
torch; :func:`run_ddp` and :func:`param_checksum` import torch lazily.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections import Counter
from typing import Any

NUM_CLASSES = 1000
LR = 0.01
MOMENTUM = 0.9
DATA_SEED_STRIDE = 1_000_003  # data seed of rank r = seed * stride + r (rank-dependent)


def reference_checksum(checksums: list[str]) -> str:
    """The value the ranks are compared with: the most common checksum.

    When several values share the highest count (e.g. 2 ranks that disagree), rank 0's
    checksum is the reference.

    Raises:
        ValueError: empty list.
    """
    if not checksums:
        raise ValueError("no checksums")
    counts = Counter(checksums).most_common()
    top = counts[0][1]
    if sum(1 for _, c in counts if c == top) > 1:
        return checksums[0]
    return counts[0][0]


def mismatched_ranks(checksums: list[str]) -> list[int]:
    """Ranks (indices into ``checksums``) whose checksum differs from the reference.

    E.g. ``["a", "b", "a"]`` -> ``[1]``; ``["a", "b"]`` -> ``[1]`` (tie: rank 0 wins);
    all equal -> ``[]``.
    """
    ref = reference_checksum(checksums)
    return [r for r, c in enumerate(checksums) if c != ref]


def param_checksum(named_parameters) -> str:
    """sha256 hex of the raw bytes of every parameter, concatenated in the given order.

    Args:
        named_parameters: iterable of ``(name, tensor)``, e.g. ``module.named_parameters()``.
            Each tensor is detached, moved to CPU and made contiguous; its bytes are its
            storage in native byte order (no numpy needed).
    """
    h = hashlib.sha256()
    for _, p in named_parameters:
        t = p.detach().cpu().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()


def _all_gather_digest(dist, torch, hexdigest: str, device: str, world: int) -> list[str]:
    """Every rank's sha256 hex digest, index = rank.

    Sent as 32 uint8 values with ``all_gather`` rather than ``all_gather_object``, which
    needs numpy in recent torch (2.13: "Numpy is not available").
    """
    raw = bytes.fromhex(hexdigest)
    mine = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    out = [torch.zeros(len(raw), dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(out, mine)
    return [bytes(t.cpu().tolist()).hex() for t in out]


def build_resnet18() -> tuple[Any, str]:
    """(model, source): torchvision's ResNet-18 when importable, else the built-in one.

    ``source`` is ``"torchvision"`` or ``"builtin"``. Weights are random (torch's global
    RNG), never downloaded.
    """
    try:
        from torchvision.models import resnet18 as tv_resnet18
    except Exception:  # ImportError, or a torchvision that does not match torch
        tv_resnet18 = None
    if tv_resnet18 is not None:
        try:
            return tv_resnet18(weights=None, num_classes=NUM_CLASSES), "torchvision"
        except TypeError:  # torchvision < 0.13 has no `weights`
            return tv_resnet18(pretrained=False, num_classes=NUM_CLASSES), "torchvision"
    from .resnet import resnet18

    return resnet18(num_classes=NUM_CLASSES), "builtin"


def run_ddp(steps: int, batch: int, image_size: int, seed: int, device: str,
            local_rank: int, perturb: bool = False, progress=None) -> dict[str, Any]:
    """Train ResNet-18 under DDP for ``steps`` steps; return the ``ddp`` result section.

    Args:
        steps: optimizer steps (>= 1); batch: images per step on this rank;
        image_size: S for synthetic images of shape (3, S, S), float32 N(0, 1), labels
            uniform in [0, 1000).
        seed: model init uses ``torch.manual_seed(seed)`` on every rank; this rank's data
            uses a generator seeded ``seed * 1000003 + rank``.
        device: ``"cpu"`` or ``"cuda:<local_rank>"``.
        perturb: TEST-ONLY fault: add 1e-3 to one parameter element before the checksum.
        progress: ``progress(name, detail, collective)`` called as each phase begins
            (``ddp`` ``setup``, ``step i``, ``checksum``; all collective), or None.

    SGD lr 0.01 momentum 0.9, cross-entropy loss. ``images_per_s`` = steps * batch /
    wall seconds of the steps on this rank (data is generated before the clock starts).
    Checksums of every rank are gathered with ``all_gather`` (see :func:`_all_gather_digest`).
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = device.startswith("cuda")

    note = progress or (lambda name, detail, collective: None)
    note("ddp", "setup", True)
    torch.manual_seed(seed)
    model, source = build_resnet18()
    model = model.to(device)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)

    gen = torch.Generator().manual_seed(seed * DATA_SEED_STRIDE + rank)
    data = []
    for _ in range(steps):
        x = torch.randn(batch, 3, image_size, image_size, generator=gen)
        y = torch.randint(0, NUM_CLASSES, (batch,), generator=gen)
        data.append((x.to(device), y.to(device)))

    ddp.train()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss: float | None = None
    for i, (x, y) in enumerate(data):
        note("ddp", f"step {i + 1:d}", True)
        opt.zero_grad(set_to_none=True)
        out = F.cross_entropy(ddp(x), y)
        out.backward()
        opt.step()
        loss = out.item()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0

    if perturb:
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] += 1e-3

    note("ddp", "checksum", True)
    mine = param_checksum(model.named_parameters())
    checksums = _all_gather_digest(dist, torch, mine, device, world)
    return {
        "model": "resnet18",
        "source": source,
        "steps": steps,
        "batch_size": batch,
        "image_size": image_size,
        "wall_s": wall,
        "images_per_s": steps * batch / wall if wall > 0 else 0.0,
        "final_loss": loss,
        "param_checksum": mine,
        "checksums_by_rank": list(checksums),
        "params_identical": len(set(checksums)) == 1,
        "mismatched_ranks": mismatched_ranks(checksums),
    }
