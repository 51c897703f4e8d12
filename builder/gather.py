"""Gather node reports, and run scripts on nodes, for ``envbuild verify`` and ``doctor``.

Four sources, each giving a list of :class:`builder.nodereport.Node` in a stable order:

* report files (:func:`from_files`): one node report per file;
* running containers on this Docker engine (:func:`from_containers`): the probe is run in
  each with ``docker exec python3 -c <probe.py>`` (nothing is copied into the container);
  ``ENVBUILD_IMAGE``, ``ENVBUILD_IMAGE_ID``, ``ENVBUILD_IMAGE_DIGEST`` and
  ``ENVBUILD_RUNTIME_VERSION`` tell the probe which image and engine it runs under;
* hosts over ssh (:func:`from_ssh`): the system ``ssh`` client in BatchMode (never a
  password prompt) with ``ConnectTimeout``, running ``python3 -`` with the probe on stdin,
  one thread per host and a deadline per host;
* Slurm (:func:`from_slurm`): one ``srun --ntasks-per-node=1 --label`` job step running
  ``python3 -`` with the probe on stdin on every node; the ``N: `` prefixes of ``--label``
  split the output per task.

A node that cannot be checked (unreachable, timed out, no python3, a report that does
not validate) is returned with ``error`` set (exit 3 material) and never stops the others.
Nodes that can run scripts carry a :class:`Target` (``node.target``) used by ``doctor``.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from . import nodereport
from .errors import EnvbuildError, ExitCode, Unreachable
from .nodereport import InvalidReport, Node

#: Seconds one node may take to produce its report (the probe imports torch and loads
#: every libnccl it finds in a subprocess).
DEFAULT_TIMEOUT_S = 120.0
#: ``ssh -o ConnectTimeout`` in seconds.
DEFAULT_CONNECT_TIMEOUT_S = 5
#: The interpreter run on remote nodes.
DEFAULT_PYTHON = "python3"

_PKG = Path(__file__).resolve().parent


def probe_source() -> str:
    """The text of ``builder/probe.py`` (run on nodes as a script)."""
    return (_PKG / "probe.py").read_text(encoding="utf-8")


def agent_source() -> str:
    """The text of ``builder/doctor_agent.py`` (run on nodes as a script)."""
    return (_PKG / "doctor_agent.py").read_text(encoding="utf-8")


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _last_line(text: str) -> str:
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return _one_line(lines[-1]) if lines else "no output"


# --------------------------------------------------------------------------- running scripts


@dataclass
class Completed:
    """A finished script: exit status (None if unknown), stdout and stderr text."""

    rc: int | None
    stdout: str
    stderr: str


class Running:
    """A script running on a node; stdout arrives line by line.

    Subclasses start the work and feed :meth:`_line` / :meth:`_finish` from a thread.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._out: list[str] = []
        self._err: list[str] = []
        self._done = threading.Event()
        self.rc: int | None = None

    def _line(self, line: str) -> None:
        self._out.append(line)
        self._lines.put(line)

    def _finish(self, rc: int | None) -> None:
        self.rc = rc
        self._done.set()
        self._lines.put(None)

    def readline(self, timeout_s: float) -> str | None:
        """The next stdout line (without newline); None at the end or after ``timeout_s``."""
        try:
            line = self._lines.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if line is None:
            self._lines.put(None)  # keep signalling the end
        return line

    def wait(self, timeout_s: float) -> Completed:
        """Wait for the end; returns what it printed.

        Raises:
            Unreachable: (exit 3) still running after ``timeout_s`` (it is killed first).
        """
        if not self._done.wait(max(0.0, timeout_s)):
            self.kill()
            raise Unreachable(f"no answer within {timeout_s:g} s", field=self.where)
        return Completed(self.rc, "\n".join(self._out) + ("\n" if self._out else ""),
                         "".join(self._err))

    def kill(self) -> None:  # pragma: no cover - overridden
        """Stop the script (best effort)."""


