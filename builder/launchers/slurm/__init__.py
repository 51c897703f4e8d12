"""Slurm launcher: run a certification as one batch job through the cluster's own scheduler.

Modules: :mod:`.options` (every value a batch script carries, checked whole),
:mod:`.script` (the batch script and the run folder), :mod:`.job` (Slurm's commands and
their answers: ``squeue --json``, else ``scontrol``/``sacct`` text), :mod:`.nodelogs` (the
node logs read as they grow), :mod:`.launcher` (:class:`SlurmLauncher`).

For a :class:`~builder.launchers.base.LaunchSpec` of N nodes with G GPUs each (P = max(G, 1)
processes per node), :meth:`SlurmLauncher.run`:

1. makes a run folder ``<slurm dir>/slurm-<run>/`` (by default next to the certificate,
   ``images/<recipe>/certificates/slurm-<run>/``; it must be on a filesystem every node
   sees) holding

   - ``certify.sbatch``: the batch script (:func:`~.script.render_script`, template
     ``builder/launchers/templates/slurm/certify.sbatch.j2``, deterministic), kept so that a user
     can read it and run it again by hand (``sbatch certify.sbatch``);
   - ``code/``: a copy of envbuild's in-image code (the one payload,
     :func:`builder.agent.payload.files`: ``bench/``, ``probe/``...), mounted read-only at
     ``/opt/envbuild`` (``PYTHONPATH``): the image is never changed;
   - ``results/`` (mode 0700, the job's user only: nothing there is writable by another
     user or by the docker nodes' UID): ``node-<i>.exit`` (torchrun's exit status, or
     ``SIGTERM``/``SIGINT``, written by the batch script) and, once the job ended, the
     accepted ``rank-<r>.json`` (the record of the run);
   - ``logs/node-<i>.log`` (each task's output: the ranks print their progress and, at the
     end, their result documents there, ``--result-to-stdout``) and ``job.log`` (the batch
     script's);

2. submits it with ``sbatch --parsable`` and polls the job every ``poll_s`` seconds
   (:func:`~.job.job_info`: ``squeue --json``, else ``scontrol show job -o``; a job purged
   from the controller's memory (``MinJobAge``) is looked up with ``sacct``, which needs
   accounting storage; without it the state is ``UNKNOWN``); at each poll it reads what the
   node logs gained (:class:`~.nodelogs.NodeLogs`: the ranks' progress, with its arrival
   time, for the hang naming of :mod:`builder.launchers.progress`);
3. gives up (``scancel``) when the job is still pending after ``pending_timeout_s``, or
   after :data:`~.launcher.NEVER_STARTS_AFTER_S` when it is pending for a reason waiting cannot resolve
   (:func:`~.job.never_starts`: ``PartitionNodeLimit``, ``InvalidAccount``...), or still running
   :data:`~.launcher.END_MARGIN_S`
   seconds after its time limit (Slurm's ``KillWait``, 30 s by default, plus slack);
   meanwhile it reports progress at most every :data:`~.launcher.PROGRESS_S` seconds;
4. reads the rest of the node logs and the exit statuses, checks every result printed
   against the run (:func:`builder.launchers.output.check_result`: schema, rank, the node
   hosting it, run id, world size, the model) and returns them as a :class:`LaunchResult`
   with the ranks' progress when the job ended (or envbuild gave up on it) and the job's
   final state in ``notes``: a job that
   ended other than ``COMPLETED`` gives ``"Slurm job 42 FAILED (NonZeroExitCode), exit
   code 1:0; job.log: ...last lines..."``;
5. ALWAYS (``finally``, also on Ctrl-C, with SIGINT/SIGTERM deferred meanwhile) cancels a
   job that is still queued or running (``scancel``), waits up to :data:`~.launcher.CANCEL_WAIT_S`
   for it to end, and removes every container labelled ``envbuild.run=<run>`` on the
   local Docker engine; with the docker runtime and nodes other than this host it also
   runs a one-task-per-node ``srun`` step doing the same there.

The job (see the template; sources: Slurm's ``sbatch``, ``srun`` and ``scontrol`` man pages,
https://slurm.schedmd.com/sbatch.html, https://slurm.schedmd.com/srun.html):

- **one Slurm task per envbuild node**, each running torchrun with ``--nproc-per-node P``
  and ``--node-rank $SLURM_PROCID`` (static rendezvous, as the local and Kubernetes
  launchers), rather than one process per task with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
  from ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``: the bench, the result files and
  torchrun's per-rank failure summary stay the same everywhere, and the G ranks of a node
  share one container (NCCL's intra-node transports need a shared ``/dev/shm`` and IPC);
- ``#SBATCH --nodes=M --ntasks=N``: by default M = N with ``--ntasks-per-node=1`` (one
  envbuild node per machine); with ``slurm_nodes`` M < N the N tasks share M machines and
  the job asks ``--overcommit`` (one CPU per machine is allocated; the containers are not
  bound by the allocation anyway): this is how a one-node test cluster runs 2 nodes;
- GPUs: ``#SBATCH --gres=gpu:<G x tasks per machine>`` and ``srun --gpus-per-task=G``;
- master address: ``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1``, port the
  recipe's (``--port``); ``#SBATCH --time`` the time limit (default: the timeout rounded up
  to whole minutes, at least 1: Slurm's granularity), ``--no-requeue``;
- ``srun --kill-on-bad-exit=1``: a node that fails ends the step at once (so
  ``killed_after_s`` is 0 for the others).

Container runtimes (``runtime``; default ``docker``, because the image envbuild certifies is
one in the local Docker engine and docker needs no further option):

``docker``
    each task runs ``docker run --rm --network host`` (host networking, the norm for
    multi-node NCCL; each run needs its own port on a shared machine) as user
    ``12345:12345`` with a read-only root filesystem, tmpfs ``/tmp``, ``HOME`` and ``/results``
    (nothing on the host is writable by that UID), all
    capabilities dropped and ``no-new-privileges``, as the local launcher. The container is
    a child of dockerd, not of the job step, so a cancelled or timed-out job would leave it
    running: it is named ``envbuild-slurm-<jobid>-<node>`` and labelled ``envbuild=1``,
    ``envbuild.run=<run>``, ``envbuild.node``, ``envbuild.slurm-job`` (plus ``spec.labels``
    and ``$ENVBUILD_EXTRA_LABELS``), removed by the task's ``trap ... EXIT TERM INT``
    (Slurm sends SIGTERM, then SIGKILL after ``KillWait``), by a cleanup step at the end
    of the batch script, and by envbuild after the job ended. GPUs: ``--gpus
    device=$CUDA_VISIBLE_DEVICES`` (correct where Slurm does not renumber devices, i.e.
    without ``ConstrainDevices=yes``; use pyxis or apptainer there).
``pyxis``
    ``srun --container-image=IMAGE --container-mounts=...:ro,... --no-container-mount-home``
    (NVIDIA pyxis, https://github.com/NVIDIA/pyxis/wiki/Usage): the task runs inside an
    enroot container as the submitting user; the root filesystem is the job's private copy,
    so the image is not changed. ``IMAGE`` is an enroot URI (``registry#repo:tag``) or a
    squashfs file on a shared filesystem (``enroot import -o x.sqsh dockerd://REF``).
``apptainer``
    ``apptainer exec [--nv] --contain --cleanenv --bind ...`` (https://apptainer.org/docs/
    user/latest/): the submitting user, the read-only image, private ``/tmp`` and
    ``HOME``, a minimal ``/dev``; the environment is passed as ``APPTAINERENV_*``. ``IMAGE``
    is a SIF file (default ``docker-daemon:<image>``, converted from the node's engine).
"""

