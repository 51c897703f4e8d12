"""verify's driver floor: a node's driver against the CUDA torch was built for, and against the
image's own CUDA requirement (``NVIDIA_REQUIRE_CUDA``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion
from packaging.version import Version as _Version

from builder.core.documents import NodeReport

from ..report import Node
from .result import FAIL, WARN, Finding

SRC_DRIVER = "NVIDIA CUDA release notes Table 3; minor-version compatibility guide"
SRC_REQUIRE = "NVIDIA container toolkit: NVIDIA_REQUIRE_CUDA (libnvidia-container requirement check)"
#: Alternatives of a requirement read (the nvidia/cuda bases have about 30).
MAX_ALTERNATIVES = 256
_COND = re.compile(r"(cuda|driver|brand|arch)(>=|<=|==|=|<|>)([A-Za-z0-9._-]{1,32})")
Condition = tuple[str, str, str]
#: The brand NVIDIA_REQUIRE_CUDA names, from the words of a GPU's NVML name ("Tesla V100-SXM2-16GB": tesla); names
#: without one of these words (the NVIDIA-branded data-center GPUs) leave the brand unknown [SRC_REQUIRE].
_BRAND = re.compile(r"\b(Tesla|Quadro|GeForce|TITAN)\b(?: (RTX)\b)?")


def gpu_brand(names: list[str]) -> str | None:
    """The brand all GPUs of ``names`` say (``tesla``, ``quadrortx``); None when unknown or mixed."""
    brands = {(m.group(1) + (m.group(2) or "")).lower() if m else None for m in map(_BRAND.search, names)}
    return next(iter(brands)) if len(brands) == 1 else None


@dataclass(frozen=True)
class CudaRequirement:
    """What an image needs of a node's driver."""

    torch_cuda: str | None
    torch: str | None = None
    require: str | None = None
    source: str = ""
    disabled: bool = False


def is_true(value: str | None) -> bool:
    """Go's ``strconv.ParseBool`` true values (how the toolkit reads ``NVIDIA_DISABLE_REQUIRE``)."""
    return (value or "") in ("1", "t", "T", "true", "TRUE", "True")


def parse_require(text: str) -> tuple[list[list[Condition]], list[str]]:
    """``NVIDIA_REQUIRE_CUDA`` as alternatives of conditions ``(key, op, value)``, and the
    tokens that are not conditions (left out; at most :data:`MAX_ALTERNATIVES` read)."""
    alternatives: list[list[Condition]] = []
    bad: list[str] = []
    for token in text.split()[:MAX_ALTERNATIVES]:
        conds = [_COND.fullmatch(part) for part in token.split(",")]
        if all(conds):
            alternatives.append([m.groups() for m in conds if m])  # type: ignore[misc]
        else:
            bad.append(token)
    return alternatives, bad


def default_floors() -> dict[str, dict]:
    """``{"12.8": {"ga": "570.26", "minor_compat": "525.60.13"}, ...}`` from the bundled facts."""
    from builder.recipe.facts import facts

    return {cuda: {"ga": row.ga, "minor_compat": row.minor_compat} for cuda, row in facts().cuda_driver.items()}


def _version(text: str | None) -> _Version | None:
    try:
        return _Version(str(text))
    except (InvalidVersion, TypeError):
        return None


def _major_minor(cuda: str) -> str:
    return ".".join(cuda.split(".")[:2])


def driver_cuda(driver: _Version, floors: dict[str, dict]) -> _Version | None:
    """The newest CUDA whose GA driver ``driver`` reaches (what ``cuDriverGetVersion``
    reports), or None when it reaches none that is known."""
    runs = [v for cuda, f in floors.items() if (v := _version(cuda)) and (ga := _version(f["ga"])) and driver >= ga]
    return max(runs, default=None)


def _compare(have: _Version, op: str, want: _Version) -> bool:
    return {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want,
            "=": have == want, "==": have == want}[op]


def _holds(cond: Condition, driver: _Version, floors: dict[str, dict], brand: str | None = None) -> bool | None:
    """Whether one condition holds for ``driver`` (and the GPUs' ``brand``); None when a report cannot tell."""
    key, op, value = cond
    want = _version(value)
    if key == "brand" and brand and op in ("=", "=="):
        return value.lower() == brand
    if key in ("brand", "arch") or want is None:
        return None
    if key == "driver":
        return _compare(driver, op, want)
    runs = driver_cuda(driver, floors)
    return _compare(runs if runs is not None else _Version("0"), op, want)


def _needed(alternatives: list[list[Condition]], floors: dict[str, dict]) -> str:
    """``"560.28.03 (CUDA 12.6)"``: the GA driver of the first ``cuda>=X`` condition."""
    for alt in alternatives:
        for key, op, value in alt:
            floor = floors.get(_major_minor(value)) if key == "cuda" and op in (">=", ">") else None
            if floor:
                return f"{floor['ga']} (CUDA {value})"
    return "a newer driver"


