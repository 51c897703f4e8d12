"""Build a rendered recipe into an image and check the image against its lock.
The site CA (BuildKit secret ``pip_ca``) and wheels (bind mount) never end up in the image. The
tag hashes the lock, the Dockerfile and the base's image ID: unchanged inputs give the same tag."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.agent import payload
from builder.core import inputs, process
from builder.core.clock import utc_stamp
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.files import write_atomic
from builder.core.paths import DOCKERFILE, LOCK_FILE, image_dir
from builder.oci import reference

from . import probecache, reuse
from .engine import BuildFailed, BuildkitCLI
from .progress import ConsoleProgress, console_warn, stderr_warn
from .site import SiteOptions

if TYPE_CHECKING:
    from builder.recipe.model import Lock

    from .bootstrap import Warn
    from .engine import Engine, OnLine
    from .indexes import IndexPlan

#: Repository of built images; the tag is the inputs hash.
IMAGE_REPO_PREFIX = "envbuild/"
#: The CA bundle's BuildKit secret id (``RUN --mount=type=secret,id=pip_ca``).
CA_SECRET_ID = "pip_ca"
#: The build-context folder bind-mounted by the Dockerfile (``source=wheels``).
WHEELS_DIR = "wheels"

LABEL_CREATED = "org.opencontainers.image.created"
LABEL_REVISION = "org.opencontainers.image.revision"
LABEL_RECIPE = "envbuild.recipe"
LABEL_BASE_USED = "envbuild.base.used"
LABEL_BASE_ID = "envbuild.base.image-id"
LABEL_LOCK_SHA = "envbuild.lock.sha256"
LABEL_INPUTS_SHA = "envbuild.inputs.sha256"
#: The base image's ``NVIDIA_REQUIRE_CUDA`` (the built image inherits it: the rendered
#: Dockerfile never sets it): the image's hard driver floor for the NVIDIA runtime.
LABEL_CUDA_REQUIRE = "envbuild.cuda.require"


@dataclass
class BuildResult:
    """Outcome of :func:`build`; ``lock_hash`` is the tag's full sha256 (64 hex); ``reused``: the tag
    existed and was checked again; ``probe_cached``: no container ran (:mod:`.probecache`)."""

    tag: str
    image_id: str
    base_used: str
    base_image_id: str
    lock_hash: str
    probe: dict[str, Any]
    mismatches: list[str]
    base_how: str = "local"
    labels: dict[str, str] = field(default_factory=dict)
    reused: bool = False
    probe_cached: bool = False
    notes: list[str] = field(default_factory=list)


class LockMismatch(EnvbuildError):
    """The built image does not match its lock (exit 2); ``.result`` holds the build."""

    def __init__(self, message: str, *, result: BuildResult, **kw: Any) -> None:
        self.result = result
        self.mismatches = result.mismatches
        super().__init__(message, **kw)


# --------------------------------------------------------------------------- inputs


def read_rendered(recipe_name: str, images_dir: str | os.PathLike) -> tuple[bytes, bytes, Lock, str]:
    """``(dockerfile_bytes, lock_bytes, lock, official_base_ref)`` of ``images_dir/<recipe>``.
    Raises EnvbuildError (exit 2): a file is missing (run ``envbuild render``), the lock is invalid or
    of another recipe, or the Dockerfile does not start with ``ARG BASE_IMAGE=``."""
    from builder.recipe.lock import validate_lock

    folder = image_dir(images_dir, recipe_name).folder
    dockerfile = folder / DOCKERFILE
    lockfile = folder / LOCK_FILE
    for path in (dockerfile, lockfile):
        if not path.is_file():
            raise EnvbuildError(f"missing; run `envbuild render {recipe_name}` first", file=str(path))
    df_bytes = inputs.read_regular(dockerfile, inputs.MAX_RECIPE_BYTES, "Dockerfile")
    lock_bytes = inputs.read_regular(lockfile, inputs.MAX_REPORT_BYTES, "lock file")
    lock = validate_lock(inputs.load_json(lock_bytes, str(lockfile)), str(lockfile))
    if lock.recipe != recipe_name:
        raise EnvbuildError(f"lock is for another recipe than {recipe_name!r}; run `envbuild render "
                            f"{recipe_name}` again", file=str(lockfile), field="recipe", value=lock.recipe)
    return df_bytes, lock_bytes, lock, official_base(df_bytes, str(dockerfile))


def official_base(dockerfile: bytes, origin: str = DOCKERFILE) -> str:
    """The default of the Dockerfile's first instruction, ``ARG BASE_IMAGE=<ref>``.
    Raises EnvbuildError (exit 2): another first instruction, or not an image reference."""
    for line in dockerfile.decode("utf-8", "replace").splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        m = re.fullmatch(r"ARG\s+BASE_IMAGE=(\S+)\s*", text, re.IGNORECASE)
        if m:
            base = m.group(1).strip("\"'")
            if not reference.is_valid(base):
                raise EnvbuildError("is not an image reference", file=origin, field="ARG BASE_IMAGE", value=base)
            return base
        break
    raise EnvbuildError("the first instruction must be ARG BASE_IMAGE=<image>", file=origin, field="ARG BASE_IMAGE")


def image_tag(recipe_name: str, lock_bytes: bytes, dockerfile_bytes: bytes, base_image_id: str) -> tuple[str, str]:
    """``(envbuild/<recipe>:<12 hex>, the 64-hex sha256 of lock + Dockerfile + base image ID)``.
    Raises EnvbuildError (exit 2): the recipe name is no image repository name."""
    if not reference.COMPONENT.fullmatch(recipe_name):
        raise EnvbuildError("not usable in an image name (lowercase letters, digits, '.', '_', '-')",
                            field="recipe", value=recipe_name)
    digest = hashlib.sha256(lock_bytes + dockerfile_bytes + base_image_id.encode()).hexdigest()
    return f"{IMAGE_REPO_PREFIX}{recipe_name}:{digest[:12]}", digest


def git_revision(path: str | os.PathLike) -> str | None:
    """The commit checked out in the git work tree containing ``path``, or None."""
    try:
        out = process.run(["git", "-C", str(path), "rev-parse", "--verify", "--quiet", "HEAD"], 20)
    except Unreachable:
        return None
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", rev) else None


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def stage_context(dockerfile_bytes: bytes, wheel_dir: Path | None, into: Path) -> list[str]:
    """Fill the empty folder ``into`` with the Dockerfile and ``wheels/`` (hard links to, or across
    filesystems copies of, the ``*.whl`` of ``wheel_dir``); the staged wheel names, sorted."""
    write_atomic(into / DOCKERFILE, dockerfile_bytes)
    wheels = into / WHEELS_DIR
    wheels.mkdir()
    staged: list[str] = []
    if wheel_dir is not None:
        for whl in sorted(Path(wheel_dir).glob("*.whl")):
            if whl.is_file():
                _link_or_copy(whl.resolve(), wheels / whl.name)
                staged.append(whl.name)
    return staged


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class BuildOptions:
    """Everything one build needs, resolved once; times in seconds (``None``: the default)."""

    recipe: str
    images_dir: Path
    site: SiteOptions = field(default_factory=SiteOptions)
    base_mode: str = "auto"
    labels: Mapping[str, str] = field(default_factory=dict)
    run_id: str | None = None
    rebuild: bool = False
    pull_timeout_s: float | None = None
    build_timeout_s: float | None = None
    workdir: Path | None = None
    agent_dir: Path = payload.AGENT_DIR
    probe_cache: Path | None = None
    tag: str | None = None  # instead of the inputs hash's (:func:`image_tag`); only with ``rebuild``

    @property
    def folder(self) -> Path:
        """``images_dir/<recipe>`` (:func:`builder.core.paths.image_dir`)."""
        return image_dir(self.images_dir, self.recipe).folder


# --------------------------------------------------------------------------- check


def check_image(client: Engine, image: str, lock: Lock, *,
                agent_dir: str | os.PathLike = payload.AGENT_DIR, labels: Mapping[str, str] | None = None,
                timeout_s: float = 300, cache_dir: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """``(probe document, differences from the lock)`` of ``image`` (probed once per image ID).
    Raises EnvbuildError (exit 3): the probe failed or its document is not ``envbuild.probe/1``."""
    from builder.core.documents import NodeReport
    from builder.core.model import convert

    from .probecheck import PROBE_SCHEMA, compare_probe_to_lock, probe_cached

    probe, _ = probe_cached(client, image, agent_dir, cache_dir=cache_dir, labels=labels, timeout_s=timeout_s)
    if probe.get("schema") != PROBE_SCHEMA:
        raise Unreachable(f"probe document has schema {probe.get('schema')!r}, expected {PROBE_SCHEMA!r}",
                          field="image", value=image)
    report = convert(probe, NodeReport, file=f"probe of {image}", exit_code=ExitCode.UNREACHABLE)
    return probe, compare_probe_to_lock(report, lock)


# --------------------------------------------------------------------------- build


def image_labels_for(options: BuildOptions, client: Engine, official: str, base: tuple[str, str, str],
                     lock_bytes: bytes, inputs_sha: str) -> dict[str, str]:
    """Never ``envbuild=1``/``envbuild.run``: containers inherit image labels, and cleanup by them
    must touch only what envbuild started."""
    from . import bootstrap

    base_ref, base_id, how = base
    labels = {LABEL_RECIPE: options.recipe, LABEL_CREATED: utc_stamp(), LABEL_BASE_USED: base_ref,
              LABEL_BASE_ID: base_id, LABEL_LOCK_SHA: hashlib.sha256(lock_bytes).hexdigest(),
              LABEL_INPUTS_SHA: inputs_sha}
    revision = git_revision(options.folder)
    if revision:
        labels[LABEL_REVISION] = revision
    if how == "bootstrapped":
        labels[bootstrap.LABEL_STANDS_FOR] = client.image(base_ref).labels.get(bootstrap.LABEL_STANDS_FOR, official)
    require = client.image(base_ref).env().get("NVIDIA_REQUIRE_CUDA")
    if require:
        labels[LABEL_CUDA_REQUIRE] = require
    labels.update(options.labels)
    return labels


def _build_in_context(options: BuildOptions, site: SiteOptions, client: Engine, dockerfile: bytes,
                      tag: str, base_ref: str, build_args: Mapping[str, str], labels: Mapping[str, str],
                      progress: ConsoleProgress, cli: BuildkitCLI | None) -> str:
    """Stage a temporary build context (removed afterwards) and build it; the image ID."""

    secrets = {CA_SECRET_ID: str(site.ca_bundle)} if site.ca_bundle else {}
    ctx = Path(tempfile.mkdtemp(prefix="envbuild-ctx-", dir=options.workdir))
    try:
        stage_context(dockerfile, site.wheel_dir, ctx)
        with progress.phase(f"building {tag}"):
            return client.build(ctx, tag, build_args={"BASE_IMAGE": base_ref, **build_args}, labels=labels,
                                      secrets=secrets, on_line=progress.on_line, cli=cli,
                                      origin=str(options.folder / DOCKERFILE), timeout_s=options.build_timeout_s)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)


def _index_plan(client: Engine, dockerfile: bytes, lock: Lock, site: SiteOptions, base_id: str) -> IndexPlan:
    """Which indexes pip asks (:func:`builder.image.indexes.plan`) for a Dockerfile that declares
    ``ARG PIP_EXTRA_INDEX_URL``."""
    from . import indexes

    if indexes.EXTRA_INDEX_ARG not in indexes.declared_args(dockerfile):
        return indexes.IndexPlan()
    img = client.inspect_image(base_id)
    arch = str((img.doc if img else {}).get("Architecture") or "amd64")
    return indexes.plan(lock, dockerfile, site.wheel_dir, arch)


def _make_image(options: BuildOptions, client: Engine, rendered: tuple[bytes, bytes, Lock, str],
                base: tuple[str, str, str], tag: str, digest: str, progress: ConsoleProgress,
                cli: BuildkitCLI | None, notes: list[str]) -> str:
    """Build the image of ``rendered`` on ``base`` under ``tag``; its ID. A failed build whose pip
    asked the torch index names that index."""
    df_bytes, lock_bytes, lock, official = rendered
    site = options.site.complete()
    plan = _index_plan(client, df_bytes, lock, site, base[1])
    if plan.note:
        notes.append(plan.note)
    labels = image_labels_for(options, client, official, base, lock_bytes, digest)
    try:
        return _build_in_context(options, site, client, df_bytes, tag, base[0], plan.build_args, labels, progress, cli)
    except BuildFailed as e:
        if not plan.asks_torch_index:
            raise
        head = f"docker build of {e.tag} failed"
        hint = (f" (pip asked the torch index {plan.asks_torch_index}; where it cannot be reached, put the pinned "
                "torch wheel into the wheel folder: --wheels DIR)")
        message = head + hint + e.message[len(head):] if e.message.startswith(head) else e.message + hint
        raise BuildFailed(message, tag=e.tag, step=e.step, lines=e.lines, file=e.file) from None


def _cached_result(options: BuildOptions, found: reuse.Found, lock: Lock) -> BuildResult | None:
    """The result of a no-change build whose image's kept probe matches the lock, or None."""
    from builder.core.documents import NodeReport
    from builder.core.model import convert

    from .probecheck import compare_probe_to_lock

    probe = probecache.load(options.probe_cache or probecache.default_dir(), found.image_id, options.agent_dir)
    try:
        if probe is None or compare_probe_to_lock(convert(probe, NodeReport), lock):
            return None
    except EnvbuildError:  # a kept probe of another shape: probe again
        return None
    return BuildResult(tag=found.tag, image_id=found.image_id, base_used=found.base[0], base_image_id=found.base[1],
                       lock_hash=found.digest, probe=probe, mismatches=[], base_how=found.base[2],
                       labels=found.labels, reused=True, probe_cached=True)


