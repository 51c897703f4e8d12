"""Local Docker launcher: one container per simulated node on this Docker engine.

For a :class:`~builder.launchers.base.LaunchSpec` of N nodes with G GPUs each (P =
max(G, 1) processes per node), :meth:`LocalDockerLauncher.run`:

1. removes the networks of earlier runs that ended without cleanup
   (:func:`builder.image.engine.remove_stale_networks`: deadline passed, no container) and
   names them in ``LaunchResult.removed_stale``;
2. creates a private network ``envbuild-<run>`` (bridge, ``--internal``: no route out),
   labelled with its deadline (:data:`builder.image.engine.DEADLINE_LABEL`: the start plus
   ``timeout_s`` plus :data:`WATCHDOG_MARGIN_S` plus :data:`NETWORK_SLACK_S`);
3. creates N containers ``envbuild-<run>-node-<i>`` (hostname and network alias
   ``node-<i>``), with Docker's ``--rm`` (``AutoRemove``), each running the node watchdog
   (:mod:`bench.node`) around torchrun::

       python3 -m bench.node --deadline-s TIMEOUT+10 -- \
           python3 -m torch.distributed.run --nnodes N --nproc-per-node P --node-rank i \
           --master-addr node-0 --master-port PORT --max-restarts 0 \
           -m bench --out /results <bench args> --result-to-stdout

   with the in-image code (``builder/agent``: ``bench/``, ``probe/``; the one payload of
   :mod:`builder.agent.payload`) mounted read-only at ``/opt/envbuild`` (``PYTHONPATH``;
   the image is never changed); as the arbitrary user ``12345:12345`` (no passwd entry), read-only root
   filesystem, tmpfs on ``/tmp``, ``HOME=/tmp/home`` and ``/results``, all capabilities
   dropped, ``no-new-privileges``, ``shm_size`` as asked; with GPUs, node i gets GPUs
   i*G .. i*G+G-1 (Docker device requests) and ``NCCL_DEBUG=INFO``. The socket settings
   are the image's own (its ``ENV``); only ``spec.socket_ifname`` (``--socket-ifname``)
   sets ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` (:func:`~builder.launchers.base.socket_env`);
4. attaches to every container's output BEFORE starting it (as ``docker run --rm`` does)
   and reads it as it comes: each rank prints progress lines (phase and heartbeat,
   :mod:`bench.progress`) and, at its end, its result document as one line; the rest is
   the node's log (the last :data:`LOG_KEEP_BYTES` kept);
5. starts them (node 0 first) and waits until all exit, the deadline (``timeout_s``)
   passes, or, once a node exited non-zero, a grace period (``grace_s``, 20 s) passes;
   whatever still runs then is killed, after the progress of every rank was noted
   (``LaunchResult.progress``: which rank stopped making progress, which wait for it);
6. ALWAYS (``finally``, also on ``KeyboardInterrupt``; further SIGINT/SIGTERM are deferred
   until it is done) removes the containers (forced; they normally removed themselves),
   the network, and then everything labelled ``envbuild.run=<run>``
   (:func:`builder.image.engine.remove_by_label`), so that an object created between a failure
   and the cleanup is not leaked.

**No results folder on the host.** The ranks write their result files to a tmpfs inside
their container and print the documents on stdout; the launcher reads them from the
container's output stream. Nothing on the host is writable by the containers, so no local
user can plant a rank result (the results folder used to be a host folder of mode 0777,
since the nodes run as another UID). Every result is checked against the run
(:func:`~builder.launchers.output.check_result`: schema, rank, run id, world size, the
:class:`~builder.launchers.model.RankResult` model; bounded by
:data:`~builder.launchers.model.MAX_RESULT_BYTES`) and must come from the node hosting that
rank (:class:`~builder.launchers.output.NodeOutput`).

**If envbuild dies** (SIGKILL, a crash), nothing is left running for long: the watchdog
ends each container :data:`WATCHDOG_MARGIN_S` seconds after the timeout and ``--rm``
removes it, so containers are gone within ``timeout_s`` + 30 s. The network cannot remove
itself; it carries its deadline and the next ``certify``/``make`` (or ``doctor --fix``,
through :func:`builder.image.engine.remove_stale_networks`) removes it.

Every container and the network carry :func:`builder.image.engine.run_labels` plus
``spec.labels`` plus the labels in the environment variable ``ENVBUILD_EXTRA_LABELS``
(``key=value,key2=value2``): meant for tests and CI, to tag everything a run creates so
that it can be found and checked or removed afterwards.

The bind mounts need the engine on this machine (``DOCKER_HOST`` a local socket).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import one_line
from builder.image import engine

from .base import (
    HOME,
    MOUNT_POINT,
    RESULTS_MOUNT,
    RUN_USER,
    LaunchResult,
    LaunchSpec,
    OnProgress,
    agent_dir,
    deferred_signals,
    labels_for,
    node_env,
    torchrun_argv,
    utc_now_iso,
)
from .model import RankResult
from .output import LineBuffer, NodeOutput, parse_torchrun_failures, problems_by_rank
from .phases import PhaseClock, phase_times
from .progress import ProgressTracker

#: Seconds the other nodes get once one node exited non-zero, before they are killed.
DEFAULT_GRACE_S = 20.0
#: Seconds between two looks at the containers while waiting.
POLL_S = 0.5
#: Seconds before the second cleanup sweep by label (only when creation was cut short).
SECOND_SWEEP_DELAY_S = 1.0
#: Seconds after ``timeout_s`` at which a node's watchdog ends it by itself (the host
#: normally ends it first, at ``timeout_s``).
WATCHDOG_MARGIN_S = 10.0
#: Seconds after the watchdogs' deadline at which the run's network counts as stale.
NETWORK_SLACK_S = 5.0
#: Seconds to wait for the engine to remove the containers before removing the network.
REMOVAL_WAIT_S = 15.0


# --------------------------------------------------------------------------- container config


def network_name(run_id: str) -> str:
    """Name of the private network of run ``run_id``: ``envbuild-<run_id>``."""
    return f"envbuild-{run_id}"


def node_name(run_id: str, node: int) -> str:
    """Container name of node ``node`` of run ``run_id``: ``envbuild-<run_id>-node-<i>``."""
    return f"envbuild-{run_id}-node-{node}"


def node_host(node: int) -> str:
    """Hostname and network alias of node ``node``: ``node-<i>``."""
    return f"node-{node}"


def gpu_ids(spec: LaunchSpec, node: int) -> list[str]:
    """GPU indices given to node ``node``: ``i*G .. i*G+G-1`` as strings; [] on CPU."""
    g = spec.gpus_per_node
    return [str(i) for i in range(node * g, node * g + g)] if g > 0 else []


def node_argv(spec: LaunchSpec, node: int) -> list[str]:
    """The container command of node ``node``: the watchdog (deadline ``timeout_s`` +
    :data:`WATCHDOG_MARGIN_S`) around :func:`~builder.launchers.base.torchrun_argv` (master
    ``node-0``), the bench printing its result."""
    deadline = f"{float(spec.timeout_s) + WATCHDOG_MARGIN_S:g}"
    return ["python3", "-m", "bench.node", "--deadline-s", deadline, "--",
            *torchrun_argv(spec, node, master_addr=node_host(0))]


def container_kwargs(
    spec: LaunchSpec,
    node: int,
    *,
    network: str,
    labels: Mapping[str, str],
    code_dir: Path,
    endpoint_config: object = None,
    user: str = RUN_USER,
) -> dict[str, Any]:
    """Keyword arguments of ``client.api.create_container`` (through
    ``client.containers.create``) for node ``node`` (no engine call).

    ``code_dir``: the in-image code (:func:`~builder.launchers.base.agent_dir`), mounted
    read-only at :data:`~builder.launchers.base.MOUNT_POINT`. ``endpoint_config``: the
    network endpoint (``client.api.create_endpoint_config`` with the alias ``node-<i>``);
    None leaves the alias out (unit tests).
    """
    kw: dict[str, Any] = dict(
        image=spec.image,
        command=node_argv(spec, node),
        name=node_name(spec.run_id, node),
        hostname=node_host(node),
        environment=node_env(spec, node),
        labels={**labels, "envbuild.node": str(node)},
        user=user,
        read_only=True,
        tmpfs={"/tmp": "rw,exec,mode=1777", HOME: "rw,mode=1777", RESULTS_MOUNT: "rw,mode=1777"},
        volumes={str(code_dir): {"bind": MOUNT_POINT, "mode": "ro"}},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        network=network,
        auto_remove=True,
        detach=True,
    )
    if endpoint_config is not None:
        kw["networking_config"] = {network: endpoint_config}
    if spec.shm_size:
        kw["shm_size"] = spec.shm_size
    ids = gpu_ids(spec, node)
    if ids:
        kw["device_requests"] = [docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
    return kw


# --------------------------------------------------------------------------- one node


class NodeWatch:
    """What one node container says and how it ends, read by two daemon threads.

    :meth:`attach` (before the container starts) reads its output stream line by line into
    ``output`` (:class:`~builder.launchers.output.NodeOutput`: progress, checked results,
    the log). :meth:`watch_exit` waits (in a thread) for the engine to remove the container
    and keeps its exit status. ``done`` is set when the output stream ended (the container
    stopped).
    """

    def __init__(self, node: int, container_id: str, spec: LaunchSpec, tracker: ProgressTracker) -> None:
        self.node = node
        self.id = container_id
        self.output = NodeOutput(node, spec, tracker)
        self.exit_code: int | None = None
        self.done = threading.Event()
        self.exited = threading.Event()
        self.stream: Any = None

    @property
    def results(self) -> dict[int, RankResult]:
        """The results this node printed so far, checked."""
        return self.output.results

    # -- output
    def attach(self, client: docker.DockerClient) -> None:
        """Attach to the container's output and start reading it (call before start).

        Raises: docker/requests errors from the engine.
        """
        self.stream = engine.attach_output(client, self.id)
        threading.Thread(target=self._read, name=f"envbuild-node-{self.node}-output", daemon=True).start()

    def _read(self) -> None:
        buffers = (LineBuffer(), LineBuffer())  # stdout, stderr
        try:
            for frame in self.stream:
                for which, data in enumerate(frame):
                    for line in buffers[which].feed(data or b""):
                        self.output.raw_line(line, stdout=which == 0)
        except Exception as e:  # noqa: BLE001 - the stream broke: say so in the log
            self.output.keep(f"(output of node {self.node} cut short: {one_line(e, 200)})")
        finally:
            for which, buf in enumerate(buffers):
                for line in buf.rest():
                    self.output.raw_line(line, stdout=which == 0)
            self.done.set()

    # -- exit
    def watch_exit(self, client: docker.DockerClient) -> None:
        """Start waiting (in a thread) for the engine to remove the container; keeps its
        exit status (call before start: ``--rm`` containers vanish when they end)."""
        def wait() -> None:
            try:
                self.exit_code = int(client.api.wait(self.id, timeout=None, condition="removed")["StatusCode"])
            except Exception:  # noqa: BLE001 - gone before the wait was seen: status unknown
                pass
            finally:
                self.exited.set()
        threading.Thread(target=wait, name=f"envbuild-node-{self.node}-exit", daemon=True).start()

    def close(self) -> None:
        """End the output stream (it normally ends by itself when the container stops)."""
        with contextlib.suppress(Exception):
            if self.stream is not None:
                self.stream.close()


# --------------------------------------------------------------------------- launcher


class LocalDockerLauncher:
    """Runs each simulated node as a container on the local Docker engine (see module doc).

    Args:
        client: a connected ``docker.DockerClient`` (:func:`builder.image.engine.connect`).
        grace_s: seconds the others get once a node exited non-zero.
        poll_s: seconds between looks at the containers.
        user: ``uid:gid`` the nodes run as.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        poll_s: float = POLL_S,
        user: str = RUN_USER,
    ) -> None:
        self.client = client
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.user = user

    # -- engine helpers

    def _api_error(self, what: str, e: Exception, image: str | None = None) -> EnvbuildError:
        if isinstance(e, docker.errors.ImageNotFound):
            return EnvbuildError("no such image", field="image", value=image or what)
        if isinstance(e, (requests.exceptions.RequestException, OSError)):
            return Unreachable(f"Docker engine: {what}: {one_line(e, 200)}")
        return EnvbuildError(f"Docker engine: {what}: {one_line(e, 300)}",
                             exit_code=ExitCode.UNREACHABLE)

    def _kill(self, watch: NodeWatch) -> None:
        """Kill a node's container (SIGKILL; the engine kills a paused one too); gone
        already is fine."""
        with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
            self.client.api.kill(watch.id)

    # -- the launch

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        """Launch ``spec`` (see the module doc) and return what the ranks produced.

        Raises:
            EnvbuildError: (exit 2) no such image, bad ``ENVBUILD_EXTRA_LABELS``;
                (exit 3) the engine failed to create or start something.
            KeyboardInterrupt: passed on, after the cleanup.
        """
        say = on_progress or (lambda msg: None)
        labels = labels_for(spec)
        code_dir = agent_dir()
        try:
            self.client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            raise EnvbuildError("no such image", field="image", value=spec.image) from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            raise self._api_error(f"inspect image {spec.image}", e) from None

        watches: list[NodeWatch] = []
        state: dict[str, Any] = {"network": None, "created": 0}
        cleanup_errors: list[str] = []
        clock, phases = PhaseClock(), list[tuple[str, float]]()  # completed after the cleanup (teardown)
        tracker = ProgressTracker(spec.world_size, spec.run_id)
        try:
            clock.mark("launch")
            stale = self._remove_stale(say)
            t0, started_at = self._start(spec, labels, code_dir, tracker, watches, state, say)
            clock.mark("started")
            timed_out, given_up, progress = self._wait(spec, watches, tracker, t0, say)
            result = self._collect(spec, watches, tracker, timed_out, given_up, progress, started_at,
                                   stale, cleanup_errors, say)
            clock.mark("ended")
            result.phases = phases
            return result
        finally:
            clock.mark("ended")
            try:
                with deferred_signals():
                    self._cleanup(spec, watches, state, cleanup_errors)
            except KeyboardInterrupt:
                # a signal that came before the deferral took hold (or during the cleanup,
                # re-raised after it): make sure the cleanup ran to its end, then pass it on
                with deferred_signals():
                    self._cleanup(spec, watches, state, cleanup_errors)
                raise
            clock.mark("removed")
            phases[:] = phase_times(clock.marks, tracker.phase_starts(), spec.world_size)

    def _remove_stale(self, say: OnProgress) -> list[str]:
        """Remove the networks of earlier runs whose deadline passed (one line each)."""
        try:
            removed = engine.remove_stale_networks(self.client)
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            return [f"could not look for stale networks: {one_line(e, 200)}"]
        lines = [f"removed network {n['name']} of run {n['run']}, left behind by an envbuild that "
                 f"did not clean up (its deadline {n['deadline']} passed)" for n in removed]
        for line in lines:
            say(line)
        return lines

    def _start(self, spec: LaunchSpec, labels: dict[str, str], code_dir: Path, tracker: ProgressTracker,
               watches: list[NodeWatch], state: dict[str, Any], say: OnProgress) -> tuple[float, str]:
        """Create the network and the containers, attach, start; ``(t0, started_at)``."""
        net_name = network_name(spec.run_id)
        deadline = time.time() + float(spec.timeout_s) + WATCHDOG_MARGIN_S + NETWORK_SLACK_S
        net_labels = {**labels, engine.DEADLINE_LABEL: engine.deadline_label(deadline)}
        try:
            state["network"] = self.client.networks.create(net_name, driver="bridge", internal=True,
                                                           labels=net_labels)
            for node in range(spec.nodes):
                kw = container_kwargs(
                    spec, node, network=net_name, labels=labels, code_dir=code_dir, user=self.user,
                    endpoint_config=self.client.api.create_endpoint_config(aliases=[node_host(node)]),
                )
                c = self.client.containers.create(**kw)
                state["created"] += 1
                watch = NodeWatch(node, c.id, spec, tracker)
                watches.append(watch)
                watch.attach(self.client)
                watch.watch_exit(self.client)
            say(f"run {spec.run_id}: starting {spec.nodes} node(s) x {spec.nproc_per_node} rank(s)")
            started_at = utc_now_iso()
            t0 = time.monotonic()
            for w in watches:
                self.client.api.start(w.id)
        except (docker.errors.APIError, requests.exceptions.RequestException, OSError) as e:
            raise self._api_error(f"launch of {spec.image}", e, spec.image) from None
        return t0, started_at

    def _node_code(self, w: NodeWatch) -> int | None:
        if w.exit_code is None and w.done.is_set():
            w.exited.wait(5.0)  # the engine reports the status once it removed the container
        return w.exit_code

    def _wait(self, spec: LaunchSpec, watches: list[NodeWatch], tracker: ProgressTracker, t0: float,
              say: OnProgress) -> tuple[bool, set[int], dict[int, dict]]:
        """Wait for the nodes; ``(timed_out, nodes still running when given up, progress
        snapshot at that moment)``."""
        deadline = t0 + spec.timeout_s
        grace_until: float | None = None
        last_msg = ""
        while True:
            running = {w.node for w in watches if not w.done.is_set()}
            failed = [w.node for w in watches if w.done.is_set() and self._node_code(w) not in (0,)]
            if not running:
                return False, set(), tracker.snapshot()
            now = time.monotonic()
            if failed and grace_until is None:
                grace_until = min(deadline, now + self.grace_s)
                say(f"run {spec.run_id}: node(s) {', '.join(map(str, failed))} failed; "
                    f"giving the others {self.grace_s:g} s")
            if now >= deadline:
                return True, running, tracker.snapshot()
            if grace_until is not None and now >= grace_until:
                return False, running, tracker.snapshot()
            reported = sum(len(w.results) for w in watches)
            msg = (f"run {spec.run_id}: {len(running)}/{spec.nodes} node(s) running, "
                   f"{reported}/{spec.world_size} rank result(s), {now - t0:.0f} s of {spec.timeout_s:g} s")
            if msg != last_msg:
                say(msg)
                last_msg = msg
            time.sleep(self.poll_s)

    def _collect(self, spec: LaunchSpec, watches: list[NodeWatch], tracker: ProgressTracker, timed_out: bool,
                 given_up: set[int], progress: dict[int, dict], started_at: str, stale: list[str],
                 cleanup_errors: list[str], say: OnProgress) -> LaunchResult:
        """Kill what still runs, wait for the output to end, build the result."""
        for w in watches:
            if w.node in given_up:
                self._kill(w)
        for w in watches:
            if not w.done.wait(30.0):
                w.close()
                w.done.wait(5.0)
        results: dict[int, RankResult] = {}
        node_logs: dict[int, str] = {}
        node_exit: dict[int, int | None] = {}
        rank_exit: dict[int, int] = {}
        for w in watches:
            code = self._node_code(w)
            node_exit[w.node] = None if w.node in given_up else code
            node_logs[w.node] = w.output.log()
            results.update(w.results)
            for rank, rcode in parse_torchrun_failures(node_logs[w.node]).items():
                rank_exit.setdefault(rank, rcode)
        problems = problems_by_rank([w.output for w in watches], results, spec.world_size)
        say(f"run {spec.run_id}: {len(results)}/{spec.world_size} rank result(s)"
            + (" (timed out)" if timed_out else ""))
        return LaunchResult(
            rank_results=results, node_logs=node_logs, node_exit_codes=node_exit, timed_out=timed_out,
            missing_ranks=[r for r in range(spec.world_size) if r not in results],
            started_at=started_at, finished_at=utc_now_iso(), rank_exit_codes=rank_exit,
            rank_problems=problems,
            killed_after_s=self.grace_s if (given_up and not timed_out) else None,
            cleanup_errors=cleanup_errors,  # filled in by the cleanup
            progress=progress, socket_seen=dict(tracker.socket), interfaces_seen=dict(tracker.interfaces),
            removed_stale=stale,
        )

    def _cleanup(self, spec: LaunchSpec, watches: list[NodeWatch], state: dict[str, Any], errors: list[str]) -> None:
        """Remove containers (they normally removed themselves), the network and
        everything labelled with the run."""
        for w in watches:
            try:
                self.client.api.remove_container(w.id, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    errors.append(f"remove container {node_name(spec.run_id, w.node)}: {one_line(e)}")
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                errors.append(f"remove container {node_name(spec.run_id, w.node)}: {one_line(e)}")
            w.close()
        run_filter = f"{engine.RUN_LABEL}={spec.run_id}"
        # one list call (no inspect per container: a container removed between a list and its
        # inspect raised NotFound and ended this wait early, leaving one still being removed)
        until = time.monotonic() + REMOVAL_WAIT_S
        with contextlib.suppress(Exception):
            while self.client.api.containers(all=True, filters={"label": run_filter}) and time.monotonic() < until:
                time.sleep(0.2)
        network = state.get("network")
        if network is not None:
            try:
                network.remove()
            except docker.errors.NotFound:
                pass
            except Exception as e:  # noqa: BLE001
                errors.append(f"remove network {network.name}: {one_line(e)}")
        # A create request cut short by an interrupt may still complete on the daemon after
        # the first sweep: when creation did not finish, sweep again a moment later.
        sweeps = 1 if state.get("created") == spec.nodes else 2
        for i in range(sweeps):
            if i:
                time.sleep(SECOND_SWEEP_DELAY_S)
            try:
                engine.remove_by_label(self.client, run_filter)
            except Exception as e:  # noqa: BLE001
                errors.append(f"remove objects labelled {run_filter}: {one_line(e)}")
