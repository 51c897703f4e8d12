"""``envbuild gate`` (is this node still what was certified?) and ``envbuild k8s gate`` (its
DaemonSet). The reference is read before the node is probed (an unreadable one exits 3)."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from builder.cli.output import console, emit, level_of, out, publish
from builder.core.errors import EnvbuildError, ExitCode, UsageError

_CHECKS_RE = re.compile(r"[a-z-]{1,40}(,[a-z-]{1,40}){0,20}")


def _gate_options(args: argparse.Namespace) -> Any:
    from builder.nodes import doctor
    from builder.nodes.gate import GATE_CHECKS, GateOptions, check_node_name
    from builder.recipe.fields import shm_bytes

    checks = GATE_CHECKS
    if args.checks is not None:
        if not _CHECKS_RE.fullmatch(args.checks) or any(c not in GATE_CHECKS for c in args.checks.split(",")):
            raise UsageError(f"envbuild gate: --checks: {args.checks!r}: choose from {', '.join(GATE_CHECKS)}")
        checks = tuple(args.checks.split(","))
    try:
        if args.node is not None:
            check_node_name(args.node)
    except EnvbuildError as e:
        raise UsageError(f"envbuild gate: {e}") from None
    for a, b in (("--history", "--no-history"), ("--epilog", "--resume")):
        if getattr(args, a[2:].replace("-", "_")) and getattr(args, b[2:].replace("-", "_")):
            raise UsageError(f"envbuild gate: {a} and {b} do not go together")
    return GateOptions(against=args.against, image=args.image, drain=args.drain or args.resume, epilog=args.epilog,
                       resume=args.resume, node=args.node,
                       history=args.history, keep_history=not args.no_history, max_age_s=args.max_age,
                       checks=checks, min_shm_bytes=shm_bytes(args.min_shm), stale_after_s=args.stale_after,
                       stale_labels=tuple(args.stale_label),
                       health=doctor.health_options(args.gpus, args.gpu_thresholds))


def cmd_gate(args: argparse.Namespace) -> int:
    """``envbuild gate --against CERT [--image IMAGE] [--drain]``: a line per failure and warning, then a summary."""
    from builder.nodes.gate import drain_on_error, gate

    opts = _gate_options(args)
    with drain_on_error(opts):
        result = gate(opts)
    lines = list(result.lines)
    if result.history:
        lines.append(f"history: {result.history}")
    if result.drained:
        lines.append(f"drained: {result.drained}")
    if result.resumed:
        lines.append(f"resumed: {result.resumed}")
    fails = sum(1 for line in result.lines if line.startswith("fail:"))
    warns = sum(1 for line in result.lines if line.startswith("warn:"))
    lines.append(f"gate: {result.node} against {args.against}: {fails} failed, {warns} warnings "
                 f"-> exit {result.exit_code}")
    out().print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    emit(result)
    _publish(args, result)  # after the lines: a metrics file that cannot be written loses none of them
    return result.exit_code


def _publish(args: argparse.Namespace, result: Any) -> None:
    """The gate's metrics (verdict, each check, the certificate's age, GPU health) and events."""
    from builder.core import metrics
    from builder.core.events import event

    ref = result.verify.reference
    labels = {"image": args.image or (ref.image if ref else None) or ""}
    node = {"node": result.node, **labels}
    samples: list[metrics.Sample] = [("envbuild_gate_passed", node, float(result.exit_code <= ExitCode.WARNINGS)),
               ("envbuild_gate_exit_code", node, result.exit_code),
               ("envbuild_certificate_age_seconds", node, ref.age_s if ref and ref.age_s is not None else math.nan)]
    samples += metrics.check_samples(result.node, [(c.name, c.status) for c in result.checks], **labels)
    samples += metrics.check_samples(result.node, [("verify", {0: "pass", 1: "warn", 2: "fail"}.get(
        result.verify.exit_code, "unknown"))], **labels)
    evs = [event("finding", line, level_of(line), node=result.node) for line in result.lines]
    evs.append(event("run-end", f"gate: exit {result.exit_code}", level_of(["pass", "warn", "fail"][
        min(result.exit_code, 2)]), node=result.node))
    publish(args, samples, evs)


# --------------------------------------------------------------------------- envbuild k8s gate


def cmd_k8s_gate(args: argparse.Namespace) -> int:
    """``envbuild k8s gate CERT --image REF@sha256:... --out DIR``: write the gate's manifests."""
    from builder.cli.commands.certify import placement
    from builder.launchers.k8s import GateSpec, gate_context, render_gate_manifests, write_manifests
    from builder.nodes.gatespec import gate_spec, lock_label
    from builder.nodes.reference import from_certificate

    spec = GateSpec(image=args.image, spec={}, label_value="0" * 12, namespace=args.namespace,
                    interval_s=args.interval, placement=placement(args), allow_tag=args.allow_tag)
    try:
        gate_context(spec)  # every option checked before the certificate is read
    except EnvbuildError as e:
        if e.exit_code == ExitCode.USAGE:
            raise UsageError(f"envbuild k8s gate: {e}") from None
        raise
    ref = from_certificate(args.certificate)
    spec = GateSpec(image=args.image, spec=gate_spec(ref, args.max_age), label_value=lock_label(ref),
                    namespace=args.namespace, interval_s=args.interval, placement=placement(args),
                    allow_tag=args.allow_tag)
    for path in write_manifests(render_gate_manifests(spec), args.out):
        out().print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    (console() if args.out == "-" else out()).print(
        f"apply with `kubectl apply -f {args.out}`; certified nodes get the label "
        f"envbuild.dev/certified={spec.label_value}", markup=False, highlight=False, soft_wrap=True)
    return ExitCode.OK
