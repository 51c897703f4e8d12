"""builder/publish (push, pull, store, hardware) and builder/oci (client, referrers) against a real
registry, through ``envbuild push``/``pull`` and their functions.

The registry is Debian's docker-registry 2.8 with htpasswd auth (``registry_server``,
tests/fixtures_registry.py), reached through the Docker config in ``DOCKER_CONFIG``. It
has no OCI Referrers API, so certificates are found through the ``sha256-<hex>`` fallback
tag or the ``<tag>.cert`` pointer. Test images are small (the bootstrapped Debian base plus
a marker file, with the labels of the rendered cpu-torch2 lock); their certificates come
from ``builder.certify.run`` with a launcher that replays passing rank results
(``RecordedLauncher``). One test certifies the session's real torch image instead.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from pathlib import Path
from types import SimpleNamespace

import docker.errors
import jsonschema
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from test_registry_units import GPU  # noqa: F401

from builder.certify import certificate
from builder.cli.app import main
from builder.core.certificate import load_certificate
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.image.engine import docker_login
from builder.oci import client as oci
from builder.oci import manifest, referrers
from builder.publish import attest, naming
from builder.publish import pull as pulling
from builder.publish import push as pushing

from certify_helpers import certify_image
from fixtures_registry import free_port, recipe_labels, recorded_certificate, small_image, write_docker_config

INDEX = "application/vnd.oci.image.index.v1+json"
ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv):
    """Run ``envbuild ARGV`` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


@pytest.fixture
def make_certified(docker_client, bootstrap_image, test_labels, tmp_path):
    """make(recipe="cpu-torch2", gpus=None, driver=None) -> a small image with a passing
    certificate under tmp_path/images (attributes: tag, id, cert, path, images_dir)."""

    def make(recipe: str = "cpu-torch2", gpus=None, driver=None, certified: bool = True):
        marker = uuid.uuid4().hex[:12]
        tag = f"envbuild-test/registry:{marker}"
        image_id = small_image(docker_client, tag, {**recipe_labels(recipe), **test_labels}, marker, bootstrap_image)
        cert = path = None
        if certified:
            cert, path = recorded_certificate(docker_client, tag, tmp_path / "images", test_labels,
                                              gpus=gpus, driver=driver)
            assert cert["verdict"]["passed"], cert["verdict"]
        return SimpleNamespace(tag=tag, id=image_id, cert=cert, path=path, images_dir=tmp_path / "images",
                               recipe=recipe, lock12=naming.lock12(recipe_labels(recipe)["envbuild.lock-hash"]))

    return make


def names_of(client, image_id) -> set[str]:
    try:
        attrs = client.sdk.images.get(image_id).attrs
    except docker.errors.ImageNotFound:
        return set()
    return set(attrs.get("RepoTags") or []) | set(attrs.get("RepoDigests") or [])


def refs_under(client, name: str) -> list[str]:
    """Every local tag or digest reference of repository ``name``."""
    out = []
    for img in client.sdk.images.list():
        for r in (img.attrs.get("RepoTags") or []) + (img.attrs.get("RepoDigests") or []):
            if r.startswith(name + ":") or r.startswith(name + "@"):
                out.append(r)
    return out


def no_gpu_host():
    return {"driver": None, "gpus": []}


# --------------------------------------------------------------------------- push + pull


