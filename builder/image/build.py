"""Build a rendered recipe into an image and check the image against its lock.

Input: the renderer's output ``images/<recipe>/Dockerfile`` and
``images/<recipe>/envbuild.lock.json`` (this module never imports the renderer).
Contract of the rendered Dockerfile:

* its first instruction is ``ARG BASE_IMAGE=<official base>``; the build passes
  ``--build-arg BASE_IMAGE=<resolved base>`` (see :func:`builder.image.bootstrap.resolve_base`);
* ``RUN --mount=type=secret,id=pip_ca`` reads the site's CA bundle, when there is one, at
  ``/run/secrets/pip_ca`` (absent otherwise);
* ``RUN --mount=type=bind,source=wheels,target=/run/envbuild/wheels`` sees the site's
  wheels: the build context holds a ``wheels/`` folder with the ``*.whl`` files of the
  site wheel folder (empty without one);
* optionally ``ARG PIP_EXTRA_INDEX_URL=<torch index>`` (and ``ARG PIP_NO_INDEX=``): the
  build empties it when the wheel folder makes that index unneeded (:mod:`builder.image.indexes`).

Neither the CA bundle nor the wheels end up in the image. The image is tagged
``envbuild/<recipe>:<first 12 hex of sha256(lock bytes + Dockerfile bytes + base image
ID)>`` and labelled (OCI ``org.opencontainers.image.created``/``revision``, the base used).
Afterwards the probe runs in the image and its findings are compared with the lock
(:func:`builder.image.probecheck.compare_probe_to_lock`).

Every option of a build is resolved once into a :class:`BuildOptions` (as cibuildwheel
resolves its ``BuildOptions``); :func:`build` takes it, the engine, and how to report
progress. The lock is read as JSON with the fields the build needs checked
(:func:`read_rendered`); a Dockerfile with the index build arguments has its lock checked
whole (:func:`builder.recipe.lock.validate_lock`). A no-change build is decided without the
docker SDK (:mod:`builder.image.reuse`, :mod:`builder.image.probecache`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.agent import payload
from builder.core import inputs
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.paths import DOCKERFILE, LOCK_FILE, image_dir
from builder.oci import reference

from . import probecache, reuse
from .buildkit import BuildFailed, BuildkitCLI
from .progress import ConsoleProgress, console_warn, stderr_warn
from .site import SiteOptions

if TYPE_CHECKING:  # the docker SDK (~0.25 s to import) only where an engine call needs it
    import docker

    from .bootstrap import Warn
    from .engine import OnLine
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

_REQUIRED_LOCK = ("recipe", "python", "torch", "cuda", "nccl", "os")


@dataclass
class BuildResult:
    """Outcome of :func:`build`.

    Attributes:
        tag: ``"envbuild/<recipe>:<12 hex>"``.
        image_id: ``"sha256:<64 hex>"``.
        base_used: the base image ref built FROM (official, pulled, bootstrapped stand-in
            or explicit).
        base_image_id: that base's image ID.
        lock_hash: 64 hex, sha256(lock bytes + Dockerfile bytes + base image ID); the tag
            is its first 12.
        probe: the probe's document from inside the image.
        mismatches: lock/probe differences (``[]`` in a returned result: differences
            raise :class:`LockMismatch`).
        base_how: ``"local"``, ``"pulled"``, ``"bootstrapped"`` or ``"explicit"``.
        labels: the image's labels.
        reused: True when an image with this tag already existed and was checked again
            instead of rebuilt.
        probe_cached: True when ``probe`` is the recorded result of an earlier probe of this
            very image ID with this lock (:mod:`builder.image.probecache`): no container ran.
        notes: one-line remarks for the user: which indexes pip asked (:mod:`builder.image.indexes`).
    """

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


def read_rendered(recipe_name: str, images_dir: str | os.PathLike) -> tuple[bytes, bytes, dict[str, Any], str]:
    """Read ``images_dir/<recipe>/{Dockerfile,envbuild.lock.json}``.

    Returns:
        ``(dockerfile_bytes, lock_bytes, lock_dict, official_base_ref)``.

    Raises:
        EnvbuildError: (exit 2) a file is missing (run ``envbuild render``), the lock is
            not (bounded, :func:`builder.core.inputs.load_json`) a JSON object with
            ``recipe``, ``python``, ``torch.local``, ``cuda``, ``nccl``, ``os``, or the
            Dockerfile does not start with ``ARG BASE_IMAGE=``.
    """
    folder = image_dir(images_dir, recipe_name).folder
    dockerfile = folder / DOCKERFILE
    lockfile = folder / LOCK_FILE
    for path in (dockerfile, lockfile):
        if not path.is_file():
            raise EnvbuildError(
                f"missing; run `envbuild render {recipe_name}` first", file=str(path)
            )
    df_bytes = inputs.read_regular(dockerfile, inputs.MAX_RECIPE_BYTES, "Dockerfile")
    lock_bytes = inputs.read_regular(lockfile, inputs.MAX_REPORT_BYTES, "lock file")
    lock = inputs.load_json(lock_bytes, str(lockfile))
    if not isinstance(lock, dict):
        raise EnvbuildError("not a JSON object", file=str(lockfile))
    for key in _REQUIRED_LOCK:
        if key not in lock:
            raise EnvbuildError("missing", file=str(lockfile), field=key)
    if not isinstance(lock["torch"], dict) or not lock["torch"].get("local"):
        raise EnvbuildError("missing", file=str(lockfile), field="torch.local")
    if not isinstance(lock["os"], dict):
        raise EnvbuildError("not an object", file=str(lockfile), field="os")
    if lock["recipe"] != recipe_name:
        raise EnvbuildError(
            f"lock is for another recipe than {recipe_name!r}; run `envbuild render "
            f"{recipe_name}` again",
            file=str(lockfile),
            field="recipe",
            value=lock["recipe"],
        )
    return df_bytes, lock_bytes, lock, official_base(df_bytes, str(dockerfile))


def official_base(dockerfile: bytes, origin: str = DOCKERFILE) -> str:
    """The default of the first instruction ``ARG BASE_IMAGE=<ref>`` of a Dockerfile.

    Comment lines (including parser directives) and blank lines before it are skipped.

    Raises:
        EnvbuildError: (exit 2) the first instruction is something else, or its default is
            not an image reference (:mod:`builder.oci.reference`).
    """
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
    raise EnvbuildError(
        "the first instruction must be ARG BASE_IMAGE=<image>", file=origin, field="ARG BASE_IMAGE"
    )


def image_tag(recipe_name: str, lock_bytes: bytes, dockerfile_bytes: bytes, base_image_id: str) -> tuple[str, str]:
    """``(tag, full_hash)``: ``envbuild/<recipe>:<12 hex>`` and the 64-hex sha256 of
    lock bytes + Dockerfile bytes + base image ID (UTF-8).

    Raises:
        EnvbuildError: (exit 2) the recipe name is not a valid image repository name.
    """
    if not reference.COMPONENT.fullmatch(recipe_name):
        raise EnvbuildError(
            "not usable in an image name (lowercase letters, digits, '.', '_', '-')",
            field="recipe",
            value=recipe_name,
        )
    digest = hashlib.sha256(lock_bytes + dockerfile_bytes + base_image_id.encode()).hexdigest()
    return f"{IMAGE_REPO_PREFIX}{recipe_name}:{digest[:12]}", digest


def git_revision(path: str | os.PathLike) -> str | None:
    """The commit checked out in the git work tree containing ``path``, or None."""
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--verify", "--quiet", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
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
    """Fill the (empty) folder ``into`` with ``Dockerfile`` and ``wheels/``.

    ``wheels/`` gets hard links to (or, across filesystems, copies of) the regular
    ``*.whl`` files of ``wheel_dir``, nothing else; it is empty without ``wheel_dir``.

    Returns:
        The staged wheel file names, sorted.
    """
    (into / DOCKERFILE).write_bytes(dockerfile_bytes)
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
    """Everything one build needs, resolved once (see :func:`build`).

    Attributes:
        recipe: folder name under ``images_dir`` and the lock's ``recipe``.
        images_dir: the renderer's output root (``images/``).
        site: CA bundle, wheel folder and base override (:class:`SiteOptions`).
        base_mode: ``"auto"``, ``"local"``, ``"pull"`` or ``"bootstrap"`` (see
            :func:`builder.image.bootstrap.resolve_base`).
        labels: extra labels for the image and the probe container.
        run_id: value of ``envbuild.run`` on the probe container (default: a new id).
        rebuild: build even when the tag exists.
        pull_timeout_s: seconds allowed for pulling the base in ``auto`` mode (default
            :data:`builder.image.bootstrap.PULL_TIMEOUT_S`).
        build_timeout_s: seconds allowed for the build (default: no limit).
        workdir: where to create the temporary build context (default ``$TMPDIR``;
            on the wheel folder's filesystem, wheels are hard-linked instead of copied).
        agent_dir: the agent folder whose ``probe`` runs in the image (default
            ``builder/agent``, :data:`builder.agent.payload.AGENT_DIR`).
        probe_cache: where probe matches are recorded by image ID (default
            :func:`builder.image.probecache.default_dir`); None: the default.
    """

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

    @property
    def folder(self) -> Path:
        """``images_dir/<recipe>`` (:func:`builder.core.paths.image_dir`)."""
        return image_dir(self.images_dir, self.recipe).folder


# --------------------------------------------------------------------------- check


def check_image(
    client: docker.DockerClient,
    image: str,
    lock: Mapping[str, Any],
    *,
    agent_dir: str | os.PathLike = payload.AGENT_DIR,
    labels: Mapping[str, str] | None = None,
    timeout_s: float = 300,
) -> tuple[dict[str, Any], list[str]]:
    """Probe ``image`` and compare its environment with ``lock``.

    Runs the probe of ``agent_dir`` in a throwaway container
    (:func:`builder.image.probecheck.run_probe`); the image's labels play no part.

    Returns:
        ``(probe_document, mismatches)``; see
        :func:`builder.image.probecheck.compare_probe_to_lock`.

    Raises:
        EnvbuildError: (exit 3) the probe failed or its document is not
            ``envbuild.probe/1``; see :func:`builder.image.probecheck.run_probe`.
    """
    from .probecheck import PROBE_SCHEMA, compare_probe_to_lock, run_probe

    probe = run_probe(client, image, agent_dir, labels=labels, timeout_s=timeout_s)
    if probe.get("schema") != PROBE_SCHEMA:
        raise EnvbuildError(
            f"probe document has schema {probe.get('schema')!r}, expected {PROBE_SCHEMA!r}",
            field="image",
            value=image,
            exit_code=ExitCode.UNREACHABLE,
        )
    return probe, compare_probe_to_lock(dict(probe), dict(lock))


# --------------------------------------------------------------------------- build


def image_labels_for(options: BuildOptions, client: docker.DockerClient, official: str, base: tuple[str, str, str],
                     lock_bytes: bytes, inputs_sha: str) -> dict[str, str]:
    """The image's labels: recipe, creation time (UTC), the base used and its ID, the
    lock's and the inputs' sha256, the git revision of the rendered files (if any), what a
    bootstrapped base stands for, the base config's ``NVIDIA_REQUIRE_CUDA`` (the built
    image's CUDA requirement, :data:`LABEL_CUDA_REQUIRE`; next to the torch variant's CUDA
    in ``envbuild.cuda`` from the Dockerfile), plus ``options.labels``. No ``envbuild=1`` /
    ``envbuild.run``: containers inherit image labels, and cleanup by those labels must
    only ever touch what envbuild itself started."""
    from . import bootstrap, engine

    base_ref, base_id, how = base
    labels = {
        LABEL_RECIPE: options.recipe,
        LABEL_CREATED: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        LABEL_BASE_USED: base_ref,
        LABEL_BASE_ID: base_id,
        LABEL_LOCK_SHA: hashlib.sha256(lock_bytes).hexdigest(),
        LABEL_INPUTS_SHA: inputs_sha,
    }
    revision = git_revision(options.folder)
    if revision:
        labels[LABEL_REVISION] = revision
    if how == "bootstrapped":
        labels[bootstrap.LABEL_STANDS_FOR] = engine.image_labels(client, base_ref).get(bootstrap.LABEL_STANDS_FOR,
                                                                                       official)
    require = engine.image_env(client, base_ref).get("NVIDIA_REQUIRE_CUDA")
    if require:
        labels[LABEL_CUDA_REQUIRE] = require
    labels.update(options.labels)
    return labels


def _existing_image(client: docker.DockerClient, tag: str) -> str | None:
    import docker.errors

    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def _build_in_context(options: BuildOptions, site: SiteOptions, client: docker.DockerClient, dockerfile: bytes,
                      tag: str, base_ref: str, build_args: Mapping[str, str], labels: Mapping[str, str],
                      progress: ConsoleProgress, cli: BuildkitCLI | None) -> str:
    """Stage a temporary build context (removed afterwards) and build it; the image ID."""
    from . import engine

    secrets = {CA_SECRET_ID: str(site.ca_bundle)} if site.ca_bundle else {}
    ctx = Path(tempfile.mkdtemp(prefix="envbuild-ctx-", dir=options.workdir))
    try:
        stage_context(dockerfile, site.wheel_dir, ctx)
        with progress.phase(f"building {tag}"):
            return engine.build_image(ctx, tag, build_args={"BASE_IMAGE": base_ref, **build_args}, labels=labels,
                                      secrets=secrets, on_line=progress.on_line, client=client, cli=cli,
                                      origin=str(options.folder / DOCKERFILE), timeout_s=options.build_timeout_s)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)


def _index_plan(client: docker.DockerClient, dockerfile: bytes, lock: Mapping[str, Any], site: SiteOptions,
                base_id: str, origin: str) -> IndexPlan:
    """Which indexes pip asks (:func:`builder.image.indexes.plan`) for a Dockerfile that declares
    ``ARG PIP_EXTRA_INDEX_URL`` (the lock is then checked whole: :func:`builder.recipe.lock.validate_lock`)."""
    from builder.recipe.lock import validate_lock

    from . import indexes

    if indexes.EXTRA_INDEX_ARG not in indexes.declared_args(dockerfile):
        return indexes.IndexPlan()
    arch = str(client.images.get(base_id).attrs.get("Architecture") or "amd64")
    return indexes.plan(validate_lock(dict(lock), origin), dockerfile, site.wheel_dir, arch)


def _make_image(options: BuildOptions, client: docker.DockerClient, rendered: tuple[bytes, bytes, dict[str, Any], str],
                base: tuple[str, str, str], tag: str, digest: str, progress: ConsoleProgress,
                cli: BuildkitCLI | None, notes: list[str]) -> str:
    """Build the image of ``rendered`` on ``base`` under ``tag``: pip's configuration is read now
    (:meth:`SiteOptions.complete`), the indexes planned, the labels made; the image ID.
    A failed build whose pip asked the torch index names that index in its message."""
    df_bytes, lock_bytes, lock, official = rendered
    site = options.site.complete()
    plan = _index_plan(client, df_bytes, lock, site, base[1], str(options.folder / LOCK_FILE))
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


def _cached_result(options: BuildOptions, found: reuse.Found, lock_bytes: bytes) -> BuildResult | None:
    """The result of a no-change build whose image's probe matched this lock before
    (:mod:`builder.image.probecache`, keyed by the image ID), or None."""
    cache = options.probe_cache or probecache.default_dir()
    probe = probecache.load(cache, found.image_id, lock_bytes, options.agent_dir)
    if probe is None:
        return None
    return BuildResult(tag=found.tag, image_id=found.image_id, base_used=found.base[0], base_image_id=found.base[1],
                       lock_hash=found.digest, probe=probe, mismatches=[], base_how=found.base[2],
                       labels=found.labels, reused=True, probe_cached=True)


def _locate(options: BuildOptions, client: docker.DockerClient, rendered: tuple[bytes, bytes, dict[str, Any], str],
            found: reuse.Found | None, progress: ConsoleProgress,
            warn: Warn | None) -> tuple[tuple[str, str, str], str, str, str | None]:
    """``(base, tag, inputs digest, existing image ID or None)``: from ``found`` (a no-change
    build whose probe is not recorded), else by resolving the base
    (:func:`builder.image.bootstrap.resolve_base`) and looking the tag up."""
    if found:
        return found.base, found.tag, found.digest, found.image_id
    from . import bootstrap

    df_bytes, lock_bytes, _lock, official = rendered
    with progress.phase(f"resolving base {official}"):
        base = bootstrap.resolve_base(client, official, options.base_mode, override=options.site.base_override,
                                      pull_timeout_s=options.pull_timeout_s or bootstrap.PULL_TIMEOUT_S,
                                      warn=warn, on_line=progress.on_line)
    tag, digest = image_tag(options.recipe, lock_bytes, df_bytes, base[1])
    return base, tag, digest, None if options.rebuild else _existing_image(client, tag)


def _checked(options: BuildOptions, client: docker.DockerClient, lock: Mapping[str, Any], lock_bytes: bytes,
             made: tuple[tuple[str, str, str], str, str, str], reused: bool, notes: list[str],
             progress: ConsoleProgress) -> BuildResult:
    """Probe the image ``made`` = ``(base, tag, digest, image ID)`` and compare it with the lock;
    a match is recorded by image ID (:mod:`builder.image.probecache`). Raises
    :class:`LockMismatch` (exit 2) on any difference."""
    from . import engine

    base, tag, digest, image_id = made
    with progress.phase(f"probing {tag}"):
        probe, mismatches = check_image(client, tag, lock, agent_dir=options.agent_dir,
                                        labels={**engine.run_labels(options.run_id or engine.new_run_id()),
                                                **options.labels})
    result = BuildResult(tag=tag, image_id=image_id, base_used=base[0], base_image_id=base[1], lock_hash=digest,
                         probe=probe, mismatches=mismatches, base_how=base[2],
                         labels=engine.image_labels(client, tag), reused=reused, notes=notes)
    if mismatches:
        raise LockMismatch(
            f"image {tag} does not match the lock ({len(mismatches)} difference"
            f"{'s' if len(mismatches) != 1 else ''}): {'; '.join(mismatches)}; the image is "
            f"kept for inspection (docker run --rm -it {tag} bash)",
            result=result,
            file=str(options.folder / LOCK_FILE),
        )
    probecache.store(options.probe_cache or probecache.default_dir(), image_id, lock_bytes, options.agent_dir, probe)
    return result


def build(
    options: BuildOptions,
    client: docker.DockerClient | None = None,
    *,
    console: Any = None,
    on_line: OnLine | None = None,
    warn: Warn | None = None,
    cli: BuildkitCLI | None = None,
    make_console: Callable[[], Any] | None = None,
) -> BuildResult:
    """Build ``options.images_dir/<options.recipe>`` and check the image against its lock.

    1. Read the rendered files (:func:`read_rendered`).
    2. Unless ``options.rebuild``, decide a no-change build from image IDs and the inputs'
       hash alone (:func:`builder.image.reuse.find`: no docker SDK, container, pull or pip
       configuration): the image of these inputs on an already-local base whose probe matched
       this lock before (:mod:`builder.image.probecache`, by image ID) is returned as it is.
    3. Else resolve the base (:func:`builder.image.bootstrap.resolve_base`) and compute the tag
       (:func:`image_tag`); unless the tag exists (and not ``options.rebuild``), build
       (:func:`_make_image`: pip's configuration read where pending, the indexes planned by
       :mod:`builder.image.indexes`, a staged context, ``--build-arg BASE_IMAGE=<base>``, the
       ``pip_ca`` secret, the labels of :func:`image_labels_for`).
    4. Probe the image (:func:`check_image`) and record a match by image ID.

    Args:
        options: the resolved :class:`BuildOptions`.
        client: the engine (default: :func:`builder.image.engine.connect` when needed).
        console: a ``rich.console.Console`` for a live status line and warnings, or None.
        on_line: build/debootstrap output lines (in addition to ``console``).
        warn: warnings (a bootstrapped base stands in); default ``console``, else stderr.
        cli: BuildKit client (default :func:`builder.image.buildkit.buildkit_cli`).
        make_console: makes ``console`` when it is None and a build, a base resolution or a
            probe runs (a rich console costs ~25 ms to import; a no-change build prints only
            through ``warn``).

    Returns:
        :class:`BuildResult` with ``mismatches == []``.

    Raises:
        EnvbuildError: (exit 2) rendered files missing or invalid; the build failed
            (:class:`builder.image.buildkit.BuildFailed`, no tag left behind).
        LockMismatch: (exit 2) the image differs from the lock; every difference is
            listed, and the image stays tagged for inspection.
        Unreachable: (exit 3) engine or base image unreachable.
    """
    rendered = read_rendered(options.recipe, options.images_dir)
    if warn is None and console is not None:
        warn = console_warn(console)
    found = None if options.rebuild else reuse.find(options, rendered[0], rendered[1], rendered[3])
    if found and found.warning:
        (warn or stderr_warn)(found.warning)
    cached = _cached_result(options, found, rendered[1]) if found else None
    if cached:
        return cached
    from . import engine

    client = client or engine.connect()
    if console is None and make_console is not None:
        console = make_console()
        warn = warn or console_warn(console)
    progress = ConsoleProgress(console, on_line)
    base, tag, digest, image_id = _locate(options, client, rendered, found, progress, warn)
    reused, notes = image_id is not None, list[str]()
    if image_id is None:
        image_id = _make_image(options, client, rendered, base, tag, digest, progress, cli, notes)
    return _checked(options, client, rendered[2], rendered[1], (base, tag, digest, image_id), reused, notes, progress)
