"""The batch script of a certification run and its run folder (see the package doc).

:func:`render_script` renders ``builder/launchers/templates/slurm/certify.sbatch.j2`` from a
plain-data context (:func:`render_context`), every value checked whole first and refused
again in the template if it holds a newline or control character; :func:`write_run_dir`
creates the run folder around it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from builder.agent import payload
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.files import template_environment
from builder.core.inputs import control_char_paths, has_control
from builder.core.paths import image_dir
from builder.image import engine

from ..base import (
    HOME,
    MOUNT_POINT,
    RESULTS_MOUNT,
    LaunchSpec,
    agent_dir,
    labels_for,
    node_env,
    socket_env,
    torchrun_argv,
)
from .options import (
    _ENV_NAME_RE,
    _LABEL_KEY_RE,
    _RUN_ID_RE,
    _SHM_RE,
    SlurmOptions,
    _is_text,
    _usage,
    check_container_image,
    check_slurm_dir,
    check_slurm_nodes,
    time_limit_for,
)

#: File names inside the run folder.
SCRIPT_NAME = "certify.sbatch"
JOB_LOG = "job.log"
RESULTS_DIR = "results"
LOGS_DIR = "logs"
CODE_DIR = "code"
#: Where the in-image code is mounted (read-only); also ``PYTHONPATH``.
CODE_MOUNT = MOUNT_POINT
#: Prefix of the docker containers: ``envbuild-slurm-<jobid>-<node>``.
CONTAINER_PREFIX = "envbuild-slurm"
#: Label naming the Slurm job of a docker container.
SLURM_JOB_LABEL = "envbuild.slurm-job"


def container_name(job_id: str | int, node: int) -> str:
    """Name of node ``node``'s docker container in job ``job_id``: ``envbuild-slurm-<job>-<node>``."""
    return f"{CONTAINER_PREFIX}-{job_id}-{node}"


def default_slurm_dir(images_dir: str | os.PathLike[str], recipe: str) -> Path:
    """Where run folders go by default: ``<images_dir>/<recipe>/certificates`` (next to the
    certificates; each run gets ``slurm-<run>/`` inside)."""
    return image_dir(images_dir, recipe).certificates


def run_dir(slurm_dir: str | os.PathLike[str], run_id: str) -> Path:
    """The run folder of ``run_id``: ``<slurm_dir>/slurm-<run_id>``, absolute."""
    return Path(os.path.abspath(Path(slurm_dir) / f"slurm-{run_id}"))


class Raw(str):
    """A shell word written as is (a variable expansion such as ``"$node"``), not quoted."""


class _Checked(str):
    """Filter output whose every word was checked for control characters (it may hold the
    ``\\``-newline continuations :func:`_words` puts between words)."""


def _refuse_control(value: object, where: str) -> EnvbuildError:
    return _usage("would put a newline or control character into the batch script; refused", where, value)


def sh(value: Any) -> str:
    """One shell word: :class:`Raw` as is, anything else ``shlex.quote``-d.

    Raises:
        EnvbuildError: (exit 64) the value holds a newline or another control character.
    """
    text = str(value)
    if has_control(text):
        raise _refuse_control(text, "script")
    return _Checked(text if isinstance(value, Raw) else shlex.quote(text))


def _words(items: Sequence[Any], indent: int = 8, width: int = 96) -> str:
    """Shell words joined with spaces, wrapped with `` \\`` continuations before ``width``
    columns. An item that is a tuple or list is a group of words (an option and its
    value) that stays on one line. Each word goes through :func:`sh` (checked, quoted)."""
    lines: list[str] = []
    cur = ""
    for item in items:
        group = " ".join(sh(w) for w in item) if isinstance(item, (tuple, list)) else sh(item)
        if cur and len(cur) + 1 + len(group) > width - indent:
            lines.append(cur)
            cur = group
        else:
            cur = f"{cur} {group}" if cur else group
    if cur:
        lines.append(cur)
    return _Checked((" \\\n" + " " * indent).join(lines))


def _finalize(value: Any) -> Any:
    """jinja2 ``finalize``: every value substituted into the script, after its filters;
    the second line of defence behind :func:`render_context`'s checks."""
    if isinstance(value, _Checked):
        return value
    if has_control(str(value)):
        raise _refuse_control(value, "script")
    return value


