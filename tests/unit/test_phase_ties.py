"""Phase spans (builder/launchers/phases.py) when phases share a time stamp: the ranks stamp
them to the millisecond (Slurm, Kubernetes), so quick phases tie; they keep the order the
ranks entered them."""

from builder.launchers.phases import phase_times

PHASES = ["start", "init", "profiles", "probe", "write", "done"]


def test_tied_phases_keep_the_ranks_order():
    starts = {r: {"start": 10.0, "init": 12.0, "profiles": 12.0, "probe": 12.0, "write": 12.0, "done": 12.0}
              for r in (0, 1)}
    marks = {"launch": 0.0, "started": 5.0, "ended": 20.0, "removed": 21.0}
    assert phase_times(marks, starts, 2, first="queued") == [
        ("queued", 5.0), ("ranks up", 5.0), ("import torch", 2.0), ("init", 0.0), ("profiles", 0.0),
        ("probe", 0.0), ("write", 0.0), ("exit", 8.0), ("teardown", 1.0)]


def test_phases_at_distinct_times_twin():
    starts = {r: {p: 10.0 + i for i, p in enumerate(PHASES)} for r in (0, 1)}
    marks = {"launch": 0.0, "started": 5.0, "ended": 20.0, "removed": 21.0}
    assert [name for name, _ in phase_times(marks, starts, 2)] == [
        "containers up", "ranks up", "import torch", "init", "profiles", "probe", "write", "exit", "teardown"]
