"""Report files as nodes: one node report per file (``envbuild probe --host > node.json``),
named one by one, as a directory of ``*.json`` files, a list file (``@list.txt``) or a list
on stdin (``-``): one path a line, so that 100,000 reports pass no argument limit."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from builder.core.documents import NodeReport
from builder.core.errors import Unreachable
from builder.core.inputs import read_regular

from .. import report as nodereport
from ..report import InvalidReport, Node
from .base import unique_names

#: Most report files one command reads, however they are named (4 x the ranks of a run).
MAX_REPORT_FILES = 1 << 18
#: Largest list file or stdin list (bytes), and the longest path in it (PATH_MAX).
MAX_LIST_BYTES = 64 << 20
MAX_PATH_BYTES = 4096
#: Directory levels below a named directory that are searched for ``*.json``.
MAX_DIR_DEPTH = 8


def _walk(top: str, depth: int) -> Iterator[str]:
    """The ``*.json`` regular files under ``top``, sorted, symbolic links not followed."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError as err:
        raise Unreachable(f"cannot list the directory: {err.strerror or err}", file=top) from None
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if depth >= MAX_DIR_DEPTH:
                raise Unreachable(f"is nested deeper than {MAX_DIR_DEPTH} directories", file=entry.path)
            yield from _walk(entry.path, depth + 1)
        elif entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
            yield entry.path


def _listed(data: bytes, where: str) -> Iterator[str]:
    for i, raw in enumerate(data.split(b"\n"), 1):
        line = raw.rstrip(b"\r")
        if not line.strip():
            continue
        if len(line) > MAX_PATH_BYTES or b"\0" in line:
            raise Unreachable(f"line {i} is not a path (NUL, or over {MAX_PATH_BYTES} bytes)", file=where)
        yield os.fsdecode(line)


def report_paths(items: Iterable[str], stdin: BinaryIO | None = None) -> list[str]:
    """The report files ``items`` name: a file, a directory (its ``*.json``, at most :data:`MAX_DIR_DEPTH` down; one
    without any is a file), ``@FILE`` (a path a line) or ``-`` (that list on stdin). Unreachable (exit 3): a list or
    directory unreadable, too deep, over :data:`MAX_REPORT_FILES`; an unreadable listed file is its node's error."""
    out: list[str] = []
    for item in items:
        if item == "-" or item.startswith("@"):
            where = "stdin" if item == "-" else item[1:]
            if item == "-":
                data = (stdin or sys.stdin.buffer).read(MAX_LIST_BYTES + 1)
                if len(data) > MAX_LIST_BYTES:
                    raise Unreachable(f"is over the {MAX_LIST_BYTES}-byte limit of a report list", file=where)
            else:
                data = read_regular(item[1:], MAX_LIST_BYTES, "report list")
            found: Iterable[str] = _listed(data, where)
        else:
            try:
                is_dir = stat.S_ISDIR(os.stat(item).st_mode)
            except (OSError, ValueError):
                is_dir = False
            found = _walk(item, 0) if is_dir else (item,)
        before = len(out)
        for p in found:
            out.append(p)
            if len(out) > MAX_REPORT_FILES:
                raise Unreachable(f"more than {MAX_REPORT_FILES} report files", file=item)
        if len(out) == before and item != "-" and not item.startswith("@"):
            out.append(item)  # a directory without reports: its node's error, as before
    return out


#: Sections of a node report that are alike on most nodes: one object per distinct value is
#: kept (a report's own copy is dropped), which keeps 100,000 reports under 600 MiB.
SHARED_SECTIONS = ("os", "python", "torch", "nccl", "container", "image", "shm", "cuda_runtime", "env")


def _shared(doc: NodeReport, seen: dict[bytes, Any]) -> NodeReport:
    """``doc`` with each of its :data:`SHARED_SECTIONS` replaced by an equal one seen before."""
    same = {}
    for name in SHARED_SECTIONS:
        value = getattr(doc, name)
        if value is not None:
            key = name.encode() + msgspec.json.encode(value)
            same[name] = seen.setdefault(key, value)
    return msgspec.structs.replace(doc, **same)


def from_files(paths: Iterable[str | Path]) -> list[Node]:
    """A node per report file, named by its hostname (else file name); unreadable or invalid: ``error``."""
    nodes = []
    seen: dict[bytes, Any] = {}
    for p in paths:
        p = str(p)
        try:
            doc = _shared(nodereport.load_file(p), seen)
            nodes.append(Node(name=doc.hostname or Path(p).stem, source=p, report=doc))
        except InvalidReport as e:
            nodes.append(Node(name=Path(p).stem, source=p, error=e))
    return unique_names(nodes, lambda n: n.source)
