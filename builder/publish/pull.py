"""``envbuild pull RECIPE|REF --registry HOST``: pull only what is certified, by digest.

:func:`pull` resolves the tag to a digest, fetches the certificate (``<tag>.cert``, else the
referrers of the digest: :func:`find_attestation`), verifies the statement (subject = that
digest, a passing verdict, the signature when a public key is configured), checks this node
(:func:`builder.publish.hardware.check_hardware`), pulls the image **by digest** and checks
that the pulled image ID and labels are the certified ones (:func:`check_image`) before
tagging it. A refused pull removes what it pulled: no half-tagged image. With
``--format sif`` it prints (and runs, when apptainer is there) ``apptainer pull`` by digest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import requests

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.oci import referrers
from builder.oci.client import RegistryClient
from builder.oci.manifest import Descriptor, decode_manifest
from builder.oci.reference import ImageRef
from builder.publish import attest, hardware
from builder.publish.attest import PublicKey
from builder.publish.naming import (
    ANN_CREATED,
    ANN_PREDICATE,
    ARTIFACT_TYPE,
    CERT_TAG_SUFFIX,
    DEFAULT_NAMESPACE,
    lock12,
    parse_target,
)
from builder.publish.push import engine_stream
from builder.publish.store import failures, passed


class Refused(EnvbuildError):
    """A pull refused by a check (exit 2)."""


def check_image(img_attrs: Mapping[str, Any], ref: ImageRef, digest: str, cert: Mapping[str, Any],
                certified_id: str | None) -> list[str]:
    """Differences between a pulled image (``docker inspect`` data) and its certificate.

    Checks: the image is known by ``name@digest``; its ID is the certified image ID; every
    label the certificate recorded has the same value.
    """
    problems = []
    wanted = f"{ref.name}@{digest}"
    repo_digests = img_attrs.get("RepoDigests") or []
    if wanted not in repo_digests:
        problems.append(f"the engine does not list {wanted} for the pulled image ({', '.join(repo_digests) or 'none'})")
    image_id = img_attrs.get("Id")
    if certified_id and image_id != certified_id:
        problems.append(f"pulled image ID {image_id} is not the certified image ID {certified_id}")
    got = ((img_attrs.get("Config") or {}).get("Labels")) or {}
    want = (cert.get("image") or {}).get("labels") or {}
    for key in sorted(want):
        if got.get(key) != want[key]:
            problems.append(f"label {key} is {str(got.get(key))[:80]!r}, the certificate says {str(want[key])[:80]!r}")
    if cert.get("lock_hash") and got.get("envbuild.lock-hash") != cert.get("lock_hash"):
        problems.append(f"label envbuild.lock-hash is {got.get('envbuild.lock-hash')!r}, the certificate says "
                        f"{cert.get('lock_hash')!r}")
    return problems


@dataclass
class Attestation:
    """A verified certificate found in the registry.

    Attributes:
        digest: the image digest it certifies.
        manifest: the artifact manifest's digest.
        found_by: ``"tag <tag>.cert"``, ``"referrers API"`` or ``"tag sha256-..."``.
        statement: the in-toto statement; ``predicate`` its envbuild predicate.
        certificate: the certificate inside.
        signer: the verified key id, or None when no key was configured.
        signed: whether the artifact is a DSSE envelope.
    """

    digest: str
    manifest: str
    found_by: str
    statement: dict[str, Any]
    predicate: dict[str, Any]
    certificate: dict[str, Any]
    signer: str | None
    signed: bool


def _load_attestation(reg: RegistryClient, ref: ImageRef, digest: str, body: bytes, desc: Descriptor,
                      found_by: str, public_key: PublicKey | None, key_name: str) -> Attestation:
    origin = f"{ref.name}@{desc.digest}"
    try:
        man = decode_manifest(body, origin)
        layer = man.layers[0]
    except (EnvbuildError, IndexError):
        raise Refused("refused: the certificate artifact is not an OCI manifest with one layer", file=origin) from None
    subject = man.subject.digest if man.subject else None
    if subject != digest:
        raise Refused(f"refused: the certificate artifact refers to {subject}, not to the image {digest}", file=origin)
    blob = reg.get_blob(ref.path, layer)
    stmt, signer = attest.decode(blob, layer.media_type, public_key=public_key, key_name=key_name, origin=origin)
    pred = attest.check_statement(stmt, digest, origin=origin)
    cert = pred["certificate"]
    if not passed(cert):
        raise Refused(f"refused: the published certificate did not pass ({failures(cert)})", file=origin)
    return Attestation(digest=digest, manifest=desc.digest, found_by=found_by, statement=stmt, predicate=pred,
                       certificate=cert, signer=signer, signed=layer.media_type == attest.MEDIA_TYPE_DSSE)


def _certified_subject(body: bytes) -> str | None:
    try:
        man = decode_manifest(body, "certificate pointer")
    except EnvbuildError:
        return None
    return man.subject.digest if man.subject else None


def _by_tag(reg: RegistryClient, ref: ImageRef, public_key: PublicKey | None, key_name: str
            ) -> tuple[str, Attestation | None]:
    """The digest ``ref``'s tag points to, and the certificate its ``<tag>.cert`` names (None
    when there is no such pointer)."""
    assert ref.tag is not None
    d = reg.head_manifest(ref.path, ref.tag)
    if d is None:
        raise Refused(f"refused: {ref.name}:{ref.tag} does not exist in the registry", field="reference",
                      value=str(ref))
    if ref.digest and d.digest != ref.digest:
        raise Refused(f"refused: {ref.name}:{ref.tag} points to {d.digest}, not to the requested {ref.digest}")
    digest = d.digest
    pointer = reg.get_manifest(ref.path, ref.tag + CERT_TAG_SUFFIX)
    if pointer is None:
        return digest, None
    body, desc = pointer
    certified = _certified_subject(body)
    if certified != digest:
        raise Refused(f"refused: {ref.name}:{ref.tag} points to {digest}, but its certificate "
                      f"({ref.tag}{CERT_TAG_SUFFIX}) certifies {certified}: the tag was moved after "
                      "certification")
    return digest, _load_attestation(reg, ref, digest, body, desc, f"tag {ref.tag}{CERT_TAG_SUFFIX}",
                                     public_key, key_name)


def find_attestation(reg: RegistryClient, ref: ImageRef, public_key: PublicKey | None = None,
                     key_name: str = "the key") -> Attestation:
    """Resolve ``ref`` to the certified digest and fetch and verify its certificate.

    A tag is resolved to a digest; the certificate is read from the tag ``<tag>.cert``
    when it exists (and must certify that very digest), else from the referrers of the
    digest (newest by ``org.opencontainers.image.created``).

    Raises:
        Refused: (exit 2) no such tag; the tag moved (both digests printed); no certificate;
            a certificate that is altered, not passing, for another image, unsigned or
            signed by another key when ``public_key`` is configured.
        Unreachable: (exit 3) the registry cannot be reached.
    """
    reg.ensure()
    digest = ref.digest
    if ref.tag:
        digest, found = _by_tag(reg, ref, public_key, key_name)
        if found is not None:
            return found
    assert digest is not None
    listed, how = referrers.referrers(reg, ref.path, digest)
    ours = [d for d in listed if d.artifact_type == ARTIFACT_TYPE
            and (d.annotations or {}).get(ANN_PREDICATE, attest.PREDICATE_TYPE) == attest.PREDICATE_TYPE]
    if not ours:
        raise Refused(f"refused: no certificate is published for {ref.name}@{digest} (looked up: {how})")
    ours.sort(key=lambda d: str((d.annotations or {}).get(ANN_CREATED) or ""), reverse=True)
    errors = []
    for d in ours:
        got = reg.get_manifest(ref.path, d.digest)
        if got is None:
            errors.append(f"{d.digest}: listed but missing")
            continue
        try:
            return _load_attestation(reg, ref, digest, got[0], got[1], how, public_key, key_name)
        except EnvbuildError as e:
            if e.exit_code == ExitCode.UNREACHABLE:
                raise
            errors.append(str(e))
    raise Refused(f"refused: no valid certificate for {ref.name}@{digest}: {' | '.join(errors)}")


@dataclass
class PullResult:
    """Outcome of :func:`pull`.

    Attributes:
        reference: ``host/repo@sha256:...`` (what was pulled or is to be pulled).
        digest: the certified digest.
        attestation: the verified certificate.
        image_id: the pulled image ID (None for ``--format sif``).
        local_tags: tags set on the pulled image.
        warnings: hardware not covered, accepted with ``allow_uncertified_hw``.
        sif_command: the ``apptainer pull`` argv (``--format sif``), else None.
        sif_ran: whether that command was run (apptainer found) and succeeded.
    """

    reference: str
    digest: str
    attestation: Attestation
    image_id: str | None = None
    local_tags: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sif_command: list[str] | None = None
    sif_ran: bool = False


def sif_command(ref: ImageRef, digest: str, output: str, plain_http: bool) -> list[str]:
    """``apptainer pull [--no-https] OUTPUT docker://HOST/REPO@sha256:...`` (by digest)."""
    cmd = ["apptainer", "pull"]
    if plain_http:
        cmd.append("--no-https")
    return [*cmd, output, f"docker://{ref.name}@{digest}"]


