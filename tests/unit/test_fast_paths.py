"""Issue 13 items 3 and 5 on real parts: the check path leaves packaging's requirement parser
alone (fresh interpreters; tests/unit/test_cli_imports.py covers docker, jinja2, rich...), the
pip requirement fast path against packaging's parser, the certification's phase times, the rank's fast exit (a real subprocess). Timing targets are in
benchmarks/bench.py, not here."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from builder.launchers.phases import PhaseClock, phase_times, stalled_phase
from builder.launchers.progress import ProgressTracker
from builder.recipe import fields

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("rich", "docker", "requests", "jinja2", "packaging.requirements", "packaging.tags")
PROBE = "HEAVY = " + repr(HEAVY) + """
import json, sys
from builder.cli import app
code = app.main(sys.argv[1:])
print(json.dumps({"code": int(code), "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def _imports_after(*argv: str, cwd: Path = REPO) -> dict:
    """Run ``envbuild ARGV`` in a fresh interpreter; its exit code and which of HEAVY it imported."""
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- item 5: the check path


def test_check_imports_no_heavy_module():
    assert _imports_after("check", "cpu-torch2") == {"code": 0, "heavy": []}
    # its driver note is printed in colour through rich; packaging stays out all the same
    assert _imports_after("check", "cuda12-torch2") == {"code": 0, "heavy": ["rich"]}


def test_probe_sees_heavy_imports_of_other_commands():
    # the twin: the same probe sees what another command needs (render loads jinja2 and prints
    # with rich), so an import of one of them on the check path would show
    assert _imports_after("render", "--check", "cpu-torch2")["heavy"] == ["rich", "jinja2"]


def test_check_with_uncommon_requirement_takes_packaging(tmp_path):
    recipe = (REPO / "recipes" / "cpu-torch2.yaml").read_text().replace("numpy==2.3.5", "'numpy[dev]>=2.3,<3'")
    assert "'numpy[dev]>=2.3,<3'" in recipe
    (tmp_path / "cpu-torch2.yaml").write_text(recipe)
    got = _imports_after("--recipes-dir", str(tmp_path), "check", "cpu-torch2")
    assert got == {"code": 0, "heavy": ["packaging.requirements", "packaging.tags"]}


SAMPLES = ["numpy==2.3.5", "numpy == 2.3.5", "scipy>=1.11", "scipy >=1.11 ", "Foo.Bar_baz-1<3", "a>1", "a!=1.0",
           "a~=1.4", "a~=1", "a<=0", "torch==2.13.0", "Torch_==1", "numpy===2.3.5", "numpy==2.3.*", "numpy=2",
           "numpy==", "numpy==2.3.5rc1", "numpy==v2", " numpy==1", "numpy\t==\t1.0", "numpy==1.0.0.0.0.0.0.0.0.0",
           "numpy==1.0.0.0.0.0.0.0.0.0.0", "x" * 128 + "==1", "-numpy==1", "numpy[extra]==1", "numpy>=1,<2",
           "numpy; python_version<'3'", "numpy @ https://example.com/n.whl", "nvidia-nccl-cu12==2.27.3", "a_.-b==1"]


@pytest.mark.parametrize("allow_torch", [False, True])
def test_simple_requirements_match_packaging(allow_torch):
    rng = random.Random(13)
    alphabet = "aZ9._-=<>!~ \t1.*[],;@"
    fuzz = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(3000)]
    fuzz += [f"{rng.choice(['np', 'Np_x', 'a.b'])}{rng.choice(['', ' '])}{rng.choice(['==', '>=', '~=', '<', '!='])}"
             f"{rng.choice(['', ' '])}{'.'.join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 4)))}"
             for _ in range(2000)]
    fast = 0
    for text in SAMPLES + fuzz:
        refused = len(text) > 512 or fields.inputs.has_control(text) or text.strip().startswith("-")
        want = (False, fields._PEP508) if refused else fields._pip_requirement_parsed(text, allow_torch)
        if fields.SIMPLE_REQUIREMENT.fullmatch(text):
            fast += 1
        assert fields.pip_requirement(text, allow_torch=allow_torch) == want, text
    assert fast > 1500  # the fast path was taken (most of the generated simple forms)


def test_simple_requirement_literals():
    assert fields.pip_requirement("numpy == 2.3.5") == (True, "numpy==2.3.5")
    assert fields.pip_requirement("torch==2.13.0") == (False, "torch is pinned by the torch section, not packages.pip")
    assert fields.pip_requirement("numpy>=1,<2") == (True, "numpy<2,>=1")  # packaging's order
    assert fields.requirement_name("Foo.Bar_baz-1<3") == "Foo.Bar_baz-1"
    assert fields.canonical_name("Foo.Bar__baz-1") == "foo-bar-baz-1"


# --------------------------------------------------------------------------- item 3: phase times


def _line(rank: int, seq: int, phase: str) -> str:
    return "@@envbuild-progress " + json.dumps({"rank": rank, "run": "r1", "seq": seq, "phase": phase})


def _tracker(phases_by_rank: dict[int, list[tuple[str, float]]]) -> ProgressTracker:
    tracker = ProgressTracker(2, "r1")
    for rank, items in phases_by_rank.items():
        for seq, (phase, at) in enumerate(items):
            assert tracker.feed(_line(rank, seq, phase), at=at)
    return tracker


RUN = ["start", "init", "all-reduce", "all-reduce", "ddp", "ddp", "probe", "write", "done"]


def test_phase_times_of_a_full_run():
    t0 = [("start", 3.0), ("init", 5.0), ("all-reduce", 6.0), ("all-reduce", 6.2), ("ddp", 7.0), ("ddp", 8.0),
          ("probe", 10.0), ("write", 10.5), ("done", 10.6)]
    t1 = [(p, t + 0.5) for p, t in t0]  # rank 1 enters each phase 0.5 s later: the last rank counts
    clock = PhaseClock(iter([0.0, 1.25, 12.0, 12.5]).__next__)
    for mark in ("launch", "started", "ended", "removed"):
        clock.mark(mark)
    clock.mark("ended")  # the first record counts
    got = phase_times(clock.marks, _tracker({0: t0, 1: t1}).phase_starts(), 2)
    assert got == [("containers up", 1.25), ("ranks up", 2.25), ("import torch", 2.0), ("init", 1.0),
                   ("all-reduce", 1.0), ("ddp", 3.0), ("probe", 0.5), ("write", 0.1), ("exit", 0.9),
                   ("teardown", 0.5)]
    assert sum(s for _, s in got) == 12.5  # no gap: the spans cover launch -> removed


MARKS = {"launch": 0.0, "started": 1.0, "ended": 12.0, "removed": 12.5}


def test_phase_times_end_with_the_phase_a_run_was_cut_short_in():
    t0 = [("start", 3.0), ("init", 5.0), ("all-reduce", 6.0), ("ddp", 7.0), ("probe", 10.0), ("write", 10.5),
          ("done", 10.6)]
    t1 = [("start", 3.5), ("init", 5.5)]  # rank 1 ended after init (the exit fault)
    assert phase_times(MARKS, _tracker({0: t0, 1: t1}).phase_starts(), 2) == [
        ("containers up", 1.0), ("ranks up", 2.5), ("import torch", 2.0), ("init (cut short)", 6.5),
        ("teardown", 0.5)]
    assert phase_times(MARKS, _tracker({0: t0}).phase_starts(), 2) == [
        ("containers up", 1.0), ("ranks up (cut short)", 11.0), ("teardown", 0.5)]
    assert phase_times({"launch": 0.0}, {}, 2) == []


def test_phase_times_name_the_phase_that_hung():
    """A timed-out run: rank 1 sleeps outside any collective while rank 0 waits in one."""
    starts = _tracker({0: [("start", 3.0), ("init", 5.0), ("all-reduce", 6.0)],
                       1: [("start", 3.5), ("init", 5.5), ("test fault", 6.1)]}).phase_starts()
    progress = {0: {"phase": "all-reduce", "collective": True, "seq": 2, "state": "S", "silent_s": 1.0},
                1: {"phase": "test fault", "collective": False, "seq": 2, "state": "S", "silent_s": 1.0}}
    stalled = stalled_phase(progress, starts, 2)
    assert stalled == ("test fault", 6.1)
    got = phase_times(MARKS, starts, 2, stalled, timed_out=True)
    assert got == [("containers up", 1.0), ("ranks up", 2.5), ("import torch", 2.0), ("init", 0.6),
                   ("test fault (hung)", 5.9), ("teardown", 0.5)]
    assert round(sum(s for _, s in got), 2) == 12.5
    # every rank waiting in the same collective: none singled out, the common phase hung
    same = {r: {"phase": "init", "collective": True, "seq": 1, "state": "S", "silent_s": 1.0} for r in (0, 1)}
    starts = _tracker({0: [("start", 3.0), ("init", 5.0)], 1: [("start", 3.5), ("init", 5.5)]}).phase_starts()
    assert phase_times(MARKS, starts, 2, stalled_phase(same, starts, 2), timed_out=True)[-2:] == [
        ("init (hung)", 6.5), ("teardown", 0.5)]


# --------------------------------------------------------------------------- item 3: the rank's fast exit

EXIT = "AGENT = " + repr(str(REPO / "builder" / "agent")) + """
import atexit, sys
sys.path.insert(0, AGENT)
from bench.__main__ import fast_exit
atexit.register(lambda: print("finalized"))
print("result line")
if sys.argv[1] == "fast":
    fast_exit(3)
sys.exit(3)
"""


def test_rank_fast_exit_skips_finalization_and_keeps_its_output():
    out = subprocess.run([sys.executable, "-c", EXIT, "fast"], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (3, "result line\n")


def test_rank_normal_exit_runs_finalization():
    out = subprocess.run([sys.executable, "-c", EXIT, "normal"], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (3, "result line\nfinalized\n")
