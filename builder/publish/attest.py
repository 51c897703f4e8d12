"""A certificate as an in-toto attestation, optionally signed in a DSSE envelope.

The certificate (``envbuild.certificate/1``, :mod:`builder.certify.certificate`) is published next to
the image it certifies as an **in-toto Statement v1**
(https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md)::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "registry.example:5000/envbuild/cpu-torch2",
                  "digest": {"sha256": "<64 hex of the image manifest digest>"}}],
     "predicateType": PREDICATE_TYPE,
     "predicate": {"schema": "envbuild.attestation/1",
                   "certificate": {...the certificate as written by certify...},
                   "certificate_sha256": "<hex of the certificate file's bytes>",
                   "image": {"id": "sha256:...", "digest": "sha256:...", "repository": "...",
                             "tags": [...], "recipe": "...", "lock_hash": "sha256:..."},
                   "filesystem": {...builder.image.fshash result...} or null}}

so that supply-chain tools can read it (the subject is the image by digest; the predicate
is envbuild's certification). A site may sign it with its own key: the statement becomes
the payload of a **DSSE envelope**
(https://github.com/secure-systems-lab/dsse/blob/master/envelope.md, protocol.md)::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": "<base64 of the statement bytes>",
     "signatures": [{"keyid": "sha256:<hex of the DER public key>", "sig": "<base64>"}]}

signed over the pre-authentication encoding ``PAE(type, body) = "DSSEv1" SP LEN(type) SP
type SP LEN(body) SP body`` (lengths as ASCII decimal). Keys are PEM files (PKCS#8 private,
SubjectPublicKeyInfo public) of Ed25519 (signature: 64 raw bytes) or ECDSA P-256/P-384
(signature: ASN.1 DER, SHA-256/SHA-384), e.g. ``openssl genpkey -algorithm ed25519``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any, Mapping

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from builder.core.errors import EnvbuildError, ExitCode

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: envbuild's predicate type (a URI naming the predicate schema ``envbuild.attestation/1``).
PREDICATE_TYPE = "https://envbuild.dev/attestation/certification/v1"
PREDICATE_SCHEMA = "envbuild.attestation/1"
#: Media type of an in-toto statement (in-toto attestation spec, "Envelope" layer).
MEDIA_TYPE_STATEMENT = "application/vnd.in-toto+json"
#: Media type of a DSSE envelope (DSSE spec, "Media type").
MEDIA_TYPE_DSSE = "application/vnd.dsse.envelope.v1+json"
#: DSSE payloadType of an in-toto statement.
PAYLOAD_TYPE = MEDIA_TYPE_STATEMENT

#: Environment variables naming the site's keys when ``--sign-key`` / ``--verify-key``
#: are not given.
ENV_SIGN_KEY = "ENVBUILD_SIGN_KEY"
ENV_VERIFY_KEY = "ENVBUILD_VERIFY_KEY"
#: Passphrase of an encrypted private key (never stored by envbuild).
ENV_SIGN_KEY_PASSWORD = "ENVBUILD_SIGN_KEY_PASSWORD"


class SignatureMismatch(EnvbuildError):
    """The attestation's signature does not verify with the configured key (exit 2)."""


# --------------------------------------------------------------------------- statement


def canonical_json(doc: Any) -> bytes:
    """Compact JSON with sorted keys, UTF-8: the bytes that are published and signed."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def statement(
    *,
    subject_name: str,
    subject_digest: str,
    certificate: Mapping[str, Any],
    certificate_sha256: str | None = None,
    image: Mapping[str, Any] | None = None,
    filesystem: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The in-toto Statement v1 certifying the image ``subject_name@subject_digest``.

    Args:
        subject_name: the repository, e.g. ``"127.0.0.1:5000/envbuild/cpu-torch2"``.
        subject_digest: the image manifest digest ``"sha256:<64 hex>"``.
        certificate: the certificate document (``envbuild.certificate/1``).
        certificate_sha256: hex sha256 of the certificate file as written on disk.
        image: facts about the published image (id, digest, repository, tags, ...).
        filesystem: :meth:`builder.image.fshash.FsHash.to_json` of the image, or None.

    Raises:
        EnvbuildError: (exit 2) ``subject_digest`` is not ``sha256:<64 hex>``.
    """
    algo, _, hexd = subject_digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise EnvbuildError("is not sha256:<64 hex>", field="subject digest", value=subject_digest)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": hexd}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "schema": PREDICATE_SCHEMA,
            "certificate": dict(certificate),
            "certificate_sha256": certificate_sha256,
            "image": dict(image or {}),
            "filesystem": dict(filesystem) if filesystem else None,
        },
    }


