"""envbuild audit FILE --to-recipe OUT.yaml: the recipe of the same stack, with a comment
for everything not carried over. It checks (`envbuild check OUT.yaml` exits 0) and
renders; the rendered files audit clean again with the same torch. Nothing is written for
a file with errors, a stack a recipe cannot hold, or a recipe that would fail its check.
(A recipe from --to-recipe built with the real engine: done by hand, see docs/audit.md.)"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from builder.cli import app

ROOT = Path(__file__).resolve().parents[2]

#: Files without errors whose recipe checks clean, and the torch and base of that recipe.
ROUND_TRIP = [
    ("tests/audit/cu-mismatch.ok.Dockerfile", "torch 2.5.1+cu124", "nvidia/cuda:12.4.1-base-ubuntu22.04"),
    ("tests/audit/ranged.ok.Dockerfile", "torch 2.13.0+cpu", "debian:bookworm-slim"),
    ("tests/audit/runtime-flavour.Dockerfile", "torch 2.8.0+cu128", "nvidia/cuda:12.8.1-base-ubuntu24.04"),
    ("tests/audit/multistage.ok.Dockerfile", "torch 2.4.1+cu124", "nvidia/cuda:12.4.1-base-ubuntu22.04"),
    ("tests/audit/conda.ok.Dockerfile", "torch 2.1.0+cu118", "nvidia/cuda:11.8.0-base-ubuntu22.04"),
    ("tests/audit/arguments.ok.def", "torch 2.1.2+cu121", "nvidia/cuda:12.1.1-base-ubuntu22.04"),
    ("tests/audit/debootstrap.ok.def", "torch 2.6.0+cpu", "ubuntu:jammy"),
    ("images/cuda12-torch2/Dockerfile", "torch 2.8.0+cu128", "nvidia/cuda:12.8.1-base-ubuntu24.04"),
    ("images/cpu-torch2/Singularity.def", "torch 2.13.0+cpu", "debian:bookworm-slim"),
]


def _run(*argv: str) -> tuple[int, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = app.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("file, torch, base", ROUND_TRIP, ids=[r[0] for r in ROUND_TRIP])
def test_to_recipe_checks_renders_and_audits_clean_again(tmp_path, monkeypatch, file, torch, base):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "converted.yaml"
    code, _out, err = _run("audit", file, "--to-recipe", str(out))
    assert code in (0, 1), err
    assert err.splitlines()[-1] == f"wrote {out}: check it with `envbuild check {out}`"
    code, stdout, err = _run("check", str(out))
    assert code == 0, err
    assert stdout.startswith(f"{out}: ok: {torch},")
    images = tmp_path / "images"
    assert _run("--images-dir", str(images), "render", str(out))[0] == 0
    for rendered in ("Dockerfile", "Singularity.def"):
        code, stdout, err = _run("audit", str(images / "converted" / rendered))
        assert code == 0, err
        assert f": ok: {torch} (pip) on {base} (" in stdout


def test_the_recipe_names_what_it_did_not_carry_over(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "from-multistage.yaml"
    assert _run("audit", "tests/audit/multistage.ok.Dockerfile", "--to-recipe", str(out))[0] == 0
    assert out.read_text() == """\
# Recipe from-multistage: written by `envbuild audit tests/audit/multistage.ok.Dockerfile --to-recipe`.
# Not carried over (by line of the audited file):
#   line 3: nvidia/cuda:12.4.1-devel-ubuntu22.04: the base of a build stage: envbuild builds every stage on the recipe's base
#   line 4: python3: installed by envbuild itself
#   line 4: python3-venv: installed by envbuild itself
#   line 7: https://download.pytorch.org/whl/cu124: the recipe reads torch from the variant's PyTorch index (derived)
#   line 13: COPY --from=builder /opt/venv /opt/venv: not carried over
#   line 14: PATH: its value cannot be expanded: not carried over
description: from multistage.ok.Dockerfile by envbuild audit
base:
  image: nvidia/cuda:12.4.1-base-ubuntu22.04
os:
  id: ubuntu
  version: '22.04'
python: '3.10'
cuda:
  version: '12.4'
torch:
  version: 2.4.1
  variant: cu124
"""


def test_packages_env_and_flavour_are_carried_the_envbuild_way(tmp_path):
    src = tmp_path / "Dockerfile"
    src.write_text("\n".join([
        "FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04",
        "ENV NCCL_DEBUG=INFO OMP_NUM_THREADS=4 GREETING=\"hello world\" LD_LIBRARY_PATH=/usr/local/lib",
        "RUN apt-get update && apt-get install -y python3 python3-venv git curl=8.5.0-2ubuntu10.6 \\",
        " && python3 -m venv /opt/venv && /opt/venv/bin/pip install -U pip \\",
        " && /opt/venv/bin/pip install torch==2.8.0+cu128 torchvision==0.23.0+cu128 nvidia-nccl-cu12==2.27.3 \\",
        "      'numpy<2' --index-url https://download.pytorch.org/whl/cu128 \\",
        " && /opt/venv/bin/pip install -e /src && git clone https://example.invalid/x.git /x",
        'CMD ["python3"]',
    ]) + "\n")
    out = tmp_path / "carried.yaml"
    code, _o, err = _run("audit", str(src), "--to-recipe", str(out))
    assert code == 1, err  # the warning: the cudnn-devel flavour ships a second NCCL
    text = out.read_text()
    head, body = text.split("description:", 1)
    assert head.splitlines()[2:] == [
        "#   line 1: nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04: the cudnn-devel flavour is not carried over: the recipe "
        "uses the base flavour (runtime and devel ship a system libnccl2, a second NCCL; envbuild installs what the image needs)",
        "#   line 2: GREETING=hello world: not carried over: must match [A-Za-z0-9_.,:/@%+=^-]{0,1024} (no spaces or quotes)",
        "#   line 2: LD_LIBRARY_PATH=/usr/local/lib: not carried over: is set by envbuild or the runtime; it cannot be overridden",
        "#   line 3: python3: installed by envbuild itself",
        "#   line 3: python3-venv: installed by envbuild itself",
        "#   line 4: pip: envbuild's venv brings it",
        "#   line 5: nvidia-nccl-cu12==2.27.3: the NCCL torch pins is resolved by envbuild from the facts",
        "#   line 6: https://download.pytorch.org/whl/cu128: the recipe reads torch from the variant's PyTorch index (derived)",
        "#   line 7: /src: not a requirement a recipe holds",
        "#   line 7: git clone https://example.invalid/x.git /x: a command: not carried over",
        "#   line 8: CMD [\"python3\"]: not carried over",
    ]
    assert "description:" + body == """\
