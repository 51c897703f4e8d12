"""Rule on the socket interfaces NCCL and gloo use between nodes [NCCL-ENV]."""

from __future__ import annotations

import re

from ..spec import ERROR
from .context import Ctx

_LOOPBACK = re.compile(r"\Alo[0-9]*(?::[0-9A-Za-z_.-]*)?\Z")
SOCKET_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def socket_ifname(c: Ctx) -> None:
    nodes = c.r.certify.nodes
    if nodes <= 1 or not c.valid("certify.nodes"):
        return
    for name, value in c.r.env.items():
        if name in SOCKET_VARIABLES and loopback_only(name, value):
            c.add(ERROR, "socket-ifname-loopback", [f"env.{name}", "certify.nodes"],
                  f"{name}={value} selects only the loopback interface; ranks on {nodes} nodes cannot reach each "
                  "other over it (remove it, or name the interface the nodes share, e.g. eth0)",
                  "NCCL-ENV, multinode.md (M)")


def loopback_only(variable: str, value: str) -> bool:
    """True when ``variable`` set to ``value`` selects only loopback (NCCL-ENV): NCCL reads name prefixes (``^``
    excludes, ``=`` exact), gloo exact names; an empty list is not loopback-only."""
    text = value.strip()
    if variable == "NCCL_SOCKET_IFNAME":
        if text.startswith("^"):
            return False
        text = text[1:] if text.startswith("=") else text
    names = [n.strip() for n in text.split(",") if n.strip()]
    return bool(names) and all(_LOOPBACK.fullmatch(n) for n in names)
