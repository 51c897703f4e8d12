"""``make test``'s parallel pass keeps each test module on one xdist worker (tests/conftest.py's
scheduler): a module fixture runs once per run, not once per worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("tests/unit/test_registry_units.py", "tests/unit/test_doctor_units.py")


def _workers_by_module(*args: str) -> dict[str, set[str]]:
    # a run of its own: not a worker of the run this test is in, not sharing its folder
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ENVBUILD_TEST"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", *args, *MODULES],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found: dict[str, set[str]] = {}
    for worker, module in re.findall(r"^\[(gw\d)\] .*?PASSED (tests/unit/\w+\.py)::", proc.stdout, re.M):
        found.setdefault(module, set()).add(worker)
    return found


def test_each_module_runs_on_one_worker():
    found = _workers_by_module("--dist", "loadgroup")
    assert sorted(found) == sorted(MODULES)
    assert [len(workers) for workers in found.values()] == [1, 1], found


def test_plain_load_spreads_a_module_over_the_workers():
    """The twin: without the scheduler (``--dist load``) the larger module is spread (xdist's load
    scheduling hands out the first tests round-robin; the smaller may end on one worker)."""
    found = _workers_by_module("--dist", "load")
    assert found["tests/unit/test_registry_units.py"] == {"gw0", "gw1"}, found
