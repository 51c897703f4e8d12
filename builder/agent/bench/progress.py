"""Progress lines of a rank: which phase it is in, and a heartbeat while it is alive.

Runs INSIDE the image (stdlib only, Python >= 3.8). Each rank prints, on its stdout (the
node's output, which the launcher reads), one line per phase it enters::

    @@envbuild-progress {"rank": 1, "run": "0123456789ab", "seq": 4, "phase": "all-reduce",
                         "detail": "1024 B", "collective": true, "t": 1715500000.123}

``seq`` counts the phases entered (0 = ``start``); ``collective`` says whether the phase
waits for the other ranks (init, all-reduce, DDP steps, gathers); ``t`` is the rank's wall
clock (seconds since the epoch). The first line (``start``) also carries what this rank
sees of the socket settings (``socket``: ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``,
null when unset) and its interfaces (``interfaces``: ``{name: is loopback}``, from
``/sys/class/net/NAME/flags``).

Every ``heartbeat_s`` seconds a **heartbeat process** (forked by :meth:`Progress.start`
before torch is imported) prints a beat for the rank::

    @@envbuild-progress {"rank": 1, "run": "0123456789ab", "beat": 17, "state": "S", "t": ...}

``state`` is the rank process's state in ``/proc/PID/stat`` (``R`` running, ``S``/``D``
waiting, ``T``/``t`` stopped by a signal such as SIGSTOP). A separate process, not a
thread: a rank blocked in a call that holds the GIL (gloo's rendezvous does) still beats,
while a frozen container (``docker pause``) beats no more. The heartbeat process ends as
soon as the rank is gone. The host tells a rank that stopped making progress from the
ranks that wait for it (:class:`builder.launchers.progress.ProgressTracker`).

A rank's result document may be printed the same way (``@@envbuild-result <JSON>``, one
line; see :func:`Progress.result`). Every line of this module is written under a lock
(a thread lock and ``flock`` on a file in ``/tmp``, shared by the ranks of one node), so
lines of several ranks on one node never interleave even when longer than a pipe's
atomic write size.
"""

from __future__ import annotations

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
#: Seconds between two heartbeats (default of ``--heartbeat-s``).
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
    """Writes whole lines to ``stream`` under a thread lock and an ``flock`` on
    ``lock_path`` (created if possible; without it, the thread lock only)."""

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
        """Write ``text`` plus a newline and flush, as one unit."""
        with self._lock:
            if self._fd is not None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                except OSError:
                    pass
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            finally:
                if self._fd is not None:
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                    except OSError:
                        pass


def proc_state(pid):
    """The state letter of process ``pid`` in ``/proc/PID/stat`` (``R``, ``S``, ``D``,
    ``T``, ``t``, ``Z``...), None when unreadable."""
    try:
        with open(f"/proc/{pid:d}/stat", "rb") as f:
            text = f.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    rest = text.rpartition(")")[2].split()
    return rest[0] if rest else None


def heartbeat_loop(parent, rank, run_id, interval, writer, clock=time.time, sleep=time.sleep,
                   getppid=os.getppid, state_of=proc_state, max_beats=None):
    """The heartbeat process's loop: every ``interval`` s, a beat line with the state of
    ``parent``; returns when ``parent`` is gone (or after ``max_beats``, for tests)."""
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
    """The progress lines of one rank (see the module doc).

    Args:
        rank: this rank (global).
        run_id: ``$ENVBUILD_RUN_ID`` (None: not sent).
        heartbeat_s: seconds between heartbeats; 0 or less: phase lines only.
        writer: a :class:`Writer` (default: stdout, lock file in ``/tmp``).
        clock: wall clock, seconds (tests pass a fake).
    """

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
        """Enter phase ``name`` (``detail``: e.g. ``"1024 B"``) and print its line."""
        with self._mu:
            self.seq += 1
            doc = {"rank": self.rank, "run": self.run_id, "seq": self.seq, "phase": name,
                   "detail": detail, "collective": bool(collective), "t": round(self.clock(), 3)}
        if extra:
            doc.update(extra)
        self.writer.line(PROGRESS_PREFIX + json.dumps(doc, sort_keys=True, allow_nan=False))

    def start(self):
        """Print the ``start`` line (socket settings, interfaces) and fork the heartbeat
        process (call before importing torch: forking a process with torch's threads is
        not safe)."""
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
        """End the heartbeat process (the last phase line stays the rank's last word)."""
        pid, self.heartbeat_pid = self.heartbeat_pid, None
        if pid:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass

    def result(self, doc):
        """Print the result document ``doc`` as one ``@@envbuild-result`` line."""
        self.writer.line(RESULT_PREFIX + json.dumps(doc, sort_keys=True, allow_nan=False))
