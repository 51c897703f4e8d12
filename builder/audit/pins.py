"""What the extracted stack comes to: torch's release and wheel variant, Python, CUDA, NCCL/cuDNN pins. A pip torch's
variant: the pin's local version, else the PyTorch index's (pip takes the highest version of all indexes, and
``+cu121`` sorts above), else PyPI's build, the release's default variant (compat.yaml [S2]; PyPI has no ``+cpu``
builds [PT-IDX])."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.recipe.facts import facts
from builder.recipe.fields import RELEASE, VARIANT
from builder.recipe.rules import context

from .extract import OPTION, CondaInstall, Index, Item, PipInstall, Stack
from .model import Installer, PipTool

#: apt packages envbuild installs itself (the system Python and its venv module).
ENVBUILD_APT = frozenset({"python3", "python3-venv", "python3-pip", "python-is-python3"})


@dataclass
class TorchPin:
    """The torch of the image; ``version`` None when unpinned or ranged, ``index`` None for PyPI."""

    item: Item
    installer: Installer
    version: str | None = None
    local: str | None = None
    variant: str | None = None
    variant_from: str = ""
    index: Index | None = None
    pypi_in_play: bool = False
    spec: str = ""
    pip: PipInstall | None = None
    conda: CondaInstall | None = None
    channel: str | None = None
    series: str | None = None

    @property
    def release(self) -> str | None:
        """The version when it is a plain release (``2.5.1``), else None."""
        return self.version if self.version and RELEASE.fullmatch(self.version) else None


@dataclass
class Pins:
    """The stack's pins; ``all_torch`` every torch install, the effective one (the last) in ``torch``."""

    stack: Stack
    torch: TorchPin | None
    all_torch: list[TorchPin] = field(default_factory=list)
    python: Item | None = None
    python_from: str | None = None
    cuda: str | None = None
    nccl: tuple[Item, str, str] | None = None
    cudnn: tuple[Item, str, str] | None = None
    pip: list[tuple[Item, Requirement, PipTool]] = field(default_factory=list)
    others: list[Item] = field(default_factory=list)

    @property
    def os(self) -> tuple[str, str] | None:
        b = self.stack.base
        return (b.os_id, b.os_version) if b.os_id and b.os_version else None


def variant_cuda(variant: str | None) -> str | None:
    """The CUDA of a wheel variant (``cu128`` -> ``12.8``); None for ``cpu`` [PT-IDX]."""
    return context.variant_cuda(variant) if variant and VARIANT.fullmatch(variant) else None


def _pip_torch(pip: PipInstall, item: Item, req: Requirement) -> TorchPin:
    specs = list(req.specifier)
    pin = TorchPin(item, pip.tool, spec=str(req.specifier), pip=pip)
    if len(specs) == 1 and specs[0].operator == "==" and specs[0].version.endswith(".*"):  # a series: pip's newest
        pin.version = max([v for v in facts().torch if specs[0].contains(v)] or [specs[0].version[:-2]], key=Version)
        pin.series = specs[0].version
    elif len(specs) == 1 and specs[0].operator in ("==", "==="):
        try:
            v = Version(specs[0].version)
            pin.version, pin.local = v.public, v.local
        except InvalidVersion:
            pin.version = specs[0].version
    main = pip.main
    pytorch = [i for i in pip.indexes if i.pytorch]
    extra_pypi = any(i.pypi for i in pip.indexes if i.role == "extra")
    pin.pypi_in_play = not pip.no_index and (main is None or main.pypi or extra_pypi)
    unknown = next((i for i in pip.indexes if not i.known), None)
    if pin.local and VARIANT.fullmatch(pin.local):
        pin.variant, pin.variant_from = pin.local, f"the local version +{pin.local}"
        pin.index = next((i for i in pytorch if i.variant == pin.local), pytorch[0] if pytorch else None)
        return pin
    if pin.local:
        pin.variant_from = f"the local version +{pin.local} (not a variant envbuild knows)"
        return pin
    if unknown is not None:
        pin.variant_from = f"the index {unknown.url.value} cannot be expanded"
        return pin
    with_variant = [i for i in pytorch if i.variant]
    if with_variant:
        idx = next((i for i in with_variant if i.role == "index"), with_variant[0])
        pin.variant, pin.variant_from, pin.index = idx.variant, f"{OPTION[idx.role]} {idx.url.value}", idx
        return pin
    if pytorch:
        pin.index, pin.variant_from = pytorch[0], f"{pytorch[0].url.value} (every variant: pip picks one)"
        return pin
    rel = facts().torch.get(pin.version or "")
    if rel:
        mirror = "" if main is None or main.pypi else f" (assuming {main.url.value} mirrors PyPI)"
        pin.variant, pin.variant_from = rel.default, f"PyPI's build of torch {pin.version}{mirror}"
    return pin