def test_push_then_pull_by_digest_on_a_clean_engine(registry, namespace, make_certified, docker_client, capsys):
    img = make_certified()
    code, out, err = run_cli(capsys, "--images-dir", img.images_dir, "push", "cpu-torch2",
                             "--registry", registry.host, "--namespace", namespace)
    assert code == 0, err
    name = f"{registry.host}/{namespace}/cpu-torch2"
    digest = re.search(rf"pushed {re.escape(name)}@(sha256:[0-9a-f]{{64}})", out).group(1)
    assert f"tags: {img.lock12}, certified" in out and "unsigned" in out
    assert "filesystem content envbuild.fshash/1 sha256:" in out

    # the registry: both tags name the pushed digest; the certificate artifact refers to it
    s = registry.session()
    api = f"http://{registry.host}/v2/{namespace}/cpu-torch2"
    for tag in (img.lock12, "certified"):
        r = s.head(f"{api}/manifests/{tag}", headers={"Accept": manifest.MANIFEST_ACCEPT})
        assert r.headers["Docker-Content-Digest"] == digest
    index = s.get(f"{api}/manifests/{referrers.fallback_tag(digest)}", headers={"Accept": INDEX}).json()
    [entry] = index["manifests"]
    assert entry["artifactType"] == "application/vnd.in-toto+json"
    artifact = s.get(f"{api}/manifests/{entry['digest']}", headers={"Accept": manifest.MT_OCI_MANIFEST}).json()
    assert artifact["subject"]["digest"] == digest
    assert artifact["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
    statement = s.get(f"{api}/blobs/{artifact['layers'][0]['digest']}").json()
    assert statement["subject"][0] == {"name": name, "digest": {"sha256": digest.split(":")[1]}}
    assert statement["predicate"]["certificate"] == json.loads(img.path.read_text())
    assert statement["predicate"]["image"]["id"] == img.id
    # the push left no registry-named reference on the local image
    assert not any(r.startswith(registry.host) for r in names_of(docker_client, img.id))

    # a clean engine: the image is gone before the pull
    docker_client.sdk.images.remove(img.id, force=True)
    assert names_of(docker_client, img.id) == set()
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == 0, err
    assert f"certified {name}@{digest}" in out and "found by" not in err
    pulled = docker_client.sdk.images.get(f"{name}@{digest}")
    assert pulled.id == img.id
    assert set(pulled.tags) == {f"{name}:certified", f"{name}:{img.lock12}"}

    # by digest alone: the certificate is found through the fallback tag sha256-<hex>
    code, out, err = run_cli(capsys, "pull", f"{name}@{digest}")
    assert code == 0, err
    assert f"(tag {referrers.fallback_tag(digest)})" in out


def test_pull_format_sif_prints_the_apptainer_pull_by_digest(registry, namespace, make_certified, docker_client,
                                                             capsys):
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir, namespace=namespace,
                      fs_hash=False)
    docker_client.sdk.images.remove(img.id, force=True)
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace,
                             "--format", "sif", "--print-only")
    assert code == 0, err
    assert (f"apptainer pull --no-https cpu-torch2_{img.lock12}.sif docker://{pushed.repository}@{pushed.digest}"
            in out)
    assert names_of(docker_client, img.id) == set()  # nothing pulled into the engine


def run_json_cli(capsys, schema: str, *argv) -> tuple[int, dict]:
    """``envbuild ARGV --json`` in this process: (exit code, the one document on stdout, valid
    against ``schemas/<schema>.schema.json``)."""
    code, out, err = run_cli(capsys, *argv, "--json")
    doc = json.loads(out)
    path = Path(__file__).resolve().parents[2] / "schemas" / f"{schema}.schema.json"
    jsonschema.Draft202012Validator(json.loads(path.read_text())).validate(doc)
    return code, doc


