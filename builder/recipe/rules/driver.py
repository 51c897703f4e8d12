"""Rule on the NVIDIA driver: the floors of the variant's CUDA, full support and minor-version
compatibility [NV-RN Table 3, NV-MVC]."""

from __future__ import annotations

from ..spec import NOTE, WARNING
from .context import Ctx, severity, version


def driver(c: Ctx) -> None:
    """Driver floors [NV-RN Table 3, NV-MVC]."""
    if not c.vcuda:
        return
    drv = c.data.cuda_driver.get(c.vcuda)
    if drv is None:
        c.add(WARNING, "driver-unknown", ["torch.variant"], f"envbuild has no driver floor for CUDA {c.vcuda}",
              "NV-RN (U)")
        return
    tag = drv.tag
    c.dmin, c.dcompat = drv.ga, drv.minor_compat
    compat = (f"; >= {c.dcompat} runs under minor-version compatibility (no PTX JIT)" if c.dcompat != c.dmin
              else " (no lower floor under minor-version compatibility)")
    c.add(NOTE, "driver-floor", ["torch.variant"], f"{c.variant} needs driver >= {c.dmin} (CUDA {c.vcuda} GA){compat}",
          f"NV-RN, NV-MVC ({tag})")
    given = c.driver
    if not given:
        return
    if version(given) < version(c.dcompat):
        tail = (f" even with minor-version compatibility; full support needs >= {c.dmin}" if c.dcompat != c.dmin
                else "")
        c.add(severity(tag), "driver-too-old", ["cuda.driver"],
              f"driver {given} is below {c.dcompat}, the oldest that runs CUDA {c.vcuda} ({c.variant}){tail}",
              f"NV-MVC ({tag})")
    elif version(given) < version(c.dmin):
        c.add(WARNING, "driver-minor-compat", ["cuda.driver"],
              f"driver {given} is below {c.dmin} (CUDA {c.vcuda} GA): runs only under minor-version compatibility "
              "(no PTX JIT, some APIs fail)", f"NV-MVC ({tag})")
