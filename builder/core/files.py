"""Small shared helpers for the files envbuild writes: atomic writes and the template
environment. Every file envbuild writes is complete or absent: nothing half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import jinja2


def write_atomic(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync'd, then
    ``os.replace`` (atomic on POSIX). The folder must exist. Returns the path.

    Raises: ``OSError`` from the filesystem; the temporary file is removed on any error
    (also KeyboardInterrupt).
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def template_environment(filters: Mapping[str, Callable] | None = None,
                         finalize: Callable[[object], object] | None = None,
                         package: str = "builder.render") -> jinja2.Environment:
    """The jinja2 environment for the ``templates/`` folder of ``package``: ``StrictUndefined`` (a missing
    value is an error, never an empty string), no autoescape, trailing newline kept, block
    tags trimmed; plus the given ``filters`` and ``finalize`` (jinja2 passes every
    ``{{ ... }}`` output through it: a check of each substituted value)."""
    env = jinja2.Environment(
        finalize=finalize,
        loader=jinja2.PackageLoader(package, "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(filters or {})
    return env