def test_push_and_pull_json(registry, namespace, make_certified, docker_client, capsys, tmp_path):
    img = make_certified()
    push = ("--images-dir", img.images_dir, "push", "cpu-torch2", "--registry", registry.host, "--namespace", namespace,
            "--no-fs-hash")
    code, pushed = run_json_cli(capsys, "push", *push)
    assert (code, pushed["tags"], pushed["signed_by"], pushed["certificate_path"]) == (
        0, [img.lock12, "certified"], None, str(img.path))
    docker_client.sdk.images.remove(img.id, force=True)
    pull = ("pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    code, pulled = run_json_cli(capsys, "pull", *pull)
    assert (code, pulled["digest"], pulled["image_id"], pulled["signed"]) == (0, pushed["digest"], img.id, False)
    assert pulled["certificate"] == json.loads(img.path.read_text())
    # the failing twins: an image without certificate is not pushed, an unsigned one not pulled with a key
    other = make_certified(certified=False)
    code, doc = run_json_cli(capsys, "error", *push, "--image", other.tag)
    assert (code, doc["exit_code"]) == (2, 2) and "has no certificate" in doc["errors"][0]["message"]
    key = ed25519.Ed25519PrivateKey.generate()
    code, doc = run_json_cli(capsys, "error", *pull, "--verify-key", write_public(key, tmp_path / "site.pub"))
    assert (code, doc["exit_code"]) == (2, 2), doc


# --------------------------------------------------------------------------- refusals


def test_push_refused_without_a_passing_certificate(registry, namespace, make_certified, docker_client, capsys,
                                                    tmp_path):
    img = make_certified(certified=False)
    base = ("--images-dir", img.images_dir, "push", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    code, out, err = run_cli(capsys, *base, "--image", img.tag)
    assert code == ExitCode.CHECK_FAILED
    assert len(error_lines(err)) == 1 and "has no certificate" in err and img.tag in err
    code, out, err = run_cli(capsys, *base)
    assert code == ExitCode.CHECK_FAILED and "no passing certificate for recipe cpu-torch2" in err

    # a failing certificate of that very image is refused too, naming the failure
    good = make_certified()
    failing = {**good.cert, "image": {**good.cert["image"], "id": img.id},
               "verdict": {"passed": False, "exit_code": 2, "failures": ["rank 1: all-reduce sum wrong at 8 B"],
                           "warnings": []}}
    certificate.write_certificate(load_certificate(failing), img.images_dir)
    code, out, err = run_cli(capsys, *base, "--image", img.tag)
    assert code == ExitCode.CHECK_FAILED and "failed certification (rank 1: all-reduce sum wrong at 8 B)" in err

    # nothing reached the registry
    r = registry.session().get(f"http://{registry.host}/v2/{namespace}/cpu-torch2/tags/list")
    assert r.status_code == 404


def test_pull_refused_when_the_tag_moved_after_certification(registry, namespace, make_certified, docker_client,
                                                             capsys):
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir, namespace=namespace,
                      fs_hash=False)
    other = make_certified(certified=False)
    creds = docker_login(registry.host)
    moved = pushing.engine_push(docker_client, other.id, pushed.repository, "certified", creds)
    assert moved != pushed.digest
    docker_client.sdk.images.remove(other.id, force=True)

    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == ExitCode.CHECK_FAILED
    [line] = error_lines(err)
    assert moved in line and pushed.digest in line and "moved after certification" in line
    assert all(moved not in r for r in refs_under(docker_client, pushed.repository))
    assert names_of(docker_client, other.id) == set()

    # the lock-hash tag was not moved: pulling it still works
    code, out, err = run_cli(capsys, "pull", f"{pushed.repository}:{img.lock12}")
    assert code == 0, err


def test_pull_refused_when_no_certificate_is_published(registry, namespace, make_certified, docker_client, capsys):
    img = make_certified(certified=False)
    name = f"{registry.host}/{namespace}/cpu-torch2"
    digest = pushing.engine_push(docker_client, img.id, name, "certified", docker_login(registry.host))
    docker_client.sdk.images.remove(img.id, force=True)
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == ExitCode.CHECK_FAILED
    [line] = error_lines(err)
    assert f"no certificate is published for {name}@{digest}" in line and referrers.fallback_tag(digest) in line
    assert names_of(docker_client, img.id) == set() and refs_under(docker_client, name) == []


def test_pull_refused_when_the_certificate_was_altered_in_the_registry(registry, namespace, make_certified,
                                                                        docker_client, capsys):
    img = make_certified()
    pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir, namespace=namespace,
                 fs_hash=False)
    docker_client.sdk.images.remove(img.id, force=True)
    s = registry.session()
    api = f"http://{registry.host}/v2/{namespace}/cpu-torch2"
    artifact = s.get(f"{api}/manifests/certified.cert", headers={"Accept": manifest.MT_OCI_MANIFEST}).json()
    blob = registry.blob_path(artifact["layers"][0]["digest"])
    data = blob.read_bytes()
    altered = data.replace(b'"exit_code":0', b'"exit_code":1', 1)
    assert altered != data and len(altered) == len(data)
    blob.write_bytes(altered)
    try:
        code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    finally:
        blob.write_bytes(data)
    assert code == ExitCode.CHECK_FAILED
    [line] = error_lines(err)
    assert "altered in the registry" in line and artifact["layers"][0]["digest"] in line
    assert names_of(docker_client, img.id) == set()


