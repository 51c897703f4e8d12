"""``verify``/``doctor`` read reports from a directory, a list file (``@list.txt``) or stdin
(``-``), bounded in count, size and depth, hostile names shown escaped."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from builder.core.errors import Unreachable
from builder.nodes.sources import files

from fixtures_nodes import gpu_report, run_json, write_reports  # noqa: F401


def test_a_directory_gives_its_json_files_sorted_links_not_followed(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "c").mkdir()
    for name in ("z.json", "a.json", "b/m.json", "b/c/k.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    os.symlink(tmp_path / "a.json", tmp_path / "link.json")
    os.symlink(tmp_path / "b", tmp_path / "loop")
    assert files.report_paths([str(tmp_path)]) == [
        str(tmp_path / p) for p in ("a.json", "b/c/k.json", "b/m.json", "z.json")]


def test_a_list_file_and_stdin_name_one_path_a_line(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"a.json\r\n\n  \nsub/b c.json\n")
    assert files.report_paths([f"@{listing}", "x.json"]) == ["a.json", "sub/b c.json", "x.json"]
    assert files.report_paths(["-"], stdin=io.BytesIO(b"/r/1.json\n/r/2.json")) == ["/r/1.json", "/r/2.json"]


def test_too_deep_too_many_or_too_large_is_exit_3(tmp_path, monkeypatch):
    deep = tmp_path
    for i in range(files.MAX_DIR_DEPTH + 1):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    with pytest.raises(Unreachable, match=f"is nested deeper than {files.MAX_DIR_DEPTH} directories"):
        files.report_paths([str(tmp_path)])
    monkeypatch.setattr(files, "MAX_REPORT_FILES", 2)
    with pytest.raises(Unreachable, match="more than 2 report files") as e:
        files.report_paths(["-"], stdin=io.BytesIO(b"1\n2\n3\n"))
    assert e.value.exit_code == 3
    assert files.report_paths(["-"], stdin=io.BytesIO(b"1\n2\n")) == ["1", "2"]  # the twin: at the bound
    monkeypatch.setattr(files, "MAX_LIST_BYTES", 8)
    with pytest.raises(Unreachable, match="is over the 8-byte limit of a report list"):
        files.report_paths(["-"], stdin=io.BytesIO(b"123456789"))
    with pytest.raises(Unreachable, match="line 2 is not a path"):
        files.report_paths(["-"], stdin=io.BytesIO(b"a\nb\0c\n"))
    with pytest.raises(Unreachable, match="no such report list"):
        files.report_paths([f"@{tmp_path}/missing.txt"])
    (tmp_path / "empty").mkdir()  # named as a file: "is a directory, not a node report"
    assert files.report_paths([str(tmp_path / "empty")]) == [str(tmp_path / "empty")]


def test_verify_reads_a_directory_a_list_and_stdin(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    paths = write_reports(folder, {f"n{i}.json": gpu_report(i) for i in (1, 2, 3)})
    code, doc = run_json("verify", str(folder))
    assert (code, [n["name"] for n in doc["nodes"]]) == (0, ["node-1", "node-2", "node-3"])
    (tmp_path / "list.txt").write_text("\n".join(paths[:2]) + "\n")
    code, doc = run_json("verify", f"@{tmp_path / 'list.txt'}", paths[2])
    assert (code, [n["name"] for n in doc["nodes"]]) == (0, ["node-1", "node-2", "node-3"])
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "verify", "-", "--json"], input="\n".join(paths),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_hostile_name_in_a_list_is_shown_escaped_on_one_line(tmp_path):
    (tmp_path / "list.txt").write_bytes(b"\x1b[2Jevil\x07.json\n")
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "verify", f"@{tmp_path / 'list.txt'}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr
    assert "\\x1b[2Jevil\\x07.json" in proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "verify", f"@{tmp_path / 'none.txt'}"],
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stderr.strip()) == (3, f"error: {tmp_path}/none.txt: no such report list")


def test_doctor_reads_a_directory_and_a_list_on_stdin(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    paths = write_reports(folder, {f"n{i}.json": gpu_report(i) for i in (1, 2)})
    for args, stdin in (([str(folder)], None), (["-"], "\n".join(paths) + "\n")):
        proc = subprocess.run([sys.executable, "-m", "builder.cli", "doctor", *args, "--checks", "nodes"],
                              input=stdin, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "2 nodes answered with valid reports" in proc.stdout, proc.stdout


def test_equal_sections_of_many_reports_are_kept_once(tmp_path):
    other = gpu_report(3)
    other["nccl"]["loaded"]["version"] = "2.26.2"
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": gpu_report(2), "n3.json": other})
    a, b, c = (n.report for n in files.from_files(paths))
    assert a.nccl is b.nccl and a.os is b.os is c.os  # one object for equal values
    assert c.nccl is not a.nccl and c.nccl.loaded.version == "2.26.2"  # a differing one stays its own
    assert (a.hostname, b.hostname, c.hostname) == ("node-1", "node-2", "node-3")
