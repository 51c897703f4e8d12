"""What the launcher sees of a cluster: the states of a Job and its pods, and the
:class:`ClusterApi` seam (:class:`~.api.KubeApi` over the ``kubernetes`` client; tests pass
stand-ins with the same methods).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .pod import CONTAINER_NAME, INDEX_ANNOTATION

_INDEX_RE = re.compile(r"[0-9]{1,9}")


@dataclass
class PodState:
    """What the launcher needs to know about one pod (plain data).

    Attributes:
        name: pod name.
        node: completion index (the envbuild node), None when the annotation is missing.
        phase: ``Pending``, ``Running``, ``Succeeded``, ``Failed`` or ``Unknown``.
        exit_code: the container's exit status once terminated, else None.
        waiting_reason: e.g. ``ImagePullBackOff`` while the container waits, else None.
        message: the waiting or termination message, if any.
        host: the Kubernetes node the pod runs on, if scheduled.
        deleted: the pod is gone (a watch's ``DELETED`` event).
    """

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
    """The Job's conditions whose status is ``True``: ``{type: reason}`` (e.g.
    ``{"Failed": "DeadlineExceeded"}``); ``deleted``: the Job is gone."""

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
    """The calls :class:`~.launcher.K8sLauncher` makes.

    ``watch(job, tick_s)`` yields lists of updates of the Job ``job`` and of its pods (label
    ``batch.kubernetes.io/job-name``), starting with their current states; an empty list
    when ``tick_s`` seconds passed without one. Closing the generator ends the watch.
    """

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
    """A :class:`PodState` from a Pod object of the API (a dict); malformed fields read as
    absent."""
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
