"""builder/publish/attest.py: the certificate as an in-toto Statement v1, DSSE signing and checks.

Pure unit tests (no engine); one cross-check verifies an envbuild signature with the
openssl command line over the DSSE pre-authentication encoding."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from builder.core.errors import EnvbuildError, ExitCode
from builder.publish import attest

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
CERT = {"schema": "envbuild.certificate/1", "recipe": "cpu-torch2", "lock_hash": "sha256:" + "1" * 64,
        "image": {"id": "sha256:" + "2" * 64}, "verdict": {"passed": True, "exit_code": 0, "failures": []}}


def stmt(digest=DIGEST):
    return attest.statement(subject_name="127.0.0.1:5000/envbuild/cpu-torch2", subject_digest=digest,
                            certificate=CERT, certificate_sha256="3" * 64, image={"id": CERT["image"]["id"]})


def write_keys(tmp_path, key, name="site"):
    priv = tmp_path / f"{name}.key"
    pub = tmp_path / f"{name}.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def test_statement_is_in_toto_v1_with_the_image_digest_as_subject():
    s = stmt()
    assert s["_type"] == "https://in-toto.io/Statement/v1"
    assert s["subject"] == [{"name": "127.0.0.1:5000/envbuild/cpu-torch2", "digest": {"sha256": "ab" * 32}}]
    assert s["predicateType"] == attest.PREDICATE_TYPE
    assert s["predicate"]["schema"] == "envbuild.attestation/1"
    assert s["predicate"]["certificate"] == CERT
    pred = attest.check_statement(s, DIGEST)
    assert pred["image"]["id"] == CERT["image"]["id"]


def test_statement_for_another_digest_is_refused_with_both_digests():
    with pytest.raises(EnvbuildError) as e:
        attest.check_statement(stmt(OTHER), DIGEST)
    assert OTHER in str(e.value) and DIGEST in str(e.value)
    assert e.value.exit_code == ExitCode.CHECK_FAILED


@pytest.mark.parametrize("change, field", [
    ({"_type": "https://in-toto.io/Statement/v0.1"}, "_type"),
    ({"predicateType": "https://slsa.dev/provenance/v1"}, "predicateType"),
    ({"predicate": {"schema": "x"}}, "predicate.certificate"),
    ({"subject": []}, "subject"),
])
def test_malformed_statements_are_named(change, field):
    bad = {**stmt(), **change}
    with pytest.raises(EnvbuildError) as e:
        attest.check_statement(bad, DIGEST, origin="reg/x@sha256:y")
    assert e.value.field == field and e.value.file == "reg/x@sha256:y"


def test_bad_subject_digest_is_rejected():
    with pytest.raises(EnvbuildError, match="sha256:<64 hex>"):
        attest.statement(subject_name="x", subject_digest="sha256:abc", certificate=CERT)


def test_pae_matches_the_dsse_spec_example():
    # DSSE protocol.md: PAE("http://example.com/HelloWorld", "hello world")
    assert attest.pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


@pytest.mark.parametrize("make_key", [
    ed25519.Ed25519PrivateKey.generate,
    lambda: ec.generate_private_key(ec.SECP256R1()),
    lambda: ec.generate_private_key(ec.SECP384R1()),
], ids=["ed25519", "p256", "p384"])
def test_sign_and_verify_round_trip(tmp_path, make_key):
    priv, pub = write_keys(tmp_path, make_key())
    key = attest.load_private_key(priv)
    blob, media_type = attest.encode(stmt(), key)
    assert media_type == attest.MEDIA_TYPE_DSSE
    env = json.loads(blob)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert json.loads(base64.b64decode(env["payload"])) == stmt()
    assert env["signatures"][0]["keyid"] == attest.key_id(key)
    got, signer = attest.decode(blob, media_type, public_key=attest.load_public_key(pub))
    assert got == stmt() and signer == attest.key_id(key)
    # without a key configured the statement is read, the signature not checked
    assert attest.decode(blob, media_type) == (stmt(), None)


def test_tampered_payload_and_other_key_are_refused(tmp_path):
    key = ed25519.Ed25519PrivateKey.generate()
    _, other_pub = write_keys(tmp_path, ed25519.Ed25519PrivateKey.generate(), "other")
    blob, mt = attest.encode(stmt(), key)
    env = json.loads(blob)
    forged = dict(stmt())
    forged["predicate"] = {**forged["predicate"],
                           "certificate": {**CERT, "verdict": {"passed": True, "note": "forged"}}}
    env_tampered = {**env, "payload": base64.b64encode(attest.canonical_json(forged)).decode()}
    with pytest.raises(attest.SignatureMismatch, match="does not verify"):
        attest.decode(attest.canonical_json(env_tampered), mt, public_key=key.public_key())
    with pytest.raises(attest.SignatureMismatch) as e:
        attest.decode(blob, mt, public_key=attest.load_public_key(other_pub), key_name=str(other_pub))
    assert str(other_pub) in str(e.value) and attest.key_id(key) in str(e.value)
    assert e.value.exit_code == ExitCode.CHECK_FAILED


def test_unsigned_statement_is_refused_when_a_key_is_configured():
    blob, mt = attest.encode(stmt())
    assert mt == attest.MEDIA_TYPE_STATEMENT
    assert attest.decode(blob, mt) == (stmt(), None)
    with pytest.raises(attest.SignatureMismatch, match="not signed"):
        attest.decode(blob, mt, public_key=ed25519.Ed25519PrivateKey.generate().public_key())


def test_key_files_errors_are_one_line_usage_errors(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    with pytest.raises(EnvbuildError) as e:
        attest.load_private_key(junk)
    assert e.value.exit_code == ExitCode.USAGE and e.value.file == str(junk) and "\n" not in str(e.value)
    rsa_priv, rsa_pub = write_keys(tmp_path, rsa.generate_private_key(public_exponent=65537, key_size=2048), "rsa")
    with pytest.raises(EnvbuildError, match="not supported"):
        attest.load_private_key(rsa_priv)
    with pytest.raises(EnvbuildError, match="not supported"):
        attest.load_public_key(rsa_pub)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.pub", "no such public key"),
    (lambda d: d, "is a directory, not a public key"),
    (lambda d: (os.mkfifo(d / "fifo"), d / "fifo")[1], "is not a regular file (a FIFO); give a public key"),
    (lambda d: Path("/dev/zero"), "is not a regular file (a character device); give a public key"),
    (lambda d: ((d / "big.pub").write_bytes(b"-" * 1048577), d / "big.pub")[1],
     "is 1048577 bytes, over the 1048576-byte limit of a public key"),
])
def test_unreadable_key_files_are_exit_3_without_reading_them(tmp_path, make, message):
    """A key file that cannot be read (missing, a directory, a FIFO without writer, a device,
    too large) is "could not check" (3), found without blocking or reading it whole; a file
    that reads but holds no key is a usage error (64, above)."""
    path = make(tmp_path)
    with pytest.raises(EnvbuildError) as e:
        attest.load_public_key(path)
    assert (e.value.exit_code, str(e.value)) == (ExitCode.UNREACHABLE, f"{path}: {message}")


def test_key_file_that_reads_loads_twin(tmp_path):
    _, pub = write_keys(tmp_path, ed25519.Ed25519PrivateKey.generate(), "ok")
    assert isinstance(attest.load_public_key(pub), ed25519.Ed25519PublicKey)


def test_encrypted_key_uses_the_password_from_the_environment(tmp_path, monkeypatch):
    key = ed25519.Ed25519PrivateKey.generate()
    path = tmp_path / "enc.key"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"s3cret")))
    with pytest.raises(EnvbuildError, match="not a usable PEM private key"):
        attest.load_private_key(path)
    monkeypatch.setenv(attest.ENV_SIGN_KEY_PASSWORD, "s3cret")
    assert attest.key_id(attest.load_private_key(path)) == attest.key_id(key)


def test_openssl_keys_and_openssl_verifies_the_signature(tmp_path):
    """The key commands of docs/publish.md work, and openssl verifies envbuild's Ed25519 signature
    over PAE(payloadType, payload): the envelope is standard DSSE."""
    priv, pub = tmp_path / "site.key", tmp_path / "site.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(priv)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(priv), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    blob, mt = attest.encode(stmt(), attest.load_private_key(priv))
    env = json.loads(blob)
    (tmp_path / "pae.bin").write_bytes(attest.pae(env["payloadType"], base64.b64decode(env["payload"])))
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
    res = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(pub), "-rawin",
                          "-in", str(tmp_path / "pae.bin"), "-sigfile", str(tmp_path / "sig.bin")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert attest.decode(blob, mt, public_key=attest.load_public_key(pub))[1] is not None


def test_published_schema_is_current_and_a_statement_validates():
    """schemas/attestation.schema.json is the model's schema; envbuild's statement validates
    against it, and a statement with an unknown key or another subject digest shape does not."""
    import jsonschema

    published = json.loads((Path(__file__).resolve().parents[2] / "schemas/attestation.schema.json").read_text())
    assert published == attest.attestation_schema()
    validator = jsonschema.Draft202012Validator(published)
    assert list(validator.iter_errors(stmt())) == []
    assert [e.validator for e in validator.iter_errors({**stmt(), "extra": 1})] == ["additionalProperties"]
    bad = {**stmt(), "subject": [{"name": "x", "digest": {"sha256": "abc"}}]}
    assert [e.validator for e in validator.iter_errors(bad)] == ["pattern"]


def test_envelopes_are_the_ones_published_before():
    """A fixed Ed25519 key signs deterministically: the envelope is byte for byte the one the
    hand-written DSSE code published (sha256 recorded before the move to securesystemslib),
    and it verifies."""
    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    s = attest.statement(subject_name="127.0.0.1:5000/envbuild/cpu-torch2", subject_digest=DIGEST,
                         certificate={"schema": "envbuild.certificate/1", "verdict": {"passed": True}},
                         certificate_sha256="3" * 64, image={"id": "sha256:" + "2" * 64})
    blob, mt = attest.encode(s, key)
    assert hashlib.sha256(blob).hexdigest() == "a748220b91054d067f54b317bddf5b45e381b2197e3d672ffb03b265267bee90"
    assert attest.decode(blob, mt, public_key=key.public_key()) == (s, attest.key_id(key))


def test_a_signature_verifies_whatever_key_id_it_carries():
    """DSSE makes keyid an unauthenticated hint: a signature under another (or no) keyid still
    verifies with the right key, and still fails with the wrong one."""
    key = ec.generate_private_key(ec.SECP256R1())
    env = json.loads(attest.encode(stmt(), key)[0])
    env["signatures"] = [{"keyid": "sha256:" + "0" * 64, "sig": env["signatures"][0]["sig"]},
                         {"sig": env["signatures"][0]["sig"]}]
    blob = attest.canonical_json(env)
    assert attest.decode(blob, attest.MEDIA_TYPE_DSSE, public_key=key.public_key())[1] == attest.key_id(key)
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(attest.SignatureMismatch, match="does not verify"):
        attest.decode(blob, attest.MEDIA_TYPE_DSSE, public_key=other)
