"""``envbuild build`` with nothing changed, on the real engine: the render stamp's fast path
(builder/render/stamp.py) prints the same ``envbuild/<recipe>:<hash>`` as the rendering path,
and stale rendered files are still refused with a valid stamp of the old ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from builder.render import stamp

ROOT = Path(__file__).resolve().parents[2]


def _site(tmp_path: Path) -> tuple[Path, Path, Path]:
    recipes, images = tmp_path / "recipes", tmp_path / "images"
    recipes.mkdir()
    shutil.copy(ROOT / "recipes" / "cpu-torch2.yaml", recipes / "cpu-torch2.yaml")
    shutil.copytree(ROOT / "images" / "cpu-torch2", images / "cpu-torch2")
    return recipes, images, tmp_path / "cache"


#: The exit of a build reusing the session's image: it stands on the bootstrapped base, whose one
#: warning line makes it 1 (done with warnings only).
REUSED = 1


def _build(recipes: Path, images: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", "--recipes-dir", str(recipes),
                           "--images-dir", str(images), "build", "cpu-torch2"], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "ENVBUILD_CACHE_DIR": str(cache), "HOME": str(cache)},
                          timeout=300)


def test_fast_path_prints_the_tag_of_the_rendering_path(tmp_path, torch_image):
    recipes, images, cache = _site(tmp_path)
    slow = _build(recipes, images, cache)  # no stamp yet: renders, compares, records
    assert slow.returncode == REUSED, slow.stderr
    assert list(stamp.default_dir({"ENVBUILD_CACHE_DIR": str(cache)}).glob("*.json"))
    assert stamp.current("cpu-torch2", recipes, images, cache=stamp.default_dir({"ENVBUILD_CACHE_DIR": str(cache)}))
    fast = _build(recipes, images, cache)
    assert fast.returncode == REUSED, fast.stderr
    # the first run probed the image (its probe was not recorded in this cache yet); the tag is the same
    assert fast.stdout.split(";")[0] == slow.stdout.split(";")[0]
    assert fast.stdout.endswith("; probe matches the lock (recorded for this image ID)\n")
    assert fast.stdout.startswith(f"reused {torch_image} ")


def test_stale_rendered_files_are_refused_despite_a_stamp(tmp_path, torch_image):
    recipes, images, cache = _site(tmp_path)
    assert _build(recipes, images, cache).returncode == REUSED  # records the stamp
    f = images / "cpu-torch2" / "Dockerfile"
    f.write_bytes(f.read_bytes() + b"# edited\n")
    done = _build(recipes, images, cache)
    assert done.returncode == 2, done.stderr
    assert "rendered files are stale (Dockerfile)" in done.stderr
    assert done.stdout == ""


PROBE = """
import json, sys
from builder.cli import app
code = app.main(sys.argv[1:])
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & {"rich", "docker", "jinja2", "requests"})]))
"""


def test_no_change_build_imports_no_heavy_module_and_a_rendering_one_does(tmp_path, torch_image):
    recipes, images, cache = _site(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "ENVBUILD_CACHE_DIR": str(cache), "HOME": str(cache)}
    argv = [sys.executable, "-c", PROBE, "--recipes-dir", str(recipes), "--images-dir", str(images), "build",
            "cpu-torch2"]
    first = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert first.stdout.splitlines()[-1] == f'[{REUSED}, ["docker", "jinja2", "requests", "rich"]]', first.stderr
    again = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert again.stdout.splitlines()[-1] == f"[{REUSED}, []]", again.stderr
