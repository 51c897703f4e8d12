"""The base image's manifest digest: the engine's record of a pull, else the registry's answer.

The registry client is an argument (:class:`ManifestClient`, made by a
:data:`RegistryFactory` for the ref's registry host): this stage imports no registry code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from builder.core.errors import EnvbuildError
from builder.recipe.model import ResolvedBase


class ManifestClient(Protocol):
    """What resolving needs of a registry client: ``HEAD /v2/<repository>/manifests/<ref>``
    (OCI distribution spec) giving a descriptor with a ``digest``, or None when absent (404);
    :class:`~builder.core.errors.EnvbuildError` when the registry cannot be asked."""

    def head_manifest(self, repository: str, ref: str) -> Any | None: ...


#: Makes the client of one registry: ``factory(host, timeout_s=seconds)``.
RegistryFactory = Callable[..., ManifestClient]


def split_ref(ref: str) -> tuple[str, str, str, str | None]:
    """``(registry host, repository, tag, digest)`` of an image ref, Docker Hub rules
    (``debian:x`` -> ``registry-1.docker.io``, ``library/debian``; no tag: ``latest``)."""
    name, _, digest = ref.partition("@")
    repo, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        repo, tag = name, ""
    first, slash, rest = repo.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = "registry-1.docker.io", repo
        if "/" not in path:
            path = f"library/{path}"
    if host in ("docker.io", "index.docker.io"):
        host = "registry-1.docker.io"
    return host, path, tag or "latest", digest or None


def _engine_digest(engine: Any, ref: str, tag: str) -> str | None:
    """The digest the engine recorded for ``ref`` when it was pulled (``RepoDigests``), if any."""
    try:
        img = engine.images.get(ref)
        repo_name = ref.rsplit(":", 1)[0] if tag and ref.endswith(f":{tag}") else ref
        for rd in img.attrs.get("RepoDigests") or []:
            name, _, digest = rd.partition("@")
            if name in (repo_name, f"docker.io/{repo_name}", f"docker.io/library/{repo_name}"):
                return str(digest)
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
    host, path, tag, digest = split_ref(ref)
    if digest:
        return ResolvedBase(ref=ref, digest=digest, source="recipe"), None
    found = _engine_digest(engine, ref, tag) if engine is not None else None
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
