"""Gather node reports, and run scripts on nodes, for ``envbuild verify`` and ``doctor``.

Four sources, each giving a list of :class:`builder.nodes.report.Node` in a stable order:

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

Bounds: what a node prints is read in binary chunks, at most ``MAX_REPORT_BYTES`` (16 MiB)
of stdout per node (:data:`MAX_SRUN_OUTPUT_BYTES` for the one srun step) and the last
:data:`STDERR_TAIL_BYTES` of stderr; a node printing more is stopped. Every value that
reaches an ssh or srun command line or the engine (hosts, ``--ssh-option``,
``--partition``, ``--srun-arg``, ``--python``, container names, labels) is matched whole
first (:meth:`Sources.check`; usage error, exit 64), and ssh gets ``--`` before the host.
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

from . import report as nodereport
from builder import agent
from builder.core.errors import EnvbuildError, ExitCode, Unreachable
from builder.core.inputs import has_control, one_line
from .report import MAX_REPORT_BYTES, InvalidReport, Node

#: Seconds one node may take to produce its report (the probe imports torch and loads
#: every libnccl it finds in a subprocess).
DEFAULT_TIMEOUT_S = 120.0
#: ``ssh -o ConnectTimeout`` in seconds.
DEFAULT_CONNECT_TIMEOUT_S = 5
#: The interpreter run on remote nodes.
DEFAULT_PYTHON = "python3"
#: Bytes of a script's stderr kept (the tail: the reason a node failed is its last line).
STDERR_TAIL_BYTES = 64 << 10
#: Bytes of stdout read from the one ``srun`` step that probes every node: each task's
#: report is still at most ``MAX_REPORT_BYTES`` (a real report is ~10-50 KB).
MAX_SRUN_OUTPUT_BYTES = 4 * MAX_REPORT_BYTES

_PKG = Path(agent.__file__).resolve().parent  # the in-node scripts


def probe_source() -> str:
    """The text of ``builder/agent/probe.py`` (run on nodes as a script)."""
    return (_PKG / "probe.py").read_text(encoding="utf-8")


def agent_source() -> str:
    """The text of ``builder/agent/doctor_agent.py`` (run on nodes as a script)."""
    return (_PKG / "doctor_agent.py").read_text(encoding="utf-8")


def _one_line(text: str, limit: int = 200) -> str:
    return one_line(text, limit)


def _last_line(text: str) -> str:
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return _one_line(lines[-1]) if lines else "no output"


# --------------------------------------------------------------------------- arguments
# Every value that reaches an ssh or srun command line is matched whole (re.fullmatch)
# and may not start with "-" (it would be read as an option). Errors are usage errors
# (exit 64): the CLI checks them before anything is contacted.

_USER = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
_HOSTNAME = r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_])?"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}(%[A-Za-z0-9_.-]{1,15})?\]"
_HOST_RE = re.compile(rf"(?:(?P<user>{_USER})@)?(?P<host>{_HOSTNAME}|{_IPV6})(?::(?P<port>[0-9]{{1,5}}))?")

#: ``--ssh-option`` keys accepted (``ssh_config(5)``): connection, authentication and
#: host-key settings. Refused are the keys that run a command or load code
#: (``ProxyCommand``, ``LocalCommand``, ``PermitLocalCommand``, ``KnownHostsCommand``,
#: ``RemoteCommand``, ``PKCS11Provider``, ``SecurityKeyProvider``, ``Include``...), open
#: forwardings or tunnels (``LocalForward``, ``RemoteForward``, ``DynamicForward``,
#: ``Tunnel``...), or undo what envbuild needs (``BatchMode``, ``RequestTTY``,
#: ``SessionType``, ``StdinNull``...): put anything else in an ``--ssh-config`` file.
SSH_OPTION_KEYS = frozenset(k.lower() for k in (
    "AddressFamily", "BindAddress", "BindInterface", "CanonicalDomains", "CanonicalizeHostname",
    "CertificateFile", "CheckHostIP", "Ciphers", "Compression", "ConnectionAttempts", "ConnectTimeout",
    "ControlMaster", "ControlPath", "ControlPersist", "GlobalKnownHostsFile", "HashKnownHosts",
    "HostKeyAlgorithms", "HostKeyAlias", "HostName", "IdentitiesOnly", "IdentityFile", "IPQoS",
    "KexAlgorithms", "LogLevel", "MACs", "NumberOfPasswordPrompts", "Port", "PreferredAuthentications",
    "ProxyJump", "PubkeyAcceptedAlgorithms", "PubkeyAuthentication", "RekeyLimit", "SendEnv",
    "ServerAliveCountMax", "ServerAliveInterval", "SetEnv", "StrictHostKeyChecking", "TCPKeepAlive",
    "UpdateHostKeys", "User", "UserKnownHostsFile", "VerifyHostKeyDNS"))
_SSH_OPTION_RE = re.compile(r"(?P<key>[A-Za-z][A-Za-z0-9]{1,40})=(?P<value>[!-~]{1,1024})")
_PARTITION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(,[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}){0,31}")
#: ``--srun-arg`` options accepted (``srun(1)``): resources, placement and accounting.
#: Refused are those that run programs (``--prolog``, ``--epilog``, ``--task-prolog``,
#: ``--task-epilog``), write or redirect files (``--output``, ``--error``, ``--input``,
#: ``--chdir``, ``--bcast``), change what runs or its environment (``--export``,
#: ``--container``, ``--uid``...), and short options (give the long form).
SRUN_OPTIONS = frozenset((
    "account", "qos", "reservation", "time", "constraint", "exclusive", "gres", "gpus", "gpus-per-node",
    "gpus-per-task", "gpu-bind", "mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "cpus-per-gpu",
    "nodelist", "exclude", "network", "overlap", "comment", "wckey", "clusters", "cluster", "distribution",
    "hint", "cpu-bind", "mpi", "switches", "licenses", "immediate", "exact", "oversubscribe", "priority",
    "nice", "threads-per-core", "cores-per-socket", "sockets-per-node", "ntasks-per-core", "mem-bind"))
_SRUN_ARG_RE = re.compile(r"--(?P<name>[a-z][a-z0-9-]{0,40})(=(?P<value>[!-~]{1,1024}))?")
_PYTHON_RE = re.compile(r"(/?[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,254})(/[A-Za-z0-9_.+-]{1,255}){0,63}")


def _usage(message: str, field: str, value: str) -> EnvbuildError:
    return EnvbuildError(message, field=field, value=value, exit_code=ExitCode.USAGE)


def check_host(spec: str) -> str:
    """``spec`` if it is ``[user@]host[:port]`` (a host name, IPv4 or ``[IPv6]``, port
    1..65535), whole; else a usage error (exit 64) naming ``--hosts``."""
    m = _HOST_RE.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        raise _usage("is not a host ([user@]host[:port]: letters, digits, _ . -, not starting with -)",
                     "--hosts", spec)
    if m.group("port") is not None and not 0 < int(m.group("port")) < 65536:
        raise _usage("has a bad port (1..65535)", "--hosts", spec)
    return spec


def check_ssh_option(opt: str) -> str:
    """``opt`` if it is ``Key=Value`` with a key of :data:`SSH_OPTION_KEYS` and a value
    of printable ASCII without blanks (``ProxyJump`` values are hosts); else exit 64."""
    m = _SSH_OPTION_RE.fullmatch(opt) if isinstance(opt, str) else None
    if m is None:
        raise _usage("is not an ssh option Key=Value (printable, no blanks)", "--ssh-option", opt)
    key = m.group("key").lower()
    if key not in SSH_OPTION_KEYS:
        raise _usage(f"is refused: {m.group('key')} is not among the ssh options envbuild passes on (connection, "
                     "authentication and host-key settings; no commands, forwardings or BatchMode); put it in an "
                     "--ssh-config file", "--ssh-option", opt)
    if key == "proxyjump" and m.group("value") != "none":
        for hop in m.group("value").split(","):
            if _HOST_RE.fullmatch(hop) is None:
                raise _usage("has a ProxyJump hop that is not [user@]host[:port]", "--ssh-option", opt)
    return opt


def check_partition(text: str) -> str:
    """``text`` if it is a Slurm partition name or a comma list of them; else exit 64."""
    if not isinstance(text, str) or _PARTITION_RE.fullmatch(text) is None:
        raise _usage("is not a Slurm partition name (letters, digits, _ . -; a comma list)", "--partition", text)
    return text


def check_srun_arg(text: str) -> str:
    """``text`` if it is ``--name[=value]`` with a name of :data:`SRUN_OPTIONS` and a
    printable value without blanks; else exit 64."""
    m = _SRUN_ARG_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise _usage("is not an srun option --name[=value] (long form, printable, no blanks)", "--srun-arg", text)
    if m.group("name") not in SRUN_OPTIONS:
        raise _usage(f"is refused: --{m.group('name')} is not among the srun options envbuild passes on "
                     "(resources, placement and accounting; no prologs, file redirections or --export)",
                     "--srun-arg", text)
    return text


_CONTAINER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}")


def check_container(text: str) -> str:
    """``text`` if it is a container name or ID (Docker's ``[a-zA-Z0-9][a-zA-Z0-9_.-]+``);
    else exit 64."""
    if not isinstance(text, str) or _CONTAINER_RE.fullmatch(text) is None:
        raise _usage("is not a container name or ID (letters, digits, _ . -)", "--container", text)
    return text


def check_label(text: str) -> str:
    """``text`` if it is ``KEY`` or ``KEY=VALUE`` (key: letters, digits, ``. _ / -``; value:
    at most 4096 characters, no control character); else exit 64."""
    key, sep, value = text.partition("=") if isinstance(text, str) else ("", "", "")
    if _LABEL_KEY_RE.fullmatch(key) is None or len(value) > 4096 or has_control(value):
        raise _usage("is not a label KEY[=VALUE] (key: letters, digits, . _ / -; no control characters)",
                     "--label", text)
    return text


def check_path(text: str, field: str) -> str:
    """``text`` if it is a path of at most 4096 characters without control characters."""
    if not isinstance(text, str) or not text or len(text) > 4096 or has_control(text):
        raise _usage("is not a path (at most 4096 characters, no control characters)", field, text)
    return text


def check_python(text: str) -> str:
    """``text`` if it is an interpreter name or path (``python3``, ``/opt/venv/bin/python``:
    letters, digits, ``_ . + -``, not starting with ``-``); else exit 64."""
    if not isinstance(text, str) or _PYTHON_RE.fullmatch(text) is None:
        raise _usage("is not an interpreter name or path (letters, digits, _ . + - and /)", "--python", text)
    return text


# --------------------------------------------------------------------------- running scripts


@dataclass
class Completed:
    """A finished script: exit status (None if unknown), stdout and stderr text."""

    rc: int | None
    stdout: str
    stderr: str


class Running:
    """A script running on a node; stdout arrives line by line.

    What it prints is bounded: at most ``max_stdout`` bytes of stdout are kept (more and
    the script is stopped; :meth:`wait` then raises), and the last
    :data:`STDERR_TAIL_BYTES` of stderr. Subclasses start the work and feed
    :meth:`_out_bytes` / :meth:`_err_bytes` / :meth:`_finish` from threads.
    """

    def __init__(self, where: str, max_stdout: int = MAX_REPORT_BYTES) -> None:
        self.where = where
        self.max_stdout = max_stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._out: list[str] = []
        self._err: list[bytes] = []
        self._err_size = 0
        self._size = 0
        self._partial = bytearray()
        self._over = False
        self._done = threading.Event()
        self.rc: int | None = None

    def _line(self, line: str) -> None:
        self._out.append(line)
        self._lines.put(line)

    def _out_bytes(self, data: bytes) -> bool:
        """Take a chunk of stdout; False once over ``max_stdout`` (the caller stops reading)."""
        if self._over:
            return False
        self._size += len(data)
        if self._size > self.max_stdout:
            self._over = True
            self.kill()
            return False
        self._partial += data
        if b"\n" in data:
            head, _, tail = self._partial.rpartition(b"\n")
            for raw in head.split(b"\n"):
                self._line(raw.decode("utf-8", "replace"))
            self._partial = bytearray(tail)
        return True

    def _err_bytes(self, data: bytes) -> None:
        """Take a chunk of stderr, keeping the last :data:`STDERR_TAIL_BYTES` only."""
        self._err.append(data)
        self._err_size += len(data)
        while self._err_size > STDERR_TAIL_BYTES and len(self._err) > 1:
            self._err_size -= len(self._err.pop(0))
        if self._err_size > STDERR_TAIL_BYTES:
            self._err[0] = self._err[0][-STDERR_TAIL_BYTES:]
            self._err_size = len(self._err[0])

    def _finish(self, rc: int | None) -> None:
        if self._partial and not self._over:
            self._line(self._partial.decode("utf-8", "replace"))
            self._partial = bytearray()
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
            InvalidReport: (exit 3) it printed more than ``max_stdout`` bytes.
        """
        if not self._done.wait(max(0.0, timeout_s)):
            self.kill()
            raise Unreachable(f"no answer within {timeout_s:g} s", field=self.where)
        if self._over:
            raise InvalidReport(f"printed over {self.max_stdout} bytes on stdout, the limit of a node "
                                "report; stopped", file=self.where)
        stderr = b"".join(self._err).decode("utf-8", "replace")
        return Completed(self.rc, "\n".join(self._out) + ("\n" if self._out else ""), stderr)

    def kill(self) -> None:  # pragma: no cover - overridden
        """Stop the script (best effort)."""


class _ProcessRunning(Running):
    """A local process (``ssh``, ``srun``) with the script text on its stdin; its output
    read in binary chunks (bounded: see :class:`Running`)."""

    def __init__(self, argv: Sequence[str], stdin_text: str, where: str,
                 max_stdout: int = MAX_REPORT_BYTES) -> None:
        super().__init__(where, max_stdout)
        try:
            self.proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise Unreachable(f"cannot run {argv[0]}: {e.strerror or e}", field=where) from None
        threading.Thread(target=self._feed, args=(stdin_text.encode("utf-8"),), daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        threading.Thread(target=self._read_out, daemon=True).start()

    def _feed(self, data: bytes) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass  # the process ended early; its exit status tells why

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        while True:
            chunk = self.proc.stderr.read1(1 << 16)
            if not chunk:
                return
            self._err_bytes(chunk)

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        while True:
            chunk = self.proc.stdout.read1(1 << 16)
            if not chunk or not self._out_bytes(chunk):
                break
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
        rc = None
        try:
            for out, err in stream:
                if err:
                    self._err_bytes(err)
                if out and not self._out_bytes(out):
                    break
            if not self._over:
                rc = self.client.api.exec_inspect(self.exec_id).get("ExitCode")
        except Exception as e:  # the engine went away: the node could not be checked
            self._err_bytes(f"docker exec stream: {one_line(e, 300)}".encode())
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
        self.python = check_python(python)
        self.where = f"container {name}"
        self.machine = f"docker engine {getattr(client.api, 'base_url', '')}"

    def start(self, script: str, args: Sequence[str] = ()) -> Running:
        """``docker exec CONTAINER python3 -c SCRIPT ARGS`` with :attr:`env`."""
        return _ExecRunning(self.client, self.container_id, [self.python, "-c", script, *args],
                            self.env, self.where)


class SshTarget(Target):
    """A host reached with the system ``ssh`` client (BatchMode, ConnectTimeout)."""

    def __init__(self, host: str, ssh_argv: Sequence[str], python: str = DEFAULT_PYTHON) -> None:
        self.host, self.ssh_argv, self.python = host, list(ssh_argv), check_python(python)
        self.where = f"ssh {host}"
        self.machine = split_host(host)[0].rpartition("@")[2]

    def start(self, script: str, args: Sequence[str] = ()) -> Running:
        """``ssh ... HOST python3 - ARGS`` (each argument shell-quoted) with SCRIPT on stdin."""
        remote = " ".join(shlex.quote(a) for a in [self.python, "-", *args])
        return _ProcessRunning([*self.ssh_argv, remote], script, self.where)


class SlurmTarget(Target):
    """One Slurm node; scripts run as a one-task ``srun`` step pinned to it (``-w``)."""

    def __init__(self, node: str, srun_argv: Sequence[str], python: str = DEFAULT_PYTHON) -> None:
        self.node, self.srun_argv, self.python = node, list(srun_argv), check_python(python)
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
        raise Unreachable(f"probe {exit_status(out.rc)}: {_last_line(out.stderr or out.stdout)}", file=source)
    return nodereport.parse(out.stdout, source)


def exit_status(rc: int | None) -> str:
    """``"exited with status 1"``, ``"was killed by SIGKILL"`` (a negative status),
    ``"ended with an unknown status"``."""
    if rc is None:
        return "ended with an unknown status"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


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
    """``"user@host:2222"`` gives ``("user@host", 2222)``; ``"host"`` gives ``("host", None)``;
    ``"[fe80::1]:22"`` gives ``("fe80::1", 22)``. The whole value is checked
    (:func:`check_host`).

    Raises:
        EnvbuildError: (exit 64) not ``[user@]host[:port]``, or a bad port.
    """
    m = _HOST_RE.fullmatch(check_host(spec))
    host = m.group("host")
    if host.startswith("["):
        host = host[1:-1]
    if m.group("user"):
        host = f"{m.group('user')}@{host}"
    return host, int(m.group("port")) if m.group("port") else None


def ssh_argv(host: str, port: int | None = None, config: str | None = None,
             options: Sequence[str] = (), connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S) -> list[str]:
    """``ssh`` arguments up to and including the host: BatchMode (no prompts), a connect
    timeout, ``-T`` (no tty), then ``-F config``, each ``-o option`` (checked:
    :func:`check_ssh_option`), ``-p port``, then ``--`` and the host, so that no host
    can ever be read as an option (a second line of defence after :func:`check_host`).

    Raises:
        EnvbuildError: (exit 64) a refused option, a host starting with ``-``.
    """
    if host.startswith("-"):
        raise _usage("is not a host (it starts with -)", "--hosts", host)
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout_s)}"]
    if config:
        argv += ["-F", config]
    for opt in options:
        argv += ["-o", check_ssh_option(opt)]
    if port:
        argv += ["-p", str(port)]
    return [*argv, "--", host]


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
        except InvalidReport as e:  # it answered, with too much
            node.error = e
            return
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

