"""Audit-only rules: what a file can get wrong that a recipe cannot, each naming its source. Worded like the recipe
rules (:mod:`builder.recipe.rules`); the rule ids and their facts are in the functions below."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import cast

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.recipe.facts import facts
from builder.recipe.rules.context import cuda_variant, severity, torch_index_for
from builder.recipe.rules.network import SOCKET_VARIABLES, loopback_only
from builder.recipe.rules.release import RECIPE_FLOOR
from builder.recipe.spec import ERROR, NOTE, WARNING

from . import bases
from .extract import OPTION, Item
from .model import Finding, Level, cut
from .pins import Pins, TorchPin, variant_cuda


class Out:
    """The findings of one file, each at the line, value and ``via`` of its :class:`Item`."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[Finding] = []

    def add(self, level: Level, rule: str, item: Item | None, message: str, source: str,
            fields: tuple[str, ...] = ()) -> None:
        self.items.append(Finding(level=level, rule=rule, file=self.file, line=item.line if item else None,
                                  value=cut(item.value) if item else None, via=item.via if item else None,
                                  message=message, source=source, fields=fields))


def example(p: Pins) -> str:
    """A pin for the fix text: the file's own release and build when known, else the newest verified release with a
    build for the base image's CUDA (else that release's default build)."""
    t, rows = p.torch, facts().torch
    if t and t.version in rows and t.variant in (*rows[t.version].variants.list, "cpu"):
        version, variant = t.version, t.variant
    else:
        rels = sorted(rows.items(), key=lambda kv: (kv[1].variants.tag == "V", Version(kv[0])), reverse=True)
        want = t.variant if t and t.variant else cuda_variant(p.stack.base.cuda) if p.stack.base.cuda else None
        version, rel = next(((v, r) for v, r in rels if want in (*r.variants.list, "cpu")), rels[0])
        variant = want if want in (*rel.variants.list, "cpu") else rel.default
    return f"torch=={version}+{variant} --index-url {torch_index_for(variant)}"


def _what(t: TorchPin) -> str:
    return f"torch {t.version}+{t.variant}" if t.version and t.variant else f"torch{t.spec}" if t.spec else "torch"


def _notes(p: Pins, out: Out) -> None:
    """What the parser and the extraction could not read."""
    for n in p.stack.notes:
        out.add(n.level, n.rule, Item(n.value or "", n.line) if n.value is not None else None, n.message, "audit")


def _base(p: Pins, out: Out) -> None:
    """What the base image's name does not say [NV-IMG, NGC-RN, PT-IMG, PY-IMG, DISTRO]."""
    b = p.stack.base
    if b.why:
        level: Level = NOTE if p.os or (b.kind == "ngc-pytorch" and b.cuda) else WARNING
        out.add(level, "base-unread", p.stack.base_item,
                f"base image: {b.why}; the rules on what it does not say are skipped", b.source or "audit")
    if p.torch and p.torch.installer == "base":
        out.add(NOTE, "torch-from-base", p.stack.base_item,
                f"torch {b.torch} comes with the base image (no pip or conda install of torch in this file)",
                b.source or "audit")


def _torch(p: Pins, out: Out) -> None:
    """torch found, pinned, its build known [compat.md §5.1]."""
    t = p.torch
    if t is None:
        out.add(WARNING, "no-torch", p.stack.base_item, "no torch install found in the stages the final image uses "
                "(audit reads pip, uv and conda installs; requirement files are not followed)", "audit")
        return
    if t.installer == "base":
        return
    tool = "conda" if t.installer == "conda" else "pip"
    if t.version is None:
        out.add(ERROR, "torch-unpinned", t.item,
                f"torch{t.spec or ''} is not pinned to one release: {tool} installs the newest matching one, and which "
                f"CUDA build that is changes from release to release; pin one release and its build"
                f"{', e.g. ' + example(p) if tool == 'pip' else ' (e.g. pytorch==2.5.1 with pytorch-cuda=12.4)'}",
                "compat.md §5.1 (V)")
    elif t.variant is None:
        out.add(WARNING, "variant-unknown", t.item,
                f"cannot tell which build of torch {t.version} this installs "
                f"({t.variant_from or 'no index names a variant'}); the rules on its CUDA are skipped", "PT-IDX (V)")
    if t.series and t.version != t.series[:-2]:
        out.add(NOTE, "torch-series", t.item, f"torch=={t.series} is judged as {t.version}, the newest release of the "
                f"series in envbuild's facts: {tool} installs the newest one", "compat.md §5.1 (V)")


