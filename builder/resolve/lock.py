"""``envbuild lock``: resolve what the recipe leaves open into ``envbuild.resolved.json`` (tied to
the lock by ``lock_hash``). What cannot be reached stays open, listed in ``unresolved`` (exit 1)."""

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
    """Outcome of :func:`lock`; ``unresolved``: one line per warning, ``written``: files rewritten."""

    path: Path
    resolved: Resolved
    unresolved: list[str]
    written: list[Path] = field(default_factory=list)


#: The parts of :class:`Resolved` a run resolves (or keeps from the earlier file for the same lock).
PARTS = ("base", "pip", "pip_resolver", "apt", "apt_source")


def _previous(spec: Spec, images_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The parts of the earlier resolved file when it is for the same lock, else open ones."""
    try:
        before = load_resolved(spec, images_dir)
    except EnvbuildError:
        before = None
    if before is None:
        return {"base": ResolvedBase(ref=spec.recipe.base.image, digest=None, source="none")}
    return {k: getattr(before, k) for k in PARTS}


def _resolve_pip(spec: Spec, site: SiteOptions, parts: dict[str, Any], unresolved: list[str],
                 resolver: PipResolverFn) -> None:
    wheels, note = resolver(spec, site)
    parts["pip"] = tuple(wheels) if wheels is not None else ()
    if wheels is None:
        unresolved.append(note or "pip: not resolved")
    r = spec.recipe
    parts["pip_resolver"] = PipResolver(python=r.python, platform=platform_tags(spec.glibc)[0],
                                     indexes=tuple(u for u in (r.index.url, spec.torch_index_url) if u),
                                     site_wheels=bool(site.wheel_dir))


def _resolve_apt(spec: Spec, site: SiteOptions, client: Any, parts: dict[str, Any], unresolved: list[str], *,
                 base_mode: str, labels: Mapping[str, str] | None, say: Callable[[str], None]) -> None:
    if client is None:
        unresolved.append("apt: no Docker engine to query the base image")
        return
    from builder.image import bootstrap

    names = apt_names(spec)
    official = spec.recipe.base.image
    say(f"resolving apt versions of {', '.join(names)}")
    try:
        image, _image_id, how = bootstrap.resolve_base(client, official, base_mode, override=site.base_override,
                                                       warn=lambda _m: None)
    except EnvbuildError as e:
        unresolved.append(f"apt: no base image to query ({e})")
        return
    pins, note = resolve_apt(client, image, names, labels=labels)
    if pins is not None:
        parts["apt"] = pins
        parts["apt_source"] = AptSource(image=image if how != "bootstrapped" else
                                        f"{image} (bootstrapped stand-in for {official})")
    if note:
        unresolved.append(note)


def lock(spec: Spec, images_dir: str | os.PathLike[str], site: SiteOptions, client: Any = None, *,
         base: bool = True, pip: bool = True, apt: bool = True, base_mode: str = "auto",
         labels: Mapping[str, str] | None = None, say: Callable[[str], None] | None = None,
         pip_resolver: PipResolverFn | None = None, registry: RegistryFactory | None = None) -> LockResult:
    """An unresolved part keeps the earlier pins of this lock; no ``registry``: the engine gives the base digest."""
    say = say or (lambda _m: None)
    parts, unresolved = _previous(spec, images_dir), []
    if base:
        say(f"resolving the base image {spec.recipe.base.image}")
        parts["base"], note = base_digest(spec.recipe.base.image, client, registry)
        unresolved.extend([note] if note else [])
    if pip:
        say("resolving pip requirements with pip's resolver")
        _resolve_pip(spec, site, parts, unresolved, pip_resolver or resolve_pip)
    if apt:
        _resolve_apt(spec, site, client, parts, unresolved, base_mode=base_mode, labels=labels, say=say)
    doc = Resolved(schema=RESOLVED_SCHEMA, recipe=spec.name, lock_hash=lock_hash(spec.lock()), **parts,
                   unresolved=tuple(unresolved))
    resolved = check_resolved(doc.to_dict(), spec, image_dir(images_dir, spec.name).resolved)
    # byte-deterministic: sorted keys, no time stamps
    path = write_atomic(image_dir(images_dir, resolved.recipe).resolved,
                        (json.dumps(resolved.to_dict(), indent=2, sort_keys=True) + "\n").encode())
    rendered = render(spec, resolved)
    changed = stale(rendered, images_dir)
    folder, _ = write(rendered, images_dir)
    return LockResult(path=path, resolved=resolved, unresolved=unresolved, written=[folder / n for n in changed])
