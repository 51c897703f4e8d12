"""``envbuild push``: publish a certified image by digest, and its certificate next to it.
The moving tag ``certified`` is set last, once its certificate is there."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from builder.core import inputs
from builder.core.errors import Unreachable
from builder.core.model import Model
from builder.core.paths import image_dir
from builder.image.engine import Engine, docker_login
from builder.oci import referrers
from builder.oci.client import Credentials, RegistryClient
from builder.oci.manifest import MT_OCI_MANIFEST, sha256_digest
from builder.oci.reference import DIGEST
from builder.publish import attest, naming
from builder.publish.attest import PrivateKey
from builder.publish.naming import CERT_TAG_SUFFIX, CERTIFIED_TAG, DEFAULT_NAMESPACE, lock12
from builder.publish.store import find_certified


def _remove_ours(client: Engine, image_id: str, ours: list[str]) -> None:
    after = client.inspect_image(image_id)
    if after and [t for t in after.tags if t not in ours]:  # never remove the image's last name
        for r in ours:
            client.untag(r)


def engine_push(client: Engine, image_id: str, name: str, tag: str, credentials: Credentials | None) -> str:
    """Push ``image_id`` as ``name:tag``; returns the manifest digest (Unreachable, exit 3).
    The references made for the push are removed afterwards unless they are the image's only names."""
    ref = f"{name}:{tag}"
    before = client.image(image_id)
    had = set(before.tags) | set(before.repo_digests)
    client.tag(image_id, name, tag)
    digest = None
    try:
        digest = client.push(name, tag, credentials.engine_auth() if credentials else None)
    finally:
        _remove_ours(client, image_id, [r for r in (ref, f"{name}@{digest}" if digest else None) if r and r not in had])
    if not digest or not DIGEST.fullmatch(digest):
        raise Unreachable(f"docker push {ref}: the engine reported no manifest digest")
    return digest


class Push(Model, frozen=True, tag_field="schema", tag="envbuild.push/1"):
    """``certificate_path``: the file pushed as the ``attestation`` manifest, found by ``referrers``."""

    repository: str
    digest: str
    tags: tuple[str, ...]
    image_id: str
    certificate_path: str
    attestation: str
    referrers: str
    signed_by: str | None
    filesystem: dict[str, Any] | None
    warnings: tuple[str, ...]


def _filesystem(client: Engine, img: Any, cert: Mapping[str, Any], labels: Mapping[str, str] | None,
                say: Callable[[str], None]) -> dict[str, Any]:
    """The image's filesystem hash: the certificate's own when it recorded one, else computed."""
    from builder.image import fshash

    recorded = (cert.get("image") or {}).get("filesystem") or cert.get("filesystem")
    if isinstance(recorded, dict) and recorded.get("method") == fshash.METHOD and recorded.get("sha256"):
        return dict(recorded)
    say(f"hashing the filesystem of {img.id[:19]}")
    return fshash.image_fshash(client, img.id, labels=labels).to_json()


def _annotations(recipe: str, cert: Mapping[str, Any]) -> dict[str, str]:
    out = {naming.ANN_PREDICATE: attest.PREDICATE_TYPE, naming.ANN_RECIPE: recipe,
           naming.ANN_LOCK: str(cert.get("lock_hash")), naming.ANN_VERDICT: "passed"}
    if cert.get("finished_at"):
        out[naming.ANN_CREATED] = str(cert["finished_at"])
    return out


def _stale_lock_warnings(images_dir: str | os.PathLike[str], recipe: str, cert: Mapping[str, Any]) -> list[str]:
    lockfile = image_dir(images_dir, recipe).lock
    if lockfile.is_file() and sha256_digest(lockfile.read_bytes()) != cert.get("lock_hash"):
        return [f"{lockfile} has changed since this image was built (image lock {cert.get('lock_hash')}); "
                "publishing the certified image as it is"]
    return []


def push(client: Engine, recipe: str, registry: str, *, images_dir: str | os.PathLike[str] = "images",
         image: str | None = None, namespace: str = DEFAULT_NAMESPACE, sign_key: PrivateKey | None = None,
         plain_http: bool | None = None, ca_cert: str | None = None, fs_hash: bool = True,
         labels: Mapping[str, str] | None = None, on_progress: Callable[[str], None] | None = None) -> Push:
    """Publish a certified image and its certificate. Raises EnvbuildError (exit 2) without a passing certificate for
    the image, Unreachable (exit 3) when the registry or engine fails."""
    say = on_progress or (lambda _msg: None)
    img, cert, cert_path = find_certified(client, images_dir, recipe, image)
    warnings = _stale_lock_warnings(images_dir, recipe, cert)
    reg = RegistryClient(registry, plain_http=plain_http, ca_cert=ca_cert, credentials=docker_login(registry))
    reg.ping()
    repository = f"{namespace}/{recipe}"
    name = f"{registry}/{repository}"
    first = lock12(cert.get("lock_hash"))
    fs = _filesystem(client, img, cert, labels, say) if fs_hash else None
    say(f"pushing {name}:{first}")
    digest = engine_push(client, img.id, name, first, reg.credentials)
    got = reg.get_manifest(repository, digest)
    if got is None:
        raise Unreachable(f"registry {registry} does not list {repository}@{digest} after the push")
    manifest_bytes, subject = got
    stmt = attest.statement(
        subject_name=name, subject_digest=digest, certificate=cert,
        certificate_sha256=hashlib.sha256(
            inputs.read_regular(cert_path, inputs.MAX_REPORT_BYTES, "certificate")).hexdigest(),
        image={"id": img.id, "digest": digest, "repository": name, "tags": [first, CERTIFIED_TAG],
               "recipe": recipe, "lock_hash": cert.get("lock_hash")},
        filesystem=fs)
    blob, media_type = attest.encode(stmt, sign_key)
    say(f"publishing the certificate of {name}@{digest}")
    att, att_body, how = referrers.attach(reg, repository, subject, blob, media_type,
                                          artifact_type=naming.ARTIFACT_TYPE, annotations=_annotations(recipe, cert))
    reg.put_manifest(repository, first + CERT_TAG_SUFFIX, att_body, MT_OCI_MANIFEST)
    # move `certified` only now that the certificate is published; its pointer last
    reg.put_manifest(repository, CERTIFIED_TAG, manifest_bytes, subject.media_type)
    reg.put_manifest(repository, CERTIFIED_TAG + CERT_TAG_SUFFIX, att_body, MT_OCI_MANIFEST)
    return Push(repository=name, digest=digest, tags=(first, CERTIFIED_TAG), image_id=img.id,
                certificate_path=str(cert_path), attestation=att.digest, referrers=how,
                signed_by=attest.key_id(sign_key) if sign_key is not None else None,
                filesystem=fs, warnings=tuple(warnings))
