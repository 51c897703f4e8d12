"""The one way envbuild writes files, and the template environment."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import Unreachable
from .inputs import _kind_of

if TYPE_CHECKING:
    import jinja2

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644, *, parents: bool = True) -> Path:
    """Write ``data`` to the regular file ``path``, replaced atomically; the path. Unreachable (exit 3)."""
    target = Path(path)
    with _folder(target.parent, parents) as dfd:
        _check_target(dfd, target)
        tmp = _write_temp(dfd, target, data, mode)
        try:
            os.rename(tmp, target.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            raise _unwritable(target, e) from None
        finally:
            _remove(dfd, tmp)
    return target


def append(path: str | os.PathLike[str], data: bytes) -> Path:
    """Append ``data`` to the regular file ``path`` (a log; made 0644 when missing). Unreachable (exit 3) naming it."""
    target = Path(path)
    with _folder(target.parent, True) as dfd:
        _check_target(dfd, target)
        try:
            fd = os.open(target.name, _TEMP_FLAGS & ~os.O_EXCL | os.O_APPEND, 0o644, dir_fd=dfd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            raise _unwritable(target, e) from None
    return target


def write_new(folder: str | os.PathLike[str], names: Iterable[str], data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` under the first free name of ``names`` in ``folder`` (a hard link: nothing is replaced); its path.
    Unreachable (exit 3): a taken name not a regular file, every name taken."""
    out, names = Path(folder), list(names)
    with _folder(out) as dfd:
        tmp = _write_temp(dfd, out / (names[0] if names else "new"), data, mode)  # errors name the file wanted
        try:
            for name in names:
                try:
                    os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                    return out / name
                except FileExistsError:
                    _check_target(dfd, out / name)
                except OSError as e:
                    raise _unwritable(out / name, e) from None
            raise Unreachable("cannot write: every name for this file is taken", file=str(out))
        finally:
            _remove(dfd, tmp)


def current_bytes(path: Path) -> bytes | None:
    """The bytes of the regular file ``path`` (not a symlink); None otherwise."""
    try:
        return path.read_bytes() if stat.S_ISREG(path.lstat().st_mode) else None
    except OSError:
        return None


def changed_files(folder: Path, files: Mapping[str, bytes]) -> list[str]:
    """Names of ``files`` (name -> bytes) whose bytes differ from those in ``folder`` (or are missing)."""
    return [name for name, data in files.items() if current_bytes(folder / name) != data]


def write_set(folder: str | os.PathLike[str], files: Mapping[str, bytes]) -> list[str]:
    """Write ``files`` into ``folder`` as one set: all temp files before any rename, so on error the old set stays."""
    out = Path(folder)
    with _folder(out) as dfd:
        for name in files:
            _check_target(dfd, out / name)
        changed = changed_files(out, files)
        temps: list[tuple[str, Path]] = []
        try:
            for name in changed:
                temps.append((_write_temp(dfd, out / name, files[name], 0o644), out / name))
            for tmp, target in temps:
                try:
                    os.rename(tmp, target.name, src_dir_fd=dfd, dst_dir_fd=dfd)
                except OSError as e:
                    raise _unwritable(target, e) from None
        finally:
            for tmp, _target in temps:
                _remove(dfd, tmp)
    return changed


def make_folder(folder: str | os.PathLike[str]) -> Path:
    """Make ``folder`` and missing parents; the path. Unreachable (exit 3): a symlink or non-folder on the way."""
    with _folder(Path(folder)):
        return Path(folder)


@contextlib.contextmanager
def _folder(folder: Path, make: bool = True) -> Iterator[int]:
    """A descriptor of ``folder``: existing ancestors opened as the system resolves them (``/home -> /gpfs/home`` is
    fine), then ``folder`` and each folder made entered with ``O_NOFOLLOW`` (made 0777 less umask when ``make``)."""
    head, tail = folder.parent, [folder.name] if folder.name else []
    while head != head.parent and not head.exists():
        head, tail = head.parent, [head.name, *tail]
    try:
        fd = os.open(str(head), _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ENOTDIR:  # a file where a folder is wanted
            raise _refused(head, stat.S_IFREG, "a folder") from None
        raise Unreachable(f"cannot open the folder: {e.strerror or e}", file=str(head)) from None
    try:
        walked = head
        for part in tail:
            walked = walked / part
            child = _enter(fd, part, walked, make)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _enter(parent: int, part: str, shown: Path, make: bool) -> int:
    """Open the folder ``part`` of ``parent`` (made when missing) without following a symlink."""
    for _ in range(3):
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not make:
                raise Unreachable("no such folder", file=str(shown)) from None
            try:
                os.mkdir(part, dir_fd=parent)
            except FileExistsError:
                continue
            except OSError as e:
                raise Unreachable(f"cannot create the folder: {e.strerror or e}", file=str(shown)) from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refused(shown, _mode(parent, part), "a folder") from None
            raise Unreachable(f"cannot open the folder: {e.strerror or e}", file=str(shown)) from None
    raise Unreachable("cannot create the folder: it keeps changing", file=str(shown))


def _mode(dfd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
    except OSError:
        return None


def _check_target(dfd: int, target: Path) -> None:
    """Refuse ``target`` when it exists and is not a regular file (a symlink is refused)."""
    mode = _mode(dfd, target.name)
    if mode is not None and not stat.S_ISREG(mode):
        raise _refused(target, mode, "a regular file")


def _refused(path: Path, mode: int | None, wanted: str) -> Unreachable:
    if mode is None:
        kind = "gone"
    elif stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
        kind = "a " + ("file" if stat.S_ISREG(mode) else "directory" if stat.S_ISDIR(mode) else "symlink")
    else:
        kind = f"a {_kind_of(mode)}"
    return Unreachable(f"is {kind}, not {wanted}: envbuild writes only regular files, never through "
                       "a symlink (remove it or give another path)", file=str(path))


def _unwritable(path: Path, e: OSError) -> Unreachable:
    return Unreachable(f"cannot write: {e.strerror or e}", file=str(path))


def _remove(dfd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dfd)


def _write_temp(dfd: int, target: Path, data: bytes, mode: int) -> str:
    """``data`` in a new fsync'd temp file beside ``target``; its name. Unreachable naming ``target``, none left."""
    for _ in range(10):
        tmp = f".{target.name[:200]}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dfd)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise _unwritable(target, e) from None
    else:
        raise Unreachable("cannot write: no free temporary name", file=str(target))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
    except BaseException as e:
        _remove(dfd, tmp)
        if isinstance(e, OSError):
            raise _unwritable(target, e) from None
        raise
    return tmp


def template_environment(filters: Mapping[str, Callable[..., Any]] | None = None,
                         finalize: Callable[[object], object] | None = None,
                         package: str = "builder.render") -> jinja2.Environment:
    """jinja2 for ``package``'s ``templates/``: a missing value is an error (not ``""``); ``finalize`` checks all."""
    import jinja2

    env = jinja2.Environment(finalize=finalize, loader=jinja2.PackageLoader(package, "templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)
    env.filters.update(filters or {})
    return env
