"""What every node source shares: agent modules running on a node, the probe, the checked values."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from builder.agent import payload
from builder.core.documents import NodeReport
from builder.core.errors import EnvbuildError, Unreachable, UsageError
from builder.core.inputs import has_control, one_line

from .. import report as nodereport
from ..report import MAX_REPORT_BYTES, InvalidReport, Node

#: Seconds one node may take to produce its report (the probe imports torch and loads
#: every libnccl it finds in a subprocess).
DEFAULT_TIMEOUT_S = 120.0
#: The interpreter run on remote nodes.
DEFAULT_PYTHON = "python3"
#: Bytes of a script's stderr kept (the tail: the reason a node failed is its last line).
STDERR_TAIL_BYTES = 64 << 10
#: The payload module that prints a node report.
PROBE_MODULE = "probe"
#: The payload module that runs doctor's in-node checks.
AGENT_MODULE = "doctor_agent"

_PYTHON_RE = re.compile(r"(/?[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,254})(/[A-Za-z0-9_.+-]{1,255}){0,63}")


@functools.lru_cache(maxsize=1)
def payload_archive() -> bytes:
    """The agent payload (:func:`builder.agent.payload.archive`), built once per process."""
    return payload.archive()


def check_path(text: str, field: str) -> str:
    """``text`` if it is a path of at most 4096 characters without control characters."""
    if not isinstance(text, str) or not text or len(text) > 4096 or has_control(text):
        raise UsageError("is not a path (at most 4096 characters, no control characters)", field=field, value=text)
    return text


def check_python(text: str) -> str:
    """``text`` if an interpreter name or path (letters, digits, ``_ . + - /``, no leading ``-``); else 64."""
    if not isinstance(text, str) or _PYTHON_RE.fullmatch(text) is None:
        raise UsageError("is not an interpreter name or path (letters, digits, _ . + - and /)",
                         field="--python", value=text)
    return text


def last_line(text: str) -> str:
    """The last non-blank line of ``text``, escaped (``"no output"`` when there is none)."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return one_line(lines[-1], 200) if lines else "no output"


def unique_names(nodes: list[Node], rename: Callable[[Node], str]) -> list[Node]:
    """``nodes`` with ``rename(node)`` as the name of every node whose name is repeated."""
    counts = collections.Counter(n.name for n in nodes)
    for n in nodes:
        if counts[n.name] > 1:
            n.name = rename(n)
    return nodes


def exit_status(rc: int | None) -> str:
    """``"exited with status 1"``, ``"was killed by SIGKILL"`` (negative), ``"ended with an unknown status"``."""
    if rc is None:
        return "ended with an unknown status"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


# --------------------------------------------------------------------------- running modules


@dataclass
class Completed:
    """A finished module: exit status (None if unknown), stdout and stderr text."""

    rc: int | None
    stdout: str
    stderr: str


