"""Which interface NCCL and gloo would pick on a node, from its report alone."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from builder.core.documents import Interface, NodeReport
from builder.core.netif import match_nccl_ifname


@dataclass(frozen=True)
class InterfacePick:
    """The interface a library would use: ``name`` and ``address`` (None when none
    qualifies), whether it is ``loopback``, and ``reason`` (the setting or rule used)."""

    name: str | None
    address: str | None
    loopback: bool
    reason: str


def usable_addresses(iface: Interface) -> list[str]:
    """IPv4 addresses, then IPv6 ones that are neither loopback nor link-local."""
    v4 = [a.address for a in iface.addresses if a.family == "inet"]
    v6 = []
    for a in iface.addresses:
        if a.family != "inet6":
            continue
        try:
            ip = ipaddress.ip_address(a.address.split("%")[0])
        except ValueError:
            continue
        if not (ip.is_loopback or ip.is_link_local):
            v6.append(a.address)
    return v4 + v6


def ordered_interfaces(report: NodeReport) -> list[Interface]:
    """The report's interfaces by index (those without one last), then name."""
    ifs = report.network.interfaces if report.network else []
    return sorted(ifs, key=lambda i: (i.index is None, i.index or 0, i.name))


def nccl_interface(report: NodeReport) -> InterfacePick:
    """The interface NCCL would pick on this node (its bootstrap interface)."""
    ifs = [i for i in ordered_interfaces(report) if usable_addresses(i)]
    names = [i.name for i in ifs]
    by_name = {i.name: i for i in ifs}
    spec = report.env.get("NCCL_SOCKET_IFNAME")
    if spec:
        order = [match_nccl_ifname(spec, names)]
        reason = f"NCCL_SOCKET_IFNAME={spec}"
    else:
        order = [match_nccl_ifname(s, names) for s in ("ib", "^docker,lo", "docker", "lo")]
        reason = "NCCL's default order (ib*, not docker*/lo, docker*, lo)"
    for chosen in order:
        if chosen:
            i = by_name[chosen[0]]
            return InterfacePick(i.name, usable_addresses(i)[0], bool(i.loopback), reason)
    return InterfacePick(None, None, False, reason)


def gloo_interface(report: NodeReport) -> InterfacePick:
    """The interface gloo would use, as :func:`nccl_interface` says it."""
    ifs = ordered_interfaces(report)
    by_name = {i.name: i for i in ifs}
    spec = report.env.get("GLOO_SOCKET_IFNAME")
    if spec:
        first = spec.split(",")[0].strip()
        i = by_name.get(first)
        if i is None or not usable_addresses(i):
            return InterfacePick(None, None, False, f"GLOO_SOCKET_IFNAME={spec}")
        return InterfacePick(first, usable_addresses(i)[0], bool(i.loopback), f"GLOO_SOCKET_IFNAME={spec}")
    for addr in report.network.hostname_addresses if report.network else []:
        try:
            ip = ipaddress.ip_address(addr.split("%")[0])
        except ValueError:
            continue
        owner = next((i.name for i in ifs if any(a.address == addr for a in i.addresses)), None)
        return InterfacePick(owner or ("lo" if ip.is_loopback else None), addr, ip.is_loopback,
                             f"hostname {report.hostname} resolves to {addr}")
    return InterfacePick(None, None, False, f"hostname {report.hostname} does not resolve")
