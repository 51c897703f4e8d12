"""Content hash of an image's filesystem, for comparing two builds of one lock.

Two builds from one lock on one machine should install the same files. Image IDs and
layer digests cannot show that: every layer tar carries modification times, and a few
files record *when* something was installed rather than *what*. :func:`image_fshash`
exports the flattened filesystem of an image (``docker export`` of a created, never
started container, through the docker SDK) and hashes, per path in sorted order:

* the entry type (file, directory, symlink, hard link, device, fifo),
* the permission bits (``mode & 0o7777``) and the numeric owner ``uid:gid``,
* the content's sha256 (regular files; a hard link counts as its target's content),
  the link target (symlinks) or ``major,minor`` (devices).

Not hashed (the documented exclusions, :data:`EXCLUDED`):

* all timestamps (mtime, atime, ctime): they never enter the hash;
* ``*.pyc`` files and ``__pycache__/`` folders: bytecode records the source's mtime and is
  written at install time (PEP 552 describes hash-based .pyc that would avoid it);
* dpkg's and debconf's backup files (``var/lib/dpkg/*-old``,
  ``var/cache/debconf/*-old``) and ldconfig's cache (``var/cache/ldconfig/``,
  ``etc/ld.so.cache``): rewritten on every package installation;
* apt's caches and lists (``var/cache/apt/``, ``var/lib/apt/lists/``) and all logs
  (``var/log/``): timestamps by design;
* scratch space (``tmp/``, ``var/tmp/``, ``root/.cache/``);
* the files the container engine puts into every container (``.dockerenv``,
  ``etc/hostname``, ``etc/hosts``, ``etc/resolv.conf``): empty mount points in an export.

Source for the export format: Docker Engine API ``GET /containers/{id}/export`` (a tar
of the container's root filesystem); tar member types from POSIX ustar/pax.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import tarfile
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO

import docker
import docker.errors

from builder.core.errors import EnvbuildError, ExitCode, Unreachable

#: Name of the method; stored next to the hash so that a changed method is not compared.
METHOD = "envbuild.fshash/1"

#: Excluded paths: ``fnmatch`` patterns on the path relative to ``/`` (no leading slash);
#: a pattern ending in ``/`` excludes that folder and everything below it.
EXCLUDED: tuple[str, ...] = (
    "*.pyc",
    "*/__pycache__/",
    "__pycache__/",
    "var/lib/dpkg/*-old",
    "var/cache/debconf/*-old",
    "var/cache/ldconfig/",
    "etc/ld.so.cache",
    "var/cache/apt/",
    "var/lib/apt/lists/",
    "var/log/",
    "tmp/",
    "var/tmp/",
    "root/.cache/",
    ".dockerenv",
    "etc/hostname",
    "etc/hosts",
    "etc/resolv.conf",
)

_TYPES = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.CONTTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.CHRTYPE: "chardev",
    tarfile.BLKTYPE: "blockdev",
    tarfile.FIFOTYPE: "fifo",
}


@dataclass
class FsHash:
    """Result of :func:`hash_tar` / :func:`image_fshash`.

    Attributes:
        sha256: 64 hex digits over the sorted entry lines (see :func:`entry_line`).
        entries: number of entries hashed.
        excluded: number of entries skipped by :data:`EXCLUDED`.
        lines: ``{path: entry line}`` of the hashed entries (for :func:`differences`);
            not part of :meth:`to_json`.
    """

    sha256: str
    entries: int
    excluded: int
    lines: dict[str, str] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        """``{"method", "sha256", "entries", "excluded", "exclusions"}`` (plain JSON data)."""
        return {
            "method": METHOD,
            "sha256": self.sha256,
            "entries": self.entries,
            "excluded": self.excluded,
            "exclusions": list(EXCLUDED),
        }


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/").rstrip("/")


def is_excluded(path: str, is_dir: bool = False, patterns: Iterable[str] = EXCLUDED) -> bool:
    """Whether ``path`` (relative to ``/``, e.g. ``"var/log/dpkg.log"``) is excluded.

    A pattern ending in ``/`` matches that folder and everything below it.
    """
    path = _norm(path)
    parts = path.split("/")
    for pat in patterns:
        if pat.endswith("/"):
            stem = pat[:-1]
            # the folder itself or any prefix of the path
            for i in range(1, len(parts) + 1):
                if fnmatch.fnmatchcase("/".join(parts[:i]), stem):
                    return True
        elif fnmatch.fnmatchcase(path, pat):
            return True
    return False


def entry_line(kind: str, path: str, mode: int, uid: int, gid: int, what: str) -> str:
    """One hashed line: ``"<kind> <mode octal> <uid>:<gid> <what> <path>"`` (path last,
    so that names with spaces stay unambiguous)."""
    return f"{kind} {mode & 0o7777:04o} {uid}:{gid} {what} {path}"


def hash_tar(fileobj: IO[bytes], patterns: Iterable[str] = EXCLUDED) -> FsHash:
    """Hash a filesystem tar stream (as ``docker export`` writes it).

    Args:
        fileobj: a readable binary stream of an uncompressed tar.
        patterns: exclusions (default :data:`EXCLUDED`).

    Returns:
        :class:`FsHash`.

    Raises:
        EnvbuildError: (exit 3) the stream is not a readable tar.
    """
    patterns = tuple(patterns)
    lines: dict[str, str] = {}
    contents: dict[str, str] = {}
    pending_links: list[tuple[str, tarfile.TarInfo]] = []
    excluded = 0
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for member in tar:
                path = _norm(member.name)
                if not path:
                    continue
                if is_excluded(path, member.isdir(), patterns):
                    excluded += 1
                    continue
                kind = _TYPES.get(member.type, f"type-{member.type!r}")
                if kind == "file":
                    h = hashlib.sha256()
                    f = tar.extractfile(member)
                    if f is not None:
                        for chunk in iter(functools.partial(f.read, 1 << 20), b""):
                            h.update(chunk)
                    digest = "sha256:" + h.hexdigest()
                    contents[path] = digest
                    what = digest
                elif kind == "hardlink":
                    pending_links.append((path, member))
                    continue
                elif kind == "symlink":
                    what = "-> " + member.linkname
                elif kind in ("chardev", "blockdev"):
                    what = f"{member.devmajor},{member.devminor}"
                else:
                    what = "-"
                lines[path] = entry_line(kind, path, member.mode, member.uid, member.gid, what)
    except tarfile.TarError as e:
        raise EnvbuildError(f"not a readable tar stream: {e}", field="export", exit_code=ExitCode.UNREACHABLE) from None
    for path, member in pending_links:
        target = _norm(member.linkname)
        # a hard link is the same file as its target: hash it as a file with that content
        what = contents.get(target, "link:" + target)
        lines[path] = entry_line("file", path, member.mode, member.uid, member.gid, what)
    h = hashlib.sha256()
    for path in sorted(lines):
        h.update(lines[path].encode("utf-8", "surrogateescape") + b"\n")
    return FsHash(sha256=h.hexdigest(), entries=len(lines), excluded=excluded, lines=lines)


class _ChunkReader:
    """A read()-able view of an iterator of byte chunks (the SDK's export stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def image_fshash(
    client: docker.DockerClient,
    image: str,
    *,
    labels: Mapping[str, str] | None = None,
    patterns: Iterable[str] = EXCLUDED,
) -> FsHash:
    """Content hash of the filesystem of ``image`` (see the module doc for what counts).

    Creates a container of ``image`` (never started; labelled ``envbuild=1`` plus
    ``labels``), exports its filesystem, hashes it with :func:`hash_tar`, and removes the
    container, also on failure.

    Args:
        client: a connected docker client (:func:`builder.image.engine.connect`).
        image: image name, tag or ID.
        labels: extra labels for the temporary container.

    Returns:
        :class:`FsHash` (``to_json()`` for a certificate).

    Raises:
        EnvbuildError: (exit 2) no such image; (exit 3) the export failed.
        Unreachable: (exit 3) the engine stopped answering.
    """
    try:
        container = client.containers.create(
            image, ["/envbuild-fshash-never-started"], labels={"envbuild": "1", **(labels or {})},
            network_disabled=True,
        )
    except docker.errors.ImageNotFound:
        raise EnvbuildError("no such image", field="image", value=image) from None
    except docker.errors.APIError as e:
        raise Unreachable(f"could not create a container to export: {e.explanation or e}",
                          field="image", value=image) from None
    try:
        return hash_tar(typing.cast(IO[bytes], _ChunkReader(iter(container.export(chunk_size=1 << 20)))), patterns)
    except docker.errors.APIError as e:
        raise Unreachable(f"export failed: {e.explanation or e}", field="image", value=image) from None
    finally:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass


def differences(a: FsHash, b: FsHash, limit: int = 20) -> list[str]:
    """Paths whose entries differ between two hashes (at most ``limit``), each as
    ``"path: <line in a> != <line in b>"`` or ``"path: only in a|b"``."""
    out = []
    for path in sorted(set(a.lines) | set(b.lines)):
        la, lb = a.lines.get(path), b.lines.get(path)
        if la == lb:
            continue
        if la is None:
            out.append(f"{path}: only in b")
        elif lb is None:
            out.append(f"{path}: only in a")
        else:
            out.append(f"{path}: {la} != {lb}")
        if len(out) >= limit:
            break
    return out
