"""The (command, exit code) pairs that need the engine (the others: tests/unit/test_exit_codes.py,
whose COVERAGE table names every pair's test): a warning line printed by build or certify
makes a run that failed nothing exit 1 (named with --base, the base warns of nothing: 0); a missing image is
3 ("could not check") with one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builder.launchers import base

ROOT = Path(__file__).resolve().parents[2]
MISSING = "envbuild-test/no-such-image:0"
BOOTSTRAP = "envbuild/bootstrap-debian:bookworm"


def envbuild(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def warnings_of(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.lstrip().startswith("warning:")]


def test_build_0_and_1_with_the_bootstrapped_base_warning(tmp_path, torch_image):
    """The session's torch image stands on the bootstrapped base: reusing it in base mode
    auto warns (exit 1); named as the base with --base, nothing warns (exit 0)."""
    (tmp_path / "cpu-torch2").mkdir()
    for name in ("Dockerfile", "Singularity.def", "envbuild.lock.json"):
        shutil.copy(ROOT / "images/cpu-torch2" / name, tmp_path / "cpu-torch2" / name)
    quiet = envbuild("--images-dir", str(tmp_path), "build", "cpu-torch2", "--base", BOOTSTRAP)
    assert (quiet.returncode, warnings_of(quiet)) == (0, []), quiet.stderr
    warned = envbuild("--images-dir", str(tmp_path), "build", "cpu-torch2")
    assert warned.returncode == 1, warned.stderr
    assert f"reused {torch_image}" in warned.stdout
    (line,) = warnings_of(warned)
    assert line.startswith("warning: debian:bookworm-slim is not available locally: "), line


@pytest.mark.parametrize("argv", [
    ["certify", MISSING],
    ["verify", "--image", MISSING],
    ["verify", "--against", MISSING, "tests/fixtures/certificate-profiles.json"],
    ["doctor", "--image", MISSING],
    ["k8s", "render", MISSING, "--out", "{tmp}/m"],
    ["push", "cpu-torch2", "--registry", "127.0.0.1:1", "--image", MISSING],
], ids=lambda a: " ".join(a[:2]))
def test_a_missing_image_is_3(argv, tmp_path, docker_client):
    proc = envbuild("--images-dir", str(tmp_path), *(a.format(tmp=tmp_path) for a in argv))
    assert (proc.returncode, proc.stderr) == (3, f"error: image: {MISSING!r} no such image\n"), proc.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_certify_of_an_image_without_numpy_is_1(tmp_path, docker_client, torch_image, test_labels, test_session_id):
    """A passing verdict with one warning (numpy missing: what needs it is unsupported) exits 1."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(textwrap.dedent(f"""\
        FROM {torch_image}
        USER root
        RUN d=$(python3 -c "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))") \\
            && rm -rf "$d"/numpy "$d"/numpy-*.dist-info "$d"/numpy.libs
        """))
    tag = f"envbuild-test/exit-nonumpy:{test_session_id}"
    docker_client.build(ctx, tag, labels=test_labels)
    labels = ",".join(f"{k}={v}" for k, v in test_labels.items())
    proc = envbuild("--images-dir", str(tmp_path / "images"), "certify", tag, "--sizes", "8", "--iters", "1",
                    "--warmup", "0", "--timeout", "240", env={base.EXTRA_LABELS_ENV: labels})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdict: PASSED" in proc.stdout
    (line,) = warnings_of(proc)
    assert line.startswith("  warning: numpy is not installed in the image on rank(s) 0,1: "), line


def test_base_bootstrap_of_the_kept_base_is_0(bootstrap_image):
    """The session's bootstrapped base is there: `base bootstrap` names it and exits 0 (its 3:
    no engine, tests/unit/test_exit_codes.py)."""
    proc = envbuild("base", "bootstrap")
    assert (proc.returncode, " ".join(proc.stdout.split())) == (
        0, f"base image {bootstrap_image} (stands in for debian:bookworm-slim)"), proc.stderr


def test_make_with_its_base_named_is_0(tmp_path, torch_image, test_labels):
    """The bootstrapped base named with --base stands in for nothing: make (render, the build a
    cache hit, certify) warns of nothing and exits 0 (its 1 twin, the base standing in:
    test_cli_e2e.py::test_make_cpu_torch2_end_to_end)."""
    labels = ",".join(f"{k}={v}" for k, v in test_labels.items())
    proc = envbuild("--images-dir", str(tmp_path), "make", "cpu-torch2", "--base", BOOTSTRAP, "--sizes", "8",
                    "--iters", "1", "--warmup", "0", env={base.EXTRA_LABELS_ENV: labels})
    assert (proc.returncode, warnings_of(proc)) == (0, []), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"reused {torch_image}" in proc.stdout and "verdict: PASSED" in proc.stdout
