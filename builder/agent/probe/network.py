"""The network as NCCL and gloo see it: interfaces, default route, hostname addresses, ephemeral ports."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
from typing import Any

from .common import read_text as _read
from .common import run_text

# ioctl request numbers of <linux/sockios.h>.
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
# Interface flags of <linux/if.h>.
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


def prefixlen_from_netmask(mask: str) -> int | None:
    """``"255.255.240.0"`` gives 20; None for a non-contiguous or unparsable mask."""
    try:
        value = int.from_bytes(socket.inet_aton(mask), "big")
    except (OSError, TypeError):
        return None
    bits = bin(value)[2:].rstrip("0")
    if "0" in bits:
        return None
    return len(bits)


def parse_if_inet6(text: str) -> dict[str, list[tuple[str, int]]]:
    """``/proc/net/if_inet6`` text as ``{ifname: [(compressed address, prefixlen), ...]}`` (proc(5))."""
    out: dict[str, list[tuple[str, int]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 6 or len(parts[0]) != 32:
            continue
        try:
            packed = bytes.fromhex(parts[0])
            addr = socket.inet_ntop(socket.AF_INET6, packed)
            plen = int(parts[2], 16)
        except (ValueError, OSError):
            continue
        out.setdefault(parts[5], []).append((addr, plen))
    return out


def parse_proc_net_dev(text: str) -> list[str]:
    names: list[str] = []
    for line in text.splitlines()[2:]:
        name, sep, _ = line.partition(":")
        if sep and name.strip():
            names.append(name.strip())
    return names


def parse_proc_net_route(text: str) -> str | None:
    """The interface of the IPv4 default route in ``/proc/net/route`` text (lowest metric), or None."""
    best: tuple[int, str] | None = None
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 7 or parts[1] != "00000000":
            continue
        try:
            metric = int(parts[6])
        except ValueError:
            continue
        if best is None or metric < best[0]:
            best = (metric, parts[0])
    return best[1] if best else None


def parse_ip_json(text: str) -> list[dict[str, Any]]:
    """``ip -j addr`` output as interfaces in the probe's shape (unsorted)."""
    out: list[dict[str, Any]] = []
    for item in json.loads(text):
        flags = item.get("flags") or []
        addrs: list[dict[str, Any]] = []
        for a in item.get("addr_info") or []:
            if a.get("family") in ("inet", "inet6") and a.get("local"):
                addrs.append({"family": a["family"], "address": a["local"], "prefixlen": a.get("prefixlen")})
        out.append({
            "name": item.get("ifname"),
            "index": item.get("ifindex"),
            "up": "UP" in flags,
            "loopback": "LOOPBACK" in flags or item.get("link_type") == "loopback",
            "mtu": item.get("mtu"),
            "addresses": addrs,
        })
    return out


def _interfaces_stdlib(errors: list[str]) -> list[dict[str, Any]]:
    try:
        pairs: list[tuple[int | None, str]] = [(idx, name) for idx, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        try:
            pairs = [(None, n) for n in parse_proc_net_dev(_read("/proc/net/dev"))]
        except OSError as e:
            errors.append(f"network: no interface list: {e}")
            return []
    try:
        inet6 = parse_if_inet6(_read("/proc/net/if_inet6"))
    except OSError:
        inet6 = {}  # no IPv6 in this kernel or namespace
    import fcntl
    import struct

    out: list[dict[str, Any]] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for idx, name in pairs:
            entry: dict[str, Any] = {"name": name, "index": idx, "up": None, "loopback": False, "mtu": None,
                     "addresses": []}
            try:
                flags = int(_read(f"/sys/class/net/{name}/flags").strip(), 16)
                entry["up"] = bool(flags & _IFF_UP)
                entry["loopback"] = bool(flags & _IFF_LOOPBACK)
            except (OSError, ValueError):
                entry["loopback"] = name == "lo"
            with contextlib.suppress(OSError, ValueError):
                entry["mtu"] = int(_read(f"/sys/class/net/{name}/mtu").strip())
            ifreq = struct.pack("256s", name.encode("utf-8")[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, ifreq)[20:24])
                try:
                    mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFNETMASK, ifreq)[20:24])
                    plen = prefixlen_from_netmask(mask)
                except OSError:
                    plen = None
                entry["addresses"].append({"family": "inet", "address": addr, "prefixlen": plen})
            except OSError:
                pass  # EADDRNOTAVAIL: no IPv4 address on this interface
            for addr, plen in inet6.get(name, []):
                entry["addresses"].append({"family": "inet6", "address": addr, "prefixlen": plen})
            out.append(entry)
    finally:
        sock.close()
    return out


# Set to False to skip `ip -j addr` (tests compare both ways of listing interfaces).
USE_IP_COMMAND = True


def network_info(errors: list[str]) -> dict[str, Any]:
    interfaces: list[dict[str, Any]] | None = None
    if USE_IP_COMMAND and shutil.which("ip"):
        text = run_text(["ip", "-j", "addr"])
        if text:
            try:
                interfaces = parse_ip_json(text)
            except (ValueError, TypeError, AttributeError) as e:
                errors.append(f"network: unexpected `ip -j addr` output: {e}")
    if interfaces is None:
        interfaces = _interfaces_stdlib(errors)
    interfaces.sort(key=lambda i: i["name"] or "")
    try:
        default_if = parse_proc_net_route(_read("/proc/net/route"))
    except OSError:
        default_if = None
    host_addrs: list[str] = []
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, 0, socket.SOCK_STREAM):
            addr = str(info[4][0])
            if addr not in host_addrs:
                host_addrs.append(addr)
    except (OSError, UnicodeError) as e:
        errors.append(f"network: hostname does not resolve: {e}")
    port_range: list[int] | None = None
    with contextlib.suppress(OSError, ValueError):
        lo, hi = (int(x) for x in _read("/proc/sys/net/ipv4/ip_local_port_range").split())
        port_range = [lo, hi]
    return {"interfaces": interfaces, "default_route_interface": default_if,
            "hostname_addresses": host_addrs, "ip_local_port_range": port_range}


