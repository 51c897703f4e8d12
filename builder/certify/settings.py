"""The settings of one certification run, resolved once: the lock's ``certify`` section, then
what the command line overrides, checked; and the socket interface setting the run uses.

:func:`resolve` is the one place that turns a lock and :class:`Overrides` into
:class:`RunSettings`. Settings the lock leaves out come from :data:`DEFAULTS` (the one
default table of certification until the recipe model's ``CertifySettings`` holds it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from builder.core.errors import EnvbuildError, ExitCode
from builder.core.model import Model
from builder.launchers.base import SOCKET_VARS, socket_env

#: Defaults for settings missing from the lock's ``certify`` section.
DEFAULTS: dict[str, Any] = {
    "backend": "gloo",
    "nodes": 2,
    "gpus_per_node": 0,
    "port": 29500,
    "shm_size": "256m",
    "timeout_s": 300,
    "allreduce": {"sizes": [8, 1024, 65536, 1048576, 4194304], "iters": 10, "warmup": 2},
    "ddp": {"steps": 3, "batch_size": 8, "image_size": 64},
    "thresholds": {"min_busbw_gbps": None, "busbw_size": None},
    "profiles": ["ddp"],
}

#: Element size of the all-reduce dtype the bench uses by default (float32).
ELEMENT_BYTES = 4
#: Most sizes of one sweep (``--sizes``), and the largest size (1 TiB).
MAX_SIZES = 64
MAX_SIZE_BYTES = 1 << 40
_SIZE = re.compile(r"([0-9]{1,13})([KMGTkmgt]?)")
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864: decimal bytes with an optional binary suffix K, M, G or T (as
    nccl-tests' ``-b``/``-e``); blanks around it are ignored, nothing else. Raises
    ValueError naming the text (escaped)."""
    m = _SIZE.fullmatch(text.strip(" "))
    if m is None:
        raise ValueError(f"size {text[:40]!r} is not a number of bytes with an optional K, M, G or T")
    n = int(m.group(1)) * _UNIT[m.group(2).lower()]
    if not 1 <= n <= MAX_SIZE_BYTES:
        raise ValueError(f"size {text[:40]!r} is outside 1 B..1T")
    return n


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: ``MIN:MAX`` (MIN, 2 x MIN, 4 x MIN... up to MAX, as nccl-tests ``-b MIN
    -e MAX -f 2``) or a comma list; e.g. ``"1K:8K"`` -> ``[1024, 2048, 4096, 8192]``,
    ``"8,1K,4M"`` -> ``[8, 1024, 4194304]`` (sorted, each once). Each a multiple of 4 bytes
    (a float32 element), at most :data:`MAX_SIZES` sizes.

    Raises:
        ValueError: (one line, naming the bad part) anything else.
    """
    if not isinstance(text, str) or not text.strip() or len(text) > 1000:
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
    """What the caller (the command line) asks for instead of the lock's settings; None:
    the lock's. ``min_busbw_gbps`` given here gates on gloo too; ``socket_ifname`` is
    ``--socket-ifname`` (:func:`socket_settings`)."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    backend: str | None = None
    port: int | None = None
    timeout_s: float | None = None
    min_busbw_gbps: float | None = None
    busbw_size: int | None = None
    shm_size: str | None = None
    sizes: list[int] | None = None
    iters: int | None = None
    warmup: int | None = None
    ddp_steps: int | None = None
    ddp_batch: int | None = None
    ddp_image_size: int | None = None
    socket_ifname: str | None = None
    profiles: list[str] | None = None
    dtypes: list[str] | None = None
    min_scaling_efficiency: float | None = None