def test_forged_certificate_pull_leaves_no_half_tagged_image(registry, namespace, make_certified, docker_client,
                                                             capsys):
    """A tag moved to another image *and* a certificate copied onto it: the statement names
    the new digest, but the pulled image is not the certified image: refused after the
    pull, and the pulled image is removed again (no tag, no digest reference)."""
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir, namespace=namespace,
                      fs_hash=False)
    other = make_certified(certified=False)
    client = oci.RegistryClient(registry.host, credentials=docker_login(registry.host))
    repo = f"{namespace}/cpu-torch2"
    moved = pushing.engine_push(docker_client, other.id, pushed.repository, "certified", client.credentials)
    docker_client.sdk.images.remove(other.id, force=True)
    subject_body, subject = client.get_manifest(repo, moved)
    forged = attest.statement(subject_name=pushed.repository, subject_digest=moved, certificate=img.cert,
                              image={"id": img.id})
    blob, mt = attest.encode(forged)
    _, body, _ = referrers.attach(client, repo, subject, blob, mt, artifact_type=naming.ARTIFACT_TYPE,
                                  annotations={naming.ANN_PREDICATE: attest.PREDICATE_TYPE})
    client.put_manifest(repo, "certified.cert", body, manifest.MT_OCI_MANIFEST)

    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == ExitCode.CHECK_FAILED
    [line] = error_lines(err)
    assert "is not the certified one" in line and other.id in line and img.id in line
    assert names_of(docker_client, other.id) == set()
    assert all(moved not in r for r in refs_under(docker_client, pushed.repository))
    assert not any(r.endswith(":certified") for r in refs_under(docker_client, pushed.repository))

    # with a site key configured, the unsigned forgery is refused before anything is pulled
    key = ed25519.Ed25519PrivateKey.generate()
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace,
                             "--verify-key", write_public(key, img.images_dir / "site.pub"))
    assert code == ExitCode.CHECK_FAILED and "not signed" in err


