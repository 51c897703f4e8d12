"""Content hash of an image's filesystem, to compare two builds of one lock. Image IDs and layer digests differ between
identical installs (tar mtimes), so the exported filesystem is hashed per path, timestamps and :data:`EXCLUDED` left
out. Sources: Docker Engine API ``GET /containers/{id}/export``; POSIX ustar/pax member types."""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import tarfile
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO

from builder.core.errors import Unreachable

from .engine import Engine

#: Name of the method; stored next to the hash so that a changed method is not compared.
METHOD = "envbuild.fshash/1"

#: ``fnmatch`` patterns on the path relative to ``/``: bytecode (records the source's mtime,
#: PEP 552), files every install rewrites (dpkg/debconf backups, the ldconfig cache), caches, logs
#: and scratch (timestamps by design), the engine's per-container files (empty in an export).
EXCLUDED: tuple[str, ...] = ("*.pyc", "*/__pycache__/", "__pycache__/", "var/lib/dpkg/*-old", "var/cache/debconf/*-old",
                             "var/cache/ldconfig/", "etc/ld.so.cache", "var/cache/apt/", "var/lib/apt/lists/",
                             "var/log/", "tmp/", "var/tmp/", "root/.cache/", ".dockerenv", "etc/hostname", "etc/hosts",
                             "etc/resolv.conf")

#: Most entries read from one tree (a CUDA image holds about 100,000); a larger export is refused (exit 3).
MAX_ENTRIES = 2_000_000

_TYPES = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.CONTTYPE: "file", tarfile.DIRTYPE: "dir",
          tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "chardev",
          tarfile.BLKTYPE: "blockdev", tarfile.FIFOTYPE: "fifo"}


@dataclass
class FsHash:
    """Result of :func:`hash_tar`; ``lines``, ``files`` (path -> (size in bytes, sha256) of each regular file) and
    ``excluded_by`` (pattern -> entries it left out) are for :func:`differences`, not in :meth:`to_json`."""

    sha256: str
    entries: int
    excluded: int
    lines: dict[str, str] = field(default_factory=dict, repr=False)
    files: dict[str, tuple[int, str]] = field(default_factory=dict, repr=False)
    excluded_by: dict[str, int] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        """``{"method", "sha256", "entries", "excluded", "exclusions"}`` (plain JSON data)."""
        return {"method": METHOD, "sha256": self.sha256, "entries": self.entries, "excluded": self.excluded,
                "exclusions": list(EXCLUDED)}


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/").rstrip("/")


def is_excluded(path: str, is_dir: bool = False, patterns: Iterable[str] = EXCLUDED) -> str | None:
    """The pattern excluding ``path`` (relative to ``/``), or None; a pattern ending in ``/`` covers the folder."""
    path = _norm(path)
    parts = path.split("/")
    for pat in patterns:
        if pat.endswith("/"):
            stem = pat[:-1]
            # the folder itself or any prefix of the path
            for i in range(1, len(parts) + 1):
                if fnmatch.fnmatchcase("/".join(parts[:i]), stem):
                    return pat
        elif fnmatch.fnmatchcase(path, pat):
            return pat
    return None


def entry_line(kind: str, path: str, mode: int, uid: int, gid: int, what: str) -> str:
    """One hashed line: ``"<kind> <mode octal> <uid>:<gid> <what> <path>"`` (path last,
    so that names with spaces stay unambiguous)."""
    return f"{kind} {mode & 0o7777:04o} {uid}:{gid} {what} {path}"


def hash_tar(fileobj: IO[bytes], patterns: Iterable[str] = EXCLUDED) -> FsHash:
    """Hash an uncompressed filesystem tar (as ``docker export`` writes it).
    Raises EnvbuildError (exit 3): not a readable tar."""
    patterns = tuple(patterns)
    lines: dict[str, str] = {}
    files: dict[str, tuple[int, str]] = {}
    pending_links: list[tuple[str, tarfile.TarInfo]] = []
    excluded: dict[str, int] = {}
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for member in tar:
                path = _norm(member.name)
                if not path:
                    continue
                pattern = is_excluded(path, member.isdir(), patterns)
                if pattern:
                    excluded[pattern] = excluded.get(pattern, 0) + 1
                    continue
                if len(lines) + len(pending_links) >= MAX_ENTRIES:
                    raise Unreachable(f"more than {MAX_ENTRIES} entries in the filesystem", field="export")
                kind = _TYPES.get(member.type, f"type-{member.type!r}")
                if kind == "file":
                    h = hashlib.sha256()
                    f = tar.extractfile(member)
                    if f is not None:
                        for chunk in iter(functools.partial(f.read, 1 << 20), b""):
                            h.update(chunk)
                    what = "sha256:" + h.hexdigest()
                    files[path] = (member.size, what)
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
        raise Unreachable(f"not a readable tar stream: {e}", field="export") from None
    for path, member in pending_links:
        target = _norm(member.linkname)
        # a hard link is the same file as its target: hash it as a file with that content
        if target in files:
            files[path] = files[target]
        what = files[target][1] if target in files else "link:" + target
        lines[path] = entry_line("file", path, member.mode, member.uid, member.gid, what)
    h = hashlib.sha256()
    for path in sorted(lines):
        h.update(lines[path].encode("utf-8", "surrogateescape") + b"\n")
    return FsHash(sha256=h.hexdigest(), entries=len(lines), excluded=sum(excluded.values()), lines=lines, files=files,
                  excluded_by=excluded)


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


def image_fshash(client: Engine, image: str, *, labels: Mapping[str, str] | None = None,
                 patterns: Iterable[str] = EXCLUDED) -> FsHash:
    """Content hash of ``image``'s filesystem, exported from a never started container.
    Raises EnvbuildError (exit 3): no such image, the export failed; Unreachable (exit 3)."""
    with client.export(image, dict(labels or {})) as chunks:
        return hash_tar(typing.cast(IO[bytes], _ChunkReader(chunks)), patterns)


@dataclass(frozen=True)
class Difference:
    """A path whose entry differs between trees ``a`` and ``b``: its hashed entry in each without the path (None:
    absent), and ``(size in bytes, sha256)`` where it is a regular file."""

    path: str
    a: str | None
    b: str | None
    file_a: tuple[int, str] | None
    file_b: tuple[int, str] | None

    def __str__(self) -> str:
        return f"{self.path}: " + ("only in b" if self.a is None else "only in a" if self.b is None
                                   else f"{self.a} != {self.b}")


def differences(a: FsHash, b: FsHash, limit: int = 20) -> list[Difference]:
    """The paths whose entries differ between two hashes, sorted, at most ``limit``."""
    out: list[Difference] = []
    for path in sorted(set(a.lines) | set(b.lines)):
        la, lb = a.lines.get(path), b.lines.get(path)
        if la == lb:
            continue
        if len(out) >= limit:
            break
        out.append(Difference(path, la and la[: -len(path) - 1], lb and lb[: -len(path) - 1], a.files.get(path),
                              b.files.get(path)))
    return out