def _pypi_wins(p: Pins, out: Out) -> None:
    """An extra index beside PyPI: pip takes the highest version of all [compat.md §5.1]; uv the first [UV-IDX]."""
    t = p.torch
    if t is None or t.index is None or not t.pypi_in_play or t.installer not in ("pip", "uv"):
        return
    if t.installer == "uv" and ((t.pip.strategy if t.pip else None) or "first-index") != "unsafe-best-match":
        return
    rel = facts().torch.get(t.version or "")
    if (t.version and t.local) or (rel and t.version and rel.default == t.variant):
        return  # an exact +local pin; or PyPI's build of that release is the very variant
    url, variant = t.index.url.value, t.index.variant or t.variant
    pypi = f"PyPI's torch {t.version} (its {rel.default} build)" if rel else "PyPI's torch"
    tool = "pip" if t.installer == "pip" else "uv with --index-strategy unsafe-best-match"
    out.add(WARNING, "pypi-wins", t.item,
            f"torch{t.spec} comes from {OPTION[t.index.role]} {url} with PyPI still read: {tool} takes the highest "
            f"matching version of every index, so {pypi} can be installed instead of "
            f"{'+' + variant if variant else 'the build of ' + url}; "
            f"{'pin torch==' + t.version + '+' + variant + ' or ' if t.version and variant else ''}use --index-url "
            f"{url}", "compat.md §5.1 (V)")


def _wheel_cuda(p: Pins, out: Out) -> None:
    """The wheel's CUDA vs the base image's CUDA: minor versions differ [compat.md §5.5, NV-IMG]."""
    t, b = p.torch, p.stack.base
    vc = variant_cuda(t.variant) if t else None
    if not (t and vc and b.cuda and t.installer != "base"):
        return
    base_mm = ".".join(b.cuda.split(".")[:2])
    if vc != base_mm and vc.split(".")[0] == base_mm.split(".")[0]:
        alt = cuda_variant(base_mm)
        rel = facts().torch.get(t.version or "")
        fix = (f"use torch +{alt} or a CUDA {vc} base" if rel and alt in rel.variants.list
               else f"use a CUDA {vc} base (torch {t.version} has no {alt} build)" if rel else f"use a CUDA {vc} base")
        out.add(ERROR, "wheel-cuda-base", t.item,
                f"{_what(t)} (from {t.variant_from}) is built for CUDA {vc} but the base image {b.image} has CUDA "
                f"{b.cuda}: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA "
                f"mismatch; {fix}",
                "compat.md §5.5, NV-IMG (V)")


def _conda(p: Pins, out: Out) -> None:
    """pytorch from conda; the pytorch channel's last release [PT-CONDA]."""
    row = bases.facts()["conda"]["pytorch_channel_last_series"]
    last = Version(str(row["version"]))
    for t in p.all_torch:
        if t.installer != "conda":
            continue
        version = None
        with contextlib.suppress(InvalidVersion):
            version = Version(t.version) if t.version else None
        if t.channel == "pytorch" and version and Version(f"{version.major}.{version.minor}") > last:
            out.add(ERROR, "conda-torch", t.item,
                    f"the pytorch conda channel has no pytorch {t.version}: {row['version']} was the last release "
                    f"published there; install the wheel (pip install {example(p)})",
                    f"{row['source']} ({row['tag']})")
        else:
            out.add(WARNING, "conda-torch", t.item,
                    f"pytorch from conda{' (-c ' + t.channel + ')' if t.channel else ''} is a conda build, not the "
                    "wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after "
                    f"{row['version']}; " + ("--to-recipe writes the wheel of the same release and variant"
                                             if not version or version >= RECIPE_FLOOR else "it is judged as the wheel "
                                             f"of the same release (recipes start at torch {RECIPE_FLOOR})"),
                    f"{row['source']} ({row['tag']})")


def _twice(p: Pins, out: Out) -> None:
    """torch installed more than once with different pins: the last install wins."""
    distinct = {(t.installer, t.spec, t.variant) for t in p.all_torch}
    if len(distinct) > 1 and p.torch:
        lines = ", ".join(f"line {t.item.line}: {t.item.value}" + (f" from {t.variant_from}" if t.variant_from else "")
                          for t in p.all_torch[:5])
        out.add(WARNING, "torch-twice", p.torch.item,
                f"torch is installed {len(p.all_torch)} times with different pins ({lines}); the image gets the "
                "last one", "audit")


