"""Local Docker launcher: one container per simulated node on this Docker engine.

For a :class:`~builder.launchers.base.LaunchSpec` of N nodes with G GPUs each (P =
max(G, 1) processes per node), :meth:`LocalDockerLauncher.run`:

1. creates a private network ``envbuild-<run>`` (bridge, ``--internal``: no route out);
2. creates N containers ``envbuild-<run>-node-<i>`` (hostname and network alias
   ``node-<i>``), each running::

       python3 -m torch.distributed.run --nnodes N --nproc-per-node P --node-rank i \\
           --master-addr node-0 --master-port PORT --max-restarts 0 \\
           -m bench --out /results <bench args>

   with ``builder/bench`` mounted read-only at ``/opt/envbuild/bench``, ``builder/probe.py``
   at ``/opt/envbuild/probe.py`` (``PYTHONPATH=/opt/envbuild``; the image is never
   changed) and a host temporary folder (mode 0777) at ``/results``; as the arbitrary
   user ``12345:12345`` (no passwd entry), read-only root filesystem, tmpfs on ``/tmp``
   and ``HOME=/tmp/home``, all capabilities dropped, ``no-new-privileges``, ``shm_size``
   as asked, ``GLOO_SOCKET_IFNAME=eth0`` and ``NCCL_SOCKET_IFNAME=eth0``; with GPUs, node
   i gets GPUs i*G .. i*G+G-1 (Docker device requests) and ``NCCL_DEBUG=INFO``;
3. starts them (node 0 first) and waits until all exit, the deadline (``timeout_s``)
   passes, or, once a node exited non-zero, a grace period (``grace_s``, 20 s) passes;
   whatever still runs then is killed;
4. reads ``/results/rank-<r>.json`` of every rank, the node logs and exit codes, and the
   per-rank exit codes torchrun reports in its failure summary;
5. ALWAYS (``finally``, also on ``KeyboardInterrupt``; further SIGINT/SIGTERM are deferred
   until it is done) removes the containers (forced), the network, the temporary folder,
   and then everything labelled ``envbuild.run=<run>`` (:func:`builder.engine.remove_by_label`),
   so that an object created between a failure and the cleanup is not leaked.

Every container and the network carry :func:`builder.engine.run_labels` plus
``spec.labels`` plus the labels in the environment variable ``ENVBUILD_EXTRA_LABELS``
(``key=value,key2=value2``): meant for tests and CI, to tag everything a run creates so
that it can be found and checked or removed afterwards.

The bind mounts need the engine on this machine (``DOCKER_HOST`` a local socket).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping, Optional

import docker
import docker.errors
import docker.types
import requests

from builder import engine
from builder.errors import EnvbuildError, ExitCode, Unreachable

from .base import LaunchResult, LaunchSpec, OnProgress, result_problem

#: Where the rank results go inside each node.
RESULTS_MOUNT = "/results"
#: Where ``builder/bench`` is mounted (read-only) inside each node.
BENCH_MOUNT = "/opt/envbuild/bench"
#: Where ``builder/probe.py`` is mounted (read-only) inside each node.
PROBE_MOUNT = engine.PROBE_MOUNT
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
#: Result schema the bench writes (``builder/bench/__init__.py``).

_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


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
        if not sep or not _LABEL_KEY_RE.match(key):
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
    :func:`builder.engine.run_labels` (which win)."""
    return {**extra_labels_from_env(environ), **spec.labels, **engine.run_labels(spec.run_id)}


# --------------------------------------------------------------------------- container config


