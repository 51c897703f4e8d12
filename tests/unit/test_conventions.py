"""The conventions a user expects of the command line, on real CLI runs: --version, the site
settings (envbuild.toml, ENVBUILD_*, envbuild config; flag > env > file), render --check's diff,
report of a file that is not a certificate, and plain progress lines."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def envbuild(*args, cwd, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, "XDG_CONFIG_HOME": str(cwd / "xdg"), **(env or {})}, timeout=120)


def test_version_and_its_misspelling(tmp_path):
    res = envbuild("--version", cwd=tmp_path)
    assert (res.returncode, res.stdout) == (0, "envbuild 0.1.0\n")
    bad = envbuild("--Version", cwd=tmp_path)
    assert bad.returncode == 64 and "Traceback" not in bad.stderr


def test_config_sources_and_precedence(tmp_path):
    (tmp_path / "envbuild.toml").write_text('images_dir = "from-file"\nregistry = "reg.example:5000"\n')
    shown = envbuild("config", cwd=tmp_path, env={"ENVBUILD_IMAGES_DIR": "from-env"}).stdout.splitlines()
    assert "images_dir = 'from-env'  (ENVBUILD_IMAGES_DIR; flag --images-dir)" in shown
    assert "registry = 'reg.example:5000'  (envbuild.toml; flag --registry)" in shown
    assert "launcher: unset (--launcher)" in shown
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", tmp_path / "r.yaml")
    for env, flag, where in (({}, [], "from-file"), ({"ENVBUILD_IMAGES_DIR": "from-env"}, [], "from-env"),
                             ({"ENVBUILD_IMAGES_DIR": "from-env"}, ["--images-dir", "from-flag"], "from-flag")):
        res = envbuild(*flag, "render", "r.yaml", cwd=tmp_path, env=env)
        assert res.returncode == 0, res.stderr
        assert (tmp_path / where / "r" / "Dockerfile").is_file()


def test_config_file_errors_name_the_file(tmp_path):
    (tmp_path / "xdg" / "envbuild").mkdir(parents=True)
    (tmp_path / "xdg" / "envbuild" / "config.toml").write_text("certify_nodes = '4'\n")
    res = envbuild("config", cwd=tmp_path)
    assert res.returncode == 64
    assert res.stderr.startswith(f"error: {tmp_path}/xdg/envbuild/config.toml: certify_nodes: unknown key")
    (tmp_path / "envbuild.toml").write_text('images_dir = "a\\u001bb"\n')  # the working folder's file wins
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", tmp_path / "r.yaml")
    res = envbuild("check", "r.yaml", cwd=tmp_path)
    assert res.returncode == 64
    assert res.stderr == ("envbuild: argument --images-dir: 'a\\x1bb' is not a folder (1-4096 characters without "
                          "control characters) (a site setting of envbuild.toml; envbuild config)\n")
    assert envbuild("--images-dir", "ok", "check", "r.yaml", cwd=tmp_path).returncode in (0, 1)  # a flag wins


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_config_file_that_is_no_regular_file_is_refused_not_skipped(tmp_path, kind):
    (tmp_path / "xdg" / "envbuild").mkdir(parents=True)
    (tmp_path / "xdg" / "envbuild" / "config.toml").write_text('images_dir = "from-xdg"\n')
    os.mkfifo(tmp_path / "envbuild.toml") if kind == "fifo" else (tmp_path / "envbuild.toml").mkdir()
    res = envbuild("config", cwd=tmp_path)
    what = "is not a regular file (a FIFO); give a config file" if kind == "fifo" else "is a directory, not a config file"
    assert (res.returncode, res.stdout, res.stderr) == (3, "", f"error: envbuild.toml: {what}\n")
    os.rmdir(tmp_path / "envbuild.toml") if kind == "folder" else os.unlink(tmp_path / "envbuild.toml")
    res = envbuild("config", cwd=tmp_path)  # the twin: the next file applies
    assert res.returncode == 0 and f"images_dir = 'from-xdg'  ({tmp_path}/xdg/envbuild/config.toml; flag " \
        "--images-dir)" in res.stdout.splitlines(), res.stdout


def test_render_check_prints_the_diff(tmp_path):
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", tmp_path / "r.yaml")
    assert envbuild("render", "r.yaml", cwd=tmp_path).returncode == 0
    fresh = envbuild("render", "--check", "r.yaml", cwd=tmp_path)
    assert (fresh.returncode, fresh.stdout) == (0, "images/r: up to date\n")
    with open(tmp_path / "images" / "r" / "Dockerfile", "a") as f:
        f.write("RUN echo \x1b[31mlocal edit\n")
    stale = envbuild("render", "--check", "r.yaml", cwd=tmp_path)
    assert stale.returncode == 2
    lines = stale.stdout.splitlines()
    assert lines[:2] == ["--- images/r/Dockerfile", "+++ images/r/Dockerfile (rendered)"]
    assert "-RUN echo \\x1b[31mlocal edit" in lines
    assert "images/r/Dockerfile: stale; run `envbuild render r`" in stale.stderr


def test_report_refuses_a_non_certificate_in_one_line(tmp_path):
    (tmp_path / "node.json").write_text('{"schema": "envbuild.probe/1", "host": {}}')
    res = envbuild("report", "node.json", cwd=tmp_path)
    assert (res.returncode, res.stderr) == (
        2, "error: node.json: not a certificate (schema 'envbuild.probe/1'; want envbuild.certificate/2)\n")
    shutil.copy(ROOT / "tests" / "fixtures" / "certificate-allreduce-ddp.json", tmp_path / "c.json")
    ok = envbuild("report", "c.json", "--out", "c.html", cwd=tmp_path)
    assert ok.returncode == 0 and (tmp_path / "c.html").read_text().startswith("<!DOCTYPE html>")


class _Pipe:
    """A rich console on a pipe, as certify's stderr without a terminal."""

    def __new__(cls, every_line: bool = False):
        from rich.console import Console

        c = Console(file=io.StringIO(), force_terminal=False, width=300)
        c.every_line = every_line
        return c


def test_plain_progress_one_line_per_change():
    from builder.certify.run import plain_lines

    console = _Pipe()
    say = plain_lines(console)
    for msg in ("run r: 2/2 node(s) running, 0/2 rank result(s), 1 s of 60 s",
                "run r: 2/2 node(s) running, 0/2 rank result(s), 2 s of 60 s",
                "run r: 2/2 node(s) running, phase start, 0/2 rank result(s), 3 s of 60 s",
                "run r: 2/2 node(s) running, phase start, 1/2 rank result(s), 4 s of 60 s"):
        say(msg)
    lines = console.file.getvalue().splitlines()
    assert [re.sub(r"^\d\d:\d\d:\d\d \+\d+\.\d s ", "", x) for x in lines] == [
        "run r: 2/2 node(s) running, 0/2 rank result(s), 1 s of 60 s",
        "run r: 2/2 node(s) running, phase start, 0/2 rank result(s), 3 s of 60 s",
        "run r: 2/2 node(s) running, phase start, 1/2 rank result(s), 4 s of 60 s"]
    verbose = _Pipe(every_line=True)
    say = plain_lines(verbose)
    say("a, 1 s of 60 s")
    say("a, 2 s of 60 s")
    assert len(verbose.file.getvalue().splitlines()) == 2