class _ProcessRunning(Running):
    """A local process (``ssh``, ``srun``) with the script text on its stdin."""

    def __init__(self, argv: Sequence[str], stdin_text: str, where: str) -> None:
        super().__init__(where)
        try:
            self.proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        except OSError as e:
            raise Unreachable(f"cannot run {argv[0]}: {e.strerror or e}", field=where) from None
        threading.Thread(target=self._feed, args=(stdin_text,), daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _feed(self, text: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(text)
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass  # the process ended early; its exit status tells why

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for chunk in self.proc.stderr:
            self._err.append(chunk)

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._line(raw.rstrip("\n"))
        status = self.proc.wait()
        # stderr is read by another thread: finish only once all of it is in, or the
        # reason a host could not be reached may be missing from the message
        self._err_reader.join(10)
        self._finish(status)

    def kill(self) -> None:
        """SIGTERM the process group (srun then cancels its step), SIGKILL after 5 s."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass


class _ExecRunning(Running):
    """``docker exec`` through the SDK: ``python3 -c SCRIPT ARGS`` in a running container."""

    def __init__(self, client, container_id: str, argv: Sequence[str],
                 env: Mapping[str, str] | None, where: str) -> None:
        import docker.errors

        super().__init__(where)
        self.client = client
        try:
            self.exec_id = client.api.exec_create(container_id, list(argv), stdout=True,
                                                  stderr=True, environment=dict(env or {}))["Id"]
            stream = client.api.exec_start(self.exec_id, stream=True, demux=True)
        except docker.errors.APIError as e:
            raise Unreachable(f"docker exec failed: {_one_line(e.explanation or e)}",
                              field=where) from None
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        buf = ""
        rc = None
        try:
            for out, err in stream:
                if err:
                    self._err.append(err.decode("utf-8", "replace"))
                if out:
                    buf += out.decode("utf-8", "replace")
                    while "\n" in buf:
                        line, buf = buf.split("\n", 1)
                        self._line(line)
            if buf:
                self._line(buf)
            rc = self.client.api.exec_inspect(self.exec_id).get("ExitCode")
        except Exception as e:  # the engine went away: the node could not be checked
            self._err.append(f"docker exec stream: {e}")
        self._finish(rc)

    def kill(self) -> None:
        """SIGKILL the exec'd process by its host PID (works with a local engine, as root)."""
        try:
            pid = self.client.api.exec_inspect(self.exec_id).get("Pid")
            if pid:
                os.kill(int(pid), signal.SIGKILL)
        except Exception:
            pass


class Target:
    """Where scripts run on one node; :meth:`start` returns a :class:`Running`.

    Attributes:
        where: how errors name the node, e.g. ``"ssh node-a"``.
        machine: nodes with the same value share one machine (and its CPUs).
    """

    where = "node"
    machine = "node"

    def start(self, script: str, args: Sequence[str] = ()) -> Running:  # pragma: no cover
        """Start ``python3`` with ``script`` and ``args`` on the node."""
        raise NotImplementedError

    def run(self, script: str, args: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> Completed:
        """Run ``script`` to its end (see :meth:`Running.wait` for the timeout)."""
        return self.start(script, args).wait(timeout_s)


class ContainerTarget(Target):
    """A running container on this engine; scripts run with ``docker exec``.

    Attributes:
        container_id: the container's ID; ``name``: its name; ``env``: extra environment
        for every exec (the probe's ``ENVBUILD_IMAGE*`` variables).
    """

    def __init__(self, client, container_id: str, name: str, env: Mapping[str, str],
                 python: str = DEFAULT_PYTHON) -> None:
        self.client, self.container_id, self.name, self.env = client, container_id, name, dict(env)
        self.python = python
        self.where = f"container {name}"
        self.machine = f"docker engine {getattr(client.api, 'base_url', '')}"

    def start(self, script: str, args: Sequence[str] = ()) -> Running:
        """``docker exec CONTAINER python3 -c SCRIPT ARGS`` with :attr:`env`."""
        return _ExecRunning(self.client, self.container_id, [self.python, "-c", script, *args],
                            self.env, self.where)


class SshTarget(Target):
    """A host reached with the system ``ssh`` client (BatchMode, ConnectTimeout)."""

    def __init__(self, host: str, ssh_argv: Sequence[str], python: str = DEFAULT_PYTHON) -> None:
        self.host, self.ssh_argv, self.python = host, list(ssh_argv), python
        self.where = f"ssh {host}"
        self.machine = split_host(host)[0].rpartition("@")[2]

    def start(self, script: str, args: Sequence[str] = ()) -> Running:
        """``ssh ... HOST python3 - ARGS`` (each argument shell-quoted) with SCRIPT on stdin."""
        remote = " ".join(shlex.quote(a) for a in [self.python, "-", *args])
        return _ProcessRunning([*self.ssh_argv, remote], script, self.where)


class SlurmTarget(Target):
    """One Slurm node; scripts run as a one-task ``srun`` step pinned to it (``-w``)."""

    def __init__(self, node: str, srun_argv: Sequence[str], python: str = DEFAULT_PYTHON) -> None:
        self.node, self.srun_argv, self.python = node, list(srun_argv), python
        self.where = f"slurm {node}"
        self.machine = node

    def start(self, script: str, args: Sequence[str] = ()) -> Running:
        """``srun --nodes=1 --ntasks=1 --nodelist=NODE python3 - ARGS`` with SCRIPT on stdin."""
        argv = [*self.srun_argv, "--nodes=1", "--ntasks=1", f"--nodelist={self.node}",
                self.python, "-", *args]
        return _ProcessRunning(argv, script, self.where)


# --------------------------------------------------------------------------- report parsing


def _report_from_output(out: Completed, source: str) -> dict:
    """The node report a probe printed, validated.

    Raises:
        Unreachable: (exit 3) the probe exited non-zero (its last stderr line is named).
        InvalidReport: (exit 3) it printed no valid report.
    """
    if out.rc not in (0, None) or (out.rc is None and not out.stdout.strip()):
        raise Unreachable(f"probe exited with status {out.rc}: {_last_line(out.stderr or out.stdout)}",
                          file=source)
    return nodereport.parse(out.stdout, source)


def _unique_names(nodes: list[Node]) -> list[Node]:
    """Make ``name`` unique: a repeated name gets ``@source`` appended."""
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.name] = counts.get(n.name, 0) + 1
    for n in nodes:
        if counts[n.name] > 1:
            n.name = f"{n.name}@{n.source.split(' ', 1)[-1]}"
    return nodes


# --------------------------------------------------------------------------- files


def from_files(paths: Iterable[str | Path]) -> list[Node]:
    """One node per report file, named by the report's hostname (the file name when that
    is missing or repeated), in the order given. Unreadable or invalid files come back
    with ``error`` set."""
    nodes = []
    for p in paths:
        p = str(p)
        try:
            doc = nodereport.load_file(p)
            nodes.append(Node(name=doc.get("hostname") or Path(p).stem, source=p, report=doc))
        except InvalidReport as e:
            nodes.append(Node(name=Path(p).stem, source=p, error=e))
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.name] = counts.get(n.name, 0) + 1
    for n in nodes:
        if counts[n.name] > 1:
            n.name = n.source
    return nodes


# --------------------------------------------------------------------------- containers


def _container_address(attrs: dict, network: str | None) -> str | None:
    nets = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
    if network and nets.get(network, {}).get("IPAddress"):
        return nets[network]["IPAddress"]
    for name in sorted(nets):
        if nets[name].get("IPAddress"):
            return nets[name]["IPAddress"]
    return None


def _shared_network(containers) -> str | None:
    """The network every container is on (user networks before ``bridge``), or None."""
    sets = [set(((c.attrs.get("NetworkSettings") or {}).get("Networks") or {})) for c in containers]
    if not sets:
        return None
    common = set.intersection(*sets)
    for name in sorted(common, key=lambda n: (n == "bridge", n)):
        return name
    return None


def find_containers(client, images: Sequence[str] = (), names: Sequence[str] = (),
                    labels: Sequence[str] = ()) -> list:
    """Running containers chosen by image, name or label, sorted by name, no duplicates.

    Args:
        images: image references; a container matches when it runs that image's ID.
        names: container names or IDs (must exist and run).
        labels: ``key`` or ``key=value`` filters; all must match (alone: select by label).

    Raises:
        EnvbuildError: (exit 2) no such image; (exit 3) a named container is not running.
    """
    import docker.errors

    chosen: dict[str, object] = {}
    filters = {"status": "running"}
    if labels:
        filters["label"] = list(labels)
    if images:
        for ref in images:
            try:
                image_id = client.images.get(ref).id
            except docker.errors.ImageNotFound:
                raise EnvbuildError("no such image", field="image", value=ref) from None
            for c in client.containers.list(filters=filters):
                if c.attrs.get("Image") == image_id:
                    chosen[c.id] = c
    for name in names:
        try:
            c = client.containers.get(name)
        except docker.errors.NotFound:
            raise Unreachable("no such container", field="container", value=name) from None
        if c.status != "running":
            raise Unreachable(f"is {c.status}, not running", field="container", value=name)
        chosen[c.id] = c
    if labels and not images and not names:
        for c in client.containers.list(filters=filters):
            chosen[c.id] = c
    return sorted(chosen.values(), key=lambda c: c.name)


def container_nodes(client, containers: Sequence, python: str = DEFAULT_PYTHON) -> list[Node]:
    """Nodes (without reports yet) for running containers: name, address on the network
    they share, and a :class:`ContainerTarget` with the probe's ``ENVBUILD_*`` variables."""
    try:
        engine_version = client.version().get("Version")
    except Exception:
        engine_version = None
    network = _shared_network(containers)
    nodes = []
    for c in containers:
        image_id = c.attrs.get("Image")
        ref = (c.attrs.get("Config") or {}).get("Image") or image_id
        digest = None
        try:
            repo_digests = client.images.get(image_id).attrs.get("RepoDigests") or []
            if repo_digests:
                digest = repo_digests[0].split("@", 1)[1]
        except Exception:
            pass
        env = {"ENVBUILD_IMAGE": ref, "ENVBUILD_IMAGE_ID": image_id or ""}
        if digest:
            env["ENVBUILD_IMAGE_DIGEST"] = digest
        if engine_version:
            env["ENVBUILD_RUNTIME_VERSION"] = engine_version
        nodes.append(Node(name=c.name, source=f"container {c.name}",
                          address=_container_address(c.attrs, network),
                          target=ContainerTarget(client, c.id, c.name, env, python)))
    return nodes


def probe_nodes(nodes: list[Node], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Node]:
    """Run the probe on every node with a target, all at once; fills ``report`` or
    ``error`` of each (in place) and returns ``nodes``."""
    script = probe_source()

    def one(node: Node) -> None:
        if node.target is None or node.report is not None or node.error is not None:
            return
        try:
            out = node.target.run(script, (), timeout_s)
            node.report = _report_from_output(out, node.source)
        except EnvbuildError as e:
            node.error = e

    if nodes:
        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            list(pool.map(one, nodes))
    return nodes


def from_containers(client, images: Sequence[str] = (), names: Sequence[str] = (),
                    labels: Sequence[str] = (), expect: int | None = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S, python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe running containers (see :func:`find_containers`); one node per container,
    named by the container.

    Args:
        expect: the number of containers there must be (``--nodes``), or None.

    Raises:
        Unreachable: (exit 3) no running container matches, or not ``expect`` of them
            (the message lists those found).
    """
    containers = find_containers(client, images, names, labels)
    what = ", ".join([*(f"image {i}" for i in images), *(f"container {n}" for n in names),
                      *(f"label {l}" for l in labels)])
    if not containers:
        raise Unreachable(f"no running container of {what}")
    if expect is not None and len(containers) != expect:
        raise Unreachable(f"expected {expect} running containers of {what}, found "
                          f"{len(containers)}: {', '.join(c.name for c in containers)}",
                          field="--nodes", value=expect)
    return probe_nodes(container_nodes(client, containers, python), timeout_s)


# --------------------------------------------------------------------------- ssh


def split_host(spec: str) -> tuple[str, int | None]:
    """``"user@host:2222"`` gives ``("user@host", 2222)``; ``"host"`` gives ``("host", None)``.

    Raises:
        EnvbuildError: (exit 64 material, shown as exit 2) an empty host or a bad port.
    """
    spec = spec.strip()
    host, sep, port = spec.rpartition(":")
    if not sep or "]" in port or ":" in host:
        host, port = spec, ""
    if not host:
        raise EnvbuildError("is not a host ([user@]host[:port])", field="--hosts", value=spec, exit_code=ExitCode.USAGE)
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise EnvbuildError("has a bad port", field="--hosts", value=spec, exit_code=ExitCode.USAGE)
        return host, int(port)
    return host, None


def ssh_argv(host: str, port: int | None = None, config: str | None = None,
             options: Sequence[str] = (), connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S) -> list[str]:
    """``ssh`` arguments up to and including the host: BatchMode (no prompts), a connect
    timeout, ``-T`` (no tty), then ``-F config``, each ``-o option``, ``-p port``."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout_s)}"]
    if config:
        argv += ["-F", config]
    for opt in options:
        argv += ["-o", opt]
    if port:
        argv += ["-p", str(port)]
    return [*argv, host]


def ssh_hostname(argv: Sequence[str]) -> str | None:
    """The address ssh would connect to for ``argv`` (from :func:`ssh_argv`), as
    ``ssh -G`` resolves it through the ssh configuration (``HostName``); None if unknown."""
    try:
        proc = subprocess.run([argv[0], "-G", *argv[1:]], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return None


def ssh_nodes(hosts: Sequence[str], config: str | None = None, options: Sequence[str] = (),
              connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
              python: str = DEFAULT_PYTHON) -> list[Node]:
    """Nodes (without reports yet) for ssh hosts, named as given, with an :class:`SshTarget`;
    ``address`` is the host name ssh resolves (``ssh -G``), which peers connect to."""
    nodes = []
    for spec in hosts:
        host, port = split_host(spec)
        argv = ssh_argv(host, port, config, options, connect_timeout_s)
        address = ssh_hostname(argv) or host.rpartition("@")[2]
        target = SshTarget(spec, argv, python)
        target.machine = address
        nodes.append(Node(name=spec, source=f"ssh {spec}", address=address, target=target))
    return nodes


def from_ssh(hosts: Sequence[str], config: str | None = None, options: Sequence[str] = (),
             timeout_s: float = DEFAULT_TIMEOUT_S,
             connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
             python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe hosts over ssh, all at once, each within ``timeout_s`` seconds.

    A host ssh cannot reach (exit status 255: refused, no route, host key, auth) or that
    does not answer in time gets ``error`` (exit 3) naming ssh's last stderr line.
    """
    nodes = ssh_nodes(hosts, config, options, connect_timeout_s, python)
    script = probe_source()

    def one(node: Node) -> None:
        try:
            out = node.target.run(script, (), timeout_s)
        except EnvbuildError as e:
            node.error = Unreachable(f"cannot be reached: {e.message}", file=node.source)
            return
        if out.rc == 255:
            node.error = Unreachable(f"cannot be reached: {_last_line(out.stderr)}", file=node.source)
            return
        try:
            node.report = _report_from_output(out, node.source)
        except EnvbuildError as e:
            node.error = e

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        list(pool.map(one, nodes))
    return nodes


# --------------------------------------------------------------------------- slurm

_LABEL_RE = re.compile(r"^\s*(\d+): ?(.*)$")
_SRUN_ERR_RE = re.compile(r"srun: error: ([^:\s]+): tasks? ([\d,\-]+):")


def split_labelled(text: str) -> dict[int, str]:
    """``srun --label`` output (``"0: line"``, ``" 1: line"``) as ``{task: text}``; lines
    without a task prefix are dropped."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _LABEL_RE.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return {task: "\n".join(lines) + "\n" for task, lines in sorted(out.items())}


def srun_argv(nodes: int | None = None, partition: str | None = None,
              extra: Sequence[str] = ()) -> list[str]:
    """``srun`` arguments shared by every step envbuild starts: ``--job-name=envbuild``,
    ``--partition``, ``--nodes``, then ``extra`` as given."""
    argv = ["srun", "--job-name=envbuild"]
    if partition:
        argv.append(f"--partition={partition}")
    if nodes:
        argv.append(f"--nodes={nodes}")
    return [*argv, *extra]


def from_slurm(nodes: int | None = None, partition: str | None = None,
               extra: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S,
               python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe every node of one Slurm job step: ``srun [--nodes=N] --ntasks-per-node=1
    --label --input=all python3 - < probe.py``; one node per task, named by the node's
    hostname, each with a :class:`SlurmTarget` for later scripts.

    Raises:
        Unreachable: (exit 3) srun cannot run, does not end within ``timeout_s`` or
            gives no task output at all (the message ends with srun's last stderr line).
    """
    base = srun_argv(nodes, partition, extra)
    argv = [*base, "--ntasks-per-node=1", "--label", "--input=all", python, "-"]
    out = _ProcessRunning(argv, probe_source(), "srun").wait(timeout_s)
    tasks = split_labelled(out.stdout)
    failed: dict[int, str] = {}
    for m in _SRUN_ERR_RE.finditer(out.stderr):
        for part in m.group(2).split(","):
            lo, _, hi = part.partition("-")
            for t in range(int(lo), int(hi or lo) + 1):
                failed[t] = m.group(1)
    if not tasks and not failed:
        raise Unreachable(f"srun gave no node reports (exit status {out.rc}): {_last_line(out.stderr)}",
                          field="slurm")
    result: list[Node] = []
    for task in sorted(set(tasks) | set(failed)):
        source = f"slurm task {task}"
        node = Node(name=failed.get(task, f"task-{task}"), source=source)
        try:
            if task not in tasks:
                raise Unreachable(f"task failed on {failed[task]}: {_last_line(out.stderr)}", file=source)
            node.report = nodereport.parse(tasks[task], source)
            node.name = node.report.get("hostname") or node.name
        except EnvbuildError as e:
            node.error = e
        node.source = f"slurm {node.name}"
        if node.report is not None:
            node.address = node.name
            node.target = SlurmTarget(node.name, base, python)
        result.append(node)
    return _unique_names(result)


# --------------------------------------------------------------------------- all sources


@dataclass
class Sources:
    """Where to gather nodes from (the ``verify``/``doctor`` command-line options).

    Attributes:
        files: report files. images, containers, labels: running containers on this
        engine (see :func:`find_containers`). nodes: how many containers there must be,
        or ``srun --nodes``. hosts: ssh hosts ``[user@]host[:port]``. ssh_config,
        ssh_options: ``ssh -F`` and ``-o``. connect_timeout_s: ``ssh -o ConnectTimeout``.
        slurm, partition, srun_args: gather with ``srun``. timeout_s: per node (per srun).
        python: the interpreter on nodes. client: a docker client (default: connect).
    """

    files: Sequence[str] = ()
    images: Sequence[str] = ()
    containers: Sequence[str] = ()
    labels: Sequence[str] = ()
    nodes: int | None = None
    hosts: Sequence[str] = ()
    ssh_config: str | None = None
    ssh_options: Sequence[str] = ()
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    slurm: bool = False
    partition: str | None = None
    srun_args: Sequence[str] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    python: str = DEFAULT_PYTHON
    client: object = None

    @property
    def uses_containers(self) -> bool:
        """True when running containers are a source."""
        return bool(self.images or self.containers or self.labels)

    @property
    def empty(self) -> bool:
        """True when no source is given."""
        return not (self.files or self.uses_containers or self.hosts or self.slurm)


def gather(src: Sources) -> list[Node]:
    """Gather nodes from every source in ``src``: files, containers, ssh hosts, Slurm (in
    that order); names are made unique across sources.

    Raises:
        EnvbuildError: (exit 2) no such image; bad ``--hosts``.
        Unreachable: (exit 3) no Docker engine; no (or not ``nodes``) running containers;
            srun gave nothing.
    """
    nodes: list[Node] = list(from_files(src.files)) if src.files else []
    if src.uses_containers:
        from .engine import connect

        client = src.client or connect()
        nodes += from_containers(client, src.images, src.containers, src.labels,
                                 None if src.slurm else src.nodes, src.timeout_s, src.python)
    if src.hosts:
        nodes += from_ssh(src.hosts, src.ssh_config, src.ssh_options, src.timeout_s,
                          src.connect_timeout_s, src.python)
    if src.slurm:
        nodes += from_slurm(src.nodes, src.partition, src.srun_args, src.timeout_s, src.python)
    seen: dict[str, int] = {}
    for n in nodes:
        seen[n.name] = seen.get(n.name, 0) + 1
    for n in nodes:
        if seen[n.name] > 1:
            n.name = f"{n.name} ({n.source})"
    return nodes