def in_image_sources() -> tuple[Path, Path]:
    """``(bench dir, probe.py)`` of the installed ``builder`` package (mounted into nodes).

    Raises:
        EnvbuildError: (exit 2) either is missing.
    """
    import builder

    root = Path(builder.__file__).resolve().parent
    bench, probe = root / "bench", root / "probe.py"
    for p in (bench / "__main__.py", probe):
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
    """Environment of node ``node``: the launcher's settings, then ``spec.env``."""
    env = {
        "PYTHONPATH": PYTHONPATH,
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": HOME,
        # getpass.getuser() looks at USER before the (missing) passwd entry
        "USER": "envbuild",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
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


def container_kwargs(
    spec: LaunchSpec,
    node: int,
    *,
    results_dir: str,
    network: str,
    labels: Mapping[str, str],
    bench_dir: Path,
    probe_path: Path,
    endpoint_config: object = None,
    user: str = RUN_USER,
) -> dict:
    """Keyword arguments of ``client.containers.create`` for node ``node`` (no engine call).

    ``endpoint_config``: the network endpoint (``client.api.create_endpoint_config``
    with the alias ``node-<i>``); None leaves the alias out (unit tests).
    """
    kw: dict = dict(
        image=spec.image,
        command=torchrun_argv(spec, node),
        name=node_name(spec.run_id, node),
        hostname=node_host(node),
        environment=node_env(spec, node),
        labels={**labels, "envbuild.node": str(node)},
        user=user,
        read_only=True,
        tmpfs={"/tmp": "rw,exec,mode=1777", HOME: "rw,mode=1777"},
        volumes={
            str(bench_dir): {"bind": BENCH_MOUNT, "mode": "ro"},
            str(probe_path): {"bind": PROBE_MOUNT, "mode": "ro"},
            str(results_dir): {"bind": RESULTS_MOUNT, "mode": "rw"},
        },
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        network=network,
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
_TR_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)", re.M)
_TR_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


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


def read_results(results_dir: str | os.PathLike, world_size: int) -> tuple[dict[int, dict], dict[int, str]]:
    """Read ``rank-<r>.json`` for r in 0..world_size-1.

    Returns:
        ``(results, problems)``: ``{rank: document}`` of the valid files and ``{rank:
        reason}`` for files that exist but are unreadable, not JSON, of another schema or
        of another rank. Absent files are in neither.
    """
    results: dict[int, dict] = {}
    problems: dict[int, str] = {}
    for rank in range(world_size):
        path = Path(results_dir) / f"rank-{rank}.json"
        if not path.exists():
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problems[rank] = f"unreadable result file: {type(e).__name__}: {e}"
            continue
        problem = result_problem(doc, rank, "result file")
        if problem:
            problems[rank] = problem
            continue
        results[rank] = doc
    return results, problems


def _count_results(results_dir: str) -> int:
    try:
        return sum(1 for n in os.listdir(results_dir) if n.startswith("rank-") and n.endswith(".json"))
    except OSError:
        return 0


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


# --------------------------------------------------------------------------- launcher


class LocalDockerLauncher:
    """Runs each simulated node as a container on the local Docker engine (see module doc).

    Args:
        client: a connected ``docker.DockerClient`` (:func:`builder.engine.connect`).
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
            return Unreachable(f"Docker engine: {what}: {engine._one_line(e, 200)}")
        return EnvbuildError(f"Docker engine: {what}: {engine._one_line(e, 300)}",
                             exit_code=ExitCode.UNREACHABLE)

    def _status(self, container) -> tuple[str, Optional[int]]:
        container.reload()
        state = container.attrs.get("State", {})
        return state.get("Status", "unknown"), state.get("ExitCode")

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
        bench_dir, probe_path = in_image_sources()
        try:
            self.client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            raise EnvbuildError("no such image", field="image", value=spec.image) from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            raise self._api_error(f"inspect image {spec.image}", e) from None

        containers: list = []
        network = None
        results_dir: Optional[str] = None
        cleanup_errors: list[str] = []
        try:
            results_dir = tempfile.mkdtemp(prefix=f"envbuild-{spec.run_id}-results-")
            os.chmod(results_dir, 0o777)  # the nodes write as an arbitrary UID
            net_name = network_name(spec.run_id)
            try:
                network = self.client.networks.create(net_name, driver="bridge", internal=True, labels=labels)
                for node in range(spec.nodes):
                    kw = container_kwargs(
                        spec, node, results_dir=results_dir, network=net_name, labels=labels,
                        bench_dir=bench_dir, probe_path=probe_path, user=self.user,
                        endpoint_config=self.client.api.create_endpoint_config(aliases=[node_host(node)]),
                    )
                    containers.append(self.client.containers.create(**kw))
                say(f"run {spec.run_id}: starting {spec.nodes} node(s) x {spec.nproc_per_node} rank(s)")
                started_at = utc_now_iso()
                t0 = time.monotonic()
                for c in containers:
                    c.start()
            except (docker.errors.APIError, requests.exceptions.RequestException, OSError) as e:
                raise self._api_error(f"launch of {spec.image}", e, spec.image) from None

            timed_out, killed_after = self._wait(spec, containers, results_dir, t0, say)

            # kill what still runs, then collect
            for c in containers:
                with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                    if self._status(c)[0] in ("running", "restarting", "paused", "created"):
                        c.kill()
            node_logs: dict[int, str] = {}
            node_exit: dict[int, Optional[int]] = {}
            for node, c in enumerate(containers):
                try:
                    with contextlib.suppress(requests.exceptions.RequestException):
                        c.wait(timeout=30)
                    status, code = self._status(c)
                    node_exit[node] = None if (node in killed_after or code is None) else code
                    node_logs[node] = c.logs(stdout=True, stderr=True).decode("utf-8", "replace")
                except (docker.errors.APIError, requests.exceptions.RequestException) as e:
                    node_exit[node] = None
                    node_logs[node] = f"(logs unavailable: {engine._one_line(e)})"
            rank_exit: dict[int, int] = {}
            for node, text in node_logs.items():
                for rank, code in parse_torchrun_failures(text).items():
                    rank_exit.setdefault(rank, code)
            results, problems = read_results(results_dir, spec.world_size)
            missing = [r for r in range(spec.world_size) if r not in results]
            say(f"run {spec.run_id}: {len(results)}/{spec.world_size} rank result(s)"
                + (" (timed out)" if timed_out else ""))
            result = LaunchResult(
                rank_results=results,
                node_logs=node_logs,
                node_exit_codes=node_exit,
                timed_out=timed_out,
                missing_ranks=missing,
                started_at=started_at,
                finished_at=utc_now_iso(),
                rank_exit_codes=rank_exit,
                rank_problems=problems,
                killed_after_s=self.grace_s if (killed_after and not timed_out) else None,
                cleanup_errors=cleanup_errors,  # filled in by the cleanup below
            )
            return result
        finally:
            try:
                with deferred_signals():
                    self._cleanup(spec, containers, network, results_dir, cleanup_errors)
            except KeyboardInterrupt:
                # a signal that came before the deferral took hold (or during the cleanup,
                # re-raised after it): make sure the cleanup ran to its end, then pass it on
                with deferred_signals():
                    self._cleanup(spec, containers, network, results_dir, cleanup_errors)
                raise

    def _wait(self, spec: LaunchSpec, containers: list, results_dir: str, t0: float,
              say: OnProgress) -> tuple[bool, set[int]]:
        """Wait for the nodes; returns ``(timed_out, nodes still running when given up)``."""
        deadline = t0 + spec.timeout_s
        grace_until: Optional[float] = None
        last_msg = ""
        while True:
            running: set[int] = set()
            failed: list[int] = []
            for node, c in enumerate(containers):
                try:
                    status, code = self._status(c)
                except docker.errors.NotFound:
                    status, code = "removed", None
                except (docker.errors.APIError, requests.exceptions.RequestException):
                    status, code = "running", None  # transient; look again
                if status in ("running", "restarting", "paused", "created"):
                    running.add(node)
                elif code != 0:
                    failed.append(node)
            if not running:
                return False, set()
            now = time.monotonic()
            if failed and grace_until is None:
                grace_until = min(deadline, now + self.grace_s)
                say(f"run {spec.run_id}: node(s) {', '.join(map(str, failed))} failed; "
                    f"giving the others {self.grace_s:g} s")
            if now >= deadline:
                return True, running
            if grace_until is not None and now >= grace_until:
                return False, running
            msg = (f"run {spec.run_id}: {len(running)}/{spec.nodes} node(s) running, "
                   f"{_count_results(results_dir)}/{spec.world_size} rank result(s), "
                   f"{now - t0:.0f} s of {spec.timeout_s:g} s")
            if msg != last_msg:
                say(msg)
                last_msg = msg
            time.sleep(self.poll_s)

    def _cleanup(self, spec: LaunchSpec, containers: list, network, results_dir: Optional[str],
                 errors: list[str]) -> None:
        """Remove containers, network, results folder and everything labelled with the run."""
        for c in containers:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                errors.append(f"remove container {c.name}: {engine._one_line(e)}")
        if network is not None:
            try:
                network.remove()
            except docker.errors.NotFound:
                pass
            except Exception as e:  # noqa: BLE001
                errors.append(f"remove network {network.name}: {engine._one_line(e)}")
        if results_dir and os.path.exists(results_dir):
            if sys.version_info >= (3, 12):
                shutil.rmtree(results_dir, onexc=_force_remove)
            else:
                shutil.rmtree(results_dir, onerror=_force_remove)
            if os.path.exists(results_dir):
                errors.append(f"remove {results_dir}: still there")
        # A create request cut short by an interrupt may still complete on the daemon after
        # the first sweep: when creation did not finish, sweep again a moment later.
        sweeps = 1 if len(containers) == spec.nodes else 2
        for i in range(sweeps):
            if i:
                time.sleep(SECOND_SWEEP_DELAY_S)
            try:
                engine.remove_by_label(self.client, f"{engine.RUN_LABEL}={spec.run_id}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"remove objects labelled {engine.RUN_LABEL}={spec.run_id}: "
                              f"{engine._one_line(e)}")


def _force_remove(func, path, exc) -> None:
    """``shutil.rmtree`` error handler: make the entry's folder writable and retry once."""
    try:
        parent = os.path.dirname(path)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        func(path)
    except OSError:
        pass