def write_public(key, path):
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def write_private(key, path):
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def test_signed_certificate_is_verified_on_pull(registry, namespace, make_certified, docker_client, capsys,
                                                tmp_path, monkeypatch):
    img = make_certified()
    site = ed25519.Ed25519PrivateKey.generate()
    intruder = ed25519.Ed25519PrivateKey.generate()
    code, out, err = run_cli(capsys, "--images-dir", img.images_dir, "push", "cpu-torch2", "--registry", registry.host,
                             "--namespace", namespace, "--no-fs-hash",
                             "--sign-key", write_private(site, tmp_path / "site.key"))
    assert code == 0, err
    assert f"signed by {attest.key_id(site)}" in out
    pull = ("pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)

    monkeypatch.setenv(attest.ENV_VERIFY_KEY, str(write_public(intruder, tmp_path / "intruder.pub")))
    code, out, err = run_cli(capsys, *pull)
    assert code == ExitCode.CHECK_FAILED
    [line] = error_lines(err)
    assert "signature does not verify" in line and str(tmp_path / "intruder.pub") in line
    assert names_of(docker_client, img.id) == {img.tag}  # nothing pulled or tagged

    monkeypatch.setenv(attest.ENV_VERIFY_KEY, str(write_public(site, tmp_path / "site.pub")))
    code, out, err = run_cli(capsys, *pull)
    assert code == 0, err
    assert f"signature verified ({attest.key_id(site)})" in out


# --------------------------------------------------------------------------- hardware


def test_node_hardware_is_checked_against_the_certificate(registry, namespace, make_certified, docker_client):
    img = make_certified("cuda12-torch2", gpus=[GPU], driver="570.124.06")
    pushing.push(docker_client, "cuda12-torch2", registry.host, images_dir=img.images_dir, namespace=namespace,
                 fs_hash=False)
    docker_client.sdk.images.remove(img.id, force=True)
    floor = img.cert["lock"]["driver"]["min"]

    def pull(host, **kw):
        return pulling.pull(docker_client, "cuda12-torch2", registry.host, namespace=namespace, host_report=host, **kw)

    with pytest.raises(pulling.Refused) as e:
        pull({"driver": "535.104.05", "gpus": [GPU]})
    assert f"driver 535.104.05 is below the image's floor {floor}" in str(e.value)
    with pytest.raises(pulling.Refused) as e:
        pull({"driver": None, "gpus": []})
    assert f"needs an NVIDIA driver >= {floor}" in str(e.value)
    a100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-2"}
    with pytest.raises(pulling.Refused) as e:
        pull({"driver": "575.57.08", "gpus": [a100]})
    assert "GPU NVIDIA A100-SXM4-80GB is not covered by the certificate (NVIDIA H100 80GB HBM3)" in str(e.value)
    assert names_of(docker_client, img.id) == set()  # refused before pulling

    result = pull({"driver": "575.57.08", "gpus": [a100]}, allow_uncertified_hw=True)
    assert result.warnings and result.image_id == img.id
    assert pull({"driver": "575.57.08", "gpus": [GPU]}).warnings == ()


def test_push_and_pull_with_warnings_only_exit_1(registry, namespace, make_certified, docker_client, capsys):
    """A push of an image whose recipe lock changed since it was built, and a pull onto a node
    whose hardware the certificate does not cover with --allow-uncertified-hw: each publishes
    or pulls, prints its warning line and exits 1 (the exit-0 twins: the clean push and pull)."""
    img = make_certified("cuda12-torch2", gpus=[GPU], driver="570.124.06")
    lock = img.images_dir / "cuda12-torch2" / "envbuild.lock.json"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text('{"changed": true}\n')
    code, out, err = run_cli(capsys, "--images-dir", img.images_dir, "push", "cuda12-torch2", "--registry",
                             registry.host, "--namespace", namespace, "--no-fs-hash")
    assert (code, [x for x in err.splitlines() if x.startswith("warning: ")]) == (1, [
        f"warning: {lock} has changed since this image was built (image lock {img.cert['lock_hash']}); "
        "publishing the certified image as it is"]), err
    assert f"pushed {registry.host}/{namespace}/cuda12-torch2@sha256:" in out
    docker_client.sdk.images.remove(img.id, force=True)
    pull = ("pull", "cuda12-torch2", "--registry", registry.host, "--namespace", namespace)
    code, out, err = run_cli(capsys, *pull)  # this CPU node has no driver: refused
    floor = img.cert["lock"]["driver"]["min"]
    assert (code, error_lines(err)) == (2, [f"error: refused: this node is not covered by the certificate: the image "
                                            f"needs an NVIDIA driver >= {floor}; this node has none "
                                            "(--allow-uncertified-hw to pull anyway)"]), err
    code, out, err = run_cli(capsys, *pull, "--allow-uncertified-hw")
    assert code == 1, err
    assert [x for x in err.splitlines() if x.startswith("warning: ")] == [
        f"warning: uncertified hardware: the image needs an NVIDIA driver >= {floor}; this node has none"]
    assert docker_client.sdk.images.get(f"{registry.host}/{namespace}/cuda12-torch2:certified").id == img.id


def test_a_v1_certificate_is_pushed_and_pulled(registry, namespace, make_certified, docker_client, capsys):
    """A certificate of schema /1 (its legacy allreduce and ddp sections; tests/fixtures), made this
    image's: push publishes it as it is, and pull checks and pulls by it (the /2 twin: the clean push
    and pull above)."""
    img = make_certified()
    v1 = json.loads((ROOT / "tests" / "fixtures" / "certificate-allreduce-ddp.json").read_text())
    v1.update({k: img.cert[k] for k in ("image", "recipe", "lock_hash", "lock", "finished_at")})
    img.path.write_text(json.dumps(v1))
    code, out, err = run_cli(capsys, "--images-dir", img.images_dir, "push", "cpu-torch2", "--registry",
                             registry.host, "--namespace", namespace, "--no-fs-hash")
    assert code == 0, err
    s, api, artifact, _ = _attestation(registry, namespace)
    statement = s.get(f"{api}/blobs/{artifact['layers'][0]['digest']}").json()
    assert statement["predicate"]["certificate"]["schema"] == "envbuild.certificate/1"
    docker_client.sdk.images.remove(img.id, force=True)
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert (code, error_lines(err)) == (0, []), err
    assert f"recipe cpu-torch2, lock {img.cert['lock_hash']}, verdict passed at {img.cert['finished_at']}" in out
    assert docker_client.sdk.images.get(f"{registry.host}/{namespace}/cpu-torch2:certified").id == img.id


def test_a_hostile_recipe_in_a_published_certificate_reaches_no_terminal_or_path(registry, namespace, make_certified,
                                                                                 docker_client, capsys):
    """The certificate comes from the registry: a recipe of a newline, a spoofed verdict, a
    clear-screen and a path is shown escaped in one line and never names the SIF file; pulled
    into the engine, the image's recipe label differs from it: refused (the twins:
    test_pull_format_sif_prints_the_apptainer_pull_by_digest, the clean pull)."""
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir,
                          namespace=namespace, fs_hash=False)
    # push refuses such a certificate: whoever can write to the registry publishes it by hand
    client, repo = oci.RegistryClient(registry.host, credentials=docker_login(registry.host)), f"{namespace}/cpu-torch2"
    _body, subject = client.get_manifest(repo, pushed.digest)
    stmt = attest.statement(subject_name=pushed.repository, subject_digest=pushed.digest,
                            certificate={**img.cert, "recipe": "../../cpu-torch2\nverdict: PASSED\x1b[2J"})
    blob, media_type = attest.encode(stmt, None)
    _att, body, _how = referrers.attach(client, repo, subject, blob, media_type, artifact_type=naming.ARTIFACT_TYPE)
    client.put_manifest(repo, "certified.cert", body, manifest.MT_OCI_MANIFEST)
    docker_client.sdk.images.remove(img.id, force=True)
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace,
                             "--format", "sif", "--print-only")
    assert code == 0, err
    assert "\x1b" not in out + err and not [x for x in out.splitlines() if x.startswith("verdict")], out
    assert r"recipe ../../cpu-torch2\x0averdict: PASSED\x1b[2J, lock" in out, out
    name = f"{registry.host}/{namespace}/cpu-torch2"
    assert out.splitlines()[-1].startswith(f"apptainer pull --no-https cpu-torch2_{img.lock12}.sif docker://{name}@")
    # into the engine: the image's recipe label is not the certificate's recipe, refused and removed again
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert (code, error_lines(err)) == (2, [
        f"error: reference: '{name}@{pushed.digest}' refused: the pulled image is not the certified one: label "
        r"envbuild.recipe is 'cpu-torch2', the certificate says '../../cpu-torch2\nverdict: PASSED\x1b[2J'"]), err
    assert names_of(docker_client, img.id) == set()


