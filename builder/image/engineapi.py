"""Read-only Docker Engine API calls over the engine's unix socket, with the standard library.

A no-change ``envbuild build`` needs a few answers from the engine: the IDs and labels of the
base image and of the image it built before (``GET /images/{name}/json``). The
docker SDK takes ~0.25 s to import on the reference machine (requests, urllib3), ten times
``docker image inspect``; these calls take a few milliseconds. Everything else (builds,
containers, pulls) goes through :mod:`builder.image.engine`.

Only a local engine (``DOCKER_HOST`` unset or ``unix://PATH``) is spoken to; for any other
``DOCKER_HOST`` :func:`connect` returns None and the caller takes the SDK path. Any failure
(no socket, a refused call, a malformed answer) is :class:`EngineAPIError`: the caller falls
back to the SDK path, which reports engine errors properly.

Source: Docker Engine API (https://docs.docker.com/reference/api/engine/version/v1.41/),
"Inspect an image".
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

#: Default socket of the engine (the docker SDK and CLI's default ``DOCKER_HOST``).
DEFAULT_SOCKET = "/var/run/docker.sock"
#: Most bytes of one answer (an image list with envbuild's labels is a few KiB per image).
MAX_ANSWER_BYTES = 16 << 20


class EngineAPIError(Exception):
    """An engine call failed or answered something unexpected (the caller falls back)."""


def _split_answer(raw: bytes) -> tuple[int, bytes]:
    """(status, body) of an HTTP/1.0 answer read to the end (the engine closes the connection
    after an HTTP/1.0 answer and sends it unchunked)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or not status_line[1].isdigit():
        raise EngineAPIError(f"not an HTTP answer: {raw[:60]!r}")
    return int(status_line[1]), body


class EngineAPI:
    """The engine at unix socket ``path``; each call is one HTTP/1.0 request on its own
    connection, at most ``timeout_s`` per socket operation (``http.client`` is not used: its
    import costs ~18 ms, half a ``docker image inspect``)."""

    def __init__(self, path: str, timeout_s: float = 10.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    def _request(self, url: str) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(self.path)
            sock.sendall(f"GET {url} HTTP/1.0\r\nHost: localhost\r\nAccept: application/json\r\n\r\n".encode())
            chunks, size = [], 0
            while size <= MAX_ANSWER_BYTES:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any | None:
        """``GET <path>`` (unversioned: the engine's own API version; the fields read here are in
        every version since v1.24): the JSON answer, or None on 404.

        Raises:
            EngineAPIError: the socket cannot be reached, another status, more than
                :data:`MAX_ANSWER_BYTES`, or not JSON.
        """
        url = path + (f"?{urlencode(query)}" if query else "")
        try:
            raw = self._request(url)
        except OSError as e:
            raise EngineAPIError(f"GET {path}: {e}") from None
        status, body = _split_answer(raw)
        if status == 404:
            return None
        if status != 200 or len(raw) > MAX_ANSWER_BYTES:
            raise EngineAPIError(f"GET {path}: status {status}, {len(raw)} bytes")
        try:
            return json.loads(body)
        except ValueError as e:
            raise EngineAPIError(f"GET {path}: not JSON: {e}") from None

    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        """The engine's document of image ``ref`` (name, tag or ID), or None when there is none."""
        doc = self.get(f"/images/{quote(ref, safe='')}/json")
        if doc is not None and not (isinstance(doc, dict) and isinstance(doc.get("Id"), str)):
            raise EngineAPIError(f"inspect {ref}: not an image document")
        return doc


def connect(env: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> EngineAPI | None:
    """The local engine of ``DOCKER_HOST`` (from ``env``, default ``os.environ``), or None when
    ``DOCKER_HOST`` names a remote engine (``tcp://``, ``ssh://``) or the socket does not exist."""
    host = (os.environ if env is None else env).get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    if not host.startswith("unix://"):
        return None
    path = host[len("unix://"):]
    return EngineAPI(path, timeout_s) if os.path.exists(path) else None


def image_labels(doc: Mapping[str, Any]) -> dict[str, str]:
    """The labels (``Config.Labels``) of an image document, as text."""
    config = doc.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in (labels or {}).items()}