class RunSettings(Model, frozen=True):
    """The resolved settings of one certification (lock's, overridden by arguments).

    ``min_busbw_gbps`` is the floor actually applied (None: busbw not gated);
    ``busbw_source`` says where it came from (``"argument"``, ``"recipe"`` or None);
    ``recipe_min_busbw_gbps`` is the recipe's threshold, applied or not; ``warnings`` what
    the resolution changed on its own (one line each).
    """

    recipe: str
    recipe_backend: str
    backend: str
    nodes: int
    gpus_per_node: int
    port: int
    shm_size: str | None
    timeout_s: float
    sizes: list[int]
    iters: int
    warmup: int
    ddp_steps: int
    ddp_batch: int
    ddp_image_size: int
    min_busbw_gbps: float | None
    busbw_size: int
    busbw_source: Literal["argument", "recipe"] | None
    recipe_min_busbw_gbps: float | None
    warnings: list[str] = []
    profiles: list[str] = msgspec.field(default_factory=lambda: ["ddp"])
    dtypes: list[str] = msgspec.field(default_factory=lambda: ["float32"])
    min_scaling_efficiency: float | None = None
    overrides: dict[str, Any] = {}

    @property
    def nproc_per_node(self) -> int:
        """Ranks per node: ``max(gpus_per_node, 1)``."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        """Ranks in all."""
        return self.nodes * self.nproc_per_node

    def bench_args(self) -> list[str]:
        """Arguments of ``python3 -m bench`` after ``--out``."""
        return [
            "--backend", self.backend,
            "--sizes", ",".join(str(s) for s in self.sizes),
            "--iters", str(self.iters),
            "--warmup", str(self.warmup),
            "--ddp-steps", str(self.ddp_steps),
            "--ddp-batch", str(self.ddp_batch),
            "--ddp-image-size", str(self.ddp_image_size),
            "--pg-timeout-s", f"{float(self.timeout_s):g}",
            *(["--profiles", ",".join(self.profiles), "--dtypes", ",".join(self.dtypes)] if self.profiles else []),
        ]


def _usage(message: str, field_: str, value: object) -> EnvbuildError:
    return EnvbuildError(message, field=field_, value=value, exit_code=ExitCode.USAGE)


def _pick(arg: Any, section: Any, key: str, default: Any) -> Any:
    if arg is not None:
        return arg
    val = section.get(key) if isinstance(section, Mapping) else None
    return default if val is None else val


def _section(lock: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = lock
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _gpus(o: Overrides, c: Mapping[str, Any], used: str, gpu_visible: bool, warnings: list[str]) -> int:
    """GPUs per node: the override, else the lock's; a GPU recipe certified on CPUs with
    ``--backend gloo`` gets one process per node (and a warning)."""
    if o.gpus_per_node is not None:
        return int(o.gpus_per_node)
    gpus = int(_pick(None, c, "gpus_per_node", DEFAULTS["gpus_per_node"]))
    if used == "gloo" and o.backend is not None and gpus > 0 and not gpu_visible:
        warnings.append(f"no GPU visible: certifying on CPUs (recipe asks for {gpus} GPU(s) per node)")
        gpus = 0
    return gpus


def _check(values: Mapping[str, Any], o: Overrides, used: str, gpu_visible: bool) -> None:
    """Ranges (exit 64), then whether the backend and the GPUs asked for can run (exit 2)."""
    if values["nodes"] < 1:
        raise _usage("must be >= 1", "nodes", values["nodes"])
    if values["gpus"] < 0:
        raise _usage("must be >= 0", "gpus_per_node", values["gpus"])
    if not 1 <= values["port"] <= 65535:
        raise _usage("is not a TCP port", "port", values["port"])
    if not values["timeout"] > 0:
        raise _usage("must be > 0", "timeout_s", values["timeout"])
    sizes = values["sizes"]
    if not sizes or any(s < ELEMENT_BYTES or s % ELEMENT_BYTES for s in sizes):
        raise _usage(f"sizes must be positive multiples of {ELEMENT_BYTES} bytes", "sizes", sizes)
    if o.min_busbw_gbps is not None and not o.min_busbw_gbps >= 0:
        raise _usage("must be >= 0", "min_busbw_gbps", o.min_busbw_gbps)
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


def _busbw_gate(o: Overrides, th: Mapping[str, Any], used: str, sizes: list[int],
                warnings: list[str]) -> tuple[float | None, Literal["argument", "recipe"] | None, int, list[int]]:
    """``(floor applied, its source, gate size, sizes with the gate size)``: the argument's
    floor gates any backend, the recipe's only nccl (CPU figures are noise)."""
    recipe_floor = th.get("min_busbw_gbps")
    gate_size = int(o.busbw_size or th.get("busbw_size") or max(sizes))
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


