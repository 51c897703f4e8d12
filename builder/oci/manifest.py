"""OCI documents as msgspec Structs: registry answers are hostile, so decoding bounds their
shape; unknown properties are ignored as the image spec requires. Source: OCI image spec v1.1."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from builder.core.errors import EnvbuildError

MT_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
#: The OCI empty descriptor's media type and content (image spec v1.1).
MT_EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
#: ``Accept`` of a manifest request: every manifest kind envbuild reads.
MANIFEST_ACCEPT = ", ".join((MT_OCI_MANIFEST, MT_OCI_INDEX, MT_DOCKER_MANIFEST, MT_DOCKER_LIST))
#: The header in which a registry names a manifest's digest (distribution spec).
DIGEST_HEADER = "Docker-Content-Digest"
#: Largest manifest or index read from a registry, in bytes (the spec's 4 MiB).
MAX_MANIFEST_BYTES = 4 << 20

Sha256 = Annotated[str, Meta(pattern=r"\Asha256:[0-9a-f]{64}\Z")]
_Text = Annotated[str, Meta(max_length=1024)]


class _Oci(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """Base of the OCI documents: camelCase keys, unknown keys ignored (OCI's rule)."""


class Descriptor(_Oci, frozen=True):
    media_type: _Text
    digest: Sha256
    size: Annotated[int, Meta(ge=0, le=1 << 62)]
    artifact_type: _Text | None = None
    annotations: dict[str, str] = {}

    def to_json(self) -> dict[str, Any]:
        """The descriptor as JSON data (``mediaType``, ``digest``, ``size``, ...)."""
        return msgspec.to_builtins(self)


class Manifest(_Oci, frozen=True):
    """An OCI image manifest (an image, or an artifact with ``artifactType``/``subject``)."""

    schema_version: int
    config: Descriptor
    layers: list[Descriptor] = []
    media_type: _Text | None = None
    artifact_type: _Text | None = None
    subject: Descriptor | None = None
    annotations: dict[str, str] = {}


class Index(_Oci, frozen=True):
    """An OCI image index (also the Referrers API answer and its tag-schema fallback)."""

    schema_version: int
    manifests: list[Descriptor] = []
    media_type: _Text | None = None


class _MediaTypeOnly(_Oci, frozen=True):
    media_type: _Text | None = None


def canonical_json(doc: Any) -> bytes:
    """Compact JSON with sorted keys, UTF-8: the bytes that are published and signed."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def decode_manifest(body: bytes, origin: str) -> Manifest:
    """``body`` as an image manifest. Raises EnvbuildError (exit 2), naming ``origin``."""
    try:
        return msgspec.json.decode(body, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise EnvbuildError(f"is not an image manifest ({_first_line(e)})", file=origin) from None


def index_entries(body: bytes) -> list[Descriptor]:
    """The descriptors an image index lists; ``[]`` when ``body`` is not an index."""
    try:
        return msgspec.json.decode(body, type=Index).manifests
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []


def media_type_of(body: bytes, default: str) -> str:
    """The ``mediaType`` a manifest declares, else ``default`` (e.g. the ``Content-Type``)."""
    try:
        return msgspec.json.decode(body, type=_MediaTypeOnly).media_type or default
    except (msgspec.DecodeError, msgspec.ValidationError):
        return default


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
