"""The files audit follows from the build context (bounds: symlink, outside the context, size, --context) and the
shell logic it decides or cannot tell, each fault with its passing twin; literal lines of `envbuild audit`."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from builder.audit.flow import test as sh_test
from builder.cli import app

BASE = "FROM nvidia/cuda:12.4.1-base-ubuntu22.04\nRUN apt-get update && apt-get install -y python3-pip\n"
PIN = "torch==2.5.1+cu124\n--index-url https://download.pytorch.org/whl/cu124\n"
NOTE = ("cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility "
        "(no PTX JIT) [NV-RN, NV-MVC (V)]")


def _audit(*argv: str) -> tuple[int, list[str]]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = app.main(["audit", *argv])
    return code, err.getvalue().splitlines()


def _project(tmp_path: Path, copy: str, req: str | None = PIN) -> Path:
    (tmp_path / "Dockerfile").write_text(f"{BASE}COPY {copy} /opt/req.txt\nRUN pip install -r /opt/req.txt\n")
    if req is not None:
        (tmp_path / "req.txt").write_text(req)
    return tmp_path / "Dockerfile"


def test_a_copied_requirements_file_is_read_with_its_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _project(tmp_path, "req.txt")
    assert _audit("Dockerfile") == (0, [f"note: Dockerfile: line 4: 'torch==2.5.1+cu124' (req.txt: line 1): {NOTE}"])


def test_a_symlinked_requirements_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _project(tmp_path, "link.txt")
    os.symlink("req.txt", tmp_path / "link.txt")
    code, lines = _audit("Dockerfile")
    assert code == 1
    assert lines[-1] == ("warning: Dockerfile: line 4: '/opt/req.txt': link.txt from the build context is not read (a "
                         "symbolic link (audit follows none)); its packages are not audited [audit]")


def test_a_file_outside_the_context_is_refused(tmp_path, monkeypatch):
    (tmp_path / "ctx").mkdir()
    (tmp_path / "req.txt").write_text(PIN)
    monkeypatch.chdir(tmp_path / "ctx")
    _project(tmp_path / "ctx", "../req.txt", None)
    code, lines = _audit("Dockerfile")
    assert code == 1
    assert lines[-1] == ("warning: Dockerfile: line 4: '/opt/req.txt': ../req.txt from the build context is not read "
                         "(outside the build context); its packages are not audited [audit]")


def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _project(tmp_path, "req.txt", PIN + "#" * (256 * 1024))
    code, lines = _audit("Dockerfile")
    assert code == 1
    assert lines[-1] == ("warning: Dockerfile: line 4: '/opt/req.txt': req.txt from the build context is not read (is "
                         "262214 bytes, over the 262144-byte limit of a file the build installs from); its packages "
                         "are not audited [audit]")


def test_context_names_the_folder_copy_reads_from(tmp_path, monkeypatch):
    (tmp_path / "docker").mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "req.txt").write_text(PIN)
    (tmp_path / "docker" / "Dockerfile").write_text(f"{BASE}COPY req.txt /opt/req.txt\nRUN pip install -r /opt/req.txt\n")
    assert _audit("docker/Dockerfile", "--context", ".") == (
        0, [f"note: docker/Dockerfile: line 4: 'torch==2.5.1+cu124' (req.txt: line 1): {NOTE}"])
    code, lines = _audit("docker/Dockerfile")  # its own folder has no req.txt: the COPY would fail
    assert (code, lines[-1]) == (1, "warning: docker/Dockerfile: line 4: '/opt/req.txt': req.txt from the build "
                                 "context is not read (no such file the build installs from); its packages are not "
                                 "audited [audit]")
    code, lines = _audit("docker/Dockerfile", "--context", "missing")
    assert (code, lines) == (3, ["error: missing: is not a folder: --context names the build context"])


@pytest.mark.parametrize("args, want", [
    (["5", "-gt", "0"], True), (["0", "-gt", "0"], False), (["-n", ""], False), (["-z", ""], True),
    (["a", "=", "a"], True), (["a", "!=", "a"], False), (["!", "x"], False), ([None, "-gt", "0"], None),
    (["x", "-gt", "0"], None), (["-f", "/etc/passwd"], None)])
def test_the_test_builtin_is_decided_over_known_words_only(args, want):
    assert sh_test(args) is want


ISSUE = "FROM python:3.11-slim\nARG V\nRUN [ ${#V} -gt 0 ] && P='torch=='$V'.*' || P='torch'; pip install \"$P\"\n"


def test_an_optional_pin_is_evaluated_with_the_build_arg_and_cannot_tell_without(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Dockerfile").write_text(ISSUE)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        app.main(["audit", "--json", "--build-arg", "V=2.6.0", "Dockerfile"])
    assert '"requirement":"torch==2.6.0.*"' in out.getvalue().replace(" ", "")
    code, lines = _audit("Dockerfile")
    assert code == 1
    assert ("warning: Dockerfile: line 3: '\"$P\"': a pip install argument cannot be expanded: $P is set at line 3 "
            "depending on the outcome of [ ${#V} -gt 0 ] (line 3): audit cannot tell whether it is; audited without "
            "it [audit]") in lines
