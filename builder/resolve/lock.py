"""``envbuild lock RECIPE``: resolve what the recipe leaves open, for reproducible builds.

The rendered lock (:meth:`builder.recipe.compat.Spec.lock`) pins what the recipe says: torch, NCCL,
Python, the base image *tag*. This stage resolves the rest, where it can be reached:

* **base image**: the tag to a manifest digest: the digest the engine recorded when the
  image was pulled (``RepoDigests``), else the registry's answer to ``HEAD
  /v2/<repo>/manifests/<tag>`` (OCI distribution spec); a ref already pinned by digest is
  kept;
* **pip**: every requirement and dependency to an exact version with the sha256 of the
  wheel, by pip's own resolver: ``pip install --dry-run --ignore-installed --report``
  for the image's interpreter and platform (``--python-version``, ``--implementation cp``,
  ``--platform manylinux_2_<m>_<arch>`` for every glibc minor down to 17,
  ``--only-binary=:all:``), with the recipe's indexes and the site's CA bundle and wheel
  folder (``builder.image.site``), and nothing else from pip's configuration
  (``PIP_CONFIG_FILE=/dev/null``): the build sees the same sources. The report format is
  pip's "installation report" (https://pip.pypa.io/en/stable/reference/installation-report/);
* **apt**: every package the rendered files install by name (``python3``,
  ``python3-venv`` and the recipe's unpinned ``packages.apt``) to the candidate version
  ``apt-cache policy`` gives in a throwaway container of the base image after ``apt-get
  update`` (top-level packages only; their dependencies follow the mirror's state).

The result is written to ``images/<recipe>/envbuild.resolved.json`` (schema
``envbuild.resolved/1``, byte-deterministic: no time stamps), tied to the rendered lock by
``lock_hash``; then the recipe is rendered again so that ``envbuild.lock.json`` carries
the pins under the key ``resolved`` and the Dockerfile/Singularity definition install
``--require-hashes`` (:func:`builder.render.rendered.render_for`). What cannot be resolved (no
registry, index or mirror reachable) is listed in ``unresolved`` and left as the recipe has
it; ``envbuild lock`` then exits 1 (warnings).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from builder.render import rendered as render
from builder.recipe.compat import Spec, lock_hash
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.files import write_atomic
from builder.recipe.schema import APT_NAME
from builder.image.site import SiteOptions

#: Seconds for one pip resolution and for the apt query container.
PIP_TIMEOUT_S = 600
APT_TIMEOUT_S = 300
#: Oldest manylinux glibc minor pip is told the image accepts (manylinux2014 = 2.17).
MANYLINUX_MIN_MINOR = 17

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class LockResult:
    """Outcome of :func:`lock`.

    Attributes:
        path: the ``envbuild.resolved.json`` written.
        resolved: its content.
        unresolved: one line per thing left unresolved (the warnings).
        written: rendered files rewritten because of the new pins.
    """

    path: Path
    resolved: dict
    unresolved: list[str]
    written: list[Path] = field(default_factory=list)


# --------------------------------------------------------------------------- base


def resolve_base(ref: str, client=None, *, timeout_s: float = 10.0) -> tuple[str | None, str, str | None]:
    """Resolve a base image ref to a manifest digest.

    Returns:
        ``(digest or None, source, note)``: source ``"recipe"`` (already pinned),
        ``"engine"`` (the local image's ``RepoDigests``), ``"registry"`` (HEAD manifest)
        or ``"none"``; ``note`` says why it is unresolved.
    """
    from builder.oci import reference

    image = reference.try_parse(ref)
    if image is None:
        return None, "none", f"base {ref}: not resolved to a digest (not an image reference)"
    if image.digest:
        return image.digest, "recipe", None
    tag = image.tag or "latest"
    if client is not None:
        try:
            img = client.images.get(ref)
            for rd in img.attrs.get("RepoDigests") or []:
                pinned = reference.try_parse(rd)
                if pinned and pinned.digest and pinned.same_repository(image):
                    return pinned.digest, "engine", None
        except Exception:  # noqa: BLE001 - the engine is only one of the sources
            pass
    from builder.oci.client import RegistryClient

    try:
        reg = RegistryClient(image.registry, timeout_s=timeout_s)
        desc = reg.head_manifest(image.repository, tag)
    except EnvbuildError as e:
        return None, "none", f"base {ref}: not resolved to a digest ({e})"
    if desc is None:
        return None, "none", f"base {ref}: the registry {image.registry} has no tag {tag}"
    return desc.digest, "registry", None


# --------------------------------------------------------------------------- pip


def platform_tags(glibc: str, arch: str = "x86_64") -> list[str]:
    """``manylinux_2_<m>_<arch>`` for m from the image's glibc minor down to 17, then
    ``linux_<arch>`` (pip matches ``--platform`` exactly, so every accepted tag is listed)."""
    major, _, minor = str(glibc).partition(".")
    try:
        top = int(minor) if major == "2" else MANYLINUX_MIN_MINOR
    except ValueError:
        top = MANYLINUX_MIN_MINOR
    tags = [f"manylinux_2_{m}_{arch}" for m in range(max(top, MANYLINUX_MIN_MINOR), MANYLINUX_MIN_MINOR - 1, -1)]
    return [*tags, f"manylinux2014_{arch}", f"linux_{arch}"]


def pip_command(spec: Spec, site: SiteOptions, report: Path, target: Path, *, python: str | None = None
                ) -> list[str]:
    """The ``pip install --dry-run --report`` argv resolving ``spec``'s requirements for
    the image (see the module doc)."""
    r = spec.recipe
    argv = [python or sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "20",
            "--report", str(report), "--target", str(target), "--only-binary=:all:",
            "--python-version", r.python, "--implementation", "cp"]
    for tag in platform_tags(spec.glibc):
        argv += ["--platform", tag]
    argv += ["--index-url", r.index_url]
    if spec.torch_index_url:
        argv += ["--extra-index-url", spec.torch_index_url]
    if site.wheel_dir:
        argv += ["--find-links", str(site.wheel_dir)]
    if site.ca_bundle:
        argv += ["--cert", str(site.ca_bundle)]
    return [*argv, *spec.pip_requirements()]


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def parse_report(report: Mapping[str, Any]) -> list[dict]:
    """``[{"name", "version", "hashes": ["sha256:..."], "file", "requested"}]`` from a pip
    installation report, sorted by name.

    Raises:
        EnvbuildError: (exit 3) an entry has no sha256 (pip could not hash its source).
    """
    out = []
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        info = item.get("download_info") or {}
        archive = info.get("archive_info") or {}
        hashes = dict(archive.get("hashes") or {})
        if not hashes and archive.get("hash"):
            algo, _, value = str(archive["hash"]).partition("=")
            hashes[algo] = value
        sha = hashes.get("sha256")
        if not sha or not _SHA256_HEX.match(sha):
            raise EnvbuildError("pip gave no sha256 for it", field="pip", value=f"{meta.get('name')}=={meta.get('version')}",
                                exit_code=ExitCode.UNREACHABLE)
        url = str(info.get("url") or "")
        out.append({
            "name": str(meta.get("name")),
            "version": str(meta.get("version")),
            "hashes": [f"sha256:{sha}"],
            "file": url.rsplit("/", 1)[-1].replace("%2B", "+"),
            "requested": bool(item.get("requested")),
        })
    return sorted(out, key=lambda p: re.sub(r"[-_.]+", "-", p["name"]).lower())


def resolve_pip(spec: Spec, site: SiteOptions, *, timeout_s: float = PIP_TIMEOUT_S
                ) -> tuple[list[dict] | None, str | None]:
    """Resolve the pip requirements with hashes. Returns ``(packages, None)`` or
    ``(None, note)`` when pip could not resolve (index unreachable, no wheel)."""
    with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp:
        report = Path(tmp) / "report.json"
        argv = pip_command(spec, site, report, Path(tmp) / "target")
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=_pip_env(),
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None, f"pip: no resolution within {timeout_s:g} s"
        if proc.returncode != 0 or not report.is_file():
            errors = [l.strip() for l in proc.stderr.splitlines() if l.strip().startswith("ERROR")]
            last = errors[0] if errors else (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"pip: not resolved ({' '.join(last.split())[:300]})"
        try:
            return parse_report(json.loads(report.read_text())), None
        except EnvbuildError as e:
            return None, f"pip: not resolved ({e})"
        except (OSError, ValueError) as e:
            return None, f"pip: unreadable report ({e})"


# --------------------------------------------------------------------------- apt


def apt_names(spec: Spec) -> list[str]:
    """The unpinned Debian packages the rendered files install: ``python3``,
    ``python3-venv`` and the recipe's ``packages.apt`` without ``=version``."""
    names = ["python3", "python3-venv", *[p for p in spec.recipe.apt if "=" not in p]]
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


#: The apt query's shell script: the package names arrive as its arguments ("$@"), never
#: as shell text.
APT_QUERY = ("apt-get update -qq >/dev/null 2>&1 || { echo 'envbuild: apt-get update failed' >&2; exit 90; }; "
             'exec apt-cache policy "$@"')


def apt_query_argv(names: list[str]) -> list[str]:
    """The container command of the apt query: ``sh -c APT_QUERY sh NAME...`` (the names are
    positional arguments of the script, each one argv word)."""
    return ["sh", "-c", APT_QUERY, "sh", *names]


def resolve_apt(client, image: str, names: list[str], *, labels: Mapping[str, str] | None = None,
                timeout_s: float = APT_TIMEOUT_S) -> tuple[dict[str, str] | None, str | None]:
    """Candidate versions of ``names`` in ``image`` (``apt-get update`` then ``apt-cache
    policy`` in a throwaway container, removed afterwards). Returns ``(pins, None)`` or
    ``(None|partial, note)``. Raises :class:`EnvbuildError` (exit 2) for a name that is not a
    Debian package name (:data:`builder.recipe.schema.APT_NAME`); names reach the container as
    argv words (:func:`apt_query_argv`), never as shell text."""
    import docker.errors
    import requests

    from builder.image import engine

    bad = [n for n in names if not (isinstance(n, str) and APT_NAME.fullmatch(n))]
    if bad:
        raise EnvbuildError("is not a Debian package name; not queried", field="apt", value=bad[0])
    try:
        c = client.containers.create(image, apt_query_argv(names), labels={engine.LABEL: "1", **(labels or {})},
                                     environment={"DEBIAN_FRONTEND": "noninteractive"})
    except docker.errors.ImageNotFound:
        return None, f"apt: base image {image} not in the engine"
    except docker.errors.APIError as e:
        return None, f"apt: {e.explanation or e}"
    try:
        c.start()
        try:
            code = c.wait(timeout=timeout_s).get("StatusCode", -1)
        except (requests.exceptions.RequestException, OSError):
            return None, f"apt: no answer within {timeout_s:g} s"
        out = c.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        if code != 0:
            err = c.logs(stdout=False, stderr=True).decode("utf-8", "replace").strip().splitlines()
            return None, f"apt: query in {image} exited {code} ({(err or ['no output'])[-1][:200]})"
    finally:
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            pass
    pins = parse_policy(out)
    missing = [n for n in names if n not in pins]
    note = f"apt: no candidate for {', '.join(missing)} in {image}" if missing else None
    return {n: pins[n] for n in names if n in pins}, note


# --------------------------------------------------------------------------- lock


def write_resolved(doc: Mapping[str, Any], images_dir: str | os.PathLike) -> Path:
    """Write ``images_dir/<recipe>/envbuild.resolved.json`` atomically (sorted keys,
    2-space indent, trailing newline). Returns the path."""
    folder = Path(images_dir) / str(doc["recipe"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / render.RESOLVED_FILE
    return write_atomic(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())


def lock(spec: Spec, images_dir: str | os.PathLike, site: SiteOptions, client=None, *,
         base: bool = True, pip: bool = True, apt: bool = True, base_mode: str = "auto",
         labels: Mapping[str, str] | None = None, say: Callable[[str], None] | None = None,
         pip_resolver: Callable[[Spec, SiteOptions], tuple[list | None, str | None]] | None = None
         ) -> LockResult:
    """Resolve ``spec`` (see the module doc), write ``envbuild.resolved.json`` and render.

    Args:
        spec: a compatible spec (:func:`builder.recipe.compat.require_ok`).
        images_dir: the rendered files' root (``images/``).
        site: CA bundle and wheel folder for pip; ``base_override`` for the apt query image.
        client: docker client (base digest from the engine, apt query); None skips both.
        base, pip, apt: which parts to resolve (a part not resolved keeps its previous pins
            when the earlier resolved file is for the same lock, else stays open).
        base_mode: how to get an image to query apt in (:func:`builder.image.bootstrap.resolve_base`).
        labels: labels for the temporary containers.
        say: progress messages.
        pip_resolver: replaces :func:`resolve_pip` (tests).

    Returns:
        :class:`LockResult`.

    Raises:
        EnvbuildError: (exit 2) the recipe is not compatible; unwritable files.
    """
    say = say or (lambda _m: None)
    r = spec.recipe
    base_lock = spec.lock()
    try:
        previous = render.load_resolved(spec, images_dir) or {}
    except EnvbuildError:
        previous = {}
    unresolved: list[str] = []
    doc: dict[str, Any] = {
        "schema": render.RESOLVED_SCHEMA,
        "recipe": r.name,
        "lock_hash": lock_hash(base_lock),
        "base": dict(previous.get("base") or {"ref": r.base_image, "digest": None, "source": "none"}),
        "pip": list(previous.get("pip") or []),
        "pip_resolver": dict(previous.get("pip_resolver") or {}),
        "apt": dict(previous.get("apt") or {}),
        "apt_source": previous.get("apt_source"),
    }
    if base:
        say(f"resolving the base image {r.base_image}")
        digest, source, note = resolve_base(r.base_image, client)
        doc["base"] = {"ref": r.base_image, "digest": digest, "source": source}
        if note:
            unresolved.append(note)
    if pip:
        say("resolving pip requirements with pip's resolver")
        packages, note = (pip_resolver or resolve_pip)(spec, site)
        if packages is None:
            doc["pip"] = []
            unresolved.append(note or "pip: not resolved")
        else:
            doc["pip"] = packages
        doc["pip_resolver"] = {
            "python": r.python,
            "platform": platform_tags(spec.glibc)[0],
            "indexes": [u for u in (r.index_url, spec.torch_index_url) if u],
            "site_wheels": bool(site.wheel_dir),
        }
    if apt:
        names = apt_names(spec)
        if client is None:
            unresolved.append("apt: no Docker engine to query the base image")
        else:
            from builder.image import bootstrap

            say(f"resolving apt versions of {', '.join(names)}")
            try:
                image, _image_id, how = bootstrap.resolve_base(client, r.base_image, base_mode,
                                                               override=site.base_override, warn=lambda _m: None)
            except EnvbuildError as e:
                image, how = None, None
                unresolved.append(f"apt: no base image to query ({e})")
            if image:
                pins, note = resolve_apt(client, image, names, labels=labels)
                if pins is not None:
                    doc["apt"] = pins
                    doc["apt_source"] = {"image": image if how != "bootstrapped" else f"{image} (bootstrapped stand-in for {r.base_image})"}
                if note:
                    unresolved.append(note)
    doc["unresolved"] = unresolved
    render.check_resolved(doc, spec, f"{images_dir}/{r.name}/{render.RESOLVED_FILE}")
    path = write_resolved(doc, images_dir)
    rendered = render.render(spec, doc)
    stale = render.stale(rendered, images_dir)
    folder, _ = render.write(rendered, images_dir)
    return LockResult(path=path, resolved=doc, unresolved=unresolved, written=[folder / n for n in stale])
