"""TEST-ONLY fault injection for the profile checks: ``ENVBUILD_BENCH_PROFILE_FAULT``.

TEST-ONLY. envbuild's own tests set it to prove that each check notices a broken rank;
never set it when certifying an image. The value is a comma list (at most
``MAX_FAULTS`` items, ``MAX_LEN`` characters) of ``KIND[:TARGET]@RANK``, RANK being the
global rank that misbehaves; several faults may share one run. Kinds:

``collective-corrupt:<collective>``
    after the correctness run of that collective (one of ``collectives.COLLECTIVES``)
    at every size and dtype, that rank overwrites the last element of its result with
    -2: its ``wrong`` is 1 at every size, so the row's ``wrong`` is >= 1.
``ddp-grad-perturb``
    a DDP communication hook on that rank adds 1.0 to the first element of each
    gradient bucket before the all-reduce: every rank then holds the same wrong average
    (the replicas stay identical, so a checksum comparison cannot see it), but the
    parameters leave the single-process reference.
``fsdp-shard-perturb``, ``tp-shard-perturb``
    after sharding, that rank adds 0.01 to the first element of its local shard of the
    first parameter: a perturbed shard.
``pipeline-message-alter``, ``pipeline-message-drop``
    the activation that rank's stage receives from the previous stage is changed (one
    element + 0.1) or lost (replaced by zeros) before the stage uses it; on stage 0 the
    microbatch input is changed the same way.
``moe-expert-perturb``
    the expert on that rank adds 0.05 to every output element it returns to the ranks
    that routed tokens to it.

Stdlib only (the host imports this in its unit tests). A separate variable from
``ENVBUILD_BENCH_FAULT`` (``bench.faults``: one fault of the all-reduce/DDP benchmark),
so both parsers stay strict and both kinds of faults can be set in one run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .collectives import COLLECTIVES

ENV_VAR = "ENVBUILD_BENCH_PROFILE_FAULT"
KINDS = ("collective-corrupt", "ddp-grad-perturb", "fsdp-shard-perturb", "tp-shard-perturb",
         "pipeline-message-alter", "pipeline-message-drop", "moe-expert-perturb")
NEEDS_TARGET = {"collective-corrupt": COLLECTIVES}
MAX_FAULTS = 16
MAX_LEN = 1024
_ITEM = re.compile(r"([a-z][a-z-]{0,39})(?::([a-z_]{1,40}))?@([0-9]{1,6})")

# Magnitudes of the perturbations (see the module docstring), far above the tolerance of
# training.TOLERANCE so a fault is always seen.
GRAD_DELTA = 1.0
SHARD_DELTA = 1e-2
MESSAGE_DELTA = 0.1
EXPERT_DELTA = 0.05


@dataclass(frozen=True)
class ProfileFault:
    """One parsed fault: ``kind`` (of ``KINDS``), ``target`` (a collective for
    ``collective-corrupt``, else None) on global rank ``rank``."""

    kind: str
    target: str | None
    rank: int

    def __str__(self) -> str:
        name = self.kind if self.target is None else f"{self.kind}:{self.target}"
        return f"{name}@{self.rank:d}"

    def hits(self, kind: str, rank: int, target: str | None = None) -> bool:
        """True when this fault is ``kind`` (with ``target``, when given) on ``rank``."""
        return (self.kind == kind and self.rank == rank
                and (target is None or self.target == target))


def _show(text: str) -> str:
    """``text`` as a one-line escaped repr, at most ~80 characters."""
    r = repr(text)
    return r if len(r) <= 80 else r[:77] + "..."


def parse_faults(spec: str | None) -> tuple[ProfileFault, ...]:
    """Parse the variable's value; None, "" or only blanks (unset) give ``()``.

    E.g. ``"collective-corrupt:all_gather@1,moe-expert-perturb@0"`` ->
    ``(ProfileFault("collective-corrupt", "all_gather", 1),
    ProfileFault("moe-expert-perturb", None, 0))``. Blanks around items are ignored.

    Raises:
        ValueError: (naming the variable and the bad item, escaped) a value longer than
            ``MAX_LEN``, more than ``MAX_FAULTS`` items, an empty item, an item not of
            the form KIND[:TARGET]@RANK, an unknown kind or target, a missing or
            unexpected target, a RANK of more than 6 digits, or the same fault twice.
    """
    if spec is None or not spec.strip():
        return ()
    if len(spec) > MAX_LEN:
        raise ValueError(f"{ENV_VAR}: value of {len(spec):d} characters (at most {MAX_LEN:d})")
    items = [item.strip() for item in spec.split(",")]
    if len(items) > MAX_FAULTS:
        raise ValueError(f"{ENV_VAR}: {len(items):d} faults (at most {MAX_FAULTS:d})")
    out = []
    for item in items:
        fault = _parse_item(item)
        if fault in out:
            raise ValueError(f"{ENV_VAR}: fault {_show(item)} given twice")
        out.append(fault)
    return tuple(out)


def _parse_item(item: str) -> ProfileFault:
    m = _ITEM.fullmatch(item)
    if m is None:
        raise ValueError(f"{ENV_VAR}: item {_show(item)} is not KIND[:TARGET]@RANK")
    kind, target, rank = m.group(1), m.group(2), int(m.group(3))
    if kind not in KINDS:
        raise ValueError("{}: unknown kind {} (one of {})".format(ENV_VAR, _show(kind), ", ".join(KINDS)))
    allowed = NEEDS_TARGET.get(kind)
    if allowed is None and target is not None:
        raise ValueError(f"{ENV_VAR}: kind {kind} takes no target, got {_show(target)}")
    if allowed is not None and target is None:
        raise ValueError("{}: kind {} needs a target, one of {}".format(ENV_VAR, kind, ", ".join(allowed)))
    if allowed is not None and target not in allowed:
        raise ValueError("{}: unknown target {} of {} (one of {})".format(
            ENV_VAR, _show(target), kind, ", ".join(allowed)))
    return ProfileFault(kind, target, rank)