description: from Dockerfile by envbuild audit
base:
  image: nvidia/cuda:12.8.1-base-ubuntu24.04
os:
  id: ubuntu
  version: '24.04'
python: '3.12'
cuda:
  version: '12.8'
torch:
  version: 2.8.0
  variant: cu128
packages:
  apt:
  - git
  - curl=8.5.0-2ubuntu10.6
  pip:
  - torchvision==0.23.0
  - numpy<2
env:
  NCCL_DEBUG: INFO
  OMP_NUM_THREADS: '4'
"""
    assert _run("check", str(out))[0] == 0


@pytest.mark.parametrize("file, code, line", [
    ("tests/audit/cu-mismatch.Dockerfile", 2, "error: OUT: not written: tests/audit/cu-mismatch.Dockerfile has errors (fix them first)"),
    ("tests/audit/conflict.Dockerfile", 3, "error: OUT: not written: tests/audit/conflict.Dockerfile has errors (fix them first)"),
    ("tests/audit/localimage.ok.def", 2, "error: OUT: cannot write a recipe: tests/audit/localimage.ok.def does not say the OS "
     "of the base image"),
    ("tests/audit/ngc.ok.Dockerfile", 2, "error: OUT: cannot write a recipe: tests/audit/ngc.ok.Dockerfile does not say "
     "a torch release and the torch build (its variant)"),
    ("tests/audit/old-release.ok.Dockerfile", 2, "error: OUT: cannot write a recipe: recipes start at torch 2.0.0 and "
     "tests/audit/old-release.ok.Dockerfile installs torch 1.6.0 (audit judges it)"),
    ("tests/audit/glibc.ok.Dockerfile", 2, "error: OUT: cannot write a recipe: tests/audit/glibc.ok.Dockerfile runs "
     "Python 3.10 (from conda) and a recipe on ubuntu 20.04 gets its system Python 3.8"),
])
def test_nothing_is_written_when_the_recipe_cannot_be_right(tmp_path, monkeypatch, file, code, line):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "kept.yaml"
    out.write_text("# the user's own recipe\n")
    got, _o, err = _run("audit", file, "--to-recipe", str(out))
    assert (got, err.splitlines()[-1]) == (code, line.replace("OUT", str(out)))
    assert out.read_text() == "# the user's own recipe\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.yaml"]


def test_an_unwritable_place_is_3_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "no" / "such" / "dir.yaml"
    code, _o, err = _run("audit", "tests/audit/ranged.ok.Dockerfile", "--to-recipe", str(out))
    assert code == 3
    assert err.splitlines()[-1] == f"error: {tmp_path / 'no'}: no such folder"
    assert list(tmp_path.iterdir()) == []


def _stack(file: str) -> tuple:
    """What the round trip keeps: OS, Python, CUDA (X.Y), torch release and build, NCCL."""
    st = json.loads(_run("audit", "--json", file)[1])["files"][0]["stack"]
    t = st["torch"] or {}
    return st["os"], st["python"], ".".join((st["cuda"] or "").split(".")[:2]), t.get("version"), t.get("variant"), \
        st["nccl"]


def test_every_audit_file_that_gives_a_recipe_round_trips_to_the_same_stack(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    done = []
    for file in sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/audit").iterdir() if p.is_file()):
        out = tmp_path / f"rt{len(done)}.yaml"
        _run("audit", file, "--to-recipe", str(out))
        if not out.exists():
            continue
        assert _run("check", str(out))[0] == 0, file
        assert _run("--images-dir", str(tmp_path / "images"), "render", str(out))[0] == 0, file
        rendered = [_stack(str(tmp_path / "images" / out.stem / name)) for name in ("Dockerfile", "Singularity.def")]
        assert rendered == [_stack(file)] * 2, file
        done.append(file)
    assert len(done) == 41  # every clean or warned file with torch >= 2.0 on an OS a recipe holds


def test_no_recipe_for_a_python_the_recipe_os_does_not_have(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "py.yaml"
    code, _out, err = _run("audit", "tests/audit/python-image.ok.Dockerfile", "--to-recipe", str(out))
    assert (code, err.splitlines()[-1]) == (2, f"error: {out}: cannot write a recipe: tests/audit/python-image.ok."
                                            "Dockerfile runs Python 3.12 (from the base image) and a recipe on debian "
                                            "12 gets its system Python 3.11")
    assert not out.exists()
    assert _run("audit", "tests/audit/python-os.ok.Dockerfile", "--to-recipe", str(out))[0] == 0  # the system Python
