"""Rule on the base image: the CUDA and OS its tag names match the recipe's [NV-IMG, DISTRO]."""

from __future__ import annotations

import re

from ..spec import ERROR, WARNING
from .context import CUDA_TAG, Ctx, base_tag, major_minor

_DISTRO_REPOS = ("debian", "library/debian", "docker.io/library/debian",
                 "ubuntu", "library/ubuntu", "docker.io/library/ubuntu")


def base_image(c: Ctx) -> None:
    """The base image: its CUDA and OS from the tag [NV-IMG, DISTRO]."""
    image = c.r.base.image
    if not image:
        return
    repo, tag = base_tag(image)
    if repo.endswith("nvidia/cuda") and tag:
        m = CUDA_TAG.fullmatch(tag)
        if not m:
            c.add(WARNING, "base-tag", ["base.image"],
                  f"cannot read CUDA and OS from the tag {tag!r} (expected X.Y.Z-flavour-osVER)", "NV-IMG (U)")
            return
        _cuda_image(c, image, tag, m)
    elif repo in _DISTRO_REPOS and tag and c.r.os.id and c.r.os.version:
        _distro_image(c, image, repo, tag)


def _cuda_image(c: Ctx, image: str, tag: str, m: re.Match[str]) -> None:
    """An ``nvidia/cuda:X.Y.Z-flavour-osVER`` base vs the recipe's CUDA, OS and NCCL."""
    r = c.r
    bcuda, flavour = m.group("cuda"), m.group("flavour")
    if not c.valid("cuda"):
        pass
    elif not c.cuda:
        c.add(WARNING, "base-cuda-unused", ["base.image", "cuda"],
              f"base image {image} carries CUDA {bcuda} but the recipe has no cuda section", "NV-IMG (V)")
    elif bcuda.split(".")[0] != c.cuda.split(".")[0]:
        c.add(ERROR, "base-cuda-major", ["base.image", "cuda.version"],
              f"base image CUDA {bcuda} and the recipe's CUDA {c.cuda} differ in major version; "
              f"use an nvidia/cuda:{c.cuda}.x tag", "NV-IMG (V)")
    elif major_minor(bcuda) != major_minor(c.cuda):
        c.add(WARNING, "base-cuda-minor", ["base.image", "cuda.version"],
              f"base image CUDA {bcuda} and the recipe's CUDA {c.cuda} differ in minor version", "NV-IMG (V)")
    base_os = (m.group("os"), m.group("osver"))
    if r.os.id and r.os.version and base_os != (r.os.id, r.os.version):
        c.add(ERROR, "base-os", ["base.image", "os.id", "os.version"],
              f"base image {tag} is {base_os[0]} {base_os[1]} but the recipe says {r.os.id} {r.os.version}",
              "NV-IMG (V)")
    sys_nccl = c.data.cuda_image_nccl.get(bcuda)
    if flavour != "base" and sys_nccl and c.nccl and str(sys_nccl) != c.nccl:
        c.add(WARNING, "base-second-nccl", ["base.image", "nccl"],
              f"the {flavour} flavour ships a system libnccl2 {sys_nccl} beside torch's NCCL {c.nccl}: two NCCLs in "
              "one image; prefer the base flavour", "compat.md §4 (S)")


def _distro_image(c: Ctx, image: str, repo: str, tag: str) -> None:
    """A ``debian:<tag>`` / ``ubuntu:<tag>`` base vs the recipe's OS (tags by version or codename)."""
    r = c.r
    distro = repo.rsplit("/", 1)[-1]
    word = tag.split("-")[0]
    versions = c.data.os.get(distro, {})
    tag_version = next((v for v, row in versions.items() if word == v or word in row.codenames), None)
    if distro != r.os.id or (tag_version and tag_version != r.os.version):
        c.add(ERROR, "base-os", ["base.image", "os.id", "os.version"],
              f"base image {image} is {distro} {tag_version or word} but the recipe says {r.os.id} {r.os.version}",
              "DISTRO (V)")
