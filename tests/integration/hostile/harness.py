"""Run many hostile ``envbuild`` invocations in one bounded worker process.

A :class:`Case` is a command line plus the files it needs (text, bytes, a FIFO, a symlink).
:func:`run_cases` starts ``worker.py`` once for a batch: the worker limits its address space
(``RLIMIT_AS``, :data:`MEMORY_LIMIT_BYTES`), and for each case makes a fresh folder, writes the
files, arms ``SIGALRM`` (the case's ``timeout_s``), calls :func:`builder.cli.app.main` with stdout
and stderr captured, and reports one JSON line (exit code, output, any traceback, seconds,
peak RSS). A case that hangs the worker past its own timeout + 5 s (a hang in C code that
ignores signals) is reported as hung and the worker restarted for the rest.

The worker sets ``DOCKER_HOST`` to a socket that does not exist, so a case that contacts the
engine gets a one-line "no Docker engine" error (exit 3) instead of touching the real one.
Bounds here are generous correctness limits, not speed targets (those live in benchmarks/).
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("worker.py")
#: Address-space limit of the worker process (bytes): a blow-up fails with MemoryError.
MEMORY_LIMIT_BYTES = 3 << 30
#: Longest line any case may print (characters).
MAX_LINE = 1000


@dataclass
class Case:
    """One hostile invocation. ``files`` maps a relative path to ``str`` (UTF-8 text),
    ``bytes``, ``{"fifo": True}`` or ``{"symlink": target}``; ``expect`` holds the accepted
    exit codes; ``stdin`` is fed to the command (None: empty); ``max_stderr_lines`` bounds
    how many lines the error may take (one fault, one line)."""

    id: str
    argv: list[str]
    expect: tuple[int, ...]
    files: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 20.0
    stdin: str | None = None
    #: the most lines stderr may hold (None: any number); hostile single-fault cases use 1
    max_stderr_lines: int | None = 1

    def to_json(self) -> dict:
        files = {}
        for path, content in self.files.items():
            if isinstance(content, bytes):
                files[path] = {"b64": base64.b64encode(content).decode()}
            elif isinstance(content, str):
                files[path] = {"b64": base64.b64encode(content.encode("utf-8", "surrogatepass")).decode()}
            else:
                files[path] = content
        return {"id": self.id, "argv": self.argv, "files": files, "env": self.env,
                "timeout_s": self.timeout_s, "stdin": self.stdin}


@dataclass
class Outcome:
    """What one case did: ``code`` (None when it hung or crashed the worker), captured
    ``stdout``/``stderr``, ``traceback`` (text when an exception escaped ``main``),
    ``hung`` (over its timeout), ``seconds`` and the worker's peak RSS (KiB) after it."""

    id: str
    code: int | None
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    hung: bool = False
    seconds: float = 0.0
    maxrss_kib: int = 0

    def problems(self, case: Case) -> list[str]:
        """Every way this outcome breaks the hostile-input contract (empty: it held):
        no traceback, no hang, an accepted exit code, output lines printable and short,
        and on failure at least one line on stderr saying why."""
        expect = case.expect
        out: list[str] = []
        lines = self.stderr.splitlines()
        if case.max_stderr_lines is not None and len(lines) > case.max_stderr_lines:
            out.append(f"{len(lines)} lines on stderr, at most {case.max_stderr_lines} expected: {lines[:3]!r}")
        if self.hung:
            out.append(f"hung (no answer within its timeout; {self.seconds:.1f} s)")
        if self.traceback:
            out.append("traceback: " + self.traceback.strip().splitlines()[-1][:300])
        if self.code is not None and self.code not in expect:
            out.append(f"exit {self.code}, expected {' or '.join(map(str, expect))}; stderr: {self.stderr[:300]!r}")
        for stream, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            for line in text.splitlines():
                if len(line) > MAX_LINE:
                    out.append(f"{stream} line of {len(line)} characters: {line[:120]!r}...")
                    break
                bad = [c for c in line if (ord(c) < 32 and c != "\t") or 0x7f <= ord(c) < 0xa0
                       or c in "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
                       or 0xd800 <= ord(c) <= 0xdfff]
                if bad:
                    out.append(f"{stream} has a raw control character {bad[0]!r}: {line[:120]!r}")
                    break
        if self.code not in (0, None) and not self.stderr.strip() and not self.stdout.strip():
            out.append(f"exit {self.code} with nothing printed")
        return out


def assert_held(case: Case, outcome: Outcome) -> None:
    """Fail the calling test with every problem of ``outcome`` (see :meth:`Outcome.problems`)."""
    problems = outcome.problems(case)
    assert not problems, f"{case.id} {case.argv!r}: " + "; ".join(problems)


def run_cases(cases: list[Case], env: dict[str, str] | None = None) -> dict[str, Outcome]:
    """Run ``cases`` in as few worker processes as possible; returns outcomes by case id."""
    results: dict[str, Outcome] = {}
    pending = list(cases)
    while pending:
        batch_timeout = sum(c.timeout_s for c in pending) + 60
        payload = json.dumps([c.to_json() for c in pending])
        proc_env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **(env or {}))
        proc = subprocess.Popen([sys.executable, str(WORKER), str(MEMORY_LIMIT_BYTES)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=proc_env, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(payload)
        proc.stdin.close()
        started: str | None = None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        case_by_id = {c.id: c for c in pending}
        deadline = time.monotonic() + batch_timeout
        case_deadline = None
        buf = ""
        while True:
            now = time.monotonic()
            limit = min(deadline, case_deadline or deadline)
            if now >= limit:
                break
            if not sel.select(timeout=limit - now):
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16).decode("utf-8", "replace")
            if not chunk:
                break
            buf += chunk
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                msg = json.loads(line)
                if msg["event"] == "start":
                    started = msg["id"]
                    case_deadline = time.monotonic() + case_by_id[started].timeout_s + 5
                else:
                    started, case_deadline = None, None
                    results[msg["id"]] = Outcome(**{k: v for k, v in msg.items() if k != "event"})
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        if started is not None:
            results[started] = Outcome(id=started, code=None, hung=True, stderr=err[-500:],
                                       seconds=case_by_id[started].timeout_s + 5)
        remaining = [c for c in pending if c.id not in results]
        if remaining and remaining == pending:  # the worker died before the first case
            raise RuntimeError(f"hostile-input worker failed: {err[-2000:]}")
        pending = remaining
    return results
