"""Write the launcher goldens, ``tests/golden/k8s/`` and ``tests/golden/slurm/`` (``make golden``).

The cases live with their tests: each module of :data:`MODULES` (found under ``tests/``,
wherever scripts/split_tests.py put it) has a ``regenerate()`` that writes its goldens from
the same ``render_case`` the golden tests compare against. Run from anywhere.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
#: Test modules that own goldens (file names under tests/).
MODULES = ("test_k8s_units.py", "test_slurm_units.py")


def find(name: str) -> Path:
    """The one ``tests/**/<name>``; SystemExit (70) when there is none or more than one."""
    found = sorted(p for p in TESTS.rglob(name) if "golden" not in p.parts)
    if len(found) != 1:
        sys.exit(f"error: expected one tests/**/{name}, found {len(found)}")
    return found[0]


def regenerate(path: Path) -> None:
    """Import the test module at ``path`` (its folder, tests/ and the root on sys.path) and
    call its ``regenerate()``."""
    for entry in (str(ROOT), str(TESTS), str(path.parent)):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    module.regenerate()


def main() -> int:
    for name in MODULES:
        regenerate(find(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