def hard_floor(req: CudaRequirement, floors: dict[str, dict]) -> tuple[str | None, list[list[Condition]]]:
    """``(driver, unless)`` for the in-pod gate, which lacks a report's nuance: the GA driver of
    ``cuda>=X`` (None: none) and the ``brand``/``arch`` alternatives as driver conditions only."""
    if not req.require or req.disabled:
        return None, []
    alternatives, _ = parse_require(req.require)
    needed = _needed(alternatives, floors).split(" ", 1)[0]
    unless = [[c for c in alt if c[0] == "driver"] for alt in alternatives
              if any(c[0] in ("brand", "arch") for c in alt)]
    return (needed if _version(needed) else None), [u for u in unless if u]


def requirement_finding(name: str, driver: str, req: CudaRequirement, floors: dict[str, dict],
                        gpus: tuple[str, ...] = ()) -> Finding | None:
    """The hard-floor finding of one node's ``driver`` under ``req.require``: fail when no
    alternative holds, warn when one holds but for ``brand``/``arch``, else None."""
    have = _version(driver)
    if not req.require or req.disabled or have is None:
        return None
    alternatives, _ = parse_require(req.require)
    brand = gpu_brand(list(gpus))
    verdicts = [[_holds(c, have, floors, brand) for c in alt] for alt in alternatives]
    if not alternatives or any(all(v is True for v in vs) for vs in verdicts):
        return None
    shown = req.require if len(req.require) <= 120 else req.require[:117] + "..."
    where = f"NVIDIA_REQUIRE_CUDA {shown!r} ({req.source})"
    maybe = [alt for alt, vs in zip(alternatives, verdicts, strict=False) if all(v is not False for v in vs)]
    if maybe:
        alt = ",".join(f"{k}{o}{v}" for k, o, v in maybe[0])
        return Finding(level=WARN, rule="floor", field="driver",
                       message=f"driver: {driver} on {name} is below {_needed(alternatives, floors)}; the image's "
                               f"{where} accepts it only as {alt}: a report cannot tell the GPU brand",
                       nodes=[name], source=SRC_REQUIRE)
    return Finding(level=FAIL, rule="floor", field="driver",
                   message=f"driver: {driver} on {name} is below {_needed(alternatives, floors)}, which the image "
                           f"requires: {where}; the NVIDIA container runtime will not start it",
                   nodes=[name], source=SRC_REQUIRE)


def variant_finding(name: str, driver: str, cuda: str, torch: str | None, floors: dict[str, dict]) -> Finding | None:
    """The floor finding of a ``driver`` for torch's ``cuda``: below the minor-version
    floor fails, below the GA driver warns, no known floor warns; else None."""
    floor = floors.get(_major_minor(cuda))
    if floor is None:
        return Finding(level=WARN, rule="floor", field="driver",
                       message=f"{name}: no driver floor known for CUDA {cuda}", nodes=[name], source=SRC_DRIVER)
    have = _version(driver)
    if have is None:
        return None
    if have < _Version(str(floor["minor_compat"])):
        return Finding(level=FAIL, rule="floor", field="driver",
                       message=f"driver: {driver} on {name} is below {floor['minor_compat']}, the oldest "
                               f"that runs CUDA {cuda} (torch {torch}); full support needs >= {floor['ga']}",
                       nodes=[name], source=SRC_DRIVER)
    if have < _Version(str(floor["ga"])):
        return Finding(level=WARN, rule="floor", field="driver",
                       message=f"driver: {driver} on {name} is below {floor['ga']} (CUDA {cuda} GA): minor-version "
                               "compatibility only (no PTX JIT, some APIs fail)", nodes=[name], source=SRC_DRIVER)
    return None


def _node_findings(n: Node, r: NodeReport, floors: dict[str, dict], req: CudaRequirement | None) -> list[Finding]:
    if not r.driver:
        return []
    hard = requirement_finding(n.name, r.driver, req, floors, tuple(g.name for g in r.gpus)) if req else None
    cuda = (req.torch_cuda if req and req.torch_cuda else None) or (r.torch.cuda if r.torch else None)
    torch = (req.torch if req and req.torch_cuda else None) or (r.torch.version if r.torch else None)
    soft = variant_finding(n.name, r.driver, cuda, torch, floors) if cuda else None
    if hard is not None and hard.level == FAIL:
        return [hard]  # the container does not start: the variant's floor adds nothing
    return [f for f in (hard, soft) if f is not None]


def driver_floor_findings(nodes: list[Node], floors: dict[str, dict] | None = None,
                          requirement: CudaRequirement | None = None) -> list[Finding]:
    """Floor findings for every node with a valid report and a driver."""
    floors = default_floors() if floors is None else floors
    out: list[Finding] = []
    for n in nodes:
        if n.ok and n.report is not None:
            out.extend(_node_findings(n, n.report, floors, requirement))
    return out
