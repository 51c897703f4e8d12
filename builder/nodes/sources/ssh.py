"""Hosts over ssh in BatchMode (never a password prompt), the agent payload on stdin, one deadline
per host. Every ssh value is matched whole first (exit 64); ssh gets ``--`` before the host."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from builder.agent import payload
from builder.core import process
from builder.core.errors import EnvbuildError, Unreachable, UsageError

from ..report import InvalidReport, Node
from .base import (
    DEFAULT_PYTHON,
    DEFAULT_TIMEOUT_S,
    PROBE_MODULE,
    ProcessRunning,
    Running,
    Target,
    check_python,
    last_line,
    payload_archive,
    report_from_output,
)

#: ``ssh -o ConnectTimeout`` in seconds.
DEFAULT_CONNECT_TIMEOUT_S = 5

_USER = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
_HOSTNAME = r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_])?"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}(%[A-Za-z0-9_.-]{1,15})?\]"
_HOST_RE = re.compile(rf"(?:(?P<user>{_USER})@)?(?P<host>{_HOSTNAME}|{_IPV6})(?::(?P<port>[0-9]{{1,5}}))?")

#: ``--ssh-option`` keys accepted (``ssh_config(5)``): connection, authentication and host keys.
#: Refused: keys that run commands or load code (``ProxyCommand``, ``Include``...), forward or
#: tunnel, or undo what envbuild needs (``BatchMode``...); those go in an ``--ssh-config`` file.
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


def check_host(spec: str) -> str:
    """``spec`` if ``[user@]host[:port]`` (name, IPv4, ``[IPv6]``; port 1..65535); else exit 64 (``--hosts``)."""
    m = _HOST_RE.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        raise UsageError("is not a host ([user@]host[:port]: letters, digits, _ . -, not starting with -)",
                         field="--hosts", value=spec)
    if m.group("port") is not None and not 0 < int(m.group("port")) < 65536:
        raise UsageError("has a bad port (1..65535)", field="--hosts", value=spec)
    return spec


def check_ssh_option(opt: str) -> str:
    """``opt`` if ``Key=Value`` of :data:`SSH_OPTION_KEYS`, printable ASCII without blanks; else exit 64."""
    m = _SSH_OPTION_RE.fullmatch(opt) if isinstance(opt, str) else None
    if m is None:
        raise UsageError("is not an ssh option Key=Value (printable, no blanks)", field="--ssh-option", value=opt)
    key = m.group("key").lower()
    if key not in SSH_OPTION_KEYS:
        raise UsageError(f"is refused: {m.group('key')} is not among the ssh options envbuild passes on (connection, "
                         "authentication and host-key settings; no commands, forwardings or BatchMode); put it in an "
                         "--ssh-config file", field="--ssh-option", value=opt)
    if key == "proxyjump" and m.group("value") != "none":
        for hop in m.group("value").split(","):
            if _HOST_RE.fullmatch(hop) is None:
                raise UsageError("has a ProxyJump hop that is not [user@]host[:port]", field="--ssh-option", value=opt)
    return opt


def split_host(spec: str) -> tuple[str, int | None]:
    """``"user@host:2222"`` -> ``("user@host", 2222)``, ``"[fe80::1]:22"`` -> ``("fe80::1", 22)``; else 64."""
    m = _HOST_RE.fullmatch(check_host(spec))
    assert m is not None  # check_host matched it
    host = m.group("host")
    if host.startswith("["):
        host = host[1:-1]
    if m.group("user"):
        host = f"{m.group('user')}@{host}"
    return host, int(m.group("port")) if m.group("port") else None


def ssh_argv(host: str, port: int | None = None, config: str | None = None,
             options: Sequence[str] = (), connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S) -> list[str]:
    """``ssh`` arguments up to the host, ``--`` before it (a second defence after check_host); exit 64."""
    if host.startswith("-"):
        raise UsageError("is not a host (it starts with -)", field="--hosts", value=host)
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout_s)}"]
    if config:
        argv += ["-F", config]
    for opt in options:
        argv += ["-o", check_ssh_option(opt)]
    if port:
        argv += ["-p", str(port)]
    return [*argv, "--", host]


def ssh_hostname(argv: Sequence[str]) -> str | None:
    """The address ssh connects to for ``argv``, as ``ssh -G`` resolves it (``HostName``); None if unknown."""
    try:
        proc = process.run([argv[0], "-G", *argv[1:]], 10)
    except Unreachable:
        return None
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return None


class SshTarget(Target):
    """A host reached with the system ``ssh`` client (BatchMode, ConnectTimeout)."""

    def __init__(self, host: str, ssh_argv: Sequence[str], python: str = DEFAULT_PYTHON) -> None:
        self.host, self.ssh_argv, self.python = host, list(ssh_argv), check_python(python)
        self.where = f"ssh {host}"
        self.machine = split_host(host)[0].rpartition("@")[2]

    def start(self, module: str, args: Sequence[str] = ()) -> Running:
        """``ssh ... HOST python3 -c BOOTSTRAP MODULE ARGS`` (words shell-quoted for the remote), payload on stdin."""
        remote = " ".join(shlex.quote(a) for a in payload.command(self.python, module, args))
        return ProcessRunning([*self.ssh_argv, remote], payload_archive(), self.where)


def ssh_nodes(hosts: Sequence[str], config: str | None = None, options: Sequence[str] = (),
              connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S, python: str = DEFAULT_PYTHON) -> list[Node]:
    """Nodes (no reports yet) for ssh hosts, named as given, :class:`SshTarget`; ``address``: ``ssh -G``'s."""
    nodes = []
    for spec in hosts:
        host, port = split_host(spec)
        argv = ssh_argv(host, port, config, options, connect_timeout_s)
        address = ssh_hostname(argv) or host.rpartition("@")[2]
        target = SshTarget(spec, argv, python)
        target.machine = address
        nodes.append(Node(name=spec, source=f"ssh {spec}", address=address, target=target))
    return nodes


def _probe_one(node: Node, timeout_s: float) -> None:
    """Fill ``node.report`` or ``node.error`` (exit status 255 is ssh's own failure)."""
    assert node.target is not None
    try:
        out = node.target.run(PROBE_MODULE, ("--host",), timeout_s)
    except InvalidReport as e:  # it answered, with too much
        node.error = e
        return
    except EnvbuildError as e:
        node.error = Unreachable(f"cannot be reached: {e.message}", file=node.source)
        return
    if out.rc == 255:
        node.error = Unreachable(f"cannot be reached: {last_line(out.stderr)}", file=node.source)
        return
    try:
        node.report = report_from_output(out, node.source)
    except EnvbuildError as e:
        node.error = e


def from_ssh(hosts: Sequence[str], config: str | None = None, options: Sequence[str] = (),
             timeout_s: float = DEFAULT_TIMEOUT_S, connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
             python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe hosts over ssh at once, each within ``timeout_s``; a silent one: ``error`` (exit 3), ssh's line."""
    nodes = ssh_nodes(hosts, config, options, connect_timeout_s, python)
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        list(pool.map(lambda n: _probe_one(n, timeout_s), nodes))
    return nodes