def _socket(p: Pins, out: Out) -> None:
    """Other ``*_SOCKET_IFNAME`` variables selecting only loopback [NCCL-ENV]; NCCL's and gloo's are recipe rules."""
    for e in p.stack.env:
        if e.name.endswith("_SOCKET_IFNAME") and e.name not in SOCKET_VARIABLES \
                and e.value is not None and loopback_only("GLOO_SOCKET_IFNAME", e.value):
            out.add(ERROR, "socket-ifname-loopback", Item(f"{e.name}={e.value}", e.line),
                    f"{e.name}={e.value} selects only the loopback interface; ranks on several nodes cannot reach each "
                    "other over it (remove it, or name the interface the nodes share, e.g. eth0)",
                    "NCCL-ENV, multinode.md (M)")


def _not_followed(p: Pins, out: Out) -> None:
    """Requirement files, paths and find-links wheels: named, not followed."""
    for pip in p.stack.pip:
        for f in pip.files:
            out.add(NOTE, "not-followed", f, "a requirements file is not followed (audit reads this file only); "
                    "the pins in it are not judged", "audit")
        for idx in pip.indexes:
            if idx.role == "find" and not idx.pytorch:
                out.add(NOTE, "find-links", idx.url,
                        "wheels may also come from this find-links location: not checked", "audit")
    for conda in p.stack.conda:
        for f in conda.files:
            out.add(NOTE, "not-followed", f, "a conda package list is not followed (audit reads this file only)",
                    "audit")
    for item in p.others:
        out.add(NOTE, "not-read", item,
                "not a requirement audit reads (a path, URL or editable install): not judged", "audit")


def _companion_over_base(p: Pins, out: Out) -> None:
    """An unpinned torchvision/torchaudio over a base's torch: pip installs the newest, whose wheel requires its own
    torch release, so pip may replace the base's torch and its CUDA [S1-COMP, PT-IMG, NGC-RN]."""
    b, rows = p.stack.base, facts().companions
    if not (p.torch and p.torch.installer == "base"):
        return
    for item, req, _tool in p.pip:
        name = canonicalize_name(req.name)
        if name not in rows or any(s.operator in ("==", "===") for s in req.specifier):
            continue
        pair: list[str] = []
        with contextlib.suppress(InvalidVersion):
            pair = [v for v, row in rows[name].items() if SpecifierSet(row.torch).contains(b.torch or "", True)]
        fix = f"pin {name}=={pair[-1]}" if pair else f"use the {name} the image ships, or pin the release of its torch"
        out.add(WARNING, "companion-over-base", item,
                f"{req} is not pinned over the base image's torch {b.torch}: pip installs the newest {name}, whose "
                f"wheel requires its own torch release, and may replace the base's torch and its CUDA; {fix}",
                f"S1-COMP, {b.source or 'audit'}")


def base_driver(p: Pins, driver: str | None) -> list[Finding]:
    """``--driver`` against the base image's own CUDA (the wheel's CUDA is a recipe rule) [NV-RN Table 3, NV-MVC]."""
    out, b = Out(p.stack.file), p.stack.base
    mm = ".".join((b.cuda or "").split(".")[:2])
    if not (driver and mm) or (p.torch and variant_cuda(p.torch.variant) == mm):
        return out.items
    floor = facts().cuda_driver.get(mm)
    if floor is None:
        out.add(NOTE, "driver-unknown", p.stack.base_item, f"envbuild has no driver floor for CUDA {mm} of the "
                "base image; --driver is not judged against it", "NV-RN (U)")
    elif Version(driver) < Version(floor.minor_compat):
        out.add(cast(Level, severity(floor.tag)), "driver-too-old", p.stack.base_item,
                f"driver {driver} is below {floor.minor_compat}, the oldest that runs the base image's CUDA {b.cuda}",
                f"NV-RN, NV-MVC ({floor.tag})")
    elif Version(driver) < Version(floor.ga):
        out.add(WARNING, "driver-minor-compat", p.stack.base_item,
                f"driver {driver} is below {floor.ga} (CUDA {mm} GA), which the base image's CUDA {b.cuda} needs: it "
                "runs only under minor-version compatibility (no PTX JIT, some APIs fail)", f"NV-MVC ({floor.tag})")
    return out.items


#: The audit-only rules, in the order their findings are listed.
RULES: tuple[Callable[[Pins, Out], None], ...] = (_notes, _base, _torch, _pypi_wins, _wheel_cuda, _conda, _twice,
                                                  _socket, _not_followed, _companion_over_base)


def audit(p: Pins) -> list[Finding]:
    """Every audit-only finding on ``p``."""
    out = Out(p.stack.file)
    for rule in RULES:
        rule(p, out)
    return out.items
