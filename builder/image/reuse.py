"""The no-change build: the image of unchanged inputs found from image IDs and the inputs' hash.
A base already local gives the tag without a pull, a container or pip's configuration; the
registry is never asked (``--base-mode pull`` and a base not local return None)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import bootstrap
from .engine import Engine

if TYPE_CHECKING:
    from .build import BuildOptions


@dataclass(frozen=True)
class Found:
    """An image of unchanged inputs; ``base`` as :func:`~.bootstrap.resolve_base`; ``warning``: a stand-in."""

    tag: str
    digest: str
    image_id: str
    labels: dict[str, str]
    base: tuple[str, str, str]
    warning: str | None = None


def _local_base(api: Engine, options: BuildOptions, official: str) -> tuple[str, str, str] | None:
    mode, override = options.base_mode, options.site.base_override
    if mode not in bootstrap.MODES:
        override, mode = override or mode, "auto"
    if mode == "pull":
        return None
    if override:
        img = None if mode == "bootstrap" else api.inspect_image(override)
        return (override, img.id, "explicit") if img else None
    if mode != "bootstrap":
        img = api.inspect_image(official)
        if img:
            return official, img.id, "local"
        if mode == "local":
            return None
    suite = bootstrap.debian_suite(official)
    if suite is None:
        return None
    ref = bootstrap.bootstrap_ref(suite)
    img = api.inspect_image(ref)
    return (ref, img.id, "bootstrapped") if img else None


def find(options: BuildOptions, dockerfile: bytes, lock_bytes: bytes, official: str,
         api: Engine | None = None) -> Found | None:
    """The image built before from these files on this base (``official``: ``ARG BASE_IMAGE``), or None."""
    from .build import image_tag

    api = api or Engine()
    base = _local_base(api, options, official)
    if base is None:
        return None
    tag, digest = image_tag(options.recipe, lock_bytes, dockerfile, base[1])
    img = api.inspect_image(tag)
    if img is None:
        return None
    warning = None
    if base[2] == "bootstrapped" and options.base_mode == "auto":
        warning = (f"{official} is not available locally: {tag}, built on the bootstrapped base {base[0]} "
                   "(debootstrap minbase, not byte-identical to the official image), is reused without asking "
                   "the registry (--base-mode pull asks it)")
    return Found(tag=tag, digest=digest, image_id=img.id, labels=img.labels, base=base, warning=warning)
