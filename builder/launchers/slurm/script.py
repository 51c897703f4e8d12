"""The batch script of a certification run (``templates/slurm/certify.sbatch.j2``) and its run folder; every value is
checked whole first and refused again in the template if it holds a control character."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from builder.agent import payload
from builder.core.errors import EnvbuildError, Unreachable, UsageError
from builder.core.files import make_folder, template_environment, write_atomic
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
    return UsageError("would put a newline or control character into the batch script; refused",
                      field=where, value=value)


def sh(value: Any) -> str:
    """One shell word: :class:`Raw` as is, anything else ``shlex.quote``-d. Raises EnvbuildError: (exit 64) the value
    holds a newline or another control character."""
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
    """The sbatch template rendered with ``ctx``, refusing any value with a newline or control
    character (in ``ctx``, then in the template). Raises UsageError (exit 64)."""
    for path, value in control_char_paths(dict(ctx)):
        raise _refuse_control(value, path)
    return _environment().get_template("slurm/certify.sbatch.j2").render(dict(ctx))


def task_env(spec: LaunchSpec, options: SlurmOptions) -> dict[str, str]:
    """Environment of every node: the launch env without ``ENVBUILD_NODE`` (set from ``SLURM_PROCID``), the socket
    variables, then ``spec.env`` again (which wins). Raises EnvbuildError: (exit 64) a name that is not an environment
    variable name, a value with a control character (a newline) or over 4096 characters."""
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
            raise UsageError("is not an environment variable name", field="env", value=name)
        if not isinstance(value, str) or has_control(value) or len(value) > 4096:
            raise UsageError("is not a one-line value of at most 4096 characters", field=f"env.{name}", value=value)
    return env


def torchrun_words(spec: LaunchSpec, out: Any = RESULTS_MOUNT) -> list[Any]:
    """The node command, in groups of words (see :func:`_words`): torchrun (node rank
    ``$node``, master ``$MASTER_ADDR:$MASTER_PORT``) running the bench;
    :func:`~builder.launchers.base.torchrun_argv` with the Slurm values."""
    argv = torchrun_argv(spec, Raw('"$node"'), master_addr=Raw('"$MASTER_ADDR"'), master_port=Raw('"$MASTER_PORT"'),
                         out=out)
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
    """``(Slurm nodes, the image the nodes run, docker labels)`` of ``spec``, each value checked whole. Raises
    EnvbuildError: (exit 64) a run id, folder, node count, port, timeout, Slurm node count, image, shm size or label
    the script cannot carry."""
    if not (_is_text(spec.run_id, 64) and _RUN_ID_RE.fullmatch(spec.run_id)):
        raise UsageError("is not a run id (1-64 letters, digits, ._-)", field="run_id", value=spec.run_id)
    check_slurm_dir(folder)
    if spec.nodes < 1:
        raise UsageError("must be >= 1", field="nodes", value=spec.nodes)
    if spec.gpus_per_node < 0:
        raise UsageError("must be >= 0", field="gpus_per_node", value=spec.gpus_per_node)
    if not 1 <= spec.port <= 65535:
        raise UsageError("is not a TCP port", field="port", value=spec.port)
    if not spec.timeout_s > 0:
        raise UsageError("must be > 0", field="timeout_s", value=spec.timeout_s)
    slurm_nodes = spec.nodes if options.slurm_nodes is None else int(options.slurm_nodes)
    check_slurm_nodes(slurm_nodes, spec.nodes)
    image = options.container_image or (f"docker-daemon:{spec.image}" if options.runtime == "apptainer" else spec.image)
    check_container_image(image, options.runtime)
    if spec.shm_size is not None and not _SHM_RE.fullmatch(str(spec.shm_size)):
        raise UsageError("is not a size (256m, 8g)", field="shm_size", value=spec.shm_size)
    labels = labels_for(spec, environ)
    for k, v in labels.items():
        if not (isinstance(k, str) and _LABEL_KEY_RE.fullmatch(k)) or not isinstance(v, str) \
                or has_control(v) or len(v) > 1000:
            raise UsageError("is not a label (KEY=VALUE, one line)", field="label", value=f"{k}={v}")
    return slurm_nodes, image, labels


def _node_command(spec: LaunchSpec, options: SlurmOptions, image: str, labels: Mapping[str, str],
                  env: Mapping[str, str], code_dir: str, results_dir: str) -> list[Any]:
    """What each task runs, in groups of words (:func:`_words`): ``docker run ...``, ``apptainer exec ...`` or torchrun
    itself (pyxis: srun runs it in the container; none: on the node, results straight into the run folder)."""
    if options.runtime == "docker":
        run: list[Any] = [("docker", "run", "--rm"), ("--name", Raw('"$name"'))]
        run += [("--label", f"{k}={v}") for k, v in labels.items()]
        run += [("--label", Raw('"envbuild.node=$node"')), ("--label", Raw(f'"{SLURM_JOB_LABEL}=$SLURM_JOB_ID"')),
                ("--network", "host"), ("--user", options.user), "--read-only", ("--tmpfs", "/tmp:rw,exec,mode=1777"),
                ("--tmpfs", f"{HOME}:rw,mode=1777"), ("--tmpfs", f"{RESULTS_MOUNT}:rw,mode=1777"),
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
    return torchrun_words(spec, Raw('"$ENVBUILD_RESULTS"') if options.runtime == "none" else RESULTS_MOUNT)


def render_context(spec: LaunchSpec, options: SlurmOptions, folder: str | os.PathLike,
                   environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plain-data context of the template (see :func:`render_script`).
    Raises EnvbuildError: (exit 64) a value the script cannot carry."""
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
    if options.runtime in ("apptainer", "none"):
        # apptainer gives each container a private, writable HOME (--contain) and sets USER; on
        # the node itself the job's user has both; no image is in use there (the probe says so)
        env = {k: v for k, v in env.items() if k not in ("HOME", "USER")}
    if options.runtime == "none":
        env = {k: v for k, v in env.items() if k != "ENVBUILD_IMAGE"}
        env["PYTHONPATH"] = code_dir
    run = _node_command(spec, options, image, labels, env, code_dir, results_dir)

    return {"run_id": spec.run_id, "runtime": options.runtime, "image": image, "nodes": spec.nodes,
            "nproc": spec.nproc_per_node, "backend": spec.backend, "slurm_nodes": slurm_nodes, "folder": folder,
            "script": f"{folder}/{SCRIPT_NAME}", "results_dir": results_dir, "logs_dir": f"{folder}/{LOGS_DIR}",
            "code_dir": code_dir, "port": spec.port, "sbatch": sbatch, "srun": srun, "env": env, "run": run,
            "status_dir": RESULTS_MOUNT if options.runtime == "pyxis" else Raw('"$ENVBUILD_RESULTS"'),
            "run_label": f"{engine.RUN_LABEL}={spec.run_id}", "container_prefix": CONTAINER_PREFIX}


