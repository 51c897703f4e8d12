"""The Kubernetes API as the launcher uses it, over the ``kubernetes`` client (imported lazily).
Errors are one line: the API refused (400, 403, 409, 422: exit 2), else exit 3."""

from __future__ import annotations

import functools
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import load_json, one_line

from .objects import CONTAINER_NAME, INDEX_ANNOTATION, JOB_NAME_LABEL

#: ``kubeconfig`` value meaning "use the pod's service account" (running inside a cluster).
IN_CLUSTER = "in-cluster"
#: Where a pod's service account token is mounted (in-cluster configuration).
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def find_kubeconfig(environ: Mapping[str, str] | None = None, home: str | None = None,
                    manifests: str | None = None) -> str:
    """As kubectl finds it: ``$KUBECONFIG``, ``~/.kube/config``, else :data:`IN_CLUSTER`; Unreachable (3)."""
    environ = os.environ if environ is None else environ
    listed = [p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    for p in listed:
        if os.path.isfile(p):
            return p
    default = os.path.join(home or environ.get("HOME") or os.path.expanduser("~"), ".kube", "config")
    if not listed and os.path.isfile(default):
        return default
    if environ.get("KUBERNETES_SERVICE_HOST") and os.path.isfile(os.path.join(SA_DIR, "token")):
        return IN_CLUSTER
    where = f"KUBECONFIG={environ.get('KUBECONFIG')!r} names no file" if listed else f"no {default}"
    if manifests is None:
        raise Unreachable(f"no kubeconfig ({where}, not in a pod): cannot apply; render the manifests with "
                          "`envbuild k8s render` and `kubectl apply -f DIR` where a cluster answers")
    raise Unreachable(f"the manifests are in this folder; no kubeconfig ({where}, not in a pod) to apply them: "
                      "`kubectl apply -f` the folder where a cluster answers", file=manifests)


def api_client(kubeconfig: str, context: str | None = None) -> tuple[Any, str | None]:
    """``(ApiClient, context namespace or None)``; Unreachable (3): no ``kubernetes``, a bad configuration."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise Unreachable("--apply needs the kubernetes package (a dependency of envbuild): "
                          "pip install kubernetes") from None
    try:
        configuration = client.Configuration()
        if kubeconfig == IN_CLUSTER:
            config.load_incluster_config(client_configuration=configuration)
            ns_file = os.path.join(SA_DIR, "namespace")
            namespace = Path(ns_file).read_text().strip() if os.path.isfile(ns_file) else None
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                    persist_config=False)
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            if context:
                active = next((c for c in contexts if c.get("name") == context), active)
            namespace = ((active or {}).get("context") or {}).get("namespace")
    except Exception as e:  # noqa: BLE001 - config errors of many kinds
        raise Unreachable(f"kubeconfig {kubeconfig}: {one_line(e, 200)}") from None
    return client.ApiClient(configuration=configuration), namespace


_INDEX_RE = re.compile(r"[0-9]{1,9}")


@dataclass
class PodState:
    name: str
    node: int | None
    phase: str
    exit_code: int | None = None
    waiting_reason: str | None = None
    message: str | None = None
    host: str | None = None
    deleted: bool = False


@dataclass
class JobState:
    """Conditions whose status is ``True``: ``{type: reason}`` (``{"Failed": "DeadlineExceeded"}``); ``deleted``."""

    name: str
    conditions: dict[str, str] = field(default_factory=dict)
    deleted: bool = False

    @property
    def done(self) -> bool:
        """Whether the Job is ``Complete`` or ``Failed``."""
        return "Complete" in self.conditions or "Failed" in self.conditions


#: What a watch reports: the new state of the Job or of one of its pods.
Update = JobState | PodState


class ClusterApi(Protocol):
    """The calls :class:`~.launcher.K8sLauncher` makes."""

    namespace: str

    def create(self, obj: Mapping[str, Any]) -> None: ...

    def delete(self, obj: Mapping[str, Any]) -> None: ...

    def delete_pods(self, selector: str) -> None: ...

    def watch(self, job: str, tick_s: float) -> Generator[list[Update], None, None]: ...

    def pods(self, job: str) -> list[PodState]: ...

    def log(self, pod: str) -> str: ...


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def pod_state(obj: Mapping[str, Any], deleted: bool = False) -> PodState:
    """A :class:`PodState` from a Pod object of the API (a dict); malformed fields read as absent."""
    meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
    idx = _dict(meta.get("annotations")).get(INDEX_ANNOTATION)
    state = PodState(name=str(meta.get("name") or ""),
                     node=int(idx) if isinstance(idx, str) and _INDEX_RE.fullmatch(idx) else None,
                     phase=_text(status.get("phase")) or "Unknown", host=_text(spec.get("nodeName")), deleted=deleted)
    for cs in _list(status.get("containerStatuses")):
        if not isinstance(cs, dict) or cs.get("name") != CONTAINER_NAME:
            continue
        terminated, waiting = _dict(cs.get("state")).get("terminated"), _dict(cs.get("state")).get("waiting")
        if isinstance(terminated, dict):
            code = terminated.get("exitCode")
            state.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
            state.message = _text(terminated.get("reason"))
        elif isinstance(waiting, dict):
            state.waiting_reason = _text(waiting.get("reason"))
            state.message = _text(waiting.get("message"))
    return state


def job_state(obj: Mapping[str, Any], deleted: bool = False) -> JobState:
    """A :class:`JobState` from a Job object of the API (a dict)."""
    meta, status = _dict(obj.get("metadata")), _dict(obj.get("status"))
    return JobState(name=str(meta.get("name") or ""), deleted=deleted, conditions={
        c["type"]: _text(c.get("reason")) or "" for c in _list(status.get("conditions"))
        if isinstance(c, dict) and isinstance(c.get("type"), str) and c.get("status") == "True"})


#: Most bytes of a pod's log read (``limitBytes``, and no more of the answer); a run's log
#: holds the results and the progress lines (about 100 bytes per rank every 2 s).
LOG_MAX_BYTES = 32 << 20
#: Most bytes of a list of objects read.
LIST_MAX_BYTES = 64 << 20
#: Seconds one watch request lasts (the API server's ``timeoutSeconds``); then it is
#: resumed from the last resource version seen.
WATCH_TIMEOUT_S = 120
#: Seconds to connect, and of silence after which a request counts as lost (a watch is
#: silent until its server ends it, at :data:`WATCH_TIMEOUT_S`).
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = WATCH_TIMEOUT_S + 30.0
#: Shortest wait between two batches of :meth:`KubeApi.watch` without updates (seconds).
MIN_TICK_S = 0.05
#: Kinds whose dependents an API delete orphans unless told otherwise (batch/v1 Jobs
#: keep their pods).
_BACKGROUND_DELETE = frozenset({"Job"})

T = TypeVar("T")


def api_error(what: str, e: BaseException) -> EnvbuildError:
    """The one-line error of a failed API call ``what`` (e.g. ``"create Job x"``)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    if isinstance(e, ApiException):
        body = e.body.decode("utf-8", "replace") if isinstance(e.body, bytes) else e.body
        reason = one_line(body or e.reason or e, 200)
        code = ExitCode.CHECK_FAILED if e.status in (400, 403, 409, 422) else ExitCode.UNREACHABLE
        return EnvbuildError(f"Kubernetes API: {what}: {e.status} {reason}", exit_code=code)
    if isinstance(e, ResourceNotFoundError):
        return EnvbuildError(f"Kubernetes API: {what}: the cluster does not serve this kind ({one_line(e, 200)})")
    return Unreachable(f"Kubernetes API: {what}: {one_line(e, 200)}")


def _call(what: str, fn: Callable[[], T], missing_ok: bool = False) -> T | None:
    """``fn()``, its errors as :func:`api_error`; None for a 404 when ``missing_ok``."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - urllib3/OS errors: cluster unreachable
        if missing_ok and getattr(e, "status", None) == 404:
            return None
        raise api_error(what, e) from None


def _read(response: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of an unread HTTP answer; the connection is closed."""
    try:
        return bytes(response.read(limit))
    finally:
        response.close()
        response.release_conn()


@functools.cache
def _discoverer() -> type:
    """The discoverer without its cache file (a predictable temp file a local user could plant)."""
    from kubernetes.dynamic.discovery import LazyDiscoverer

    class MemoryDiscoverer(LazyDiscoverer):
        def _write_cache(self) -> None:
            pass

    return MemoryDiscoverer


class KubeApi:
    """Contacts nothing before the first call; Unreachable (exit 3): no ``kubernetes`` package, a bad configuration."""

    def __init__(self, kubeconfig: str, context: str | None = None, namespace: str | None = None) -> None:
        self._client, context_namespace = api_client(kubeconfig, context)
        self.namespace: str = namespace or context_namespace or "default"
        self._dynamic: Any = None

    def _resource(self, api_version: str, kind: str) -> Any:
        """The dynamic client's resource of ``kind`` in ``api_version`` (discovery on first use)."""
        if self._dynamic is None:
            from kubernetes.dynamic import DynamicClient

            with tempfile.TemporaryDirectory(prefix="envbuild-k8s-") as private:  # no cache file is read
                self._dynamic = DynamicClient(self._client, cache_file=os.path.join(private, "discovery.json"),
                                              discoverer=_discoverer())
        prefix = "apis" if "/" in api_version else "api"
        return self._dynamic.resources.get(prefix=prefix, api_version=api_version, kind=kind)

    def create(self, obj: Mapping[str, Any]) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        _call(f"create {kind} {name}", lambda: _read(self._resource(obj["apiVersion"], kind).create(
            body=dict(obj), namespace=self.namespace, serialize=False), 1 << 20))

    def delete(self, obj: Mapping[str, Any]) -> None:
        """Delete a rendered object (a Job with its pods, in the background); a missing one is fine."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        extra = {"propagation_policy": "Background"} if kind in _BACKGROUND_DELETE else {}
        _call(f"delete {kind} {name}", lambda: _read(self._resource(obj["apiVersion"], kind).delete(
            name=name, namespace=self.namespace, serialize=False, **extra), 1 << 20), missing_ok=True)

    def delete_pods(self, selector: str) -> None:
        """Delete every pod matching the label ``selector`` (immediately)."""
        _call(f"delete pods {selector}", lambda: _read(self._resource("v1", "Pod").delete(
            namespace=self.namespace, label_selector=selector, grace_period_seconds=0, serialize=False), 1 << 20))

    def pods(self, job: str) -> list[PodState]:
        """The pods of Job ``job``, as :class:`~.cluster.PodState`, sorted by name."""
        what = f"list pods {JOB_NAME_LABEL}={job}"
        data = _call(what, lambda: _read(self._resource("v1", "Pod").get(
            namespace=self.namespace, label_selector=f"{JOB_NAME_LABEL}={job}", serialize=False), LIST_MAX_BYTES))
        doc = load_json(data or b"{}", f"Kubernetes API: {what}", ExitCode.UNREACHABLE)
        items = doc.get("items") if isinstance(doc, dict) else None
        return sorted((pod_state(p) for p in (items if isinstance(items, list) else []) if isinstance(p, dict)),
                      key=lambda p: p.name)

    def log(self, pod: str) -> str:
        """The pod's log, at most :data:`LOG_MAX_BYTES`; ``""`` when none (404, 400); EnvbuildError (exit 3): no API."""
        what = f"read log of pod {pod}"
        try:
            data = _call(what, lambda: _read(self._resource("v1", "Pod").log.get(
                name=pod, namespace=self.namespace, serialize=False,
                query_params=[("container", CONTAINER_NAME), ("limitBytes", LOG_MAX_BYTES)]), LOG_MAX_BYTES),
                missing_ok=True)
        except EnvbuildError as e:
            if e.exit_code == ExitCode.CHECK_FAILED:
                return ""
            raise
        return (data or b"").decode("utf-8", "replace")

    def watch(self, job: str, tick_s: float) -> Generator[list[Update], None, None]:
        """The Job's and pods' updates, at least every ``tick_s`` s; closing stops the watches; EnvbuildError."""
        events: queue.Queue[Update | EnvbuildError] = queue.Queue()
        watchers = [
            _Watcher(f"watch Job {job}", _call(f"watch Job {job}", lambda: self._resource("batch/v1", "Job")),
                     self.namespace, events, job_state, field_selector=f"metadata.name={job}"),
            _Watcher(f"watch pods of Job {job}", _call(f"watch pods of Job {job}", lambda: self._resource("v1", "Pod")),
                     self.namespace, events, pod_state, label_selector=f"{JOB_NAME_LABEL}={job}"),
        ]
        try:
            for w in watchers:
                w.start()
            while True:
                batch = _drain(events, max(tick_s, MIN_TICK_S))
                for item in batch:
                    if isinstance(item, EnvbuildError):
                        raise item
                yield [item for item in batch if not isinstance(item, EnvbuildError)]
        finally:
            for w in watchers:
                w.stop()


def _drain(events: queue.Queue[T], wait_s: float, limit: int = 1000) -> list[T]:
    """What ``events`` holds, after waiting at most ``wait_s`` for the first; at most ``limit``."""
    batch: list[T] = []
    try:
        batch.append(events.get(timeout=wait_s))
        while len(batch) < limit:
            batch.append(events.get_nowait())
    except queue.Empty:
        pass
    return batch


class _Watcher(threading.Thread):
    """Streams one resource's events into ``events``, resuming ended watches (from scratch after 410 Gone), a failure
    put as an EnvbuildError; a daemon: one connecting when stopped ends in :data:`WATCH_TIMEOUT_S`."""

    def __init__(self, what: str, resource: Any, namespace: str, events: queue.Queue[Any],
                 convert: Callable[..., JobState | PodState], **selectors: str) -> None:
        super().__init__(name=f"envbuild {what}", daemon=True)
        self.what, self.resource, self.namespace = what, resource, namespace
        self.events, self.convert, self.selectors = events, convert, selectors
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._watch: Any = None

    def stop(self) -> None:
        """End the watch (its connection is shut down)."""
        with self._lock:
            self._stopped.set()
            if self._watch is not None:
                self._watch.stop()

    def run(self) -> None:
        from kubernetes import watch

        version: str | None = None
        while not self._stopped.is_set():
            with self._lock:
                if self._stopped.is_set():
                    return
                self._watch = w = watch.Watch()
            began, seen = time.monotonic(), 0
            try:
                for event in w.stream(self.resource.get, namespace=self.namespace, resource_version=version,
                                      timeout_seconds=WATCH_TIMEOUT_S, serialize=False,
                                      _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), **self.selectors):
                    obj = event.get("raw_object")
                    if not isinstance(obj, dict):
                        continue
                    seen += 1
                    seen_version = _text(_dict(obj.get("metadata")).get("resourceVersion"))
                    version = seen_version if seen_version and len(seen_version) <= 64 else version
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.events.put(self.convert(obj, deleted=event["type"] == "DELETED"))
            except Exception as e:  # noqa: BLE001 - reported to the launcher
                if self._stopped.is_set():
                    return
                if getattr(e, "status", None) == 410:  # expired: start over from the current state
                    version = None
                    continue
                self.events.put(api_error(self.what, e))
                return
            if not seen and time.monotonic() - began < 1.0:
                self._stopped.wait(1.0)  # a server that ends watches at once: not in a tight loop