# --------------------------------------------------------------------------- reachability, credentials


def test_registry_down_is_one_line_exit_3(make_certified, registry, capsys, docker_client):
    down = f"127.0.0.1:{free_port()}"
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", down)
    assert code == ExitCode.UNREACHABLE
    assert err.strip().splitlines() == [f"error: registry {down} unreachable: connection refused (http://{down}/v2/)"]
    img = make_certified()
    code, out, err = run_cli(capsys, "--images-dir", img.images_dir, "push", "cpu-torch2", "--registry", down)
    assert code == ExitCode.UNREACHABLE and len(error_lines(err)) == 1 and f"registry {down} unreachable" in err
    assert not any(r.startswith(down) for r in names_of(docker_client, img.id))


def test_credentials_come_from_the_docker_config_only(registry, namespace, make_certified, capsys, tmp_path,
                                                      monkeypatch):
    img = make_certified()
    push = ("--images-dir", img.images_dir, "push", "cpu-torch2", "--registry", registry.host, "--namespace",
            namespace, "--no-fs-hash")
    wrong = write_docker_config(tmp_path / "wrong", registry.host, registry.username, "not-the-password")
    monkeypatch.setenv("DOCKER_CONFIG", str(wrong))
    code, out, err = run_cli(capsys, *push)
    assert code == ExitCode.UNREACHABLE
    [line] = error_lines(err)
    assert f"refused the credentials of user '{registry.username}' from {wrong / 'config.json'}" in line

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(empty))
    code, out, err = run_cli(capsys, *push)
    assert code == ExitCode.UNREACHABLE
    assert (f"asks for credentials and {empty / 'config.json'} has none for it; "
            f"run `docker login {registry.host}`") in err
    assert list(empty.iterdir()) == []  # nothing written into the Docker config folder

    monkeypatch.setenv("DOCKER_CONFIG", str(registry.docker_config))
    before = (registry.docker_config / "config.json").read_bytes()
    code, out, err = run_cli(capsys, *push)
    assert code == 0, err
    assert (registry.docker_config / "config.json").read_bytes() == before
    # (the docker CLI keeps a .buildNodeID there for BuildKit; no credentials anywhere else)
    others = [p for p in registry.docker_config.rglob("*") if p.is_file() and p.name != "config.json"]
    assert not any(registry.password.encode() in p.read_bytes() for p in others)


# --------------------------------------------------------------------------- a real certification


