"""The ``port`` check: the master's rendezvous port and a sample of every node's ephemeral range are
reachable from the peers (pytorch#79388, #52848, NVIDIA/nccl#388)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import FAIL, PASS, UNKNOWN, Check, port_range

if TYPE_CHECKING:
    from .network import Round


def port_check(rnd: Round) -> Check:
    opts, master = rnd.opts, rnd.master
    data = {"results": {k: v.to_dict() for k, v in rnd.results.items()}, "plan": rnd.meta}
    blocked, short, in_use = [], [], []
    if master.name in rnd.bound:
        state = rnd.bound[master.name].ports.get(str(opts.port))
        if state != "listening":
            in_use.append(f"port {opts.port}/tcp on {master.name}: {state} "
                          "(another job or a stale rendezvous holds it)")
    for tid, m in rnd.meta.items():
        res = rnd.results.get(tid)
        if res is None or res.status == "ok" or m["kind"] == "interface":
            continue
        line = f"{m['from']} -> {m['to']} ({m['host']}) port {m['port']}/tcp: {res.status} ({res.detail})"
        blocked.append(line if m["kind"] == "rendezvous" else line + " [ephemeral range]")
        short.append(f"{m['from']} -> {m['to']} port {m['port']}/tcp ({res.status})")
    if blocked or in_use:
        lo, hi = port_range(master)
        msg = "; ".join(in_use + ([f"firewall: {', '.join(short)}"] if short else []))
        fix = (f"open TCP {opts.port} (rendezvous) on {master.name} to every node and the ephemeral range "
               f"{lo}-{hi} between nodes (NCCL and gloo listen on random ports) in iptables/firewalld/"
               "security groups, or pick a free --master-port (pytorch#79388, NVIDIA/nccl#388)")
        return Check("port", FAIL, msg, fix, in_use + blocked, data)
    if rnd.unknown:
        return Check("port", UNKNOWN, "; ".join(rnd.unknown), "check that python3 runs on every node", rnd.unknown)
    n_conn = sum(1 for m in rnd.meta.values() if m["kind"] != "interface")
    others = len(rnd.live) - 1
    return Check("port", PASS, f"{n_conn} connections ok: rendezvous {master.name}:{opts.port} from "
                 f"{others} other node{'s' if others != 1 else ''}, {rnd.samples} ephemeral "
                 f"port{'s' if rnd.samples != 1 else ''} of every node from every peer", None, [], data)
