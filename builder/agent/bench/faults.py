"""TEST-ONLY fault injection: ``ENVBUILD_BENCH_FAULT=KIND@RANK`` (global rank), to prove the host notices a broken rank:
``sleep`` ``SLEEP_S``, ``exit`` 3, or ``oom`` (writes memory 64 MiB at a time up to ``OOM_MAX_BYTES``, exit 3 if not
killed). Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass

ENV_VAR = "ENVBUILD_BENCH_FAULT"
KINDS = ("sleep", "exit", "oom")
SLEEP_S = 3600
EXIT_CODE = 3
OOM_MAX_BYTES = 2 << 30


@dataclass(frozen=True)
class Fault:

    kind: str
    rank: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.rank:d}"

    def hits(self, kind: str, rank: int) -> bool:
        return self.kind == kind and self.rank == rank


def parse_fault(spec: str | None) -> Fault | None:
    """Parse ``"KIND@RANK"``; unset gives None; ValueError on a bad spec."""
    if spec is None or not spec.strip():
        return None
    kind, sep, rank = spec.strip().partition("@")
    if not sep:
        raise ValueError(f"{ENV_VAR}={spec!r}: expected KIND@RANK")
    if kind not in KINDS:
        raise ValueError("{}={!r}: unknown kind {!r} (one of {})".format(ENV_VAR, spec, kind, ", ".join(KINDS)))
    if not rank.isdigit():
        raise ValueError(f"{ENV_VAR}={spec!r}: rank {rank!r} is not a non-negative integer")
    return Fault(kind, int(rank))
