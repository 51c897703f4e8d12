"""Python and PyTorch: the interpreter, torch's version, its CUDA, cuDNN and compiled NCCL."""

from __future__ import annotations

from typing import Any

from .nccl import nccl_version_from_code


def torch_info(errors: list[str]) -> dict[str, Any] | None:
    """torch's facts (None: not importable), never raising; ``nccl_compiled``: its build header (pytorch#116977)."""
    try:
        import torch  # noqa: F401  (lazy: probe runs without torch too)
    except ImportError:
        return None
    except Exception as e:  # a broken install: report it, carry on
        errors.append(f"torch: import failed: {type(e).__name__}: {e}")
        return None
    info: dict[str, Any] = {"version": str(getattr(torch, "__version__", None)), "cuda": None, "cuda_available": False,
                            "cudnn": None, "nccl_compiled": None}
    try:
        info["cuda"] = torch.version.cuda
    except Exception as e:
        errors.append(f"torch: version.cuda: {e}")
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as e:
        errors.append(f"torch: cuda.is_available: {e}")
    try:
        v = torch.backends.cudnn.version()
        info["cudnn"] = None if v is None else str(v)
    except Exception as e:
        errors.append(f"torch: cudnn.version: {e}")
    if info["cuda"] is not None or info["cuda_available"]:
        info["nccl_compiled"] = _nccl_compiled(torch, errors)
    return info


def _nccl_compiled(torch: Any, errors: list[str]) -> str | None:
    try:
        v = torch.cuda.nccl.version()
        if isinstance(v, (tuple, list)):
            return ".".join(str(int(x)) for x in v)
        if isinstance(v, int):  # torch < 1.11 returned the version code
            return nccl_version_from_code(v)
    except Exception as e:
        errors.append(f"torch: cuda.nccl.version: {e}")
    return None
