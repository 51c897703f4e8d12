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

   with ``builder/agent/bench`` mounted read-only at ``/opt/envbuild/bench``, ``builder/agent/probe/``
   at ``/opt/envbuild/probe`` (``PYTHONPATH=/opt/envbuild``; the image is never
   changed); as the arbitrary user ``12345:12345`` (no passwd entry), read-only root
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
(:func:`~builder.launchers.base.result_problem`: schema, rank, run id, world size; bounded
by :data:`~builder.launchers.base.MAX_RESULT_BYTES`) and must come from the node hosting
that rank.

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

import collections
import contextlib
import datetime
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping, Optional

import docker
import docker.errors
import docker.types
import requests

from builder.image import engine
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import one_line

from .base import MAX_RESULT_BYTES, PROGRESS_PREFIX, RESULT_PREFIX, LaunchResult, LaunchSpec, OnProgress, ProgressTracker, parse_result_line, result_problem, socket_env

#: Where the rank results go inside each node.
RESULTS_MOUNT = "/results"
#: Where ``builder/agent/bench`` is mounted (read-only) inside each node.
BENCH_MOUNT = "/opt/envbuild/bench"
#: Where the ``builder/agent/probe/`` package is mounted (read-only) inside each node.
PROBE_MOUNT = "/opt/envbuild/probe"
#: ``PYTHONPATH`` inside each node: makes ``-m bench`` and ``import probe`` work.
PYTHONPATH = "/opt/envbuild"
#: The arbitrary user the nodes run as; deliberately without a passwd entry.
RUN_USER = "12345:12345"
#: ``HOME`` inside each node (on the ``/tmp`` tmpfs).
HOME = "/tmp/home"
#: Seconds the other nodes get once one node exited non-zero, before they are killed.
DEFAULT_GRACE_S = 20.0
#: Seconds between two looks at the containers while waiting.
POLL_S = 0.5
#: Seconds before the second cleanup sweep by label (only when creation was cut short).
SECOND_SWEEP_DELAY_S = 1.0
#: Environment variable with extra labels ``key=value,...`` (for tests and CI).
EXTRA_LABELS_ENV = "ENVBUILD_EXTRA_LABELS"
#: Seconds after ``timeout_s`` at which a node's watchdog ends it by itself (the host
#: normally ends it first, at ``timeout_s``).
WATCHDOG_MARGIN_S = 10.0
#: Seconds after the watchdogs' deadline at which the run's network counts as stale.
NETWORK_SLACK_S = 5.0
#: Bytes of each node's log kept (the end; progress and result lines are not log).
LOG_KEEP_BYTES = 4 << 20
#: Seconds to wait for the engine to remove the containers before removing the network.
REMOVAL_WAIT_S = 15.0

_LABEL_KEY_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._/-]*\Z")


def utc_now_iso() -> str:
    """Current UTC time, ISO 8601 with seconds and ``Z``: ``"2026-05-12T10:00:00Z"``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- labels


def parse_extra_labels(text: str | None) -> dict[str, str]:
    """Parse ``"key=value,key2=value2"`` (blanks around items ignored) into a dict.

    ``None`` or ``""`` gives ``{}``. Values may be empty (``"key="``).

    Raises:
        EnvbuildError: (exit 2) an item has no ``=`` or its key is not a label key.
    """
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _LABEL_KEY_RE.fullmatch(key):
            raise EnvbuildError(
                "expected key=value[,key=value...]", field=EXTRA_LABELS_ENV, value=text
            )
        labels[key] = value.strip()
    return labels


def extra_labels_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels in ``$ENVBUILD_EXTRA_LABELS`` (see :func:`parse_extra_labels`)."""
    environ = os.environ if environ is None else environ
    return parse_extra_labels(environ.get(EXTRA_LABELS_ENV))


