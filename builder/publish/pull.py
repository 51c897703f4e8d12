"""``envbuild pull``: pull only what is certified, by digest; a refused pull removes what it pulled."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from builder.core import process
from builder.core.errors import EnvbuildError, ExitCode, Unreachable, UsageError
from builder.core.model import Model
from builder.image.engine import Engine, Image, PullFailed, docker_login
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
from builder.publish.store import CERT_LABELS, failures, passed

#: Longest ``apptainer pull`` waited for, in seconds: it downloads and converts every layer.
APPTAINER_TIMEOUT_S = 6 * 3600
#: How the engine words a blob whose content does not hash to its digest (config or layer).
_VERIFY_FAILED = re.compile(r"verification failed for digest (sha256:[0-9a-f]{64})")


class Refused(EnvbuildError):
    """A pull refused by a check (exit 2)."""


def check_image(img: Image, ref: ImageRef, digest: str, cert: Mapping[str, Any], certified_id: str | None) -> list[str]:
    """Differences between a pulled image and its certificate."""
    problems = []
    wanted = f"{ref.name}@{digest}"
    if wanted not in img.repo_digests:
        problems.append(f"the engine does not list {wanted} for the pulled image "
                        f"({', '.join(img.repo_digests) or 'none'})")
    if certified_id and img.id != certified_id:
        problems.append(f"pulled image ID {img.id} is not the certified image ID {certified_id}")
    got = img.labels
    want = (cert.get("image") or {}).get("labels") or {}
    for key in sorted(want):
        if got.get(key) != want[key]:
            problems.append(f"label {key} is {str(got.get(key))[:80]!r}, the certificate says {str(want[key])[:80]!r}")
    for key, name in CERT_LABELS:  # the certificate's own fields too (the registry supplies them)
        if cert.get(name) and got.get(key) != cert.get(name):
            problems.append(f"label {key} is {str(got.get(key))[:80]!r}, the certificate says {str(cert[name])[:80]!r}")
    return problems


@dataclass
class Attestation:
    """A verified certificate found in the registry; ``signer`` is the verified key id or None."""

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
    """The digest ``ref``'s tag points to, and the certificate its ``<tag>.cert`` names, if any."""
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
        own, _ = referrers.referrers(reg, ref.path, digest)
        if any(d.artifact_type == ARTIFACT_TYPE for d in own):  # the tag's image is certified: the pointer changed
            raise Refused(f"refused: {ref.name}:{ref.tag}{CERT_TAG_SUFFIX} is the certificate of another image "
                          f"({certified}), not of {digest} that {ref.name}:{ref.tag} points to")
        raise Refused(f"refused: {ref.name}:{ref.tag} points to {digest}, but its certificate "
                      f"({ref.tag}{CERT_TAG_SUFFIX}) certifies {certified}: the tag was moved after "
                      "certification")
    return digest, _load_attestation(reg, ref, digest, body, desc, f"tag {ref.tag}{CERT_TAG_SUFFIX}",
                                     public_key, key_name)


def find_attestation(reg: RegistryClient, ref: ImageRef, public_key: PublicKey | None = None,
                     key_name: str = "the key") -> Attestation:
    """Resolve ``ref`` to a digest and fetch and verify its certificate.
    Raises Refused (exit 2) when none is valid, Unreachable (exit 3)."""
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


class Pull(Model, frozen=True, tag_field="schema", tag="envbuild.pull/1"):
    """``image_id``/``local_tags``: the pulled image (docker); ``sif_command``: ``--format sif``'s."""

    reference: str
    digest: str
    attestation: str
    found_by: str
    signer: str | None
    signed: bool
    image_id: str | None
    local_tags: tuple[str, ...]
    sif_command: tuple[str, ...] | None
    sif_ran: bool
    warnings: tuple[str, ...]
    certificate: dict[str, Any]


def sif_command(ref: ImageRef, digest: str, output: str, plain_http: bool) -> list[str]:
    cmd = ["apptainer", "pull"]
    if plain_http:
        cmd.append("--no-https")
    return [*cmd, output, f"docker://{ref.name}@{digest}"]


def sif_name(ref: ImageRef, cert: Mapping[str, Any]) -> str:
    """``cpu-torch2_<lock12>.sif``: the repository's last component (the reference grammar's, never
    the certificate's recipe, which the registry supplies: ``../x`` or a newline must not reach a path)."""
    return f"{ref.path.rsplit('/', 1)[-1]}_{lock12(cert.get('lock_hash'))}.sif"


