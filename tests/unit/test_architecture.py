"""The architecture as the data flows (README: Architecture): stages import only earlier
stages, in-image code imports nothing of envbuild. The contracts are import-linter's
(pyproject.toml, [tool.importlinter]); these tests run the real `lint-imports` on this tree
and on a copy with one planted backward import, which must break the contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_tree_keeps_every_import_contract():
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in res.stdout


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    shutil.copytree(ROOT / "builder", dst / "builder", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_a_planted_backward_import_breaks_the_layers(tmp_path):
    repo = _copy(tmp_path)
    target = repo / "builder" / "recipe" / "__init__.py"
    target.write_text(target.read_text() + "\nfrom builder.certify import certify  # planted\n")
    res = _lint(repo)
    assert res.returncode == 1
    assert "builder.recipe is not allowed to import builder.certify" in res.stdout


def test_an_envbuild_import_in_the_agent_breaks_its_contract(tmp_path):
    repo = _copy(tmp_path)
    target = repo / "builder" / "agent" / "probe" / "collect.py"
    target.write_text(target.read_text() + "\nfrom builder.core import errors  # planted\n")
    res = _lint(repo)
    assert res.returncode == 1
    assert "builder.agent.probe.collect -> builder.core.errors" in res.stdout