from __future__ import annotations

from .job import (
    INTERRUPTED_STATES,
    NEVER_STARTS,
    PENDING_STATES,
    STOP_STATUSES,
    TERMINAL_STATES,
    ControllerError,
    JobInfo,
    hostnames,
    job_info,
    log_tail,
    never_starts,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue_json,
    read_exit_status,
    scancel,
    submit,
)
from .launcher import (
    CANCEL_WAIT_S,
    END_MARGIN_S,
    NEVER_STARTS_AFTER_S,
    POLL_S,
    PROGRESS_S,
    Outcome,
    SlurmLauncher,
)
from .nodelogs import NodeLogs
from .options import (
    DEFAULT_PENDING_TIMEOUT_S,
    DEFAULT_RUNTIME,
    MAX_PATH_CHARS,
    RUNTIMES,
    SBATCH_OPTIONS,
    SBATCH_SET_BY_ENVBUILD,
    SlurmOptions,
    check_container_image,
    check_partition,
    check_pending_timeout,
    check_sbatch_arg,
    check_slurm_dir,
    check_slurm_nodes,
    parse_time_limit,
    time_limit_for,
)
from .script import (
    CODE_DIR,
    CONTAINER_PREFIX,
    JOB_LOG,
    LOGS_DIR,
    RESULTS_DIR,
    SCRIPT_NAME,
    SLURM_JOB_LABEL,
    Raw,
    container_name,
    default_slurm_dir,
    render_context,
    render_script,
    render_template,
    run_dir,
    sh,
    task_env,
    torchrun_words,
    write_run_dir,
)

__all__ = [
    "CANCEL_WAIT_S", "CODE_DIR", "CONTAINER_PREFIX", "DEFAULT_PENDING_TIMEOUT_S", "DEFAULT_RUNTIME", "END_MARGIN_S",
    "INTERRUPTED_STATES", "JOB_LOG", "LOGS_DIR", "MAX_PATH_CHARS", "NEVER_STARTS", "NEVER_STARTS_AFTER_S",
    "PENDING_STATES", "POLL_S", "PROGRESS_S", "RESULTS_DIR", "RUNTIMES", "SBATCH_OPTIONS", "SBATCH_SET_BY_ENVBUILD",
    "SCRIPT_NAME", "SLURM_JOB_LABEL", "STOP_STATUSES", "TERMINAL_STATES", "ControllerError", "JobInfo", "NodeLogs",
    "Outcome", "Raw", "SlurmLauncher", "SlurmOptions", "check_container_image", "check_partition",
    "check_pending_timeout", "check_sbatch_arg", "check_slurm_dir", "check_slurm_nodes", "container_name",
    "default_slurm_dir", "hostnames", "job_info", "log_tail", "never_starts", "parse_sacct", "parse_scontrol_job",
    "parse_squeue_json", "parse_time_limit", "read_exit_status", "render_context", "render_script",
    "render_template", "run_dir", "scancel", "sh", "submit", "task_env", "time_limit_for", "torchrun_words",
    "write_run_dir",
]