def _locate(options: BuildOptions, client: Engine, rendered: tuple[bytes, bytes, Lock, str], found: reuse.Found | None,
            progress: ConsoleProgress, warn: Warn | None) -> tuple[tuple[str, str, str], str, str, str | None]:
    """``(base, tag, inputs digest, existing image ID or None)``."""
    if found:
        return found.base, found.tag, found.digest, found.image_id
    from . import bootstrap

    df_bytes, lock_bytes, _lock, official = rendered
    with progress.phase(f"resolving base {official}"):
        base = bootstrap.resolve_base(client, official, options.base_mode, override=options.site.base_override,
                                      pull_timeout_s=options.pull_timeout_s or bootstrap.PULL_TIMEOUT_S,
                                      warn=warn, on_line=progress.on_line)
    tag, digest = image_tag(options.recipe, lock_bytes, df_bytes, base[1])
    return base, options.tag or tag, digest, None if options.rebuild else client.image_id(tag)


def _checked(options: BuildOptions, client: Engine, lock: Lock, made: tuple[tuple[str, str, str], str, str, str],
             reused: bool, notes: list[str], progress: ConsoleProgress) -> BuildResult:
    """Probe the image ``made`` and compare it with the lock. Raises LockMismatch (exit 2)."""
    from . import engine

    base, tag, digest, image_id = made
    with progress.phase(f"probing {tag}"):
        probe, mismatches = check_image(client, tag, lock,
                                        agent_dir=options.agent_dir,
                                        labels={**engine.run_labels(options.run_id or engine.new_run_id()),
                                                **options.labels}, cache_dir=options.probe_cache)
    result = BuildResult(tag=tag, image_id=image_id, base_used=base[0], base_image_id=base[1], lock_hash=digest,
                         probe=probe, mismatches=mismatches, base_how=base[2],
                         labels=client.image(tag).labels, reused=reused, notes=notes)
    if mismatches:
        raise LockMismatch(f"image {tag} does not match the lock ({len(mismatches)} difference"
                           f"{'s' if len(mismatches) != 1 else ''}): {'; '.join(mismatches)}; the image is "
                           f"kept for inspection (docker run --rm -it {tag} bash)", result=result,
                           file=str(options.folder / LOCK_FILE))
    return result


