"""The one way to run a host-side command: a timeout always set, stdin closed, the command shown
escaped in errors (arguments may carry hostile input)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence

from .errors import Unreachable
from .inputs import escape


def shown(argv: Sequence[str]) -> str:
    """``argv`` as one escaped line, cut to 300 characters."""
    return escape(" ".join(argv), 300)


def run(argv: Sequence[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
        capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Non-zero exit is the caller's to judge; Unreachable (exit 3): cannot start, no answer in ``timeout_s``."""
    try:
        return subprocess.run(list(argv), capture_output=capture, text=True, timeout=timeout_s, check=False,
                              env=None if env is None else dict(env), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Unreachable(f"{shown(argv)}: no answer within {timeout_s:g} s") from None
    except OSError as e:
        raise Unreachable(f"cannot run {shown(argv)}: {e.strerror or e}") from None


def stream(argv: Sequence[str], timeout_s: float | None, on_line: Callable[[str], None], *,
           env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """``(exit status, whether it timed out)`` of ``argv``, stdout and stderr merged, each line (no
    newline) to ``on_line``; killed after ``timeout_s`` seconds, never outliving the call."""
    timed_out = threading.Event()
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=None if env is None else dict(env), text=True,
                                errors="replace", bufsize=1)
    except OSError as e:
        raise Unreachable(f"cannot run {shown(argv)}: {e.strerror or e}") from None

    def _kill() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout_s, _kill) if timeout_s else None
    try:
        if timer:
            timer.start()
        assert proc.stdout is not None
        for raw in proc.stdout:
            on_line(raw.rstrip("\n"))
        return proc.wait(), timed_out.is_set()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