_LABEL_RE = re.compile(r"\s{0,8}([0-9]{1,6}): ?(.*)", re.DOTALL)
_SRUN_ERR_RE = re.compile(r"srun: error: ([^:\s]{1,255}): tasks? ([0-9][0-9,\-]{0,4000}):")
#: Most tasks of one srun step envbuild reads (``--nodes`` is at most 1024 here).
MAX_TASKS = 65536


def split_labelled(text: str) -> dict[int, str]:
    """``srun --label`` output (``"0: line"``, ``" 1: line"``) as ``{task: text}``; lines
    without a task prefix (or a task number over :data:`MAX_TASKS`) are dropped."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _LABEL_RE.fullmatch(line)
        if m and int(m.group(1)) < MAX_TASKS:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return {task: "\n".join(lines) + "\n" for task, lines in sorted(out.items())}


def failed_tasks(stderr: str) -> dict[int, str]:
    """``{task: node}`` from srun's ``srun: error: NODE: tasks 0-2,5: ...`` lines; ranges
    are bounded (tasks below :data:`MAX_TASKS`, at most that many in all)."""
    failed: dict[int, str] = {}
    for m in _SRUN_ERR_RE.finditer(stderr):
        for part in m.group(2).split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            for t in range(int(lo), min(int(hi or lo), MAX_TASKS - 1) + 1):
                failed[t] = m.group(1)
                if len(failed) >= MAX_TASKS:
                    return failed
    return failed


def srun_argv(nodes: int | None = None, partition: str | None = None,
              extra: Sequence[str] = ()) -> list[str]:
    """``srun`` arguments shared by every step envbuild starts: ``--job-name=envbuild``,
    ``--partition`` (checked: :func:`check_partition`), ``--nodes``, then ``extra``
    (each checked: :func:`check_srun_arg`).

    Raises:
        EnvbuildError: (exit 64) a bad partition or a refused srun argument.
    """
    argv = ["srun", "--job-name=envbuild"]
    if partition:
        argv.append(f"--partition={check_partition(partition)}")
    if nodes:
        argv.append(f"--nodes={int(nodes)}")
    return [*argv, *(check_srun_arg(a) for a in extra)]


def from_slurm(nodes: int | None = None, partition: str | None = None,
               extra: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S,
               python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe every node of one Slurm job step: ``srun [--nodes=N] --ntasks-per-node=1
    --label --input=all python3 - < probe.py``; one node per task, named by the node's
    hostname, each with a :class:`SlurmTarget` for later scripts. srun's output is read
    up to :data:`MAX_SRUN_OUTPUT_BYTES`; each task's report up to ``MAX_REPORT_BYTES``.

    Raises:
        Unreachable: (exit 3) srun cannot run, does not end within ``timeout_s`` or
            gives no task output at all (the message ends with srun's last stderr line).
        InvalidReport: (exit 3) srun printed more than :data:`MAX_SRUN_OUTPUT_BYTES`.
    """
    base = srun_argv(nodes, partition, extra)
    argv = [*base, "--ntasks-per-node=1", "--label", "--input=all", check_python(python), "-"]
    out = _ProcessRunning(argv, probe_source(), "srun", MAX_SRUN_OUTPUT_BYTES).wait(timeout_s)
    tasks = split_labelled(out.stdout)
    failed = failed_tasks(out.stderr)
    if not tasks and not failed:
        status = f"exit status {out.rc}" if out.rc is not None and out.rc >= 0 else exit_status(out.rc)
        raise Unreachable(f"srun gave no node reports ({status}): {_last_line(out.stderr)}", field="slurm")
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

    def check(self) -> "Sources":
        """Every value that reaches a command line or the engine, checked whole before
        anything is contacted (:func:`check_host`, :func:`check_ssh_option`,
        :func:`check_partition`, :func:`check_srun_arg`, :func:`check_python`,
        :func:`check_container`, :func:`check_label`); returns ``self``.

        Raises:
            EnvbuildError: (exit 64) the first value refused, naming its option.
        """
        for h in self.hosts:
            check_host(h)
        for o in self.ssh_options:
            check_ssh_option(o)
        if self.ssh_config is not None:
            check_path(self.ssh_config, "--ssh-config")
        if self.partition is not None:
            check_partition(self.partition)
        for a in self.srun_args:
            check_srun_arg(a)
        for c in self.containers:
            check_container(c)
        for label in self.labels:
            check_label(label)
        check_python(self.python)
        return self


def gather(src: Sources) -> list[Node]:
    """Gather nodes from every source in ``src``: files, containers, ssh hosts, Slurm (in
    that order); names are made unique across sources.

    Raises:
        EnvbuildError: (exit 64) a value refused by :meth:`Sources.check` (before
            anything is contacted); (exit 2) no such image.
        Unreachable: (exit 3) no Docker engine; no (or not ``nodes``) running containers;
            srun gave nothing.
    """
    src.check()
    nodes: list[Node] = list(from_files(src.files)) if src.files else []
    if src.uses_containers:
        from builder.image.engine import connect

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
