"""The one image-reference grammar, ``[registry[:port]/]path[:tag][@sha256:digest]``, matched
whole and bounded, with Docker Hub normalisation. Source: https://github.com/distribution/reference
(reference.go, normalize.go), narrowed to sha256 digests."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

from builder.core.errors import UsageError

#: Longest name (registry and path), distribution's ``NameTotalLengthMax``.
MAX_NAME_CHARS = 255
#: Longest whole reference: the name, ``:`` and a tag of at most 128 characters, ``@`` and
#: ``sha256:`` with 64 hex (456 characters); longer input is refused unread.
MAX_CHARS = MAX_NAME_CHARS + 1 + 128 + 1 + 71

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}\]"
_PORT = r"[0-9]{1,5}"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: A first path component when no registry is named: no ``.`` (that would make it a host).
_FIRST = r"[a-z0-9]+(?:(?:_|__|-+)[a-z0-9]+)*"
_PATH = rf"{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
#: A registry as it may appear in a reference (Docker's rule: a ``.``, a port, or localhost).
_REGISTRY = rf"(?:(?:{_LABEL}(?:\.{_LABEL})+|{_IPV6})(?::{_PORT})?|{_LABEL}:{_PORT}|localhost)"

#: The whole grammar as one pattern without groups (also fit for a JSON Schema ``pattern``,
#: which cannot check the port range, the IPv6 address or the name length: :func:`parse` does).
PATTERN = rf"\A(?:{_REGISTRY}/{_PATH}|{_FIRST}(?:/{_COMPONENT})+|{_COMPONENT})(?::{_TAG})?(?:@{_DIGEST})?\Z"
REFERENCE = re.compile(PATTERN)
#: A registry ``host[:port]`` on its own (``--registry``): any DNS name or ``[IPv6]``.
HOST = re.compile(rf"\A(?:{_LABEL}(?:\.{_LABEL})*|{_IPV6})(?::({_PORT}))?\Z")
#: One path component (a recipe name in a repository) and a whole path (``--namespace``).
COMPONENT = re.compile(rf"\A{_COMPONENT}\Z")
PATH = re.compile(rf"\A{_PATH}\Z")
TAG = re.compile(rf"\A{_TAG}\Z")
DIGEST = re.compile(rf"\A{_DIGEST}\Z")
#: A local image ID as the engine prints it: 12..64 hex, optionally ``sha256:``-prefixed.
IMAGE_ID = re.compile(r"\A(?:sha256:)?[0-9a-f]{12,64}\Z")

#: Docker Hub: the names a reference may give it, and the host its API answers on.
DOCKER_HUB = "docker.io"
DOCKER_HUB_NAMES = frozenset({DOCKER_HUB, "index.docker.io", "registry-1.docker.io"})
DOCKER_HUB_API = "registry-1.docker.io"

Reason = Literal["size", "name", "long", "tag", "digest", "host"]


class ReferenceError(UsageError):
    """Not an image reference (exit 64); ``reason``: ``size``, ``name``, ``long``, ``tag``, ``digest`` or ``host``."""

    def __init__(self, message: str, reason: Reason, *, field: str, value: object) -> None:
        super().__init__(message, field=field, value=value)
        self.reason = reason


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference ``[host/]path[:tag][@digest]``, as written."""

    host: str | None
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``[host/]path`` as written."""
        return f"{self.host}/{self.path}" if self.host else self.path

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    @property
    def by_digest(self) -> bool:
        """Whether the reference pins a digest (the only immutable kind of reference)."""
        return self.digest is not None

    @property
    def is_docker_hub(self) -> bool:
        """Whether it names Docker Hub (no host, ``docker.io``, ``index.docker.io``...)."""
        return self.host is None or self.host in DOCKER_HUB_NAMES

    @property
    def domain(self) -> str:
        """The normalised registry: ``docker.io`` for Docker Hub, else ``host``."""
        return DOCKER_HUB if self.is_docker_hub else str(self.host)

    @property
    def registry(self) -> str:
        """The host its registry API answers on (``registry-1.docker.io`` for Docker Hub)."""
        return DOCKER_HUB_API if self.is_docker_hub else str(self.host)

    @property
    def repository(self) -> str:
        """The API's repository: Docker Hub's official images are ``library/<path>``, else ``path``."""
        return f"library/{self.path}" if self.is_docker_hub and "/" not in self.path else self.path

    @property
    def familiar(self) -> str:
        """The repository as Docker shows it: ``docker.io/library/debian`` -> ``debian``."""
        if not self.is_docker_hub:
            return self.name
        return self.path.removeprefix("library/") if self.path.count("/") == 1 else self.path

    def same_repository(self, other: ImageRef) -> bool:
        """Whether both name the same repository once normalised (``debian`` and ``docker.io/library/debian`` do)."""
        return (self.domain, self.repository) == (other.domain, other.repository)

    def with_host(self, host: str) -> ImageRef:
        return dataclasses.replace(self, host=host)

    def with_tag(self, tag: str | None) -> ImageRef:
        return dataclasses.replace(self, tag=tag)


_SYNTAX = "[host[:port]/]path[:tag][@sha256:digest]"


def parse(text: object, *, field: str = "reference", syntax: str = _SYNTAX) -> ImageRef:
    """Parse ``text`` as an image reference. Raises ReferenceError (exit 64)."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise ReferenceError(f"is not an image reference (at most {MAX_CHARS} characters)", "size",
                             field=field, value=text)
    if not REFERENCE.fullmatch(text):
        reason = _diagnose(text)
        raise ReferenceError(_MESSAGES.get(reason) or f"is not an image reference ({syntax})", reason,
                             field=field, value=text)
    ref = _split(text)
    if ref.host is not None and not is_host(ref.host):
        raise ReferenceError(_MESSAGES["host"], "host", field=field, value=text)
    if len(ref.name) > MAX_NAME_CHARS:
        raise ReferenceError(f"name is longer than {MAX_NAME_CHARS} characters", "long", field=field, value=text)
    return ref


