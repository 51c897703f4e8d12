"""Rules on Python, the OS release and glibc: torch has wheels for the Python, the OS ships
that Python, and its glibc runs the wheels [S1, DISTRO, pytorch#141565]."""

from __future__ import annotations

from ..spec import ERROR
from .context import Ctx, severity, version


def python_os(c: Ctx) -> None:
    """Python: Requires-Python and wheels [S1]; OS: system Python and glibc [DISTRO];
    manylinux_2_28 needs glibc >= 2.28 [S1, PT141565]."""
    r = c.r
    if c.rel and r.python:
        lo, hi = c.rel.python
        if not (version(lo) <= version(r.python) <= version(hi)):
            c.add(severity(c.rel.python_tag), "python-wheel", ["python", "torch.version"],
                  f"torch {r.torch.version} has wheels for Python {lo} to {hi}, not {r.python}",
                  f"S1 ({c.rel.python_tag})")
    if not (r.os.id and r.os.version):
        return
    osrel = c.data.os.get(r.os.id, {}).get(r.os.version)
    if osrel is None:
        known = ", ".join(f"{i} {v}" for i, vs in c.data.os.items() for v in vs)
        c.add(ERROR, "os-release", ["os.id", "os.version"],
              f"{r.os.id} {r.os.version} is not a known OS release; known: {known}", "DISTRO (V)")
        return
    c.glibc = osrel.glibc
    if r.python and osrel.python != r.python:
        c.add(ERROR, "os-python", ["python", "os.version"],
              f"Python {r.python} is not the system Python of {r.os.id} {r.os.version} ({osrel.python}); "
              f"use python: \"{osrel.python}\" or another OS release", "DISTRO (V)")
    if c.rel and c.variant:
        tag = c.rel.manylinux_by_variant.get(c.variant, c.rel.manylinux)
        if tag == "manylinux_2_28" and version(c.glibc) < version("2.28"):
            c.add(ERROR, "glibc", ["os.version", "torch.version"],
                  f"torch {c.local} wheels are manylinux_2_28 and need glibc >= 2.28; "
                  f"{r.os.id} {r.os.version} has glibc {c.glibc}", "S1, pytorch#141565 (V)")
