"""The Slurm launcher: submit the batch script, follow the job, collect, clean up (package doc)."""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.clock import utc_stamp
from builder.core.documents import RankResult
from builder.core.errors import EnvbuildError, Unreachable
from builder.core.files import write_atomic
from builder.core.inputs import one_line
from builder.image import engine

from ..base import LaunchResult, LaunchSpec, OnProgress, deferred_signals
from ..output import parse_torchrun_failures
from ..phases import PhaseClock, job_phases
from .job import (
    INTERRUPTED_STATES,
    PENDING_STATES,
    STOP_STATUSES,
    ControllerError,
    JobInfo,
    down_nodes,
    hostnames,
    job_info,
    log_tail,
    never_starts,
    read_exit_status,
    run_command,
    scancel,
    scancel_by_name,
    submit,
)
from .nodelogs import NodeLogs
from .options import SlurmOptions, parse_time_limit, time_limit_for
from .script import JOB_LOG, LOGS_DIR, RESULTS_DIR, render_script, run_dir, write_run_dir

#: Seconds between two looks at the job.
POLL_S = 2.0
#: Seconds past its time limit before envbuild cancels a job Slurm did not end (Slurm's
#: default ``KillWait`` is 30 s; ``scontrol show config``).
END_MARGIN_S = 120.0
#: Seconds to wait for a cancelled job to end.
CANCEL_WAIT_S = 60.0
#: Seconds of failures to reach the controller before giving up.
UNREACHABLE_AFTER_S = 60.0
#: Seconds between two progress messages when nothing changed.
PROGRESS_S = 15.0
#: Seconds a job must stay pending for reasons of :data:`~.job.NEVER_STARTS` before envbuild
#: cancels it (right after submission Slurm may show ``PartitionConfig`` for a moment).
NEVER_STARTS_AFTER_S = 10.0


@dataclass
class Outcome:
    """How the wait for a job ended: its last state, and the ranks' progress at that moment."""

    info: JobInfo
    started_at: str
    gave_up: str | None = None  # "pending" or "running": envbuild cancelled the job
    waited_s: float = 0.0
    last_state: str | None = None  # the state seen when envbuild gave up
    never_starts: str | None = None  # why the pending job could never start (never_starts)
    progress: dict[int, dict] = field(default_factory=dict)


@dataclass
class _Watch:
    """What the wait loop remembers between two looks at the job."""

    t0: float
    started_at: str
    started: float | None = None
    failing: list[float] = field(default_factory=list)
    last: tuple[Any, ...] = ()
    said_at: float = 0.0
    never_since: float | None = None


