"""Site settings a user repeats (never certification settings): ``envbuild.toml`` in the working
folder, else ``$XDG_CONFIG_HOME/envbuild/config.toml``, then ``ENVBUILD_<KEY>``; a flag wins.
Each value is handed to the command line as its flag, so the flag's own check applies."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from builder.core.errors import UsageError
from builder.core.inputs import escape, read_regular

#: key -> (flag, commands it goes to; () for every command, given before the command).
SITE: dict[str, tuple[str, tuple[str, ...]]] = {
    "images_dir": ("--images-dir", ()), "recipes_dir": ("--recipes-dir", ()),
    "registry": ("--registry", ("push", "pull")), "namespace": ("--namespace", ("push", "pull")),
    "launcher": ("--launcher", ("certify", "make")), "partition": ("--partition", ("certify", "make")),
    "container_runtime": ("--container-runtime", ("certify", "make")),
    "slurm_dir": ("--slurm-dir", ("certify", "make")), "kubeconfig": ("--kubeconfig", ("k8s render",)),
    "context": ("--context", ("k8s render",)),
}


def config_file() -> Path | None:
    """The config file that applies, or None; one that is there but no regular file (a FIFO, a
    folder) applies too, so that reading it refuses it (exit 3) rather than skip it unsaid."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    for path in (Path("envbuild.toml"), Path(xdg, "envbuild", "config.toml")):
        if path.exists():
            return path
    return None


def settings() -> dict[str, tuple[str, str]]:
    """``{key: (value, where it came from)}`` of the keys set in the file or the environment."""
    found: dict[str, tuple[str, str]] = {}
    path = config_file()
    if path is not None:
        try:
            doc = tomllib.loads(read_regular(path, 1 << 16, "config file").decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"not TOML: {escape(str(e), 200)}", file=str(path)) from None
        for key, value in doc.items():
            if key not in SITE or not isinstance(value, str) or len(value) > 4096:
                raise UsageError(f"unknown key or not a string (keys: {', '.join(SITE)})",
                                 file=str(path), field=str(key)[:80])
            found[key] = (value, str(path))
    for key in SITE:
        if f"ENVBUILD_{key.upper()}" in os.environ:
            found[key] = (os.environ[f"ENVBUILD_{key.upper()}"], f"ENVBUILD_{key.upper()}")
    return found


def with_settings(argv: list[str], commands: set[str]) -> tuple[list[str], list[str]]:
    """``argv`` with the settings as flags before the user's own (argparse keeps the last), and
    the sources used."""
    at = next((i for i, a in enumerate(argv) if a in commands), None)
    if at is None or argv[at] == "config":
        return argv, []
    command = argv[at] + (f" {argv[at + 1]}" if argv[at] == "k8s" and at + 1 < len(argv) else "")
    before: list[str] = []
    after: list[str] = []
    used: list[str] = []
    for key, (value, where) in settings().items():
        flag, goes_to = SITE[key]
        given = any(a == flag or a.startswith(f"{flag}=") for a in argv)
        if not given and (not goes_to or command in goes_to):
            (before if not goes_to else after).append(f"{flag}={value}")
            used.append(where)
    cut = at + 1 + (command != argv[at])
    return argv[:at] + before + argv[at:cut] + after + argv[cut:], used