def render_script(spec: LaunchSpec, options: SlurmOptions, folder: str | os.PathLike,
                  environ: Mapping[str, str] | None = None) -> str:
    """The batch script of ``spec`` for the run folder ``folder``; deterministic.
    Raises EnvbuildError: (exit 64) ``folder`` not absolute or with characters an ``#SBATCH`` line or a pyxis mount
    list cannot carry; a bad option, or any value with a control character (:func:`render_template`)."""
    return render_template(render_context(spec, options, folder, environ))


def write_run_dir(folder: str | os.PathLike[str], script: str) -> Path:
    """Create the run folder: ``certify.sbatch``, ``code/`` (a read-only payload copy, as every node
    sees the folder but maybe not envbuild's installation), ``results/`` (0700) and ``logs/``.
    Returns the script's path. Raises EnvbuildError (exit 3): the folder exists or is unwritable."""
    folder = Path(folder)
    agent_dir()  # the bench and the probe are there
    try:
        make_folder(folder.parent)
        folder.mkdir(exist_ok=False)
        code = folder / CODE_DIR
        for rel, data in payload.files().items():
            write_atomic(code / rel, data)
        for p in sorted(code.rglob("*"), reverse=True):
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        os.chmod(code, 0o555)
        results = folder / RESULTS_DIR
        results.mkdir(mode=0o700)
        os.chmod(results, 0o700)  # whatever the umask
        (folder / LOGS_DIR).mkdir()
        path = write_atomic(folder / SCRIPT_NAME, script.encode("utf-8"), 0o755)
    except FileExistsError:
        raise Unreachable("exists already; every run needs its own folder", field="slurm_dir",
                          value=str(folder)) from None
    except OSError as e:
        raise Unreachable(f"cannot write: {e.strerror or e}", field="slurm_dir", value=str(folder)) from None
    return path
