"""The settings of one certification run, resolved once (:func:`resolve`) into the frozen
:class:`~builder.core.certificate.RunSettings` the certificate stores: the lock's ``certify``
section over the one default table, then the command line's :class:`Overrides`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from builder.core.certificate import RunSettings, SocketSetting
from builder.core.errors import EnvbuildError, UsageError
from builder.core.model import Model, convert
from builder.launchers.base import SOCKET_VARS, socket_env
from builder.recipe.model import DEFAULT_PROFILES, CertifySettings, Lock

#: Element size of the all-reduce dtype the bench uses by default (float32).
ELEMENT_BYTES = 4
#: Most sizes of one sweep (``--sizes``), and the largest size (1 TiB).
MAX_SIZES = 64
MAX_SIZE_BYTES = 1 << 40
_SIZE = re.compile(r"([0-9]{1,13})([KMGTkmgt]?)")
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864 bytes (binary suffixes, as nccl-tests' ``-b``/``-e``).
    Raises ValueError naming the text (escaped)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"size {text[:40]!r} is not a number of bytes with an optional K, M, G or T")
    n = int(m.group(1)) * _UNIT[m.group(2).lower()]
    if not 1 <= n <= MAX_SIZE_BYTES:
        raise ValueError(f"size {text[:40]!r} is outside 1 B..1T")
    return n


def parse_sizes(text: str) -> list[int]:
    """``--sizes`` in bytes: ``MIN:MAX`` doubling (nccl-tests ``-b MIN -e MAX -f 2``) or a comma list;
    ``"1K:8K"`` -> ``[1024, 2048, 4096, 8192]``. Each a multiple of 4 (a float32).
    Raises ValueError: (one line, naming the bad part) anything else."""
    if not isinstance(text, str) or not text or len(text) > 1000:
        raise ValueError("sizes must be MIN:MAX or a comma list of sizes (at most 1000 characters)")
    if ":" in text:
        lo_text, _, hi_text = text.partition(":")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo > hi:
            raise ValueError(f"sizes {text[:40]!r}: MIN is above MAX")
        sizes: list[int] = []
        while lo <= hi and len(sizes) <= MAX_SIZES:
            sizes.append(lo)
            lo *= 2
    else:
        sizes = sorted({parse_size(t) for t in text.split(",")})
    if len(sizes) > MAX_SIZES:
        raise ValueError(f"sizes {text[:40]!r}: more than {MAX_SIZES} sizes")
    bad = [n for n in sizes if n % ELEMENT_BYTES]
    if bad:
        raise ValueError(f"size {bad[0]} is not a multiple of {ELEMENT_BYTES} bytes (a float32 element)")
    return sizes


class Overrides(Model, frozen=True):
    """What the command line asks for instead of the lock's settings (None: the lock's).
    ``min_busbw_gbps`` given here gates on gloo too."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    backend: str | None = None
    port: int | None = None
    timeout_s: float | None = None
    min_busbw_gbps: float | None = None
    sizes: list[int] | None = None
    iters: int | None = None
    warmup: int | None = None
    socket_ifname: str | None = None
    profiles: list[str] | None = None
    dtypes: list[str] | None = None
    min_scaling_efficiency: float | None = None


def _gpus(o: Overrides, c: CertifySettings, used: str, gpu_visible: bool, warnings: list[str]) -> int:
    """GPUs per node: the override, else the lock's; a GPU recipe certified on CPUs with
    ``--backend gloo`` gets one process per node (and a warning)."""
    if o.gpus_per_node is not None:
        return int(o.gpus_per_node)
    gpus = c.gpus_per_node
    if used == "gloo" and o.backend is not None and gpus > 0 and not gpu_visible:
        warnings.append(f"no GPU visible: certifying on CPUs (recipe asks for {gpus} GPU(s) per node)")
        gpus = 0
    return gpus


def _check(values: Mapping[str, Any], o: Overrides, used: str, gpu_visible: bool) -> None:
    """Ranges (exit 64), then whether the backend and the GPUs asked for can run (exit 2)."""
    if values["nodes"] < 1:
        raise UsageError("must be >= 1", field="nodes", value=values["nodes"])
    if values["gpus"] < 0:
        raise UsageError("must be >= 0", field="gpus_per_node", value=values["gpus"])
    if not 1 <= values["port"] <= 65535:
        raise UsageError("is not a TCP port", field="port", value=values["port"])
    if not values["timeout"] > 0:
        raise UsageError("must be > 0", field="timeout_s", value=values["timeout"])
    sizes = values["sizes"]
    if not sizes or any(s < ELEMENT_BYTES or s % ELEMENT_BYTES for s in sizes):
        raise UsageError(f"sizes must be positive multiples of {ELEMENT_BYTES} bytes", field="sizes", value=sizes)
    if o.min_busbw_gbps is not None and not o.min_busbw_gbps >= 0:
        raise UsageError("must be >= 0", field="min_busbw_gbps", value=o.min_busbw_gbps)
    gpus = values["gpus"]
    if used == "nccl" and (gpus == 0 or not gpu_visible):
        why = "gpus_per_node is 0" if gpus == 0 else "the Docker engine has no NVIDIA runtime"
        who = "backend nccl" if o.backend else "recipe backend nccl"
        raise EnvbuildError(f"{who} needs GPUs; none visible: pass --backend gloo to certify on CPUs ({why})")
    if gpus > 0 and not gpu_visible:
        raise EnvbuildError(
            f"{gpus} GPU(s) per node asked for; none visible (the Docker engine has no NVIDIA "
            "runtime): pass --gpus-per-node 0 --backend gloo to certify on CPUs"
        )


