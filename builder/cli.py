"""The ``envbuild`` command: the only module that knows every stage.

Commands: ``check``, ``render``, ``build``, ``certify``, ``make`` (check -> render -> build
-> certify), ``probe``, ``base``. Errors from any stage are :class:`EnvbuildError` values
printed as one line each (no traceback) with the exit code of the shared table
(``builder/errors.py``); usage errors exit 64; SIGINT/SIGTERM exit 130 after cleanup.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from . import compat, recipe, render
from .errors import EnvbuildError, ExitCode

INTERRUPTED = 130
console = Console(stderr=True, highlight=False)
out = Console(highlight=False)


class UsageError(Exception):
    """A command-line usage error (exit 64)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 by default: the table says 64
        raise UsageError(f"{self.prog}: {message}")


def _load_spec(name: str, recipes_dir: str) -> compat.Spec:
    path = recipe.find(name, recipes_dir)
    return compat.check(recipe.load(path))


def _print_findings(spec: compat.Spec) -> None:
    style = {"error": "red", "warning": "yellow", "note": "cyan"}
    for f in spec.findings:
        console.print(Text.assemble((f.level, style[f.level]), ": ", f.line(spec.recipe.path)), soft_wrap=True)


def cmd_check(args) -> int:
    """``envbuild check RECIPE``: 0 compatible, 1 warnings only, 2 errors."""
    spec = _load_spec(args.recipe, args.recipes_dir)
    _print_findings(spec)
    if spec.errors:
        return ExitCode.CHECK_FAILED
    out.print(f"{spec.recipe.path}: ok: torch {spec.torch_local}, python {spec.recipe.python}, "
              f"cuda {spec.cuda or 'none'}, nccl {spec.nccl or 'none'}", soft_wrap=True)
    return ExitCode.WARNINGS if spec.warnings else ExitCode.OK


def _render(args, spec: compat.Spec) -> int:
    rendered = render.render(compat.require_ok(spec))
    if getattr(args, "check_only", False):
        stale = render.stale(rendered, args.images_dir)
        if stale:
            for name in stale:
                console.print(f"{args.images_dir}/{spec.recipe.name}/{name}: stale; run `envbuild render {spec.recipe.name}`", soft_wrap=True)
            return ExitCode.CHECK_FAILED
        out.print(f"{args.images_dir}/{spec.recipe.name}: up to date")
        return ExitCode.OK
    where = render.write(rendered, args.images_dir)
    for name in rendered.files:
        out.print(f"wrote {where / name}", markup=False)
    return ExitCode.OK


def cmd_render(args) -> int:
    """``envbuild render RECIPE [--check]``: write (or check for drift) the rendered files."""
    names = [p.stem for p in sorted(Path(args.recipes_dir).glob("*.yaml"))] if args.all else [args.recipe]
    if not names or names == [None]:
        raise UsageError("envbuild render: give a RECIPE or --all")
    worst = ExitCode.OK
    for name in names:
        spec = _load_spec(name, args.recipes_dir)
        _print_findings(spec) if spec.errors else None
        worst = max(worst, _render(args, spec))
    return worst


def _site(args):
    from .site import SiteOptions

    return SiteOptions.detect(ca_cert=args.ca_cert, wheels=args.wheels, base=args.base, no_detect=args.no_site_detect)


def _build(args, spec: compat.Spec):
    from . import build, engine

    client = engine.connect()
    result = build.build(spec.recipe.name, Path(args.images_dir), _site(args), client, base_mode=args.base_mode, console=console)
    out.print(f"built {result.tag} ({result.image_id[:19]}); base {result.base_used}; probe matches the lock")
    return result


def cmd_build(args) -> int:
    """``envbuild build RECIPE``: build the rendered Dockerfile, then check the probe against the lock."""
    spec = compat.require_ok(_load_spec(args.recipe, args.recipes_dir))
    rendered = render.render(spec)
    stale = render.stale(rendered, args.images_dir)
    if stale:
        raise EnvbuildError(f"rendered files are stale ({', '.join(stale)}); run `envbuild render {spec.recipe.name}`",
                            file=f"{args.images_dir}/{spec.recipe.name}")
    _build(args, spec)
    return ExitCode.OK


def _certify(args, image: str) -> int:
    from . import certify, engine

    client = engine.connect()
    cert, path = certify.certify(
        client,
        image,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        backend=args.backend,
        port=args.port,
        timeout_s=args.timeout,
        min_busbw_gbps=args.min_busbw,
        images_dir=Path(args.images_dir),
        console=console,
    )
    certify.print_table(cert, out)
    out.print(f"certificate: {path}")
    return ExitCode.OK if cert["verdict"]["passed"] else ExitCode(cert["verdict"]["exit_code"])


def cmd_certify(args) -> int:
    """``envbuild certify IMAGE``: run the probe and benchmarks on N container nodes; write a certificate."""
    return _certify(args, args.image)


def cmd_make(args) -> int:
    """``envbuild make [RECIPE]``: check -> render -> build -> certify, stopping at the first failure."""
    spec = _load_spec(args.recipe, args.recipes_dir)
    _print_findings(spec)
    compat.require_ok(spec)
    _render(argparse.Namespace(images_dir=args.images_dir, check_only=False), spec)
    result = _build(args, spec)
    return _certify(args, result.tag)


