"""``envbuild build`` and ``envbuild base bootstrap``: the image on the Docker engine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from builder.cli.documents import build_document
from builder.cli.output import console, emit, out, put, warn
from builder.core.errors import EnvbuildError, ExitCode
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
