"""The base image's manifest digest: the engine's record of a pull, else the registry's answer.

The registry client is an argument (:class:`ManifestClient`, made by a
:data:`RegistryFactory` for the ref's registry host): this stage imports no registry code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from builder.core.errors import EnvbuildError
from builder.oci import reference
from builder.oci.reference import ImageRef
from builder.recipe.model import ResolvedBase


class ManifestClient(Protocol):
    """What resolving needs of a registry client: ``HEAD /v2/<repository>/manifests/<ref>``
    (OCI distribution spec) giving a descriptor with a ``digest``, or None when absent (404);
    :class:`~builder.core.errors.EnvbuildError` when the registry cannot be asked."""

    def head_manifest(self, repository: str, ref: str) -> Any | None: ...


#: Makes the client of one registry: ``factory(host, timeout_s=seconds)``.
RegistryFactory = Callable[..., ManifestClient]


def _engine_digest(engine: Any, image: ImageRef) -> str | None:
    """The digest the engine recorded for ``image`` when it was pulled (``RepoDigests`` of the
    same repository, :meth:`builder.oci.reference.ImageRef.same_repository`), if any."""
    try:
        img = engine.images.get(str(image))
        for rd in img.attrs.get("RepoDigests") or []:
            pinned = reference.try_parse(rd)
            if pinned is not None and pinned.digest and pinned.same_repository(image):
                return pinned.digest
    except Exception:  # noqa: BLE001 - the engine is only one of the sources
        pass
    return None


def base_digest(ref: str, engine: Any = None, registry: RegistryFactory | None = None, *,
                timeout_s: float = 10.0) -> tuple[ResolvedBase, str | None]:
    """Resolve the base image ``ref`` to a manifest digest.

    Args:
        engine: a docker client (the local image's ``RepoDigests``) or None.
        registry: makes the registry client (``registry(host, timeout_s=...)``) or None
            (the registry is not asked).

    Returns:
        ``(ResolvedBase, note)``: its ``source`` is ``"recipe"`` (already pinned),
        ``"engine"``, ``"registry"`` or ``"none"``; ``note`` says why it is unresolved.
    """
    image = reference.try_parse(ref)
    if image is None:
        return (ResolvedBase(ref=ref, digest=None, source="none"),
                f"base {ref}: not resolved to a digest (not an image reference)")
    if image.digest:
        return ResolvedBase(ref=ref, digest=image.digest, source="recipe"), None
    host, path, tag = image.registry, image.repository, image.tag or "latest"
    found = _engine_digest(engine, image) if engine is not None else None
    if found:
        return ResolvedBase(ref=ref, digest=found, source="engine"), None
    unresolved = ResolvedBase(ref=ref, digest=None, source="none")
    if registry is None:
        return unresolved, f"base {ref}: not resolved to a digest (no registry asked)"
    try:
        desc = registry(host, timeout_s=timeout_s).head_manifest(path, tag)
    except EnvbuildError as e:
        return unresolved, f"base {ref}: not resolved to a digest ({e})"
    if desc is None:
        return unresolved, f"base {ref}: the registry {host} has no tag {tag}"
    return ResolvedBase(ref=ref, digest=str(desc.digest), source="registry"), None