def _pull_sif(reg: RegistryClient, ref: ImageRef, att: Attestation, output: str | None, run_apptainer: bool,
              say: Callable[[str], None]) -> tuple[list[str], bool]:
    """The ``apptainer pull`` command, and whether it ran."""
    command = sif_command(ref, att.digest, output or sif_name(ref, att.certificate), reg.scheme == "http")
    if run_apptainer and shutil.which("apptainer"):
        env = dict(os.environ)
        if reg.credentials:
            env["APPTAINER_DOCKER_USERNAME"] = reg.credentials.username
            env["APPTAINER_DOCKER_PASSWORD"] = reg.credentials.password
        say(" ".join(command))
        rc = process.run(command, APPTAINER_TIMEOUT_S, env=env, capture=False).returncode
        if rc != 0:
            raise Unreachable(f"apptainer pull exited with {rc}", field="reference", value=f"{ref.name}@{att.digest}")
        return command, True
    return command, False


def _engine_pull(client: Engine, reg: RegistryClient, ref: ImageRef, digest: str) -> Image:
    by_digest = f"{ref.name}@{digest}"
    try:
        auth = reg.credentials.engine_auth() if reg.credentials else None
        image_id = client.pull(ref.name, None, tag=digest, auth=auth)
    except PullFailed as e:  # the engine checks every blob against its digest: a mismatch is a refusal
        bad = _VERIFY_FAILED.search(e.reason)
        if bad is None:
            raise Unreachable(f"docker pull {by_digest} failed: {e.reason[:300]}") from None
        raise Refused(f"refused: docker pull {by_digest}: blob {bad.group(1)} does not match its digest "
                      "(altered in the registry)") from None
    return client.image(image_id)


def _pull_docker(client: Engine, reg: RegistryClient, ref: ImageRef, att: Attestation,
                 say: Callable[[str], None]) -> tuple[str, list[str]]:
    """Pull by digest, check the image against the certificate, tag it: ``(image ID, tags)``; undo on refusal."""
    digest, by_digest = att.digest, f"{ref.name}@{att.digest}"
    cert = att.certificate
    certified_id = (att.predicate.get("image") or {}).get("id") or (cert.get("image") or {}).get("id")
    pre = client.inspect_image(by_digest)
    pre_existing = pre is not None and by_digest in pre.repo_digests
    ok = False
    added: list[str] = []
    try:
        say(f"pulling {by_digest}")
        img = _engine_pull(client, reg, ref, digest)
        problems = check_image(img, ref, digest, cert, certified_id)
        if problems:
            raise Refused("refused: the pulled image is not the certified one: " + "; ".join(problems),
                          field="reference", value=by_digest)
        for t in dict.fromkeys([t for t in (ref.tag, lock12(cert.get("lock_hash"))) if t]):
            client.tag(img.id, ref.name, t)
            added.append(f"{ref.name}:{t}")
        ok = True
        return img.id, added
    finally:
        if not ok:
            for t in added:
                client.untag(t)
            if not pre_existing:
                client.untag(by_digest, prune=True)


def pull(client: Engine | None, target: str, registry: str | None = None, *,
         namespace: str = DEFAULT_NAMESPACE, public_key: PublicKey | None = None, key_name: str = "the key",
         allow_uncertified_hw: bool = False, fmt: str = "docker", host_report: Mapping[str, Any] | None = None,
         plain_http: bool | None = None, ca_cert: str | None = None, sif_output: str | None = None,
         run_apptainer: bool = True, on_progress: Callable[[str], None] | None = None) -> Pull:
    """Pull a certified image by digest onto this node, or refuse.
    Raises Refused (exit 2) when no valid certificate covers this node or the pulled image
    differs from it, Unreachable (exit 3) when the registry, engine or apptainer fails."""
    say = on_progress or (lambda _msg: None)
    ref = parse_target(target, registry, namespace)
    assert ref.host is not None
    reg = RegistryClient(ref.host, plain_http=plain_http, ca_cert=ca_cert, credentials=docker_login(ref.host))
    reg.ping()
    say(f"resolving {ref}")
    att = find_attestation(reg, ref, public_key, key_name)
    issues = hardware.check_hardware(att.certificate, host_report if host_report is not None
                                     else hardware.node_report())
    if issues and not allow_uncertified_hw:
        raise Refused("refused: this node is not covered by the certificate: " + "; ".join(issues)
                      + " (--allow-uncertified-hw to pull anyway)")
    lock12(att.certificate.get("lock_hash"))  # a certificate without a lock hash is refused before pulling
    image_id: str | None = None
    tags: list[str] = []
    command, ran = None, False
    if fmt == "sif":
        command, ran = _pull_sif(reg, ref, att, sif_output, run_apptainer, say)
    elif fmt != "docker":
        raise UsageError("is not docker or sif", field="--format", value=fmt)
    else:
        assert client is not None
        image_id, tags = _pull_docker(client, reg, ref, att, say)
    return Pull(reference=f"{ref.name}@{att.digest}", digest=att.digest, attestation=att.manifest,
                found_by=att.found_by, signer=att.signer, signed=att.signed, image_id=image_id, local_tags=tuple(tags),
                sif_command=None if command is None else tuple(command), sif_ran=ran, warnings=tuple(issues),
                certificate=dict(att.certificate))