def test_real_certificate_of_the_torch_image_is_published_and_pulled(registry, namespace, torch_image, docker_client,
                                                                     test_labels, session_labels, tmp_path):
    """The certificate of a real (short) certification run of the session's torch image
    is published with it and verified on pull (the image is in the engine already, so
    the pull checks digest, ID and labels without downloading). A label-only copy is pushed:
    a push gives the image a repo digest, which would change what tests running beside this
    one see of the shared torch image."""
    copy = f"envbuild-test/registry-torch:{uuid.uuid4().hex[:12]}"
    docker_client.sdk.images.build(fileobj=io.BytesIO(f"FROM {torch_image}\n".encode()), tag=copy, rm=True,
                               labels={**session_labels, **test_labels})
    torch_image = copy
    cert, path = certify_image(docker_client, torch_image, images_dir=tmp_path / "images", nodes=2,
                               sizes=[1024], iters=1, warmup=0,
                               timeout_s=300, labels=test_labels)
    assert cert["verdict"]["passed"], cert["verdict"]
    name = f"{registry.host}/{namespace}/cpu-torch2"
    added = []
    try:
        pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=tmp_path / "images",
                          image=torch_image, namespace=namespace, fs_hash=False)
        result = pulling.pull(docker_client, "cpu-torch2", registry.host, namespace=namespace,
                              host_report=no_gpu_host())
        added = [*result.local_tags, result.reference]
        assert result.image_id == docker_client.sdk.images.get(torch_image).id == cert["image"]["id"]
        assert result.certificate == json.loads(path.read_text())
        probe = result.certificate["probe"]["0"]
        assert probe["torch"]["version"] == cert["lock"]["torch"]["local"]
        assert pushed.digest == result.digest
    finally:
        for ref in added + refs_under(docker_client, name):
            try:
                docker_client.sdk.api.remove_image(ref, noprune=True)
            except docker.errors.APIError:
                pass
        docker_client.sdk.api.remove_image(copy, force=True)


def test_registry_client_errors_are_one_line(registry):
    client = oci.RegistryClient(registry.host, credentials=docker_login(registry.host))
    client.ping()
    assert client.scheme == "http"
    assert client.head_manifest("nothing/here", "latest") is None
    with pytest.raises(EnvbuildError) as e:
        client.get_blob("nothing/here", manifest.Descriptor("application/octet-stream", "sha256:" + "0" * 64, 2))
    assert "has no blob" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(Unreachable):
        oci.RegistryClient(f"127.0.0.1:{free_port()}", timeout_s=2).ping()


def test_blob_reads_are_bounded_whatever_the_descriptor_says(registry, namespace):
    """A descriptor comes from a manifest, which is registry input: one that understates a
    blob's size does not make envbuild read past its limit; the honest descriptor reads."""
    client = oci.RegistryClient(registry.host, credentials=docker_login(registry.host))
    repo = f"{namespace}/blobs"
    data = b"x" * (1 << 20)
    desc = client.push_blob(repo, data)
    assert client.get_blob(repo, desc, limit=2 << 20) == data
    lying = manifest.Descriptor(desc.media_type, desc.digest, 10)
    with pytest.raises(EnvbuildError) as e:
        client.get_blob(repo, lying, limit=1000)
    assert str(e.value) == (f"registry {registry.host}: blob {desc.digest} is 1048576 bytes, over the 1000-byte "
                            "limit")
    with pytest.raises(EnvbuildError, match="altered in the registry"):
        client.get_blob(repo, lying)


# --------------------------------------------------------------------------- leftovers in the registry


def _attestation(registry, namespace):
    """(session, api url, certified.cert artifact manifest JSON, its digest)."""
    s = registry.session()
    api = f"http://{registry.host}/v2/{namespace}/cpu-torch2"
    r = s.get(f"{api}/manifests/certified.cert", headers={"Accept": manifest.MT_OCI_MANIFEST})
    return s, api, r.json(), r.headers["Docker-Content-Digest"]


