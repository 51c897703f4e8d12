"""``envbuild push RECIPE --registry HOST[:PORT]``: publish a certified image by digest.

1. :func:`builder.publish.store.find_certified` finds a *passing* certificate for the exact
   local image (same image ID) and refuses (exit 2) without one;
2. the Docker engine pushes the image as ``HOST/<namespace>/<recipe>:<lock hash 12>``
   (:func:`engine_push`) and reports the manifest digest; the moving tag ``certified`` is
   then set to that same manifest through the registry API (no second engine push);
3. the certificate is published as an in-toto statement (:mod:`builder.publish.attest`,
   optionally a signed DSSE envelope) in an OCI artifact whose ``subject`` is the image
   manifest (:func:`builder.oci.referrers.attach`: Referrers API or its tag fallback);
4. the artifact manifest is tagged ``<tag>.cert`` next to each image tag
   (:mod:`builder.publish.naming`); ``certified`` moves last, once its certificate is there.

Credentials come from the user's Docker config (:func:`builder.oci.client.docker_credentials`)
and are handed in memory to the engine and to the registry client.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from builder.core import inputs
from builder.core.errors import EnvbuildError, Unreachable
from builder.core.paths import image_dir
from builder.oci import referrers
from builder.oci.client import Credentials, RegistryClient
from builder.oci.manifest import MT_OCI_MANIFEST, sha256_digest
from builder.oci.reference import DIGEST
from builder.publish import attest, naming
from builder.publish.attest import PrivateKey
from builder.publish.naming import CERT_TAG_SUFFIX, CERTIFIED_TAG, DEFAULT_NAMESPACE, lock12
from builder.publish.store import find_certified

_STATUS_DIGEST = re.compile(r"Digest: (sha256:[0-9a-f]{64})")


def engine_stream(stream: Iterable[Any], what: str) -> str | None:
    """Consume a docker push/pull progress stream; returns the manifest digest it reports.

    Raises:
        Unreachable: (exit 3) the stream reports an error (one line, at most 300 characters).
    """
    digest = None
    for msg in stream:
        if not isinstance(msg, dict):
            continue
        if msg.get("error") or msg.get("errorDetail"):
            text = (msg.get("errorDetail") or {}).get("message") or msg.get("error")
            raise Unreachable(f"{what} failed: {' '.join(str(text).split())[:300]}")
        aux = msg.get("aux") or {}
        if aux.get("Digest"):
            digest = aux["Digest"]
        m = _STATUS_DIGEST.search(str(msg.get("status") or ""))
        if m:
            digest = m.group(1)
    return digest


def _remove_ours(client: docker.DockerClient, image_id: str, ours: list[str]) -> None:
    """Remove the references made for a push, unless they are the image's only names."""
    with contextlib.suppress(docker.errors.APIError):
        after = client.images.get(image_id).attrs
        others = [t for t in (after.get("RepoTags") or []) if t not in ours]
        if others:  # never remove the image's last name
            for r in ours:
                with contextlib.suppress(docker.errors.APIError):
                    client.api.remove_image(r, noprune=True)


def engine_push(client: docker.DockerClient, image_id: str, name: str, tag: str,
                credentials: Credentials | None) -> str:
    """Push image ``image_id`` as ``name:tag`` with the engine; returns the manifest digest.

    The local references ``name:tag`` (made for the push) and ``name@digest`` (recorded by
    the engine) are removed afterwards unless they existed before or are the image's only
    names (the image itself always stays).

    Raises:
        Unreachable: (exit 3) the engine or the registry failed the push.
    """
    ref = f"{name}:{tag}"
    try:
        before = client.images.get(image_id).attrs
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image in the engine", field="image", value=image_id) from None
    had = set(before.get("RepoTags") or []) | set(before.get("RepoDigests") or [])
    client.api.tag(image_id, name, tag, force=True)
    digest = None
    try:
        stream = client.api.push(name, tag=tag, stream=True, decode=True,
                                 auth_config=credentials.engine_auth() if credentials else None)
        digest = engine_stream(stream, f"docker push {ref}")
    except (docker.errors.APIError, requests.exceptions.RequestException) as e:
        raise Unreachable(f"docker push {ref} failed: {' '.join(str(e).split())[:300]}") from None
    finally:
        _remove_ours(client, image_id, [r for r in (ref, f"{name}@{digest}" if digest else None)
                                        if r and r not in had])
    if not digest or not DIGEST.fullmatch(digest):
        raise Unreachable(f"docker push {ref}: the engine reported no manifest digest")
    return digest


