"""The docs site and the README: `mkdocs build --strict` passes on docs/ (and fails on a page
with a broken link), every page is in the navigation, the README stays a short entry page, and
its example commands exist and answer as it shows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mkdocs(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_mkdocs_build_strict_passes_and_fails_on_a_broken_link(tmp_path):
    proc = _mkdocs(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "certify" / "index.html").is_file()
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "certify.md", "a") as f:
        f.write("\nSee [the gone page](gone.md).\n")
    broken = _mkdocs(copy, tmp_path / "site2")
    assert broken.returncode == 1
    assert "gone.md" in broken.stderr


def test_every_page_is_in_the_navigation():
    nav = set(re.findall(r"\b([\w-]+\.md)\b", (ROOT / "mkdocs.yml").read_text()))
    assert nav == {p.name for p in (ROOT / "docs").glob("*.md")}


def test_readme_is_short_and_its_examples_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    for command in ("make run", "make test"):
        assert re.search(rf"^{command} ", readme, re.M), command
    for page in re.findall(r"\]\((docs/[\w-]+\.md)", readme):
        assert (ROOT / page).is_file(), page
    proc = subprocess.run([sys.executable, "-m", "builder.cli", "check", "recipes/examples/bad.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    first = proc.stderr.splitlines()[0]
    assert proc.returncode == 2 and f"$ envbuild check recipes/examples/bad.yaml\n{first}\n" in readme
