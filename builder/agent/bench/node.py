"""The watchdog of one node: ``python3 -m bench.node --deadline-s S -- COMMAND...``. The container runs with ``--rm``;
this makes it end by the deadline even when nobody is left to stop it (envbuild killed): it kills the child and every
descendant (torchrun's workers have their own sessions, so they are found via ``/proc/*/stat``) and exits 124;
SIGTERM/SIGINT give 143/130; else the child's status. As PID 1 it also reaps orphans."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from .progress import stat_fields

EXIT_DEADLINE = 124
EXIT_USAGE = 64
POLL_S = 0.2


def descendants(pid, proc="/proc"):
    parent_of = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        rest = stat_fields(name, proc) if name.isdigit() else []
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
    """SIGKILL ``pid`` and its descendants found before the kill."""
    for p in [pid] + descendants(pid):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


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
    """``(deadline seconds, command)``; ValueError on a bad deadline or no command."""
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
