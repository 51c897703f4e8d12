"""What the torch in the image supports: the ``Unsupported`` outcome and how it is told
apart from a failure.

A collective, dtype or training API the image's torch (or its backend) lacks is not a
failure of the cluster: it is reported as ``{"unsupported": "<reason>"}`` and never
counted as passed. Only errors that say so are taken as "unsupported"; any other error
(a dead peer, a timeout, a bug) propagates and fails the rank.

Stdlib only; the torch-side helpers import torch lazily.
"""

from __future__ import annotations

import re

REASON_MAX = 300  # characters of an error message kept in a reason

# Messages of torch/c10d that mean "no such collective/dtype/feature here". Examples:
# "ProcessGroupGloo does not support reduce_scatter" (torch < 2.1),
# "Unsupported ScalarType BFloat16", "Numpy is not available" (torch built with numpy
# support, numpy not installed: object collectives, pipeline shape inference, dcp.save).
UNSUPPORTED_RE = re.compile(
    r"not supported|does not support|unsupported|not implemented|no support|"
    r"unhandled scalar ?type|invalid scalar ?type|numpy is not available", re.IGNORECASE)

NUMPY_RE = re.compile(r"numpy is not available|no module named .?numpy", re.IGNORECASE)


class Unsupported(Exception):
    """The image's torch or backend lacks what a check needs; ``str()`` is the reason."""


def first_line(text: str, limit: int = REASON_MAX) -> str:
    """First non-empty line of ``text``, stripped and cut to ``limit`` characters."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def unsupported_reason(exc: BaseException) -> str | None:
    """``"<Type>: <first line>"`` when ``exc`` says something is not supported, else None.

    True for NotImplementedError and for a RuntimeError (c10d's DistBackendError is one)
    whose message matches ``UNSUPPORTED_RE``. E.g.
    ``RuntimeError("Numpy is not available")`` -> ``"RuntimeError: Numpy is not available"``;
    ``RuntimeError("Connection closed by peer")`` -> None.
    """
    text = first_line(str(exc))
    if isinstance(exc, NotImplementedError) or (
            isinstance(exc, RuntimeError) and UNSUPPORTED_RE.search(text)):
        return f"{type(exc).__name__}: {text}"
    return None


def needs_numpy(reason: str | None) -> bool:
    """True when an unsupported reason is the missing numpy."""
    return bool(reason and NUMPY_RE.search(reason))


def numpy_problem() -> str | None:
    """None when torch can use numpy in this process, else the reason (one line).

    Tries torch's own conversion first, ``torch.zeros(1).numpy()`` (what object
    collectives and shape inference rely on; without numpy torch says ``"RuntimeError:
    Numpy is not available"``), then ``import numpy``. Communication-free, so ranks can
    agree on it before any collective that would fail on one side only (a one-sided
    failure would leave the peers waiting until the process-group timeout).
    """
    try:
        import torch

        torch.zeros(1).numpy()
        import numpy  # noqa: F401
    except Exception as e:  # RuntimeError("Numpy is not available"), ImportError, ...
        return f"{type(e).__name__}: {first_line(str(e))}"
    return None
