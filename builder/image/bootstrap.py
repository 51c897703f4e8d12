"""Base images: use the official one, pull it, or bootstrap a Debian stand-in.

Where no registry is reachable an official ``debian:<suite>[-slim]`` base cannot be
pulled. :func:`bootstrap_debian` then makes a stand-in from the Debian archive with
``debootstrap --variant=minbase`` and imports it under envbuild's OWN name
``envbuild/bootstrap-debian:<suite>`` (never the official tag, so nobody mistakes it for
the official image); its labels say what it stands for. :func:`resolve_base` picks
between official, pulled, bootstrapped and explicitly named bases.

Sources: debootstrap(8); Debian release names and numbers:
https://www.debian.org/releases/ (11 bullseye, 12 bookworm, 13 trixie).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from builder.core.errors import EnvbuildError, Unreachable

if TYPE_CHECKING:  # the docker SDK is imported where an engine call needs it (~0.25 s)
    import docker

    from builder.image.engine import OnLine

#: Repository of bootstrapped Debian bases; the tag is the suite.
BOOTSTRAP_REPO = "envbuild/bootstrap-debian"
#: Default Debian mirror for debootstrap.
DEFAULT_MIRROR = "http://deb.debian.org/debian"

LABEL_STANDS_FOR = "envbuild.bootstrap.stands-for"
LABEL_SUITE = "envbuild.bootstrap.suite"
LABEL_MIRROR = "envbuild.bootstrap.mirror"

#: Debian release numbers and codenames (https://www.debian.org/releases/).
DEBIAN_SUITES = {
    "10": "buster",
    "11": "bullseye",
    "12": "bookworm",
    "13": "trixie",
    "14": "forky",
}
_CODENAMES = set(DEBIAN_SUITES.values()) | {"sid", "unstable"}

#: PATH of the official Debian images (``docker inspect debian:bookworm-slim``).
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Seconds allowed for an attempted pull in ``auto`` mode.
PULL_TIMEOUT_S = 30
#: debootstrap output lines kept in a failure's one-line message.
BOOTSTRAP_ERROR_LINES = 3

Warn = Callable[[str], None]


def _default_warn(message: str) -> None:
    print(f"envbuild: warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------- naming


def debian_suite(ref: str) -> str | None:
    """The Debian suite an official Debian image ref stands for, else None.

    ``"debian:bookworm-slim"`` -> ``"bookworm"``; ``"docker.io/library/debian:12"`` ->
    ``"bookworm"``; ``"debian:bookworm-20240110-slim"`` -> ``"bookworm"``;
    ``"ubuntu:22.04"``, ``"debian:latest"`` -> None.
    """
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
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                point = line.split()[4].encode().decode("unicode_escape")
                if point.startswith(prefix):
                    found.append(point)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def _remove_rootfs(root: Path) -> None:
    """Unmount what debootstrap may have left mounted below ``root``, then delete it.

    Refuses to delete (raises) while something is still mounted there: removing a tree
    with /proc or /sys of the host mounted in it would reach the host.
    """
    for point in _mounts_below(root):
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = _mounts_below(root)
    if left:
        raise EnvbuildError(
            f"still mounted after debootstrap: {', '.join(left)}; unmount and delete it by hand",
            field="bootstrap",
            value=str(root),
        )
    shutil.rmtree(root, ignore_errors=True)


def _run_logged(argv: list[str], on_line: OnLine | None, keep: int = 30) -> tuple[int, list[str]]:
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
    )
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            if on_line:
                on_line(line)
        return proc.wait(), list(tail)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _label_change(key: str, value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'LABEL {key}="{escaped}"'


def _can_bootstrap(ref: str, stands_for: str) -> str:
    """The debootstrap executable; raises EnvbuildError (exit 2) when it is missing or
    this process is not root."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise EnvbuildError(
            f"debootstrap is not installed, needed to bootstrap {ref} standing in for "
            f"{stands_for}; run `apt-get install debootstrap` (or scripts/setup.sh)",
            field="base",
            value=stands_for,
        )
    if os.geteuid() != 0:
        raise EnvbuildError(
            f"bootstrapping {ref} needs root (debootstrap); run as root or make "
            f"{stands_for} available to the engine",
            field="base",
            value=stands_for,
        )
    return debootstrap


