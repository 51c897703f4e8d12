"""Where a certified image and its certificate live in a registry: repository, tags, annotations.
The certificate artifact is tagged ``<tag>.cert`` next to each tag, so a node can tell from the
tag alone which digest the certificate covers."""

from __future__ import annotations

import re

from builder.core.errors import EnvbuildError, UsageError
from builder.oci import reference
from builder.oci.reference import ImageRef
from builder.oci.referrers import ANN_PREDICATE
from builder.publish.attest import MEDIA_TYPE_STATEMENT

DEFAULT_NAMESPACE = "envbuild"
CERTIFIED_TAG = "certified"
#: Suffix of the tag naming the certificate artifact of an image tag (``certified.cert``).
CERT_TAG_SUFFIX = ".cert"
#: artifactType of the certificate artifact.
ARTIFACT_TYPE = MEDIA_TYPE_STATEMENT
ANN_CREATED = "org.opencontainers.image.created"
ANN_RECIPE = "dev.envbuild.recipe"
ANN_LOCK = "dev.envbuild.lock-hash"
ANN_VERDICT = "dev.envbuild.verdict"
#: Longest ``envbuild pull`` target accepted (characters).
MAX_REF_CHARS = reference.MAX_CHARS
_SYNTAX = "host/repository[:tag][@sha256:digest]"

__all__ = ["ANN_CREATED", "ANN_LOCK", "ANN_PREDICATE", "ANN_RECIPE", "ANN_VERDICT", "ARTIFACT_TYPE",
           "CERTIFIED_TAG", "CERT_TAG_SUFFIX", "DEFAULT_NAMESPACE", "lock12", "parse_ref", "parse_target"]


def parse_ref(text: str, default_host: str | None = None) -> ImageRef:
    """An image reference with a registry: ``default_host`` when it names none (EnvbuildError, exit 64)."""
    ref = reference.parse(text, field="reference", syntax=_SYNTAX)
    if ref.host is None:
        if not default_host:
            raise UsageError("names no registry; give --registry HOST[:PORT]", field="reference", value=text)
        if not reference.is_host(default_host):
            raise UsageError("registry is not HOST[:PORT] (a port in 1..65535)", field="reference", value=text)
        ref = ref.with_host(default_host)
    return ref


def parse_target(target: str, registry: str | None, namespace: str = DEFAULT_NAMESPACE) -> ImageRef:
    """What ``envbuild pull`` fetches: a recipe name (``REGISTRY/<namespace>/NAME:certified``) or a reference.
    Raises EnvbuildError (exit 64) when malformed or no registry is known."""
    if not isinstance(target, str) or len(target) > MAX_REF_CHARS:
        raise UsageError(f"is not a recipe name or image reference (at most {MAX_REF_CHARS} characters)",
                         field="reference", value=target)
    if reference.COMPONENT.fullmatch(target):
        if not registry:
            raise UsageError("a recipe name needs --registry HOST[:PORT]", field="reference", value=target)
        return ImageRef(host=registry, path=f"{namespace}/{target}", tag=CERTIFIED_TAG)
    ref = parse_ref(target, registry)
    if ref.tag is None and ref.digest is None:
        ref = ref.with_tag(CERTIFIED_TAG)
    return ref


def lock12(lock_hash: str | None) -> str:
    """The image tag of a lock hash: its first 12 hex digits (EnvbuildError, exit 2, if not sha256)."""
    hexd = str(lock_hash or "").split(":", 1)[-1]
    if not re.fullmatch(r"[0-9a-f]{12,64}", hexd):
        raise EnvbuildError("is not a sha256 lock hash", field="envbuild.lock-hash", value=lock_hash)
    return hexd[:12]