def _pull_sif(reg: RegistryClient, ref: ImageRef, result: PullResult, output: str | None, run_apptainer: bool,
              say: Callable[[str], None]) -> PullResult:
    cert = result.attestation.certificate
    out = output or f"{cert.get('recipe') or ref.path.rsplit('/', 1)[-1]}_{lock12(cert.get('lock_hash'))}.sif"
    result.sif_command = sif_command(ref, result.digest, out, reg.scheme == "http")
    if run_apptainer and shutil.which("apptainer"):
        env = dict(os.environ)
        if reg.credentials:
            env["APPTAINER_DOCKER_USERNAME"] = reg.credentials.username
            env["APPTAINER_DOCKER_PASSWORD"] = reg.credentials.password
        say(" ".join(result.sif_command))
        rc = subprocess.run(result.sif_command, env=env).returncode
        if rc != 0:
            raise Unreachable(f"apptainer pull exited with {rc}", field="reference", value=result.reference)
        result.sif_ran = True
    return result


def _engine_pull(client: docker.DockerClient, reg: RegistryClient, ref: ImageRef, digest: str) -> Any:
    by_digest = f"{ref.name}@{digest}"
    try:
        stream = client.api.pull(ref.name, tag=digest, stream=True, decode=True,
                                 auth_config=reg.credentials.engine_auth() if reg.credentials else None)
        engine_stream(stream, f"docker pull {by_digest}")
    except (docker.errors.APIError, requests.exceptions.RequestException) as e:
        raise Unreachable(f"docker pull {by_digest} failed: {' '.join(str(e).split())[:300]}") from None
    try:
        return client.images.get(by_digest)
    except docker.errors.ImageNotFound:
        raise Unreachable(f"docker pull {by_digest} left no image") from None


