"""Local Docker launcher: one container per simulated node on this Docker engine."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.core.clock import utc_stamp
from builder.core.documents import RankResult
from builder.core.errors import Unreachable
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
)
from .output import LineBuffer, NodeOutput, log_events, parse_torchrun_failures, problems_by_rank
from .phases import PhaseClock, phase_times, stalled_phase
from .progress import ProgressTracker, phase_text

#: Seconds the other nodes get once one node exited non-zero, before they are killed.
DEFAULT_GRACE_S = 20.0
#: Ranks the engine is asked to run per CPU it reports (``docker info`` NCPU), and memory per
#: rank (bytes): a cpu-torch2 node (torchrun and one rank) holds about 470 MiB during the
#: checks (``docker stats``), doubled for the larger profiles. Beyond this a run swaps or
#: times out instead of certifying anything.
RANKS_PER_CPU = 4
RANK_MEMORY_BYTES = 1 << 30
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
#: Seconds after the watchdogs' deadline at which the reaper removes what is left (a
#: paused node: its watchdog is frozen with it).
REAPER_SLACK_S = 5.0


def start_reaper(run_id: str, after_s: float) -> subprocess.Popen[bytes]:
    """Start :mod:`.reaper` in its own session (it outlives a SIGKILL of envbuild), no pipe of ours."""
    return subprocess.Popen([sys.executable, "-m", "builder.launchers.reaper", run_id, f"{after_s:g}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


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
    """The container command of node ``node``: torchrun under a watchdog, so the node ends itself."""
    deadline = f"{float(spec.timeout_s) + WATCHDOG_MARGIN_S:g}"
    return ["python3", "-m", "bench.node", "--deadline-s", deadline, "--",
            *torchrun_argv(spec, node, master_addr=node_host(0))]


def container_kwargs(spec: LaunchSpec, node: int, *, network: str, labels: Mapping[str, str], code_dir: Path,
                     user: str = RUN_USER, memory: str | None = None) -> dict[str, Any]:
    """Keyword arguments of :meth:`~builder.image.engine.Engine.create_container` for node ``node``."""
    kw: dict[str, Any] = dict(image=spec.image, command=node_argv(spec, node), name=node_name(spec.run_id, node),
                              hostname=node_host(node), environment=node_env(spec, node),
                              labels={**labels, "envbuild.node": str(node)}, user=user, read_only=True,
                              tmpfs={"/tmp": "rw,exec,mode=1777", HOME: "rw,mode=1777", RESULTS_MOUNT: "rw,mode=1777"},
                              volumes={str(code_dir): {"bind": MOUNT_POINT, "mode": "ro"}}, cap_drop=["ALL"],
                              security_opt=["no-new-privileges"], network=network, aliases=[node_host(node)],
                              auto_remove=True, detach=True, gpus=gpu_ids(spec, node))
    if spec.shm_size:
        kw["shm_size"] = spec.shm_size
    if memory:
        kw["mem_limit"] = kw["memswap_limit"] = memory
    return kw


# --------------------------------------------------------------------------- one node


class NodeWatch:
    """What one node container says and how it ends, read by two daemon threads."""

    def __init__(self, node: int, container_id: str, spec: LaunchSpec, tracker: ProgressTracker) -> None:
        self.node = node
        self.id = container_id
        self.output = NodeOutput(node, spec, tracker)
        self.exit_code: int | None = None
        self.memory = 0  # the container's memory limit in bytes (0: none)
        self.done = threading.Event()
        self.exited = threading.Event()
        self.stream: Any = None

    @property
    def results(self) -> dict[int, RankResult]:
        """The results this node printed so far, checked."""
        return self.output.results

    # -- output
    def attach(self, client: engine.Engine) -> None:
        """Attach to the container's output and start reading it (call before start); Unreachable (exit 3)."""
        self.stream = client.attach_output(self.id)
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
    def watch_exit(self, client: engine.Engine) -> None:
        """Wait (in a thread) for the engine to remove the container, keeping its status (before start: ``--rm``)."""
        def wait() -> None:
            try:
                self.exit_code = client.wait(self.id, condition="removed")
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


