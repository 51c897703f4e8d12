"""The engine-free half of ``envbuild rebuild --compare`` (builder/image/fshash.py, builder/image/rebuild.py): the
volatile paths each exclusion rule leaves out, the per-file differences (path, size, sha256) and the document."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile

import msgspec
import pytest

from builder.cli.documents import rebuild_document
from builder.core.errors import Unreachable
from builder.image import fshash
from builder.image.rebuild import Comparison


def tree(*entries: tuple[str, bytes | str]) -> io.BytesIO:
    """An uncompressed tar as ``docker export`` writes it: ``(name, bytes)`` a file, ``(name, "-> target")`` a link."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = 0o644, 1
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data[3:]
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


@pytest.mark.parametrize(("path", "pattern"), [
    ("opt/venv/lib/python3.11/site-packages/torch/__pycache__/version.cpython-311.pyc", "*.pyc"),
    ("usr/lib/python3.11/__pycache__", "*/__pycache__/"),
    ("etc/ld.so.cache", "etc/ld.so.cache"),
    ("var/cache/ldconfig/aux-cache", "var/cache/ldconfig/"),
    ("var/cache/apt/pkgcache.bin", "var/cache/apt/"),
    ("var/lib/apt/lists/lock", "var/lib/apt/lists/"),
    ("var/log/apt/term.log", "var/log/"),
    ("./var/lib/dpkg/status-old", "var/lib/dpkg/*-old"),
    ("root/.cache/pip/x", "root/.cache/"),
    ("etc/resolv.conf", "etc/resolv.conf"),
])
def test_each_volatile_path_is_excluded_by_its_rule(path, pattern):
    assert fshash.is_excluded(path) == pattern


@pytest.mark.parametrize("path", ["var/lib/dpkg/status", "opt/venv/pyvenv.cfg", "usr/lib/python3.11/os.py",
                                  "var/logs", "etc/ld.so.conf", "opt/venv/lib/x.pyc.txt", "var/cache"])
def test_installed_files_are_not_excluded(path):
    assert fshash.is_excluded(path) is None


def test_excluded_entries_are_counted_per_rule_and_not_hashed():
    a = fshash.hash_tar(tree(("etc/x", b"1"), ("var/log/a", b"a"), ("var/log/b", b"b"), ("m.pyc", b"p")))
    b = fshash.hash_tar(tree(("etc/x", b"1"), ("var/log/a", b"other"), ("m.pyc", b"q")))
    assert a.sha256 == b.sha256 and a.entries == 1
    assert a.excluded_by == {"var/log/": 2, "*.pyc": 1} and a.excluded == 3
    assert fshash.differences(a, b) == []


def test_differences_name_each_file_with_its_size_and_hash():
    a = fshash.hash_tar(tree(("etc/same", b"s"), ("etc/changed", b"one\n"), ("etc/gone", b"g"), ("etc/l", "-> a")))
    b = fshash.hash_tar(tree(("etc/same", b"s"), ("etc/changed", b"changed\n"), ("etc/new", b""), ("etc/l", "-> b")))
    one, changed = hashlib.sha256(b"one\n").hexdigest(), hashlib.sha256(b"changed\n").hexdigest()
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert changed == "7f8b1dfc466b6249f06cbe55c9174df2578e7754da793fded244ef5cba2a38f1"
    assert fshash.differences(a, b) == [
        fshash.Difference("etc/changed", f"file 0644 0:0 sha256:{one}", f"file 0644 0:0 sha256:{changed}",
                          (4, f"sha256:{one}"), (8, f"sha256:{changed}")),
        fshash.Difference("etc/gone", "file 0644 0:0 sha256:" + hashlib.sha256(b"g").hexdigest(), None,
                          (1, "sha256:" + hashlib.sha256(b"g").hexdigest()), None),
        fshash.Difference("etc/l", "symlink 0644 0:0 -> a", "symlink 0644 0:0 -> b", None, None),
        fshash.Difference("etc/new", None, f"file 0644 0:0 sha256:{empty}", None, (0, f"sha256:{empty}"))]
    assert [str(d) for d in fshash.differences(a, b, limit=2)] == [
        f"etc/changed: file 0644 0:0 sha256:{one} != file 0644 0:0 sha256:{changed}",
        "etc/gone: only in a"]

    c = Comparison(image="sha256:a", rebuilt="sha256:b", trees=(a, b), differing=4,
                   differences=fshash.differences(a, b, 1), layers=3, layers_equal=1)
    doc = msgspec.to_builtins(rebuild_document("cpu-torch2", "sha256:b", None, c, "current"))
    assert doc["comparison"]["equal"] is False and doc["comparison"]["differing"] == 4
    assert list(doc["comparison"]["differences"]) == [{"path": "etc/changed", "image": {
        "entry": f"file 0644 0:0 sha256:{one}", "size": 4, "sha256": f"sha256:{one}"}, "rebuilt": {
        "entry": f"file 0644 0:0 sha256:{changed}", "size": 8, "sha256": f"sha256:{changed}"}}]
    assert doc["comparison"]["rebuilt_tree"] == {"sha256": b.sha256, "entries": 4, "excluded": {}}
    assert doc["comparison"]["exclusions"][0] == "*.pyc" and doc["schema"] == "envbuild.rebuild/1"


def test_a_tree_beyond_the_entry_bound_is_refused(monkeypatch):
    monkeypatch.setattr(fshash, "MAX_ENTRIES", 2)
    assert fshash.hash_tar(tree(("a", b"1"), ("b", b"2"))).entries == 2
    with pytest.raises(Unreachable, match="more than 2 entries") as e:
        fshash.hash_tar(tree(("a", b"1"), ("b", b"2"), ("c", b"3")))
    assert e.value.exit_code == 3


@pytest.mark.parametrize("flag", [["--keep"], ["--against", "x:1"], ["--rebuilt", "x:1"]])
def test_compare_options_without_compare_are_a_usage_error(flag):
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "rebuild", "cpu-torch2", *flag], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 64
    assert proc.stderr.strip() == "envbuild rebuild: --against, --keep and --rebuilt go with --compare"
