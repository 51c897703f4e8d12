"""``envbuild probe``, ``verify`` and ``doctor``: node reports, their comparison and the preflight checks."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from builder.cli.documents import Doctor, DoctorCheck
from builder.cli.output import emit, level_of, out, publish
from builder.core.errors import EnvbuildError, ExitCode, UsageError

if TYPE_CHECKING:
    from builder.nodes.sources import Sources


def cmd_probe(args: argparse.Namespace) -> int:
    """``envbuild probe``: print this host's node report (the in-image probe, run on the host)."""
    from builder.agent import probe

    out().print_json(json.dumps(probe.collect("host")))  # scope host: run outside any image
    return ExitCode.OK


def node_sources(args: argparse.Namespace, allow_empty: bool = False) -> Sources:
    """The node sources of ``verify``/``doctor``, every value checked (exit 64) before anything is contacted."""
    from builder.nodes.sources import Sources

    # --image on a shared engine: only the containers envbuild started, unless the user chose
    mine = [] if args.label or args.any_container or not args.image else ["envbuild"]
    src = Sources(files=args.reports, images=args.image, containers=args.container, labels=args.label or mine,
                  nodes=args.nodes, hosts=[h for item in args.hosts for h in item],
                  ssh_config=args.ssh_config, ssh_options=args.ssh_option,
                  connect_timeout_s=args.connect_timeout, slurm=args.slurm, partition=args.partition,
                  srun_args=args.srun_arg, timeout_s=args.node_timeout, python=args.python)
    if src.empty and not allow_empty:
        raise UsageError(f"envbuild {args.command}: give report files, --image/--container/--label, --hosts or --slurm"
                         + ("; or --checks stale-containers for this engine alone" if args.command == "doctor" else ""))
    if args.nodes is not None and not (src.uses_containers or src.slurm):
        raise UsageError(f"envbuild {args.command}: --nodes goes with --image/--container/--label or --slurm")
    try:
        return src.check()
    except EnvbuildError as e:
        raise UsageError(f"envbuild {args.command}: {e}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    """``envbuild verify``: compare node reports (or with ``--against REF``); 0 same, 1 warn, 2 differ, 3 unchecked."""
    from builder.nodes import sources, verify

    src = node_sources(args)
    reference = None
    if args.against:  # read before the nodes are gathered (an unreadable one exits 3)
        from builder.nodes.reference import load_reference

        reference = load_reference(args.against)
    result = verify.verify(sources.gather(src), reference=reference, max_age_s=args.max_age)
    verify.render(result, out(), all_rows=args.all_rows)
    emit(result)
    return result.exit_code


def cmd_doctor(args: argparse.Namespace) -> int:
    """``envbuild doctor``: preflight checks on the nodes; worst of pass/skip 0, warn 1, fail 2, unknown 3
    (also 3 when nothing could be checked). Usage errors (64) come before anything is contacted."""
    from builder.core.inputs import escape
    from builder.nodes import doctor, sources
    from builder.nodes.verify.result import node_summary
    from builder.recipe.fields import shm_bytes

    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip()) if args.checks else doctor.ALL_CHECKS
    unknown = [c for c in checks if c not in doctor.ALL_CHECKS]
    if unknown:
        raise UsageError(f"envbuild doctor: --checks: unknown {', '.join(escape(c, 60) for c in unknown[:5])}; "
                         f"choose from {', '.join(doctor.ALL_CHECKS)}")
    try:
        min_shm = shm_bytes(args.min_shm)  # matched by argtypes.size
        labels = tuple(sources.check_label(label) for label in args.stale_label)
    except EnvbuildError as e:
        raise UsageError(f"envbuild doctor: {e}") from None
    opts = doctor.Options(checks=checks, port=args.port, master=args.master, connect_timeout_s=args.connect_timeout,
                          min_shm_bytes=min_shm, straggler_ratio=args.straggler_ratio,
                          backend=args.backend, fix=args.fix, stale_after_s=args.stale_after, labels=labels,
                          health=doctor.health_options(args.gpus, args.gpu_thresholds))
    # without nodes only stale-containers can check anything: it must be asked for alone
    src = node_sources(args, allow_empty=checks == ("stale-containers",))
    result = doctor.doctor([] if src.empty else sources.gather(src), opts)
    doctor.render(result, out())
    emit(Doctor(exit_code=int(result.exit_code), nodes=tuple(node_summary(n) for n in result.nodes),
                checks=tuple(DoctorCheck(**vars(c)) for c in result.checks)))
    _publish(args, result)
    return result.exit_code


def _publish(args: argparse.Namespace, result: Any) -> None:
    """doctor's metrics (exit code, each check, GPU health readings) and events, under this host's name."""
    import socket

    from builder.core import metrics
    from builder.core.events import event

    host = socket.gethostname()
    samples: list[metrics.Sample] = [("envbuild_doctor_exit_code", {"node": host}, int(result.exit_code))]
    samples += metrics.check_samples(host, [(c.name, c.status) for c in result.checks])
    for c in result.checks:
        samples += metrics.health_samples(c.data.get("findings", []))
    evs = [event("finding", f"{c.name}: {c.status}: {c.message}", level_of(c.status), node=host) for c in result.checks]
    evs.append(event("run-end", f"doctor: exit {int(result.exit_code)}", level_of(
        ["pass", "warn", "fail"][min(int(result.exit_code), 2)]), node=host))
    publish(args, samples, evs)
