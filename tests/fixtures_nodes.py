"""Fixtures for the verify/doctor/gather tests: container "nodes", an sshd on loopback, a
real one-node Slurm, and node reports written to files (import the fixtures in conftest.py).

Everything created on the engine carries the session labels (``test_labels``) plus a
per-test label ``envbuild.test-case=<id>``; each test's containers are removed by that
label when the test ends (also on failure), the rest by the session finalizer. The sshd
runs from a temporary folder and is stopped at the end of the session. Slurm (Debian's
slurm-wlm + munge) is installed and started by ``scripts/setup-slurm.sh`` and left
running for later sessions (the Slurm launcher uses it too).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from fixtures_engine import TEST_SESSION_LABEL, shared_image

ROOT = Path(__file__).resolve().parent.parent
CASE_LABEL = "envbuild.test-case"


# --------------------------------------------------------------------------- machine tools


def ensure_apt(binary: str, package: str) -> str:
    """Path of ``binary`` (PATH or /usr/sbin); ``apt-get install package`` first when it
    is missing (fails the test, never skips, when that does not work)."""
    found = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-q"],
                 ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q",
                  "--no-install-recommends", package]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed: {proc.stderr.strip()[-300:]}", pytrace=False)
    found = shutil.which(binary) or f"/usr/sbin/{binary}"
    assert os.path.exists(found), f"{package} installed no {binary}"
    return found


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_envbuild(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run envbuild as ``python -m builder.cli`` on the interpreter running the tests (found
    wherever its venv is, activated or not); text output."""
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def run_json(*args: str, timeout: float = 300) -> tuple[int, dict]:
    """``envbuild ARGS --json``: (exit status, parsed stdout)."""
    proc = run_envbuild(*args, "--json", timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON (exit {proc.returncode}): {proc.stdout[-500:]} {proc.stderr[-1000:]}") from None
    return proc.returncode, doc


def finding(doc: dict, rule: str, field: str | None = None) -> list[dict]:
    """The findings of a verify JSON result with this rule (and field)."""
    return [f for f in doc["findings"] if f["rule"] == rule and (field is None or f["field"] == field)]


def check(doc: dict, name: str) -> dict:
    """The check called ``name`` of a doctor JSON result."""
    found = [c for c in doc["checks"] if c["name"] == name]
    assert len(found) == 1, doc["checks"]
    return found[0]


# --------------------------------------------------------------------------- container nodes


class NodeFactory:
    """Starts containers that stand for nodes (``sleep infinity``), labelled for cleanup.

    Attributes:
        labels: the labels on everything it starts (session labels + this test's case).
        case: this test's case id (``envbuild.test-case`` value).
    """

    def __init__(self, client, labels: dict[str, str]) -> None:
        self.client = client
        self.case = uuid.uuid4().hex[:12]
        self.labels = {**labels, CASE_LABEL: self.case}
        self.extra: list = []  # containers without our labels, removed by id

    def name(self, suffix: str) -> str:
        """A container name unique to this test: ``envbuild-test-<case>-<suffix>``."""
        return f"envbuild-test-{self.case}-{suffix}"

    def network(self) -> str:
        """A bridge network for this test's nodes (labelled); returns its name."""
        name = self.name("net")
        self.client.sdk.networks.create(name, driver="bridge", labels=self.labels)
        return name

    def start(self, image: str, suffix: str, *, labels: dict[str, str] | None = None,
              labelled: bool = True, **kwargs):
        """Start ``image`` running ``sleep infinity`` as container ``name(suffix)``.

        Args:
            labels: extra labels; labelled: False starts it with no labels at all (the
                factory still removes it at the end, by id).
            kwargs: passed to ``containers.run`` (``environment``, ``shm_size``,
                ``nano_cpus``, ``network``, ``cap_add``, ...).
        """
        all_labels = {**self.labels, **(labels or {})} if labelled else {}
        c = self.client.sdk.containers.run(image, ["sleep", "infinity"], name=self.name(suffix), detach=True,
                                       labels=all_labels, init=True, **kwargs)
        if not labelled:
            self.extra.append(c)
        c.reload()
        return c

    @staticmethod
    def iptables(container, action: str, port: int | str, syn_only: bool = False) -> None:
        """``iptables -A|-D INPUT -p tcp [--syn] --dport PORT -j DROP`` in the container's
        network namespace (nsenter from the host, as a firewall on that node would).
        ``port`` may be a range ``"32768:60999"``; ``syn_only`` drops new connections only
        (replies to the node's own connections still arrive)."""
        nsenter = ensure_apt("nsenter", "util-linux")
        iptables = ensure_apt("iptables", "iptables")
        container.reload()
        pid = str(container.attrs["State"]["Pid"])
        rule = ["INPUT", "-p", "tcp", *(["--syn"] if syn_only else []), "--dport", str(port), "-j", "DROP"]
        subprocess.run([nsenter, "-t", pid, "-n", iptables, action, *rule], check=True, capture_output=True,
                       timeout=30)

    def block_port(self, container, port: int | str, syn_only: bool = False) -> None:
        """Drop incoming TCP to ``port`` on ``container`` (see :meth:`iptables`)."""
        self.iptables(container, "-A", port, syn_only)

    def unblock_port(self, container, port: int | str, syn_only: bool = False) -> None:
        """Remove the rule :meth:`block_port` added."""
        self.iptables(container, "-D", port, syn_only)

    def cleanup(self) -> None:
        """Remove everything of this test case (by label) and the unlabelled extras."""
        for c in self.extra:
            try:
                c.remove(force=True)
            except Exception:
                pass
        self.client.remove_by_label(f"{CASE_LABEL}={self.case}")


@pytest.fixture
def nodes_factory(docker_client, test_labels):
    """A :class:`NodeFactory` whose containers and networks are removed after the test."""
    factory = NodeFactory(docker_client, test_labels)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture(scope="session")
def bumped_torch_image(docker_client, torch_image, run_labels, tmp_path_factory) -> str:
    """``torch_image`` with one pinned package changed: torch claims 2.13.1+cpu (its
    ``torch/version.py`` and its dist-info METADATA are rewritten). Built once per run, with
    the run's labels (removed at its end)."""
    ctx = tmp_path_factory.mktemp("bumped-torch")
    (ctx / "Dockerfile").write_text(textwrap.dedent(f"""\
        FROM {torch_image}
        RUN set -e; site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \\
            sed -i "s/^__version__ = .*/__version__ = '2.13.1+cpu'/" "$site/torch/version.py"; \\
            sed -i 's/^Version: .*/Version: 2.13.1+cpu/' "$site"/torch-*.dist-info/METADATA; \\
            grep -q "2.13.1+cpu" "$site/torch/version.py"
        """))
    tag = f"envbuild-test/torch-bumped:{run_labels[TEST_SESSION_LABEL]}"
    return shared_image(docker_client, tag, lambda: docker_client.build(ctx, tag, labels=run_labels))


# --------------------------------------------------------------------------- sshd


class Sshd:
    """An sshd on 127.0.0.1 with key auth only, and an ssh client config for it.

    Attributes:
        config: the client config (``ssh -F``) with hosts ``node-a`` and ``node-b`` (this
            sshd; node-b sends ``NCCL_DEBUG=INFO`` with SetEnv), ``dead`` (a closed port)
            and ``blackhole`` (a port that accepts and never answers).
        port: the sshd's port.
    """

    def __init__(self, config: Path, port: int) -> None:
        self.config = config
        self.port = port


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """Start ``/usr/sbin/sshd -D`` on 127.0.0.1 (a free high port) from a temporary folder
    with its own host key and an authorized client key; stopped at the end of the session."""
    sshd_bin = ensure_apt("sshd", "openssh-server")
    keygen = ensure_apt("ssh-keygen", "openssh-client")
    d = tmp_path_factory.mktemp("sshd")
    os.chmod(d, 0o700)
    for name in ("host_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True, timeout=60)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    os.chmod(d / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    port = free_port()
    (d / "sshd_config").write_text(textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {d}/host_key
        PidFile {d}/sshd.pid
        AuthorizedKeysFile {d}/authorized_keys
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PermitRootLogin prohibit-password
        PubkeyAuthentication yes
        UsePAM no
        StrictModes no
        AcceptEnv NCCL_*
        """))
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "wb"))
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(8)  # accepts (kernel backlog), never speaks: ssh waits for a banner
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"sshd exited: {(d / 'sshd.log').read_text()[-500:]}", pytrace=False)
                time.sleep(0.1)
        host_pub = (d / "host_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        common = textwrap.dedent(f"""\
            User root
            IdentityFile {d}/client_key
            IdentitiesOnly yes
            UserKnownHostsFile {d}/known_hosts
            StrictHostKeyChecking yes
            LogLevel ERROR
            """)
        (d / "ssh_config").write_text(
            f"Host node-a\n  HostName 127.0.0.1\n  Port {port}\n" + textwrap.indent(common, "  ")
            + f"Host node-b\n  HostName 127.0.0.1\n  Port {port}\n  SetEnv NCCL_DEBUG=INFO\n"
            + textwrap.indent(common, "  ")
            + f"Host dead\n  HostName 127.0.0.1\n  Port {free_port()}\n" + textwrap.indent(common, "  ")
            + f"Host blackhole\n  HostName 127.0.0.1\n  Port {blackhole.getsockname()[1]}\n"
            + textwrap.indent(common, "  "))
        yield Sshd(d / "ssh_config", port)
    finally:
        blackhole.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# --------------------------------------------------------------------------- slurm


@pytest.fixture(scope="session")
def slurm_node() -> str:
    """A real one-node Slurm (partition ``debug``) started by ``scripts/setup-slurm.sh``;
    returns the node name (this host's hostname)."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup-slurm.sh")], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"scripts/setup-slurm.sh failed: {(proc.stdout + proc.stderr).strip()[-800:]}", pytrace=False)
    return socket.gethostname()


# --------------------------------------------------------------------------- hand-written reports

#: The report documents come from tests/factories.py (one factory for every test).
from factories import GPU_REPORT, gpu_report, set_path  # noqa: E402, F401 - re-exported for the tests


def write_reports(folder: Path, docs: dict[str, dict | str]) -> list[str]:
    """Write ``{file name: report dict or raw text}`` under ``folder``; returns the paths
    in the order given."""
    paths = []
    for name, doc in docs.items():
        p = folder / name
        p.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
        paths.append(str(p))
    return paths
