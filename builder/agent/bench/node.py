"""The watchdog of one node: ``python3 -m bench.node --deadline-s S -- COMMAND...``.

Runs INSIDE the image as the container's command (stdlib only, Python >= 3.8). It starts
``COMMAND`` (torchrun running the bench) as a child and waits for it; when ``S`` seconds
have passed since the watchdog started, it kills the child and every process descended
from it (torchrun starts its workers in sessions of their own, so a process-group kill
would miss them: descendants are found by walking ``/proc/*/stat`` parent ids), prints
one line on stderr and exits with :data:`EXIT_DEADLINE` (124). SIGTERM and SIGINT do the
same with 143 and 130. Otherwise it exits with the child's status (128 + N when the
child was killed by signal N).

Why: the local launcher runs each node with Docker's ``--rm`` (``AutoRemove``), so a
container removes itself once its command ends. This watchdog makes sure it ends by the
deadline even when nobody is left to stop it (``envbuild`` killed with SIGKILL, the host's
engine client gone): the container then ends ``S`` seconds after it started and the engine
removes it. As the container's PID 1 it also reaps orphaned processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

EXIT_DEADLINE = 124
EXIT_USAGE = 64
POLL_S = 0.2


def descendants(pid, proc="/proc"):
    """PIDs descended from ``pid`` (children, their children, ...), from ``/proc/*/stat``."""
    parent_of = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat"), "rb") as f:
                text = f.read(4096).decode("ascii", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        rest = text.rpartition(")")[2].split()
        if len(rest) >= 2 and rest[1].isdigit():
            parent_of[int(name)] = int(rest[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p and c not in out]
        out.extend(kids)
        frontier.extend(kids)
    return out


def kill_tree(pid):
    """SIGKILL ``pid`` and its descendants (those found before the kill)."""
    for p in [pid] + descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _reap_others(child_pid):
    """As PID 1, collect exited orphans (never the child: its status is needed)."""
    if os.getpid() != 1:
        return
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0 or pid == child_pid:
            return


def parse_args(argv):
    """``(deadline seconds, command)`` from ``--deadline-s S -- COMMAND...``.

    Raises:
        ValueError: a missing or non-positive deadline, or no command.
    """
    if len(argv) < 4 or argv[0] != "--deadline-s" or argv[2] != "--":
        raise ValueError("usage: python3 -m bench.node --deadline-s SECONDS -- COMMAND...")
    try:
        deadline = float(argv[1])
    except ValueError:
        raise ValueError(f"--deadline-s {argv[1]!r} is not a number") from None
    if not deadline > 0 or deadline != deadline:
        raise ValueError("--deadline-s must be > 0")
    return deadline, argv[3:]


def run(deadline_s, command, clock=time.monotonic):
    """Run ``command`` under the deadline; returns the exit status (see the module doc)."""
    t0 = clock()
    child = subprocess.Popen(command)
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    while True:
        code = child.poll()
        if code is not None:
            return 128 - code if code < 0 else code
        _reap_others(child.pid)
        if stop:
            kill_tree(child.pid)
            child.wait()
            return 128 + stop[0]
        if clock() - t0 >= deadline_s:
            print(f"envbuild node watchdog: the deadline of {deadline_s:g} s passed; killing the ranks",
                  file=sys.stderr, flush=True)
            kill_tree(child.pid)
            child.wait()
            return EXIT_DEADLINE
        time.sleep(POLL_S)


def main(argv=None):
    try:
        deadline, command = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"python3 -m bench.node: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run(deadline, command)


if __name__ == "__main__":
    sys.exit(main())
