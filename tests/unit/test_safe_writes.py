"""Every file envbuild writes is a regular file in a real folder: a target that is a device
node, a FIFO or a symlink, or a folder on the way that is a symlink, is refused (exit 3, one
line naming it) and left as it was; a regular file is replaced, a new one created."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from builder.certify.certificate import CertificateNotWritten, certificate_path, write_certificate
from builder.cli import app
from builder.core.certificate import load_certificate
from builder.core.errors import EnvbuildError
from builder.launchers.slurm.script import write_run_dir

from factories import gpu_report

ROOT = Path(__file__).resolve().parents[2]
CERT = ROOT / "tests" / "fixtures" / "certificate-profiles.json"
IMAGE = "reg.example/x@sha256:" + "a" * 64
TAIL = "envbuild writes only regular files, never through a symlink (remove it or give another path)"
PRECIOUS = b"precious\n"
#: doctor on two node report files (no engine), which then writes its metrics or events.
DOCTOR = ("n1.json", "n2.json", "--checks", "interface,shm")


def _cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """The envbuild command line in this process, run in ``tmp_path``."""
    err, out, cwd = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = app.main(list(args))
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def _plant(kind: str, target: Path) -> Path:
    """Put a hostile ``kind`` at ``target``; returns the path the refusal must name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "device":
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # the numbers of /dev/full
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (target.parent / "elsewhere").write_bytes(PRECIOUS)
        os.symlink("elsewhere", target)
    else:  # a symlinked folder: the target's folder points to another one
        real = target.parent.with_name(target.parent.name + "-real")
        target.parent.rmdir()
        real.mkdir()
        os.symlink(real.name, target.parent)
        return target.parent
    return target


def _untouched(kind: str, target: Path) -> None:
    mode = os.lstat(target if kind != "parent" else target.parent).st_mode
    if kind == "device":
        assert stat.S_ISCHR(mode) and os.stat(target).st_rdev == os.makedev(1, 7)
    elif kind == "fifo":
        assert stat.S_ISFIFO(mode)
    elif kind == "symlink":
        assert stat.S_ISLNK(mode) and (target.parent / "elsewhere").read_bytes() == PRECIOUS
    else:
        assert stat.S_ISLNK(mode)
        assert list(target.parent.with_name(target.parent.name + "-real").iterdir()) == []


def _refusal(kind: str, named: Path) -> str:
    what = {"device": "a character device", "fifo": "a FIFO", "symlink": "a symlink", "parent": "a symlink"}[kind]
    wanted = "a folder" if kind == "parent" else "a regular file"
    return f"{named}: is {what}, not {wanted}: {TAIL}"


def _render(tmp_path: Path) -> None:
    code, _o, err = _cli(tmp_path, "--recipes-dir", str(ROOT / "recipes"), "--images-dir", "images",
                         "render", "cpu-torch2")
    assert code == 0, err


# Each writer: (the file it writes, relative to tmp_path; what runs it; a setup before).
WRITERS = {
    "report": ("out/r.html", ("report", str(CERT), "--out", "out/r.html")),
    "render": ("images/cpu-torch2/Dockerfile",
               ("--recipes-dir", str(ROOT / "recipes"), "--images-dir", "images", "render", "cpu-torch2")),
    "render-lock": ("images/cpu-torch2/envbuild.lock.json",
                    ("--recipes-dir", str(ROOT / "recipes"), "--images-dir", "images", "render", "cpu-torch2")),
    "to-recipe": ("out/r.yaml", ("audit", str(ROOT / "tests/audit/ranged.ok.Dockerfile"), "--to-recipe", "out/r.yaml")),
    "k8s-render": ("k8s/job.yaml", ("--images-dir", "images", "k8s", "render", "cpu-torch2", "--image", IMAGE,
                                    "--out", "k8s")),
    "k8s-gate": ("k8s/gate-daemonset.yaml", ("k8s", "gate", str(CERT), "--image", IMAGE, "--out", "k8s")),
    "lock": ("images/cpu-torch2/envbuild.resolved.json",
             ("--recipes-dir", str(ROOT / "recipes"), "--images-dir", "images", "lock", "cpu-torch2", "--no-base",
              "--no-pip", "--no-apt")),
    "metrics": ("out/m.prom", ("doctor", *DOCTOR, "--metrics-file", "out/m.prom")),
    "log-json": ("out/l.jsonl", ("doctor", *DOCTOR, "--log-json", "out/l.jsonl")),
}


