"""The host-side reaper of one local run: ``python -m builder.launchers.reaper RUN_ID SECONDS``.
In a session of its own, it outlives an envbuild killed with SIGKILL and after SECONDS
removes the run's containers, also those frozen by ``docker pause`` (beyond the watchdog)."""

from __future__ import annotations

import re
import sys
import time

#: A run id as :func:`builder.image.engine.new_run_id` makes them.
RUN_ID = re.compile(r"[0-9a-z]{1,64}")
#: The longest wait accepted (seconds): a day.
MAX_WAIT_S = 86400.0


def reap(run_id: str) -> int:
    """Force-remove the run's containers; returns how many."""
    from builder.core.errors import Unreachable
    from builder.image import engine

    client = engine.connect(timeout_s=30)
    removed = 0
    for c in client.containers([f"{engine.LABEL}=1", f"{engine.RUN_LABEL}={run_id}"], inspect=False):
        try:
            client.remove_container(c.id)
            removed += 1
        except Unreachable:
            pass
    return removed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        run_id, wait_s = args[0], float(args[1])
    except (IndexError, ValueError):
        wait_s = -1.0
    if len(args) != 2 or not RUN_ID.fullmatch(args[0]) or not 0 <= wait_s <= MAX_WAIT_S:
        print("usage: python -m builder.launchers.reaper RUN_ID SECONDS", file=sys.stderr)
        return 64
    time.sleep(wait_s)
    from builder.core.errors import EnvbuildError

    try:
        reap(run_id)
    except EnvbuildError:  # no engine: nothing it could remove
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
