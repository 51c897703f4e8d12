"""Read the transports NCCL chose from its ``NCCL_DEBUG=INFO`` output."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# anything before the prefix (a torchrun "[rank0]:" tag, a timestamp) is skipped
_PREFIX_RE = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?P<msg>.*)$"
)
_CHANNEL_RE = re.compile(
    r"Channel\s+\d+(?:/\d+)?\s*:\s*(?P<a>\d+)\[[^\]]*\]\s*->\s*(?P<b>\d+)\[[^\]]*\]"
    r"\s*(?P<dir>\[(?:send|receive)\])?\s*via\s+(?P<via>.+?)\s*$"
)
_USING_NETWORK_RE = re.compile(r"^Using network (?P<net>\S+)")
_NET_PLUGIN_RE = re.compile(r"^NET/(?P<net>[A-Za-z0-9_]+)\s*:\s*Using\s+(?P<devs>.*)$")
_INIT_RANK_RE = re.compile(r"\b(?:ncclCommInitRank\w*|comm 0x[0-9a-fA-F]+)\b.*?\brank (?P<rank>\d+)\b")
_VERSION_RE = re.compile(r"^NCCL version (?P<version>\S+)")
_IB_DEV_RE = re.compile(r"\[\d+\](?P<dev>[A-Za-z0-9_]+:\d+)/(?:IB|RoCE)")


def normalize_transport(via: str) -> str:
    """``"NET/Socket/0"`` -> ``"NET/Socket"``, ``"P2P/CUMEM/read"`` -> ``"P2P/CUMEM"``,
    ``"SHM/direct/direct"`` -> ``"SHM"``, ``"P2P/direct pointer"`` -> ``"P2P/direct"``."""
    parts = [p.strip() for p in via.strip().split("/")]
    head = parts[0].split()[0] if parts and parts[0] else via.strip()
    if head in ("NET", "P2P"):
        if len(parts) > 1 and parts[1]:
            return f"{head}/{parts[1].split()[0]}"
        return head
    return head


@dataclass
class NcclLog:
    """What one or more NCCL_DEBUG=INFO logs say, by global rank."""

    transports: dict[int, list[str]] = field(default_factory=dict)
    networks: dict[int, str] = field(default_factory=dict)
    ib_devices: dict[int, list[str]] = field(default_factory=dict)
    versions: dict[int, str] = field(default_factory=dict)


def parse(texts: str | Iterable[str]) -> NcclLog:
    """Parse NCCL INFO output (one text, or several: e.g. one per node)."""
    if isinstance(texts, str):
        texts = [texts]
    out = NcclLog()
    transports: dict[int, set[str]] = {}
    proc_rank: dict[tuple[str, str], int] = {}
    pending: list[tuple[tuple[str, str], str]] = []  # (process, msg) needing a rank
    for text in texts:
        for line in text.splitlines():
            m = _PREFIX_RE.search(line.rstrip())
            if not m:
                continue
            proc = (m.group("host"), m.group("pid"))
            msg = m.group("msg")
            ch = _CHANNEL_RE.search(msg)
            if ch:
                rank = int(ch.group("b") if ch.group("dir") == "[receive]" else ch.group("a"))
                transports.setdefault(rank, set()).add(normalize_transport(ch.group("via")))
                continue
            ir = _INIT_RANK_RE.search(msg)
            if ir:
                proc_rank.setdefault(proc, int(ir.group("rank")))
                continue
            if _USING_NETWORK_RE.match(msg) or _NET_PLUGIN_RE.match(msg) or _VERSION_RE.match(msg):
                pending.append((proc, msg))
    plugin_nets: dict[int, str] = {}
    for proc, msg in pending:
        found = proc_rank.get(proc)
        if found is None:
            continue
        rank = found
        if (u := _USING_NETWORK_RE.match(msg)) is not None:
            out.networks.setdefault(rank, u.group("net"))  # the choice: wins
        elif (n := _NET_PLUGIN_RE.match(msg)) is not None:
            devs = _IB_DEV_RE.findall(n.group("devs"))
            if devs:
                out.ib_devices.setdefault(rank, devs)
            plugin_nets.setdefault(rank, n.group("net"))
        elif (v := _VERSION_RE.match(msg)) is not None:
            out.versions.setdefault(rank, v.group("version"))
    for rank, net in plugin_nets.items():
        out.networks.setdefault(rank, net)
    out.transports = {r: sorted(t) for r, t in sorted(transports.items())}
    return out


def transports_by_rank(texts: str | Iterable[str]) -> dict[int, list[str]]:
    """``{global rank: sorted transports}`` from the channel lines of NCCL INFO output."""
    return parse(texts).transports
