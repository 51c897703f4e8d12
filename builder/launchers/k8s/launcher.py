"""``--apply``: run a certification's Indexed Job; results from pod logs (rank files printed between marker lines)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.core.documents import MAX_RESULT_BYTES, RankResult
from builder.core.errors import EnvbuildError, ExitCode, Unreachable, UsageError
from builder.core.events import stamp
from builder.core.inputs import load_json, one_line

from ..base import LaunchResult, LaunchSpec, OnProgress
from ..output import result_problem
from ..phases import PhaseClock, job_phases
from ..progress import ProgressTracker, progress_from_logs
from .api import ClusterApi, JobState, KubeApi, PodState, Update, find_kubeconfig
from .manifests import load_objects, render_manifests, write_manifests
from .objects import RESULT_BEGIN, RESULT_END
from .options import DEFAULT_OPTIONS, K8sOptions, object_name

_BEGIN_RE = re.compile(rf"{re.escape(RESULT_BEGIN)} rank-(\d{{1,9}})\.json")
_END_RE = re.compile(rf"{re.escape(RESULT_END)} rank-(\d{{1,9}})\.json")


def parse_result_blocks(log: str, run_id: str | None = None, world_size: int | None = None
                        ) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """The result documents a node printed between marker lines (:data:`~.pod.NODE_SCRIPT`)."""
    results: dict[int, dict[str, Any]] = {}
    problems: dict[int, str] = {}
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        m = _BEGIN_RE.fullmatch(lines[i].rstrip())
        if not m:
            i += 1
            continue
        rank = int(m.group(1))
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not _END_RE.fullmatch(lines[j].rstrip()):
            body.append(lines[j])
            j += 1
        i = j + 1
        if j >= len(lines):
            problems[rank] = "result block in the pod log is not terminated (log cut short?)"
            continue
        doc, problem = _result_of_block("\n".join(body), rank, run_id, world_size)
        if problem is not None:
            problems[rank] = problem
            continue
        results[rank] = doc
        problems.pop(rank, None)
    return results, problems


def _result_of_block(text: str, rank: int, run_id: str | None, world_size: int | None) -> tuple[Any, str | None]:
    """``(document, None)`` or ``(None, reason)`` for the body of one result block."""
    if len(text) > MAX_RESULT_BYTES:
        return None, f"result in the pod log is over {MAX_RESULT_BYTES} bytes"
    try:
        doc = load_json(text, "result in the pod log")
    except EnvbuildError as e:
        return None, one_line(str(e), 300)
    problem = result_problem(doc, rank, "result", run_id=run_id, world_size=world_size)
    return (None, problem) if problem else (doc, None)


@dataclass
class Outcome:
    """What was seen of a run's pods (nodes are completion indexes)."""

    timed_out: bool = False
    failed: bool = False
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)
    headers: dict[int, str] = field(default_factory=dict)


def assemble_result(spec: LaunchSpec, outcome: Outcome, *, started_at: str, finished_at: str,
                    cleanup_errors: list[str] | None = None, tracker: ProgressTracker | None = None) -> LaunchResult:
    """The :class:`LaunchResult`; ``killed_after_s`` 0 for a failed run's other nodes (no grace)."""
    from ..output import check_result, log_events, parse_torchrun_failures, plain_lines

    exit_codes: dict[int, int | None] = {n: None for n in range(spec.nodes)}
    exit_codes.update({n: c for n, c in outcome.exit_codes.items() if 0 <= n < spec.nodes})
    node_logs: dict[int, str] = {}
    results: dict[int, RankResult] = {}
    problems: dict[int, str] = {}
    rank_exit: dict[int, int] = {}
    for node in range(spec.nodes):
        text = outcome.logs.get(node)
        if text is None:
            continue
        node_logs[node] = outcome.headers.get(node, "") + text
        got, bad = parse_result_blocks(text, spec.run_id, spec.world_size)
        mine = set(spec.ranks_of_node(node))
        for rank, doc in got.items():
            if rank in mine:
                model, why = check_result(doc, rank, "result", run_id=spec.run_id, world_size=spec.world_size)
                if model is not None:
                    results[rank] = model
                else:
                    problems.setdefault(rank, why or "refused")
            else:
                problems.setdefault(rank, f"result of rank {rank} printed by node {node}, which does not host it")
        for rank, why in bad.items():
            problems.setdefault(rank, why)
        for rank, code in parse_torchrun_failures(text).items():
            rank_exit.setdefault(rank, code)
    for rank in results:
        problems.pop(rank, None)
    killed = [n for n, c in exit_codes.items() if c is None]
    tracker = tracker or progress_from_logs(outcome.logs.values(), spec.world_size, spec.run_id)
    return LaunchResult(
        rank_results=results, node_logs=node_logs, node_exit_codes=exit_codes, timed_out=outcome.timed_out,
        missing_ranks=[r for r in range(spec.world_size) if r not in results],
        started_at=started_at, finished_at=finished_at, rank_exit_codes=rank_exit, rank_problems=problems,
        killed_after_s=0.0 if (outcome.failed and killed and not outcome.timed_out) else None,
        cleanup_errors=cleanup_errors if cleanup_errors is not None else [],
        progress=tracker.snapshot(at=tracker.latest) if tracker.latest else {},
        socket_seen=dict(tracker.socket), interfaces_seen=dict(tracker.interfaces),
        log_events=[e for n, text in node_logs.items()  # read at the end: stamped now
                    for e in log_events(spec, n, [(stamp(), line) for line in plain_lines(text)])],
    )


