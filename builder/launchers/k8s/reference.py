"""Image references as the pods see them: ``[host[:port]/]path[:tag][@sha256:<64 hex>]``.

A module of its own so that the one image-reference grammar of ``builder/oci/reference.py``
can replace it with one import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from builder.core.errors import EnvbuildError, ExitCode

# The grammar of the distribution project's ``reference`` package (Docker, Kubernetes).
_ALNUM = r"[a-z0-9]+"
_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_IMAGE_REF_RE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?"
)
_SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class ImageReference:
    """A parsed image reference.

    Attributes:
        name: ``[host[:port]/]path``, e.g. ``"registry.example/envbuild/cpu-torch2"``.
        tag: e.g. ``"fbe68042d4fa"``, or None.
        digest: ``"sha256:<64 lowercase hex>"``, or None.
    """

    name: str
    tag: str | None
    digest: str | None

    @property
    def by_digest(self) -> bool:
        """Whether the reference pins a digest (the only immutable kind of reference)."""
        return self.digest is not None


def parse_image_ref(text: str) -> ImageReference:
    """Parse an image reference (the ``reference`` grammar of the distribution project,
    as used by Docker and Kubernetes); only ``sha256`` digests are accepted.

    Raises:
        EnvbuildError: (exit 64) not an image reference, or a digest other than
            ``sha256:<64 lowercase hex>``.
    """
    m = _IMAGE_REF_RE.fullmatch(text or "")
    first, sep, _ = (m.group("name") if m else "").partition("/")
    if m and sep and not ("." in first or ":" in first or first == "localhost") \
            and not re.fullmatch(_COMPONENT, first):
        m = None  # not a registry host (Docker's rule), so a path component: lowercase only
    if not m:
        raise EnvbuildError("is not an image reference ([host/]path[:tag][@sha256:digest])",
                            field="image", value=text, exit_code=ExitCode.USAGE)
    digest = m.group("digest")
    if digest is not None and not _SHA256_RE.fullmatch(digest):
        raise EnvbuildError("digest is not sha256:<64 lowercase hex>", field="image", value=text,
                            exit_code=ExitCode.USAGE)
    return ImageReference(m.group("name"), m.group("tag"), digest)