class SlurmLauncher:
    """Runs the ranks of a :class:`LaunchSpec` as one Slurm batch job (see the package doc).
    """

    def __init__(self, slurm_dir: str | os.PathLike[str], options: SlurmOptions | None = None, *,
                 client: Any = None, poll_s: float = POLL_S) -> None:
        self.slurm_dir = Path(slurm_dir)
        self.options = options or SlurmOptions()
        self.client = client
        self.poll_s = poll_s
        self.job_id: str | None = None
        self.folder: Path | None = None
        self._submitting = False
        self._clock = PhaseClock(time.time)

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        """Write the run folder, submit the job, wait for it, collect the results.
        Raises EnvbuildError: (exit 64) a value the script cannot carry; also exit 3."""
        say = on_progress or (lambda msg: None)
        folder = run_dir(self.slurm_dir, spec.run_id)
        script = render_script(spec, self.options, folder)
        limit_s = parse_time_limit(time_limit_for(spec, self.options))
        self.folder, self.job_id = folder, None
        if shutil.which("sbatch") is None:
            raise Unreachable("Slurm: sbatch not found on PATH (run envbuild on a Slurm submit host)")
        cleanup_errors: list[str] = []
        outcome: Outcome | None = None
        result: LaunchResult | None = None
        self._submitting = False
        self._clock = PhaseClock(time.time)  # epoch s, as the ranks stamp their phases
        try:
            path = write_run_dir(folder, script)
            logs = NodeLogs(folder / LOGS_DIR, spec)
            submitted_at = utc_stamp()
            self._clock.mark("launch")
            self._submitting = True
            try:
                self.job_id = submit(path)
            except EnvbuildError:  # sbatch answered: no job (only Ctrl-C leaves one unknown)
                self._submitting = False
                raise
            self._submitting = False
            say(f"run {spec.run_id}: Slurm job {self.job_id} submitted ({path}), "
                f"{spec.nodes} node(s) x {spec.nproc_per_node} rank(s) through {self.options.runtime}")
            outcome = self._wait(spec, self.job_id, limit_s, submitted_at, logs, say)
            self._clock.mark("ended")
            result = self.collect(spec, folder, outcome, limit_s, cleanup_errors, logs)
            return result
        finally:
            try:
                with deferred_signals():
                    self._cleanup(spec, outcome, cleanup_errors, say)
            except KeyboardInterrupt:
                with deferred_signals():
                    self._cleanup(spec, outcome, cleanup_errors, say)
                raise
            self._clock.mark("removed")
            if result is not None and outcome is not None:
                result.phases = job_phases(self._clock.marks, logs.tracker, outcome.progress, spec.world_size,
                                           result.timed_out, "queued")

    # -- waiting

    def _info(self, job_id: str, failing_since: list[float]) -> JobInfo | None:
        try:
            info = job_info(job_id)
        except ControllerError as e:
            now = time.monotonic()
            if not failing_since:
                failing_since.append(now)
            elif now - failing_since[0] > UNREACHABLE_AFTER_S:
                raise Unreachable(f"Slurm controller: {e}") from None
            return None
        failing_since.clear()
        return info

    def _wait(self, spec: LaunchSpec, job_id: str, limit_s: int, submitted_at: str, logs: NodeLogs,
              say: OnProgress) -> Outcome:
        """Poll the job (and the node logs) until it ended or envbuild gave up on it."""
        w = _Watch(t0=time.monotonic(), started_at=submitted_at)
        slurm_nodes = self.options.slurm_nodes or spec.nodes
        while True:
            info = self._info(job_id, w.failing)
            logs.poll()
            now = time.monotonic()
            if info is not None:
                if info.terminal:
                    return Outcome(info, w.started_at, waited_s=now - w.t0, progress=logs.tracker.snapshot())
                out = self._look(spec, job_id, info, limit_s, slurm_nodes, w, now, logs)
                if out is not None:
                    return out
                n = len(logs.results())
                reason = info.reason if info.state in PENDING_STATES else None
                if (info.state, reason, n) != w.last or now - w.said_at >= PROGRESS_S:
                    say(f"run {spec.run_id}: Slurm job {job_id} {info.state}" + (f" ({reason})" if reason else "")
                        + f", {n}/{spec.world_size} rank result(s), {now - w.t0:.0f} s")
                    w.last, w.said_at = (info.state, reason, n), now
            time.sleep(self.poll_s)

    def _look(self, spec: LaunchSpec, job_id: str, info: JobInfo, limit_s: int, slurm_nodes: int, w: _Watch,
              now: float, logs: NodeLogs) -> Outcome | None:
        """The outcome when envbuild gives up on a job that did not end (pending too long
        or for a reason that never resolves; still running past its limit), else None."""
        if info.state in PENDING_STATES:
            never = never_starts(info, slurm_nodes)
            if not never:
                w.never_since = None
            elif w.never_since is None:
                w.never_since = now
            if (never and w.never_since is not None and now - w.never_since >= NEVER_STARTS_AFTER_S) \
                    or now - w.t0 > self.options.pending_timeout_s:
                out = self._give_up(job_id, info, w.started_at, "pending", w.t0, logs)
                out.never_starts = never
                return out
            return None
        if w.started is None:
            w.started, w.started_at = now, utc_stamp()
            self._clock.mark("started")
        if now - w.started > limit_s + END_MARGIN_S:
            return self._give_up(job_id, info, w.started_at, "running", w.t0, logs)
        return None

    def _give_up(self, job_id: str, info: JobInfo, started_at: str, why: str, t0: float, logs: NodeLogs) -> Outcome:
        progress = logs.tracker.snapshot()
        err = scancel(job_id)
        end = self._await_end(job_id, CANCEL_WAIT_S)
        out = Outcome(end or info, started_at, gave_up=why, waited_s=time.monotonic() - t0,
                      last_state=info.state, progress=progress)
        out.info.reason = out.info.reason or info.reason
        if err:
            out.info.reason = f"{out.info.reason or ''}; {err}".strip("; ")
        return out

    def _await_end(self, job_id: str, timeout_s: float) -> JobInfo | None:
        deadline = time.monotonic() + timeout_s
        info = None
        while time.monotonic() < deadline:
            try:
                info = job_info(job_id)
            except (ControllerError, Unreachable):
                info = None
            if info is not None and info.terminal:
                return info
            time.sleep(min(self.poll_s, 1.0))
        return info

    # -- collecting

    def _job_note(self, spec: LaunchSpec, outcome: Outcome, limit_s: int) -> tuple[str, bool, float | None]:
        """``(what happened to the job, timed out?, deadline enforced)``, from its state
        (``squeue``/``scontrol``/``sacct``), never from a log line."""
        info = outcome.info
        if outcome.never_starts:
            return f"{outcome.never_starts}; envbuild cancelled it", False, None
        if outcome.gave_up == "pending":
            return (f"did not start within {self.options.pending_timeout_s:g} s (still "
                    f"{outcome.last_state or 'PENDING'}" + (f", reason {info.reason}" if info.reason else "")
                    + "); envbuild cancelled it"), False, None
        if outcome.gave_up == "running":
            return (f"was still running {END_MARGIN_S:g} s after its time limit of {limit_s:g} s; "
                    "envbuild cancelled it"), True, float(limit_s + END_MARGIN_S)
        what = f"ended {info.state}" + (f" ({info.reason})" if info.reason else "")
        if info.state == "NODE_FAIL":
            lost = down_nodes(info.nodes)
            what += f", node(s) lost: {', '.join(lost)}" if lost else ""
        if info.state in ("TIMEOUT", "DEADLINE"):
            what += f": cancelled by Slurm at its time limit (--time={time_limit_for(spec, self.options)})"
            return what, True, float(limit_s)
        return what, False, None

    def collect(self, spec: LaunchSpec, folder: Path, outcome: Outcome, limit_s: int, cleanup_errors: list[str],
                logs: NodeLogs | None = None) -> LaunchResult:
        """The :class:`LaunchResult` of a job that ended or was given up; ranks stopped by the signal
        that ended the job are not blamed for it. Accepted results are kept in ``results/`` (0600)."""
        if logs is None:
            logs = NodeLogs(folder / LOGS_DIR, spec)
        logs.finish()
        results, problems, node_logs = logs.results(), logs.problems(), logs.logs()
        node_exit = {n: read_exit_status(folder / RESULTS_DIR / f"node-{n}.exit") for n in range(spec.nodes)}
        rank_exit: dict[int, int] = {}
        for text in node_logs.values():
            for rank, code in parse_torchrun_failures(text).items():
                rank_exit.setdefault(rank, code)
        missing = [r for r in range(spec.world_size) if r not in results]
        what, timed_out, deadline_s = self._job_note(spec, outcome, limit_s)
        # A node Slurm stopped (time limit, scancel, srun --kill-on-bad-exit: node-<i>.exit
        # holds the signal's name, or nothing) had SIGTERM, then SIGKILL after KillWait, reach
        # torchrun too (docker run passes signals on); its summary may or may not be written
        # before the container goes: that signal is no fault of the node's ranks.
        stopped = [r for r, c in rank_exit.items()
                   if c in STOP_STATUSES and node_exit.get(spec.node_of_rank(r), 0) is None]
        for r in stopped:
            del rank_exit[r]
        if not outcome.gave_up and outcome.info.state == "NODE_FAIL":  # a lost peer ends the others' ranks
            for r in [r for r in missing if r in rank_exit]:
                problems.setdefault(r, f"exited with {rank_exit.pop(r)} after Slurm job {self.job_id} {what}")
        if outcome.gave_up == "pending" or (not outcome.gave_up and outcome.info.state in INTERRUPTED_STATES):
            for r in missing:
                if r not in rank_exit:
                    problems.setdefault(r, f"Slurm job {self.job_id} {what.split(':')[0]} before this rank reported")
        failed_nodes = [n for n, c in node_exit.items() if c not in (None, 0)]
        killed = [n for n, c in node_exit.items() if c is None]
        keep_results(folder / RESULTS_DIR, results, cleanup_errors)
        return LaunchResult(rank_results=results, node_logs=node_logs, node_exit_codes=node_exit, timed_out=timed_out,
                            missing_ranks=missing, started_at=outcome.started_at, finished_at=utc_stamp(),
                            rank_exit_codes=rank_exit, rank_problems=problems,
                            killed_after_s=0.0 if (failed_nodes and killed and not timed_out) else None,
                            cleanup_errors=cleanup_errors, notes=self._notes(folder, outcome, what),
                            deadline_s=deadline_s, progress=outcome.progress, socket_seen=dict(logs.tracker.socket),
                            interfaces_seen=dict(logs.tracker.interfaces), log_events=logs.events())

    def _notes(self, folder: Path, outcome: Outcome, what: str) -> list[str]:
        """The job's note when it did not simply complete: its state, exit code and the
        tail of ``job.log``."""
        info = outcome.info
        if info.state == "COMPLETED" and not outcome.gave_up:
            return []
        note = f"Slurm job {self.job_id} {what}"
        if info.exit_code and outcome.gave_up != "pending":  # a job that never ran has none
            note += f", exit code {info.exit_code}"
        tail = log_tail(folder / JOB_LOG)
        note += f"; {folder / JOB_LOG}: {tail}" if tail else f"; {folder / JOB_LOG} is empty"
        return [one_line(note, 600)]

    # -- cleanup

    def _cleanup(self, spec: LaunchSpec, outcome: Outcome | None, errors: list[str], say: OnProgress) -> None:
        """Cancel the job if it may still run; remove the run's docker containers."""
        info = outcome.info if outcome else None
        if self.job_id is None and self._submitting:
            err = scancel_by_name(f"envbuild-{spec.run_id}")  # sbatch was cut short: maybe submitted
            if err:
                errors.append(err)
        if self.job_id and (info is None or not info.terminal):
            say(f"run {spec.run_id}: cancelling Slurm job {self.job_id}")
            err = scancel(self.job_id)
            if err:
                errors.append(err)
            end = self._await_end(self.job_id, CANCEL_WAIT_S)
            if end is None or not end.terminal:
                errors.append(f"Slurm job {self.job_id} did not end within {CANCEL_WAIT_S:g} s of scancel")
            info = end or info
        if self.options.runtime != "docker" or not self.job_id:
            return
        label = f"{engine.RUN_LABEL}={spec.run_id}"
        try:
            client = self.client or engine.connect(timeout_s=30)
            client.remove_by_label(label)
        except Exception as e:  # noqa: BLE001 - cleanup goes on
            errors.append(f"remove containers labelled {label}: {one_line(e, 200)}")
        me = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
        others = [h for h in hostnames(info.nodes if info else None) if h not in me and h.split(".")[0] not in me]
        if others:
            self._remote_cleanup(others, label, errors)

    def _remote_cleanup(self, hosts: list[str], label: str, errors: list[str]) -> None:
        """``docker rm -f`` the run's containers on the job's other nodes (one-task-per-node
        ``srun`` step, bounded)."""
        argv = ["srun", f"--job-name=envbuild-cleanup-{label.split('=')[-1]}", f"--nodelist={','.join(hosts)}",
                f"--nodes={len(hosts)}", "--ntasks-per-node=1", "--time=2", "--immediate=60"]
        if self.options.partition:
            argv.append(f"--partition={self.options.partition}")
        argv += ["bash", "-c", f"docker ps -aq --filter label={label} | xargs -r docker rm -f >/dev/null"]
        try:
            proc = run_command(argv, timeout_s=180)
            if proc.returncode != 0:
                errors.append(f"remove containers labelled {label} on {', '.join(hosts)}: "
                              f"{one_line(proc.stderr or proc.returncode, 200)}")
        except Unreachable as e:
            errors.append(f"remove containers labelled {label} on {', '.join(hosts)}: {e}")


def keep_results(results_dir: Path, results: dict[int, RankResult], errors: list[str]) -> None:
    """Write the accepted results into the run folder as ``rank-<r>.json`` (mode 0600), the
    record of the run next to its script and logs; a failure is a cleanup warning."""
    import json

    for rank, result in sorted(results.items()):
        try:
            write_atomic(results_dir / f"rank-{rank}.json",
                         (json.dumps(result.to_dict(), indent=2) + "\n").encode(), mode=0o600)
        except EnvbuildError as e:
            errors.append(f"keep the result of rank {rank} in {results_dir}: {e.message}")
            return
