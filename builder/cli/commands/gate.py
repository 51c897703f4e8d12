"""``envbuild gate`` (is this node still what was certified? exit 0/1/2/3), ``envbuild k8s
gate`` (the DaemonSet that gates every node of a cluster), and the options ``verify`` takes
for a reference (``--against``, ``--max-age``, ``--all``).

Every value is checked before anything is contacted (usage errors exit 64); the reference
is read before the nodes are gathered (an unreadable one exits 3).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode

_DURATION = re.compile(r"([0-9]{1,9})([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_CHECKS_RE = re.compile(r"[a-z-]{1,40}(,[a-z-]{1,40}){0,20}")
_SELECTOR_RE = re.compile(r"([A-Za-z0-9./_-]{1,316})=([A-Za-z0-9._-]{0,63})")


def duration_arg(text: str) -> float:
    """argparse type: seconds from ``30d``, ``12h``, ``90m``, ``3600s`` or ``3600`` (> 0,
    matched whole); else a usage error."""
    m = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if m is None or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30d, 12h, 90m or 3600s (> 0)")
    return float(int(m.group(1)) * _UNITS[m.group(2)])


def add_verify_options(p: argparse.ArgumentParser) -> None:
    """``verify --against REF [--max-age D] [--all]``."""
    from builder.cli.app import _text

    p.add_argument("--against", metavar="REF", type=_text("a certificate, node report or image", 4096),
                   help="compare every node with this certificate (its rank probes), node report or image (probed)")
    p.add_argument("--max-age", type=duration_arg, default=30 * 86400.0, metavar="D",
                   help="with --against CERT: warn when the certificate is older (default 30d)")
    p.add_argument("--all", dest="all_rows", action="store_true",
                   help="a row for every node (default: one line per group of equal nodes)")


def load_against(text: str | None) -> Any:
    """The reference of ``--against`` (:func:`builder.nodes.reference.load_reference`), or None."""
    if not text:
        return None
    from builder.nodes.reference import load_reference

    return load_reference(text)


# --------------------------------------------------------------------------- envbuild gate


def add_gate(sub: Any) -> None:
    """The ``gate`` subparser."""
    from builder.cli.app import _image_ref, _label_arg, _path, _size_arg

    g = sub.add_parser("gate", help="check this node against its certificate at job start (exit 0/1/2/3)")
    g.add_argument("--against", required=True, metavar="CERT", type=_path("a certificate"),
                   help="the certificate (or a node report) this node must match")
    g.add_argument("--image", metavar="IMAGE", type=_image_ref, help="the image jobs run here: probe it too")
    g.add_argument("--drain", action="store_true", help="Slurm: drain this node when it fails (scontrol update)")
    g.add_argument("--node", metavar="NAME", help="the Slurm node name (default $SLURMD_NODENAME, else the host name)")
    g.add_argument("--history", metavar="DIR", type=_path("a folder"),
                   help="append the report here (default /var/lib/envbuild/gate as root, "
                        "else $XDG_STATE_HOME/envbuild/gate)")
    g.add_argument("--no-history", action="store_true", help="write no history file")
    g.add_argument("--max-age", type=duration_arg, default=30 * 86400.0, metavar="D",
                   help="warn when the certificate is older (default 30d)")
    g.add_argument("--checks", metavar="A,B", help="local checks: shm, gpu-uuid, gpu-processes, interface, "
                   "stale-containers (default all)")
    g.add_argument("--min-shm", default="256m", metavar="SIZE", type=_size_arg, help="smallest /dev/shm (default 256m)")
    g.add_argument("--stale-after", type=duration_arg, default=3600.0, metavar="D",
                   help="an envbuild container running longer is stale (default 1h)")
    g.add_argument("--stale-label", action="append", default=[], metavar="KEY[=VALUE]", type=_label_arg,
                   help="look for stale containers only among those with this label too (repeatable)")
    g.add_argument("--json", action="store_true", help="print the envbuild.gate/1 document only")
    g.set_defaults(func=cmd_gate)


def _gate_options(args: argparse.Namespace) -> Any:
    from builder.cli.app import UsageError
    from builder.nodes import doctor
    from builder.nodes.gate import GATE_CHECKS, GateOptions, check_node_name

    checks = GATE_CHECKS
    if args.checks is not None:
        if not _CHECKS_RE.fullmatch(args.checks) or any(c not in GATE_CHECKS for c in args.checks.split(",")):
            raise UsageError(f"envbuild gate: --checks: {args.checks!r}: choose from {', '.join(GATE_CHECKS)}")
        checks = tuple(args.checks.split(","))
    try:
        if args.node is not None:
            check_node_name(args.node)
        min_shm = doctor.parse_size(args.min_shm)
    except EnvbuildError as e:
        raise UsageError(f"envbuild gate: {e}") from None
    if args.history and args.no_history:
        raise UsageError("envbuild gate: --history and --no-history do not go together")
    return GateOptions(against=args.against, image=args.image, drain=args.drain, node=args.node,
                       history=args.history, keep_history=not args.no_history, max_age_s=args.max_age,
                       checks=checks, min_shm_bytes=min_shm, stale_after_s=args.stale_after,
                       stale_labels=tuple(args.stale_label))


def cmd_gate(args: argparse.Namespace) -> int:
    """``envbuild gate --against CERT [--image IMAGE] [--drain]``: one line per failure and
    warning, then a summary line; ``--json``: the ``envbuild.gate/1`` document only."""
    from builder.cli.app import out
    from builder.nodes.gate import drain_on_error, gate

    opts = _gate_options(args)
    with drain_on_error(opts):
        result = gate(opts)
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return result.exit_code
    lines = list(result.lines)
    if result.history:
        lines.append(f"history: {result.history}")
    if result.drained:
        lines.append(f"drained: {result.drained}")
    fails = sum(1 for line in result.lines if line.startswith("fail:"))
    warns = sum(1 for line in result.lines if line.startswith("warn:"))
    lines.append(f"gate: {result.node} against {args.against}: {fails} failed, {warns} warnings "
                 f"-> exit {result.exit_code}")
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return result.exit_code


# --------------------------------------------------------------------------- envbuild k8s gate


def selector_arg(text: str) -> tuple[str, str]:
    """argparse type: a node selector ``KEY=VALUE`` (a label key and value)."""
    m = _SELECTOR_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node label KEY=VALUE")
    return m.group(1), m.group(2)


def add_k8s_gate(ksub: Any) -> None:
    """The ``k8s gate`` subparser."""
    from builder.cli.app import _image_ref, _int_in, _path, _text

    g = ksub.add_parser("gate", help="write the DaemonSet (+ RBAC) that labels certified nodes and taints the others")
    g.add_argument("certificate", metavar="CERT", type=_path("a certificate"), help="the certificate nodes must match")
    g.add_argument("--image", required=True, metavar="REPO@sha256:DIGEST", type=_image_ref,
                   help="the certified image, by digest (the gate runs in it)")
    g.add_argument("--out", required=True, metavar="DIR", type=_path("a folder"), help="folder for the manifests")
    g.add_argument("--namespace", default="default", type=_text("a namespace", 63),
                   help="namespace of the ServiceAccount, ConfigMap and DaemonSet (default: default)")
    g.add_argument("--interval", type=_int_in(10, 86400), default=600, metavar="S",
                   help="seconds between checks on each node (default 600)")
    g.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE", type=selector_arg,
                   help="run the gate only on nodes with this label (repeatable)")
    g.add_argument("--max-age", type=duration_arg, default=30 * 86400.0, metavar="D",
                   help="the pods warn when the certificate is older (default 30d)")
    g.add_argument("--allow-tag", action="store_true", help="accept an image without digest (development clusters)")
    g.set_defaults(func=cmd_k8s_gate)


def cmd_k8s_gate(args: argparse.Namespace) -> int:
    """``envbuild k8s gate CERT --image REF@sha256:... --out DIR``: write the gate's manifests."""
    from builder.cli.app import out
    from builder.launchers.k8s.gate import GateSpec, gate_context
    from builder.launchers.k8s.manifests import render_gate_manifests, write_manifests
    from builder.nodes.gatespec import gate_spec, lock_label
    from builder.nodes.reference import from_certificate

    spec = GateSpec(image=args.image, spec={}, label_value="0" * 12, namespace=args.namespace,
                    interval_s=args.interval, node_selector=dict(args.node_selector), allow_tag=args.allow_tag)
    try:
        gate_context(spec)  # every option checked before the certificate is read
    except EnvbuildError as e:
        if e.exit_code == ExitCode.USAGE:
            from builder.cli.app import UsageError

            raise UsageError(f"envbuild k8s gate: {e}") from None
        raise
    ref = from_certificate(args.certificate)
    spec = GateSpec(image=args.image, spec=gate_spec(ref, args.max_age), label_value=lock_label(ref),
                    namespace=args.namespace, interval_s=args.interval, node_selector=dict(args.node_selector),
                    allow_tag=args.allow_tag)
    for path in write_manifests(render_gate_manifests(spec), args.out):
        out.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    out.print(f"apply with `kubectl apply -f {args.out}`; certified nodes get the label "
              f"envbuild.dev/certified={spec.label_value}", markup=False, highlight=False, soft_wrap=True)
    return ExitCode.OK
