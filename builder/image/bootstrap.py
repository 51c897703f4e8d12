"""Base images: the official one, pulled, or a bootstrapped Debian stand-in.
Without a registry, ``debootstrap`` makes a stand-in under envbuild's OWN name (never the official
tag, so nobody takes it for the official image). Sources: debootstrap(8), debian.org/releases."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from builder.core import process
from builder.core.errors import EnvbuildError, Unreachable
from builder.core.files import write_atomic

from .engine import PULL_TIMEOUT_S, PullFailed
from .progress import stderr_warn

if TYPE_CHECKING:
    from builder.image.engine import Engine, OnLine

#: Repository of bootstrapped Debian bases; the tag is the suite.
BOOTSTRAP_REPO = "envbuild/bootstrap-debian"
#: Default Debian mirror for debootstrap.
DEFAULT_MIRROR = "http://deb.debian.org/debian"

LABEL_STANDS_FOR = "envbuild.bootstrap.stands-for"
LABEL_SUITE = "envbuild.bootstrap.suite"
LABEL_MIRROR = "envbuild.bootstrap.mirror"

#: Debian release numbers and codenames (https://www.debian.org/releases/).
DEBIAN_SUITES = {"10": "buster", "11": "bullseye", "12": "bookworm", "13": "trixie", "14": "forky"}
_CODENAMES = set(DEBIAN_SUITES.values()) | {"sid", "unstable"}

#: PATH of the official Debian images (``docker inspect debian:bookworm-slim``).
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: debootstrap output lines kept in a failure's one-line message.
BOOTSTRAP_ERROR_LINES = 3

Warn = Callable[[str], None]


# --------------------------------------------------------------------------- naming


def debian_suite(ref: str) -> str | None:
    """The suite an official Debian ref stands for (``debian:12`` -> ``bookworm``), else None."""
    from builder.oci import reference

    parsed = reference.try_parse(ref)
    if parsed is None or parsed.familiar != "debian" or not parsed.tag:
        return None
    tag = parsed.tag
    head = re.split(r"[.\-]", tag, maxsplit=1)[0]
    if head in DEBIAN_SUITES:
        return DEBIAN_SUITES[head]
    return head if head in _CODENAMES else None


def bootstrap_ref(suite: str) -> str:
    """The stand-in's name for ``suite``: ``"envbuild/bootstrap-debian:<suite>"``."""
    return f"{BOOTSTRAP_REPO}:{suite}"


# --------------------------------------------------------------------------- bootstrap