def check_capacity(nodes: int, nproc_per_node: int, info: Mapping[str, Any]) -> None:
    """Refuse more local nodes than the engine (``docker info``) runs, before starting; exit 3 says why."""
    ncpu, memory = max(1, int(info.get("NCPU") or 1)), int(info.get("MemTotal") or 0)
    ranks = min(ncpu * RANKS_PER_CPU, memory // RANK_MEMORY_BYTES) if memory else ncpu * RANKS_PER_CPU
    limit = max(1, ranks // max(1, nproc_per_node))
    if nodes > limit:
        raise Unreachable(
            f"{nodes} local node(s) of {nproc_per_node} rank(s) are more than this Docker engine runs: at most "
            f"{limit} ({RANKS_PER_CPU} ranks per CPU of its {ncpu}, {RANK_MEMORY_BYTES >> 20} MiB of its "
            f"{memory >> 20} MiB memory per rank); give --nodes {limit} or fewer, or run on a cluster "
            "(--launcher slurm or k8s)")


class LocalDockerLauncher:
    def __init__(self, client: engine.Engine, *, grace_s: float = DEFAULT_GRACE_S, poll_s: float = POLL_S,
                 user: str = RUN_USER, memory: str | None = None, machines: list[int] | None = None,
                 node_options: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        self.client = client
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.user = user
        self.memory = memory
        #: node i of a run is machine ``machines[i]`` (default i), created with that machine's
        #: extra container options (``node_options``: ``nano_cpus``, ``environment`` merged), so
        #: that a bisection's runs over part of the nodes meet the same machines
        self.machines = machines
        self.node_options = dict(node_options or {})

    def on(self, machines: list[int]) -> LocalDockerLauncher:
        """The same launcher, its nodes the given machines."""
        return LocalDockerLauncher(self.client, grace_s=self.grace_s, poll_s=self.poll_s, user=self.user,
                                   memory=self.memory, machines=list(machines), node_options=self.node_options)

    # -- the launch

    def run(self, spec: LaunchSpec, on_progress: OnProgress | None = None) -> LaunchResult:
        """EnvbuildError: (exit 3) no such image, too many nodes, the engine failed; also exit 2."""
        say = on_progress or (lambda msg: None)
        labels = labels_for(spec)
        code_dir = agent_dir()
        check_capacity(spec.nodes, spec.nproc_per_node, self.client.info())
        self.client.image(spec.image)

        watches: list[NodeWatch] = []
        state: dict[str, Any] = {"network": None, "created": 0}
        cleanup_errors: list[str] = []
        clock, phases = PhaseClock(), list[tuple[str, float]]()  # completed after the cleanup (teardown)
        tracker = ProgressTracker(spec.world_size, spec.run_id)
        ending: dict[str, Any] = {"timed_out": False, "progress": {}}  # how the wait ended
        try:
            clock.mark("launch")
            stale = self._remove_stale(say)
            state["events"], oom = self._watch_oom(spec.run_id)
            t0, started_at = self._start(spec, labels, code_dir, tracker, watches, state, say)
            clock.marks.setdefault("started", t0)  # the deadline's clock: taken before the nodes start
            timed_out, given_up, progress = self._wait(spec, watches, tracker, t0, say)
            ending.update(timed_out=timed_out, progress=progress)
            result = self._collect(spec, watches, tracker, timed_out, given_up, progress, started_at,
                                   stale, cleanup_errors, say)
            result.oom_killed = {w.node: w.memory for w in watches if w.node in oom}
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
            starts = tracker.phase_starts()
            phases[:] = phase_times(clock.marks, starts, spec.world_size,
                                    stalled_phase(ending["progress"], starts, spec.world_size), ending["timed_out"])

    def _watch_oom(self, run_id: str) -> tuple[Any, set[int]]:
        """The run's ``oom`` events from before it starts: ``(stream, set of nodes named, filled as they come)``."""
        seen: set[int] = set()
        try:
            stream = self.client.events({"type": "container", "event": "oom", "label": f"{engine.RUN_LABEL}={run_id}"})
        except Unreachable:
            return None, seen

        def read() -> None:
            with contextlib.suppress(Exception):  # the stream closed: the run is over
                for ev in stream:
                    node = str(((ev.get("Actor") or {}).get("Attributes") or {}).get("envbuild.node", ""))
                    if node.isdigit() and len(node) < 7:
                        seen.add(int(node))
        threading.Thread(target=read, name=f"envbuild-{run_id}-events", daemon=True).start()
        return stream, seen

    def _remove_stale(self, say: OnProgress) -> list[str]:
        """Remove the networks of earlier runs whose deadline passed (one line each)."""
        try:
            removed = self.client.remove_stale_networks()
        except Unreachable as e:
            return [f"could not look for stale networks: {one_line(e.message, 200)}"]
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
        state["network"] = self.client.create_network(net_name, net_labels)
        for node in range(spec.nodes):
            kw = container_kwargs(spec, node, network=net_name, labels=labels, code_dir=code_dir, user=self.user,
                                  memory=self.memory)
            for k, v in self.node_options.get(self.machines[node] if self.machines else node, {}).items():
                kw[k] = {**kw[k], **v} if isinstance(v, Mapping) and isinstance(kw.get(k), Mapping) else v
            c = self.client.create_container(**kw)
            state["created"] += 1
            watch = NodeWatch(node, c.id, spec, tracker)
            watch.memory = int((c.doc.get("HostConfig") or {}).get("Memory") or 0)
            watches.append(watch)
            watch.attach(self.client)
            watch.watch_exit(self.client)
        # the reaper's clock starts with the nodes' (creation may be slow under load)
        state["reaper"] = start_reaper(spec.run_id, float(spec.timeout_s) + WATCHDOG_MARGIN_S + REAPER_SLACK_S)
        say(f"run {spec.run_id}: starting {spec.nodes} node(s) x {spec.nproc_per_node} rank(s)")
        started_at = utc_stamp()
        t0 = time.monotonic()
        for w in watches:
            self.client.start(w.id)
        return t0, started_at

    def _node_code(self, w: NodeWatch) -> int | None:
        if w.exit_code is None and w.done.is_set():
            w.exited.wait(5.0)  # the engine reports the status once it removed the container
        return w.exit_code

    def _wait(self, spec: LaunchSpec, watches: list[NodeWatch], tracker: ProgressTracker, t0: float,
              say: OnProgress) -> tuple[bool, set[int], dict[int, dict]]:
        """``(timed_out, nodes still running when given up, progress snapshot then)``."""
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
            phases = sorted({phase_text(p) for p in tracker.snapshot(now).values()})
            msg = (f"run {spec.run_id}: {len(running)}/{spec.nodes} node(s) running, "
                   + (f"phase {', '.join(phases)}, " if phases else "")
                   + f"{reported}/{spec.world_size} rank result(s), {now - t0:.0f} s of {spec.timeout_s:g} s")
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
                self.client.kill(w.id)
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
            started_at=started_at, finished_at=utc_stamp(), rank_exit_codes=rank_exit,
            rank_problems=problems,
            killed_after_s=self.grace_s if (given_up and not timed_out) else None,
            cleanup_errors=cleanup_errors,  # filled in by the cleanup
            progress=progress, socket_seen=dict(tracker.socket), interfaces_seen=dict(tracker.interfaces),
            removed_stale=stale,
            log_events=[e for w in watches for e in log_events(spec, w.node, w.output.log_lines())],
        )

    def _cleanup(self, spec: LaunchSpec, watches: list[NodeWatch], state: dict[str, Any], errors: list[str]) -> None:
        """Remove everything labelled with the run (containers normally removed themselves); end the reaper."""
        try:
            self._remove_all(spec, watches, state, errors)
        finally:
            reaper = state.pop("reaper", None)
            if reaper is not None:
                reaper.kill()
                reaper.wait()

    def _remove_all(self, spec: LaunchSpec, watches: list[NodeWatch], state: dict[str, Any], errors: list[str]) -> None:
        for w in watches:
            try:
                self.client.remove_container(w.id)
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                errors.append(f"remove container {node_name(spec.run_id, w.node)}: {one_line(e)}")
            w.close()
        with contextlib.suppress(Exception):
            if state.get("events") is not None:
                state["events"].close()
        run_filter = f"{engine.RUN_LABEL}={spec.run_id}"
        # one list call (no inspect per container: a container removed between a list and its
        # inspect raised NotFound and ended this wait early, leaving one still being removed)
        until = time.monotonic() + REMOVAL_WAIT_S
        with contextlib.suppress(Exception):
            while self.client.containers([run_filter], inspect=False) and time.monotonic() < until:
                time.sleep(0.2)
        if state.get("network") is not None:
            try:
                self.client.remove_network(state["network"])
            except Exception as e:  # noqa: BLE001
                errors.append(f"remove network {network_name(spec.run_id)}: {one_line(e)}")
        # A create request cut short by an interrupt may still complete on the daemon after
        # the first sweep: when creation did not finish, sweep again a moment later.
        sweeps = 1 if state.get("created") == spec.nodes else 2
        for i in range(sweeps):
            if i:
                time.sleep(SECOND_SWEEP_DELAY_S)
            try:
                self.client.remove_by_label(run_filter)
            except Exception as e:  # noqa: BLE001
                errors.append(f"remove objects labelled {run_filter}: {one_line(e)}")