@pytest.mark.parametrize("deleted", ["manifest", "manifest and blob"])
def test_repush_after_a_deleted_attestation_recovers(registry, namespace, make_certified, docker_client, capsys,
                                                     deleted):
    img = make_certified()
    argv = ("--images-dir", img.images_dir, "push", "cpu-torch2", "--registry", registry.host,
            "--namespace", namespace)
    code, out, err = run_cli(capsys, *argv, "--no-fs-hash")
    assert code == 0, err
    s, api, artifact, att = _attestation(registry, namespace)
    assert s.delete(f"{api}/manifests/{att}").status_code == 202
    if deleted == "manifest and blob":
        assert s.delete(f"{api}/blobs/{artifact['layers'][0]['digest']}").status_code == 202
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == ExitCode.CHECK_FAILED, err  # the fault is real: nothing to pull until it is pushed again

    code, out, err = run_cli(capsys, *argv)  # a new statement (with the filesystem hash): another digest
    assert (code, error_lines(err)) == (0, []), err
    _, _, again, att2 = _attestation(registry, namespace)
    assert att2 != att
    index = s.get(f"{api}/manifests/{referrers.fallback_tag(artifact['subject']['digest'])}",
                  headers={"Accept": INDEX}).json()
    assert [m["digest"] for m in index["manifests"]] == [att2]
    assert s.head(f"{api}/blobs/{again['layers'][0]['digest']}").status_code == 200
    docker_client.sdk.images.remove(img.id, force=True)
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == 0, err


def test_repush_keeps_the_other_entries_of_the_referrers_index(registry, namespace, make_certified, docker_client,
                                                               capsys):
    """The twin: an index entry whose manifest still exists (another pusher's) is kept."""
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir,
                          namespace=namespace, fs_hash=False)
    client = oci.RegistryClient(registry.host, credentials=docker_login(registry.host))
    repo = f"{namespace}/cpu-torch2"
    _, subject = client.get_manifest(repo, pushed.digest)
    other, _, _ = referrers.attach(client, repo, subject, b'{"other": 1}', "application/json",
                                   artifact_type="application/example")
    pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir, namespace=namespace,
                 fs_hash=False)
    listed, _ = referrers.referrers(client, repo, pushed.digest)
    assert sorted(d.digest for d in listed) == sorted([pushed.attestation, other.digest])


def test_pull_of_a_corrupted_blob_is_refused_naming_the_digest(registry, namespace, make_certified, docker_client,
                                                                capsys):
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir,
                          namespace=namespace, fs_hash=False)
    docker_client.sdk.images.remove(img.id, force=True)
    client = oci.RegistryClient(registry.host, credentials=docker_login(registry.host))
    body, _ = client.get_manifest(f"{namespace}/cpu-torch2", pushed.digest)
    # the image config: the engine still has the layers (build cache), never the removed image's config
    config = json.loads(body)["config"]["digest"]
    blob = registry.blob_path(config)
    data = blob.read_bytes()
    blob.write_bytes(data[:-8] + bytes(8))
    try:
        code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host,
                                 "--namespace", namespace)
    finally:
        blob.write_bytes(data)
    assert code == ExitCode.CHECK_FAILED, err
    [line] = error_lines(err)
    assert line == (f"error: refused: docker pull {pushed.repository}@{pushed.digest}: blob {config} does not "
                    "match its digest (altered in the registry)"), line
    assert names_of(docker_client, img.id) == set()
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == 0, err  # the twin: the intact layer pulls


def test_another_images_certificate_swapped_in_is_named_as_such(registry, namespace, make_certified,
                                                                docker_client, capsys):
    """`certified.cert` replaced by the certificate of another image of the repository (the
    tag did not move): the refusal says the certificate's subject is another image."""
    img = make_certified()
    pushed = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=img.images_dir,
                          namespace=namespace, fs_hash=False)
    s, api, artifact, att = _attestation(registry, namespace)
    other = make_certified()
    pushed_other = pushing.push(docker_client, "cpu-torch2", registry.host, images_dir=other.images_dir,
                                image=other.id, namespace=namespace, fs_hash=False)
    client = oci.RegistryClient(registry.host, credentials=docker_login(registry.host))
    repo = f"{namespace}/cpu-torch2"
    # put the first image back under `certified`, leaving the other image's certificate pointer
    body, desc = client.get_manifest(repo, pushed.digest)
    client.put_manifest(repo, "certified", body, desc.media_type)
    code, out, err = run_cli(capsys, "pull", "cpu-torch2", "--registry", registry.host, "--namespace", namespace)
    assert code == ExitCode.CHECK_FAILED
    [line] = error_lines(err)
    assert line == (f"error: refused: {pushed.repository}:certified.cert is the certificate of another image "
                    f"({pushed_other.digest}), not of {pushed.digest} that {pushed.repository}:certified "
                    "points to"), line
    assert "moved" not in line
