"""Fixtures for the registry tests: a real registry, a Docker config with its credentials,
small "certified" images (import them in conftest.py).

``registry_server`` (session) starts Debian's ``docker-registry`` (CNCF distribution 2.8,
``apt-get install docker-registry apache2-utils``) on a free loopback port with htpasswd
(bcrypt) authentication and its own storage folder under the session's tmp dir; it is
stopped and its storage removed at the end. That registry has no OCI Referrers API, so
envbuild's tag-schema fallback is what gets exercised.

``registry`` (function) points ``DOCKER_CONFIG`` at a folder whose ``config.json`` holds
the registry's credentials (as ``docker login`` would write them) for the duration of one
test, and gives the test its own repository namespace.

``RecordedLauncher`` is a certification launcher that starts nothing: each rank "reports"
the passing result a correct image would give (the probe equal to the image's lock), so
``builder.certify.run`` (settings, judging, certificate writer) produces a real
certificate document in milliseconds for small test images.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from builder.certify.source import read_image
from builder.launchers.base import LaunchResult
from builder.recipe import load, rules
from builder.render import context as render_context

from certify_helpers import certify_image
from factories import CPU_REPORT, node_report, profiles_result, rank_result

ROOT = Path(__file__).resolve().parent.parent
REGISTRY_USER = "envbuild-test"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RegistryServer:
    """A running ``docker-registry``.

    Attributes:
        host: ``"127.0.0.1:<port>"``.
        storage: its storage root (``docker/registry/v2/...`` below).
        username, password: the htpasswd account.
        docker_config: a folder with ``config.json`` holding those credentials.
        log: the registry's log file.
    """

    host: str
    storage: Path
    username: str
    password: str
    docker_config: Path
    log: Path
    proc: subprocess.Popen

    def blob_path(self, digest: str) -> Path:
        """Where the registry stores blob ``sha256:<hex>`` (distribution's filesystem driver)."""
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def session(self) -> requests.Session:
        """An HTTP session authenticated as the test user (for inspecting the registry)."""
        s = requests.Session()
        s.auth = (self.username, self.password)
        return s


def write_docker_config(folder: Path, host: str, username: str, password: str) -> Path:
    """Write ``folder/config.json`` as ``docker login host`` does (``auths.<host>.auth``)."""
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}, indent=2))
    return folder


@pytest.fixture(scope="session")
def registry_server(tmp_path_factory):
    """A real registry with htpasswd auth on a loopback port (see the module doc)."""
    binary = shutil.which("docker-registry")
    htpasswd = shutil.which("htpasswd")
    if not binary or not htpasswd:
        pytest.fail("the registry tests need Debian's docker-registry and htpasswd: "
                    "apt-get install docker-registry apache2-utils", pytrace=False)
    base = tmp_path_factory.mktemp("registry")
    password = uuid.uuid4().hex
    pw = subprocess.run([htpasswd, "-Bbn", REGISTRY_USER, password], capture_output=True, text=True, check=True)
    (base / "htpasswd").write_text(pw.stdout)
    port = free_port()
    host = f"127.0.0.1:{port}"
    storage = base / "storage"
    config = base / "config.yml"
    config.write_text(textwrap.dedent(f"""\
        version: 0.1
        log:
          level: info
        storage:
          filesystem:
            rootdirectory: {storage}
          delete:
            enabled: true
        http:
          addr: {host}
        auth:
          htpasswd:
            realm: envbuild-test
            path: {base / 'htpasswd'}
        """))
    log = base / "registry.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"http://{host}/v2/", timeout=2).status_code == 401:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"docker-registry did not start: {log.read_text()[-2000:]}", pytrace=False)
        time.sleep(0.2)
    server = RegistryServer(host=host, storage=storage, username=REGISTRY_USER, password=password,
                            docker_config=write_docker_config(base / "docker-config", host, REGISTRY_USER, password),
                            log=log, proc=proc)
    try:
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(storage, ignore_errors=True)


@pytest.fixture
def registry(registry_server, monkeypatch):
    """The session registry, with ``DOCKER_CONFIG`` holding its credentials for this test."""
    monkeypatch.setenv("DOCKER_CONFIG", str(registry_server.docker_config))
    return registry_server


