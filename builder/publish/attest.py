"""A certificate as an in-toto Statement v1, optionally signed in a DSSE envelope. Every signature
is offered to the configured key whatever its key id (DSSE: an unauthenticated hint). Sources:
https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md,
https://github.com/secure-systems-lab/dsse/blob/master/envelope.md."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from typing import Annotated, Any, TypeAlias

import msgspec
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from msgspec import Meta

from builder.core import inputs
from builder.core.errors import EnvbuildError, UsageError
from builder.core.model import json_schema
from builder.oci.manifest import canonical_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: A URI naming the predicate schema ``envbuild.attestation/1``.
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
#: Largest key file read, in bytes (a PEM key is a few hundred bytes).
MAX_KEY_BYTES = 1 << 20

PrivateKey: TypeAlias = "ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey"
PublicKey: TypeAlias = "ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey"


class SignatureMismatch(EnvbuildError):
    """The attestation's signature does not verify with the configured key (exit 2)."""


# --------------------------------------------------------------------------- statement

_Hex64 = Annotated[str, Meta(pattern=r"\A[0-9a-f]{64}\Z")]


class SubjectDigest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sha256: _Hex64


class Subject(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The image the statement is about: its repository and manifest digest."""

    name: Annotated[str, Meta(max_length=1000)]
    digest: SubjectDigest


class Predicate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """envbuild's certification (``envbuild.attestation/1``)."""

    schema: Annotated[str, Meta(pattern=r"\Aenvbuild\.attestation/1\Z")]
    certificate: dict[str, Any]
    certificate_sha256: _Hex64 | None
    image: dict[str, Any]
    filesystem: dict[str, Any] | None


class Statement(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An in-toto Statement v1 with envbuild's predicate."""

    type: Annotated[str, Meta(pattern=r"\Ahttps://in-toto\.io/Statement/v1\Z")] = msgspec.field(name="_type")
    subject: Annotated[list[Subject], Meta(min_length=1)]
    predicate_type: Annotated[str, Meta(pattern=r"\Ahttps://envbuild\.dev/attestation/certification/v1\Z")] = (
        msgspec.field(name="predicateType"))
    predicate: Predicate


def schemas() -> dict[str, tuple[Any, str, str]]:
    """The published document of this package: ``{name: (model, $id, title)}``."""
    return {"attestation": (Statement, "https://envbuild.dev/schemas/attestation.schema.json",
                            "envbuild attestation: in-toto Statement v1 of a certification")}


def attestation_schema() -> dict[str, Any]:
    """The JSON Schema of :class:`Statement` (``schemas/attestation.schema.json``)."""
    model, schema_id, title = schemas()["attestation"]
    return json_schema(model, schema_id, title)


def statement(*, subject_name: str, subject_digest: str, certificate: Mapping[str, Any],
              certificate_sha256: str | None = None, image: Mapping[str, Any] | None = None,
              filesystem: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The in-toto Statement certifying ``subject_name@subject_digest``, as JSON data.
    Raises EnvbuildError (exit 2) when ``subject_digest`` is not ``sha256:<64 hex>``."""
    algo, _, hexd = subject_digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise EnvbuildError("is not sha256:<64 hex>", field="subject digest", value=subject_digest)
    stmt = Statement(type=STATEMENT_TYPE, subject=[Subject(name=subject_name, digest=SubjectDigest(sha256=hexd))],
                     predicate_type=PREDICATE_TYPE,
                     predicate=Predicate(schema=PREDICATE_SCHEMA, certificate=dict(certificate),
                                         certificate_sha256=certificate_sha256, image=dict(image or {}),
                                         filesystem=dict(filesystem) if filesystem else None))
    return msgspec.to_builtins(stmt)


def check_statement(doc: Any, subject_digest: str | None = None, *, origin: str = "attestation") -> dict[str, Any]:
    """Check a statement's shape and that it certifies ``subject_digest``; returns its predicate.
    Raises EnvbuildError (exit 2) on another type, no certificate, or another subject digest."""
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        got = doc.get("_type") if isinstance(doc, dict) else type(doc).__name__
        raise EnvbuildError(f"is not an in-toto statement ({STATEMENT_TYPE})", file=origin, field="_type", value=got)
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise EnvbuildError(f"is not envbuild's certification ({PREDICATE_TYPE})", file=origin,
                            field="predicateType", value=doc.get("predicateType"))
    pred = doc.get("predicate")
    if not isinstance(pred, dict) or not isinstance(pred.get("certificate"), dict):
        raise EnvbuildError("holds no certificate", file=origin, field="predicate.certificate")
    subjects = doc["subject"] if isinstance(doc.get("subject"), list) else []
    digests = ["sha256:" + str(s["digest"]["sha256"]) for s in subjects
               if isinstance(s, dict) and isinstance(s.get("digest"), dict) and s["digest"].get("sha256")]
    if not digests:
        raise EnvbuildError("names no sha256 subject", file=origin, field="subject")
    if subject_digest is not None and subject_digest not in digests:
        raise EnvbuildError(f"the certificate certifies {', '.join(digests)}, not the image {subject_digest}",
                            file=origin, field="subject")
    return pred


# --------------------------------------------------------------------------- keys


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load_private_key(path: str | os.PathLike[str], password: bytes | None = None) -> PrivateKey:
    """A PEM Ed25519 or ECDSA P-256/P-384 private key for signing. Raises Unreachable (exit 3) when
    the file cannot be read, EnvbuildError (exit 64) when it is no usable key."""
    data = inputs.read_regular(path, MAX_KEY_BYTES, "signing key")
    if password is None and os.environ.get(ENV_SIGN_KEY_PASSWORD):
        password = os.environ[ENV_SIGN_KEY_PASSWORD].encode()
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise UsageError(f"is not a usable PEM private key ({_first_line(e)})", file=str(path)) from None
    return _checked(key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey), path)


def load_public_key(path: str | os.PathLike[str]) -> PublicKey:
    """A PEM public key (SubjectPublicKeyInfo); errors as :func:`load_private_key`."""
    data = inputs.read_regular(path, MAX_KEY_BYTES, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise UsageError(f"is not a PEM public key ({_first_line(e)})", file=str(path)) from None
    return _checked(key, (ed25519.Ed25519PublicKey, ec.EllipticCurvePublicKey), path)


def _checked(key: Any, kinds: tuple[type, ...], path: str | os.PathLike[str]) -> Any:
    """``key`` when it is one of ``kinds`` (Ed25519, or ECDSA on P-256 or P-384); else UsageError (exit 64)."""
    if not isinstance(key, kinds):
        raise UsageError(f"key type {type(key).__name__} is not supported (Ed25519 or ECDSA)", file=str(path))
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and \
            not isinstance(key.curve, (ec.SECP256R1, ec.SECP384R1)):
        raise UsageError(f"ECDSA curve {key.curve.name} is not supported (P-256 or P-384)", file=str(path))
    return key


def _public(key: PrivateKey | PublicKey) -> PublicKey:
    return key.public_key() if isinstance(key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey)) else key


def key_id(key: PrivateKey | PublicKey) -> str:
    """``"sha256:<hex>"`` of the DER SubjectPublicKeyInfo of ``key`` (private or public)."""
    der = _public(key).public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _sslib_key(key: PrivateKey | PublicKey) -> Any:
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(_public(key), keyid=key_id(key))


# --------------------------------------------------------------------------- DSSE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding of ``payload``."""
    from securesystemslib.dsse import Envelope

    return Envelope(payload, payload_type, {}).pae()


def sign(payload: bytes, key: PrivateKey, payload_type: str = PAYLOAD_TYPE) -> dict[str, Any]:
    """A DSSE envelope of ``payload`` signed with ``key``."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    envelope = Envelope(payload, payload_type, {})
    envelope.sign(CryptoSigner(key, _sslib_key(key)))
    return envelope.to_dict()


def _b64(text: Any) -> bytes:
    """Standard or URL-safe base64 (DSSE accepts both)."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _verifies(payload: bytes, payload_type: str, sig: bytes, key: Any) -> bool:
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import Signature

    try:
        Envelope(payload, payload_type, {key.keyid: Signature(key.keyid, sig.hex())}).verify([key], 1)
    except VerificationError:
        return False
    return True


def verify_envelope(envelope: Any, public_key: PublicKey, *, origin: str = "attestation",
                    key_name: str = "the key") -> bytes:
    """The payload of a DSSE envelope when any signature verifies with ``public_key``.
    Raises SignatureMismatch (exit 2) on a malformed envelope, no signature, or none verifying."""
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
    key = _sslib_key(public_key)
    for s in sigs:
        try:
            sig = _b64((s or {}).get("sig"))
        except (ValueError, AttributeError):
            continue
        if _verifies(payload, ptype, sig, key):
            return payload
    ids = ", ".join(str((s or {}).get("keyid")) for s in sigs if isinstance(s, dict))
    raise SignatureMismatch(
        f"signature does not verify with {key_name} ({key_id(public_key)}); signed by {ids or 'unknown keys'}",
        file=origin, field="signatures")


# --------------------------------------------------------------------------- blobs


def encode(stmt: Mapping[str, Any], key: PrivateKey | None = None) -> tuple[bytes, str]:
    """The published blob and its media type: the canonical statement, or its DSSE envelope."""
    body = canonical_json(stmt)
    if key is None:
        return body, MEDIA_TYPE_STATEMENT
    return canonical_json(sign(body, key)), MEDIA_TYPE_DSSE


def _json(data: bytes, origin: str, field: str | None = None, what: str = "is not JSON") -> Any:
    try:
        return inputs.load_json(data, origin)
    except EnvbuildError as e:
        raise EnvbuildError(f"{what} ({e.message.removeprefix('not valid JSON: ')})", file=origin,
                            field=field) from None


def decode(blob: bytes, media_type: str, *, public_key: PublicKey | None = None, key_name: str = "the key",
           origin: str = "attestation") -> tuple[dict[str, Any], str | None]:
    """``(statement, verified signer key id or None)`` of a published attestation blob.
    Raises SignatureMismatch (exit 2) when ``public_key`` is given and no signature verifies, and
    EnvbuildError (exit 2) on bad JSON or an unknown media type."""
    doc = _json(blob, origin)
    if media_type == MEDIA_TYPE_DSSE:
        signer = None
        if public_key is not None:
            payload = verify_envelope(doc, public_key, origin=origin, key_name=key_name)
            signer = key_id(public_key)
        else:
            try:
                payload = _b64(doc.get("payload") if isinstance(doc, dict) else None)
            except ValueError:
                raise EnvbuildError("payload is not base64", file=origin, field="payload") from None
        return _json(payload, origin, "payload", "payload is not JSON"), signer
    if media_type == MEDIA_TYPE_STATEMENT:
        if public_key is not None:
            raise SignatureMismatch(f"the attestation is not signed, and {key_name} is configured to check it",
                                    file=origin, field="signatures")
        return doc, None
    raise EnvbuildError(f"media type is neither {MEDIA_TYPE_STATEMENT} nor {MEDIA_TYPE_DSSE}",
                        file=origin, field="mediaType", value=media_type)