def labels_for(spec: LaunchSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of everything a launch creates: env extras, then ``spec.labels``, then
    :func:`builder.image.engine.run_labels` (which win)."""
    return {**extra_labels_from_env(environ), **spec.labels, **engine.run_labels(spec.run_id)}


# --------------------------------------------------------------------------- container config


def in_image_sources() -> tuple[Path, Path]:
    """``(bench dir, probe package dir)`` of the installed ``builder`` package (mounted into nodes).

    Raises:
        EnvbuildError: (exit 2) either is missing.
    """
    from builder import agent

    root = Path(agent.__file__).resolve().parent
    bench, probe = root / "bench", root / "probe"
    for p in (bench / "__main__.py", probe / "__main__.py"):
        if not p.is_file():
            raise EnvbuildError("missing from the envbuild package", field="file", value=str(p))
    return bench, probe


def network_name(run_id: str) -> str:
    """Name of the private network of run ``run_id``: ``envbuild-<run_id>``."""
    return f"envbuild-{run_id}"


def node_name(run_id: str, node: int) -> str:
    """Container name of node ``node`` of run ``run_id``: ``envbuild-<run_id>-node-<i>``."""
    return f"envbuild-{run_id}-node-{node}"


def node_host(node: int) -> str:
    """Hostname and network alias of node ``node``: ``node-<i>``."""
    return f"node-{node}"


def torchrun_argv(spec: LaunchSpec, node: int) -> list[str]:
    """The command of node ``node``: torchrun (static rendezvous on node-0) running the bench."""
    return [
        "python3", "-m", "torch.distributed.run",
        "--nnodes", str(spec.nodes),
        "--nproc-per-node", str(spec.nproc_per_node),
        "--node-rank", str(node),
        "--master-addr", node_host(0),
        "--master-port", str(spec.port),
        "--max-restarts", "0",
        "-m", "bench", "--out", RESULTS_MOUNT,
        *spec.bench_args,
    ]


def node_env(spec: LaunchSpec, node: int) -> dict[str, str]:
    """Environment of node ``node``: the launcher's settings, the ``--socket-ifname``
    override (:func:`~builder.launchers.base.socket_env`; without it the image's own
    ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``, if any, stay in effect), then ``spec.env``."""
    env = {
        "PYTHONPATH": PYTHONPATH,
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": HOME,
        # getpass.getuser() looks at USER before the (missing) passwd entry
        "USER": "envbuild",
        **socket_env(spec.socket_ifname),
        "ENVBUILD_RUN_ID": spec.run_id,
        "ENVBUILD_NODE": str(node),
        "ENVBUILD_IMAGE": spec.image,  # the probe records the image in use (node report)
    }
    if spec.backend == "nccl":
        env["NCCL_DEBUG"] = "INFO"
    env.update(spec.env)
    return env


def gpu_ids(spec: LaunchSpec, node: int) -> list[str]:
    """GPU indices given to node ``node``: ``i*G .. i*G+G-1`` as strings; [] on CPU."""
    g = spec.gpus_per_node
    return [str(i) for i in range(node * g, node * g + g)] if g > 0 else []


def node_argv(spec: LaunchSpec, node: int) -> list[str]:
    """The container command of node ``node``: the watchdog (deadline ``timeout_s`` +
    :data:`WATCHDOG_MARGIN_S`) around :func:`torchrun_argv`, the bench printing its result."""
    deadline = f"{float(spec.timeout_s) + WATCHDOG_MARGIN_S:g}"
    return ["python3", "-m", "bench.node", "--deadline-s", deadline, "--",
            *torchrun_argv(spec, node), "--result-to-stdout"]


def container_kwargs(
    spec: LaunchSpec,
    node: int,
    *,
    network: str,
    labels: Mapping[str, str],
    bench_dir: Path,
    probe_path: Path,
    endpoint_config: object = None,
    user: str = RUN_USER,
) -> dict:
    """Keyword arguments of ``client.api.create_container`` (through
    ``client.containers.create``) for node ``node`` (no engine call).

    ``endpoint_config``: the network endpoint (``client.api.create_endpoint_config``
    with the alias ``node-<i>``); None leaves the alias out (unit tests).
    """
    kw: dict = dict(
        image=spec.image,
        command=node_argv(spec, node),
        name=node_name(spec.run_id, node),
        hostname=node_host(node),
        environment=node_env(spec, node),
        labels={**labels, "envbuild.node": str(node)},
        user=user,
        read_only=True,
        tmpfs={"/tmp": "rw,exec,mode=1777", HOME: "rw,mode=1777", RESULTS_MOUNT: "rw,mode=1777"},
        volumes={
            str(bench_dir): {"bind": BENCH_MOUNT, "mode": "ro"},
            str(probe_path): {"bind": PROBE_MOUNT, "mode": "ro"},
        },
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


# --------------------------------------------------------------------------- reading results

# torchrun's failure summary (torch.distributed.elastic ChildFailedError), per failed rank:
#   rank      : 1 (local_rank: 0)
#   exitcode  : 3 (pid: 45)
_TR_RANK_RE = re.compile(r"\s*rank\s*:\s*(\d{1,9})\s*\(local_rank:\s*\d{1,9}\)")
_TR_EXIT_RE = re.compile(r"\s*exitcode\s*:\s*(-?\d{1,9})")


def parse_torchrun_failures(text: str) -> dict[int, int]:
    """``{global rank: exit status}`` from torchrun's failure summary in a node log.

    Signals appear as negative statuses (``-9`` for SIGKILL), as torchrun prints them.
    Ranks that torchrun did not list are absent; ``{}`` when there is no summary.
    """
    out: dict[int, int] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _TR_RANK_RE.match(line)
        if not m:
            continue
        for nxt in lines[i + 1 : i + 4]:
            e = _TR_EXIT_RE.match(nxt)
            if e:
                out.setdefault(int(m.group(1)), int(e.group(1)))
                break
    return out


def read_results(results_dir: str | os.PathLike, world_size: int, run_id: Optional[str] = None
                 ) -> tuple[dict[int, dict], dict[int, str]]:
    """Read ``rank-<r>.json`` for r in 0..world_size-1 (the Slurm launcher's run folder).

    Each file is read with :func:`builder.core.inputs.read_json` (a regular file of at most
    :data:`~builder.launchers.base.MAX_RESULT_BYTES`, bounded JSON) and checked with
    :func:`~builder.launchers.base.result_problem` (schema, rank, world size, and the run
    id when ``run_id`` is given).

    Returns:
        ``(results, problems)``: ``{rank: document}`` of the valid files and ``{rank:
        reason}`` for files that exist but are unreadable, not JSON, of another schema,
        rank, run or world size. Absent files are in neither.
    """
    from builder.core.inputs import read_json

    results: dict[int, dict] = {}
    problems: dict[int, str] = {}
    for rank in range(world_size):
        path = Path(results_dir) / f"rank-{rank}.json"
        if not os.path.lexists(path):
            continue
        try:
            doc = read_json(path, MAX_RESULT_BYTES, "result file", ExitCode.UNREACHABLE)
        except EnvbuildError as e:
            problems[rank] = f"unreadable result file: {e}"
            continue
        problem = result_problem(doc, rank, "result file", run_id=run_id, world_size=world_size)
        if problem:
            problems[rank] = problem
            continue
        results[rank] = doc
    return results, problems


# --------------------------------------------------------------------------- signals


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold off SIGINT and SIGTERM while cleaning up; re-raise one afterwards.

    In the main thread only (elsewhere a no-op). A signal received inside raises
    ``KeyboardInterrupt`` once the block is done, so a second Ctrl-C cannot cut the
    cleanup short.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def _note(signum, frame):
        received.append(signum)

    old = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            old[s] = signal.signal(s, _note)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if received:
            raise KeyboardInterrupt(signal.Signals(received[0]).name)


# --------------------------------------------------------------------------- one node


class NodeWatch:
    """What one node container says and how it ends, read by two daemon threads.

    :meth:`attach` (before the container starts) reads its output stream: progress lines
    go to ``tracker``, result lines become ``results``/``problems`` (checked against the
    run; a rank the node does not host is refused), everything else is the log (the last
    :data:`LOG_KEEP_BYTES`). :meth:`watch_exit` waits (in a thread) for the engine to
    remove the container and keeps its exit status. ``done`` is set when the output
    stream ended (the container stopped).
    """

    def __init__(self, node: int, container_id: str, spec: LaunchSpec, tracker: ProgressTracker) -> None:
        self.node = node
        self.id = container_id
        self.spec = spec
        self.tracker = tracker
        self.results: dict[int, dict] = {}
        self.problems: dict[int, str] = {}
        self.exit_code: Optional[int] = None
        self.done = threading.Event()
        self.exited = threading.Event()
        self.stream = None
        self._log: collections.deque[str] = collections.deque()
        self._log_bytes = 0
        self._mu = threading.Lock()

    # -- output
    def attach(self, client) -> None:
        """Attach to the container's output and start reading it (call before start).

        Raises: docker/requests errors from the engine.
        """
        self.stream = engine.attach_output(client, self.id)
        threading.Thread(target=self._read, name=f"envbuild-node-{self.node}-output", daemon=True).start()

    def _read(self) -> None:
        parts = {0: [], 1: []}  # partial line per stream (stdout, stderr)
        sizes = {0: 0, 1: 0}
        try:
            for frame in self.stream:
                for which, data in enumerate(frame):
                    if data:
                        self._take(which, data, parts, sizes)
        except Exception as e:  # noqa: BLE001 - the stream broke: say so in the log
            self._keep(f"(output of node {self.node} cut short: {one_line(e, 200)})")
        finally:
            for which in (0, 1):
                if parts[which]:
                    self._line(which, b"".join(parts[which]))
            self.done.set()

    def _take(self, which: int, data: bytes, parts: dict, sizes: dict) -> None:
        while data:
            cut = data.find(b"\n")
            if cut < 0:
                if sizes[which] <= MAX_RESULT_BYTES + 64:  # longer: dropped, noted at its end
                    parts[which].append(data)
                sizes[which] += len(data)
                return
            parts[which].append(data[:cut])
            line = b"".join(parts[which]) if sizes[which] + cut <= MAX_RESULT_BYTES + 64 else None
            parts[which], sizes[which] = [], 0
            data = data[cut + 1:]
            if line is None:
                self._keep(f"(node {self.node}: a line over {MAX_RESULT_BYTES} bytes was dropped)")
            else:
                self._line(which, line)

    def _line(self, which: int, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if which == 0 and text.startswith(PROGRESS_PREFIX):
            if self.tracker.feed(text):
                return
        elif which == 0 and text.startswith(RESULT_PREFIX):
            self._result(text)
            return
        self._keep(text)

    def _result(self, text: str) -> None:
        doc, why = parse_result_line(text, self.node)
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if why is not None or type(rank) is not int:
            with self._mu:
                self.problems.setdefault(-1 - len(self.problems), why or "a result without a rank")
            return
        if rank not in self.spec.ranks_of_node(self.node):
            why = f"result of rank {rank} printed by node {self.node}, which does not host it"
        else:
            why = result_problem(doc, rank, "result", run_id=self.spec.run_id, world_size=self.spec.world_size)
        with self._mu:
            if why:
                self.problems[rank] = why
            else:
                self.results[rank] = doc
                self.problems.pop(rank, None)

    def _keep(self, text: str) -> None:
        with self._mu:
            self._log.append(text)
            self._log_bytes += len(text) + 1
            while self._log_bytes > LOG_KEEP_BYTES and len(self._log) > 1:
                self._log_bytes -= len(self._log.popleft()) + 1

    def log(self) -> str:
        """The node's log kept so far (text, newline-terminated lines)."""
        with self._mu:
            return "".join(line + "\n" for line in self._log)

    # -- exit
    def watch_exit(self, client) -> None:
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

    def _api_error(self, what: str, e: Exception, image: Optional[str] = None) -> EnvbuildError:
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

    def run(self, spec: LaunchSpec, on_progress: Optional[OnProgress] = None) -> LaunchResult:
        """Launch ``spec`` (see the module doc) and return what the ranks produced.

        Raises:
            EnvbuildError: (exit 2) no such image, bad ``ENVBUILD_EXTRA_LABELS``;
                (exit 3) the engine failed to create or start something.
            KeyboardInterrupt: passed on, after the cleanup.
        """
        say = on_progress or (lambda msg: None)
        labels = labels_for(spec)
        sources = in_image_sources()
        try:
            self.client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            raise EnvbuildError("no such image", field="image", value=spec.image) from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            raise self._api_error(f"inspect image {spec.image}", e) from None

        watches: list[NodeWatch] = []
        state: dict = {"network": None, "created": 0}
        cleanup_errors: list[str] = []
        try:
            stale = self._remove_stale(say)
            tracker = ProgressTracker(spec.world_size, spec.run_id)
            t0, started_at = self._start(spec, labels, sources, tracker, watches, state, say)
            timed_out, given_up, progress = self._wait(spec, watches, tracker, t0, say)
            return self._collect(spec, watches, tracker, timed_out, given_up, progress, started_at,
                                 stale, cleanup_errors, say)
        finally:
            try:
                with deferred_signals():
                    self._cleanup(spec, watches, state, cleanup_errors)
            except KeyboardInterrupt:
                # a signal that came before the deferral took hold (or during the cleanup,
                # re-raised after it): make sure the cleanup ran to its end, then pass it on
                with deferred_signals():
                    self._cleanup(spec, watches, state, cleanup_errors)
                raise

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

    def _start(self, spec: LaunchSpec, labels: dict, sources: tuple[Path, Path], tracker: ProgressTracker,
               watches: list, state: dict, say: OnProgress) -> tuple[float, str]:
        """Create the network and the containers, attach, start; ``(t0, started_at)``."""
        bench_dir, probe_path = sources
        net_name = network_name(spec.run_id)
        deadline = time.time() + float(spec.timeout_s) + WATCHDOG_MARGIN_S + NETWORK_SLACK_S
        net_labels = {**labels, engine.DEADLINE_LABEL: engine.deadline_label(deadline)}
        try:
            state["network"] = self.client.networks.create(net_name, driver="bridge", internal=True,
                                                           labels=net_labels)
            for node in range(spec.nodes):
                kw = container_kwargs(
                    spec, node, network=net_name, labels=labels, bench_dir=bench_dir,
                    probe_path=probe_path, user=self.user,
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

    def _node_code(self, w: NodeWatch) -> Optional[int]:
        if w.exit_code is None and w.done.is_set():
            w.exited.wait(5.0)  # the engine reports the status once it removed the container
        return w.exit_code

    def _wait(self, spec: LaunchSpec, watches: list, tracker: ProgressTracker, t0: float,
              say: OnProgress) -> tuple[bool, set[int], dict]:
        """Wait for the nodes; ``(timed_out, nodes still running when given up, progress
        snapshot at that moment)``."""
        deadline = t0 + spec.timeout_s
        grace_until: Optional[float] = None
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

    def _collect(self, spec: LaunchSpec, watches: list, tracker: ProgressTracker, timed_out: bool,
                 given_up: set[int], progress: dict, started_at: str, stale: list[str],
                 cleanup_errors: list[str], say: OnProgress) -> LaunchResult:
        """Kill what still runs, wait for the output to end, build the result."""
        for w in watches:
            if w.node in given_up:
                self._kill(w)
        for w in watches:
            if not w.done.wait(30.0):
                w.close()
                w.done.wait(5.0)
        results: dict[int, dict] = {}
        problems: dict[int, str] = {}
        node_logs: dict[int, str] = {}
        node_exit: dict[int, Optional[int]] = {}
        rank_exit: dict[int, int] = {}
        for w in watches:
            code = self._node_code(w)
            node_exit[w.node] = None if w.node in given_up else code
            node_logs[w.node] = w.log()
            results.update(w.results)
            problems.update({r: why for r, why in w.problems.items() if r not in results})
            for rank, rcode in parse_torchrun_failures(node_logs[w.node]).items():
                rank_exit.setdefault(rank, rcode)
        for r in list(problems):
            if r < 0:  # a result without a usable rank: shown on the first missing rank
                why = problems.pop(r)
                first = next((m for m in range(spec.world_size) if m not in results and m not in problems), None)
                if first is not None:
                    problems[first] = why
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

    def _cleanup(self, spec: LaunchSpec, watches: list, state: dict, errors: list[str]) -> None:
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
        until = time.monotonic() + REMOVAL_WAIT_S
        with contextlib.suppress(Exception):
            while self.client.containers.list(all=True, filters={"label": run_filter}) and time.monotonic() < until:
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