def _debootstrap(debootstrap: str, suite: str, root: Path, mirror: str, stands_for: str,
                 on_line: OnLine | None) -> None:
    """``debootstrap --variant=minbase SUITE ROOT MIRROR``, then ``apt-get clean`` in a
    chroot. Raises Unreachable (exit 3) when the mirror cannot be reached, EnvbuildError
    (exit 2) for any other failure (its last lines in the one-line message)."""
    rc, tail = _run_logged([debootstrap, "--variant=minbase", suite, str(root), mirror], on_line)
    if rc != 0:
        # one line (errors always are): debootstrap's last lines after " | output: "
        text = " | output: " + " | ".join(ln for ln in tail[-BOOTSTRAP_ERROR_LINES:] if ln.strip()) if tail else ""
        unreachable = ("Failed getting release file", "Couldn't download", "Temporary failure resolving")
        if any(s in ln for ln in tail for s in unreachable):
            raise Unreachable(
                f"debootstrap could not reach the Debian mirror {mirror} (exit {rc}){text}",
                field="base",
                value=stands_for,
            )
        raise EnvbuildError(f"debootstrap {suite} failed (exit {rc}){text}", field="base", value=stands_for)
    rc, tail = _run_logged(["chroot", str(root), "apt-get", "clean"], on_line)
    if rc != 0:
        raise EnvbuildError(
            f"apt-get clean in the bootstrapped rootfs failed (exit {rc}): {tail[-1:]}",
            field="base",
            value=stands_for,
        )


def _empty_caches(root: Path) -> None:
    """Empty ``/var/lib/apt/lists`` and ``/etc/resolv.conf`` of the rootfs (the engine
    provides its own resolv.conf at run time)."""
    lists = root / "var/lib/apt/lists"
    if lists.is_dir():
        for entry in lists.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    resolv = root / "etc/resolv.conf"
    if resolv.is_file() and not resolv.is_symlink():
        resolv.write_text("")


def bootstrap_debian(
    client: docker.DockerClient,
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    stands_for: str | None = None,
    *,
    on_line: OnLine | None = None,
    rebuild: bool = False,
) -> str:
    """Make (or reuse) ``envbuild/bootstrap-debian:<suite>``, a minbase Debian rootfs.

    Steps: ``debootstrap --variant=minbase SUITE TMPDIR MIRROR``; ``apt-get clean`` in a
    chroot and empty ``/var/lib/apt/lists``; ``tar -C TMPDIR -c . | docker import`` with
    ``CMD ["/bin/bash"]``, ``ENV PATH=...`` (as the official image) and labels
    ``envbuild=1``, ``envbuild.bootstrap.stands-for=<stands_for>``,
    ``envbuild.bootstrap.suite=<suite>``, ``envbuild.bootstrap.mirror=<mirror>``. The
    import goes to a temporary tag renamed on success; the temporary rootfs (under
    ``$TMPDIR``, about 200 MB) is removed afterwards, also on failure. Needs root.

    Args:
        client: the engine.
        suite: Debian suite, e.g. ``"bookworm"``.
        mirror: Debian archive URL reachable from this host.
        stands_for: official image this replaces (default ``"debian:<suite>-slim"``).
        on_line: called with every debootstrap output line.
        rebuild: make a new one even when the image exists.

    Returns:
        ``"envbuild/bootstrap-debian:<suite>"``. An existing image of that name is
        reused as is unless ``rebuild``.

    Raises:
        EnvbuildError: (exit 2) debootstrap is not installed (``apt-get install
            debootstrap``), not root, or debootstrap failed (last lines in the message).
        Unreachable: (exit 3) the mirror could not be reached.
    """
    import docker.errors

    ref = bootstrap_ref(suite)
    stands_for = stands_for or f"debian:{suite}-slim"
    if not rebuild:
        try:
            client.images.get(ref)
            return ref
        except docker.errors.ImageNotFound:
            pass
    debootstrap = _can_bootstrap(ref, stands_for)
    root = Path(tempfile.mkdtemp(prefix="envbuild-bootstrap-"))
    tmp_tag = f"{suite}-importing-{uuid.uuid4().hex[:8]}"
    try:
        _debootstrap(debootstrap, suite, root, mirror, stands_for, on_line)
        _empty_caches(root)
        changes = [
            'CMD ["/bin/bash"]',
            f"ENV PATH={DEBIAN_PATH}",
            _label_change(LABEL_STANDS_FOR, stands_for),
            _label_change(LABEL_SUITE, suite),
            _label_change(LABEL_MIRROR, mirror),
        ]
        _import_rootfs(client, root, BOOTSTRAP_REPO, tmp_tag, changes)
        client.api.tag(f"{BOOTSTRAP_REPO}:{tmp_tag}", BOOTSTRAP_REPO, suite, force=True)
        return ref
    finally:
        try:
            client.api.remove_image(f"{BOOTSTRAP_REPO}:{tmp_tag}", noprune=True)
        except docker.errors.APIError:
            pass
        _remove_rootfs(root)


