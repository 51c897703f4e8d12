"""A stand-in for a Kubernetes cluster on the local Docker engine, for tests only.

:class:`DockerKubeApi` has the methods of :class:`builder.launchers.k8s.api.KubeApi` (the
:class:`~builder.launchers.k8s.api.ClusterApi` seam), so the real
:class:`~builder.launchers.k8s.launcher.K8sLauncher` can apply rendered manifests to it. It
plays the parts of the API server, the Job controller and the kubelet for what envbuild's
manifests use, read from the rendered objects (nothing is taken from envbuild's code):

* ConfigMap: its ``data`` is kept; a ``configMap`` volume with ``items`` becomes a
  folder holding each key at its ``path`` (mode ``defaultMode``), bind-mounted read-only.
* Service (headless): the pods of its ``selector`` get the DNS name
  ``<hostname>.<service>`` as a network alias on a private (internal) network.
* Indexed Job: ``completions`` containers; pod i has hostname ``<job>-<i>``, the annotation
  ``batch.kubernetes.io/job-completion-index`` (read by ``fieldRef``), the variable
  ``JOB_COMPLETION_INDEX`` (injected as the Job controller does), ``$(VAR)`` expanded in
  ``command``/``args`` (``$$`` escapes), ``emptyDir`` volumes as tmpfs (``medium: Memory``
  at ``/dev/shm`` as the shm size from ``sizeLimit``), ``runAsUser``/``runAsGroup``,
  ``readOnlyRootFilesystem``, dropped capabilities and no privilege escalation.
  ``backoffLimit: 0``: once a pod fails the Job is ``Failed`` (``BackoffLimitExceeded``) and
  the running pods are deleted; ``activeDeadlineSeconds``: then ``Failed``
  (``DeadlineExceeded``), running pods deleted; all succeeded: ``Complete``.

Its watch looks at the containers every ``tick_s`` and reports the Job's state and every
pod's (a pod whose container is gone as deleted). Everything it creates carries the labels
given (the test session's) and the pods' own.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Generator, Mapping
from typing import Any

import docker.errors

from builder.image.engine import Engine
from builder.launchers.k8s.api import JobState, PodState, Update
from builder.launchers.k8s.objects import INDEX_ANNOTATION, JOB_NAME_LABEL

_VAR_RE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of ``command``/``args``: a defined variable is
    replaced, an undefined one left as is, ``$$`` gives ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_RE.sub(sub, text)


def docker_size(quantity: str) -> str:
    """A Kubernetes binary quantity (``256Mi``) as a Docker size (``256m``)."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", quantity)
    assert m, quantity
    return m.group(1) + {"Ki": "k", "Mi": "m", "Gi": "g", "Ti": "t", None: ""}[m.group(2)]


