"""Stage 2: the compatibility rules over a loaded recipe, giving a resolved
:class:`~builder.recipe.spec.Spec` (its pins and every finding).

May import: builder.core, the rest of builder.recipe; packaging.

The facts live in ``builder/recipe/data/compat.yaml`` (:mod:`builder.recipe.facts`). Each rule
names its fact source. Facts tagged V (verified from the artifact) or M (maintainer's
statement) give **errors**; facts tagged S (secondary copy) or U (unverified) give
**warnings** naming their source. One module per topic: :mod:`.release` (torch release,
variant, CUDA, wheel index, backend), :mod:`.platform` (Python, OS, glibc), :mod:`.libraries`
(NCCL, cuDNN), :mod:`.driver` (driver floors), :mod:`.base_image`, :mod:`.stacks` (second
stacks, companion packages), :mod:`.network` (socket interfaces).

``check`` is offline and deterministic: it reads only the bundled facts. Every violation
is listed, each naming the recipe fields, the values and what would be valid; the rules
also run on a partial recipe (:func:`builder.recipe.load.parse`), skipping only what
concerns a field that failed the schema, so that one run lists schema errors and rule
violations.
"""

from __future__ import annotations

from collections.abc import Callable

from builder.core.errors import EnvbuildError, ManyErrors

from ..facts import facts
from ..load import Loaded
from ..spec import Spec
from . import base_image, driver, libraries, network, platform, release, stacks
from .context import Ctx, derive_variant, variant_cuda

#: The rules, in the order their findings are listed.
RULES: tuple[Callable[[Ctx], None], ...] = (
    release.release_variant, release.cuda, platform.python_os, libraries.nccl_cudnn, driver.driver,
    base_image.base_image, release.backend, release.torch_index, network.socket_ifname, stacks.second_stack,
    stacks.companions,
)


def check(loaded: Loaded) -> Spec:
    """Apply every rule to the recipe of ``loaded`` and resolve its pins.

    ``loaded`` may be partial (:func:`builder.recipe.load.parse`; its schema errors ride
    along): rules run on the fields that validated and skip what concerns the others.
    Returns a :class:`Spec` whose ``findings`` hold all errors, warnings and notes (the
    caller decides: :func:`require_ok` raises on errors). Never raises.
    """
    r = loaded.recipe
    data = facts()
    variant = derive_variant(loaded)
    rel = data.torch.get(r.torch.version) if r.torch.version else None
    c = Ctx(loaded=loaded, data=data, variant=variant, rel=rel, vcuda=variant_cuda(variant) if variant else None)
    for rule in RULES:
        rule(c)
    return Spec(
        name=loaded.name,
        path=loaded.path,
        recipe=r,
        variant=variant or "",
        torch_local=c.local,
        cuda=c.vcuda,
        nccl_package=c.nccl_pkg,
        nccl=c.nccl,
        cudnn=c.cudnn,
        glibc=c.glibc or "",
        driver_min=c.dmin,
        driver_minor_compat_min=c.dcompat,
        findings=tuple(c.findings),
        torch_index_url=c.torch_index_url,
        schema_errors=loaded.errors,
    )


def require_ok(spec: Spec) -> Spec:
    """Raise :class:`ManyErrors` (exit 2) listing every schema error and every error finding
    of ``spec``; else return it."""
    if spec.failed:
        raise ManyErrors([*spec.schema_errors,
                          *(EnvbuildError(f"{e.message} [{e.source}]", file=spec.path, field=", ".join(e.fields))
                            for e in spec.errors)])
    return spec
