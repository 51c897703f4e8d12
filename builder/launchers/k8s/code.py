"""envbuild's in-image code as ConfigMap data.

The files are those :func:`builder.agent.payload.files` ships to every launcher. ConfigMap
keys may not contain ``/`` (``[-._a-zA-Z0-9]+``), so ``bench/ddp.py`` is stored under the
key ``bench.ddp.py`` and the volume's ``items`` put it back at ``bench/ddp.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from builder.core.errors import EnvbuildError

#: ConfigMaps hold at most 1 MiB of data (Kubernetes ConfigMap docs).
CONFIGMAP_MAX_BYTES = 1024 * 1024
#: Files the pods cannot run without.
REQUIRED = ("bench/__main__.py", "probe/__main__.py")

_CM_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")


def in_image_code() -> dict[str, str]:
    """:func:`builder.agent.payload.files` as text: ``{relative path: UTF-8 text}``, sorted.

    Raises:
        EnvbuildError: (exit 2) a file is not UTF-8.
    """
    from builder.agent import payload

    out: dict[str, str] = {}
    for path, data in payload.files().items():
        try:
            out[path] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EnvbuildError(f"is not UTF-8: {e}", file=str(payload.AGENT_DIR / path)) from None
    return out


def code_key(path: str) -> str:
    """ConfigMap key of an in-image file: ``/`` replaced by ``.`` (``bench/ddp.py`` ->
    ``bench.ddp.py``); keys may only hold ``[-._a-zA-Z0-9]``, at most 253.

    Raises:
        EnvbuildError: (exit 2) the path has other characters.
    """
    key = path.replace("/", ".")
    if not _CM_KEY_RE.fullmatch(key) or len(key) > 253:
        raise EnvbuildError("cannot be a ConfigMap key", field="file", value=path)
    return key


@dataclass(frozen=True)
class CodeData:
    """The in-image code as the ConfigMap and the pods' volume carry it.

    Attributes:
        data: the ConfigMap's ``data``, ``{key: text}`` in key order.
        items: the volume's ``items``, ``[{"key", "path"}]`` in path order.
        sha256: hex digest over the sorted ``path NUL text NUL`` (an annotation).
    """

    data: dict[str, str]
    items: list[dict[str, str]]
    sha256: str


def code_data(code: Mapping[str, str] | None = None) -> CodeData:
    """The :class:`CodeData` of ``code`` (``{path: text}``; default :func:`in_image_code`).

    Raises:
        EnvbuildError: (exit 2) ``probe/__main__.py`` or ``bench/__main__.py`` missing, two paths
            with the same key, more than :data:`CONFIGMAP_MAX_BYTES`.
    """
    files = dict(in_image_code() if code is None else code)
    if any(p not in files for p in REQUIRED):
        raise EnvbuildError("in-image code lacks probe/__main__.py or bench/__main__.py", field="code",
                            value=sorted(files))
    paths = sorted(files)
    keys = [code_key(p) for p in paths]
    if len(set(keys)) != len(keys):
        raise EnvbuildError("two files map to the same ConfigMap key", field="code", value=paths)
    size = sum(len(t.encode("utf-8")) for t in files.values())
    if size > CONFIGMAP_MAX_BYTES:
        raise EnvbuildError(f"in-image code is {size} bytes; a ConfigMap holds at most "
                            f"{CONFIGMAP_MAX_BYTES}", field="code", value=paths)
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.encode() + b"\0" + files[p].encode("utf-8") + b"\0")
    return CodeData(data=dict(sorted(zip(keys, (files[p] for p in paths), strict=True))),
                    items=[{"key": k, "path": p} for k, p in zip(keys, paths, strict=True)], sha256=digest.hexdigest())
