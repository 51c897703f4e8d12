"""``envbuild check``, ``audit``, ``render`` and ``lock``: the recipe, its rules, its rendered
files and its resolved pins."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from builder.cli import output
from builder.cli.documents import Render, check_document
from builder.cli.output import console, out
from builder.core.errors import EnvbuildError, ExitCode, Unreachable, UsageError

if TYPE_CHECKING:
    from builder.recipe.spec import Spec


def load_spec(name: str, recipes_dir: str) -> Spec:
    """Schema errors and findings of recipe ``name`` in one Spec; Unreachable (3), EnvbuildError (2): bad YAML."""
    from builder.recipe import load, rules

    return rules.check(load.parse(load.find(name, recipes_dir)))


def print_findings(spec: Spec) -> None:
    """Every schema error (capped as :class:`~builder.core.errors.ManyErrors`), then each finding, a line each."""
    from builder.core.errors import ManyErrors

    if spec.schema_errors:
        for line in str(ManyErrors(list(spec.schema_errors))).splitlines():
            output.finding("error", line)
    for f in spec.findings:
        output.finding(f.level, f.line(spec.path))


def cmd_check(args: argparse.Namespace) -> int:
    """``envbuild check RECIPE``: 0 compatible, 1 warnings only (printed), 2 errors (schema or rules)."""
    from builder.core.inputs import escape

    spec = load_spec(args.recipe, args.recipes_dir)
    print_findings(spec)
    output.emit(check_document(spec))
    if spec.failed:
        return ExitCode.CHECK_FAILED
    output.put(f"{escape(spec.path)}: ok: torch {spec.torch_local}, python {spec.recipe.python}, "
               f"cuda {spec.cuda or 'none'}, nccl {spec.nccl or ('bundled in the wheel' if spec.cuda else 'none')}")
    return ExitCode.OK


def _check_to_recipe(args: argparse.Namespace) -> None:
    """``--to-recipe``: one FILE and a recipe file name (``<name>.yaml``), else exit 64."""
    from builder.core.inputs import show
    from builder.recipe import fields, load

    target = Path(args.to_recipe)
    if len(args.files) != 1:
        raise UsageError("envbuild audit: --to-recipe takes exactly one FILE")
    if target.suffix not in load.SUFFIXES or not (len(target.stem) <= fields.MAX_RECIPE_NAME
                                                   and fields.RECIPE_NAME.fullmatch(target.stem)):
        raise UsageError(f"envbuild audit: --to-recipe: {show(args.to_recipe)} is not a recipe file name "
                         "(<name>.yaml, <name> lower-case [a-z0-9] joined by '.', '_' or '-')")


def cmd_audit(args: argparse.Namespace) -> int:
    """``envbuild audit``: the worst file's code (3: malformed or unreadable); ``--to-recipe`` refused: 2."""
    from builder.audit import run, torecipe
    from builder.core.inputs import escape

    if args.to_recipe is not None:
        _check_to_recipe(args)
    build_args = dict(item.split("=", 1) for item in args.build_arg)
    if args.context is not None and not os.path.isdir(args.context):
        raise Unreachable("is not a folder: --context names the build context", file=args.context)
    report, done = run.audit(args.files, driver=args.driver, build_args=build_args, context=args.context)
    from rich.text import Text

    for result in report.files:
        for f in result.findings:
            output.finding(f.level, f.text())
        if result.stack is not None:
            out().print(Text(run.summary(result)), soft_wrap=True)
    output.emit(report)
    code = report.exit_code
    if args.to_recipe is not None:
        try:
            written = torecipe.write(done[0], args.to_recipe, args.driver)
        except EnvbuildError as e:
            output.say(f"error: {escape(str(e), 1000)}")
            return max(code, int(e.exit_code))
        output.say(f"wrote {escape(str(written), 1000)}: check it with `envbuild check {escape(str(written), 1000)}`")
    return code


def render_spec(args: argparse.Namespace, spec: Spec) -> dict[str, str]:
    """Write ``spec``'s rendered files (``check_only``: the diff of stale ones on stdout); each file's state."""
    import difflib

    from builder.core.inputs import escape
    from builder.core.paths import image_dir
    from builder.recipe import rules
    from builder.render import rendered as render
    from builder.render import write as render_write

    rendered = render.render_for(rules.require_ok(spec), args.images_dir)
    folder = image_dir(args.images_dir, spec.name)
    if not getattr(args, "check_only", False):
        where, written = render_write.write(rendered, args.images_dir)
        for name in rendered.files:
            out().print(f"{'wrote' if name in written else 'up to date'} {where / name}", markup=False)
        return {str(where / n): "written" if n in written else "unchanged" for n in rendered.files}
    stale = render_write.stale(rendered, args.images_dir)
    for name in stale:
        path = folder.file(name)
        console().print(f"{path}: stale; run `envbuild render {spec.name}`", soft_wrap=True, markup=False)
        old = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
        new = rendered.files[name].decode("utf-8", "replace")
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), f"{path}",
                                         f"{path} (rendered)", lineterm=""):
            output.put(escape(line, None))
    if not stale:
        out().print(f"{folder.folder}: up to date", markup=False)
    return {str(folder.file(n)): "stale" if n in stale else "unchanged" for n in rendered.files}


def cmd_render(args: argparse.Namespace) -> int:
    """``envbuild render RECIPE [--check]``: write or check the rendered files (2: stale); not for bad recipes."""
    from builder.recipe import load, rules

    if args.all == (args.recipe is not None):
        raise UsageError("envbuild render: give either a RECIPE or --all")
    names = load.names(args.recipes_dir) if args.all else [args.recipe]
    if not names:
        raise EnvbuildError("no recipes (*.yaml) here", file=str(args.recipes_dir))
    files: dict[str, str] = {}
    for name in names:
        spec = load_spec(name, args.recipes_dir)
        if spec.failed:
            rules.require_ok(spec)  # raises every schema and rule error, one line each
        print_findings(spec)
        files |= render_spec(args, spec)
    output.emit(Render(files=files))  # type: ignore[arg-type]
    return ExitCode.CHECK_FAILED if "stale" in files.values() else ExitCode.OK


def cmd_lock(args: argparse.Namespace) -> int:
    """``envbuild lock RECIPE``: pin base digest, pip hashes, apt versions, render again; 1 if some stay open."""
    from builder.cli.commands.image import site_options
    from builder.image import engine
    from builder.oci.client import RegistryClient
    from builder.recipe import rules
    from builder.resolve import lock

    spec = rules.require_ok(load_spec(args.recipe, args.recipes_dir))
    client = None
    if not (args.no_base and args.no_apt):
        try:
            client = engine.connect()
        except EnvbuildError as e:
            output.warn(str(e))
    result = lock.lock(spec, args.images_dir, site_options(args), client, base=not args.no_base, pip=not args.no_pip,
                       apt=not args.no_apt, base_mode=args.base_mode, registry=RegistryClient, say=output.progress)
    doc = result.resolved
    output.emit(doc)
    out().print(f"wrote {result.path}", markup=False)
    for path in result.written:
        out().print(f"wrote {path}", markup=False)
    out().print(f"  base {doc.base.ref} -> {doc.base.digest or 'unresolved'}; "
                f"pip {len(doc.pip)} package(s) with hashes; apt {len(doc.apt)} pin(s)", markup=False, soft_wrap=True)
    for note in result.unresolved:
        output.warn(note)
    return ExitCode.OK