@dataclass
class PushResult:
    """Outcome of :func:`push`.

    Attributes:
        repository: ``host/namespace/recipe``.
        digest: the image manifest digest in the registry, ``sha256:...``.
        tags: the tags set to it (``<lock hash 12>``, ``certified``).
        image_id: the local image ID (the certified one).
        certificate_path: the certificate published.
        attestation: the artifact manifest's digest.
        referrers: how the artifact is discoverable (``"referrers API"`` or ``"tag sha256-..."``).
        signed_by: key id of the signature, or None (unsigned).
        filesystem: the image's filesystem hash (:mod:`builder.image.fshash`), or None.
        warnings: remarks (e.g. the image was built from an older lock than the rendered one).
    """

    repository: str
    digest: str
    tags: list[str]
    image_id: str
    certificate_path: Path
    attestation: str
    referrers: str
    signed_by: str | None
    filesystem: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)


def _filesystem(client: docker.DockerClient, img: Any, cert: Mapping[str, Any], labels: Mapping[str, str] | None,
                say: Callable[[str], None]) -> dict[str, Any]:
    """The image's filesystem hash: the certificate's own when it recorded one, else computed."""
    from builder.image import fshash

    recorded = (cert.get("image") or {}).get("filesystem") or cert.get("filesystem")
    if isinstance(recorded, dict) and recorded.get("method") == fshash.METHOD and recorded.get("sha256"):
        return dict(recorded)
    say(f"hashing the filesystem of {img.id[:19]}")
    return fshash.image_fshash(client, img.id, labels=labels).to_json()


def _annotations(recipe: str, cert: Mapping[str, Any]) -> dict[str, str]:
    out = {
        naming.ANN_PREDICATE: attest.PREDICATE_TYPE,
        naming.ANN_RECIPE: recipe,
        naming.ANN_LOCK: str(cert.get("lock_hash")),
        naming.ANN_VERDICT: "passed",
    }
    if cert.get("finished_at"):
        out[naming.ANN_CREATED] = str(cert["finished_at"])
    return out


def _stale_lock_warnings(images_dir: str | os.PathLike[str], recipe: str, cert: Mapping[str, Any]) -> list[str]:
    lockfile = image_dir(images_dir, recipe).lock
    if lockfile.is_file() and sha256_digest(lockfile.read_bytes()) != cert.get("lock_hash"):
        return [f"{lockfile} has changed since this image was built (image lock {cert.get('lock_hash')}); "
                "publishing the certified image as it is"]
    return []


def push(client: docker.DockerClient, recipe: str, registry: str, *, images_dir: str | os.PathLike[str] = "images",
         image: str | None = None, namespace: str = DEFAULT_NAMESPACE, sign_key: PrivateKey | None = None,
         plain_http: bool | None = None, ca_cert: str | None = None, fs_hash: bool = True,
         labels: Mapping[str, str] | None = None, on_progress: Callable[[str], None] | None = None) -> PushResult:
    """Publish a certified image and its certificate (see the module doc).

    Args:
        client: connected docker client.
        recipe: recipe name (``images_dir/<recipe>/certificates/``).
        registry: ``host[:port]``.
        image: push this local image (default: the newest certified one of ``recipe``).
        namespace: repository prefix (``<namespace>/<recipe>``).
        sign_key: a private key from :func:`builder.publish.attest.load_private_key`, or None.
        plain_http, ca_cert: see :class:`builder.oci.client.RegistryClient`.
        fs_hash: record the filesystem content hash (:mod:`builder.image.fshash`) in the statement.
        labels: labels for temporary containers (the filesystem export).
        on_progress: receives one-line progress messages.

    Raises:
        EnvbuildError: (exit 2) refused (see :func:`builder.publish.store.find_certified`).
        Unreachable: (exit 3) registry or engine unreachable, credentials refused.
    """
    say = on_progress or (lambda _msg: None)
    img, cert, cert_path = find_certified(client, images_dir, recipe, image)
    warnings = _stale_lock_warnings(images_dir, recipe, cert)
    reg = RegistryClient(registry, plain_http=plain_http, ca_cert=ca_cert)
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
    return PushResult(repository=name, digest=digest, tags=[first, CERTIFIED_TAG], image_id=img.id,
                      certificate_path=cert_path, attestation=att.digest, referrers=how,
                      signed_by=attest.key_id(sign_key) if sign_key is not None else None,
                      filesystem=fs, warnings=warnings)
