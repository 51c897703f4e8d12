"""builder/oci/reference.py: the one image-reference grammar (distribution/reference, narrowed).

Every refusal has a passing twin; the cases where the grammars envbuild had before disagreed
(an upper-case first component, a leading-hyphen host label, IPv6 registries, ports over
65535, Unicode tags, digests other than sha256, names over 255 characters) are pinned here."""

from __future__ import annotations

import pytest

from builder.core.errors import ExitCode
from builder.oci import reference
from builder.oci.reference import ImageRef

D = "sha256:" + "0" * 64


@pytest.mark.parametrize("text, parts", [
    ("debian", (None, "debian", None, None)),
    ("debian:bookworm-slim", (None, "debian", "bookworm-slim", None)),
    (f"debian:bookworm-slim@{D}", (None, "debian", "bookworm-slim", D)),
    ("nvidia/cuda:12.8.1-base-ubuntu24.04", (None, "nvidia/cuda", "12.8.1-base-ubuntu24.04", None)),
    ("localhost/x", ("localhost", "x", None, None)),
    ("localhost:5000/a/b:v1", ("localhost:5000", "a/b", "v1", None)),
    (f"127.0.0.1:5000/envbuild/x@{D}", ("127.0.0.1:5000", "envbuild/x", None, D)),
    ("[::1]:5000/team/x:1", ("[::1]:5000", "team/x", "1", None)),
    ("Registry.Example.org/a__b/c-d.e", ("Registry.Example.org", "a__b/c-d.e", None, None)),
    ("a.b", (None, "a.b", None, None)),
    ("h:1/a.b/c", ("h:1", "a.b/c", None, None)),
])
def test_references_parse_into_their_parts(text, parts):
    ref = reference.parse(text)
    assert (ref.host, ref.path, ref.tag, ref.digest) == parts
    assert str(ref) == text and reference.REFERENCE.fullmatch(text)


@pytest.mark.parametrize("text, reason", [
    ("UPPER/x", "name"),  # not a registry (no '.', ':' or localhost), so a lower-case path component
    ("h:5000/Team/x", "name"),
    ("a_b.c/d", "host"),  # a '.' makes it a registry, and '_' is not in a host name
    ("-a.example/x", "host"),
    ("h:99999/x", "host"),
    ("h:0/x", "host"),
    ("[zz::1]:5000/x", "host"),
    ("x:t\u00e4g", "tag"),  # ASCII tags only
    ("x:" + "t" * 129, "tag"),
    ("x@sha512:" + "0" * 128, "digest"),
    ("x@sha256:" + "A" * 64, "digest"),
    ("x@sha256:abc", "digest"),
    ("x\n", "name"),
    ("x:1\n", "tag"),
    (f"x@{D}\n", "digest"),
    ("", "name"),
    ("a//b", "name"),
    ("h:1/" + "a" * 252, "long"),
    ("a" * 1001, "size"),
    (None, "size"),
])
def test_references_are_refused_whole_with_the_reason(text, reason):
    with pytest.raises(reference.ReferenceError) as e:
        reference.parse(text, field="image")
    assert (e.value.reason, e.value.exit_code, e.value.field) == (reason, ExitCode.USAGE, "image")
    assert "\n" not in str(e.value)
    assert not reference.is_valid(text) and reference.try_parse(text) is None


def test_refusal_twins_parse():
    for text in ("upper/x", "h:5000/team/x", "a-b.c/d", "a.example/x", "h:65535/x", "h:1/x", "[fe80::1]:5000/x",
                 "x:tag", "x:" + "t" * 128, f"x@{D}", "x:1", "a/b", "h:1/" + "a" * 251):
        assert reference.is_valid(text), text


def test_messages():
    def message(text, **kw):
        with pytest.raises(reference.ReferenceError) as e:
            reference.parse(text, **kw)
        return str(e.value)

    assert message("x y") == "reference: 'x y' is not an image reference ([host[:port]/]path[:tag][@sha256:digest])"
    assert message("x y", field="base", syntax="name") == "base: 'x y' is not an image reference (name)"
    assert message("h;id:1/x") == "reference: 'h;id:1/x' registry is not HOST[:PORT] (a port in 1..65535)"
    assert message("x:a b") == "reference: 'x:a b' tag is not a valid tag"
    assert message("x@sha256:1") == "reference: 'x@sha256:1' digest is not sha256:<64 hex>"


@pytest.mark.parametrize("text, domain, registry, repository, familiar", [
    ("debian:12", "docker.io", "registry-1.docker.io", "library/debian", "debian"),
    ("docker.io/library/debian:12", "docker.io", "registry-1.docker.io", "library/debian", "debian"),
    ("index.docker.io/debian", "docker.io", "registry-1.docker.io", "library/debian", "debian"),
    ("team/x", "docker.io", "registry-1.docker.io", "team/x", "team/x"),
    ("reg.example:5000/debian", "reg.example:5000", "reg.example:5000", "debian", "reg.example:5000/debian"),
])
def test_docker_hub_normalisation(text, domain, registry, repository, familiar):
    ref = reference.parse(text)
    assert (ref.domain, ref.registry, ref.repository, ref.familiar) == (domain, registry, repository, familiar)


def test_same_repository_and_replacements():
    a = reference.parse("debian:bookworm")
    assert a.same_repository(reference.parse(f"docker.io/library/debian@{D}"))
    assert not a.same_repository(reference.parse("reg.example/debian"))
    assert str(reference.parse(f"debian:bookworm@{D}").with_tag(None)) == f"debian@{D}"
    assert str(ImageRef(host=None, path="x").with_host("h:1")) == "h:1/x"


def test_hosts():
    for good in ("h", "h:1", "reg.example:5000", "127.0.0.1", "[::1]", "[::1]:5000"):
        assert reference.is_host(good), good
    for bad in ("h:0", "h:65536", "h;x", "-h", "[::g]", "h:1\n", "", "a" * 64):
        assert not reference.is_host(bad), bad
    assert reference.split_host("[::1]:5000") == ("::1", 5000)
    assert reference.split_host("reg.example") == ("reg.example", None)


def test_pattern_agrees_with_parse():
    """PATTERN (also for JSON Schemas) accepts what parse accepts; parse only adds the checks
    a pattern cannot make (port range, IPv6 address, name length)."""
    texts = ["debian", "UPPER/x", "a_b.c/d", "h:1/x:y@" + D, "x\n", "[::1]:1/x", "a.b", "h:99999/x"]
    for text in texts:
        if reference.is_valid(text):
            assert reference.REFERENCE.fullmatch(text), text
    assert reference.REFERENCE.fullmatch("h:99999/x") and not reference.is_valid("h:99999/x")
    assert reference.PATTERN.startswith("\\A") and reference.PATTERN.endswith("\\Z") and "(?P<" not in reference.PATTERN


def test_image_ids():
    assert reference.IMAGE_ID.fullmatch("0123456789ab") and reference.IMAGE_ID.fullmatch("sha256:" + "a" * 64)
    assert not reference.IMAGE_ID.fullmatch("0123456789ab\n") and not reference.IMAGE_ID.fullmatch("0123456789a")