def resolve(lock: Mapping[str, Any], overrides: Overrides | None = None, *, gpu_visible: bool,
            recipe_backend: str | None = None) -> RunSettings:
    """Resolve the settings: ``lock["certify"]`` (else :data:`DEFAULTS`), overridden by the
    :class:`Overrides` that are not None (None: no overrides).

    Args:
        gpu_visible: whether the nodes can have GPUs (the engine's NVIDIA runtime; a
            cluster's scheduler decides: True).
        recipe_backend: the recipe's backend when the lock has none (the
            ``envbuild.backend`` label).

    Raises:
        EnvbuildError: (exit 2) nccl without a visible GPU ("recipe backend nccl needs
            GPUs; none visible: pass --backend gloo to certify on CPUs"), or GPUs asked
            for on an engine without any; (exit 64) a value out of range.
    """
    o = overrides or Overrides()
    c, ar, dd, th = (_section(lock, "certify"), _section(lock, "certify", "allreduce"),
                     _section(lock, "certify", "ddp"), _section(lock, "certify", "thresholds"))
    warnings: list[str] = []
    rec_backend = c.get("backend") or recipe_backend or DEFAULTS["backend"]
    used = o.backend or rec_backend
    if used not in ("gloo", "nccl"):
        raise _usage("is not a backend (gloo or nccl)", "backend", used)
    values: dict[str, Any] = {
        "nodes": int(_pick(o.nodes, c, "nodes", DEFAULTS["nodes"])),
        "gpus": _gpus(o, c, used, gpu_visible, warnings),
        "port": int(_pick(o.port, c, "port", DEFAULTS["port"])),
        "timeout": float(_pick(o.timeout_s, c, "timeout_s", DEFAULTS["timeout_s"])),
        "sizes": [int(x) for x in (o.sizes if o.sizes is not None
                                   else (ar.get("sizes") or DEFAULTS["allreduce"]["sizes"]))],
    }
    _check(values, o, used, gpu_visible)
    floor, source, gate_size, sizes = _busbw_gate(o, th, used, values["sizes"], warnings)
    recipe_floor = th.get("min_busbw_gbps")
    names, dtypes = _profile_settings(o, c, used)
    return RunSettings(
        recipe=str(lock.get("recipe") or "unknown"), recipe_backend=rec_backend, backend=used,
        nodes=values["nodes"], gpus_per_node=values["gpus"], port=values["port"],
        shm_size=_pick(o.shm_size, c, "shm_size", DEFAULTS["shm_size"]), timeout_s=values["timeout"],
        sizes=sizes, iters=int(_pick(o.iters, ar, "iters", DEFAULTS["allreduce"]["iters"])),
        warmup=int(_pick(o.warmup, ar, "warmup", DEFAULTS["allreduce"]["warmup"])),
        ddp_steps=int(_pick(o.ddp_steps, dd, "steps", DEFAULTS["ddp"]["steps"])),
        ddp_batch=int(_pick(o.ddp_batch, dd, "batch_size", DEFAULTS["ddp"]["batch_size"])),
        ddp_image_size=int(_pick(o.ddp_image_size, dd, "image_size", DEFAULTS["ddp"]["image_size"])),
        min_busbw_gbps=floor, busbw_size=gate_size, busbw_source=source,
        recipe_min_busbw_gbps=None if recipe_floor is None else float(recipe_floor), warnings=warnings,
        profiles=names, dtypes=dtypes, min_scaling_efficiency=o.min_scaling_efficiency,
        overrides={k: v for k, v in o.to_dict().items() if v is not None},
    )