def check_statement(doc: Any, subject_digest: str | None = None, *, origin: str = "attestation") -> dict:
    """Check the shape of a statement and (optionally) that it certifies ``subject_digest``.

    Returns:
        The statement's predicate (``envbuild.attestation/1``).

    Raises:
        EnvbuildError: (exit 2) not an in-toto Statement v1 of envbuild's predicate type,
            no certificate in it, or its subject is another digest (the message prints both).
    """
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        got = doc.get("_type") if isinstance(doc, dict) else type(doc).__name__
        raise EnvbuildError(f"is not an in-toto statement ({STATEMENT_TYPE})", file=origin, field="_type", value=got)
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise EnvbuildError(f"is not envbuild's certification ({PREDICATE_TYPE})", file=origin,
                            field="predicateType", value=doc.get("predicateType"))
    pred = doc.get("predicate")
    if not isinstance(pred, dict) or not isinstance(pred.get("certificate"), dict):
        raise EnvbuildError("holds no certificate", file=origin, field="predicate.certificate")
    subjects = doc.get("subject")
    digests = []
    if isinstance(subjects, list):
        for s in subjects:
            if isinstance(s, dict) and isinstance(s.get("digest"), dict) and s["digest"].get("sha256"):
                digests.append("sha256:" + str(s["digest"]["sha256"]))
    if not digests:
        raise EnvbuildError("names no sha256 subject", file=origin, field="subject")
    if subject_digest is not None and subject_digest not in digests:
        raise EnvbuildError(
            f"the certificate certifies {', '.join(digests)}, not the image {subject_digest}",
            file=origin, field="subject")
    return pred


# --------------------------------------------------------------------------- keys


#: Largest key file read, in bytes (a PEM key is a few hundred bytes).
MAX_KEY_BYTES = 1 << 20


def _read_key_file(path: str | os.PathLike, what: str) -> bytes:
    """The bytes of a key file, read bounded (:func:`builder.core.inputs.read_regular`).

    Raises:
        Unreachable: (exit 3) missing, not a regular file (a FIFO, a device, a directory),
            over :data:`MAX_KEY_BYTES`, unreadable.
    """
    from builder.core.inputs import read_regular

    return read_regular(path, MAX_KEY_BYTES, what)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load_private_key(path: str | os.PathLike, password: bytes | None = None):
    """Load a PEM private key (Ed25519 or ECDSA P-256/P-384) for signing.

    ``password`` defaults to ``$ENVBUILD_SIGN_KEY_PASSWORD`` when that is set.

    Raises:
        Unreachable: (exit 3) the file cannot be read (:func:`_read_key_file`).
        EnvbuildError: (exit 64) not a PEM private key, wrong password, or an unsupported
            key type.
    """
    data = _read_key_file(path, "signing key")
    if password is None and os.environ.get(ENV_SIGN_KEY_PASSWORD):
        password = os.environ[ENV_SIGN_KEY_PASSWORD].encode()
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise EnvbuildError(f"is not a usable PEM private key ({_first_line(e)})",
                            file=str(path), exit_code=ExitCode.USAGE) from None
    if not isinstance(key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey)):
        raise EnvbuildError(f"key type {type(key).__name__} is not supported (Ed25519 or ECDSA)",
                            file=str(path), exit_code=ExitCode.USAGE)
    _check_curve(key, path)
    return key


def load_public_key(path: str | os.PathLike):
    """Load a PEM public key (SubjectPublicKeyInfo) for verifying.

    Raises:
        Unreachable: (exit 3) the file cannot be read (:func:`_read_key_file`).
        EnvbuildError: (exit 64) not a PEM public key, unsupported type.
    """
    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise EnvbuildError(f"is not a PEM public key ({_first_line(e)})",
                            file=str(path), exit_code=ExitCode.USAGE) from None
    if not isinstance(key, (ed25519.Ed25519PublicKey, ec.EllipticCurvePublicKey)):
        raise EnvbuildError(f"key type {type(key).__name__} is not supported (Ed25519 or ECDSA)",
                            file=str(path), exit_code=ExitCode.USAGE)
    _check_curve(key, path)
    return key


def _check_curve(key, path) -> None:
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if not isinstance(key.curve, (ec.SECP256R1, ec.SECP384R1)):
            raise EnvbuildError(f"ECDSA curve {key.curve.name} is not supported (P-256 or P-384)",
                                file=str(path), exit_code=ExitCode.USAGE)


def _public(key):
    return key.public_key() if hasattr(key, "public_key") else key


