"""``--apply``: run a certification's Indexed Job on a cluster and collect its results."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import one_line

from ..base import LaunchResult, LaunchSpec, OnProgress
from .cluster import ClusterApi, JobState, PodState, Update
from .manifests import load_objects, render_manifests
from .naming import object_name
from .options import DEFAULT_OPTIONS, K8sOptions
from .results import Outcome, assemble_result

#: Container waiting reasons that will not resolve by waiting (image or config errors).
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "ErrImageNeverPull")


@dataclass
class _Seen:
    """What the launcher knows of a running Job: its conditions, its live pods, when each
    pod's log was last read (and whether since its container ended), since when each pod
    waits on a fatal reason, and the :class:`~.results.Outcome` so far."""

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
    """Runs the ranks of a :class:`LaunchSpec` as an Indexed Job on a Kubernetes cluster.

    :meth:`run` renders the manifests (:func:`~.manifests.render_manifests`), creates the
    ConfigMap, Service and Job, watches the Job and its pods (:meth:`~.api.KubeApi.watch`)
    until the Job is ``Complete`` or ``Failed`` or ``timeout_s + slack_s`` seconds passed,
    reads every pod's log (when its container ends, and every ``log_every_s`` while it
    runs, since the Job controller deletes the pods it stops), takes the result documents
    from the logs (:func:`~.results.parse_result_blocks`) and ALWAYS (``finally``, also on
    Ctrl-C) deletes the Job (with its pods), the Service, the ConfigMap and any pod
    labelled ``envbuild.run=<run>``.

    A container stuck for ``pull_grace_s`` in a waiting state of :data:`FATAL_WAITING`
    (an image that cannot be pulled) ends the run with an error. TrainJobs are rendered
    only (``options.kubeflow`` is refused here).

    Args:
        options: rendering options (:class:`~.options.K8sOptions`).
        api: a :class:`~.cluster.ClusterApi`; default: a :class:`~.api.KubeApi` built
            from ``kubeconfig`` (default :func:`~.kubeconfig.find_kubeconfig`),
            ``context`` and ``namespace``.
        tick_s: longest wait for an update before the deadline, the logs and the waiting
            pods are looked at again (seconds).
        code: the in-image code (default :func:`~.code.in_image_code`).
    """

    def __init__(self, options: K8sOptions = DEFAULT_OPTIONS, *, api: ClusterApi | None = None,
                 kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None,
                 tick_s: float = 2.0, log_every_s: float = 10.0, slack_s: float = 30.0, pull_grace_s: float = 60.0,
                 code: Mapping[str, str] | None = None) -> None:
        if options.kubeflow:
            raise EnvbuildError("--apply runs the Indexed Job only; apply a TrainJob with "
                                "`kubectl apply -f DIR`", field="kubeflow", value=True, exit_code=ExitCode.USAGE)
        self.options = options
        self._api = api
        self.kubeconfig = kubeconfig
        self.context = context
        self.namespace = namespace
        self.tick_s = tick_s
        self.log_every_s = log_every_s
        self.slack_s = slack_s
        self.pull_grace_s = pull_grace_s
        self.code = code

    @property
    def api(self) -> ClusterApi:
        """The API seam, connected on first use (:class:`~.api.KubeApi`)."""
        if self._api is None:
            from .api import KubeApi
            from .kubeconfig import find_kubeconfig

            self._api = KubeApi(self.kubeconfig or find_kubeconfig(), self.context, self.namespace)
        return self._api

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        """Launch ``spec`` on the cluster and return what the ranks produced.

        Raises:
            EnvbuildError: (exit 2) a tag-only image, the API refused an object; (exit 3) no
                kubeconfig, cluster unreachable, an image that cannot be pulled.
            KeyboardInterrupt: passed on, after the cleanup.
        """
        from ..base import deferred_signals, utc_now_iso

        say = on_progress or (lambda msg: None)
        objects = load_objects(render_manifests(spec, self.options, self.code))
        api = self.api
        name = object_name(spec.run_id)
        # every object whose creation was asked for: a request cut short by Ctrl-C may still
        # have been carried out, so the cleanup deletes them all (a missing one is fine)
        created: list[dict[str, Any]] = []
        cleanup_errors: list[str] = []
        try:
            for obj in objects:
                created.append(obj)
                try:
                    api.create(obj)
                except EnvbuildError as e:
                    if e.exit_code == ExitCode.CHECK_FAILED:  # refused (e.g. 409: exists): not ours
                        created.pop()
                    raise
            started_at = utc_now_iso()
            say(f"run {spec.run_id}: created Job {name} in namespace {getattr(api, 'namespace', '?')}: "
                f"{spec.nodes} pod(s) x {spec.nproc_per_node} rank(s)")
            outcome = self._wait(spec, name, say)
            result = assemble_result(spec, outcome, started_at=started_at, finished_at=utc_now_iso(),
                                     cleanup_errors=cleanup_errors)
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
                msg = (f"run {spec.run_id}: {running}/{spec.nodes} pod(s) running, "
                       f"{now - t0:.0f} s of {float(spec.timeout_s):g} s")
                if msg != last_msg:
                    say(msg)
                    last_msg = msg
        return seen.outcome

    def _observe(self, spec: LaunchSpec, seen: _Seen, done: bool, now: float) -> None:
        """Record the pods' exit codes, read their logs when due, fail on a pod stuck on an
        image (:data:`FATAL_WAITING` for ``pull_grace_s``)."""
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
