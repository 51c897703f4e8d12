"""The engine-free tests of tests/integration/test_certify_profiles.py: Certify with the parallelism profiles (issue 10) on the real engine, 2 gloo nodes."""

from __future__ import annotations

import re

import pytest

from builder.certify.settings import parse_sizes

# --------------------------------------------------------------------------- no engine


@pytest.mark.parametrize("text, sizes", [
    ("1K:8K", [1024, 2048, 4096, 8192]), ("8,1K,4M", [8, 1024, 4194304]), ("64M", [67108864]),
    ("4M,8,8", [8, 4194304]), ("8:8", [8]), ("1k:2k", [1024, 2048]), ("1T", [1099511627776]),
    ("512G:1T", [549755813888, 1099511627776])])
def test_sizes_parsed(text, sizes):
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize("text, message", [
    ("6", "size 6 is not a multiple of 4 bytes"), ("1K:8", "MIN is above MAX"), ("", "MIN:MAX or a comma list"),
    ("2T", "outside 1 B..1T"), ("8\n", "is not a number of bytes"), (",".join(str(4 * i) for i in range(1, 66)), "more than 64 sizes"),
    ("2G,", "is not a number of bytes"),
    ("4096G", "outside 1 B..1T")])
def test_sizes_refused(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_sizes(text)

