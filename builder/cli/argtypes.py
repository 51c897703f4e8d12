"""The argument types of the command line: each value matched whole and bounded, refused as a
usage error (``argparse.ArgumentTypeError``: exit 64) with the value shown escaped.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from builder.core.errors import EnvbuildError
from builder.core.inputs import has_control, show

#: An argparse type: text of the command line -> value.
ArgType = Callable[[str], object]

#: Longest path accepted on the command line (characters; Linux ``PATH_MAX``).
MAX_PATH_CHARS = 4096
#: Most nodes of a certification or a node source.
MAX_NODES = 1024
#: Longest timeout accepted (seconds): a week.
MAX_TIMEOUT_S = 7 * 24 * 3600
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?")
_SUITE = re.compile(r"[a-z][a-z0-9-]{0,31}")
#: Kubernetes names: an RFC 1123 label (namespaces) and subdomain (object names); source:
#: https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
K8S_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
K8S_SUBDOMAIN = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}(?:=.{0,1000})?", re.S)
_ENV_ITEM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}=.{0,4096}", re.S)
_DRIVER = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}")
_BUILD_ARG = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}=[^\x00]{0,4096}", re.S)
_DURATION = re.compile(r"([0-9]{1,9})([smhd]?)")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SELECTOR = re.compile(r"([A-Za-z0-9./_-]{1,316})=([A-Za-z0-9._-]{0,63})")
_HOST_PORT = re.compile(r"(?:\[([0-9A-Fa-f:.]{2,45})\]|([A-Za-z0-9.-]{1,253})):([0-9]{1,5})")
_PAIRS = re.compile(r"[a-z-]{1,32}=[A-Za-z0-9.]{1,20}(?:,[a-z-]{1,32}=[A-Za-z0-9.]{1,20}){0,3}")


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """argparse type: a decimal integer in ``lo..hi``, matched whole (no blanks, no
    ``_``, at most 30 digits; else a usage error, exit 64)."""
    def parse(text: str) -> int:
        value = int(text) if _INT_TEXT.fullmatch(text) else None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{show(text)} is not an integer in {lo}..{hi}")
        return value
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """argparse type: a decimal number in ``lo..hi`` (``(lo..hi]`` with ``lo_open``),
    matched whole: ``nan``, ``inf``, ``1_0`` and blanks are refused (exit 64)."""
    def parse(text: str) -> float:
        value = float(text) if _FLOAT_TEXT.fullmatch(text) else float("nan")
        ok = value == value and (value > lo if lo_open else value >= lo) and value <= hi
        if not ok:
            bounds = f"{'(' if lo_open else '['}{lo:.10g}..{hi:.10g}]"
            raise argparse.ArgumentTypeError(f"{show(text)} is not a number in {bounds}")
        return value
    return parse


def image_ref(text: str) -> str:
    """argparse type: an image reference (:mod:`builder.oci.reference`) or image ID."""
    from builder.oci import reference

    if not (reference.is_valid(text) or reference.IMAGE_ID.fullmatch(text)):
        raise argparse.ArgumentTypeError(
            f"{show(text)} is not an image reference (lower-case name[:tag][@sha256:digest]) or image ID")
    return text


def pattern(regex: re.Pattern[str] | Callable[[], re.Pattern[str]], what: str, limit: int = 255,
            check: Callable[[str], bool] | None = None) -> Callable[[str], str]:
    """argparse type: a value ``regex`` matches whole (``fullmatch``), of at most ``limit``
    characters, without control characters; ``check(text)`` may refuse it too (False).
    ``regex`` may be a function returning the pattern (a stage's, imported at parse time)."""
    def parse(text: str) -> str:
        compiled = regex if isinstance(regex, re.Pattern) else regex()
        if len(text) > limit or has_control(text) or not compiled.fullmatch(text) or (check and not check(text)):
            raise argparse.ArgumentTypeError(f"{show(text)} is not {what}")
        return text
    return parse


def text(what: str, limit: int = 255) -> Callable[[str], str]:
    """argparse type: 1..``limit`` characters of one line (no control characters)."""
    return pattern(re.compile(r".+", re.S), what, limit)


def path(what: str = "a path", *, no_dash: bool = False) -> Callable[[str], str]:
    """argparse type: a path of 1..:data:`MAX_PATH_CHARS` characters without control
    characters (a newline in a file name given on a command line is an error, not a name);
    with ``no_dash`` also not starting with ``-`` (it is handed to another program)."""
    def parse(value: str) -> str:
        if not value or len(value) > MAX_PATH_CHARS or has_control(value) or (no_dash and value.startswith("-")):
            extra = ", not starting with -" if no_dash else ""
            raise argparse.ArgumentTypeError(
                f"{show(value)} is not {what} (1-{MAX_PATH_CHARS} characters without control characters{extra})")
        return value
    return parse


def slurm_value(checker: str) -> Callable[[str], str]:
    """argparse type: a value :mod:`builder.launchers.slurm` ``checker`` accepts (the one
    place that knows what a batch script can carry; imported only when the option is given)."""
    def parse(value: str) -> str:
        from builder.launchers import slurm

        try:
            getattr(slurm, checker)(value)
        except EnvbuildError as e:
            raise argparse.ArgumentTypeError(f"{show(value)} {e.message}") from None
        return value
    return parse


def registry_component(what: str, *, path: bool = False) -> Callable[[str], str]:
    """argparse type: a repository name component (a recipe) or path (``--namespace``) of
    the reference grammar (:data:`builder.oci.reference.COMPONENT`, ``PATH``)."""
    def parse(value: str) -> str:
        from builder.oci import reference

        regex = reference.PATH if path else reference.COMPONENT
        if len(value) > 255 or not regex.fullmatch(value):
            raise argparse.ArgumentTypeError(f"{show(value)} is not {what}")
        return value
    return parse


def registry(value: str) -> str:
    """argparse type: a registry ``HOST[:PORT]`` (:func:`builder.oci.reference.is_host`)."""
    from builder.oci import reference

    if len(value) > 255 or has_control(value) or not reference.is_host(value):
        raise argparse.ArgumentTypeError(f"{show(value)} is not a registry HOST[:PORT]")
    return value


def host_port(value: str) -> tuple[str, int]:
    """argparse type: ``HOST:PORT`` or ``[IPv6]:PORT``, the port 1..65535."""
    m = _HOST_PORT.fullmatch(value)
    if m is None or not 1 <= int(m[3]) <= 65535:
        raise argparse.ArgumentTypeError(f"{show(value)} is not HOST:PORT (port 1..65535)")
    return (m[1] or m[2], int(m[3]))


def socket_ifname(value: str) -> str | None:
    """argparse type of ``--socket-ifname`` (:func:`builder.launchers.base.check_socket_ifname`)."""
    from builder.launchers.base import check_socket_ifname

    try:
        return check_socket_ifname(value)
    except EnvbuildError as e:
        raise argparse.ArgumentTypeError(f"{show(value)} {e.message}") from None


def node_source(checker: str, *extra: str, split: bool = False) -> ArgType:
    """argparse type: :mod:`builder.nodes.sources` ``checker`` on the value (with ``extra``
    arguments after it), or on each item of a comma list (``split``); a refused value is a
    usage error (exit 64). The node sources are imported when a value is parsed."""
    def parse(value: str) -> object:
        from builder.nodes import sources

        check = getattr(sources, checker)
        try:
            return [check(h, *extra) for h in value.split(",") if h] if split else check(value, *extra)
        except EnvbuildError as e:
            raise argparse.ArgumentTypeError(f"{show(e.value)} {e.message}") from None
    return parse


def _shm_size() -> re.Pattern[str]:
    """The shm size grammar of recipes (:data:`builder.recipe.fields.SHM_SIZE`)."""
    from builder.recipe import fields

    return fields.SHM_SIZE


suite = pattern(_SUITE, "a Debian suite name such as bookworm")
size = pattern(_shm_size, "a size such as 256m or 1g", limit=20)
label = pattern(_LABEL, "a label KEY[=VALUE]", limit=1256)
env_item = pattern(_ENV_ITEM, "NAME=VALUE", limit=4300)
driver = pattern(_DRIVER, "a driver version such as 570.124.06", limit=40)
build_arg = pattern(_BUILD_ARG, "NAME=VALUE", limit=4300)
recipe = path("a recipe name or path")


def duration(text: str) -> float:
    """Seconds from ``30d``, ``12h``, ``90m``, ``3600s`` or ``3600`` (> 0, matched whole)."""
    m = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if m is None or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{show(text)} is not a duration like 30d, 12h, 90m or 3600s (> 0)")
    return float(int(m.group(1)) * _DURATION_UNITS[m.group(2)])


def node_selector(text: str) -> tuple[str, str]:
    """A Kubernetes node selector ``KEY=VALUE`` (a label key and value)."""
    m = _SELECTOR.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise argparse.ArgumentTypeError(f"{show(text)} is not a node label KEY=VALUE")
    return m.group(1), m.group(2)


def k8s_pairs(text: str) -> dict[str, str]:
    """``cpu=Q,memory=Q`` as a dict (the quantities are checked by builder.launchers.k8s)."""
    pairs = [p.partition("=") for p in text.split(",")] if _PAIRS.fullmatch(text or "") else []
    if not pairs or len({k for k, _, _ in pairs}) != len(pairs):
        raise argparse.ArgumentTypeError(f"{show(text)} is not KEY=QUANTITY[,KEY=QUANTITY] (each key once)")
    return {k: v for k, _, v in pairs}


def _value_error_type(parse: Callable[[str], object]) -> ArgType:
    """argparse type from a parser raising ValueError (a one-line message naming the value)."""
    def convert(value: str) -> object:
        if has_control(value):  # a trailing newline too: validated whole, never stripped
            raise argparse.ArgumentTypeError(f"{show(value)} holds a control character")
        try:
            return parse(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def profiles(value: str) -> object:
    """argparse type of ``--profile``: a comma list of ddp, fsdp, tp, pipeline, moe or all
    (:func:`builder.agent.bench.profiles.parse_profiles`) -> the names, in table order."""
    from builder.agent.bench.profiles import parse_profiles

    return _value_error_type(parse_profiles)(value)


def sizes(value: str) -> object:
    """argparse type of ``--sizes``: ``MIN:MAX`` or a comma list (:func:`builder.certify.settings.parse_sizes`)."""
    from builder.certify.settings import parse_sizes

    return _value_error_type(parse_sizes)(value)


def _parse_dtypes(value: str) -> list[str]:
    from builder.agent.bench.collectives import typesize

    names = [n.strip() for n in value.split(",")] if len(value) <= 200 else []
    if not names or not all(names) or len(set(names)) != len(names):
        raise ValueError(f"{show(value)} is not a comma list of distinct element types")
    for n in names:
        typesize(n)
    return names


def dtypes(value: str) -> object:
    """argparse type of ``--dtype``: a comma list of float32, bfloat16, float16, float64."""
    return _value_error_type(_parse_dtypes)(value)