def _pull_docker(client: docker.DockerClient, reg: RegistryClient, ref: ImageRef, result: PullResult,
                 say: Callable[[str], None]) -> PullResult:
    """Pull by digest, check the image against the certificate, tag it; undo on refusal."""
    att, digest, by_digest = result.attestation, result.digest, result.reference
    cert = att.certificate
    certified_id = (att.predicate.get("image") or {}).get("id") or (cert.get("image") or {}).get("id")
    try:
        pre = client.images.get(by_digest)
        pre_existing = by_digest in (pre.attrs.get("RepoDigests") or [])
    except docker.errors.ImageNotFound:
        pre_existing = False
    ok = False
    added: list[str] = []
    try:
        say(f"pulling {by_digest}")
        img = _engine_pull(client, reg, ref, digest)
        problems = check_image(img.attrs, ref, digest, cert, certified_id)
        if problems:
            raise Refused("refused: the pulled image is not the certified one: " + "; ".join(problems),
                          field="reference", value=by_digest)
        for t in dict.fromkeys([t for t in (ref.tag, lock12(cert.get("lock_hash"))) if t]):
            client.api.tag(img.id, ref.name, t, force=True)
            added.append(f"{ref.name}:{t}")
        result.image_id = img.id
        result.local_tags = added
        ok = True
        return result
    finally:
        if not ok:
            for t in added:
                with contextlib.suppress(docker.errors.APIError):
                    client.api.remove_image(t, noprune=True)
            if not pre_existing:
                with contextlib.suppress(docker.errors.APIError):
                    client.api.remove_image(by_digest)