def _environment() -> jinja2.Environment:
    env = template_environment({"sh": sh, "words": _words}, package="builder.launchers")
    env.finalize = _finalize  # read when the template is compiled (get_template below)
    return env


def render_template(ctx: Mapping[str, Any]) -> str:
    """``builder/launchers/templates/slurm/certify.sbatch.j2`` rendered with ``ctx`` (from
    :func:`render_context`), refusing any value with a newline or control character: first
    by walking ``ctx`` (the error names the field, e.g. ``sbatch[7]``), then in the template
    itself (:func:`_finalize`, :func:`sh`).

    Raises:
        EnvbuildError: (exit 64) such a value, shown escaped.
    """
    for path, value in control_char_paths(dict(ctx)):
        raise _refuse_control(value, path)
    return _environment().get_template("slurm/certify.sbatch.j2").render(dict(ctx))


def task_env(spec: LaunchSpec, options: SlurmOptions) -> dict[str, str]:
    """Environment of every node: :func:`~builder.launchers.base.node_env` without the
    per-node ``ENVBUILD_NODE`` (set from ``SLURM_PROCID``), with the socket variables of
    ``options.socket_ifname`` (else ``spec.socket_ifname``;
    :func:`~builder.launchers.base.socket_env`, unset when neither: host networking, the
    libraries choose), then ``spec.env`` again (which wins).

    Raises:
        EnvbuildError: (exit 64) a name that is not an environment variable name, a value
            with a control character (a newline) or over 4096 characters.
    """
    env = node_env(spec, 0)
    env.pop("ENVBUILD_NODE", None)
    sock = socket_env(options.socket_ifname or spec.socket_ifname)
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.pop(k, None)
        if k in sock:
            env[k] = sock[k]
    env.update(spec.env)
    for name, value in env.items():
        if not (isinstance(name, str) and _ENV_NAME_RE.fullmatch(name)):
            raise _usage("is not an environment variable name", "env", name)
        if not isinstance(value, str) or has_control(value) or len(value) > 4096:
            raise _usage("is not a one-line value of at most 4096 characters", f"env.{name}", value)
    return env


def torchrun_words(spec: LaunchSpec) -> list[Any]:
    """The node command, in groups of words (see :func:`_words`): torchrun (node rank
    ``$node``, master ``$MASTER_ADDR:$MASTER_PORT``) running the bench;
    :func:`~builder.launchers.base.torchrun_argv` with the Slurm values."""
    argv = torchrun_argv(spec, Raw('"$node"'), master_addr=Raw('"$MASTER_ADDR"'), master_port=Raw('"$MASTER_PORT"'))
    groups: list[Any] = []
    i = 0
    while i < len(argv):
        w = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if isinstance(w, str) and w.startswith("-") and nxt is not None and not str(nxt).startswith("-"):
            groups.append((w, nxt))
            i += 2
        else:
            groups.append(w)
            i += 1
    return groups


def _check_spec(spec: LaunchSpec, options: SlurmOptions, folder: str,
                environ: Mapping[str, str] | None) -> tuple[int, str, dict[str, str]]:
    """``(Slurm nodes, the image the nodes run, docker labels)`` of ``spec``, each value
    checked whole.

    Raises:
        EnvbuildError: (exit 64) a run id, folder, node count, port, timeout, Slurm node
            count, image, shm size or label the script cannot carry.
    """
    if not (_is_text(spec.run_id, 64) and _RUN_ID_RE.fullmatch(spec.run_id)):
        raise _usage("is not a run id (1-64 letters, digits, ._-)", "run_id", spec.run_id)
    check_slurm_dir(folder)
    if spec.nodes < 1:
        raise _usage("must be >= 1", "nodes", spec.nodes)
    if spec.gpus_per_node < 0:
        raise _usage("must be >= 0", "gpus_per_node", spec.gpus_per_node)
    if not 1 <= spec.port <= 65535:
        raise _usage("is not a TCP port", "port", spec.port)
    if not spec.timeout_s > 0:
        raise _usage("must be > 0", "timeout_s", spec.timeout_s)
    slurm_nodes = spec.nodes if options.slurm_nodes is None else int(options.slurm_nodes)
    check_slurm_nodes(slurm_nodes, spec.nodes)
    image = options.container_image or (f"docker-daemon:{spec.image}" if options.runtime == "apptainer"
                                        else spec.image)
    check_container_image(image, options.runtime)
    if spec.shm_size is not None and not _SHM_RE.fullmatch(str(spec.shm_size)):
        raise _usage("is not a size (256m, 8g)", "shm_size", spec.shm_size)
    labels = labels_for(spec, environ)
    for k, v in labels.items():
        if not (isinstance(k, str) and _LABEL_KEY_RE.fullmatch(k)) or not isinstance(v, str) \
                or has_control(v) or len(v) > 1000:
            raise _usage("is not a label (KEY=VALUE, one line)", "label", f"{k}={v}")
    return slurm_nodes, image, labels