def build(options: BuildOptions, client: Engine | None = None, *, console: Any = None, on_line: OnLine | None = None,
          warn: Warn | None = None, cli: BuildkitCLI | None = None,
          make_console: Callable[[], Any] | None = None) -> BuildResult:
    """Build and check against the lock; ``make_console`` runs only when work is done (rich: ~25 ms).
    Raises EnvbuildError/BuildFailed (exit 2; no tag left behind), LockMismatch (exit 2; the image
    stays tagged), Unreachable (exit 3: engine or base image)."""
    rendered = read_rendered(options.recipe, options.images_dir)
    if warn is None and console is not None:
        warn = console_warn(console)
    from .engine import Engine

    client = client or Engine()
    found = None if options.rebuild else reuse.find(options, rendered[0], rendered[1], rendered[3], client)
    if found and found.warning:
        (warn or stderr_warn)(found.warning)
    cached = _cached_result(options, found, rendered[2]) if found else None
    if cached:
        return cached
    if console is None and make_console is not None:
        console = make_console()
        warn = warn or console_warn(console)
    progress = ConsoleProgress(console, on_line)
    base, tag, digest, image_id = _locate(options, client, rendered, found, progress, warn)
    reused, notes = image_id is not None, list[str]()
    if image_id is None:
        image_id = _make_image(options, client, rendered, base, tag, digest, progress, cli, notes)
    return _checked(options, client, rendered[2], (base, tag, digest, image_id), reused, notes, progress)
