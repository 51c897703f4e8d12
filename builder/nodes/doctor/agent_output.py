"""What the in-node agent prints (:mod:`builder.agent.doctor_agent`), as models checked
before use: the agent runs on the node, so its output is as untrusted as a node report.
A JSON line that breaks its model is refused (:class:`~builder.nodes.report.InvalidReport`,
exit 3) with one line naming the field and the value."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta

from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.model import Model

from ..reporterrors import first_problem

T = TypeVar("T", bound=Model)

Seconds = Annotated[float, Meta(ge=0, le=1e9, description="a number in 0..1e+09")]
#: A timing; a ratio to the median divides by it: never 0.
Timing = Annotated[float, Meta(ge=1e-9, le=1e9, description="a number in 1e-09..1e+09")]
Port = Annotated[int, Meta(ge=0, le=65535, description="a port (0..65535)")]
Small = Annotated[int, Meta(ge=0, le=65535, description="an integer in 0..65535")]
PortKey = Annotated[str, Meta(pattern=r"\A(?:[0-9]{1,5})\Z", max_length=256, description="a port number")]
ProbeId = Annotated[str, Meta(pattern=r"\A(?:[^\x00-\x1f\x7f]{1,2048})\Z", max_length=2048, description="a probe id")]


class Listen(Model, frozen=True):
    """``listen``'s first line: each asked port's state and the sampled ephemeral ports."""

    ports: Annotated[dict[PortKey, Annotated[str, Meta(max_length=512)]], Meta(max_length=1024)]
    sample: Annotated[list[Port], Meta(max_length=1024)]


class Probe(Model, frozen=True):
    """One TCP probe of ``connect``."""

    status: Annotated[Literal["ok", "open", "refused", "timeout", "unreachable", "error"],
                      Meta(description="'ok' or 'open' or 'refused' or 'timeout' or 'unreachable' or 'error'")]
    detail: Annotated[str, Meta(max_length=4096)]
    seconds: Seconds | None


class Connect(Model, frozen=True):
    """``connect``'s result: every probe by its id."""

    results: Annotated[dict[ProbeId, Probe], Meta(max_length=1 << 20)]


class ComputeTiming(Model, frozen=True):
    """This node's compute timed alone."""

    backend: Annotated[str, Meta(max_length=64)]
    iters: Annotated[int, Meta(ge=0, le=2**31 - 1, description="an integer in 0..2147483647")]
    seconds: Annotated[list[Seconds], Meta(max_length=10000)]
    best_s: Timing | None


class Compute(Model, frozen=True):
    """``compute``'s result."""

    compute: ComputeTiming


class Pair(Model, frozen=True):
    """One pairwise all-reduce with ``peer`` in ``round``."""

    peer: Small
    round: Small
    seconds: Timing | None
    error: Annotated[str, Meta(max_length=4096)] | None


class Pairs(Model, frozen=True, omit_defaults=True):
    """``pairs``' result (``error`` without torch)."""

    pairs: Annotated[list[Pair], Meta(max_length=65536)]
    error: Annotated[str, Meta(max_length=4096)] | None = None


def json_line(line: str | None, model: type[T], where: str = "agent") -> T | None:
    """``line`` as a ``model`` when it is a JSON object (bounded:
    :func:`builder.core.inputs.load_json`), else None.

    Raises:
        InvalidReport: (exit 3) a JSON object that does not follow ``model``.
    """
    if not line or not line.lstrip().startswith("{"):
        return None
    try:
        doc = inputs.load_json(line, where, exit_code=ExitCode.UNREACHABLE)
    except EnvbuildError:
        return None
    if not isinstance(doc, dict):
        return None
    try:
        return msgspec.convert(doc, model, strict=True)
    except msgspec.ValidationError as e:
        raise first_problem(e, doc, model, f"{where}: agent output", "the agent's output") from None


def last_json(text: str, model: type[T], where: str = "agent") -> T | None:
    """The last line of ``text`` that is a JSON object, as a ``model`` (see
    :func:`json_line`); None when there is none."""
    for line in reversed(text.strip().splitlines()):
        doc = json_line(line, model, where)
        if doc is not None:
            return doc
    return None
