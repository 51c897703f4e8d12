"""`certify --bisect` on real local nodes (builder/certify/bisect.py): three container nodes,
node 2 with a broken socket setting (``GLOO_SOCKET_IFNAME`` naming an interface it does not
have: its rank fails at the rendezvous and every collective of the others waits on it, so
the verdict blames every rank). The search runs nodes 0,1 (pass) and 2 with 0 (fail) and names
node 2, reason ``network``, with that run's evidence. The passing twin: the same three nodes,
none broken, pass.

(``--cpus 0.2`` on one node is no fault on this shared 2-core machine while others load it:
every process then gets less than a fifth of a CPU anyway, and the throttled node kept the
busbw floor in a trial; docs/bisect.md.)
"""

from __future__ import annotations

import json

from builder.certify import bisect, run
from builder.certify.settings import Overrides
from builder.certify.source import EngineImage
from builder.launchers.local import LocalDockerLauncher

SETTINGS = dict(nodes=3, sizes=[65536], iters=3, warmup=1, timeout_s=300, backend="gloo")
BROKEN = {2: {"environment": {"GLOO_SOCKET_IFNAME": "nosuchif0"}}}
GRACE_S = 5.0  # the others' grace once node 2 failed (20 s by default)


def certify(client, image, labels, images_dir, launcher):
    p = run.plan(EngineImage(client, image), Overrides(**SETTINGS), labels=labels)
    judged: list = []
    cert, path = run.run(p, images_dir=images_dir, launcher=launcher,
                         judged=lambda launch, verdict: judged.extend((launch, verdict)))
    return p, cert, path, judged


NETCONFIG = "fix the network config (the interface NCCL/gloo use, its MTU, the firewall between the nodes)"


def test_healthy_nodes_pass(docker_client, torch_image, test_labels, tmp_path):
    _, cert, _, _ = certify(docker_client, torch_image, test_labels, tmp_path,
                            LocalDockerLauncher(docker_client, grace_s=GRACE_S))
    assert cert.verdict.passed and cert.world_size == 3, cert.verdict.failures
    assert (cert.verdict.failure_class, cert.verdict.next_step) == (None, None)  # the passing twin has none


def test_bisection_names_the_node_with_the_broken_socket_setting(docker_client, torch_image, test_labels, tmp_path):
    launcher = LocalDockerLauncher(docker_client, grace_s=GRACE_S, node_options=BROKEN)
    p, cert, path, judged = certify(docker_client, torch_image, test_labels, tmp_path, launcher)
    assert not cert.verdict.passed and cert.verdict.exit_code == 2, cert.verdict
    assert (cert.verdict.failure_class, cert.verdict.next_step) == ("network", NETCONFIG)
    doc = bisect.bisect(p, judged[0], judged[1], launcher)
    assert (doc.reason, doc.unresolved, doc.rounds) == ("network", [], 1)
    assert [(t.nodes, t.passed, t.reason) for t in doc.trials] == [([0, 1], True, None), ([2, 0], False, "network")]
    assert [(b.node, b.reason, b.run_id) for b in doc.bad] == [(2, "network", doc.trials[1].run_id)]
    assert doc.bad[0].evidence[0].startswith("nodes 2,0 as ranks 0..1: rank 0 exited with 1"), doc.bad[0].evidence
    written = bisect.write_bisection(doc, path)
    assert written.name == path.stem + ".bisect.json"
    assert json.loads(written.read_text())["bad"][0] == {"node": 2, "reason": "network", "next_step": NETCONFIG,
                                                         "evidence": doc.bad[0].evidence,
                                                         "run_id": doc.trials[1].run_id}
    assert docker_client.sdk.api.containers(all=True, filters={"label": f"envbuild.run={doc.trials[1].run_id}"}) == []