def _profile_settings(o: Overrides, c: Mapping[str, Any], used: str) -> tuple[list[str], list[str]]:
    """``(profiles, dtypes)``: the override, else the lock's ``certify.profiles``, else
    ``["ddp"]``; dtypes the override, else float32 (and bfloat16 on nccl). An empty
    override (``profiles=[]``, not reachable from the command line) runs no profile: the
    all-reduce sweep and the DDP steps alone.

    Raises:
        EnvbuildError: (exit 64) an unknown profile or dtype, an efficiency floor outside 0..1.
    """
    from builder.agent.bench import profiles as bench_profiles

    given = o.profiles if o.profiles is not None else c.get("profiles") or DEFAULTS["profiles"]
    if not given:
        return [], []
    try:
        names = bench_profiles.parse_profiles(",".join(str(p) for p in given))
        dtypes = list(o.dtypes) if o.dtypes else bench_profiles.default_dtypes(used)
        bench_profiles.check_options(names, [8], 1, 0, dtypes, used)
    except ValueError as e:
        raise _usage(str(e), "profiles" if o.dtypes is None else "dtype", given) from None
    if o.min_scaling_efficiency is not None and not 0 < o.min_scaling_efficiency <= 1:
        raise _usage("must be in (0, 1]", "min_scaling_efficiency", o.min_scaling_efficiency)
    return names, dtypes


# --------------------------------------------------------------------------- socket settings

#: Where the socket interface setting of a run came from (``socket.source`` of the
#: certificate): the image's own ``ENV``, the ``--socket-ifname`` option, or neither
#: (``default``: unset; NCCL and gloo choose: NCCL the first interface not ``lo`` or
#: ``docker*``, gloo the address of the hostname).
SOCKET_SOURCES = ("image", "--socket-ifname", "default")


class SocketSetting(Model, frozen=True):
    """The socket interface setting a run uses and where it comes from (``source``, one
    of :data:`SOCKET_SOURCES`); ``override`` the ``--socket-ifname`` value."""

    source: Literal["image", "--socket-ifname", "default"]
    override: str | None
    GLOO_SOCKET_IFNAME: str | None
    NCCL_SOCKET_IFNAME: str | None

    def get(self, var: str) -> str | None:
        """The value of socket variable ``var`` (``GLOO_SOCKET_IFNAME`` or ``NCCL_SOCKET_IFNAME``)."""
        return self.GLOO_SOCKET_IFNAME if var == "GLOO_SOCKET_IFNAME" else self.NCCL_SOCKET_IFNAME


def socket_settings(image_env: Mapping[str, str], override: str | None) -> SocketSetting:
    """The socket interface setting a run uses: with an override, the values it sets
    (:func:`~builder.launchers.base.socket_env`); else the image's ``ENV`` values
    (``source`` ``image`` when it sets either), else None (``default``)."""
    if override is not None:
        env = socket_env(override)
        return SocketSetting(source="--socket-ifname", override=override,
                             GLOO_SOCKET_IFNAME=env["GLOO_SOCKET_IFNAME"], NCCL_SOCKET_IFNAME=env["NCCL_SOCKET_IFNAME"])
    values = {k: image_env.get(k) for k in SOCKET_VARS}
    source: Literal["image", "default"] = "image" if any(v is not None for v in values.values()) else "default"
    return SocketSetting(source=source, override=None, GLOO_SOCKET_IFNAME=values["GLOO_SOCKET_IFNAME"],
                         NCCL_SOCKET_IFNAME=values["NCCL_SOCKET_IFNAME"])