def _node_command(spec: LaunchSpec, options: SlurmOptions, image: str, labels: Mapping[str, str],
                  env: Mapping[str, str], code_dir: str, results_dir: str) -> list[Any]:
    """What each task runs, in groups of words (:func:`_words`): ``docker run ...``,
    ``apptainer exec ...`` or (pyxis: srun runs it in the container) torchrun itself."""
    if options.runtime == "docker":
        run: list[Any] = [("docker", "run", "--rm"), ("--name", Raw('"$name"'))]
        run += [("--label", f"{k}={v}") for k, v in labels.items()]
        run += [("--label", Raw('"envbuild.node=$node"')), ("--label", Raw(f'"{SLURM_JOB_LABEL}=$SLURM_JOB_ID"')),
                ("--network", "host"), ("--user", options.user), "--read-only",
                ("--tmpfs", "/tmp:rw,exec,mode=1777"), ("--tmpfs", f"{HOME}:rw,mode=1777"),
                ("--tmpfs", f"{RESULTS_MOUNT}:rw,mode=1777"),
                ("--cap-drop", "ALL"), ("--security-opt", "no-new-privileges")]
        if spec.shm_size:
            run.append(("--shm-size", spec.shm_size))
        if spec.gpus_per_node > 0:
            run.append(("--gpus", Raw('"\\"device=${CUDA_VISIBLE_DEVICES:?no GPUs given to this task}\\""')))
        run += [("--volume", f"{code_dir}:{CODE_MOUNT}:ro")]
        run += [("--env", f"{k}={v}") for k, v in env.items()]
        run += [("--env", Raw('"ENVBUILD_NODE=$node"')), ("--env", Raw('"ENVBUILD_SLURM_JOB=$SLURM_JOB_ID"')),
                image, *torchrun_words(spec)]
        return run
    if options.runtime == "apptainer":
        run = [("apptainer", "exec")] + (["--nv"] if spec.gpus_per_node > 0 else [])
        run += ["--contain", "--cleanenv", ("--bind", f"{code_dir}:{CODE_MOUNT}:ro"),
                ("--bind", f"{results_dir}:{RESULTS_MOUNT}"), image, *torchrun_words(spec)]
        return run
    return torchrun_words(spec)


