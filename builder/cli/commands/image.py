"""``envbuild build``, ``envbuild rebuild`` and ``envbuild base bootstrap``: the image on the Docker engine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.documents import build_document
from builder.cli.output import console, emit, out, put, warn
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import escape

if TYPE_CHECKING:
    from builder.image.build import BuildResult
    from builder.image.site import SiteOptions
    from builder.recipe.spec import Spec


def site_options(args: argparse.Namespace, *, deferred: bool = False) -> SiteOptions:
    """The site options (``--ca-cert``, ``--wheels``, ``--base``, pip's configuration unless ``--no-site-detect``) of
    build, lock, make; ``deferred``: pip's configuration read only when a build runs (a no-change build does not)."""
    from builder.image.site import SiteOptions

    return SiteOptions.detect(ca_cert=args.ca_cert, wheels=args.wheels, base=args.base, no_detect=args.no_site_detect,
                              deferred=deferred)


def build_spec(args: argparse.Namespace, spec: Spec | str) -> BuildResult:
    """Build (or reuse) the image of ``spec`` or a recipe name and print its tag; the engine only if reuse.find must."""
    from builder.image import build

    name = spec if isinstance(spec, str) else spec.name
    options = build.BuildOptions(recipe=name, images_dir=Path(args.images_dir), site=site_options(args, deferred=True),
                                 base_mode=args.base_mode)
    result = build.build(options, make_console=console, warn=warn)
    for note in result.notes:
        console().print(f"note: {note}", markup=False, soft_wrap=True)
    verb = "reused" if result.reused else "built"
    how = " (recorded for this image ID)" if result.probe_cached else ""
    put(f"{verb} {result.tag} ({result.image_id[:19]}); base {escape(result.base_used)}; probe matches the lock{how}")
    return result


def cmd_build(args: argparse.Namespace) -> int:
    """``envbuild build RECIPE``: build the rendered Dockerfile, then check the probe against the lock."""
    from builder.render import stamp

    # unchanged inputs and rendered files (hashes recorded after the last check): no render needed
    name = stamp.current(args.recipe, args.recipes_dir, args.images_dir)
    if name is None:
        from builder.cli.commands.recipe import load_spec
        from builder.core.paths import image_dir
        from builder.recipe import rules
        from builder.render import rendered as render
        from builder.render import write as render_write

        spec = rules.require_ok(load_spec(args.recipe, args.recipes_dir))
        rendered = render.render_for(spec, args.images_dir)
        stale = render_write.stale(rendered, args.images_dir)
        if stale:
            raise EnvbuildError(f"rendered files are stale ({', '.join(stale)}); run `envbuild render {spec.name}`",
                                file=str(image_dir(args.images_dir, spec.name).folder))
        stamp.record(args.recipe, args.recipes_dir, args.images_dir, spec.name, rendered.files)
        name = spec.name
    emit(build_document(name, build_spec(args, name)))
    return ExitCode.OK


def cmd_base(args: argparse.Namespace) -> int:
    """``envbuild base bootstrap``: make a local Debian base image with debootstrap (air-gapped sites)."""
    from builder.image import bootstrap, engine

    client = engine.connect()
    ref = bootstrap.bootstrap_debian(client, suite=args.suite, stands_for=args.stands_for)
    out().print(f"base image {ref} (stands in for {args.stands_for})")
    return ExitCode.OK


def _compared_image(args: argparse.Namespace, client: Any) -> tuple[str, str]:
    """``(image ID, source)`` the rebuild is compared with: ``--against``, else the recipe's newest certified image,
    else the current build of its lock. Raises Unreachable (exit 3): none of them is on the engine."""
    from builder.image import build, reuse

    if args.against:
        return client.image(args.against).id, "given"
    from builder.publish.store import find_certified

    try:
        return find_certified(client, args.images_dir, args.recipe)[0].id, "certified"
    except EnvbuildError:  # none (or not usable): the current build
        pass
    df, lock, _, official = build.read_rendered(args.recipe, args.images_dir)
    options = build.BuildOptions(recipe=args.recipe, images_dir=Path(args.images_dir), site=site_options(args),
                                 base_mode=args.base_mode)
    found = reuse.find(options, df, lock, official, client)
    if found is None:
        raise Unreachable(f"nothing to compare with: no certified image of {args.recipe} and no build of its lock on "
                          f"the engine; run `envbuild build {args.recipe}` or give --against IMAGE",
                          file=str(Path(args.images_dir) / args.recipe))
    return found.image_id, "current"


def _side(entry: str | None, file: tuple[int, str] | None) -> str:
    return "absent" if entry is None else f"{file[0]} bytes {file[1]}" if file else entry


def _print_comparison(c: Any, source: str) -> None:
    from builder.image import fshash

    a, b = c.trees
    verdict = "equal" if c.equal else f"differs from sha256:{a.sha256}"
    put(f"compared with the {source} image {c.image[:19]}: installed files {fshash.METHOD} sha256:{b.sha256} "
        f"({b.entries} entries) {verdict}")
    put("excluded (volatile, not compared): " + ", ".join(f"{p} ({b.excluded_by.get(p, 0)})" for p in fshash.EXCLUDED))
    put(f"image IDs {'equal' if c.image == c.rebuilt else 'differ'}; layer diffIDs equal: {c.layers_equal} of "
        f"{c.layers}")
    for d in c.differences:
        put(f"  {escape(d.path, 500)}: {_side(d.a, d.file_a)} -> {_side(d.b, d.file_b)}")
    if c.differing > len(c.differences):
        put(f"  ... and {c.differing - len(c.differences)} more")


def cmd_rebuild(args: argparse.Namespace) -> int:
    """``envbuild rebuild RECIPE [--compare]``: build the rendered files again without BuildKit's cache; with
    ``--compare``, compare its installed files with another image of the recipe and remove it (unless ``--keep``)."""
    from builder.cli.documents import rebuild_document
    from builder.image import build, engine, rebuild

    client = engine.connect()
    image, source = _compared_image(args, client) if args.compare else ("", "")
    run = engine.new_run_id()
    options = build.BuildOptions(recipe=args.recipe, images_dir=Path(args.images_dir), site=site_options(args),
                                 base_mode=args.base_mode, tag=f"{build.IMAGE_REPO_PREFIX}{args.recipe}:rebuild-{run}")
    made, comparison, keep = None, None, args.keep or not args.compare
    try:
        if args.rebuilt:  # an earlier rebuild, compared again
            rebuilt, tag, keep = client.image(args.rebuilt).id, args.rebuilt, True
        else:
            try:
                made = rebuild.rebuild(options, client, image or "none", make_console=console, warn=warn)
            except build.LockMismatch as e:
                made = e.result
                raise
            rebuilt, tag = made.image_id, made.tag
            put(f"rebuilt {tag} ({rebuilt[:19]}) without cache; probe matches the lock")
        if args.compare:
            comparison = rebuild.compare(client, image, rebuilt, engine.run_labels(run))
            _print_comparison(comparison, source)
    finally:
        if made is not None and not keep:
            client.untag(made.tag, prune=True)
    if made is not None:
        put(f"kept {tag}" if keep else f"removed {tag}")
    emit(rebuild_document(args.recipe, rebuilt, tag if keep else None, comparison, source))
    return ExitCode.OK if comparison is None or comparison.equal else ExitCode.CHECK_FAILED