def _busbw_gate(o: Overrides, c: CertifySettings, used: str, sizes: list[int],
                warnings: list[str]) -> tuple[float | None, Literal["argument", "recipe"] | None, int, list[int]]:
    """``(floor applied, its source, gate size, sizes with the gate size)``: the argument's
    floor gates any backend, the recipe's only nccl (CPU figures are noise)."""
    recipe_floor = c.thresholds.min_busbw_gbps
    gate_size = int(c.thresholds.busbw_size or max(sizes))
    floor: float | None
    source: Literal["argument", "recipe"] | None
    if o.min_busbw_gbps is not None:
        floor, source = float(o.min_busbw_gbps), "argument"
    elif used == "nccl" and recipe_floor is not None:
        floor, source = float(recipe_floor), "recipe"
    else:
        floor, source = None, None
        if recipe_floor is not None:
            warnings.append(f"recipe busbw floor {recipe_floor:g} GB/s not applied on {used} (CPU figures "
                            "are noise); pass --min-busbw to gate")
    if floor is not None and gate_size not in sizes:
        sizes = sorted([*sizes, gate_size])
    return floor, source, gate_size, sizes


def lock_settings(lock: Lock | None) -> CertifySettings:
    """The lock's ``certify`` section; no lock (a foreign image) gets the default table itself."""
    return convert({} if lock is None else msgspec.to_builtins(lock.certify), CertifySettings,
                   file="the image's lock", prefix="certify")


def resolve(lock: Lock | None, overrides: Overrides | None = None, *, gpu_visible: bool,
            recipe_backend: str | None = None) -> RunSettings:
    """:func:`lock_settings` overridden by the :class:`Overrides` that are not None.
    Raises EnvbuildError: (exit 2) nccl or GPUs without a visible GPU; (exit 64) a value out of range."""
    o = overrides or Overrides()
    c = lock_settings(lock)
    rec_backend = c.backend if lock is not None or not recipe_backend else recipe_backend
    used = o.backend or rec_backend
    if used not in ("gloo", "nccl"):
        raise UsageError("is not a backend (gloo or nccl)", field="backend", value=used)
    warnings: list[str] = []
    values: dict[str, Any] = {"nodes": int(o.nodes if o.nodes is not None else c.nodes),
                              "gpus": _gpus(o, c, used, gpu_visible, warnings),
                              "port": int(o.port if o.port is not None else c.port),
                              "timeout": float(o.timeout_s if o.timeout_s is not None else c.timeout_s),
                              "sizes": [int(x) for x in (o.sizes if o.sizes is not None else c.allreduce.sizes)]}
    _check(values, o, used, gpu_visible)
    floor, source, gate_size, sizes = _busbw_gate(o, c, used, values["sizes"], warnings)
    names, dtypes = _profile_settings(o, used)
    recipe_floor = c.thresholds.min_busbw_gbps
    return RunSettings(recipe=lock.recipe if lock else "unknown", recipe_backend=rec_backend, backend=used,
                       nodes=values["nodes"], gpus_per_node=values["gpus"], port=values["port"], shm_size=c.shm_size,
                       timeout_s=values["timeout"], sizes=sizes,
                       iters=int(o.iters if o.iters is not None else c.allreduce.iters),
                       warmup=int(o.warmup if o.warmup is not None else c.allreduce.warmup), ddp_steps=c.ddp.steps,
                       ddp_batch=c.ddp.batch_size, ddp_image_size=c.ddp.image_size, min_busbw_gbps=floor,
                       busbw_size=gate_size, busbw_source=source,
                       recipe_min_busbw_gbps=None if recipe_floor is None else float(recipe_floor), profiles=names,
                       dtypes=dtypes, min_scaling_efficiency=o.min_scaling_efficiency, warnings=warnings,
                       overrides={k: v for k, v in o.to_dict().items() if v is not None})


def _profile_settings(o: Overrides, used: str) -> tuple[list[str], list[str]]:
    """``(profiles, dtypes)``: the overrides, else the defaults.
    Raises EnvbuildError: (exit 64) an unknown profile or dtype, an efficiency floor outside 0..1."""
    from builder.agent.bench import profiles as bench_profiles

    given = o.profiles or list(DEFAULT_PROFILES)
    try:
        names = bench_profiles.parse_profiles(",".join(str(p) for p in given))
        dtypes = list(o.dtypes) if o.dtypes else bench_profiles.default_dtypes(used)
        bench_profiles.check_options(names, [8], 1, 0, dtypes, used)
    except ValueError as e:
        raise UsageError(str(e), field="profiles" if o.dtypes is None else "dtype", value=given) from None
    if o.min_scaling_efficiency is not None and not 0 < o.min_scaling_efficiency <= 1:
        raise UsageError("must be in (0, 1]", field="min_scaling_efficiency", value=o.min_scaling_efficiency)
    return names, dtypes


# --------------------------------------------------------------------------- socket settings

def socket_settings(image_env: Mapping[str, str], override: str | None) -> SocketSetting:
    """The socket interface setting a run uses: the override's, else the image's ``ENV``, else None."""
    if override is not None:
        env = socket_env(override)
        return SocketSetting(source="--socket-ifname", override=override,
                             GLOO_SOCKET_IFNAME=env["GLOO_SOCKET_IFNAME"], NCCL_SOCKET_IFNAME=env["NCCL_SOCKET_IFNAME"])
    values = {k: image_env.get(k) for k in SOCKET_VARS}
    source: Literal["image", "default"] = "image" if any(v is not None for v in values.values()) else "default"
    return SocketSetting(source=source, override=None, GLOO_SOCKET_IFNAME=values["GLOO_SOCKET_IFNAME"],
                         NCCL_SOCKET_IFNAME=values["NCCL_SOCKET_IFNAME"])
