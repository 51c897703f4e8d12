"""Site options: what this machine's network setup needs inside image builds.
Read from pip's own configuration (``cert``, ``find-links``), so builds work where pip works.
Source: https://pip.pypa.io/en/stable/topics/configuration/."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from builder.core import process
from builder.core.errors import EnvbuildError, Unreachable

# pip's option precedence, highest first: environment variable, command section, global.
_SECTIONS = (":env:", "install", "global")


@dataclass(frozen=True)
class SiteOptions:
    """How builds reach package indexes; ``pending``: pip's configuration to read (:meth:`complete`)."""

    ca_bundle: Path | None = None
    wheel_dir: Path | None = None
    base_override: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)
    pending: bool = False

    @classmethod
    def detect(cls, *, ca_cert: str | os.PathLike | None = None, wheels: str | os.PathLike | None = None,
               base: str | None = None, no_detect: bool = False, env: Mapping[str, str] | None = None,
               python: str | None = None, deferred: bool = False) -> SiteOptions:
        """Site options given, else from pip's configuration (``deferred``: later, ~0.7 s), local and present only, else
        a note. EnvbuildError (exit 2): a given ``--ca-cert``/``--wheels`` missing or of the wrong kind."""
        env = dict(os.environ if env is None else env)
        notes: list[str] = []

        ca: Path | None = None
        if ca_cert is not None:
            ca = Path(ca_cert).expanduser()
            if not ca.is_file():
                raise EnvbuildError("no such file", field="--ca-cert", value=str(ca_cert))
        wheel_dir: Path | None = None
        if wheels is not None:
            wheel_dir = Path(wheels).expanduser()
            if not wheel_dir.is_dir():
                raise EnvbuildError("no such folder", field="--wheels", value=str(wheels))

        if deferred and not no_detect and (ca is None or wheel_dir is None):
            return cls(ca_bundle=ca.absolute() if ca else None, wheel_dir=wheel_dir.absolute() if wheel_dir else None,
                       base_override=base, pending=True)
        if not no_detect and (ca is None or wheel_dir is None):
            config = pip_config(env=env, python=python, notes=notes)
            if ca is None:
                ca = _detect_cert(config, env, notes)
            if wheel_dir is None:
                wheel_dir = _detect_find_links(config, env, notes)

        if wheel_dir is not None and not any(wheel_dir.glob("*.whl")):
            notes.append(f"wheel folder {wheel_dir} holds no *.whl files")
        return cls(ca_bundle=ca.absolute() if ca else None, wheel_dir=wheel_dir.absolute() if wheel_dir else None,
                   base_override=base, notes=tuple(notes))

    def complete(self, *, env: Mapping[str, str] | None = None, python: str | None = None) -> SiteOptions:
        """These options with pip's configuration read where ``pending`` (:meth:`detect`); themselves otherwise."""
        if not self.pending:
            return self
        return SiteOptions.detect(ca_cert=self.ca_bundle, wheels=self.wheel_dir, base=self.base_override,
                                  env=env, python=python)


def pip_config(*, env: Mapping[str, str] | None = None, python: str | None = None,
               notes: list[str] | None = None) -> dict[str, str]:
    """``python -m pip config list`` as a dict; ``{}`` with a note when pip cannot run."""
    python = python or sys.executable
    try:
        out = process.run([python, "-m", "pip", "config", "list"], 60, env=os.environ if env is None else env)
    except Unreachable as e:
        if notes is not None:
            notes.append(f"could not read pip's configuration: {e}")
        return {}
    if out.returncode != 0:
        if notes is not None:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            notes.append(f"could not read pip's configuration: {last}")
        return {}
    config: dict[str, str] = {}
    for line in out.stdout.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw.strip("'\"")
        config[key.strip()] = str(value)
    return config


def _lookup(config: Mapping[str, str], env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(value, where) of pip option ``name`` by pip's precedence, or None."""
    env_name = "PIP_" + name.upper().replace("-", "_")
    if env.get(env_name):
        return env[env_name], env_name
    for section in _SECTIONS:
        key = f"{section}.{name}"
        if config.get(key):
            return config[key], f"pip config {key}"
    return None


def _local_path(value: str) -> Path | None:
    """A local filesystem path for a pip path/URL value, or None for a remote URL."""
    parsed = urlparse(value)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # http, https, ... (not "C:")
        return None
    return Path(value).expanduser()


def _detect_cert(config: Mapping[str, str], env: Mapping[str, str], notes: list[str]) -> Path | None:
    found = _lookup(config, env, "cert")
    if not found:
        return None
    value, where = found
    path = _local_path(value)
    if path is None or not path.is_file():
        notes.append(f"{where}={value!r} ignored: not an existing local file")
        return None
    return path


def _detect_find_links(config: Mapping[str, str], env: Mapping[str, str], notes: list[str]) -> Path | None:
    found = _lookup(config, env, "find-links")
    if not found:
        return None
    value, where = found
    chosen: Path | None = None
    for item in value.split():
        path = _local_path(item)
        if path is None:
            notes.append(f"{where}: find-links {item!r} ignored: a URL, not a local folder")
        elif not path.is_dir():
            notes.append(f"{where}: find-links {item!r} ignored: not an existing folder")
        elif chosen is None:
            chosen = path
        else:
            notes.append(f"{where}: find-links {item!r} ignored: only the first folder is used")
    return chosen
