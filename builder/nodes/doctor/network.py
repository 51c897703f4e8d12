"""One round of real TCP listens and connects on the live nodes, shared by ``port`` and ``interface``:
the master's rendezvous port, a sample of each node's ephemeral range, every address NCCL/gloo would use."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError

from ..report import Node
from ..sources.base import Running
from .agent_output import Connect, Listen, Probe, json_line, last_json
from .base import AGENT_START_S, SKIP, Check, Options, live, no_answer, port_range, start_all, stderr_tail
from .interface import interface_check, other_addresses, report_interface_problems
from .port import port_check


@dataclass
class Round:
    """One round on the ``live`` nodes: listeners (``bound``), planned probes (``meta``), ``results``, ``unknown``."""

    live: list[Node]
    opts: Options
    backend: str
    want_port: bool
    want_if: bool
    master: Node
    samples: int
    bound: dict[str, Listen] = field(default_factory=dict)
    plan: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, Probe] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    def expected(self, n: Node) -> int:
        per_peer = self.samples if self.want_port else 0
        if self.want_if:
            per_peer += len(other_addresses(n, self.backend, self.want_port))
        rdzv = len(self.live) - 1 if (self.want_port and n is self.master) else 0
        return per_peer * (len(self.live) - 1) + rdzv

    def listen(self) -> dict[str, Running | EnvbuildError]:
        """Start a listener on every live node; fills :attr:`bound` and :attr:`unknown`."""
        deadline = AGENT_START_S + self.opts.connect_timeout_s + 10

        def args(n: Node) -> list[str]:
            lo, hi = port_range(n)
            ports = str(self.opts.port) if (self.want_port and n is self.master) else ""
            return ["listen", "--ports", ports, "--sample", str(self.samples), "--range", f"{lo}-{hi}",
                    "--deadline-s", str(deadline), "--expect-total", str(self.expected(n))]

        listeners = start_all(self.live, args)
        for n in self.live:
            r = listeners[n.name]
            why = None
            try:
                doc = None if isinstance(r, EnvbuildError) else json_line(r.readline(AGENT_START_S), Listen, n.source)
            except EnvbuildError as e:
                doc, why = None, str(e)
                if isinstance(r, Running):
                    r.kill()
            if doc is None:
                why = why or (str(r) if isinstance(r, EnvbuildError) else stderr_tail(r))
                self.unknown.append(f"{n.name}: could not listen ({why})")
                continue
            self.bound[n.name] = doc
        return listeners

    def _probe(self, src: Node, tid: str, host: str | None, port: int, **meta: Any) -> None:
        self.plan[src.name].append({"id": tid, "host": host, "port": port})
        self.meta[tid] = {"kind": meta.pop("kind"), "from": src.name, "to": meta.pop("to"), "port": port,
                          "host": host, **meta}

    def make_plan(self) -> None:
        """Who connects where: the rendezvous, ephemeral samples, interface addresses."""
        self.plan = {n.name: [] for n in self.live}
        master, port = self.master, self.opts.port
        if self.want_port and master.name in self.bound and self.bound[master.name].ports.get(str(port)) == "listening":
            for n in self.live:
                if n is not master and n.name in self.bound:
                    self._probe(n, f"rdzv:{n.name}", master.address, port, kind="rendezvous", to=master.name)
        for dst in self.live:
            if dst.name not in self.bound:
                continue
            sample = self.bound[dst.name].sample
            picks = other_addresses(dst, self.backend, self.want_port)
            for src in self.live:
                if src is dst or src.name not in self.bound:
                    continue
                if self.want_port:
                    for p in sample[:self.samples]:
                        self._probe(src, f"eph:{src.name}:{dst.name}:{p}", dst.address, p, kind="ephemeral",
                                    to=dst.name)
                if self.want_if and sample:
                    for pick in picks:
                        self._probe(src, f"if:{src.name}:{dst.name}:{pick.address}", pick.address, sample[0],
                                    kind="interface", to=dst.name, iface=pick.name)

    def connect(self) -> None:
        """Run every node's planned connects; fills :attr:`results` and :attr:`unknown`."""
        with_targets = [n for n in self.live if self.plan[n.name]]
        connectors = start_all(with_targets, lambda n: [
            "connect", "--from", n.name, "--targets", json.dumps(self.plan[n.name]),
            "--timeout-s", str(self.opts.connect_timeout_s)])
        for n in with_targets:
            r = connectors[n.name]
            try:
                if isinstance(r, EnvbuildError):
                    raise r
                done = r.wait(AGENT_START_S + self.opts.connect_timeout_s + 10)
                doc = last_json(done.stdout, Connect, n.source)
                if doc is None:
                    raise EnvbuildError(f"agent printed no result: {done.stderr.strip()[-200:]}")
                self.results.update(doc.results)
            except EnvbuildError as e:
                self.unknown.append(f"{n.name}: could not connect out ({e})")

    def reach_failures(self) -> list[str]:
        """Interface addresses a peer could not reach."""
        out = []
        for tid, m in self.meta.items():
            res = self.results.get(tid)
            if m["kind"] == "interface" and res is not None and res.status != "ok":
                out.append(f"{m['to']}'s {m['iface']} address {m['host']} is not reachable from {m['from']}: "
                           f"{res.status} ({res.detail})")
        return out


def run_round(live_nodes: list[Node], opts: Options, backend: str, want_port: bool, want_if: bool) -> Round:
    """Listen, plan, connect; the listeners are stopped after. EnvbuildError (exit 2): ``--master`` not live."""
    master = next((n for n in live_nodes if n.name == opts.master), live_nodes[0])
    if opts.master and master.name != opts.master:
        raise EnvbuildError("is not a live node here", field="--master", value=opts.master)
    rnd = Round(live_nodes, opts, backend, want_port, want_if, master, max(1, opts.ephemeral_samples))
    listeners = rnd.listen()
    rnd.make_plan()
    rnd.connect()
    for r in listeners.values():
        if isinstance(r, Running):
            r.kill()
    return rnd


def network_checks(nodes: list[Node], opts: Options, backend: str) -> list[Check]:
    """The ``port`` and ``interface`` checks from one round on the live nodes."""
    want_port, want_if = "port" in opts.checks, "interface" in opts.checks
    out: list[Check] = []
    live_nodes = live(nodes)
    if_fail, if_seen = report_interface_problems([n for n in nodes if n.ok], backend) if want_if else ([], 0)
    if want_if and not if_seen:
        out.append(no_answer("interface", nodes)
                   or Check("interface", SKIP, "no report has a network section", checked=False))
        want_if = False
        if not want_port:
            return out
    if len(live_nodes) < 2:
        if want_port:
            why = ("one live node: nothing to connect" if live_nodes
                   else "needs live nodes (report files give reports only)")
            out.append(Check("port", SKIP, why, checked=False))
        if want_if:
            out.append(interface_check(if_fail, [], reach_checked=False))
        return out
    rnd = run_round(live_nodes, opts, backend, want_port, want_if)
    if want_port:
        out.append(port_check(rnd))
    if want_if:
        out.append(interface_check(if_fail, rnd.reach_failures(), reach_checked=not rnd.unknown))
    return out