def _mounts_below(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _remove_rootfs(root: Path) -> None:
    """Unmount what debootstrap left in ``root``, then delete it; refused while mounted (the host's /proc)."""
    for point in _mounts_below(root):
        process.run(["umount", "-l", point], 60)
    left = _mounts_below(root)
    if left:
        raise EnvbuildError(f"still mounted after debootstrap: {', '.join(left)}; unmount and delete it by hand",
                            field="bootstrap", value=str(root))
    shutil.rmtree(root, ignore_errors=True)


def _run_logged(argv: list[str], on_line: OnLine | None, keep: int = 30) -> tuple[int, list[str]]:
    tail: collections.deque[str] = collections.deque(maxlen=keep)

    def each(line: str) -> None:
        tail.append(line)
        if on_line:
            on_line(line)

    return process.stream(argv, None, each)[0], list(tail)


def _label_change(key: str, value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'LABEL {key}="{escaped}"'


def _can_bootstrap(ref: str, stands_for: str) -> str:
    """The debootstrap executable; raises EnvbuildError (exit 2) when it is missing or this process is not root."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise EnvbuildError(f"debootstrap is not installed, needed to bootstrap {ref} standing in for "
                            f"{stands_for}; run `apt-get install debootstrap` (or scripts/setup.sh)",
                            field="base", value=stands_for)
    if os.geteuid() != 0:
        raise EnvbuildError(f"bootstrapping {ref} needs root (debootstrap); run as root or make "
                            f"{stands_for} available to the engine", field="base", value=stands_for)
    return debootstrap


def _debootstrap(debootstrap: str, suite: str, root: Path, mirror: str, stands_for: str,
                 on_line: OnLine | None) -> None:
    """Unreachable (exit 3): mirror unreachable; EnvbuildError (exit 2): another failure, its last lines."""
    rc, tail = _run_logged([debootstrap, "--variant=minbase", suite, str(root), mirror], on_line)
    if rc != 0:
        # one line (errors always are): debootstrap's last lines after " | output: "
        text = " | output: " + " | ".join(ln for ln in tail[-BOOTSTRAP_ERROR_LINES:] if ln.strip()) if tail else ""
        unreachable = ("Failed getting release file", "Couldn't download", "Temporary failure resolving")
        if any(s in ln for ln in tail for s in unreachable):
            raise Unreachable(f"debootstrap could not reach the Debian mirror {mirror} (exit {rc}){text}",
                              field="base", value=stands_for)
        raise EnvbuildError(f"debootstrap {suite} failed (exit {rc}){text}", field="base", value=stands_for)
    rc, tail = _run_logged(["chroot", str(root), "apt-get", "clean"], on_line)
    if rc != 0:
        raise EnvbuildError(f"apt-get clean in the bootstrapped rootfs failed (exit {rc}): {tail[-1:]}",
                            field="base", value=stands_for)


def _empty_caches(root: Path) -> None:
    """Empty the rootfs' ``/var/lib/apt/lists`` and ``/etc/resolv.conf`` (the engine gives its own at run)."""
    lists = root / "var/lib/apt/lists"
    if lists.is_dir():
        for entry in lists.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    resolv = root / "etc/resolv.conf"
    if resolv.is_file() and not resolv.is_symlink():
        write_atomic(resolv, b"")


def bootstrap_debian(client: Engine, suite: str = "bookworm", mirror: str = DEFAULT_MIRROR,
                     stands_for: str | None = None, *, on_line: OnLine | None = None, rebuild: bool = False) -> str:
    """Make or reuse ``envbuild/bootstrap-debian:<suite>`` (a temporary tag renamed on success); needs root.
    EnvbuildError (exit 2): no debootstrap, not root, it failed; Unreachable (exit 3): mirror."""
    ref = bootstrap_ref(suite)
    stands_for = stands_for or f"debian:{suite}-slim"
    if not rebuild and client.image_id(ref):
        return ref
    debootstrap = _can_bootstrap(ref, stands_for)
    root = Path(tempfile.mkdtemp(prefix="envbuild-bootstrap-"))
    tmp_tag = f"{suite}-importing-{uuid.uuid4().hex[:8]}"
    try:
        _debootstrap(debootstrap, suite, root, mirror, stands_for, on_line)
        _empty_caches(root)
        changes = ['CMD ["/bin/bash"]', f"ENV PATH={DEBIAN_PATH}", _label_change(LABEL_STANDS_FOR, stands_for),
                   _label_change(LABEL_SUITE, suite), _label_change(LABEL_MIRROR, mirror)]
        _import_rootfs(client, root, BOOTSTRAP_REPO, tmp_tag, changes)
        client.tag(f"{BOOTSTRAP_REPO}:{tmp_tag}", BOOTSTRAP_REPO, suite)
        return ref
    finally:
        client.untag(f"{BOOTSTRAP_REPO}:{tmp_tag}")
        _remove_rootfs(root)


def _import_rootfs(client: Engine, root: Path, repo: str, tag: str, changes: list[str]) -> None:
    """``tar -C root -c . | docker import``; raises if tar fails."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-c", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tar.stdout is not None
    try:
        client.import_tar(iter(functools.partial(tar.stdout.read, 1 << 20), b""), repo, tag, changes)
    except Unreachable as e:
        raise EnvbuildError(f"docker import failed: {e.message}", field="base", value=f"{repo}:{tag}") from None
    finally:
        tar.stdout.close()
        err = tar.stderr.read().decode("utf-8", "replace") if tar.stderr else ""
        rc = tar.wait()
    if rc != 0:
        raise EnvbuildError(f"tar of the bootstrapped rootfs failed (exit {rc}): {err.strip()[-300:]}",
                            field="base", value=str(root))


# --------------------------------------------------------------------------- resolve


#: Values of ``--base-mode``.
MODES = ("auto", "pull", "bootstrap", "local")


def _explicit_base(client: Engine, override: str, mode: str, pull_timeout_s: float) -> tuple[str, str, str]:
    """``--base IMAGE``: taken as is, local or pulled, never bootstrapped."""
    if mode == "bootstrap":
        raise EnvbuildError("--base IMAGE and --base-mode bootstrap exclude each other", field="base", value=override)
    image_id = None if mode == "pull" else client.image_id(override)
    if image_id is None:
        if mode == "local":
            raise Unreachable("is not available locally", field="base", value=override)
        image_id = client.pull(override, pull_timeout_s)
    return override, image_id, "explicit"


def _auto_base(client: Engine, official_ref: str, mode: str, pull_timeout_s: float, mirror: str,
               warn: Warn, on_line: OnLine | None) -> tuple[str, str, str]:
    """``local`` and ``auto``: the local image, else (``auto``) pulled, else bootstrapped."""
    image_id = client.image_id(official_ref)
    if image_id:
        return official_ref, image_id, "local"
    if mode == "local":
        raise Unreachable("base image is not available locally (--base-mode local)", field="base", value=official_ref)
    try:
        return official_ref, client.pull(official_ref, pull_timeout_s), "pulled"
    except Unreachable as e:
        reason = e.reason if isinstance(e, PullFailed) else e.message
        suite = debian_suite(official_ref)
        if suite is None:
            raise Unreachable(f"base image is not available locally and cannot be pulled ({reason}); "
                              "load it (docker load) or name a local one with --base IMAGE",
                              field="base", value=official_ref) from None
    ref = bootstrap_debian(client, suite, mirror, official_ref, on_line=on_line)
    warn(f"{official_ref} is not available locally and cannot be pulled ({reason}); a bootstrapped base {ref} "
         f"(debootstrap minbase of {suite}) stands in for it: not byte-identical to the official image")
    return ref, str(client.image_id(ref)), "bootstrapped"


def resolve_base(client: Engine, official_ref: str, mode: str = "auto", *, override: str | None = None,
                 pull_timeout_s: float = PULL_TIMEOUT_S, mirror: str = DEFAULT_MIRROR, warn: Warn | None = None,
                 on_line: OnLine | None = None) -> tuple[str, str, str]:
    """``(ref used, image ID, how)``; ``override`` (``--base``) is never bootstrapped. Unreachable (exit 3): registry
    needed; EnvbuildError (exit 2): ``bootstrap`` of a non-Debian base or with ``override``, or failed."""
    if mode not in MODES:
        override, mode = override or mode, "auto"
    if override:
        return _explicit_base(client, override, mode, pull_timeout_s)
    if mode == "bootstrap":
        suite = debian_suite(official_ref)
        if suite is None:
            raise EnvbuildError("only a debian:<suite> base can be bootstrapped", field="base", value=official_ref)
        ref = bootstrap_debian(client, suite, mirror, official_ref, on_line=on_line)
        return ref, str(client.image_id(ref)), "bootstrapped"
    if mode == "pull":
        return official_ref, client.pull(official_ref, pull_timeout_s), "pulled"
    return _auto_base(client, official_ref, mode, pull_timeout_s, mirror, warn or stderr_warn, on_line)
