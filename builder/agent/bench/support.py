"""What the image's torch lacks: ``{"unsupported": reason}``, never passed; only errors that say so count, any other
fails the rank."""

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
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def unsupported_reason(exc: BaseException) -> str | None:
    """``"<Type>: <first line>"`` for NotImplementedError or a RuntimeError matching ``UNSUPPORTED_RE``, else None."""
    text = first_line(str(exc))
    if isinstance(exc, NotImplementedError) or (isinstance(exc, RuntimeError) and UNSUPPORTED_RE.search(text)):
        return f"{type(exc).__name__}: {text}"
    return None


def needs_numpy(reason: str | None) -> bool:
    return bool(reason and NUMPY_RE.search(reason))


def numpy_problem() -> str | None:
    """None when torch can use numpy here, else why; local, so ranks agree before a one-sided failure."""
    try:
        import torch

        torch.zeros(1).numpy()
        import numpy  # noqa: F401
    except Exception as e:  # RuntimeError("Numpy is not available"), ImportError, ...
        return f"{type(e).__name__}: {first_line(str(e))}"
    return None
