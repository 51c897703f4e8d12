"""Rules on the extra packages: no second torch, CUDA, cuDNN, NCCL or driver beside the one torch brings, and
torchvision/torchaudio releases that pair with the torch release [compat.md §5.3-5.4, §5.8; S1; S1-COMP; NV-CTK]."""

from __future__ import annotations

import re
from typing import TypeVar

from packaging.version import Version

from ..facts import BaseImageRow, PackageRow
from ..fields import canonical_name, requirement_name
from ..spec import ERROR, WARNING
from .context import Ctx, base_tag, severity

_STACK_REASONS = {
    "nccl": "a second NCCL: {torch_text} loads the NCCL of its own wheel{nccl_text}",
    "cuda": "a second CUDA: {torch_text} brings its CUDA runtime as the nvidia-* wheels it pins",
    "cudnn": "a second cuDNN: {torch_text} brings {cudnn_text} as a wheel",
    "driver": "an NVIDIA driver package: the driver comes from the host (the container runtime mounts the host's "
              "driver libraries); one in the image shadows or mismatches it",
    "torch": "a second PyTorch beside {torch_text}",
}
_LIBRARY_NAMES = {"nccl": "NCCL", "cuda": "CUDA", "cudnn": "cuDNN"}


def _stack_reason(c: Ctx, stack: str) -> str:
    if c.variant == "cpu" and stack in _LIBRARY_NAMES:
        return (f"a CUDA library in a CPU image: a CPU build of torch ({c.local}) uses no "
                f"{_LIBRARY_NAMES[stack]}")
    values = {"local": c.local, "torch_text": f"torch {c.local}",
              "nccl_text": f" ({c.nccl_pkg} {c.nccl})" if c.nccl_pkg and c.nccl else "",
              "cudnn_text": f"cuDNN {c.cudnn}" if c.cudnn else "its cuDNN"}
    return _STACK_REASONS[stack].format_map(values)


Row = TypeVar("Row", BaseImageRow, PackageRow)


def _first_row(rows: tuple[Row, ...], name: str) -> Row | None:
    return next((row for row in rows if re.fullmatch(row.pattern, name)), None)


def second_stack(c: Ctx) -> None:
    """No second torch, CUDA, cuDNN, NCCL or driver beside the one torch brings
    [compat.md §5.3-5.4, §5.8; S1; NV-CTK; base images that ship torch]."""
    rules = c.data.second_stack
    for i, item in enumerate(c.r.packages.apt):
        row = _first_row(rules.apt, item.split("=", 1)[0])
        if row:
            c.add(severity(row.tag), "second-stack", [f"packages.apt[{i}]"],
                  f"{item} is {_stack_reason(c, row.stack)}; remove it", f"{row.source} ({row.tag})")
    major = c.vcuda.split(".")[0] if c.vcuda else None
    for i, req in enumerate(c.r.packages.pip):  # packaging's parser (~40 ms to import) only for uncommon forms
        name = canonical_name(requirement_name(req))
        m = re.fullmatch(r"(nvidia-[a-z0-9-]+?)-cu([0-9]+)", name)
        if m and major and m.group(2) != major:  # never mix -cu12 and -cu13 [compat.md §5.8]
            c.add(ERROR, "cuda-package-mix", [f"packages.pip[{i}]"],
                  f"{req} is a CUDA {m.group(2)} package in a CUDA {major} image (torch {c.variant}); "
                  f"use the -cu{major} package", "S1 (V)")
            continue
        row = _first_row(rules.pip, name)
        if row:
            c.add(severity(row.tag), "second-stack", [f"packages.pip[{i}]"],
                  f"{req} is {_stack_reason(c, row.stack)}; remove it", f"{row.source} ({row.tag})")
    image = c.r.base.image
    shipped = _first_row(rules.base, base_tag(image)[0]) if image else None
    if shipped:
        c.add(severity(shipped.tag), "second-stack", ["base.image"],
              f"base image {image} already ships PyTorch: installing torch {c.local} makes a second one; start from "
              "its CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian)", f"{shipped.source} ({shipped.tag})")


def companions(c: Ctx) -> None:
    """torchvision/torchaudio requirements must admit a release that pairs with the torch
    release, by those wheels' own Requires-Dist [S1-COMP]."""
    torch_version = c.r.torch.version
    if not (torch_version and c.r.packages.pip):
        return
    table = c.data.companions
    torch_v = Version(torch_version)
    for i, req_text in enumerate(c.r.packages.pip):
        rows = table.get(canonical_name(requirement_name(req_text)))
        if rows is None:
            continue
        from packaging.requirements import Requirement

        req = Requirement(req_text)
        pairs = {v: row for v, row in rows.items() if _spec_contains(row.torch, torch_v)}
        fields = [f"packages.pip[{i}]", "torch.version"]
        if not pairs:
            c.add(WARNING, "companion-unknown", fields,
                  f"envbuild knows no {req.name} release whose wheel pairs with torch {torch_version}; "
                  f"{req_text} is unchecked (pip may find none)", "S1-COMP (U)")
            continue
        if any(req.specifier.contains(v, prereleases=True) for v in pairs):
            continue
        worst = "V" if any(row.tag in ("V", "M") for row in pairs.values()) else "U"
        best = max(pairs, key=Version)
        row = pairs[best]
        c.add(severity(worst), "companion-pair", fields,
              f"{req_text} does not pair with torch {torch_version}: {req.name} {best} is the release for it "
              f"(its wheel requires torch{row.torch}); use {req.name}=={best}",
              f"S1-COMP {row.wheel} ({row.tag})")


def _spec_contains(spec: str, version: Version) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except InvalidSpecifier:  # pragma: no cover - compat.yaml is ours
        return False