#: Container waiting reasons that will not resolve by waiting (image or config errors).
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "ErrImageNeverPull")


@dataclass
class _Seen:
    job: JobState
    pods: dict[str, PodState] = field(default_factory=dict)
    last_log: dict[str, float] = field(default_factory=dict)
    waiting_since: dict[str, float] = field(default_factory=dict)
    final_read: set[str] = field(default_factory=set)
    outcome: Outcome = field(default_factory=Outcome)

    def apply(self, updates: list[Update]) -> None:
        for u in updates:
            if isinstance(u, JobState):
                if u.deleted:
                    raise Unreachable(f"Kubernetes API: Job {self.job.name} was deleted before it finished")
                self.job = u
            elif u.deleted:
                self.pods.pop(u.name, None)
            else:
                self.pods[u.name] = u


class K8sLauncher:
    """An Indexed Job watched ``timeout_s + slack_s`` s, logs read as pods go; ALWAYS deletes what it made."""

    def __init__(self, options: K8sOptions = DEFAULT_OPTIONS, *, api: ClusterApi | None = None,
                 kubeconfig: str | None = None, context: str | None = None, manifests_dir: str | None = None,
                 tick_s: float = 2.0, log_every_s: float = 10.0, slack_s: float = 30.0, pull_grace_s: float = 60.0,
                 code: Mapping[str, str] | None = None) -> None:
        if options.kubeflow:
            raise UsageError("--apply runs the Indexed Job only; apply a TrainJob with "
                             "`kubectl apply -f DIR`", field="kubeflow", value=True)
        self.options = options
        self._api = api
        self.kubeconfig = kubeconfig
        self.context = context
        self.manifests_dir = manifests_dir
        self.folder: str | None = None
        self.tick_s = tick_s
        self.log_every_s = log_every_s
        self.slack_s = slack_s
        self.pull_grace_s = pull_grace_s
        self.code = code
        self._clock = PhaseClock(time.time)

    @property
    def api(self) -> ClusterApi:
        """The API seam, connected on first use (:class:`~.api.KubeApi`)."""
        if self._api is None:
            self._api = KubeApi(self.kubeconfig or find_kubeconfig(manifests=self.folder), self.context,
                                self.options.namespace)
        return self._api

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        """EnvbuildError: (exit 2) a tag-only image, an object refused; (exit 3) no kubeconfig, cluster unreachable, an
        image that cannot be pulled. KeyboardInterrupt passes, after the cleanup."""
        from builder.core.clock import utc_stamp

        from ..base import deferred_signals

        say = on_progress or (lambda msg: None)
        files = render_manifests(spec, self.options, self.code)
        if self.manifests_dir is not None:
            from pathlib import Path

            self.folder = str(Path(self.manifests_dir) / f"k8s-{spec.run_id}")
            write_manifests(files, self.folder)
            say(f"run {spec.run_id}: manifests in {self.folder}")
        objects = load_objects(files)
        api = self.api
        name = object_name(spec.run_id)
        # every object whose creation was asked for: a request cut short by Ctrl-C may still
        # have been carried out, so the cleanup deletes them all (a missing one is fine)
        created: list[dict[str, Any]] = []
        cleanup_errors: list[str] = []
        result: LaunchResult | None = None
        self._clock = clock = PhaseClock(time.time)  # epoch s, as the ranks stamp their phases
        try:
            clock.mark("launch")
            for obj in objects:
                created.append(obj)
                try:
                    api.create(obj)
                except EnvbuildError as e:
                    if e.exit_code == ExitCode.CHECK_FAILED:  # refused (e.g. 409: exists): not ours
                        created.pop()
                    raise
            started_at = utc_stamp()
            say(f"run {spec.run_id}: created Job {name} in namespace {getattr(api, 'namespace', '?')}: "
                f"{spec.nodes} pod(s) x {spec.nproc_per_node} rank(s)")
            outcome = self._wait(spec, name, say)
            clock.mark("ended")
            tracker = progress_from_logs(outcome.logs.values(), spec.world_size, spec.run_id)
            result = assemble_result(spec, outcome, started_at=started_at, finished_at=utc_stamp(),
                                     cleanup_errors=cleanup_errors, tracker=tracker)
            say(f"run {spec.run_id}: {len(result.rank_results)}/{spec.world_size} rank result(s)"
                + (" (timed out)" if result.timed_out else ""))
            return result
        finally:
            try:
                with deferred_signals():
                    self._cleanup(spec, created, cleanup_errors)
            except KeyboardInterrupt:
                with deferred_signals():
                    self._cleanup(spec, created, cleanup_errors)
                raise
            clock.mark("removed")
            if result is not None:
                result.phases = job_phases(clock.marks, tracker, result.progress, spec.world_size, result.timed_out,
                                           "pods up")

    def _wait(self, spec: LaunchSpec, name: str, say: OnProgress) -> Outcome:
        """Follow the Job's updates until it ends or the deadline passes."""
        t0 = time.monotonic()
        deadline = t0 + float(spec.timeout_s) + self.slack_s
        seen = _Seen(job=JobState(name))
        last_msg = ""
        with contextlib.closing(self.api.watch(name, self.tick_s)) as updates:
            for batch in updates:
                seen.apply(batch)
                now = time.monotonic()
                done = seen.job.done
                if done:  # the Job's end is final; its pods once more, as the API has them now
                    seen.pods = {p.name: p for p in self.api.pods(name)}
                self._observe(spec, seen, done, now)
                if done:
                    seen.outcome.failed = "Failed" in seen.job.conditions
                    seen.outcome.timed_out = seen.job.conditions.get("Failed") == "DeadlineExceeded"
                    break
                if now >= deadline:
                    seen.outcome.timed_out = True
                    break
                running = sum(1 for p in seen.pods.values() if p.phase == "Running")
                if running + sum(1 for p in seen.pods.values() if p.phase in ("Succeeded", "Failed")) >= spec.nodes:
                    self._clock.mark("started")
                msg = (f"run {spec.run_id}: {running}/{spec.nodes} pod(s) running, "
                       f"{now - t0:.0f} s of {float(spec.timeout_s):g} s")
                if msg != last_msg:
                    say(msg)
                    last_msg = msg
        return seen.outcome

    def _observe(self, spec: LaunchSpec, seen: _Seen, done: bool, now: float) -> None:
        """Record exit codes, read logs when due, fail a pod stuck on an image (:data:`FATAL_WAITING`)."""
        out = seen.outcome
        for p in sorted(seen.pods.values(), key=lambda p: p.name):
            if p.node is None:
                continue
            out.headers[p.node] = f"[envbuild] pod {p.name} on {p.host or '?'}\n"
            final = p.exit_code is not None
            # a pod that ended before the Job did ended on its own; once the Job failed,
            # 137/143 (SIGKILL/SIGTERM) is the controller stopping the others: killed
            if final and (not done or "Complete" in seen.job.conditions or p.exit_code not in (137, 143)):
                out.exit_codes.setdefault(p.node, p.exit_code)
            if p.phase in ("Running", "Succeeded", "Failed") and (
                    (final and p.name not in seen.final_read) or done
                    or now - seen.last_log.get(p.name, -1e9) >= self.log_every_s):
                text = self.api.log(p.name)
                if text or p.node not in out.logs:
                    out.logs[p.node] = text
                seen.last_log[p.name] = now
                if final:
                    seen.final_read.add(p.name)
            if p.waiting_reason in FATAL_WAITING:
                since = seen.waiting_since.setdefault(p.name, now)
                if now - since >= self.pull_grace_s:
                    raise Unreachable(f"pod {p.name}: {p.waiting_reason}: {one_line(p.message or '', 200)}"
                                      f" (image {spec.image})")
            else:
                seen.waiting_since.pop(p.name, None)

    def _cleanup(self, spec: LaunchSpec, created: list[dict[str, Any]], errors: list[str]) -> None:
        """Delete what was created (newest first) and every pod labelled with the run."""
        from builder.image import engine

        for obj in reversed(created):
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            try:
                self.api.delete(obj)
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                errors.append(f"delete {kind} {obj_name}: {one_line(e, 200)}")
        if created:
            try:
                self.api.delete_pods(f"{engine.RUN_LABEL}={spec.run_id}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"delete pods labelled {engine.RUN_LABEL}={spec.run_id}: {one_line(e, 200)}")