class DockerKubeApi:
    """See the module doc. ``labels``: put on every Docker object (for the session cleanup)."""

    namespace = "docker-stand-in"

    def __init__(self, client: Engine, labels: Mapping[str, str]) -> None:
        self.client = client
        self.labels = dict(labels)
        self.configmaps: dict[str, dict] = {}
        self.services: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.dirs: list[str] = []
        self.networks: dict[str, Any] = {}
        self.status: dict[str, tuple[str, str]] = {}  # job -> (condition type, reason)

    # -- API server

    def create(self, obj: Mapping[str, Any]) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "ConfigMap":
            self.configmaps[name] = obj
        elif kind == "Service":
            assert obj["spec"]["clusterIP"] == "None"
            self.services[name] = obj
        elif kind == "Job":
            self.jobs[name] = {"obj": obj, "started": time.monotonic(), "containers": []}
            self._start_job(name)
        else:
            raise AssertionError(f"the stand-in does not run {kind}")

    def delete(self, obj: Mapping[str, Any]) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "Job" and name in self.jobs:
            for c in self.jobs.pop(name)["containers"]:
                self._remove(c)
            net = self.networks.pop(name, None)
            if net is not None:
                net.remove()
        elif kind == "ConfigMap":
            self.configmaps.pop(name, None)
        elif kind == "Service":
            self.services.pop(name, None)
        if not self.jobs:
            for d in self.dirs:
                shutil.rmtree(d, ignore_errors=True)
            self.dirs.clear()

    def delete_pods(self, selector: str) -> None:
        key, _, value = selector.partition("=")
        for c in self.client.sdk.containers.list(all=True, filters={"label": f"{key}={value}"}):
            self._remove(c)

    # -- Job controller

    def watch(self, job: str, tick_s: float) -> Generator[list[Update], None, None]:
        previous: dict[str, PodState] = {}
        while True:
            state = self._job_state(job)  # first: a failed Job's controller deletes the running pods
            pods = {p.name: p for p in self.pods(job)}
            gone = [PodState(name=n, node=p.node, phase=p.phase, deleted=True)
                    for n, p in previous.items() if n not in pods]
            previous = pods
            yield [state, *pods.values(), *gone]
            time.sleep(tick_s)

    def _job_state(self, name: str) -> JobState:
        job = self.jobs[name]
        if name not in self.status:
            spec = job["obj"]["spec"]
            states = [self._state(c) for c in job["containers"]]
            if any(s[0] == "exited" and s[1] != 0 for s in states):
                self.status[name] = ("Failed", "BackoffLimitExceeded")
            elif all(s == ("exited", 0) for s in states):
                self.status[name] = ("Complete", "")
            elif time.monotonic() - job["started"] > spec["activeDeadlineSeconds"]:
                self.status[name] = ("Failed", "DeadlineExceeded")
            if self.status.get(name, ("",))[0] == "Failed":  # the controller deletes the active pods
                for c in list(job["containers"]):
                    if self._state(c)[0] != "exited":
                        self._remove(c)
                        job["containers"].remove(c)
        if name not in self.status:
            return JobState(name)
        kind, reason = self.status[name]
        return JobState(name, {kind: reason})

    def pods(self, job: str) -> list[PodState]:
        out = []
        for c in sorted(self.client.sdk.containers.list(all=True, filters={"label": f"{JOB_NAME_LABEL}={job}"}),
                        key=lambda c: c.name):
            status, code = self._state(c)
            phase = {"created": "Pending", "running": "Running"}.get(status)
            if phase is None:
                phase = "Succeeded" if code == 0 else "Failed"
            out.append(PodState(name=c.name, node=int(c.labels[INDEX_ANNOTATION]), phase=phase,
                                exit_code=code if status == "exited" else None, host="docker"))
        return out

    def log(self, pod: str) -> str:
        try:
            return self.client.sdk.containers.get(pod).logs(stdout=True, stderr=True).decode("utf-8", "replace")
        except docker.errors.NotFound:
            return ""

    # -- kubelet

    def _state(self, c) -> tuple[str, int | None]:
        try:
            c.reload()
        except docker.errors.NotFound:
            return "exited", 137
        st = c.attrs["State"]
        return st["Status"], st.get("ExitCode")

    def _remove(self, c) -> None:
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            pass

    def _volume_dir(self, cm: Mapping[str, Any], vol: Mapping[str, Any]) -> str:
        d = tempfile.mkdtemp(prefix="envbuild-k8s-cm-")
        self.dirs.append(d)
        os.chmod(d, 0o755)
        mode = vol.get("defaultMode", 0o644)
        for item in vol["items"]:
            path = os.path.join(d, item["path"])
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(cm["data"][item["key"]])
            os.chmod(path, mode)
        return d

    def _start_job(self, name: str) -> None:
        job = self.jobs[name]
        spec = job["obj"]["spec"]
        assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
        pod = spec["template"]["spec"]
        (ctr,) = pod["containers"]
        svc = self.services[pod["subdomain"]]
        assert svc["spec"]["selector"] == {JOB_NAME_LABEL: name}
        net = self.client.sdk.networks.create(f"{name}-net", driver="bridge", internal=True, labels=self.labels)
        self.networks[name] = net
        volumes = {v["name"]: v for v in pod["volumes"]}
        binds: dict[str, dict] = {}
        tmpfs: dict[str, str] = {}
        shm_size = None
        for m in ctr["volumeMounts"]:
            v = volumes[m["name"]]
            if "configMap" in v:
                d = self._volume_dir(self.configmaps[v["configMap"]["name"]], v["configMap"])
                binds[d] = {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
            elif m["mountPath"] == "/dev/shm":
                assert v["emptyDir"]["medium"] == "Memory"
                shm_size = docker_size(v["emptyDir"]["sizeLimit"])
            else:
                tmpfs[m["mountPath"]] = "rw,exec,mode=1777"
        sc, psc = ctr["securityContext"], pod["securityContext"]
        assert psc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
        for i in range(spec["completions"]):
            hostname = f"{name}-{i}"
            env = {"JOB_COMPLETION_INDEX": str(i)}
            for e in ctr["env"]:
                if "value" in e:
                    env[e["name"]] = expand(e["value"], env)
                else:
                    assert e["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{INDEX_ANNOTATION}']"
                    env[e["name"]] = str(i)
            command = [expand(a, env) for a in ctr["command"]]
            args = [expand(a, env) for a in ctr["args"]]
            labels = {**self.labels, **spec["template"]["metadata"]["labels"], JOB_NAME_LABEL: name,
                      INDEX_ANNOTATION: str(i)}
            c = self.client.sdk.containers.create(
                ctr["image"], entrypoint=command[:1], command=command[1:] + args, name=hostname,
                hostname=hostname, environment=env, labels=labels,
                user=f"{psc['runAsUser']}:{psc['runAsGroup']}", read_only=True, tmpfs=tmpfs, volumes=binds,
                cap_drop=["ALL"], security_opt=["no-new-privileges"], shm_size=shm_size, network=net.name,
                mem_limit=docker_size(ctr["resources"]["limits"]["memory"]),  # the kubelet's cgroup limit
                networking_config={net.name: self.client.sdk.api.create_endpoint_config(
                    aliases=[hostname, f"{hostname}.{svc['metadata']['name']}"])},
                detach=True,
            )
            job["containers"].append(c)
        for c in job["containers"]:
            c.start()
