"""Network-interface selection as NCCL and gloo read it (NVIDIA/nccl ``src/misc/socket.cc``)."""

from __future__ import annotations


def match_nccl_ifname(spec: str | None, names: list[str]) -> list[str]:
    """The names an ``NCCL_SOCKET_IFNAME`` value selects, in order (None or ``""``: all)."""
    if not spec:
        return list(names)
    negate = spec.startswith("^")
    spec = spec[1:] if negate else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    items = {s.split(":")[0] for s in spec.split(",")} - {""}

    def hit(name: str) -> bool:
        if exact:
            return name in items
        return any(name[:k] in items for k in range(1, len(name) + 1))

    return [n for n in names if hit(n) != negate]
