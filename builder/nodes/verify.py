"""Compare node reports: which node differs in what, and how bad that is.

Rules (each with its source), applied to every node with a valid report:

========================  ======================================================  =====
rule                      fields                                                   level
========================  ======================================================  =====
must-match                ``torch.version``, ``torch.cuda``, ``nccl.loaded``        fail
                          (the NCCL x.y.z each rank loads), ``torch.cudnn``,
                          ``python.version``, ``image.digest``
floor                     ``driver`` >= the minimum of the CUDA torch was built     fail
                          for (``cuda_driver`` in ``builder/recipe/data/compat.yaml``:
                          below the minor-version-compatibility floor fails,
                          below the GA driver warns)
interface                 ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` that       fail
                          match no interface of the node
should-match              ``driver.branch``, ``kernel``, ``os``, ``glibc``,          warn
                          ``torch.nccl_compiled``, ``gpu.models``, ``image.id``,
                          every ``NCCL_*``/``GLOO_*``/``TORCH_*`` variable
nccl-copies               several libnccl files or ``nvidia-nccl-*`` packages on     warn
                          one node (torch loads one, the system may load another)
probe-errors              the probe met problems on a node                           warn
informational             hostname, addresses, image reference, driver, /dev/shm    (shown)
unreachable / invalid     a node that could not be checked                          unknown
========================  ======================================================  =====

Sources: NVIDIA/nccl ``src/init.cc`` ("Mismatched NCCL version detected" from 2.23.4) and
NVIDIA/nccl#1267, #1328 (mixed NCCL before that); pytorch#116977 (compiled vs loaded NCCL);
NVIDIA CUDA release notes Table 3 and the minor-version-compatibility guide (driver
floors); Google cluster-health-scanner ``configcheck`` (driver, CUDA, NCCL, NCCL env and
container diffed against a golden config); NCCL ``src/misc/socket.cc`` (interface
selection, ``NCCL_SOCKET_IFNAME`` syntax); PyTorch ``ProcessGroupGloo`` (GLOO_SOCKET_IFNAME).

Exit codes in the style of Meta GCM health checks, worst wins: 0 all match, 1 warnings
only, 2 a must-match, floor or interface rule broken, 3 a node could not be checked.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from builder.core.netif import match_nccl_ifname
from builder.core.errors import ExitCode
from builder.core.inputs import one_line
from .report import Node, get

FAIL, WARN, UNKNOWN = "fail", "warn", "unknown"
_LEVEL_CODE = {FAIL: ExitCode.CHECK_FAILED, WARN: ExitCode.WARNINGS, UNKNOWN: ExitCode.UNREACHABLE}

#: Environment prefixes compared between nodes (should-match).
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")

SRC_NCCL_MISMATCH = "NVIDIA/nccl src/init.cc (>= 2.23.4), NVIDIA/nccl#1267, #1328"
SRC_CONFIGCHECK = "Google cluster-health-scanner configcheck"
SRC_DRIVER = "NVIDIA CUDA release notes Table 3; minor-version compatibility guide"
SRC_IFNAME = "NCCL src/misc/socket.cc; PyTorch ProcessGroupGloo; NVIDIA/nccl#286, #1581"
SRC_COPIES = "compat.md gotcha 3; pytorch#116977"


def _driver_branch(doc: dict) -> str | None:
    drv = doc.get("driver")
    return drv.split(".")[0] if drv else None


def _gpu_models(doc: dict) -> str | None:
    names = sorted({g["name"] for g in doc.get("gpus") or []})
    return ", ".join(names) if names else None


def _os(doc: dict) -> str | None:
    o = doc.get("os") or {}
    if not o.get("id"):
        return None
    return f"{o['id']} {o.get('version_id') or ''}".strip()


@dataclass(frozen=True)
class Rule:
    """One compared field: ``name`` shown in output, ``level`` when values differ
    (``fail``/``warn``), ``value`` extracts it from a report (None: absent), ``source``
    says why it matters, ``skip_absent``: nodes without a value are left out of the
    comparison (a warning names them) instead of counting as a different value."""

    name: str
    level: str
    value: Callable[[dict], Any]
    source: str
    skip_absent: bool = False


MUST_MATCH = (
    Rule("torch.version", FAIL, lambda d: get(d, "torch.version"), "collectives and DDP need one PyTorch release"),
    Rule("torch.cuda", FAIL, lambda d: get(d, "torch.cuda"), "torch.version.cuda: the CUDA torch was built with"),
    Rule("nccl.loaded", FAIL, lambda d: get(d, "nccl.loaded.version"), SRC_NCCL_MISMATCH),
    Rule("torch.cudnn", FAIL, lambda d: get(d, "torch.cudnn"), "cuDNN differences change numerics and kernels"),
    Rule("python.version", FAIL, lambda d: get(d, "python.version"), "pickled objects cross ranks"),
    Rule("image.digest", FAIL, lambda d: get(d, "image.digest"), "one image everywhere", skip_absent=True),
)

SHOULD_MATCH = (
    Rule("driver.branch", WARN, _driver_branch, SRC_CONFIGCHECK),
    Rule("kernel", WARN, lambda d: d.get("kernel"), SRC_CONFIGCHECK),
    Rule("os", WARN, _os, SRC_CONFIGCHECK),
    Rule("glibc", WARN, lambda d: d.get("glibc"), SRC_CONFIGCHECK),
    Rule("torch.nccl_compiled", WARN, lambda d: get(d, "torch.nccl_compiled"), "pytorch#116977"),
    Rule("gpu.models", WARN, _gpu_models, SRC_CONFIGCHECK),
    Rule("image.id", WARN, lambda d: get(d, "image.id"), "the engine's image ID (the digest is unknown for local images)",
         skip_absent=True),
)


@dataclass
class Finding:
    """One result line.

    Attributes:
        level: ``fail``, ``warn`` or ``unknown`` (exit 2, 1, 3).
        rule: ``must-match``, ``should-match``, ``floor``, ``interface``, ``nccl-copies``,
            ``probe-errors``, ``unreachable`` or ``invalid``.
        field: the report field concerned, e.g. ``"nccl.loaded"`` or ``"env.NCCL_DEBUG"``.
        message: one line, e.g. ``"nccl.loaded: 2.20.5 on node-1; 2.19.3 on node-2"``.
        groups: for differences: ``[(value, [node, ...]), ...]``, smallest group first.
        nodes: the nodes concerned.
        source: the fact behind the rule.
    """

    level: str
    rule: str
    field: str | None
    message: str
    groups: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    source: str = ""

    def to_json(self) -> dict:
        """The finding as JSON-ready data (``groups`` as ``[{"value", "nodes"}]``)."""
        return {"level": self.level, "rule": self.rule, "field": self.field,
                "message": self.message, "nodes": list(self.nodes), "source": self.source,
                "groups": [{"value": v, "nodes": list(n)} for v, n in self.groups]}


def exit_code(findings: list[Finding]) -> ExitCode:
    """The worst level among ``findings``: 0 none, 1 warn, 2 fail, 3 unknown."""
    return max((_LEVEL_CODE[f.level] for f in findings), default=ExitCode.OK)


def show(value: Any) -> str:
    """A value as shown in output: ``None`` is ``(absent)``."""
    return "(absent)" if value is None else str(value)


def group_values(pairs: list[tuple[str, Any]]) -> list[tuple[Any, list[str]]]:
    """``[(node, value), ...]`` grouped by value: ``[(value, [nodes])]``, the smallest
    group first (ties: the group whose first node comes first)."""
    groups: dict[str, tuple[Any, list[str], int]] = {}
    for i, (node, value) in enumerate(pairs):
        key = repr(value)
        if key not in groups:
            groups[key] = (value, [], i)
        groups[key][1].append(node)
    ordered = sorted(groups.values(), key=lambda g: (len(g[1]), g[2]))
    return [(v, nodes) for v, nodes, _ in ordered]


def describe_groups(name: str, groups: list[tuple[Any, list[str]]]) -> str:
    """``"nccl.loaded: 2.20.5 on node-1; 2.19.3 on node-2, node-3"``."""
    return f"{name}: " + "; ".join(f"{show(v)} on {', '.join(n)}" for v, n in groups)


def compare(nodes: list[Node], rule: Rule, kind: str) -> list[Finding]:
    """Apply one :class:`Rule` to the nodes with reports; a finding when values differ."""
    pairs = [(n.name, rule.value(n.report)) for n in nodes if n.ok]
    out = []
    if rule.skip_absent:
        absent = [n for n, v in pairs if v is None]
        pairs = [(n, v) for n, v in pairs if v is not None]
        if absent and pairs:
            out.append(Finding(WARN, kind, rule.name,
                               f"{rule.name}: unknown on {', '.join(absent)}; not compared there",
                               nodes=absent, source=rule.source))
    groups = group_values(pairs)
    if len(groups) > 1:
        out.insert(0, Finding(rule.level, kind, rule.name, describe_groups(rule.name, groups), groups,
                              [n for n, _ in pairs], rule.source))
    return out


def env_findings(nodes: list[Node]) -> list[Finding]:
    """Should-match findings for every ``NCCL_*``, ``GLOO_*``, ``TORCH_*`` variable set on
    some node and not the same (or unset) on another."""
    ok = [n for n in nodes if n.ok]
    names = sorted({k for n in ok for k in n.report.get("env", {}) if k.startswith(ENV_PREFIXES)})
    out = []
    for var in names:
        rule = Rule(f"env.{var}", WARN, lambda d, var=var: d.get("env", {}).get(var),
                    "NCCL/gloo/torch knobs should agree on every node (configcheck)")
        out.extend(compare(nodes, rule, "should-match"))
    return out


def _parse_version(text: str) -> Version | None:
    try:
        return Version(text)
    except (InvalidVersion, TypeError):
        return None


def driver_floor_findings(nodes: list[Node], floors: dict[str, dict] | None = None) -> list[Finding]:
    """Floor findings: a node's driver below what its torch's CUDA needs.

    ``floors`` maps CUDA ``"12.8"`` to ``{"ga": "570.26", "minor_compat": "525.60.13"}``
    (default: ``cuda_driver`` of ``builder/recipe/data/compat.yaml``). Below ``minor_compat``:
    fail (CUDA cannot run); below ``ga``: warn (minor-version compatibility only: no PTX
    JIT, some APIs fail). Nodes without a driver or a CUDA torch are not checked.
    """
    if floors is None:
        from builder.recipe.facts import facts

        floors = {cuda: {"ga": row.ga, "minor_compat": row.minor_compat} for cuda, row in facts().cuda_driver.items()}
    out = []
    for n in nodes:
        if not n.ok:
            continue
        drv, cuda = n.report.get("driver"), get(n.report, "torch.cuda")
        if not drv or not cuda:
            continue
        key = ".".join(cuda.split(".")[:2])
        floor = floors.get(key)
        if floor is None:
            out.append(Finding(WARN, "floor", "driver", f"{n.name}: no driver floor known for CUDA {cuda}",
                               nodes=[n.name], source=SRC_DRIVER))
            continue
        have = _parse_version(drv)
        if have is None:
            continue
        if have < Version(str(floor["minor_compat"])):
            out.append(Finding(FAIL, "floor", "driver",
                               f"driver: {drv} on {n.name} is below {floor['minor_compat']}, the oldest "
                               f"that runs CUDA {cuda} (torch {get(n.report, 'torch.version')}); "
                               f"full support needs >= {floor['ga']}", nodes=[n.name], source=SRC_DRIVER))
        elif have < Version(str(floor["ga"])):
            out.append(Finding(WARN, "floor", "driver",
                               f"driver: {drv} on {n.name} is below {floor['ga']} (CUDA {cuda} GA): minor-version "
                               "compatibility only (no PTX JIT, some APIs fail)", nodes=[n.name], source=SRC_DRIVER))
    return out


# --------------------------------------------------------------------------- interfaces


def _usable_addresses(iface: dict) -> list[str]:
    """IPv4 addresses, then IPv6 ones that are neither loopback nor link-local."""
    v4 = [a["address"] for a in iface.get("addresses", []) if a["family"] == "inet"]
    v6 = []
    for a in iface.get("addresses", []):
        if a["family"] != "inet6":
            continue
        try:
            ip = ipaddress.ip_address(a["address"].split("%")[0])
        except ValueError:
            continue
        if not (ip.is_loopback or ip.is_link_local):
            v6.append(a["address"])
    return v4 + v6


def _ordered_interfaces(doc: dict) -> list[dict]:
    ifs = get(doc, "network.interfaces") or []
    return sorted(ifs, key=lambda i: (i.get("index") is None, i.get("index") or 0, i["name"]))


def nccl_interface(doc: dict) -> dict:
    """The interface NCCL would pick on this node (its bootstrap interface).

    Returns ``{"name": str|None, "address": str|None, "loopback": bool, "reason": str}``.
    With ``NCCL_SOCKET_IFNAME`` set: the first interface (by index) it selects that has a
    usable address, else name None. Unset: NCCL's own order (``ncclFindInterfaces``):
    ``ib*``, then anything but ``docker*``/``lo``, then ``docker*``, then ``lo``.
    """
    ifs = [i for i in _ordered_interfaces(doc) if _usable_addresses(i)]
    names = [i["name"] for i in ifs]
    by_name = {i["name"]: i for i in ifs}
    spec = get(doc, "env.NCCL_SOCKET_IFNAME")
    if spec:
        order = [match_nccl_ifname(spec, names)]
        reason = f"NCCL_SOCKET_IFNAME={spec}"
    else:
        order = [match_nccl_ifname(s, names) for s in ("ib", "^docker,lo", "docker", "lo")]
        reason = "NCCL's default order (ib*, not docker*/lo, docker*, lo)"
    for chosen in order:
        if chosen:
            i = by_name[chosen[0]]
            return {"name": i["name"], "address": _usable_addresses(i)[0],
                    "loopback": bool(i.get("loopback")), "reason": reason}
    return {"name": None, "address": None, "loopback": False, "reason": reason}


def gloo_interface(doc: dict) -> dict:
    """The interface gloo would use, in the same shape as :func:`nccl_interface`.

    ``GLOO_SOCKET_IFNAME`` (a comma list of exact names; the first is taken here) or, when
    unset, the address the hostname resolves to (``network.hostname_addresses``), which
    is loopback on hosts whose ``/etc/hosts`` maps the hostname to 127.0.x.x.
    """
    ifs = _ordered_interfaces(doc)
    by_name = {i["name"]: i for i in ifs}
    spec = get(doc, "env.GLOO_SOCKET_IFNAME")
    if spec:
        first = spec.split(",")[0].strip()
        i = by_name.get(first)
        if i is None or not _usable_addresses(i):
            return {"name": None, "address": None, "loopback": False, "reason": f"GLOO_SOCKET_IFNAME={spec}"}
        return {"name": first, "address": _usable_addresses(i)[0], "loopback": bool(i.get("loopback")),
                "reason": f"GLOO_SOCKET_IFNAME={spec}"}
    for addr in get(doc, "network.hostname_addresses") or []:
        try:
            ip = ipaddress.ip_address(addr.split("%")[0])
        except ValueError:
            continue
        owner = next((i["name"] for i in ifs if any(a["address"] == addr for a in i.get("addresses", []))), None)
        return {"name": owner or ("lo" if ip.is_loopback else None), "address": addr,
                "loopback": ip.is_loopback, "reason": f"hostname {doc.get('hostname')} resolves to {addr}"}
    return {"name": None, "address": None, "loopback": False,
            "reason": f"hostname {doc.get('hostname')} does not resolve"}


def missing_interface_findings(nodes: list[Node]) -> list[Finding]:
    """Fail for every node whose ``NCCL_SOCKET_IFNAME`` selects no interface with an
    address, or whose ``GLOO_SOCKET_IFNAME`` names one it does not have. Nodes whose
    report has no ``network`` section are not checked."""
    out = []
    for n in nodes:
        if not n.ok or get(n.report, "network") is None:
            continue
        have = ", ".join(i["name"] for i in _ordered_interfaces(n.report)) or "none"
        for var, pick in (("NCCL_SOCKET_IFNAME", nccl_interface), ("GLOO_SOCKET_IFNAME", gloo_interface)):
            value = get(n.report, f"env.{var}")
            if value and pick(n.report)["name"] is None:
                out.append(Finding(FAIL, "interface", f"env.{var}",
                                   f"{var}={value} on {n.name} matches no interface with an address "
                                   f"(it has: {have})", nodes=[n.name], source=SRC_IFNAME))
    return out


def nccl_copies_findings(nodes: list[Node]) -> list[Finding]:
    """Warn for every node with more than one libnccl file or ``nvidia-nccl-*`` package."""
    out = []
    for n in nodes:
        if not n.ok:
            continue
        found = get(n.report, "nccl.found") or []
        pkgs = get(n.report, "nccl.pip_packages") or {}
        loaded = get(n.report, "nccl.loaded.path")
        if len(found) > 1:
            files = "; ".join(f"{f['path']} ({f.get('version') or 'version unknown'})" for f in found)
            tail = f"; torch loads {loaded}" if loaded else ""
            out.append(Finding(WARN, "nccl-copies", "nccl.found",
                               f"{n.name} has {len(found)} NCCL libraries: {files}{tail}",
                               nodes=[n.name], source=SRC_COPIES))
        if len(pkgs) > 1:
            out.append(Finding(WARN, "nccl-copies", "nccl.pip_packages",
                               f"{n.name} has {len(pkgs)} NCCL packages: "
                               + ", ".join(f"{k}=={v}" for k, v in pkgs.items()),
                               nodes=[n.name], source=SRC_COPIES))
    return out


def probe_error_findings(nodes: list[Node]) -> list[Finding]:
    """Warn for nodes whose probe listed problems (``errors``), naming the first."""
    out = []
    for n in nodes:
        if n.ok and n.report.get("errors"):
            errs = n.report["errors"]
            more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
            out.append(Finding(WARN, "probe-errors", "errors", f"{n.name}: probe: {errs[0]}{more}",
                               nodes=[n.name], source="builder/agent/probe.py"))
    return out


def unreachable_findings(nodes: list[Node]) -> list[Finding]:
    """``unknown`` for every node that could not be checked, with its one-line reason."""
    out = []
    for n in nodes:
        if n.error is not None:
            rule = "invalid" if type(n.error).__name__ == "InvalidReport" else "unreachable"
            out.append(Finding(UNKNOWN, rule, n.error.field, str(n.error), nodes=[n.name],
                               source="could not check this node"))
    return out


@dataclass
class VerifyResult:
    """Everything ``verify`` found.

    Attributes:
        nodes: the nodes compared (with reports) and those that could not be checked.
        findings: failures first, then warnings, then unknowns (order within: the rules' order).
        exit_code: see :func:`exit_code`.
    """

    nodes: list[Node]
    findings: list[Finding]
    exit_code: ExitCode

    @property
    def differences(self) -> list[Finding]:
        """The findings that are differing values (must- and should-match)."""
        return [f for f in self.findings if f.groups and len(f.groups) > 1]

    def to_json(self) -> dict:
        """Machine-readable result, schema ``envbuild.verify/1``."""
        return {
            "schema": "envbuild.verify/1",
            "exit_code": int(self.exit_code),
            "nodes": [node_summary(n) for n in self.nodes],
            "findings": [f.to_json() for f in self.findings],
        }


def node_summary(n: Node) -> dict:
    """The informational fields of one node (for tables and JSON)."""
    d = n.report or {}
    pick = nccl_interface(d) if d.get("network") else {"name": None, "address": None}
    return {
        "name": n.name, "source": n.source, "ok": n.ok,
        "error": str(n.error) if n.error else None,
        "hostname": d.get("hostname"),
        "address": n.address or pick.get("address"),
        "nccl_interface": pick.get("name"),
        "torch": get(d, "torch.version"), "nccl": get(d, "nccl.loaded.version"),
        "driver": d.get("driver"), "gpus": len(d.get("gpus") or []),
        "image": get(d, "image.digest") or get(d, "image.id") or get(d, "image.ref"),
        "image_ref": get(d, "image.ref"),
        "runtime": get(d, "container.runtime"),
        "shm_bytes": get(d, "shm.size_bytes"),
    }


def verify(nodes: list[Node], floors: dict[str, dict] | None = None) -> VerifyResult:
    """Compare ``nodes`` by every rule in the module docstring.

    Args:
        nodes: gathered nodes (:mod:`builder.nodes.gather`); those with ``error`` are reported
            as unknown and left out of the comparison.
        floors: driver floors per CUDA version (default: the bundled facts).

    Returns:
        A :class:`VerifyResult`; ``exit_code`` 0/1/2/3.
    """
    findings: list[Finding] = []
    for rule in MUST_MATCH:
        findings += compare(nodes, rule, "must-match")
    findings += driver_floor_findings(nodes, floors)
    findings += missing_interface_findings(nodes)
    for rule in SHOULD_MATCH:
        findings += compare(nodes, rule, "should-match")
    findings += env_findings(nodes)
    findings += nccl_copies_findings(nodes)
    findings += probe_error_findings(nodes)
    findings += unreachable_findings(nodes)
    order = {FAIL: 0, WARN: 1, UNKNOWN: 2}
    findings.sort(key=lambda f: order[f.level])  # stable: rule order kept within a level
    return VerifyResult(nodes, findings, exit_code(findings))


# --------------------------------------------------------------------------- output


def _short_image(value: str | None) -> str:
    """An image ID or digest as 12 hex digits (as ``docker images`` shows IDs)."""
    if not value:
        return "-"
    return value.split(":", 1)[-1][:12] if value.startswith("sha256:") else value


#: Characters of one value shown in a table cell (the JSON output has it whole).
CELL_LIMIT = 200
#: Characters of one finding line in the human output (the JSON output has it whole).
LINE_LIMIT = 900
#: Differing fields shown in the "fields that differ" table; the rest are printed one
#: line each (a rich table costs ~0.5 ms a row: 20k rows would take tens of seconds).
TABLE_FIELDS = 100
_STYLE = {FAIL: "red", WARN: "yellow", UNKNOWN: "magenta"}


def cell(value: Any, limit: int | None = CELL_LIMIT, style: str = ""):
    """``value`` as a rich ``Text`` safe for a terminal: one line, control characters and
    bidi overrides escaped (:func:`builder.core.inputs.one_line`), never read as rich markup
    (``"[/]"`` prints as it is), cut to ``limit`` characters."""
    from rich.text import Text

    return Text(one_line("-" if value is None else value, limit), style=style)


def _node_rows(result: VerifyResult) -> tuple[list[str], list[list]]:
    rows = []
    for n in result.nodes:
        s = node_summary(n)
        kind = n.source if n.source.split(" ", 1)[0] not in ("container", "ssh", "slurm") else n.source.split(" ", 1)[0]
        if not n.ok:
            rows.append([n.name, kind, None, None, None, None, None])
        else:
            rows.append([n.name, kind, s["torch"] or "-", s["nccl"] or "-", s["driver"] or "-",
                         _short_image(s["image"]), s["address"] or "-"])
    return ["node", "source", "torch", "nccl", "driver", "image", "address"], rows


def render(result: VerifyResult, console) -> None:
    """Print ``result`` with rich: a nodes table, a table of the first
    :data:`TABLE_FIELDS` differing fields (nodes grouped by value), the other findings one
    per line, and a summary line.

    Every value from a report is shown through :func:`cell` (escaped, never markup), so
    a report string such as ``"[/]"`` or ``"\\x1b[2J"`` prints literally. Linear in the
    number of findings and nodes.
    """
    from rich.table import Table
    from rich.text import Text

    header, rows = _node_rows(result)
    keep = [i for i in range(len(header)) if i < 3 or any(r[i] not in ("-", None) for r in rows)]
    nodes = Table(title="nodes", title_justify="left", show_edge=False)
    for i in keep:
        nodes.add_column(header[i], no_wrap=header[i] not in ("source", "address"), overflow="fold")
    for r in rows:
        if r[2] is None:
            r[2] = Text("not checked", style="magenta")
        nodes.add_row(*[r[i] if isinstance(r[i], Text) else cell(r[i] or "") for i in keep])
    console.print(nodes)
    diffs = result.differences[:TABLE_FIELDS]
    shown_as_diff = {id(f) for f in diffs}
    if diffs:
        t = Table(title="fields that differ", title_justify="left", show_edge=False)
        t.add_column("rule", no_wrap=True)  # coloured by level: red fails, yellow warns
        t.add_column("field", overflow="fold")
        t.add_column("value", overflow="fold")
        t.add_column("nodes", overflow="fold", min_width=min(40, max(len(n.name) for n in result.nodes)))
        for f in diffs:
            for i, (value, names) in enumerate(f.groups):
                first = i == 0
                shown = _short_image(value) if f.field in ("image.id", "image.digest") and value else show(value)
                t.add_row(cell(f.rule, style=_STYLE[f.level]) if first else "", cell(f.field) if first else "",
                          cell(shown), cell(", ".join(names), None))
        console.print(t)
    for f in result.findings:
        if id(f) in shown_as_diff:
            continue
        line = Text.assemble((f.level, _STYLE[f.level]), f": {f.rule}: ", one_line(f.message, LINE_LIMIT))
        console.print(line, highlight=False, soft_wrap=True)
    checked = sum(1 for n in result.nodes if n.ok)
    fails = sum(1 for f in result.findings if f.level == FAIL)
    warns = sum(1 for f in result.findings if f.level == WARN)
    unknown = sum(1 for f in result.findings if f.level == UNKNOWN)
    console.print(f"verify: {checked} of {len(result.nodes)} nodes checked; {fails} failed, {warns} warnings, "
                  f"{unknown} not checked -> exit {int(result.exit_code)}", markup=False, highlight=False)
