"""Small helpers shared by the probe's modules (standard library only, Python >= 3.8)."""

from __future__ import annotations

import subprocess
from typing import Any

#: Seconds allowed for one ``NAME --version`` or ``ip -j addr``.
COMMAND_TIMEOUT_S = 10


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def run_text(argv: list[str]) -> str | None:
    """stdout of argv, or None when it cannot run, fails or runs past :data:`COMMAND_TIMEOUT_S` seconds."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              timeout=COMMAND_TIMEOUT_S, text=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()
