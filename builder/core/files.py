"""Small shared helpers for the files envbuild writes: atomic writes, a set of files written
as one, and the template environment. Every file envbuild writes is complete or absent:
nothing half-written. jinja2 is imported only when a template environment is made."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import EnvbuildError, ExitCode

if TYPE_CHECKING:
    import jinja2


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> Path:
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


def current_bytes(path: Path) -> bytes | None:
    """The bytes of the regular file ``path``; None when absent, not a file or unreadable."""
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def changed_files(folder: Path, files: Mapping[str, bytes]) -> list[str]:
    """Names of ``files`` (name -> bytes) whose bytes differ from those in ``folder`` (or are missing)."""
    return [name for name, data in files.items() if current_bytes(folder / name) != data]


def write_set(folder: str | os.PathLike[str], files: Mapping[str, bytes]) -> list[str]:
    """Write ``files`` (name -> bytes) into ``folder`` as one set: every changed file is
    first written in full to a temporary file in that folder (fsync'd), and only when all
    of them are written are they renamed over the old ones (``os.replace``, atomic each;
    a rename in the same folder needs no space). On any error while writing (a full disk)
    the temporary files are removed and the old set is left as it was. The folder is
    created when missing; files whose bytes are unchanged are not rewritten.

    Returns: the names of the files written.
    Raises:
        EnvbuildError: (exit 3) the folder or a file cannot be written (a full disk, no
            permission), naming the file.
    """
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EnvbuildError(f"cannot create the folder: {e.strerror or e}", file=str(out),
                            exit_code=ExitCode.UNREACHABLE) from None
    changed = changed_files(out, files)
    temps: list[tuple[Path, Path]] = []
    try:
        for name in changed:
            target = out / name
            temps.append((_write_temp(target, files[name]), target))
        for tmp, target in temps:
            try:
                os.replace(tmp, target)
            except OSError as e:
                raise _unwritable(target, e) from None
    finally:
        for tmp, _target in temps:
            tmp.unlink(missing_ok=True)
    return changed


def _unwritable(path: Path, e: OSError) -> EnvbuildError:
    return EnvbuildError(f"cannot write: {e.strerror or e}", file=str(path), exit_code=ExitCode.UNREACHABLE)


def _write_temp(target: Path, data: bytes, mode: int = 0o644) -> Path:
    """``data`` in a new temporary file next to ``target`` (fsync'd, ``mode``); its path.
    Raises :class:`EnvbuildError` (exit 3) naming ``target``; nothing is left behind."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise _unwritable(target, e) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _unwritable(target, e) from None
        raise
    return Path(tmp)


def template_environment(filters: Mapping[str, Callable[..., Any]] | None = None,
                         finalize: Callable[[object], object] | None = None,
                         package: str = "builder.render") -> jinja2.Environment:
    """The jinja2 environment for the ``templates/`` folder of ``package``: ``StrictUndefined`` (a missing
    value is an error, never an empty string), no autoescape, trailing newline kept, block
    tags trimmed; plus the given ``filters`` and ``finalize`` (jinja2 passes every
    ``{{ ... }}`` output through it: a check of each substituted value)."""
    import jinja2

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
