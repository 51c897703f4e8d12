"""A rank's progress lines on stdout: one per phase entered, and a heartbeat while alive. The heartbeat is a forked
process, not a thread: a rank blocked in a call holding the GIL (gloo's rendezvous) still beats, a frozen container
does not. Lines are written under a thread lock and an ``flock`` shared by the node's ranks, so they never interleave.
The host reads them in :class:`builder.launchers.progress.ProgressTracker`. Stdlib only."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

try:  # not on every platform; without it the ranks of a node are not serialized
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # the module or None; callers check for None

PROGRESS_PREFIX = "@@envbuild-progress "
RESULT_PREFIX = "@@envbuild-result "
#: Seconds between two heartbeats.
DEFAULT_HEARTBEAT_S = 2.0
#: The socket variables recorded in the ``start`` line.
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_IFF_LOOPBACK = 0x8


def interfaces():
    """``{interface name: is loopback}`` from ``/sys/class/net`` ({} when unreadable)."""
    out: dict[str, bool] = {}
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return out
    for name in names[:64]:
        try:
            with open(f"/sys/class/net/{name}/flags") as f:
                out[name] = bool(int(f.read(32).strip(), 16) & _IFF_LOOPBACK)
        except (OSError, ValueError):
            out[name] = name == "lo"
    return out


class Writer:
    """Whole lines to ``stream`` under a thread lock and, when it can be opened, an ``flock``."""

    def __init__(self, stream=None, lock_path=None):
        self.stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()
        self._fd = None
        if lock_path and fcntl is not None:
            try:
                self._fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:
                self._fd = None

    def line(self, text):
        with self._lock:
            self._flock(fcntl.LOCK_EX if fcntl else 0)
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            finally:
                self._flock(fcntl.LOCK_UN if fcntl else 0)

    def _flock(self, op):
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, op)


def stat_fields(pid, proc="/proc"):
    """Fields of ``/proc/PID/stat`` after ``(comm)`` (it may hold spaces, parentheses): state, ppid...; [] if unread."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), "rb") as f:
            return f.read(4096).decode("ascii", "replace").rpartition(")")[2].split()
    except OSError:
        return []


def proc_state(pid):
    """The state letter of ``pid``, None when unreadable."""
    return (stat_fields(pid) or [None])[0]


def heartbeat_loop(parent, rank, run_id, interval, writer, clock=time.time, sleep=time.sleep,
                   getppid=os.getppid, state_of=proc_state, max_beats=None):
    """Every ``interval`` s a beat with ``parent``'s state; returns when ``parent`` is gone."""
    beat = 0
    while max_beats is None or beat < max_beats:
        sleep(interval)
        state = state_of(parent)
        if getppid() != parent or state in (None, "Z", "X", "x"):
            return
        beat += 1
        doc = {"rank": rank, "run": run_id, "beat": beat, "state": state, "t": round(clock(), 3)}
        writer.line(PROGRESS_PREFIX + json.dumps(doc, sort_keys=True))


class Progress:
    """The progress lines of one rank; ``heartbeat_s`` <= 0 prints phase lines only."""

    def __init__(self, rank, run_id=None, heartbeat_s=DEFAULT_HEARTBEAT_S, writer=None, clock=time.time):
        self.rank = rank
        self.run_id = run_id
        self.heartbeat_s = heartbeat_s
        self.lock_path = "/tmp/envbuild-%s-output.lock" % (run_id or "bench")
        self.writer = writer if writer is not None else Writer(lock_path=self.lock_path)
        self.clock = clock
        self.seq = -1
        self.heartbeat_pid = None
        self._mu = threading.Lock()

    def phase(self, name, detail=None, collective=False, extra=None):
        with self._mu:
            self.seq += 1
            doc = {"rank": self.rank, "run": self.run_id, "seq": self.seq, "phase": name,
                   "detail": detail, "collective": bool(collective), "t": round(self.clock(), 3)}
        if extra:
            doc.update(extra)
        self.writer.line(PROGRESS_PREFIX + json.dumps(doc, sort_keys=True, allow_nan=False))

    def start(self):
        """Print the ``start`` line and fork the heartbeat (before importing torch: forking its threads is unsafe)."""
        seen = {k: os.environ.get(k) for k in SOCKET_VARS}
        self.phase("start", extra={"socket": seen, "interfaces": interfaces()})
        if self.heartbeat_s and self.heartbeat_s > 0 and hasattr(os, "fork"):
            self._fork_heartbeat()

    def _fork_heartbeat(self):
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            return
        if pid:
            self.heartbeat_pid = pid
            return
        code = 0
        try:  # the child: its own lock file description (flock locks are per description)
            heartbeat_loop(parent, self.rank, self.run_id, self.heartbeat_s, Writer(lock_path=self.lock_path))
        except BaseException:
            code = 1
        finally:
            os._exit(code)

    def stop(self):
        pid, self.heartbeat_pid = self.heartbeat_pid, None
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
                os.waitpid(pid, 0)

    def result(self, doc):
        self.writer.line(RESULT_PREFIX + json.dumps(doc, sort_keys=True, allow_nan=False))
