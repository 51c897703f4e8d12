"""The engine-free tests of tests/integration/test_cli_e2e.py: The command line as a user meets it: `envbuild make cpu-torch2` end to end on the real
engine, and bad input giving one clear line, exit 2, and no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.errors import EnvbuildError

ROOT = Path(__file__).resolve().parents[2]


def envbuild(*args, cwd=ROOT, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.mark.parametrize("text, expected", [
    ("base: {image: debian:bookworm-slim}\nos: {id: debian, version: '12'}\npython: '3.11'\ntorch: {version: 2.13.0, varient: cpu}\n",
     "bad.yaml: torch.varient: unknown key; did you mean 'variant'?"),
    ("base: {image: debian:bookworm-slim}\nos: {id: debian, version: '12'}\npython: '3.11'\ntorch: {version: '2.8;rm -rf /'}\n",
     "bad.yaml: torch.version: '2.8;rm -rf /' is not a version"),
    ("base: {image: 'nvidia/cuda:12.6.3-base-ubuntu24.04'}\nos: {id: ubuntu, version: '24.04'}\npython: '3.12'\ncuda: {version: '12.6'}\ntorch: {version: 2.5.1}\n",
     "bad.yaml: torch.version, cuda.version: torch 2.5.1 has no cu126 build; builds exist for cu118, cu121, cu124 [S2 (V)]"),
    ("base: [\n", "bad.yaml: malformed YAML: line 2, column 1: expected the node content, but found '<stream end>'"),
])
@pytest.mark.parametrize("command", ["check", "make"])
def test_bad_input_one_line_exit_2(tmp_path, command, text, expected):
    (tmp_path / "bad.yaml").write_text(text)
    res = envbuild(command, "bad.yaml", cwd=tmp_path)
    assert res.returncode == 2
    assert expected in res.stderr.replace("\n", " ").replace("  ", " ") or expected in res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "bad.yaml"]  # nothing half-written


def test_missing_recipe_file(tmp_path):
    res = envbuild("--recipes-dir", str(tmp_path), "check", "nope", cwd=tmp_path)
    assert res.returncode == 3  # unreadable input (issue 8)
    assert res.stderr.strip() == f"error: {tmp_path}/nope.yaml: no such recipe"


def test_good_recipe_check_passes():
    res = envbuild("check", "cpu-torch2")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "recipes/cpu-torch2.yaml: ok: torch 2.13.0+cpu, python 3.11, cuda none, nccl none"


def test_a_bundled_nccl_is_said_so_not_none(tmp_path):
    from helpers import CUDA, merge, write_recipe

    data = merge(CUDA, {"base": {"image": "nvidia/cuda:11.8.0-base-ubuntu22.04"}, "os": {"version": "22.04"},
                        "python": "3.10", "cuda": {"version": "11.8"}, "torch": {"version": "2.0.1", "variant": "cu118"},
                        "nccl": ...})
    res = envbuild("check", str(write_recipe(tmp_path, data)), cwd=tmp_path)
    assert res.stdout.strip().endswith(": ok: torch 2.0.1+cu118, python 3.10, cuda 11.8, nccl bundled in the wheel")
    res = envbuild("check", str(write_recipe(tmp_path, merge(data, {"torch": {"variant": "cu117"},
                                                                     "cuda": {"version": "11.7"}}), "u")), cwd=tmp_path)
    assert res.stdout.strip().endswith(": ok: torch 2.0.1+cu117, python 3.10, cuda 11.7, nccl 2.14.3"), res.stderr


def test_usage_error_exits_64():
    res = envbuild("frobnicate")
    assert res.returncode == 64 and "invalid choice: 'frobnicate'" in res.stderr


def test_render_cuda_recipe_into_fresh_dir(tmp_path):
    res = envbuild("--images-dir", str(tmp_path), "render", "cuda12-torch2")
    assert res.returncode == 0, res.stderr
    for name in ("Dockerfile", "Singularity.def", "envbuild.lock.json"):
        assert (tmp_path / "cuda12-torch2" / name).read_bytes() == (ROOT / "images/cuda12-torch2" / name).read_bytes()


@pytest.mark.parametrize("args, expected", [
    (["certify", "bad ref;rm"], "envbuild certify: argument image: 'bad ref;rm' is not an image reference (lower-case name[:tag][@sha256:digest]) or image ID"),
    (["certify", "UPPER/x"], "envbuild certify: argument image: 'UPPER/x' is not an image reference (lower-case name[:tag][@sha256:digest]) or image ID"),
    (["certify", "envbuild/x:1", "--nodes", "100000"], "envbuild certify: argument --nodes: '100000' is not an integer in 1..1024"),
    (["certify", "envbuild/x:1", "--timeout", "100000000000000"], "envbuild certify: argument --timeout: '100000000000000' is not an integer in 1..604800"),
    (["certify", "envbuild/x:1", "--port", "99999"], "envbuild certify: argument --port: '99999' is not an integer in 1..65535"),
    (["build", "cpu-torch2", "--base", "evil;rm -rf /"], "envbuild build: argument --base: 'evil;rm -rf /' is not an image reference (lower-case name[:tag][@sha256:digest]) or image ID"),
    (["base", "bootstrap", "--suite", "evil;rm"], "envbuild base bootstrap: argument --suite: 'evil;rm' is not a Debian suite name such as bookworm"),
    (["push", "cpu-torch2", "--registry", "bad host;x"], "envbuild push: argument --registry: 'bad host;x' is not a registry HOST[:PORT]"),
    (["doctor", "--port", "0"], "envbuild doctor: argument --port: '0' is not an integer in 1..65535"),
    (["doctor", "--straggler-ratio", "-1"], "envbuild doctor: argument --straggler-ratio: '-1' is not a number in (1..100]"),
    (["doctor", "--stale-after", "-5", "--fix"], "envbuild doctor: argument --stale-after: '-5' is not a number in [0..31536000]"),
    (["doctor", "--min-shm", "lots"], "envbuild doctor: argument --min-shm: 'lots' is not a size such as 256m or 1g"),
    (["verify", "--timeout", "0", "x.json"], "envbuild verify: argument --timeout: '0' is not a number in (0..86400]"),
    (["render", "--all", "cpu-torch2"], "envbuild render: give either a RECIPE or --all"),
    (["verify", "--hosts", "127.0.0.1:99999"], "envbuild verify: argument --hosts: '127.0.0.1:99999' has a bad port (1..65535)"),
])
def test_bad_arguments_are_usage_errors(args, expected):
    res = envbuild(*args)
    assert (res.returncode, res.stderr.strip()) == (64, expected)


def test_unwritable_images_dir_is_one_line_exit_3(tmp_path):
    (tmp_path / "file").write_text("x")
    res = envbuild("--images-dir", str(tmp_path / "file"), "render", "cpu-torch2")
    assert res.returncode == 3
    assert res.stderr.strip() == (f"error: {tmp_path}/file: is a file, not a folder: envbuild writes only regular "
                                  "files, never through a symlink (remove it or give another path)")


def test_render_all_with_no_recipes(tmp_path):
    res = envbuild("--recipes-dir", str(tmp_path), "render", "--all")
    assert (res.returncode, res.stderr.strip()) == (2, f"error: {tmp_path}: no recipes (*.yaml) here")


NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/envbuild-e2e.sock"}


@pytest.mark.parametrize("args, expected", [
    (["certify", "envbuild/x:1", "--launcher", "slurm", "--pending-timeout", "-5"],
     "envbuild certify: argument --pending-timeout: '-5' is not a number in (0..604800]"),
    (["certify", "envbuild/x:1", "--launcher", "slurm", "--slurm-nodes", "0"],
     "envbuild certify: argument --slurm-nodes: '0' is not an integer in 1..1024"),
    (["certify", "envbuild/x:1", "--launcher", "slurm", "--time-limit", "x\n"],
     r"envbuild certify: argument --time-limit: 'x\n' is not a Slurm time limit (M, M:S, H:M:S, D-H, D-H:M or "
     "D-H:M:S)"),
    (["make", "cpu-torch2", "--partition", "debug"], "envbuild make: --partition go(es) with --launcher slurm"),
    (["certify", "envbuild/x:1", "--launcher", "k8s", "--bisect"],
     "envbuild certify: --bisect runs on the local launcher only (docs/bisect.md)"),
    (["certify", "envbuild/x:1", "--port", "29500\n"], r"envbuild certify: argument --port: '29500\n' is not an "
     "integer in 1..65535"),
    (["certify", "envbuild/x:1", "--min-busbw", "nan"], "envbuild certify: argument --min-busbw: 'nan' is not a "
     "number in (0..1000000]"),
    (["build", "cpu-torch2", "--base", "debian:bookworm-slim\n"], r"envbuild build: argument --base: "
     r"'debian:bookworm-slim\n' is not an image reference (lower-case name[:tag][@sha256:digest]) or image ID"),
    (["build", "cpu-torch2", "--ca-cert", "ca.pem\n"], r"envbuild build: argument --ca-cert: 'ca.pem\n' is not a "
     "file (1-4096 characters without control characters)"),
    (["lock", "cpu-torch2\n"], r"envbuild lock: argument recipe: 'cpu-torch2\n' is not a recipe name or path "
     "(1-4096 characters without control characters)"),
    (["push", "cpu-torch2", "--registry", "localhost:99999"], "envbuild push: argument --registry: "
     "'localhost:99999' is not a registry HOST[:PORT]"),
    (["push", "cpu-torch2", "--registry", "localhost:5000", "--namespace", "team\n"],
     r"envbuild push: argument --namespace: 'team\n' is not a repository path"),
    (["push", "Cpu", "--registry", "localhost:5000"], "envbuild push: argument recipe: 'Cpu' is not a recipe name "
     "(lower-case letters, digits, ._-)"),
    (["pull", "cpu-torch2", "--registry", "localhost:5000", "--namespace", "a b"],
     "envbuild pull: argument --namespace: 'a b' is not a repository path"),
    (["pull", "cpu-torch2", "--registry", "localhost:5000", "--output", "x.sif"],
     "envbuild pull: --output go(es) with --format sif"),
    (["pull", "cpu-torch2", "--registry", "localhost:5000", "--format", "sif", "--output=-x.sif"],
     "envbuild pull: argument --output: '-x.sif' is not a file name (1-4096 characters without control "
     "characters, not starting with -)"),
    (["pull", "cpu-torch2"], "error: reference: 'cpu-torch2' a recipe name needs --registry HOST[:PORT]"),
    (["pull", "h:5000/team/x:1\n"], r"envbuild pull: argument RECIPE|REF: 'h:5000/team/x:1\n' is not a recipe name "
     "or image reference"),
    (["pull", "h:5000/Team/x"], "error: reference: 'h:5000/Team/x' is not an image reference "
     "(host/repository[:tag][@sha256:digest])"),
    (["pull", "h;id:5000/team/x"], "error: reference: 'h;id:5000/team/x' registry is not HOST[:PORT] (a port in "
     "1..65535)"),
    (["k8s", "render", "cpu-torch2", "--out", "k8s", "--ttl", "-1"],
     "envbuild k8s render: argument --ttl: '-1' is not an integer in 0..2147483647"),
    (["k8s", "render", "cpu-torch2", "--out", "k8s", "--namespace", "Team"],
     "envbuild k8s render: argument --namespace: 'Team' is not a Kubernetes namespace (RFC 1123 label)"),
    (["k8s", "render", "envbuild/x@sha256:" + "a" * 64, "--out", "k8s", "--run-id", "ab\n"],
     r"envbuild k8s render: argument --run-id: 'ab\n' is not a run id"),
    (["base", "bootstrap", "--suite", "bookworm\n"], r"envbuild base bootstrap: argument --suite: 'bookworm\n' is "
     "not a Debian suite name such as bookworm"),
    (["doctor", "--min-shm", "256m\n"], r"envbuild doctor: argument --min-shm: '256m\n' is not a size such as 256m "
     "or 1g"),
])
def test_usage_errors_are_64_before_anything_is_contacted(args, expected, tmp_path):
    """No engine answers (DOCKER_HOST: a missing socket) and the registry does not exist: a
    malformed value or a combination that does not go together is still a usage error (64),
    found before anything is contacted (on the old code several were 3: the engine first)."""
    res = envbuild(*args, cwd=tmp_path, env=NO_ENGINE)
    assert (res.returncode, res.stderr.strip()) == (64, expected)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("args, make, expected", [
    (["push", "cpu-torch2", "--registry", "localhost:5000", "--sign-key", "missing.key"], None,
     "error: missing.key: no such signing key (--sign-key)"),
    (["pull", "cpu-torch2", "--registry", "localhost:5000", "--verify-key", "fifo.pub"], "fifo",
     "error: fifo.pub: is not a regular file (a FIFO); give a public key (--verify-key)"),
    (["pull", "cpu-torch2", "--registry", "localhost:5000", "--registry-ca", "/dev/zero"], None,
     "error: /dev/zero: is not a regular file (a character device); give a CA bundle (--registry-ca)"),
    (["build", "cpu-torch2", "--ca-cert", "missing.pem"], None, "error: missing.pem: no such CA bundle (--ca-cert)"),
    (["lock", "cpu-torch2", "--ca-cert", "adir"], "dir", "error: adir: is a directory, not a CA bundle (--ca-cert)"),
    (["build", "cpu-torch2", "--wheels", "missing"], None, "error: missing: no such folder (--wheels)"),
])
def test_unreadable_input_files_are_3_before_anything_is_contacted(args, make, expected, tmp_path):
    """An input file that cannot be read is "could not check" (3) for every file option alike
    (the old code: a missing --sign-key 64, a missing --ca-cert 2, a FIFO hung), named in one
    line, without blocking; a file that reads but is no key stays a usage error (64)."""
    if make == "fifo":
        os.mkfifo(tmp_path / args[-1])
    elif make == "dir":
        (tmp_path / args[-1]).mkdir()
    res = envbuild(*args, cwd=tmp_path, env=NO_ENGINE, timeout=60)
    assert (res.returncode, res.stderr.strip()) == (3, expected)


def _main_with(monkeypatch, capsys, fault):
    """builder.cli.app.main running ``probe`` whose command raises ``fault()``; (code, stderr)."""
    from builder.cli import app as cli
    from builder.cli.commands import nodes

    def boom(args):
        raise fault()

    monkeypatch.setattr(nodes, "cmd_probe", boom)
    code = cli.main(["probe"])
    return code, capsys.readouterr().err


RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def test_unexpected_exception_is_escaped_and_exit_70(monkeypatch, capsys):
    """A bug (an exception no stage expected): the traceback for the report, every line
    escaped (no raw ESC/bidi/newline from the message), then one error line; exit 70, never 1
    (1 means "done with warnings only")."""
    code, err = _main_with(monkeypatch, capsys, lambda: RuntimeError("boom\x1b[2J\u202eevil\nsecond line"))
    lines = err.splitlines()
    assert code == 70 and not RAW.search(err), err
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == (r"error: internal error (a bug in envbuild; please report it with the lines above): "
                         r"RuntimeError: boom\x1b[2J\u202eevil second line")


def test_expected_error_is_one_escaped_line_twin(monkeypatch, capsys):
    code, err = _main_with(monkeypatch, capsys, lambda: EnvbuildError("is not a version", field="torch.version",
                                                                       value="2.8\x1b[2J"))
    assert (code, err) == (2, "error: torch.version: '2.8\\x1b[2J' is not a version\n")


def test_os_error_names_the_file_escaped(monkeypatch, capsys):
    code, err = _main_with(monkeypatch, capsys, lambda: PermissionError(13, "Permission denied", "/tmp/a\x1b[2Jb\nc"))
    assert (code, err) == (3, "error: /tmp/a\\x1b[2Jb\\x0ac: Permission denied\n")


def test_sigterm_is_130_with_one_line(monkeypatch, capsys):
    import signal
    import time

    def term():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return RuntimeError("not reached")

    code, err = _main_with(monkeypatch, capsys, term)
    assert (code, err) == (130, "interrupted (SIGTERM); everything envbuild started was removed\n")