def render_context(spec: LaunchSpec, options: SlurmOptions, folder: str | os.PathLike,
                   environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plain-data context of the template (see :func:`render_script`).

    Raises:
        EnvbuildError: (exit 64) a value the script cannot carry (module doc of
            :func:`render_script`).
    """
    folder = str(folder)
    slurm_nodes, image, labels = _check_spec(spec, options, folder, environ)
    per_node = spec.nodes // slurm_nodes
    code_dir = f"{folder}/{CODE_DIR}"
    results_dir = f"{folder}/{RESULTS_DIR}"
    sbatch = [f"--job-name=envbuild-{spec.run_id}", f"--nodes={slurm_nodes}", f"--ntasks={spec.nodes}"]
    sbatch.append("--ntasks-per-node=1" if per_node == 1 else "--overcommit")
    sbatch += [f"--time={time_limit_for(spec, options)}", f"--output={folder}/{JOB_LOG}",
               f"--chdir={folder}", "--no-requeue"]
    if options.partition:
        sbatch.append(f"--partition={options.partition}")
    if spec.gpus_per_node > 0:
        sbatch.append(f"--gres=gpu:{spec.gpus_per_node * per_node}")
    sbatch += list(options.sbatch_args)

    srun = [f"--nodes={slurm_nodes}", f"--ntasks={spec.nodes}",
            "--ntasks-per-node=1" if per_node == 1 else "--overcommit",
            "--kill-on-bad-exit=1", "--export=ALL", Raw('--output="$ENVBUILD_LOGS/node-%t.log"')]
    if spec.gpus_per_node > 0:
        srun.append(f"--gpus-per-task={spec.gpus_per_node}")
    if options.runtime == "pyxis":
        srun += [f"--container-image={image}",
                 f"--container-mounts={code_dir}:{CODE_MOUNT}:ro,{results_dir}:{RESULTS_MOUNT}",
                 "--no-container-mount-home", "--container-workdir=/tmp"]

    env = task_env(spec, options)
    if options.runtime == "apptainer":
        # apptainer gives each container a private, writable HOME (--contain) and sets USER
        env = {k: v for k, v in env.items() if k not in ("HOME", "USER")}
    run = _node_command(spec, options, image, labels, env, code_dir, results_dir)

    return {
        "run_id": spec.run_id,
        "runtime": options.runtime,
        "image": image,
        "nodes": spec.nodes,
        "nproc": spec.nproc_per_node,
        "backend": spec.backend,
        "slurm_nodes": slurm_nodes,
        "folder": folder,
        "script": f"{folder}/{SCRIPT_NAME}",
        "results_dir": results_dir,
        "logs_dir": f"{folder}/{LOGS_DIR}",
        "code_dir": code_dir,
        "port": spec.port,
        "sbatch": sbatch,
        "srun": srun,
        "env": env,
        "run": run,
        "status_dir": RESULTS_MOUNT if options.runtime == "pyxis" else Raw('"$ENVBUILD_RESULTS"'),
        "run_label": f"{engine.RUN_LABEL}={spec.run_id}",
        "container_prefix": CONTAINER_PREFIX,
    }


def render_script(spec: LaunchSpec, options: SlurmOptions, folder: str | os.PathLike,
                  environ: Mapping[str, str] | None = None) -> str:
    """The batch script of ``spec`` for the run folder ``folder`` (see the module doc).

    The same spec, options, folder and labels give the same bytes (the run id is part of
    the spec). ``environ`` is where ``ENVBUILD_EXTRA_LABELS`` is read (default
    ``os.environ``; docker labels).

    Raises:
        EnvbuildError: (exit 64) ``folder`` not absolute or with characters an ``#SBATCH``
            line or a pyxis mount list cannot carry (blanks, ``%``, ``,``, ``:``, quotes); a
            bad runtime, partition, time limit, sbatch option, ``slurm_nodes`` (must be 1..N
            and divide N), interface name, image reference, environment name, or any value
            with a newline or control character (:func:`render_template`).
    """
    return render_template(render_context(spec, options, folder, environ))


def write_run_dir(folder: str | os.PathLike[str], script: str) -> Path:
    """Create the run folder: ``certify.sbatch`` (mode 0755); ``code/``, a read-only copy of
    the in-image code (:func:`builder.agent.payload.files`, the one payload: the run folder
    is on a filesystem every node sees, envbuild's own installation may not be); ``results/``
    (mode 0700: only the job's user writes there, the nodes' exit statuses; the ranks print
    their results on stdout) and ``logs/``. Returns the script's path.

    Raises:
        EnvbuildError: (exit 3) the folder exists already or cannot be written.
    """
    folder = Path(folder)
    agent_dir()  # the bench and the probe are there
    try:
        folder.mkdir(parents=True, exist_ok=False)
        code = folder / CODE_DIR
        for rel, data in payload.files().items():
            target = code / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        for p in sorted(code.rglob("*"), reverse=True):
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        os.chmod(code, 0o555)
        results = folder / RESULTS_DIR
        results.mkdir(mode=0o700)
        os.chmod(results, 0o700)  # whatever the umask
        (folder / LOGS_DIR).mkdir()
        path = folder / SCRIPT_NAME
        path.write_text(script)
        os.chmod(path, 0o755)
    except FileExistsError:
        raise EnvbuildError("exists already; every run needs its own folder", field="slurm_dir",
                            value=str(folder), exit_code=ExitCode.UNREACHABLE) from None
    except OSError as e:
        raise EnvbuildError(f"cannot write: {e.strerror or e}", field="slurm_dir", value=str(folder),
                            exit_code=ExitCode.UNREACHABLE) from None
    return path
