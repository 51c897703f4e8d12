"""The ``stale-containers`` check: no leftover containers labelled ``envbuild`` on this
engine; ``--fix`` removes them (and only them)."""

from __future__ import annotations

import datetime
from typing import Any

from builder.core.errors import EnvbuildError

from ..report import Node
from .base import DEFAULT_STALE_AFTER_S, FAIL, PASS, SKIP, Check, Options

#: Seconds a stopped run must have been stopped before it counts as stale (its launcher
#: may still be reading its logs).
STOPPED_GRACE_S = 60.0


def _parse_time(text: str | None) -> datetime.datetime | None:
    """An engine timestamp (``2024-05-01T10:00:00.123456789Z``) in UTC; None for none."""
    if not text or text.startswith("0001-"):
        return None
    text = text.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


def stale_containers(client: Any, labels: tuple[str, ...] = (), stale_after_s: float = DEFAULT_STALE_AFTER_S,
                     exclude: tuple[str, ...] = (), now: datetime.datetime | None = None) -> list[Any]:
    """Containers labelled ``envbuild`` (plus ``labels``) left over from earlier runs.

    Containers are grouped by their ``envbuild.run`` label (one group per container
    without it). A group is stale when its newest container started more than
    ``stale_after_s`` seconds ago, or when none of its containers runs and the last one
    stopped more than ``min(stale_after_s, STOPPED_GRACE_S)`` seconds ago. Containers
    whose ID is in ``exclude`` (the nodes being checked) are never stale.

    Returns:
        docker ``Container`` objects, sorted by name.
    """
    from builder.image.engine import LABEL, RUN_LABEL

    now = now or datetime.datetime.now(datetime.UTC)
    found = client.containers.list(all=True, filters={"label": [LABEL, *labels]})
    groups: dict[str, list[Any]] = {}
    for c in found:
        if c.id in exclude:
            continue
        groups.setdefault((c.labels or {}).get(RUN_LABEL) or c.id, []).append(c)
    stale: list[Any] = []
    grace = min(stale_after_s, STOPPED_GRACE_S)
    for members in groups.values():
        states = [c.attrs.get("State") or {} for c in members]
        running = any(s.get("Running") for s in states)
        started = [t for t in (_parse_time(s.get("StartedAt")) for s in states) if t]
        created = [t for t in (_parse_time(c.attrs.get("Created")) for c in members) if t]
        newest = max(started + created, default=None)
        finished = [t for t in (_parse_time(s.get("FinishedAt")) for s in states) if t]
        if newest is not None and (now - newest).total_seconds() > stale_after_s:
            stale.extend(members)
        elif not running:
            last = max(finished + created, default=None)
            if last is None or (now - last).total_seconds() > grace:
                stale.extend(members)
    return sorted(stale, key=lambda c: c.name)




def _remove(stale: list[Any], lines: list[str]) -> Check:
    """Remove ``stale`` (forced): ``pass`` listing what was removed, ``fail`` naming what
    could not be."""
    import docker.errors

    from builder.image.engine import LABEL

    removed, failed = [], []
    for c in stale:
        if LABEL not in (c.labels or {}):  # belt and braces: never touch what envbuild did not start
            continue
        try:
            c.remove(force=True)
            removed.append(c.name)
        except docker.errors.NotFound:
            removed.append(c.name)
        except docker.errors.APIError as e:
            failed.append(f"{c.name}: {e.explanation or e}")
    if failed:
        return Check("stale-containers", FAIL, "could not remove: " + "; ".join(failed),
                     "remove them by hand: docker rm -f NAME", lines, {"removed": removed})
    return Check("stale-containers", PASS, f"removed {len(removed)} stale envbuild containers: "
                 + ", ".join(removed), None, lines, {"removed": removed})


def check_stale_containers(nodes: list[Node], opts: Options) -> Check:
    """``fail`` listing stale envbuild containers on this engine; with ``opts.fix``
    remove them (forced) and ``pass`` listing what was removed. ``skip`` without an engine."""
    from builder.image.engine import LABEL, connect

    client = opts.client
    if client is None:
        try:
            client = connect(timeout_s=30)
        except EnvbuildError as e:
            return Check("stale-containers", SKIP, f"no Docker engine here ({e.message.split(';')[0]})",
                         checked=False)
    exclude = tuple(cid for n in nodes if (cid := getattr(n.target, "container_id", None)))
    stale = stale_containers(client, tuple(opts.labels), opts.stale_after_s, exclude)
    scope = f"label {LABEL}" + "".join(f", {lab}" for lab in opts.labels)
    lines = [f"{c.name} ({c.short_id}, {c.status}, run {(c.labels or {}).get('envbuild.run', '-')})" for c in stale]
    if not stale:
        return Check("stale-containers", PASS, f"no stale containers ({scope})")
    if not opts.fix:
        return Check("stale-containers", FAIL, f"{len(stale)} stale envbuild containers: "
                     + ", ".join(c.name for c in stale),
                     "`envbuild doctor --fix` removes them (only containers labelled envbuild)", lines,
                     {"stale": [c.name for c in stale]})
    return _remove(stale, lines)
