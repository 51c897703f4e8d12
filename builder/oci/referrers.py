"""Artifacts referring to a manifest: the Referrers API, else the referrers tag schema (docker-registry
2.8; oras-py 0.2 has neither). Source: OCI distribution spec v1.1."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from builder.core import inputs
from builder.core.errors import EnvbuildError
from builder.oci.client import RegistryClient, read_bounded
from builder.oci.manifest import (
    EMPTY_BLOB,
    MAX_MANIFEST_BYTES,
    MT_EMPTY,
    MT_OCI_INDEX,
    MT_OCI_MANIFEST,
    Descriptor,
    canonical_json,
    index_entries,
    sha256_digest,
)
from builder.oci.reference import DIGEST

#: How :func:`referrers` and :func:`attach` say they found or filed an artifact.
BY_API = "referrers API"
#: The layer annotation naming an in-toto predicate type (in-toto attestation spec, "OCI").
ANN_PREDICATE = "in-toto.io/predicate-type"


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for ``digest``: ``sha256:<hex>`` -> ``sha256-<hex>``."""
    algo, _, hexd = digest.partition(":")
    return f"{algo}-{hexd}"


def referrers(reg: RegistryClient, repository: str, digest: str) -> tuple[list[Descriptor], str]:
    """Manifests that refer to ``digest`` (their ``subject``), and how they were found."""
    reg.ensure()
    r = reg.request("GET", reg.url(repository, "referrers", digest), headers={"Accept": MT_OCI_INDEX}, stream=True)
    if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(MT_OCI_INDEX):
        body = read_bounded(r, MAX_MANIFEST_BYTES, f"registry {reg.host}: referrers of {repository}@{digest}")
        return index_entries(body), BY_API
    r.close()
    tag = fallback_tag(digest)
    got = reg.get_manifest(repository, tag)
    return (index_entries(got[0]) if got else []), f"tag {tag}"


def artifact_manifest(subject: Descriptor, config: Descriptor, layer: Descriptor, artifact_type: str,
                      annotations: Mapping[str, str]) -> bytes:
    """The canonical bytes of an artifact manifest: ``layer`` refers to ``subject``, with ``annotations``' predicate."""
    ann = dict(sorted(annotations.items()))
    layer_json = layer.to_json()
    if ann.get(ANN_PREDICATE):
        layer_json["annotations"] = {ANN_PREDICATE: ann[ANN_PREDICATE]}
    manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": MT_OCI_MANIFEST, "artifactType": artifact_type,
                                "config": {**config.to_json(), "data": base64.b64encode(EMPTY_BLOB).decode()},
                                "layers": [layer_json],
                                "subject": Descriptor(subject.media_type, subject.digest, subject.size).to_json()}
    if ann:
        manifest["annotations"] = ann
    return canonical_json(manifest)


def attach(reg: RegistryClient, repository: str, subject: Descriptor, blob: bytes, media_type: str, *,
           artifact_type: str, annotations: Mapping[str, str] | None = None) -> tuple[Descriptor, bytes, str]:
    cfg = reg.push_blob(repository, EMPTY_BLOB, MT_EMPTY)
    layer = reg.push_blob(repository, blob, media_type)
    ann = dict(sorted((annotations or {}).items()))
    body = artifact_manifest(subject, cfg, layer, artifact_type, ann)
    desc = Descriptor(MT_OCI_MANIFEST, sha256_digest(body), len(body), artifact_type, ann)
    r = reg.put_manifest(repository, desc.digest, body, MT_OCI_MANIFEST)
    if r.headers.get("OCI-Subject") == subject.digest:
        return desc, body, BY_API
    tag = fallback_tag(subject.digest)
    entries = _fallback_entries(reg, repository, tag)
    if not any(isinstance(m, dict) and m.get("digest") == desc.digest for m in entries):
        entries.append(desc.to_json())
    index = {"schemaVersion": 2, "mediaType": MT_OCI_INDEX, "manifests": entries}
    reg.put_manifest(repository, tag, canonical_json(index), MT_OCI_INDEX)
    return desc, body, f"tag {tag}"


def _fallback_entries(reg: RegistryClient, repository: str, tag: str) -> list[Any]:
    """Fallback index ``tag``'s entries, ``[]`` if absent; dead manifests dropped (the registry refuses them)."""
    got = reg.get_manifest(repository, tag)
    if not got:
        return []
    try:
        old = inputs.load_json(got[0], f"{reg.host}/{repository}:{tag}")
    except EnvbuildError:
        return []
    entries = old.get("manifests") if isinstance(old, dict) else None
    if not isinstance(entries, list):
        return []
    return [m for m in entries if not (isinstance(m, dict) and isinstance(m.get("digest"), str)
                                       and DIGEST.fullmatch(m["digest"])
                                       and reg.head_manifest(repository, m["digest"]) is None)]
