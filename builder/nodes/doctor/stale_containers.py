"""The ``stale-containers`` check: no leftover envbuild containers or expired run networks on this
engine; ``--fix`` removes them (and only them)."""

from __future__ import annotations

import datetime
from typing import Any

from builder.core.errors import EnvbuildError

from ..report import Node
from .base import DEFAULT_STALE_AFTER_S, FAIL, PASS, SKIP, Check, Options

#: Seconds a stopped run must have been stopped before it counts as stale (its launcher may still be reading its logs).
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
    """Containers left over from earlier runs, by name: a run is stale when its newest container
    started over ``stale_after_s`` (seconds) ago, or all stopped over ``STOPPED_GRACE_S`` ago."""
    from builder.image.engine import LABEL, RUN_LABEL

    now = now or datetime.datetime.now(datetime.UTC)
    found = client.containers([LABEL, *labels])
    groups: dict[str, list[Any]] = {}
    for c in found:
        if c.id in exclude:
            continue
        groups.setdefault((c.labels or {}).get(RUN_LABEL) or c.id, []).append(c)
    stale: list[Any] = []
    grace = min(stale_after_s, STOPPED_GRACE_S)
    for members in groups.values():
        states = [c.doc.get("State") or {} for c in members]
        running = any(s.get("Running") for s in states)
        started = [t for t in (_parse_time(s.get("StartedAt")) for s in states) if t]
        created = [t for t in (_parse_time(c.doc.get("Created")) for c in members) if t]
        newest = max(started + created, default=None)
        finished = [t for t in (_parse_time(s.get("FinishedAt")) for s in states) if t]
        if newest is not None and (now - newest).total_seconds() > stale_after_s:
            stale.extend(members)
        elif not running:
            last = max(finished + created, default=None)
            if last is None or (now - last).total_seconds() > grace:
                stale.extend(members)
    return sorted(stale, key=lambda c: c.name)


def _remove(client: Any, stale: list[Any], labels: list[str], lines: list[str]) -> Check:
    """Remove ``stale``, then the stale networks (only once their containers are gone)."""
    from builder.image.engine import LABEL

    removed, failed = [], []
    for c in stale:
        if LABEL not in (c.labels or {}):  # belt and braces: never touch what envbuild did not start
            continue
        try:
            client.remove_container(c.id)
            removed.append(c.name)
        except EnvbuildError as e:
            failed.append(f"{c.name}: {e.message}")
    nets = [n["name"] for n in client.remove_stale_networks(label_filter=labels)]
    data = {"removed": removed, "removed_networks": nets}
    if failed:
        return Check("stale-containers", FAIL, "could not remove: " + "; ".join(failed),
                     "remove them by hand: docker rm -f NAME", lines, data)
    return Check("stale-containers", PASS, f"removed {len(removed)} stale envbuild containers: "
                 + ", ".join(removed) + (f"; {len(nets)} stale networks: " + ", ".join(nets) if nets else ""),
                 None, lines, data)


def check_stale_containers(nodes: list[Node], opts: Options) -> Check:
    """``fail`` listing stale containers and networks, or with ``opts.fix`` remove them; ``skip`` without an engine."""
    from builder.image.engine import LABEL, connect

    client = opts.client
    if client is None:
        try:
            client = connect(timeout_s=30)
        except EnvbuildError as e:
            return Check("stale-containers", SKIP, f"no Docker engine here ({e.message.split(';')[0]})", checked=False)
    exclude = tuple(cid for n in nodes if (cid := getattr(n.target, "container_id", None)))
    stale = stale_containers(client, tuple(opts.labels), opts.stale_after_s, exclude)
    nets = [n["name"] for n in client.stale_networks(label_filter=list(opts.labels))]
    scope = f"label {LABEL}" + "".join(f", {lab}" for lab in opts.labels)
    lines = [f"{c.name} ({c.id[:12]}, {c.status}, run {(c.labels or {}).get('envbuild.run', '-')})" for c in stale]
    lines += [f"network {n} (its deadline passed, no container)" for n in nets]
    if not stale and not nets:
        return Check("stale-containers", PASS, f"no stale containers or networks ({scope})")
    if opts.fix:
        return _remove(client, stale, list(opts.labels), lines)
    found = [f"{len(stale)} stale envbuild containers: " + ", ".join(c.name for c in stale)] if stale else []
    found += [f"{len(nets)} stale envbuild networks: " + ", ".join(nets)] if nets else []
    return Check("stale-containers", FAIL, "; ".join(found),
                 "`envbuild doctor --fix` removes them (only containers and networks labelled envbuild)", lines,
                 {"stale": [c.name for c in stale], "stale_networks": nets})