def _setup(tmp_path: Path, writer: str) -> None:
    """What a writer reads first: the rendered files (k8s render), two node reports (doctor)."""
    if writer == "k8s-render":
        _render(tmp_path)
    for n in (1, 2):
        (tmp_path / f"n{n}.json").write_text(json.dumps(gpu_report(n)))


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "parent"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_refuses_a_target_that_is_not_a_regular_file(tmp_path, writer, kind):
    rel, args = WRITERS[writer]
    _setup(tmp_path, writer)
    named = _plant(kind, tmp_path / rel)
    code, out, err = _cli(tmp_path, *args)
    assert (code, err.splitlines()[-1]) == (3, "error: " + _refusal(kind, named.relative_to(tmp_path))), (out, err)
    _untouched(kind, tmp_path / rel)


@pytest.mark.parametrize("exists", [True, False])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_replaces_a_regular_file_or_creates_a_new_one_twin(tmp_path, writer, exists):
    rel, args = WRITERS[writer]
    _setup(tmp_path, writer)
    target = tmp_path / rel
    target.parent.mkdir(parents=True, exist_ok=True)  # report and --to-recipe make no folder
    if exists:
        target.write_bytes(PRECIOUS)
    code, _out, err = _cli(tmp_path, *args)
    assert code == 0, err
    assert stat.S_ISREG(os.lstat(target).st_mode) and target.read_bytes() not in (PRECIOUS, b"")
    assert [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("args", [("report", str(CERT), "--out", "-"),
                                  ("k8s", "gate", str(CERT), "--image", IMAGE, "--out", "-")])
def test_out_dash_is_standard_output(tmp_path, args):
    res = subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    code, out, err = res.returncode, res.stdout, res.stderr
    assert code == 0, err
    assert out.startswith("<!DOCTYPE html>" if args[0] == "report" else "---\n")
    assert list(tmp_path.iterdir()) == [] and not [line for line in out.splitlines() if line.startswith("wrote ")]


def _cert():
    return load_certificate(json.loads(CERT.read_text()), file=str(CERT))


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "parent"])
def test_the_certificate_refuses_a_name_that_is_not_a_regular_file(tmp_path, kind):
    cert = _cert()
    target = certificate_path(tmp_path, cert)
    named = _plant(kind, target)
    with pytest.raises(CertificateNotWritten) as e:
        write_certificate(cert, tmp_path)
    assert e.value.exit_code == 3
    assert str(e.value) == _refusal(kind, named).replace(": is ", ": cannot write the certificate: is ", 1)
    _untouched(kind, target)


def test_the_certificate_takes_the_next_name_beside_a_regular_file_twin(tmp_path):
    cert = _cert()
    target = certificate_path(tmp_path, cert)
    assert write_certificate(cert, tmp_path) == target
    assert write_certificate(cert, tmp_path) == target.with_name(f"{target.stem}-2.json")
    assert json.loads(target.read_text()) == json.loads(target.with_name(f"{target.stem}-2.json").read_text())
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, f"{target.stem}-2.json"])


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "parent"])
def test_the_slurm_run_folder_refuses_a_planted_name_or_a_symlinked_folder(tmp_path, kind):
    slurm_dir = tmp_path / "slurm"
    run = slurm_dir / "slurm-r1"
    _plant(kind, run)
    with pytest.raises(EnvbuildError) as e:
        write_run_dir(run, "#!/bin/sh\n")
    assert e.value.exit_code == 3
    if kind == "parent":
        assert str(e.value) == _refusal(kind, slurm_dir)
    else:
        assert str(e.value) == f"slurm_dir: {str(run)!r} exists already; every run needs its own folder"
    _untouched(kind, run)


def test_the_slurm_run_folder_is_written_twin(tmp_path):
    path = write_run_dir(tmp_path / "slurm" / "slurm-r1", "#!/bin/sh\n")
    assert path.read_text() == "#!/bin/sh\n" and stat.S_IMODE(path.stat().st_mode) == 0o755
    assert (path.parent / "code" / "bench" / "__main__.py").is_file()


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "parent", "twin"])
def test_the_bisection_beside_the_certificate_refuses_what_is_no_regular_file(tmp_path, kind):
    from builder.certify.bisect import Bisection, write_bisection

    doc = Bisection(run_id="r1", nodes=[0, 1], reason="network", bad=[], unresolved=[0, 1], rounds=1, trials=[])
    cert = tmp_path / "certificates" / "c.json"
    target = cert.with_name("c.bisect.json")
    if kind == "twin":  # a regular file there is replaced
        target.parent.mkdir(parents=True)
        target.write_bytes(PRECIOUS)
        assert write_bisection(doc, cert) == target and json.loads(target.read_text())["run_id"] == "r1"
        return
    named = _plant(kind, target)
    with pytest.raises(EnvbuildError) as e:
        write_bisection(doc, cert)
    assert (e.value.exit_code, str(e.value)) == (3, _refusal(kind, named))
    _untouched(kind, target)