def pull(client: docker.DockerClient | None, target: str, registry: str | None = None, *,
         namespace: str = DEFAULT_NAMESPACE, public_key: PublicKey | None = None, key_name: str = "the key",
         allow_uncertified_hw: bool = False, fmt: str = "docker", host_report: Mapping[str, Any] | None = None,
         plain_http: bool | None = None, ca_cert: str | None = None, sif_output: str | None = None,
         run_apptainer: bool = True, on_progress: Callable[[str], None] | None = None) -> PullResult:
    """Pull a certified image by digest onto this node, or refuse (see the module doc).

    Args:
        client: connected docker client (may be None for ``fmt="sif"``).
        target: recipe name or image reference (:func:`builder.publish.naming.parse_target`).
        registry: ``host[:port]`` when ``target`` names none.
        public_key: from :func:`builder.publish.attest.load_public_key`: the certificate must be a
            DSSE envelope signed by it.
        allow_uncertified_hw: hardware the certificate does not cover gives warnings
            instead of a refusal.
        fmt: ``"docker"`` (pull into the engine) or ``"sif"`` (print/run ``apptainer pull``).
        host_report: this node's report (default :func:`builder.publish.hardware.node_report`).
        sif_output: the SIF file (default ``<recipe>_<lock12>.sif``).
        run_apptainer: run the command when ``apptainer`` is on PATH.

    Raises:
        Refused: (exit 2) see :func:`find_attestation`; hardware not covered; the pulled
            image differs from the certificate (it is removed again).
        Unreachable: (exit 3) registry or engine unreachable; apptainer failed.
    """
    say = on_progress or (lambda _msg: None)
    ref = parse_target(target, registry, namespace)
    assert ref.host is not None
    reg = RegistryClient(ref.host, plain_http=plain_http, ca_cert=ca_cert)
    reg.ping()
    say(f"resolving {ref}")
    att = find_attestation(reg, ref, public_key, key_name)
    issues = hardware.check_hardware(att.certificate, host_report if host_report is not None
                                     else hardware.node_report())
    if issues and not allow_uncertified_hw:
        raise Refused("refused: this node is not covered by the certificate: " + "; ".join(issues)
                      + " (--allow-uncertified-hw to pull anyway)")
    result = PullResult(reference=f"{ref.name}@{att.digest}", digest=att.digest, attestation=att,
                        warnings=list(issues))
    lock12(att.certificate.get("lock_hash"))  # a certificate without a lock hash is refused before pulling
    if fmt == "sif":
        return _pull_sif(reg, ref, result, sif_output, run_apptainer, say)
    if fmt != "docker":
        raise EnvbuildError("is not docker or sif", field="--format", value=fmt, exit_code=ExitCode.USAGE)
    assert client is not None
    return _pull_docker(client, reg, ref, result, say)