def cmd_probe(args) -> int:
    """``envbuild probe``: print this host's node report (the in-image probe, run on the host)."""
    from . import probe

    out.print_json(json.dumps(probe.collect()))
    return ExitCode.OK


def cmd_base(args) -> int:
    """``envbuild base bootstrap``: make a local Debian base image with debootstrap (air-gapped sites)."""
    from . import bootstrap, engine

    client = engine.connect()
    ref = bootstrap.bootstrap_debian(client, suite=args.suite, stands_for=args.stands_for)
    out.print(f"base image {ref} (stands in for {args.stands_for})")
    return ExitCode.OK


def _add_site(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("site options (enter at build time; the rendered files do not change)")
    g.add_argument("--ca-cert", metavar="FILE", help="CA bundle handed to pip in the build (default: from pip's configuration)")
    g.add_argument("--wheels", metavar="DIR", help="local wheel folder for pip --find-links (default: from pip's configuration)")
    g.add_argument("--base", metavar="IMAGE", help="base image override (e.g. a site mirror)")
    g.add_argument("--base-mode", choices=("auto", "pull", "bootstrap", "local"), default="auto",
                   help="auto: use the base if present or pullable, else bootstrap a Debian base locally (default)")
    g.add_argument("--no-site-detect", action="store_true", help="do not read pip's configuration")


def _add_certify(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("certification (defaults from the image's envbuild.* labels)")
    g.add_argument("--nodes", type=int, help="simulated nodes (containers); default from the recipe (2)")
    g.add_argument("--gpus-per-node", type=int, help="GPUs per node container (0 on CPU)")
    g.add_argument("--backend", choices=("gloo", "nccl"), help="override the recipe's backend (recorded in the certificate)")
    g.add_argument("--port", type=int, help="rendezvous port on the first node (default 29500)")
    g.add_argument("--timeout", type=int, help="seconds before hung ranks are killed")
    g.add_argument("--min-busbw", type=float, metavar="GBPS", help="busbw floor in GB/s at the gate size; gates also on gloo")


def parser() -> argparse.ArgumentParser:
    """The argument parser (usage errors raise :class:`UsageError`, exit 64)."""
    p = _Parser(prog="envbuild", description="Reproducible, certified PyTorch images for multi-node clusters.")
    p.add_argument("--recipes-dir", default="recipes", help="where recipes live (default: recipes)")
    p.add_argument("--images-dir", default="images", help="where rendered files and certificates go (default: images)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="validate a recipe and its version compatibility (offline)")
    c.add_argument("recipe")
    c.set_defaults(func=cmd_check)

    r = sub.add_parser("render", help="render Dockerfile, Singularity.def and lock under images/RECIPE/")
    r.add_argument("recipe", nargs="?")
    r.add_argument("--all", action="store_true", help="every recipe under --recipes-dir")
    r.add_argument("--check", dest="check_only", action="store_true", help="fail (exit 2) if the committed files are stale")
    r.set_defaults(func=cmd_render)

    b = sub.add_parser("build", help="build the image with the Docker engine and check it against the lock")
    b.add_argument("recipe")
    _add_site(b)
    b.set_defaults(func=cmd_build)

    ce = sub.add_parser("certify", help="certify an image on N container nodes")
    ce.add_argument("image")
    _add_certify(ce)
    ce.set_defaults(func=cmd_certify)

    m = sub.add_parser("make", help="check, render, build and certify (default recipe: cpu-torch2)")
    m.add_argument("recipe", nargs="?", default="cpu-torch2")
    _add_site(m)
    _add_certify(m)
    m.set_defaults(func=cmd_make)

    pr = sub.add_parser("probe", help="print this host's node report as JSON")
    pr.add_argument("--host", action="store_true", help="probe the host (outside containers); the default")
    pr.set_defaults(func=cmd_probe)

    ba = sub.add_parser("base", help="base images")
    bsub = ba.add_subparsers(dest="base_command", required=True, parser_class=_Parser)
    bb = bsub.add_parser("bootstrap", help="debootstrap a Debian base image under its own name")
    bb.add_argument("--suite", default="bookworm")
    bb.add_argument("--stands-for", default="debian:bookworm-slim")
    bb.set_defaults(func=cmd_base)
    return p


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``envbuild`` console script. Returns (and exits with) the exit code."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        args = parser().parse_args(argv)
        code = args.func(args)
    except UsageError as exc:
        console.print(str(exc), soft_wrap=True, markup=False)
        code = ExitCode.USAGE
    except EnvbuildError as exc:
        for line in str(exc).splitlines():
            console.print(f"error: {line}", soft_wrap=True, markup=False)
        code = exc.exit_code
    except KeyboardInterrupt as exc:
        console.print(f"interrupted ({exc or 'SIGINT'}); everything envbuild started was removed", markup=False)
        code = INTERRUPTED
    if argv is None:
        sys.exit(int(code))
    return int(code)


if __name__ == "__main__":  # pragma: no cover
    main()
