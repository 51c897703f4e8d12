"""Rules on NCCL and cuDNN: a CPU build has neither; a CUDA build pins its own, which the
recipe's must match [S1, compat.md §1]."""

from __future__ import annotations

from ..facts import CudnnPin, NcclPin
from ..spec import ERROR, WARNING
from .context import Ctx, severity


def nccl_cudnn(c: Ctx) -> None:
    """NCCL pinned and cuDNN brought by the torch build [S1]."""
    r = c.r
    if c.variant == "cpu":
        if r.nccl:
            c.add(ERROR, "nccl-cpu", ["nccl", "torch.variant"],
                  f"a CPU build of torch has no NCCL; remove nccl ({r.nccl}) or use a CUDA variant", "S1 (V)")
        if r.cudnn:
            c.add(ERROR, "cudnn-cpu", ["cudnn"], f"a CPU build of torch has no cuDNN; remove cudnn ({r.cudnn})",
                  "S1 (V)")
        return
    c.nccl, c.cudnn = r.nccl, r.cudnn
    if not (c.rel and c.variant and c.variant in c.variant_list()):
        return
    pin = c.rel.nccl.get(c.variant)
    if pin is None:
        if r.nccl:
            c.add(WARNING, "nccl-unknown", ["nccl", "torch.variant"],
                  f"envbuild has no fact on the NCCL that torch {c.local} pins; keeping the recipe's {r.nccl} "
                  "unchecked",
                  "compat.md §1 (U)")
    else:
        _nccl_pin(c, pin)
    _cudnn_pin(c, c.rel.cudnn.get(c.variant))


def _nccl_pin(c: Ctx, pin: NcclPin) -> None:
    """The NCCL wheel the torch build pins (``pin``: package, version or null, tag) vs the recipe's."""
    wanted = c.r.nccl
    c.nccl_pkg = pin.package
    pinned = pin.version or None
    c.nccl = pinned if pinned else wanted
    if wanted and pinned and wanted != pinned:
        c.add(severity(pin.tag), "nccl-pin", ["nccl", "torch.version", "torch.variant"],
              f"torch {c.local} pins {c.nccl_pkg}=={pinned}; the recipe's NCCL {wanted} would be a second NCCL "
              f"or a resolver conflict (use nccl: {pinned})", f"S1 ({pin.tag})")
        if severity(pin.tag) == WARNING:
            c.nccl = wanted
    elif pinned is None and wanted:
        c.add(WARNING, "nccl-bundled", ["nccl"],
              f"torch {c.local} bundles its NCCL (version unverified); the recipe's {wanted} cannot be checked",
              "compat.md §1 (U)")


def _cudnn_pin(c: Ctx, pin: CudnnPin | None) -> None:
    """The cuDNN the torch build brings (``pin``: version, tag; None: unknown) vs the recipe's."""
    wanted = c.r.cudnn
    c.cudnn = pin.version if pin else wanted
    if pin and wanted and wanted != pin.version:
        c.add(severity(pin.tag), "cudnn-pin", ["cudnn", "torch.variant"],
              f"torch {c.local} brings cuDNN {pin.version}, not {wanted}", f"S1 ({pin.tag})")
        if severity(pin.tag) == WARNING:
            c.cudnn = wanted
