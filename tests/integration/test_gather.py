"""Gathering node reports: over ssh (a real sshd on loopback with key auth; a refused and a
silent host), under a real one-node Slurm, from running containers; the node-report
fields the probe adds for verify/doctor; and the in-node agent's helpers."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import msgspec
import pytest
from test_gather_units import _free_port  # noqa: F401

from builder.nodes import sources
from builder.nodes.sources import containers

from fixtures_nodes import (  # noqa: F401 - pytest fixtures
    check,
    finding,
    gpu_report,
    nodes_factory,
    run_envbuild,
    run_json,
    slurm_node,
    sshd,
    write_reports,
)

# --- ssh --------------------------------------------------------------------------------------------

def test_ssh_reachable_and_unreachable_hosts(sshd):
    t0 = time.monotonic()
    code, doc = run_json("verify", "--hosts", "node-a,node-b,dead", "--hosts", "blackhole",
                         "--ssh-config", str(sshd.config), "--connect-timeout", "3", "--timeout", "20")
    took = time.monotonic() - t0
    assert code == 3
    assert took < 60, f"verify took {took:.0f} s"
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert [n["name"] for n in doc["nodes"]] == ["node-a", "node-b", "dead", "blackhole"]
    assert (nodes["node-a"]["ok"], nodes["node-b"]["ok"]) == (True, True)
    assert nodes["node-a"]["hostname"] == socket.gethostname()
    assert nodes["node-a"]["address"] == "127.0.0.1"  # ssh -G resolved the alias
    unknown = {f["nodes"][0]: f["message"] for f in doc["findings"] if f["level"] == "unknown"}
    assert set(unknown) == {"dead", "blackhole"}
    assert unknown["dead"].startswith("ssh dead: cannot be reached: ssh: connect to host 127.0.0.1 port ")
    assert unknown["dead"].endswith("Connection refused")
    # accepted, never a banner: ssh's ConnectTimeout covers the banner exchange
    assert unknown["blackhole"] == "ssh blackhole: cannot be reached: Connection timed out during banner exchange"
    # the two reachable hosts were still compared: node-b sends NCCL_DEBUG=INFO (SetEnv)
    assert finding(doc, "should-match", "env.NCCL_DEBUG")[0]["groups"] == [
        {"value": None, "nodes": ["node-a"]}, {"value": "INFO", "nodes": ["node-b"]}]


def test_ssh_host_that_hangs_is_cut_off(sshd, tmp_path):
    hang = tmp_path / "python-that-hangs"
    hang.write_text("#!/bin/sh\nexec sleep 15\n")  # outlives --timeout, then ends by itself
    hang.chmod(0o755)
    t0 = time.monotonic()
    code, doc = run_json("verify", "--hosts", "node-a", "--ssh-config", str(sshd.config), "--python", str(hang),
                         "--timeout", "4")
    assert code == 3
    assert time.monotonic() - t0 < 30
    assert [f["message"] for f in doc["findings"]] == ["ssh node-a: cannot be reached: no answer within 4 s"]


def test_ssh_hosts_that_agree(sshd):
    code, doc = run_json("verify", "--hosts", "node-a", "--hosts", "node-a:" + str(sshd.port),
                         "--ssh-config", str(sshd.config))
    assert code in (0, 1), doc  # 1 only if the host probe itself met problems
    assert [f for f in doc["findings"] if f["rule"] != "probe-errors"] == []
    assert [n["name"] for n in doc["nodes"]] == ["node-a", f"node-a:{sshd.port}"]


def test_doctor_over_ssh_checks_the_ports(sshd):
    code, doc = run_json("doctor", "--hosts", "node-a,node-b", "--ssh-config", str(sshd.config),
                         "--checks", "nodes,port", "--port", str(_free_port()), "--connect-timeout", "3")
    assert (code, [c["status"] for c in doc["checks"]]) == (0, ["pass", "pass"]), doc


def test_allowed_ssh_option_reaches_ssh(sshd):
    code, doc = run_json("verify", "--hosts", "node-a", "--ssh-config", str(sshd.config),
                         "--ssh-option", "ConnectTimeout=3", "--ssh-option", "ServerAliveInterval=5")
    assert code in (0, 1), doc
    assert [n["ok"] for n in doc["nodes"]] == [True]


# --- output of a node, bounded (issue 8) ------------------------------------------------------------

def _fake_python(tmp_path: Path, name: str, body: str) -> str:
    """An executable that stands in for the node's python3, run as ``python3 -c BOOTSTRAP
    MODULE ARGS`` with the agent payload on stdin: ``$3`` is ``probe`` for the probe and
    ``doctor_agent`` for the doctor agent."""
    exe = tmp_path / name
    exe.write_text("#!/bin/sh\ncat > /dev/null\n" + body)
    exe.chmod(0o755)
    return str(exe)


def test_a_node_that_prints_too_much_is_cut_off(sshd, tmp_path):
    flood = _fake_python(tmp_path, "flood", "head -c 20000000 /dev/zero | tr '\\0' x\n")
    t0 = time.monotonic()
    code, doc = run_json("verify", "--hosts", "node-a", "--ssh-config", str(sshd.config), "--python", flood,
                         "--timeout", "60")
    assert time.monotonic() - t0 < 60
    assert (code, [f["message"] for f in doc["findings"]]) == (
        3, ["ssh node-a: printed over 16777216 bytes on stdout, the limit of a node report; stopped"])
    # the passing twin: a node that prints a valid report of its own
    report = tmp_path / "report.json"
    report.write_text(json.dumps(gpu_report(1)))
    good = _fake_python(tmp_path, "good", f"cat {report}\n")
    code, doc = run_json("verify", "--hosts", "node-a", "--ssh-config", str(sshd.config), "--python", good)
    assert (code, doc["findings"]) == (0, [])


@pytest.mark.parametrize("body, message", [
    ("printf '['%.0s $(seq 3000)\n", "ssh node-a: not valid JSON: nesting deeper than 64 levels"),
    ("printf '{\"schema\": \"envbuild.probe/1\", \"x\": 1%s}' $(printf '0%.0s' $(seq 100))\n",
     "ssh node-a: not valid JSON: an integer of 101 digits (at most 30)"),
    ("printf '\\033[2J[/]'\n", "ssh node-a: not valid JSON: Expecting value: line 1 column 1 (char 0)"),
])
def test_hostile_output_of_a_node_is_one_line(sshd, tmp_path, body, message):
    exe = _fake_python(tmp_path, "hostile", body)
    code, doc = run_json("verify", "--hosts", "node-a", "--ssh-config", str(sshd.config), "--python", exe)
    assert (code, [f["message"] for f in doc["findings"]]) == (3, [message])


def test_hostile_agent_output_is_not_checked_not_a_traceback(sshd, tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(gpu_report(1, **{"network.ip_local_port_range": [32768, 32800]})))
    exe = _fake_python(tmp_path, "agent", f'if [ "$3" = probe ]; then cat {report}; else '
                       'echo \'{"compute": {"backend": "x", "iters": 1, "seconds": [], "best_s": -1}}\'; fi\n')
    code, doc = run_json("doctor", "--hosts", "node-a,node-b", "--ssh-config", str(sshd.config), "--python", exe,
                         "--checks", "straggler")
    assert code == 3, doc
    assert check(doc, "straggler")["details"][:2] == [
        "node-a: ssh node-a: agent output: compute.best_s: -1 is not a number in 1e-09..1e+09",
        "node-b: ssh node-b: agent output: compute.best_s: -1 is not a number in 1e-09..1e+09"]


# --- slurm ------------------------------------------------------------------------------------------

def test_slurm_gathers_every_node(slurm_node, tmp_path):
    code, doc = run_json("verify", "--slurm", "--partition", "debug", "--timeout", "120")
    assert code in (0, 1), doc
    assert [(n["name"], n["source"], n["ok"]) for n in doc["nodes"]] == [(slurm_node, f"slurm {slurm_node}", True)]
    # mixed with a report file: the Slurm node runs no torch, the file's node does
    paths = write_reports(tmp_path, {"gpu.json": gpu_report(1)})
    code, doc = run_json("verify", "--slurm", *paths)
    assert code == 2
    assert finding(doc, "must-match", "torch.version")[0]["groups"] == [
        {"value": "2.8.0+cu128", "nodes": ["node-1"]}, {"value": None, "nodes": [slurm_node]}]


def test_slurm_doctor_runs_scripts_through_srun(slurm_node):
    code, doc = run_json("doctor", "--slurm", "--checks", "nodes,port,shm,straggler", "--min-shm", "1m")
    assert code == 0, doc
    assert [(c["name"], c["status"]) for c in doc["checks"]] == [
        ("nodes", "pass"), ("port", "skip"), ("shm", "pass"), ("straggler", "skip")]
    # and a script run as one srun step pinned to the node
    [node] = sources.gather(sources.Sources(slurm=True))
    out = node.target.run("doctor_agent", ["compute", "--iters", "1", "--repeats", "1"], 60)
    assert out.rc == 0 and json.loads(out.stdout)["compute"]["backend"] in ("python", "torch-cpu")


def test_slurm_unknown_partition_cannot_check(slurm_node):
    proc = run_envbuild("verify", "--slurm", "--partition", "no-such-partition", "--timeout", "60")
    assert proc.returncode == 3
    assert proc.stderr.strip() == ("error: slurm: srun gave no node reports (exit status 1): srun: error: "
                                   "Unable to allocate resources: Invalid partition name specified")


# --- containers ---------------------------------------------------------------------------------------

def test_container_reports_name_image_and_runtime(docker_client, torch_image, nodes_factory):
    c = nodes_factory.start(torch_image, "node-0", shm_size="128m", environment={"GLOO_SOCKET_IFNAME": "eth0"})
    [node] = containers.from_containers(docker_client, names=[c.name])
    assert node.ok, node.error
    r = node.report
    image = docker_client.sdk.images.get(torch_image)
    assert msgspec.to_builtins(r.image) == {"ref": torch_image, "digest": None, "id": image.id}
    assert r.container.runtime == "docker"
    assert r.container.version == docker_client.version()["Version"]
    assert r.shm.size_bytes == 134217728
    assert r.env == {"GLOO_SOCKET_IFNAME": "eth0"}
    ip = c.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
    assert node.address == ip
    eth0 = [i for i in r.network.interfaces if i.name == "eth0"][0]
    assert [a.address for a in eth0.addresses if a.family == "inet"] == [ip]
    assert r.network.default_route_interface == "eth0"
    assert r.network.hostname_addresses == [ip]
    assert r.torch.version == "2.13.0+cpu"


def test_a_container_that_prints_too_much_is_cut_off(docker_client, torch_image, nodes_factory):
    c = nodes_factory.start(torch_image, "flood")
    rc, _ = c.exec_run(["sh", "-c", "printf '#!/bin/sh\\nhead -c 20000000 /dev/zero\\n' > /tmp/flood; "
                        "chmod +x /tmp/flood"])
    assert rc == 0
    t0 = time.monotonic()
    code, doc = run_json("verify", "--container", c.name, "--python", "/tmp/flood", "--timeout", "60")
    assert time.monotonic() - t0 < 60
    assert (code, [f["message"] for f in doc["findings"]]) == (
        3, [f"container {c.name}: printed over 16777216 bytes on stdout, the limit of a node report; stopped"])
    # the passing twin: the image's own python3 prints a valid report
    code, doc = run_json("verify", "--container", c.name)
    assert code in (0, 1) and [n["ok"] for n in doc["nodes"]] == [True], doc


def test_no_running_container_cannot_check(docker_client, nodes_factory):
    proc = run_envbuild("verify", "--label", f"envbuild.test-case={nodes_factory.case}")
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"error: no running container of label envbuild.test-case={nodes_factory.case}"
