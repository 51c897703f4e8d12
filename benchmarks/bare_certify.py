"""The bare run that `envbuild certify` is measured against (not a test).

Run:  .venv/bin/python benchmarks/bare_certify.py IMAGE

Starts the same containers as a local certification of IMAGE (one per node, the recipe's node
count, on an internal Docker network, as a non-root UID on a read-only root with tmpfs /tmp,
all capabilities dropped, the recipe's /dev/shm size) and runs under torchrun, with the same
static rendezvous, ``benchmarks/bare_rank.py``: the default profile's work (the all-reduce
and broadcast loops of the lock's sizes, iterations and warm-up, each checked once; the lock's
DDP steps of the same ResNet-18 against the single-process reference; the scaling steps)
written as plain torch.distributed, nothing else. The settings come from the image's
``envbuild.lock`` label. Prints one JSON line (wall seconds from the first engine call to the
last container's removal, and rank 0's own split). Everything it creates carries ``envbuild.bench=<uuid>`` and is removed at the end.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
#: As the local launcher runs nodes (builder/launchers/local.py: RUN_USER, HOME, PYTHONPATH).
RUN_USER = "12345:12345"
HOME = "/tmp/home"


def node_command(node: int, nodes: int, port: int, cert: dict) -> list[str]:
    sweep, ddp = cert["allreduce"], cert["ddp"]
    return ["python3", "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", "1",
            "--node-rank", str(node), "--master-addr", "node-0", "--master-port", str(port), "--max-restarts", "0",
            "/opt/bare/bare_rank.py", ",".join(str(s) for s in sweep["sizes"]), str(sweep["iters"]),
            str(sweep["warmup"]), str(ddp["steps"]), str(ddp["batch_size"]), str(ddp["image_size"])]


def run(client: docker.DockerClient, image: str) -> dict:
    """Run the bare nodes of ``image``; rank 0's JSON line plus ``wall_s``."""
    t0 = time.monotonic()
    cert = json.loads(client.images.get(image).labels["envbuild.lock"])["certify"]
    nodes, port = int(cert["nodes"]), int(cert["port"])
    label = {"envbuild.bench": uuid.uuid4().hex}
    net = client.networks.create("envbuild-bare-" + label["envbuild.bench"][:12], internal=True, labels=label)
    containers = []
    try:
        for node in range(nodes):
            alias = f"node-{node}"
            containers.append(client.containers.create(
                image, command=node_command(node, nodes, port, cert), hostname=alias, labels=label,
                environment={"PYTHONPATH": "/opt/envbuild", "PYTHONDONTWRITEBYTECODE": "1", "HOME": HOME,
                             "USER": "envbuild"},
                user=RUN_USER, read_only=True, tmpfs={"/tmp": "rw,exec,mode=1777", HOME: "rw,mode=1777"},
                # only the rank script (benchmarks/ holds bench.py, which would shadow the bench package)
                volumes={str(ROOT / "builder" / "agent" / "bench"): {"bind": "/opt/envbuild/bench", "mode": "ro"},
                         str(ROOT / "benchmarks" / "bare_rank.py"): {"bind": "/opt/bare/bare_rank.py", "mode": "ro"}},
                cap_drop=["ALL"], security_opt=["no-new-privileges"], shm_size=cert.get("shm_size"),
                network=net.name, networking_config={net.name: client.api.create_endpoint_config(aliases=[alias])}))
        for c in containers:
            c.start()
        codes = [c.wait(timeout=1800)["StatusCode"] for c in containers]
        out = containers[0].logs(stderr=False).decode()
        if any(codes):
            raise SystemExit(f"bare nodes exited {codes}:\n{containers[0].logs().decode()[-3000:]}")
    finally:
        for c in containers:
            c.remove(force=True)
        net.remove()
    doc = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return {**doc, "nodes": nodes, "wall_s": time.monotonic() - t0}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 64
    print(json.dumps(run(docker.from_env(timeout=600), sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
