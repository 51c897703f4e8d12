"""Rules on the torch release and variant: they exist, their CUDA matches the recipe's, the
wheel index serves them, and the backend fits them [S2, compat.md §5.5, PT-IDX, multinode.md]."""

from __future__ import annotations

from packaging.version import Version

from ..fields import VARIANT
from ..spec import ERROR, NOTE, WARNING
from .context import Ctx, major_minor, severity, torch_index_for

#: The oldest torch a recipe may pin: the 1.x facts serve ``envbuild audit`` of old files only.
RECIPE_FLOOR = Version("2.0.0")


def release_variant(c: Ctx) -> None:
    """The torch release and variant exist [S2]."""
    r = c.r
    known = sorted((v for v in c.data.torch if Version(v) >= RECIPE_FLOOR), key=Version)
    if r.torch.version and c.rel is None:
        c.add(ERROR, "torch-release", ["torch.version"],
              f"torch {r.torch.version} is not in envbuild's compatibility data; known releases: {', '.join(known)}",
              "S2 (V)")
    elif r.torch.version and Version(r.torch.version) < RECIPE_FLOOR:
        c.add(ERROR, "torch-floor", ["torch.version"],
              f"recipes start at torch {RECIPE_FLOOR}: torch {r.torch.version} is judged by envbuild audit only "
              f"(its facts are kept for old files); use one of {known[0]} to {known[-1]}", "envbuild")
    if c.rel and c.variant:
        vlist = c.variant_list()
        tag = c.rel.variants.tag
        if c.variant != "cpu" and c.variant not in vlist:
            named = "torch.variant" if r.torch.variant else "cuda.version"
            c.add(severity(tag), "torch-variant", ["torch.version", named],
                  f"torch {r.torch.version} has no {c.variant} build; builds exist for {', '.join(vlist)}",
                  f"S2 ({tag})")
    if c.variant == "cpu" and c.cuda and c.valid("cuda"):
        major = c.cuda.split(".")[0]
        alt = c.variants_for_major(major)
        hint = f"or use {' or '.join(alt)}" if alt else f"({_named(c)} has no CUDA {major} build)"
        c.add(ERROR, "cpu-with-cuda", ["torch.variant", "cuda.version"],
              f"torch variant cpu does not use the image's CUDA {c.cuda}: drop the CUDA {hint}", "S2 (V)")


def _named(c: Ctx) -> str:
    return f"torch {c.r.torch.version}" if c.r.torch.version else "this torch"


def cuda(c: Ctx) -> None:
    """CUDA of the variant vs the recipe's CUDA [compat.md §5.5]."""
    if not (c.variant and c.valid("cuda")):
        return
    if c.vcuda and c.cuda:
        if c.vcuda.split(".")[0] != c.cuda.split(".")[0]:
            major = c.cuda.split(".")[0]
            alt = c.variants_for_major(major)
            hint = (f"use {' or '.join(alt)} or CUDA {c.vcuda}" if alt else
                    f"{_named(c)} has no CUDA {major} build; use CUDA {c.vcuda}")
            c.add(ERROR, "cuda-major", ["torch.variant", "cuda.version"],
                  f"torch variant {c.variant} is CUDA {c.vcuda} but the image's CUDA is {c.cuda}; "
                  f"the major versions must match ({hint})", "compat.md §5.5 (V)")
        elif c.vcuda != major_minor(c.cuda):
            c.add(WARNING, "cuda-minor", ["torch.variant", "cuda.version"],
                  f"torch variant {c.variant} brings its own CUDA {c.vcuda} runtime; the image's CUDA is {c.cuda} "
                  "(minor versions differ)", "compat.md §5.5 (U)")
    if c.variant != "cpu" and not c.cuda:
        c.add(ERROR, "cuda-missing", ["torch.variant", "cuda"],
              f"torch variant {c.variant} needs a cuda section (cuda.version: {c.vcuda})", "S2 (V)")


def backend(c: Ctx) -> None:
    """The nccl backend needs a CUDA build [multinode.md]."""
    if c.r.certify.backend == "nccl" and c.variant == "cpu" and c.valid("certify.backend"):
        c.add(ERROR, "backend-nccl-cpu", ["certify.backend", "torch.variant"],
              "backend nccl needs a CUDA build of torch; use gloo for a CPU image", "multinode.md (V)")


PYPI_HOSTS = ("pypi.org", "pypi.python.org", "files.pythonhosted.org")


def torch_index(c: Ctx) -> None:
    """Where torch comes from: the variant's folder of the PyTorch index [PT-IDX]. Derived when ``index.torch_url`` is
    omitted; one that names another variant, or PyPI (which has no ``+cpu``/``+cuXYZ`` builds), is refused."""
    given = c.r.index.torch_url
    if not (c.variant and c.valid("index.torch_url")):
        return
    src = f"PT-IDX ({c.data.torch_index.tag})"
    derived = torch_index_for(c.variant)
    if not given:
        c.torch_index_url = derived
        c.add(NOTE, "torch-index", ["index.torch_url"],
              f"torch {c.local} comes from {derived} (derived from the variant)", src)
        return
    c.torch_index_url = given
    url = given.rstrip("/")
    last = url.rsplit("/", 1)[-1]
    host = url.split("/")[2].lower() if url.count("/") >= 2 else ""
    if VARIANT.fullmatch(last) and last != c.variant:
        c.add(ERROR, "torch-index-variant", ["index.torch_url", "torch.variant"],
              f"index.torch_url {given} is the {last} index but the variant is {c.variant}: pip finds no "
              f"torch=={c.local} there; use {derived} or leave index.torch_url out", src)
    elif host in PYPI_HOSTS:
        c.add(ERROR, "torch-index-pypi", ["index.torch_url"],
              f"index.torch_url {given} is PyPI, which has no torch=={c.local} (local +{c.variant} builds live on "
              f"the PyTorch index); use {derived} or leave index.torch_url out", src)
