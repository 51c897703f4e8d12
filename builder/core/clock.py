"""UTC timestamps in the one format of envbuild's documents and labels: ``2026-05-12T10:00:00Z``."""

from __future__ import annotations

import datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_stamp(epoch_s: float | None = None) -> str:
    """``epoch_s`` (seconds; default now), whole seconds dropped below, as ``2026-05-12T10:00:00Z``."""
    t = datetime.datetime.now(datetime.UTC) if epoch_s is None else datetime.datetime.fromtimestamp(epoch_s,
                                                                                                    datetime.UTC)
    return t.strftime(FORMAT)
