"""Test-only fault injection for the bench: ``ENVBUILD_BENCH_FAULT=KIND@RANK``.

TEST-ONLY. Used by envbuild's own tests to prove that the host side notices a broken
rank; never set it when certifying an image. ``RANK`` is the global rank (torchrun's
``RANK``) that misbehaves; the other ranks run normally. Kinds:

``allreduce-corrupt``
    after the correctness all-reduce at each size, that rank changes one element of its
    result (+1 on the last element), so its ``wrong`` is 1 at every size.
``ddp-perturb``
    after the DDP steps, that rank adds 1e-3 to the first element of the first
    parameter before the checksum, so ``params_identical`` is false.
``sleep``
    that rank sleeps 3600 s before the all-reduce sweep; the others block in the first
    collective. The host's timeout must catch it.
``exit``
    that rank exits with status 3 before the all-reduce sweep (no result file).

Stdlib only (the host imports this in its unit tests).
"""

from __future__ import annotations

from dataclasses import dataclass

ENV_VAR = "ENVBUILD_BENCH_FAULT"
KINDS = ("allreduce-corrupt", "ddp-perturb", "sleep", "exit")
SLEEP_S = 3600
EXIT_CODE = 3


@dataclass(frozen=True)
class Fault:
    """A parsed fault: ``kind`` (one of ``KINDS``) on global rank ``rank``."""

    kind: str
    rank: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.rank:d}"

    def hits(self, kind: str, rank: int) -> bool:
        """True when this fault is ``kind`` and targets global rank ``rank``."""
        return self.kind == kind and self.rank == rank


def parse_fault(spec: str | None) -> Fault | None:
    """Parse ``"KIND@RANK"`` (e.g. ``"exit@1"``); None or "" (unset) gives None.

    Raises:
        ValueError: unknown kind, missing ``@``, or RANK not a non-negative integer.
    """
    if spec is None or not spec.strip():
        return None
    kind, sep, rank = spec.strip().partition("@")
    if not sep:
        raise ValueError(f"{ENV_VAR}={spec!r}: expected KIND@RANK")
    if kind not in KINDS:
        raise ValueError(
            "{}={!r}: unknown kind {!r} (one of {})".format(ENV_VAR, spec, kind, ", ".join(KINDS))
        )
    if not rank.isdigit():
        raise ValueError(f"{ENV_VAR}={spec!r}: rank {rank!r} is not a non-negative integer")
    return Fault(kind, int(rank))
