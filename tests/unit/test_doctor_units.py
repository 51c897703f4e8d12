"""The engine-free tests of tests/integration/test_doctor.py: envbuild doctor: every check with a real failing case and its passing twin, on
container "nodes" of the torch image (firewall by iptables in a node's network namespace,
a second network, --shm-size, NCCL_SOCKET_IFNAME, --cpus) and on hand-written reports
(duplicate GPUs, GPU processes); stale containers removed by --fix and nothing else."""

from __future__ import annotations

import json

import pytest

from builder.nodes.doctor import agent_output
from builder.nodes.report import InvalidReport

from fixtures_nodes import (  # noqa: F401 - pytest fixtures
    CASE_LABEL,
    check,
    gpu_report,
    nodes_factory,
    run_envbuild,
    run_json,
    write_reports,
)


def containers(*cs) -> list[str]:
    out = []
    for c in cs:
        out += ["--container", c.name]
    return out


@pytest.mark.parametrize("line, spec, message", [
    ('{"compute": {"backend": "torch-cpu", "iters": 1, "seconds": [], "best_s": 0}}', "AGENT_COMPUTE",
     "ssh n: agent output: compute.best_s: 0 is not a number in 1e-09..1e+09"),
    ('{"pairs": [{"peer": "x", "round": 0, "seconds": 1.0, "error": null}]}', "AGENT_PAIRS",
     "ssh n: agent output: pairs[0].peer: 'x' is not an integer in 0..65535"),
    ('{"ports": {"29500": "listening"}, "sample": [70000]}', "AGENT_LISTEN",
     "ssh n: agent output: sample[0]: 70000 is not a port (0..65535)"),
    ('{"results": {"rdzv:a": {"status": "[/]", "detail": "", "seconds": 0}}}', "AGENT_CONNECT",
     "ssh n: agent output: results.rdzv:a.status: '[/]' is not 'ok' or 'open' or 'refused' or 'timeout' or "
     "'unreachable' or 'error'"),
])
def test_agent_output_is_checked_before_use(line, spec, message):
    model = {"AGENT_COMPUTE": agent_output.Compute, "AGENT_PAIRS": agent_output.Pairs,
             "AGENT_LISTEN": agent_output.Listen, "AGENT_CONNECT": agent_output.Connect}[spec]
    with pytest.raises(InvalidReport) as err:
        agent_output.last_json("noise\n" + line + "\n", model, "ssh n")
    assert str(err.value) == message
    # the passing twin: the agent's real output shape
    good = {"AGENT_COMPUTE": '{"compute": {"backend": "torch-cpu", "iters": 1, "seconds": [0.5], "best_s": 0.5}}',
            "AGENT_PAIRS": '{"pairs": [{"peer": 1, "round": 0, "seconds": 1.0, "error": null}]}',
            "AGENT_LISTEN": '{"ports": {"29500": "listening"}, "sample": [32768]}',
            "AGENT_CONNECT": '{"results": {"rdzv:a": {"status": "ok", "detail": "connected", "seconds": 0.0}}}'}
    assert agent_output.last_json(good[spec], model, "ssh n").to_dict() == json.loads(good[spec])
    assert agent_output.last_json('{"deep": ' + "[" * 5000 + "]" * 5000 + "}", model, "n") is None




@pytest.mark.parametrize(("name", "status", "cls", "step"), [
    ("port", "fail", "network", "fix the network config (the interface NCCL/gloo use, its MTU, the firewall between "
                                "the nodes)"),
    ("shm", "warn", "image", "fix the image (or the node image) and run again"),
    ("gpu-processes", "fail", "workload", "look at the job that ran (an application fault); the GPU stays usable"),
    ("straggler", "fail", "hardware", "drain the node and open a vendor case (attach nvidia-bug-report.sh output)"),
    ("shm", "pass", None, None), ("port", "unknown", None, None), ("straggler", "skip", None, None),
])
def test_a_failing_check_carries_its_class_and_next_step(name, status, cls, step):
    from builder.cli.documents import DoctorCheck
    from builder.nodes.doctor.base import Check

    c = Check(name, status, "m")
    assert (c.cls, c.next_step) == (cls, step)
    doc = DoctorCheck(**vars(c)).to_dict()
    assert (doc["cls"], doc["next_step"]) == (cls, step)


@pytest.mark.parametrize(("level", "rule", "field", "cls"), [
    ("fail", "interface", "env.NCCL_SOCKET_IFNAME", "network"), ("warn", "must-match", "gpu.models", "hardware"),
    ("fail", "must-match", "torch.version", "image"), ("unknown", "unreachable", None, None),
])
def test_a_verify_finding_carries_its_class(level, rule, field, cls):
    from builder.core.errors import next_step
    from builder.nodes.verify.result import Finding, classified

    f = classified(Finding(level=level, rule=rule, field=field, message="m"))
    assert (f.cls, f.next_step) == (cls, cls and next_step(cls))
