"""``envbuild rebuild RECIPE --compare``: the recipe's image built again from its rendered files with BuildKit's cache
off, its installed files (:mod:`.fshash`, read from never started containers) compared with the image it should
equal. What two uncached builds still differ in is measured in docs/reproducibility.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from builder.core.errors import Unreachable

from . import build, fshash
from .buildkit import BuildFailed, BuildkitCLI, buildkit_cli
from .engine import Engine

#: On a rebuilt image: the ID of the image it was rebuilt to be compared with.
LABEL_REBUILD_OF = "envbuild.rebuild-of"
#: Differing paths a comparison lists (all are counted).
MAX_LISTED = 200


@dataclass
class Comparison:
    """Installed files of ``image`` and ``rebuilt`` (image IDs); ``differing``: paths whose entries differ (the first
    :data:`MAX_LISTED` in ``differences``); ``layers_equal``: the rebuilt image's layer diffIDs equal to the image's
    at the same position, of ``layers``."""

    image: str
    rebuilt: str
    trees: tuple[fshash.FsHash, fshash.FsHash]
    differing: int
    differences: list[fshash.Difference]
    layers: int
    layers_equal: int

    @property
    def equal(self) -> bool:
        return self.trees[0].sha256 == self.trees[1].sha256


def compare(client: Engine, image: str, rebuilt: str, labels: Mapping[str, str] | None = None) -> Comparison:
    """The installed files of two images compared. Raises NoSuchImage, Unreachable (exit 3)."""
    ids = client.image(image).id, client.image(rebuilt).id
    trees = fshash.image_fshash(client, ids[0], labels=labels), fshash.image_fshash(client, ids[1], labels=labels)
    a, b = trees
    differing = fshash.differences(a, b, len(a.lines) + len(b.lines))  # one pass: every differing path
    layers = [(client.image(i).doc.get("RootFS") or {}).get("Layers") or [] for i in ids]
    return Comparison(image=ids[0], rebuilt=ids[1], trees=trees, differing=len(differing),
                      differences=differing[:MAX_LISTED], layers=len(layers[1]),
                      layers_equal=sum(1 for x, y in zip(*layers, strict=False) if x == y))


def rebuild(options: build.BuildOptions, client: Engine, of: str, *, cli: BuildkitCLI | None = None,
            **kw: object) -> build.BuildResult:
    """Build ``options.recipe`` from its rendered files without BuildKit's cache, under ``options.tag``, labelled
    :data:`LABEL_REBUILD_OF` ``of``; ``kw`` as :func:`builder.image.build.build`'s. Raises Unreachable (exit 3): the
    build failed (nothing to compare); LockMismatch (exit 2): the rebuilt image does not match its lock."""
    cli = cli or buildkit_cli()
    options = dataclasses.replace(options, rebuild=True, labels={**options.labels, LABEL_REBUILD_OF: of})
    try:
        return build.build(options, client, cli=dataclasses.replace(cli, argv=(*cli.argv, "--no-cache")),
                           **kw)  # type: ignore[arg-type]
    except BuildFailed as e:
        raise Unreachable(f"cannot compare: the rebuild failed: {e.message}", file=e.file) from None
