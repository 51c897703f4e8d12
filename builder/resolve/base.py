"""The base image's digest: the engine's record of a pull, else the registry's (a RegistryFactory
argument: this stage imports no registry code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from builder.core.errors import EnvbuildError
from builder.oci import reference
from builder.oci.reference import ImageRef
from builder.recipe.model import ResolvedBase


class ManifestClient(Protocol):
    """``HEAD /v2/<repository>/manifests/<ref>``: a descriptor, None on 404, EnvbuildError when unreachable."""

    def head_manifest(self, repository: str, ref: str) -> Any | None: ...


#: Makes the client of one registry: ``factory(host, timeout_s=seconds, credentials=docker_login(host))``.
RegistryFactory = Callable[..., ManifestClient]


def _engine_digest(engine: Any, image: ImageRef) -> str | None:
    """The digest the engine recorded for ``image`` (``RepoDigests`` of the same repository), if any."""
    try:
        for rd in engine.image(str(image)).repo_digests:
            pinned = reference.try_parse(rd)
            if pinned is not None and pinned.digest and pinned.same_repository(image):
                return pinned.digest
    except Exception:  # noqa: BLE001 - the engine is only one of the sources
        pass
    return None


def base_digest(ref: str, engine: Any = None, registry: RegistryFactory | None = None, *,
                timeout_s: float = 10.0) -> tuple[ResolvedBase, str | None]:
    """``(ResolvedBase, note)``: ``ref`` resolved to a manifest digest, or a note saying why not."""
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
        from builder.image.engine import docker_login

        desc = registry(host, timeout_s=timeout_s, credentials=docker_login(host)).head_manifest(path, tag)
    except EnvbuildError as e:
        return unresolved, f"base {ref}: not resolved to a digest ({e})"
    if desc is None:
        return unresolved, f"base {ref}: the registry {host} has no tag {tag}"
    return ResolvedBase(ref=ref, digest=str(desc.digest), source="registry"), None