def key_id(key) -> str:
    """``"sha256:<hex>"`` of the DER SubjectPublicKeyInfo of ``key`` (private or public)."""
    der = _public(key).public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _ec_hash(key):
    return hashes.SHA384() if isinstance(key.curve, ec.SECP384R1) else hashes.SHA256()


# --------------------------------------------------------------------------- DSSE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: ``b"DSSEv1 <len type> <type> <len body> <body>"``."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign(payload: bytes, key, payload_type: str = PAYLOAD_TYPE) -> dict[str, Any]:
    """A DSSE envelope of ``payload`` signed with ``key`` (see the module doc for the shape)."""
    msg = pae(payload_type, payload)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        sig = key.sign(msg)
    else:
        sig = key.sign(msg, ec.ECDSA(_ec_hash(key)))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [{"keyid": key_id(key), "sig": base64.b64encode(sig).decode("ascii")}],
    }


def _b64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not a string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_envelope(envelope: Any, public_key, *, origin: str = "attestation", key_name: str = "the key") -> bytes:
    """Verify a DSSE envelope with ``public_key``; returns the payload bytes.

    Passes when any signature verifies over ``PAE(payloadType, payload)``.

    Raises:
        SignatureMismatch: (exit 2) malformed envelope, no signature, or none verifies.
    """
    if not isinstance(envelope, dict):
        raise SignatureMismatch("is not a DSSE envelope", file=origin)
    try:
        payload = _b64(envelope.get("payload"))
    except ValueError:
        raise SignatureMismatch("payload is not base64", file=origin, field="payload") from None
    ptype = envelope.get("payloadType")
    if not isinstance(ptype, str):
        raise SignatureMismatch("missing", file=origin, field="payloadType")
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise SignatureMismatch("the attestation is not signed", file=origin, field="signatures")
    msg = pae(ptype, payload)
    for s in sigs:
        try:
            sig = _b64((s or {}).get("sig"))
        except (ValueError, AttributeError):
            continue
        try:
            if isinstance(public_key, ed25519.Ed25519PublicKey):
                public_key.verify(sig, msg)
            else:
                public_key.verify(sig, msg, ec.ECDSA(_ec_hash(public_key)))
            return payload
        except InvalidSignature:
            continue
    ids = ", ".join(str((s or {}).get("keyid")) for s in sigs if isinstance(s, dict))
    raise SignatureMismatch(
        f"signature does not verify with {key_name} ({key_id(public_key)}); signed by {ids or 'unknown keys'}",
        file=origin, field="signatures")


# --------------------------------------------------------------------------- blobs


def encode(stmt: Mapping[str, Any], key=None) -> tuple[bytes, str]:
    """The published blob and its media type: the canonical statement
    (``application/vnd.in-toto+json``) or, with ``key``, its DSSE envelope
    (``application/vnd.dsse.envelope.v1+json``)."""
    body = canonical_json(stmt)
    if key is None:
        return body, MEDIA_TYPE_STATEMENT
    return canonical_json(sign(body, key)), MEDIA_TYPE_DSSE


def decode(blob: bytes, media_type: str, *, public_key=None, key_name: str = "the key",
           origin: str = "attestation") -> tuple[dict[str, Any], str | None]:
    """Parse a published attestation blob; verify its signature when ``public_key`` is given.

    Returns:
        ``(statement, signer)``: ``signer`` is the verified key id, or None when not checked.

    Raises:
        SignatureMismatch: (exit 2) a key is configured and the blob is unsigned, or no
            signature verifies.
        EnvbuildError: (exit 2) not JSON, unknown media type.
    """
    try:
        doc = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvbuildError(f"is not JSON ({e})", file=origin) from None
    if media_type == MEDIA_TYPE_DSSE:
        if public_key is not None:
            payload = verify_envelope(doc, public_key, origin=origin, key_name=key_name)
            signer = key_id(public_key)
        else:
            try:
                payload = _b64(doc.get("payload") if isinstance(doc, dict) else None)
            except ValueError:
                raise EnvbuildError("payload is not base64", file=origin, field="payload") from None
            signer = None
        try:
            return json.loads(payload), signer
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise EnvbuildError(f"payload is not JSON ({e})", file=origin, field="payload") from None
    if media_type == MEDIA_TYPE_STATEMENT:
        if public_key is not None:
            raise SignatureMismatch(f"the attestation is not signed, and {key_name} is configured to check it",
                                    file=origin, field="signatures")
        return doc, None
    raise EnvbuildError(f"media type is neither {MEDIA_TYPE_STATEMENT} nor {MEDIA_TYPE_DSSE}",
                        file=origin, field="mediaType", value=media_type)