def _import_rootfs(client: docker.DockerClient, root: Path, repo: str, tag: str, changes: list[str]) -> None:
    """``tar -C root -c . | docker import`` through the SDK; raises if tar fails."""
    import docker.errors

    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None
    out = tar.stdout

    def chunks() -> Iterator[bytes]:
        while True:
            block = out.read(1 << 20)
            if not block:
                return
            yield block

    saved = client.api.timeout
    client.api.timeout = 900  # the engine writes the layer before it answers
    try:
        client.api.import_image(src=chunks(), repository=repo, tag=tag, changes=changes, stream_src=True)
    except docker.errors.APIError as e:
        raise EnvbuildError(f"docker import failed: {e}", field="base", value=f"{repo}:{tag}") from None
    finally:
        client.api.timeout = saved
        tar.stdout.close()
        err = tar.stderr.read().decode("utf-8", "replace") if tar.stderr else ""
        rc = tar.wait()
    if rc != 0:
        raise EnvbuildError(f"tar of the bootstrapped rootfs failed (exit {rc}): {err.strip()[-300:]}",
                            field="base", value=str(root))


# --------------------------------------------------------------------------- resolve


class PullFailed(Unreachable):
    """``ref`` could not be pulled (exit 3); ``reason`` says why in one line."""

    def __init__(self, reason: str, ref: str) -> None:
        self.reason = reason
        super().__init__(f"cannot be pulled: {reason}", field="image", value=ref)


