"""``envbuild lock RECIPE``: resolve what the recipe leaves open, for reproducible builds.

The rendered lock (:meth:`builder.recipe.spec.Spec.lock`) pins what the recipe says: torch,
NCCL, Python, the base image *tag*. This stage resolves the rest, where it can be reached:

* **base image**: the tag to a manifest digest (:mod:`builder.resolve.base`): the digest the
  engine recorded when the image was pulled (``RepoDigests``), else the registry's answer
  to ``HEAD /v2/<repo>/manifests/<tag>`` (OCI distribution spec); a ref already pinned by
  digest is kept;
* **pip**: every requirement and dependency to an exact version with the sha256 of the
  wheel, by pip's own resolver (:mod:`builder.resolve.pip`);
* **apt**: every package the rendered files install by name to the candidate version of
  the base image's mirror (:mod:`builder.resolve.apt`).

The result (:class:`~builder.recipe.model.Resolved`) is written to
``images/<recipe>/envbuild.resolved.json`` (schema ``envbuild.resolved/1``,
byte-deterministic: no time stamps), tied to the rendered lock by ``lock_hash``; then the
recipe is rendered again so that ``envbuild.lock.json`` carries the pins under the key
``resolved`` and the Dockerfile/Singularity definition install ``--require-hashes``
(:func:`builder.render.rendered.render_for`). What cannot be resolved (no registry, index or
mirror reachable) is listed in ``unresolved`` and left as the recipe has it; ``envbuild
lock`` then exits 1 (warnings).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.errors import EnvbuildError
from builder.core.files import write_atomic
from builder.core.paths import image_dir
from builder.image.site import SiteOptions
from builder.recipe.fields import RESOLVED_SCHEMA
from builder.recipe.lock import lock_hash
from builder.recipe.model import AptSource, PipResolver, Resolved, ResolvedBase, ResolvedWheel
from builder.recipe.spec import Spec
from builder.render.rendered import render
from builder.render.resolved import check_resolved, load_resolved
from builder.render.write import stale, write

from .apt import apt_names, resolve_apt
from .base import RegistryFactory, base_digest
from .pip import platform_tags, resolve_pip

PipResolverFn = Callable[[Spec, SiteOptions], "tuple[list[ResolvedWheel] | None, str | None]"]


@dataclass
class LockResult:
    """Outcome of :func:`lock`.

    Attributes:
        path: the ``envbuild.resolved.json`` written.
        resolved: its content.
        unresolved: one line per thing left unresolved (the warnings).
        written: rendered files rewritten because of the new pins.
    """

    path: Path
    resolved: Resolved
    unresolved: list[str]
    written: list[Path] = field(default_factory=list)


def resolved_bytes(resolved: Resolved) -> bytes:
    """Canonical serialisation of ``envbuild.resolved.json`` (sorted keys, 2-space indent, trailing newline)."""
    return (json.dumps(resolved.to_dict(), indent=2, sort_keys=True) + "\n").encode()


def write_resolved(resolved: Resolved, images_dir: str | os.PathLike[str]) -> Path:
    """Write ``images_dir/<recipe>/envbuild.resolved.json`` atomically. Returns the path."""
    where = image_dir(images_dir, resolved.recipe)
    where.folder.mkdir(parents=True, exist_ok=True)
    return write_atomic(where.resolved, resolved_bytes(resolved))


@dataclass
class _Parts:
    """The parts of the resolved document as they stand (the previous file's, or open)."""

    base: ResolvedBase
    pip: tuple[ResolvedWheel, ...] = ()
    pip_resolver: PipResolver = PipResolver()
    apt: dict[str, str] = field(default_factory=dict)
    apt_source: AptSource | None = None
    unresolved: list[str] = field(default_factory=list)


def _previous(spec: Spec, images_dir: str | os.PathLike[str]) -> _Parts:
    """The parts of the earlier resolved file when it is for the same lock, else open ones."""
    try:
        before = load_resolved(spec, images_dir)
    except EnvbuildError:
        before = None
    if before is None:
        return _Parts(base=ResolvedBase(ref=spec.recipe.base.image, digest=None, source="none"))
    return _Parts(base=before.base, pip=before.pip, pip_resolver=before.pip_resolver, apt=dict(before.apt),
                  apt_source=before.apt_source)


def _resolve_pip(spec: Spec, site: SiteOptions, parts: _Parts, resolver: PipResolverFn) -> None:
    wheels, note = resolver(spec, site)
    parts.pip = tuple(wheels) if wheels is not None else ()
    if wheels is None:
        parts.unresolved.append(note or "pip: not resolved")
    r = spec.recipe
    parts.pip_resolver = PipResolver(python=r.python, platform=platform_tags(spec.glibc)[0],
                                     indexes=tuple(u for u in (r.index.url, spec.torch_index_url) if u),
                                     site_wheels=bool(site.wheel_dir))


def _resolve_apt(spec: Spec, site: SiteOptions, client: Any, parts: _Parts, *, base_mode: str,
                 labels: Mapping[str, str] | None, say: Callable[[str], None]) -> None:
    if client is None:
        parts.unresolved.append("apt: no Docker engine to query the base image")
        return
    from builder.image import bootstrap

    names = apt_names(spec)
    official = spec.recipe.base.image
    say(f"resolving apt versions of {', '.join(names)}")
    try:
        image, _image_id, how = bootstrap.resolve_base(client, official, base_mode, override=site.base_override,
                                                       warn=lambda _m: None)
    except EnvbuildError as e:
        parts.unresolved.append(f"apt: no base image to query ({e})")
        return
    pins, note = resolve_apt(client, image, names, labels=labels)
    if pins is not None:
        parts.apt = pins
        parts.apt_source = AptSource(image=image if how != "bootstrapped" else
                                     f"{image} (bootstrapped stand-in for {official})")
    if note:
        parts.unresolved.append(note)


def lock(spec: Spec, images_dir: str | os.PathLike[str], site: SiteOptions, client: Any = None, *,
         base: bool = True, pip: bool = True, apt: bool = True, base_mode: str = "auto",
         labels: Mapping[str, str] | None = None, say: Callable[[str], None] | None = None,
         pip_resolver: PipResolverFn | None = None, registry: RegistryFactory | None = None) -> LockResult:
    """Resolve ``spec`` (see the module doc), write ``envbuild.resolved.json`` and render.

    Args:
        spec: a compatible spec (:func:`builder.recipe.rules.require_ok`).
        images_dir: the rendered files' root (``images/``).
        site: CA bundle and wheel folder for pip; ``base_override`` for the apt query image.
        client: docker client (base digest from the engine, apt query); None skips both.
        base, pip, apt: which parts to resolve (a part not resolved keeps its previous pins
            when the earlier resolved file is for the same lock, else stays open).
        base_mode: how to get an image to query apt in (:func:`builder.image.bootstrap.resolve_base`).
        labels: labels for the temporary containers.
        say: progress messages.
        pip_resolver: replaces :func:`builder.resolve.pip.resolve_pip` (tests).
        registry: makes the registry client asked for the base digest
            (:data:`builder.resolve.base.RegistryFactory`); None: the engine only.

    Returns:
        :class:`LockResult`.

    Raises:
        EnvbuildError: (exit 2) the recipe is not compatible; unwritable files.
    """
    say = say or (lambda _m: None)
    parts = _previous(spec, images_dir)
    if base:
        say(f"resolving the base image {spec.recipe.base.image}")
        parts.base, note = base_digest(spec.recipe.base.image, client, registry)
        parts.unresolved.extend([note] if note else [])
    if pip:
        say("resolving pip requirements with pip's resolver")
        _resolve_pip(spec, site, parts, pip_resolver or resolve_pip)
    if apt:
        _resolve_apt(spec, site, client, parts, base_mode=base_mode, labels=labels, say=say)
    doc = Resolved(schema=RESOLVED_SCHEMA, recipe=spec.name, lock_hash=lock_hash(spec.lock()), base=parts.base,
                   pip=parts.pip, pip_resolver=parts.pip_resolver, apt=parts.apt, apt_source=parts.apt_source,
                   unresolved=tuple(parts.unresolved))
    resolved = check_resolved(doc.to_dict(), spec, image_dir(images_dir, spec.name).resolved)
    path = write_resolved(resolved, images_dir)
    rendered = render(spec, resolved)
    changed = stale(rendered, images_dir)
    folder, _ = write(rendered, images_dir)
    return LockResult(path=path, resolved=resolved, unresolved=list(parts.unresolved),
                      written=[folder / n for n in changed])
