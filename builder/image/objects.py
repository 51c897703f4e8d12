"""The engine's answers as small values (:mod:`.engine` makes them), and the one socket call that
needs no SDK: an image inspect without the SDK's ~0.25 s import."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError

#: Bounds of an image's ``Config.Env``: entries, and bytes per entry.
MAX_IMAGE_ENV = 4096
MAX_IMAGE_ENV_ENTRY = 65536
#: Most bytes of one answer read from the socket, and of a one-shot container's output.
MAX_ANSWER_BYTES = 16 << 20


class SocketError(Exception):
    """A socket call failed: :class:`Engine` falls back to the SDK, which reports it properly."""


def socket_get(path: str, url: str, timeout_s: float) -> Any | None:
    """``GET url`` as HTTP/1.0 on unix socket ``path`` (``http.client``: ~18 ms import): JSON, None on 404."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(f"GET {url} HTTP/1.0\r\nHost: localhost\r\nAccept: application/json\r\n\r\n".encode())
            chunks, size = [], 0
            while size <= MAX_ANSWER_BYTES:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except OSError as e:
        raise SocketError(f"GET {url}: {e}") from None
    raw = b"".join(chunks)
    head, sep, body = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status) < 2 or not status[1].isdigit():
        raise SocketError(f"not an HTTP answer: {raw[:60]!r}")
    if int(status[1]) == 404:
        return None
    if int(status[1]) != 200 or size > MAX_ANSWER_BYTES:
        raise SocketError(f"GET {url}: status {status[1]!r}, {size} bytes")
    try:
        return json.loads(body)
    except ValueError as e:
        raise SocketError(f"GET {url}: not JSON: {e}") from None


def _str_map(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Image:
    """An image as the engine describes it (``doc``: its inspect document)."""

    id: str
    labels: dict[str, str]
    tags: tuple[str, ...]
    #: ``repo@sha256:...`` references the engine recorded for pushes and pulls.
    repo_digests: tuple[str, ...]
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Image:
        config = doc["Config"] if isinstance(doc.get("Config"), dict) else {}
        return cls(str(doc["Id"]), _str_map(config.get("Labels")), tuple(map(str, doc.get("RepoTags") or ())),
                   tuple(map(str, doc.get("RepoDigests") or ())), dict(doc))

    @property
    def digests(self) -> list[str]:
        """The manifest digests of :attr:`repo_digests`."""
        return [d.rsplit("@", 1)[1] for d in self.repo_digests if "@" in d]

    def env(self) -> dict[str, str]:
        """``Config.Env`` as ``{name: value}``; exit 2 past :data:`MAX_IMAGE_ENV` or not ``NAME=VALUE``."""
        entries = (self.doc.get("Config") or {}).get("Env") or []
        if not isinstance(entries, list) or len(entries) > MAX_IMAGE_ENV:
            raise EnvbuildError(f"image config Env is not a list of at most {MAX_IMAGE_ENV} entries",
                                field=f"{self.id}: Config.Env")
        env: dict[str, str] = {}
        for i, item in enumerate(entries):
            name, sep, value = item.partition("=") if isinstance(item, str) else ("", "", "")
            if not sep or not re.fullmatch(r"[^=\x00]+", name) or len(item) > MAX_IMAGE_ENV_ENTRY:
                raise EnvbuildError("is not NAME=VALUE (within the bounds)", field=f"Config.Env[{i}]", value=item)
            env[name] = value
        return env


@dataclass(frozen=True)
class Container:
    """A container as the engine describes it (``doc``: its inspect document, or its list entry)."""

    id: str
    name: str
    status: str
    labels: dict[str, str]
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Container:
        state = doc.get("State")
        names = doc.get("Names") or [doc.get("Name") or ""]
        labels = doc.get("Labels") if "Labels" in doc else (doc.get("Config") or {}).get("Labels")
        return cls(str(doc["Id"]), str(names[0]).lstrip("/"),
                   str(state.get("Status") if isinstance(state, dict) else state or ""), _str_map(labels), dict(doc))


@dataclass(frozen=True)
class Ran:
    """What a one-shot container did: its exit status and output (each cut at ``limit`` bytes)."""

    code: int
    stdout: bytes
    stderr: bytes
    cut: bool = False
