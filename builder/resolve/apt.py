"""apt packages to the candidates of the base image's mirror (top-level only: dependencies follow it)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from builder.core.errors import EnvbuildError
from builder.recipe.fields import APT_NAME
from builder.recipe.spec import Spec

#: Seconds for the apt query container.
APT_TIMEOUT_S = 300

#: The apt query; the package names arrive as its arguments ("$@").
APT_QUERY = ("apt-get update -qq >/dev/null 2>&1 || { echo 'envbuild: apt-get update failed' >&2; exit 90; }; "
             'exec apt-cache policy "$@"')


def apt_names(spec: Spec) -> list[str]:
    """The unpinned Debian packages the rendered files install."""
    names = ["python3", "python3-venv", *[p for p in spec.recipe.packages.apt if "=" not in p]]
    return list(dict.fromkeys(names))


def parse_policy(text: str) -> dict[str, str]:
    """``{package: candidate version}`` from ``apt-cache policy`` output."""
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
    """The names are positional arguments of the script, never shell text."""
    return ["sh", "-c", APT_QUERY, "sh", *names]


def resolve_apt(client: Any, image: str, names: list[str], *, labels: Mapping[str, str] | None = None,
                timeout_s: float = APT_TIMEOUT_S) -> tuple[dict[str, str] | None, str | None]:
    """``(pins, None)`` or ``(None|partial, note)``; EnvbuildError (exit 2) for a bad package name."""
    bad = [n for n in names if not (isinstance(n, str) and APT_NAME.fullmatch(n))]
    if bad:
        raise EnvbuildError("is not a Debian package name; not queried", field="apt", value=bad[0])
    from builder.core.errors import NoSuchImage, Unreachable
    from builder.image import engine

    try:
        ran = client.run_once(image, apt_query_argv(names), timeout_s=timeout_s, what="apt query",
                              labels={engine.LABEL: "1", **(labels or {})},
                              environment={"DEBIAN_FRONTEND": "noninteractive"})
    except NoSuchImage:
        return None, f"apt: base image {image} not in the engine"
    except Unreachable as e:
        return None, f"apt: {e.message}"
    if ran.code != 0:
        err = ran.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"apt: query in {image} exited {ran.code} ({(err or ['no output'])[-1][:200]})"
    pins = parse_policy(ran.stdout.decode("utf-8", "replace"))
    missing = [n for n in names if n not in pins]
    note = f"apt: no candidate for {', '.join(missing)} in {image}" if missing else None
    return {n: pins[n] for n in names if n in pins}, note