_MESSAGES: dict[str, str] = {"tag": "tag is not a valid tag", "digest": "digest is not sha256:<64 hex>",
                             "host": "registry is not HOST[:PORT] (a port in 1..65535)"}


def try_parse(text: object) -> ImageRef | None:
    """:func:`parse`, or None where it refuses ``text`` (read references: ``RepoDigests``, rendered files)."""
    try:
        return parse(text)
    except ReferenceError:
        return None


def is_valid(text: object) -> bool:
    return try_parse(text) is not None


def _has_host(first: str) -> bool:
    """Docker's rule: a first component with ``.`` or ``:``, or ``localhost``, is a registry."""
    return "." in first or ":" in first or first == "localhost"


def _split(text: str) -> ImageRef:
    """``text`` (already matched by :data:`REFERENCE`) split into its parts."""
    rest, _, digest = text.partition("@")
    first, sep, remainder = rest.partition("/")
    host = None
    if sep and _has_host(first):
        host, rest = first, remainder
    path, sep, tag = rest.partition(":")
    return ImageRef(host=host, path=path, tag=tag if sep else None, digest=digest or None)


def _diagnose(text: str) -> Reason:
    """Which part of ``text`` (refused by :data:`REFERENCE`) is wrong, in the order digest, tag, path, registry."""
    rest, at, digest = text.partition("@")
    if at and not DIGEST.fullmatch(digest):
        return "digest"
    first, sep, remainder = rest.partition("/")
    host = None
    if sep and _has_host(first):
        host, rest = first, remainder
    repo, sep, tag = rest.rpartition(":")
    if sep and "/" not in tag:
        if not TAG.fullmatch(tag):
            return "tag"
        rest = repo
    if host is not None and PATH.fullmatch(rest):
        return "host"
    return "name"


def is_host(text: str) -> bool:
    """Whether ``text`` is a registry ``host[:port]``: DNS labels or ``[IPv6]``, port 1..65535."""
    m = HOST.fullmatch(text) if isinstance(text, str) else None
    if not m or (m.group(1) is not None and not 1 <= int(m.group(1)) <= 65535):
        return False
    if text.startswith("["):
        try:
            ipaddress.IPv6Address(text[1:].split("]", 1)[0])
        except ValueError:
            return False
    return True


def split_host(host: str) -> tuple[str, int | None]:
    """``("name", port or None)`` of a registry ``host[:port]`` (``[::1]:5000`` -> ``("::1", 5000)``)."""
    if host.startswith("["):
        inner, _, after = host[1:].partition("]")
        return inner, int(after[1:]) if after.startswith(":") and after[1:].isdigit() else None
    name, sep, port = host.partition(":")
    return name, int(port) if sep and port.isdigit() else None
