"""apt packages to the candidate versions of the base image's mirror.

Every package the rendered files install by name (``python3``, ``python3-venv`` and the
recipe's unpinned ``packages.apt``) gets the candidate version ``apt-cache policy`` gives
in a throwaway container of the base image after ``apt-get update`` (top-level packages
only; their dependencies follow the mirror's state).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from builder.core.errors import EnvbuildError
from builder.recipe.fields import APT_NAME
from builder.recipe.spec import Spec

#: Seconds for the apt query container.
APT_TIMEOUT_S = 300

#: The apt query's shell script: the package names arrive as its arguments ("$@"), never
#: as shell text.
APT_QUERY = ("apt-get update -qq >/dev/null 2>&1 || { echo 'envbuild: apt-get update failed' >&2; exit 90; }; "
             'exec apt-cache policy "$@"')


def apt_names(spec: Spec) -> list[str]:
    """The unpinned Debian packages the rendered files install: ``python3``,
    ``python3-venv`` and the recipe's ``packages.apt`` without ``=version``."""
    names = ["python3", "python3-venv", *[p for p in spec.recipe.packages.apt if "=" not in p]]
    return list(dict.fromkeys(names))


def parse_policy(text: str) -> dict[str, str]:
    """``{package: candidate version}`` from ``apt-cache policy`` output (packages
    without a candidate are absent)."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.fullmatch(r"(\S+):", line)
        if m:
            current = m.group(1)
            continue
        m = re.fullmatch(r"\s+Candidate:\s+(\S+)\s*", line)
        if m and current and m.group(1) != "(none)":
            out[current] = m.group(1)
    return out


def apt_query_argv(names: list[str]) -> list[str]:
    """The container command of the apt query: ``sh -c APT_QUERY sh NAME...`` (the names are
    positional arguments of the script, each one argv word)."""
    return ["sh", "-c", APT_QUERY, "sh", *names]


def resolve_apt(client: Any, image: str, names: list[str], *, labels: Mapping[str, str] | None = None,
                timeout_s: float = APT_TIMEOUT_S) -> tuple[dict[str, str] | None, str | None]:
    """Candidate versions of ``names`` in ``image`` (``apt-get update`` then ``apt-cache
    policy`` in a throwaway container, removed afterwards). Returns ``(pins, None)`` or
    ``(None|partial, note)``. Raises :class:`EnvbuildError` (exit 2) for a name that is not a
    Debian package name (:data:`builder.recipe.fields.APT_NAME`); names reach the container as
    argv words (:func:`apt_query_argv`), never as shell text."""
    bad = [n for n in names if not (isinstance(n, str) and APT_NAME.fullmatch(n))]
    if bad:
        raise EnvbuildError("is not a Debian package name; not queried", field="apt", value=bad[0])
    import docker.errors

    from builder.image import engine

    try:
        c = client.containers.create(image, apt_query_argv(names), labels={engine.LABEL: "1", **(labels or {})},
                                     environment={"DEBIAN_FRONTEND": "noninteractive"})
    except docker.errors.ImageNotFound:
        return None, f"apt: base image {image} not in the engine"
    except docker.errors.APIError as e:
        return None, f"apt: {e.explanation or e}"
    try:
        out, note = _run_query(c, image, timeout_s)
    finally:
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            pass
    if note:
        return None, note
    pins = parse_policy(out)
    missing = [n for n in names if n not in pins]
    note = f"apt: no candidate for {', '.join(missing)} in {image}" if missing else None
    return {n: pins[n] for n in names if n in pins}, note


def _run_query(container: Any, image: str, timeout_s: float) -> tuple[str, str | None]:
    """Start the query container and wait: ``(its stdout, None)`` or ``("", note)``."""
    import requests

    container.start()
    try:
        code = container.wait(timeout=timeout_s).get("StatusCode", -1)
    except (requests.exceptions.RequestException, OSError):
        return "", f"apt: no answer within {timeout_s:g} s"
    out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
    if code != 0:
        err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace").strip().splitlines()
        return "", f"apt: query in {image} exited {code} ({(err or ['no output'])[-1][:200]})"
    return out, None