def pull(client: docker.DockerClient, ref: str, timeout_s: float = PULL_TIMEOUT_S) -> str:
    """Pull ``ref`` and return its image ID.

    Raises:
        Unreachable: (exit 3) the pull failed or did not finish within ``timeout_s``
            (the engine may keep trying in the background).
    """
    import docker.errors

    outcome: dict = {}

    def _pull() -> None:
        try:
            for event in client.api.pull(ref, stream=True, decode=True):
                if isinstance(event, dict) and event.get("error"):
                    outcome["error"] = event["error"]
                    return
            outcome["done"] = True
        except docker.errors.APIError as e:  # reported below, in the calling thread
            outcome["error"] = e.explanation or str(e)
        except Exception as e:
            outcome["error"] = str(e)

    worker = threading.Thread(target=_pull, daemon=True, name=f"pull {ref}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        reason = f"pull did not finish within {timeout_s:g} s"
    elif "error" in outcome:
        reason = " ".join(str(outcome["error"]).split())
    else:
        reason = None
    if reason:
        raise PullFailed(reason, ref)
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        raise Unreachable("pulled but not found afterwards", field="image", value=ref) from None


def _local_id(client: docker.DockerClient, ref: str) -> str | None:
    import docker.errors

    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


#: Values of ``--base-mode``.
MODES = ("auto", "pull", "bootstrap", "local")


def _explicit_base(client: docker.DockerClient, override: str, mode: str,
                   pull_timeout_s: float) -> tuple[str, str, str]:
    """``--base IMAGE``: taken as is, local or pulled, never bootstrapped."""
    if mode == "bootstrap":
        raise EnvbuildError("--base IMAGE and --base-mode bootstrap exclude each other", field="base", value=override)
    image_id = None if mode == "pull" else _local_id(client, override)
    if image_id is None:
        if mode == "local":
            raise Unreachable("is not available locally", field="base", value=override)
        image_id = pull(client, override, pull_timeout_s)
    return override, image_id, "explicit"


def _bootstrapped(client: docker.DockerClient, official_ref: str, mirror: str,
                  on_line: OnLine | None) -> tuple[str, str, str]:
    suite = debian_suite(official_ref)
    if suite is None:
        raise EnvbuildError("only a debian:<suite> base can be bootstrapped", field="base", value=official_ref)
    ref = bootstrap_debian(client, suite, mirror, official_ref, on_line=on_line)
    return ref, client.images.get(ref).id, "bootstrapped"


def _auto_base(client: docker.DockerClient, official_ref: str, mode: str, pull_timeout_s: float, mirror: str,
               warn: Warn, on_line: OnLine | None) -> tuple[str, str, str]:
    """``local`` and ``auto``: the local image, else (``auto``) pulled, else bootstrapped."""
    image_id = _local_id(client, official_ref)
    if image_id:
        return official_ref, image_id, "local"
    if mode == "local":
        raise Unreachable(
            "base image is not available locally (--base-mode local)", field="base", value=official_ref
        )
    try:
        return official_ref, pull(client, official_ref, pull_timeout_s), "pulled"
    except Unreachable as e:
        reason = e.reason if isinstance(e, PullFailed) else e.message
        suite = debian_suite(official_ref)
        if suite is None:
            raise Unreachable(
                f"base image is not available locally and cannot be pulled ({reason}); "
                "load it (docker load) or name a local one with --base IMAGE",
                field="base",
                value=official_ref,
            ) from None
    ref = bootstrap_debian(client, suite, mirror, official_ref, on_line=on_line)
    warn(
        f"{official_ref} is not available locally and cannot be pulled ({reason}); "
        f"a bootstrapped base {ref} (debootstrap minbase of {suite}) stands in for it: "
        "not byte-identical to the official image"
    )
    return ref, client.images.get(ref).id, "bootstrapped"


def resolve_base(
    client: docker.DockerClient,
    official_ref: str,
    mode: str = "auto",
    *,
    override: str | None = None,
    pull_timeout_s: float = PULL_TIMEOUT_S,
    mirror: str = DEFAULT_MIRROR,
    warn: Warn | None = None,
    on_line: OnLine | None = None,
) -> tuple[str, str, str]:
    """Decide which image the build uses as its base.

    Args:
        official_ref: the recipe's base, e.g. ``"debian:bookworm-slim"``.
        mode: ``"auto"``: the official image if present locally, else pull it (at most
            ``pull_timeout_s``), else for a Debian base bootstrap a stand-in
            (:func:`bootstrap_debian`) with a warning through ``warn``;
            ``"local"``: only an image present locally; ``"pull"``: pull (refresh) it;
            ``"bootstrap"``: the bootstrapped stand-in. Any other value is taken as an
            image ref, like ``override``.
        override: ``--base IMAGE``: an image used instead of the official one, taken as
            is: local (``local``, ``auto``) or pulled (``pull``, ``auto`` when absent);
            never bootstrapped.
        warn: receives the warning that a bootstrapped base stands in (default: print to
            stderr).
        on_line: debootstrap output lines.

    Returns:
        ``(ref_used, image_id, how)``, ``how`` one of ``"local"``, ``"pulled"``,
        ``"bootstrapped"``, ``"explicit"`` (``override`` used).

    Raises:
        Unreachable: (exit 3) the image is needed from a registry that cannot be reached
            and cannot be bootstrapped (not a Debian base, or mode ``local``/``pull``);
            the message names it.
        EnvbuildError: (exit 2) ``bootstrap`` for a non-Debian base or with ``override``;
            bootstrap failures.
    """
    if mode not in MODES:
        override, mode = override or mode, "auto"
    if override:
        return _explicit_base(client, override, mode, pull_timeout_s)
    if mode == "bootstrap":
        return _bootstrapped(client, official_ref, mirror, on_line)
    if mode == "pull":
        return official_ref, pull(client, official_ref, pull_timeout_s), "pulled"
    return _auto_base(client, official_ref, mode, pull_timeout_s, mirror, warn or _default_warn, on_line)
