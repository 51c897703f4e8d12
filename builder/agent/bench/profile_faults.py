"""TEST-ONLY fault injection for the profile checks: ``ENVBUILD_BENCH_PROFILE_FAULT``. A comma list of
``KIND[:TARGET]@RANK`` (global rank): ``collective-corrupt:<collective>`` spoils the last element of that rank's
result; ``ddp-grad-perturb`` adds ``GRAD_DELTA`` in a comm hook (the replicas stay identical: a checksum would not see
it); ``*-shard-perturb`` changes the rank's first shard; ``pipeline-message-alter``/``-drop`` change or zero the
received activation; ``moe-expert-perturb`` shifts the expert's outputs. Stdlib only."""

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

# Far above training.TOLERANCE, so a fault is always seen.
GRAD_DELTA = 1.0
SHARD_DELTA = 1e-2
MESSAGE_DELTA = 0.1
EXPERT_DELTA = 0.05


@dataclass(frozen=True)
class ProfileFault:

    kind: str
    target: str | None
    rank: int

    def __str__(self) -> str:
        name = self.kind if self.target is None else f"{self.kind}:{self.target}"
        return f"{name}@{self.rank:d}"

    def hits(self, kind: str, rank: int, target: str | None = None) -> bool:
        return (self.kind == kind and self.rank == rank and (target is None or self.target == target))


def _show(text: str) -> str:
    """``text`` as a one-line escaped repr, at most 80 characters."""
    r = repr(text)
    return r if len(r) <= 80 else r[:77] + "..."


def parse_faults(spec: str | None) -> tuple[ProfileFault, ...]:
    """Parse the variable's value (unset gives ``()``); ValueError names the bad item, escaped."""
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