class Running:
    """An agent module running on a node; stdout arrives line by line."""

    def __init__(self, where: str, max_stdout: int = MAX_REPORT_BYTES) -> None:
        self.where = where
        self.max_stdout = max_stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._out: list[str] = []
        self._err: list[bytes] = []
        self._err_size = 0
        self._size = 0
        self._partial = bytearray()
        self._over = False
        self._done = threading.Event()
        self.rc: int | None = None

    def _line(self, line: str) -> None:
        self._out.append(line)
        self._lines.put(line)

    def _out_bytes(self, data: bytes) -> bool:
        """Take a chunk of stdout; False once over ``max_stdout`` (the caller stops reading)."""
        if self._over:
            return False
        self._size += len(data)
        if self._size > self.max_stdout:
            self._over = True
            self.kill()
            return False
        self._partial += data
        if b"\n" in data:
            head, _, tail = self._partial.rpartition(b"\n")
            for raw in head.split(b"\n"):
                self._line(raw.decode("utf-8", "replace"))
            self._partial = bytearray(tail)
        return True

    def _err_bytes(self, data: bytes) -> None:
        """Take a chunk of stderr, keeping the last :data:`STDERR_TAIL_BYTES` only."""
        self._err.append(data)
        self._err_size += len(data)
        while self._err_size > STDERR_TAIL_BYTES and len(self._err) > 1:
            self._err_size -= len(self._err.pop(0))
        if self._err_size > STDERR_TAIL_BYTES:
            self._err[0] = self._err[0][-STDERR_TAIL_BYTES:]
            self._err_size = len(self._err[0])

    def _finish(self, rc: int | None) -> None:
        if self._partial and not self._over:
            self._line(self._partial.decode("utf-8", "replace"))
            self._partial = bytearray()
        self.rc = rc
        self._done.set()
        self._lines.put(None)

    def readline(self, timeout_s: float) -> str | None:
        """The next stdout line (without newline); None at the end or after ``timeout_s``."""
        try:
            line = self._lines.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if line is None:
            self._lines.put(None)  # keep signalling the end
        return line

    def wait(self, timeout_s: float) -> Completed:
        """What it printed; Unreachable (3): past ``timeout_s`` (killed); InvalidReport (3): over ``max_stdout``."""
        if not self._done.wait(max(0.0, timeout_s)):
            self.kill()
            raise Unreachable(f"no answer within {timeout_s:g} s", field=self.where)
        if self._over:
            raise InvalidReport(f"printed over {self.max_stdout} bytes on stdout, the limit of a node "
                                "report; stopped", file=self.where)
        stderr = b"".join(self._err).decode("utf-8", "replace")
        return Completed(self.rc, "\n".join(self._out) + ("\n" if self._out else ""), stderr)

    def kill(self) -> None:  # pragma: no cover - overridden
        """Stop the module (best effort)."""


class ProcessRunning(Running):
    """A local process (``ssh``, ``srun``) given ``stdin`` (the payload archive); its output read in bounded chunks."""

    def __init__(self, argv: Sequence[str], stdin: bytes, where: str, max_stdout: int = MAX_REPORT_BYTES) -> None:
        super().__init__(where, max_stdout)
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise Unreachable(f"cannot run {argv[0]}: {e.strerror or e}", field=where) from None
        threading.Thread(target=self._feed, args=(stdin,), daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):  # the process ended early; its exit status tells why
            self.proc.stdin.write(data)
            self.proc.stdin.close()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        while chunk := os.read(self.proc.stderr.fileno(), 1 << 16):
            self._err_bytes(chunk)

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        while True:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk or not self._out_bytes(chunk):
                break
        status = self.proc.wait()
        # stderr is read by another thread: finish only once all of it is in, or the
        # reason a host could not be reached may be missing from the message
        self._err_reader.join(10)
        self._finish(status)

    def kill(self) -> None:
        """SIGTERM the process group (srun then cancels its step), SIGKILL after 5 s."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class Target:
    """Where agent modules run on one node; :meth:`start` returns a :class:`Running`."""

    where = "node"
    machine = "node"

    def start(self, module: str, args: Sequence[str] = ()) -> Running:  # pragma: no cover
        """Start ``python3`` running the payload's ``module`` with ``args`` on the node."""
        raise NotImplementedError

    def run(self, module: str, args: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> Completed:
        """Run ``module`` to its end (see :meth:`Running.wait` for the timeout)."""
        return self.start(module, args).wait(timeout_s)


# --------------------------------------------------------------------------- reports


def report_from_output(out: Completed, source: str) -> NodeReport:
    """The report a probe printed, validated; Unreachable (3): a non-zero exit (last stderr line); InvalidReport (3)."""
    if out.rc not in (0, None) or (out.rc is None and not out.stdout.strip()):
        raise Unreachable(f"probe {exit_status(out.rc)}: {last_line(out.stderr or out.stdout)}", file=source)
    return nodereport.parse(out.stdout, source)


def probe_nodes(nodes: list[Node], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Node]:
    """Probe every node with a target at once, filling each ``report`` or ``error`` in place; returns ``nodes``."""
    def one(node: Node) -> None:
        if node.target is None or node.report is not None or node.error is not None:
            return
        try:
            out = node.target.run(PROBE_MODULE, (), timeout_s)
            node.report = report_from_output(out, node.source)
        except EnvbuildError as e:
            node.error = e

    if nodes:
        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            list(pool.map(one, nodes))
    return nodes
