"""The no-change build: find the image of unchanged inputs from image IDs and the inputs' hash.

A build's tag is ``envbuild/<recipe>:<first 12 hex of sha256(lock + Dockerfile + base image
ID)>`` (:func:`builder.image.build.image_tag`). When the base is already local, its ID, and with
it the tag, is known without a pull, a bootstrap, a container or pip's configuration:
:func:`find` asks the engine for the base's ID and for the image under that tag, through
:mod:`builder.image.engineapi` (no docker SDK). Whether that image's probe matched this lock
is then read from :mod:`builder.image.probecache`, keyed by the image's ID.

The base is the one :func:`builder.image.bootstrap.resolve_base` would take, restricted to
what is already local: ``--base IMAGE`` when local; the stand-in of ``--base-mode bootstrap``
when it exists; the official base when local (``auto``, ``local``); and in ``auto`` mode,
when the official base is not local, the bootstrapped stand-in an earlier build used, with a
warning: the registry is not asked (``--base-mode pull`` asks it). ``--base-mode pull`` and a
base that is not local are never decided here: :func:`find` returns None and the build
resolves the base as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import bootstrap, engineapi

if TYPE_CHECKING:
    from .build import BuildOptions


@dataclass(frozen=True)
class Found:
    """An image of unchanged inputs (:func:`find`).

    Attributes:
        tag: ``envbuild/<recipe>:<12 hex>``.
        digest: the inputs' full sha256 (64 hex).
        image_id: ``sha256:<64 hex>`` of the image under ``tag``.
        labels: that image's labels.
        base: ``(ref used, image ID, how)`` as :func:`builder.image.bootstrap.resolve_base` returns.
        warning: one line to show (a bootstrapped stand-in is reused without asking the
            registry), or None.
    """

    tag: str
    digest: str
    image_id: str
    labels: dict[str, str]
    base: tuple[str, str, str]
    warning: str | None = None


def _local_base(api: engineapi.EngineAPI, options: BuildOptions, official: str) -> tuple[str, str, str] | None:
    """The base :func:`builder.image.bootstrap.resolve_base` would take when it is already
    local, else None (see the module docstring)."""
    mode, override = options.base_mode, options.site.base_override
    if mode not in bootstrap.MODES:
        override, mode = override or mode, "auto"
    if mode == "pull":
        return None
    if override:
        doc = None if mode == "bootstrap" else api.inspect_image(override)
        return (override, doc["Id"], "explicit") if doc else None
    if mode != "bootstrap":
        doc = api.inspect_image(official)
        if doc:
            return official, doc["Id"], "local"
        if mode == "local":
            return None
    suite = bootstrap.debian_suite(official)
    if suite is None:
        return None
    ref = bootstrap.bootstrap_ref(suite)
    doc = api.inspect_image(ref)
    return (ref, doc["Id"], "bootstrapped") if doc else None


def find(options: BuildOptions, dockerfile: bytes, lock_bytes: bytes, official: str,
         api: engineapi.EngineAPI | None = None) -> Found | None:
    """The image built before from these rendered files on this base, or None when there is
    none, when the base is not local (a pull or bootstrap decides it), or when the engine
    cannot be asked without the docker SDK (a remote ``DOCKER_HOST``, an error: the caller
    takes the SDK path, which reports engine errors).

    Args:
        options: the build's options (recipe, base mode, ``--base``; nothing of pip's configuration).
        dockerfile, lock_bytes: the rendered files' bytes.
        official: the Dockerfile's ``ARG BASE_IMAGE`` default.
        api: the engine (default :func:`builder.image.engineapi.connect`).
    """
    from .build import image_tag

    api = api or engineapi.connect()
    if api is None:
        return None
    try:
        base = _local_base(api, options, official)
        if base is None:
            return None
        tag, digest = image_tag(options.recipe, lock_bytes, dockerfile, base[1])
        doc = api.inspect_image(tag)
    except engineapi.EngineAPIError:
        return None
    if doc is None:
        return None
    warning = None
    if base[2] == "bootstrapped" and options.base_mode == "auto":
        warning = (f"{official} is not available locally: {tag}, built on the bootstrapped base {base[0]} "
                   "(debootstrap minbase, not byte-identical to the official image), is reused without asking "
                   "the registry (--base-mode pull asks it)")
    return Found(tag=tag, digest=digest, image_id=doc["Id"], labels=engineapi.image_labels(doc), base=base,
                 warning=warning)
