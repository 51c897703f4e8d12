"""``envbuild probe``, ``verify`` and ``doctor``: node reports, their comparison and the
preflight checks."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from builder.cli.checks import UsageError
from builder.cli.output import out
from builder.core.errors import EnvbuildError, ExitCode

if TYPE_CHECKING:
    from builder.nodes.sources import Sources


def cmd_probe(args: argparse.Namespace) -> int:
    """``envbuild probe``: print this host's node report (the in-image probe, run on the host)."""
    from builder.agent import probe

    out().print_json(json.dumps(probe.collect()))
    return ExitCode.OK


def node_sources(args: argparse.Namespace, allow_empty: bool = False) -> Sources:
    """The node sources of ``verify``/``doctor``, every value checked (exit 64) before
    anything is contacted (:meth:`builder.nodes.sources.Sources.check`)."""
    from builder.nodes.sources import Sources

    src = Sources(files=args.reports, images=args.image, containers=args.container, labels=args.label,
                  nodes=args.nodes, hosts=[h for item in args.hosts for h in item],
                  ssh_config=args.ssh_config, ssh_options=args.ssh_option,
                  connect_timeout_s=args.connect_timeout, slurm=args.slurm, partition=args.partition,
                  srun_args=args.srun_arg, timeout_s=args.node_timeout, python=args.python)
    if src.empty and not allow_empty:
        raise UsageError(f"envbuild {args.command}: give report files, --image/--container/--label, --hosts or --slurm")
    if args.nodes is not None and not (src.uses_containers or src.slurm):
        raise UsageError(f"envbuild {args.command}: --nodes goes with --image/--container/--label or --slurm")
    try:
        return src.check()
    except EnvbuildError as e:
        raise UsageError(f"envbuild {args.command}: {e}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    """``envbuild verify``: gather node reports and compare them; 0 match, 1 warnings, 2 differ, 3 not checked."""
    from builder.nodes import sources, verify

    result = verify.verify(sources.gather(node_sources(args)))
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        verify.render(result, out())
    return result.exit_code


def cmd_doctor(args: argparse.Namespace) -> int:
    """``envbuild doctor``: preflight checks on the nodes; worst of pass/skip 0, warn 1, fail 2, unknown 3
    (also 3 when nothing could be checked). Usage errors (64) come before anything is contacted."""
    from builder.core.inputs import escape
    from builder.nodes import doctor, sources

    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip()) if args.checks else doctor.ALL_CHECKS
    unknown = [c for c in checks if c not in doctor.ALL_CHECKS]
    if unknown:
        raise UsageError(f"envbuild doctor: --checks: unknown {', '.join(escape(c, 60) for c in unknown[:5])}; "
                         f"choose from {', '.join(doctor.ALL_CHECKS)}")
    try:
        min_shm = doctor.parse_size(args.min_shm)
        labels = tuple(sources.check_label(label) for label in args.stale_label)
    except EnvbuildError as e:
        raise UsageError(f"envbuild doctor: {e}") from None
    opts = doctor.Options(checks=checks, port=args.port, master=args.master, connect_timeout_s=args.connect_timeout,
                          min_shm_bytes=min_shm, straggler_ratio=args.straggler_ratio,
                          backend=args.backend, fix=args.fix, stale_after_s=args.stale_after, labels=labels)
    # without nodes only stale-containers can check anything: asking for nothing else is a usage error
    src = node_sources(args, allow_empty="stale-containers" in checks)
    result = doctor.doctor([] if src.empty else sources.gather(src), opts)
    if args.json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        doctor.render(result, out())
    return result.exit_code
