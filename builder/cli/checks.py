"""Checks of the command line that need nothing outside this process, run before anything is
contacted: option combinations and values (exit 64), then the input files (exit 3)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from builder.core.errors import UsageError

if TYPE_CHECKING:
    from builder.launchers.slurm import SlurmOptions


#: Largest CA bundle read (``--ca-cert``, ``--registry-ca``), in bytes.
MAX_CA_BYTES = 16 << 20

#: Slurm options of certify/make: (attribute, flag); each needs ``--launcher slurm``.
SLURM_FLAGS = (("partition", "--partition"), ("time_limit", "--time-limit"),
               ("container_runtime", "--container-runtime"), ("container_image", "--container-image"),
               ("slurm_dir", "--slurm-dir"), ("slurm_nodes", "--slurm-nodes"), ("sbatch_arg", "--sbatch-arg"),
               ("pending_timeout", "--pending-timeout"))

#: Input files of the command line: (attribute, option, what, byte limit). Each is read
#: (bounded, regular files only) before anything is contacted; one that cannot be is exit 3.
INPUT_FILES = (("sign_key", "--sign-key", "signing key", 1 << 20),
               ("verify_key", "--verify-key", "public key", 1 << 20),
               ("registry_ca", "--registry-ca", "CA bundle", MAX_CA_BYTES),
               ("ca_cert", "--ca-cert", "CA bundle", MAX_CA_BYTES))


def slurm_options(args: argparse.Namespace) -> SlurmOptions:
    """Raises EnvbuildError (exit 64): a value the batch script cannot carry."""
    from builder.launchers import slurm

    return slurm.SlurmOptions(
        runtime=args.container_runtime or slurm.DEFAULT_RUNTIME, partition=args.partition,
        time_limit=args.time_limit, slurm_nodes=args.slurm_nodes, container_image=args.container_image,
        sbatch_args=tuple(args.sbatch_arg or ()), socket_ifname=args.socket_ifname,
        pending_timeout_s=slurm.DEFAULT_PENDING_TIMEOUT_S if args.pending_timeout is None else args.pending_timeout)


def check_launcher_args(args: argparse.Namespace) -> None:
    """Raises UsageError, EnvbuildError (exit 64)."""
    kind = getattr(args, "launcher", None) or "local"
    if getattr(args, "bisect", False) and kind != "local":
        raise UsageError(f"envbuild {args.command}: --bisect runs on the local launcher only (docs/bisect.md)")
    given = [flag for attr, flag in SLURM_FLAGS if getattr(args, attr, None) not in (None, [])]
    if kind != "slurm" and given:
        raise UsageError(f"envbuild {args.command}: {', '.join(given)} go(es) with --launcher slurm")
    if kind != "slurm":
        return
    from builder.launchers import slurm

    slurm_options(args)
    if args.slurm_nodes is not None and getattr(args, "nodes", None) is not None:
        slurm.check_slurm_nodes(args.slurm_nodes, args.nodes)
    slurm.check_slurm_dir(os.path.abspath(args.slurm_dir or args.images_dir))


def check_input_files(args: argparse.Namespace) -> None:
    """Every input file given is a bounded regular file (``--wheels``: a folder); else Unreachable (exit 3)."""
    from builder.core.errors import Unreachable
    from builder.core.inputs import read_regular

    for attr, flag, what, limit in INPUT_FILES:
        path = getattr(args, attr, None)
        if path is not None:
            read_regular(path, limit, f"{what} ({flag})")
    wheels = getattr(args, "wheels", None)
    if wheels is not None and not os.path.isdir(wheels):
        raise Unreachable("no such folder (--wheels)" if not os.path.exists(wheels)
                          else "is not a folder (--wheels)", file=wheels)


def check_args(args: argparse.Namespace) -> None:
    """Raises UsageError, EnvbuildError (exit 64); Unreachable (exit 3): an unreadable input file."""
    if args.command in ("certify", "make"):
        check_launcher_args(args)
    if args.command == "pull":
        if args.format != "sif":
            given = [flag for flag, value in (("--output", args.output), ("--print-only", args.print_only)) if value]
            if given:
                raise UsageError(f"envbuild pull: {', '.join(given)} go(es) with --format sif")
        from builder.publish import naming

        naming.parse_target(args.target, args.registry, args.namespace)
    if args.command == "rebuild" and not args.compare and (args.against or args.keep or args.rebuilt):
        raise UsageError("envbuild rebuild: --against, --keep and --rebuilt go with --compare")
    if args.command == "k8s" and getattr(args, "run_id", None):
        from builder.launchers.k8s import check_run_id

        check_run_id(args.run_id)
    check_input_files(args)
