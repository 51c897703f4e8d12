"""The Apptainer/SingularityCE definition of a recipe (template ``templates/Singularity.def.j2``):
one ``%post`` that makes the venv; label values written raw (one line each), not JSON-quoted."""

from __future__ import annotations

from typing import ClassVar

from builder.core.paths import SINGULARITY_DEF

from .context import Context


class SingularityDef(Context):
    """The Singularity definition writer: the shared context as it is."""

    file_name: ClassVar[str] = SINGULARITY_DEF
    template: ClassVar[str] = "Singularity.def.j2"
