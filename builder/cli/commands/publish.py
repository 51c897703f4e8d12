"""``envbuild push`` and ``envbuild pull``: certified images and their certificates in a registry, by digest."""

from __future__ import annotations

import argparse
import os
from typing import Any

from builder.cli import output
from builder.cli.output import out
from builder.core.errors import ExitCode
from builder.core.inputs import escape


def registry_opts(args: argparse.Namespace) -> dict[str, Any]:
    """The registry connection options of push and pull (``--plain-http``, ``--registry-ca``)."""
    return {"plain_http": True if args.plain_http else None, "ca_cert": args.registry_ca}


def cmd_push(args: argparse.Namespace) -> int:
    """``envbuild push RECIPE --registry HOST[:PORT]``: image and attestation; 2 refused, 3 unreachable."""
    from builder.image import engine
    from builder.publish import attest, push

    key_path = args.sign_key or os.environ.get(attest.ENV_SIGN_KEY)
    key = attest.load_private_key(key_path) if key_path else None
    client = engine.connect()
    result = push.push(client, args.recipe, args.registry, images_dir=args.images_dir, image=args.image,
                       namespace=args.namespace, sign_key=key, fs_hash=not args.no_fs_hash,
                       on_progress=output.progress, **registry_opts(args))
    for w in result.warnings:
        output.warn(w)
    output.emit(result)
    out().print(f"pushed {result.repository}@{result.digest}", markup=False, soft_wrap=True)
    out().print(f"  tags: {', '.join(result.tags)}; image {result.image_id}", markup=False, soft_wrap=True)
    out().print(f"  certificate {result.certificate_path} -> attestation {result.attestation} "
                f"({'signed by ' + result.signed_by if result.signed_by else 'unsigned'}; found by {result.referrers})",
                markup=False, soft_wrap=True)
    if result.filesystem:
        out().print(f"  filesystem content {result.filesystem['method']} sha256:{result.filesystem['sha256']}",
                    markup=False, soft_wrap=True)
    return ExitCode.OK


def cmd_pull(args: argparse.Namespace) -> int:
    """``envbuild pull RECIPE|REF --registry HOST``: by digest once checked; 2 refused, 3 unreachable."""
    from builder.image import engine
    from builder.publish import attest, pull

    key_path = args.verify_key or os.environ.get(attest.ENV_VERIFY_KEY)
    key = attest.load_public_key(key_path) if key_path else None
    client = engine.connect() if args.format == "docker" else None
    result = pull.pull(client, args.target, args.registry, namespace=args.namespace, public_key=key,
                       key_name=str(key_path) if key_path else "the key",
                       allow_uncertified_hw=args.allow_uncertified_hw, fmt=args.format, sif_output=args.output,
                       run_apptainer=not args.print_only, on_progress=output.progress, **registry_opts(args))
    cert = result.certificate
    for w in result.warnings:
        output.warn(f"uncertified hardware: {w}")
    output.emit(result)
    sig = (f"signature verified ({result.signer})" if result.signer else
           "signed, signature not checked (no public key configured)" if result.signed else "unsigned")
    out().print(f"certified {escape(result.reference)}: recipe {escape(cert.get('recipe'), 80)}, lock "
                f"{escape(cert.get('lock_hash'), 80)}, verdict passed at {escape(cert.get('finished_at'), 40)}; "
                f"{escape(sig)}; certificate {escape(result.attestation)} ({escape(result.found_by)})",
                markup=False, soft_wrap=True)
    if result.sif_command is not None:
        command = " ".join(result.sif_command)
        out().print(f"ran: {command}" if result.sif_ran else command, markup=False, soft_wrap=True)
    else:
        out().print(f"pulled {result.reference} as {', '.join(result.local_tags)} (image {result.image_id})",
                    markup=False, soft_wrap=True)
    return ExitCode.OK


def cmd_config(args: argparse.Namespace) -> int:
    """``envbuild config``: each site setting, its value and where it came from (flags win over all)."""
    from builder.cli import config

    found = config.settings()
    for key, (flag, _) in config.SITE.items():
        value, where = found.get(key, ("", "default"))
        output.put(escape(f"{key} = {value!r}  ({where}; flag {flag})" if value else f"{key}: unset ({flag})", None))
    return ExitCode.OK


def cmd_completion(args: argparse.Namespace) -> int:
    """``envbuild completion bash|zsh|fish``: argcomplete's script for the ``envbuild`` on ``PATH``."""
    import argcomplete

    output.put(argcomplete.shellcode(["envbuild"], shell=args.shell).rstrip("\n"))
    return ExitCode.OK
