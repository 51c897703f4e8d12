"""Compatibility rules (builder/recipe/rules/): one failing case per rule with its literal
message, and a passing twin that differs only in the offending value."""

import json

import pytest
from test_compat_units import LOCK, ROOT, forged  # noqa: F401

from builder.core.errors import EnvbuildError
from builder.recipe import lock as lockdoc


def _image_with_lock_label(client, labels, lock_doc, name):
    import io

    text = json.dumps(lock_doc, sort_keys=True, separators=(",", ":"))
    image, _ = client.sdk.images.build(fileobj=io.BytesIO(b"FROM scratch\n"), tag=f"envbuild-test/{name}:forged", rm=True,
                                   labels={**labels, "envbuild.lock": text, "envbuild.lock-hash": lockdoc.lock_hash(lock_doc)})
    return f"envbuild-test/{name}:forged"


def test_certify_reads_image_labels_through_the_lock_schema(docker_client, test_labels):
    """A forged lock label whose hash label matches (so the hash check cannot catch it)."""
    from builder.certify.source import read_image

    bad = _image_with_lock_label(docker_client, test_labels, forged(("certify", "nodes"), "abc"), "bad-lock")
    with pytest.raises(EnvbuildError) as info:
        read_image(docker_client, bad)
    assert (str(info.value), info.value.exit_code) == (
        f"{bad}: label envbuild.lock: certify.nodes: 'abc' must be an integer in 1..1024", 2)
    good = _image_with_lock_label(docker_client, test_labels, LOCK, "good-lock")
    labels, lock = read_image(docker_client, good)
    assert lock.to_dict() == LOCK and labels["envbuild.lock-hash"] == lockdoc.lock_hash(LOCK)