@pytest.fixture
def namespace() -> str:
    """A repository namespace of this test alone (``t<8 hex>``)."""
    return "t" + uuid.uuid4().hex[:8]


# --------------------------------------------------------------------------- images


def recipe_labels(name: str = "cpu-torch2") -> dict[str, str]:
    """The labels the renderer gives recipe ``recipes/<name>.yaml`` (``envbuild.lock`` etc.)."""
    spec = rules.require_ok(rules.check(load.load(ROOT / "recipes" / f"{name}.yaml")))
    return dict(render_context.labels(spec, spec.lock()))


def small_image(client, tag: str, labels: dict[str, str], marker: str, base: str) -> str:
    """Build ``tag``: ``base`` plus a file ``/envbuild-marker`` holding ``marker`` (distinct
    markers give distinct images), with ``labels``. Returns the image ID."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="envbuild-small-") as ctx:
        Path(ctx, "Dockerfile").write_text(
            f"FROM {base}\nRUN printf '%s\\n' '{marker}' > /envbuild-marker\n")
        return client.build(ctx, tag, labels=labels)


class RecordedLauncher:
    """A launcher that starts nothing and returns, for every rank, the passing result a
    correct image would give: exact all-reduce at every size, identical DDP parameters,
    and a probe equal to the lock (with ``gpus``/``driver`` as given)."""

    def __init__(self, lock: dict, gpus: list[dict] | None = None, driver: str | None = None) -> None:
        self.lock = lock
        self.gpus = gpus or []
        self.driver = driver

    def probe(self) -> dict:
        """A whole node report (:data:`CPU_REPORT`) with the lock's stack in it."""
        lock = self.lock
        loaded = {"version": lock["nccl"], "code": 0, "path": "/opt/venv/lib/libnccl.so.2"} if lock.get("nccl") else None
        return node_report(CPU_REPORT, **{
            "hostname": "node", "os.id": lock["os"]["id"], "os.version_id": lock["os"]["version_id"],
            "glibc": lock["os"].get("glibc"),
            "python": {"version": f"{lock['python']}.2", "executable": "/opt/venv/bin/python3"},
            "torch.version": lock["torch"]["local"], "torch.cuda": lock.get("cuda"), "nccl.loaded": loaded,
            "gpus": self.gpus, "driver": self.driver,
        })

    def run(self, spec, on_progress=None) -> LaunchResult:
        args = spec.bench_args
        sizes = [int(x) for x in args[args.index("--sizes") + 1].split(",")]
        world = spec.world_size
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        results = {}
        for rank in range(world):
            results[rank] = rank_result(  # tests/factories.py, with what this replay gives
                rank, world,
                run_id=spec.run_id,  # certify refuses a result of another run
                backend=spec.backend,
                hostname=f"node-{spec.node_of_rank(rank)}",
                device="cuda" if spec.gpus_per_node else "cpu",
                profiles=profiles_result(rank, world, sizes, times=[100.0] * world, busbw=500.0),
                probe=self.probe(),
                local_rank=None, node_rank=None, started_at=None, finished_at=None, elapsed_s=None,
            )
        return LaunchResult(rank_results=results, node_logs={n: "" for n in range(spec.nodes)},
                            node_exit_codes={n: 0 for n in range(spec.nodes)}, timed_out=False,
                            missing_ranks=[], started_at=now, finished_at=now)


def recorded_certificate(client, image: str, images_dir: Path, labels: dict[str, str], *,
                         gpus: list[dict] | None = None, driver: str | None = None, **kw) -> tuple[dict, Path]:
    """The certification of ``image`` through :class:`RecordedLauncher`: a real
    certificate document, written under ``images_dir/<recipe>/certificates/``."""
    lock = read_image(client, image)[1].to_dict()
    # the recorded rank results are the ddp profile's (tests/factories.py)
    return certify_image(client, image, images_dir=images_dir, launcher=RecordedLauncher(lock, gpus, driver),
                         labels=labels, gpu_visible=bool(gpus), **kw)