def _conda_torch(conda: CondaInstall, spec) -> TorchPin:
    item, _name, op, version, build = spec
    pin = TorchPin(item, "conda", spec=f"{op or ''}{version or ''}", conda=conda)
    exact = op == "==" or (op == "=" and version and version.count(".") >= 2)
    if exact and version and "*" not in version:
        pin.version = version
    pin.channel = next((c for c in conda.channels if c), None)
    for _it, name, _op, ver, _b in conda.specs:
        mm = ".".join((ver or "").split(".")[:2])
        if name in ("pytorch-cuda", "cudatoolkit", "cuda-version") and re.fullmatch(r"[0-9]+\.[0-9]+", mm):
            pin.variant, pin.variant_from = context.cuda_variant(mm), f"{name}={ver}"
        elif name == "cpuonly":
            pin.variant, pin.variant_from = "cpu", "cpuonly"
    m = re.search(r"cuda([0-9]+)\.([0-9]+)", build or "")
    if pin.variant is None and m:
        pin.variant, pin.variant_from = f"cu{m.group(1)}{m.group(2)}", f"the build {build}"
    return pin


def _python(stack: Stack, torch: TorchPin | None) -> tuple[Item | None, str | None]:
    if torch and torch.pip and torch.pip.python:
        return torch.pip.python, "interpreter"
    for conda in stack.conda:
        for item, name, _op, version, _b in conda.specs:
            if name == "python" and version and re.fullmatch(r"3\.[0-9]{1,2}(?:\.[0-9*]+)?", version):
                return Item(".".join(version.split(".")[:2]), item.line, item.via), "conda"
    b = stack.base
    if b.python:
        return Item(b.python, stack.base_item.line, stack.base_item.via), "base"
    if b.os_id and b.os_version:
        rel = facts().os.get(b.os_id, {}).get(b.os_version)
        if rel:
            return Item(rel.python, stack.base_item.line, stack.base_item.via), "system"
    return None, None


#: torch's companions: their ``==X+cu121`` pins name the variant of the same release.
COMPANIONS = frozenset({"torchvision", "torchaudio"})


def _without_local(req: Requirement) -> Requirement:
    """``torchvision==0.16.0+cu121`` as ``torchvision==0.16.0``: the rules pair releases; the variant follows torch."""
    specs = [f"{s.operator}{s.version.split('+', 1)[0]}" for s in req.specifier]
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return Requirement(f"{req.name}{extras}{','.join(specs)}")


def _wheel_pin(req: Requirement, stem: str) -> tuple[str, str] | None:
    """``(major, version)`` of an exact ``nvidia-<stem>-cuNN==V`` pin, else None."""
    m = re.fullmatch(rf"nvidia-{stem}-cu([0-9]+)", canonicalize_name(req.name))
    specs = list(req.specifier)
    if m and len(specs) == 1 and specs[0].operator == "==" and RELEASE.fullmatch(specs[0].version):
        return m.group(1), specs[0].version
    return None


def pins(stack: Stack) -> Pins:
    """The :class:`Pins` of ``stack``."""
    found: list[TorchPin] = [_pip_torch(p, it, r) for p, it, r in stack.torch_requirements()]
    for conda in stack.conda:
        for spec in conda.specs:
            if spec[1] == "pytorch":
                found.append(_conda_torch(conda, spec))
    order = {s.index: i for i, s in reversed(list(enumerate(stack.stages)))}
    found.sort(key=lambda t: (order[t.pip.stage if t.pip else t.conda.stage if t.conda else 0], t.item.line))
    torch = found[-1] if found else None
    b = stack.base
    if torch is None and b.torch:
        torch = TorchPin(stack.base_item, "base", version=b.torch, variant=b.variant,
                         variant_from=f"the base image {b.image}", spec=b.torch)
    out = Pins(stack, torch, found)
    out.python, out.python_from = _python(stack, torch)
    out.cuda = b.cuda
    major = (variant_cuda(torch.variant) or "").split(".")[0] or None if torch and torch.variant else None
    seen: dict[str, int] = {}
    for p in stack.pip:
        for item, req in p.requirements:
            if req is None:
                out.others.append(item)
                continue
            name = canonicalize_name(req.name)
            if name == "torch":
                continue
            nccl, cudnn = _wheel_pin(req, "nccl"), _wheel_pin(req, "cudnn")
            if nccl and nccl[0] == major:
                out.nccl = (item, nccl[1], name)
            elif cudnn and cudnn[0] == major:
                out.cudnn = (item, cudnn[1], name)
            else:
                req = _without_local(req) if name in COMPANIONS else req
                if name in seen:
                    out.pip[seen[name]] = (item, req, p.tool)
                else:
                    seen[name] = len(out.pip)
                    out.pip.append((item, req, p.tool))
    return out
