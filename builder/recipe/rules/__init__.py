"""The compatibility rules over a loaded recipe, offline (the bundled facts only): facts tagged V
or M give errors, S or U warnings. Rules skip only fields that failed the schema."""

from __future__ import annotations

from collections.abc import Callable

from builder.core.errors import EnvbuildError, ManyErrors

from ..facts import facts
from ..load import Loaded
from ..spec import Spec
from . import base_image, driver, libraries, network, platform, release, stacks
from .context import Ctx, derive_variant, variant_cuda

#: The rules, in the order their findings are listed.
RULES: tuple[Callable[[Ctx], None], ...] = (release.release_variant, release.cuda, platform.python_os,
                                            libraries.nccl_cudnn, driver.driver, base_image.base_image, release.backend,
                                            release.torch_index, network.socket_ifname, stacks.second_stack,
                                            stacks.companions)


def check(loaded: Loaded) -> Spec:
    """Apply every rule to ``loaded`` (maybe partial) and resolve its pins; never raises."""
    r = loaded.recipe
    data = facts()
    variant = derive_variant(loaded)
    rel = data.torch.get(r.torch.version) if r.torch.version else None
    c = Ctx(loaded=loaded, data=data, variant=variant, rel=rel, vcuda=variant_cuda(variant) if variant else None)
    for rule in RULES:
        rule(c)
    return Spec(name=loaded.name, path=loaded.path, recipe=r, variant=variant or "", torch_local=c.local, cuda=c.vcuda,
                nccl_package=c.nccl_pkg, nccl=c.nccl, cudnn=c.cudnn, glibc=c.glibc or "", driver_min=c.dmin,
                driver_minor_compat_min=c.dcompat, findings=tuple(c.findings), torch_index_url=c.torch_index_url,
                schema_errors=loaded.errors)


def require_ok(spec: Spec) -> Spec:
    """Raise ManyErrors (exit 2) listing every schema error and error finding; else return ``spec``."""
    if spec.failed:
        raise ManyErrors([*spec.schema_errors,
                          *(EnvbuildError(f"{e.message} [{e.source}]", file=spec.path, field=", ".join(e.fields))
                            for e in spec.errors)])
    return spec
