"""envbuild doctor: every check with a real failing case and its passing twin, on
container "nodes" of the torch image (firewall by iptables in a node's network namespace,
a second network, --shm-size, NCCL_SOCKET_IFNAME, --cpus) and on hand-written reports
(duplicate GPUs, GPU processes); stale containers removed by --fix and nothing else."""

from __future__ import annotations

import datetime
import time

import docker.errors
import pytest
from test_doctor_units import containers  # noqa: F401

from builder.nodes import doctor

from fixtures_nodes import (  # noqa: F401 - pytest fixtures
    CASE_LABEL,
    check,
    gpu_report,
    nodes_factory,
    run_envbuild,
    run_json,
    write_reports,
)


def doctor_json(*args: str) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    code, doc = run_json("doctor", *args)
    return code, doc, time.monotonic() - t0


def statuses(doc: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in doc["checks"]}


# --- firewall ----------------------------------------------------------------------------------

@pytest.mark.serial  # timed: alone, after the parallel pass (Makefile)
def test_blocked_rendezvous_port_is_named_with_the_host_pair(torch_image, nodes_factory):
    net = nodes_factory.network()
    n0 = nodes_factory.start(torch_image, "node-0", network=net)
    n1 = nodes_factory.start(torch_image, "node-1", network=net)
    nodes_factory.block_port(n0, 29500)
    code, doc, took = doctor_json(*containers(n0, n1), "--checks", "port", "--connect-timeout", "3")
    assert code == 2
    port = check(doc, "port")
    assert port["status"] == "fail"
    ip0 = n0.attrs["NetworkSettings"]["Networks"][net]["IPAddress"]
    assert port["details"] == [f"{n1.name} -> {n0.name} ({ip0}) port 29500/tcp: timeout (no answer within 3 s)"]
    assert port["message"].startswith(f"firewall: {n1.name} -> {n0.name}")
    assert "open TCP 29500 (rendezvous) on " + n0.name in port["fix"]
    assert (port["cls"], port["next_step"]) == (
        "network", "fix the network config (the interface NCCL/gloo use, its MTU, the firewall between the nodes)")
    assert took < 45, f"doctor took {took:.0f} s"

    # the passing twin: the same nodes once the rule is gone (the listener of the first
    # run was stopped, so 29500 is free again)
    nodes_factory.unblock_port(n0, 29500)
    code, doc, took = doctor_json(*containers(n0, n1), "--checks", "port", "--connect-timeout", "3")
    assert (code, statuses(doc)) == (0, {"port": "pass"})
    assert check(doc, "port")["message"] == (f"5 connections ok: rendezvous {n0.name}:29500 from 1 other node, "
                                             "2 ephemeral ports of every node from every peer")

    # NCCL's own connections: new connections into node-1's ephemeral range dropped
    nodes_factory.block_port(n1, "32768:60999", syn_only=True)
    code, doc, took = doctor_json(*containers(n0, n1), "--checks", "port", "--connect-timeout", "3")
    assert code == 2
    details = check(doc, "port")["details"]
    assert len(details) == 2
    assert all(d.startswith(f"{n0.name} -> {n1.name} (") and d.endswith("[ephemeral range]") for d in details)
    assert took < 45


# --- interface -----------------------------------------------------------------------------------

def test_nccl_socket_ifname_naming_a_missing_interface(torch_image, nodes_factory):
    net = nodes_factory.network()
    n0 = nodes_factory.start(torch_image, "node-0", network=net, environment={"NCCL_SOCKET_IFNAME": "eth0"})
    n1 = nodes_factory.start(torch_image, "node-1", network=net, environment={"NCCL_SOCKET_IFNAME": "eth9"})
    code, doc, _ = doctor_json(*containers(n0, n1), "--checks", "interface")
    assert code == 2
    assert check(doc, "interface")["details"] == [
        f"{n1.name}: NCCL_SOCKET_IFNAME=eth9: no such interface with an address (it has: lo, eth0)"]
    code, doc = run_json("verify", *containers(n0, n1))  # verify says it too
    assert code == 2
    assert [f["message"] for f in doc["findings"] if f["rule"] == "interface"] == [
        f"NCCL_SOCKET_IFNAME=eth9 on {n1.name} matches no interface with an address (it has: lo, eth0)"]


def test_nccl_socket_ifname_present_everywhere(torch_image, nodes_factory):
    net = nodes_factory.network()
    n0 = nodes_factory.start(torch_image, "node-0", network=net, environment={"NCCL_SOCKET_IFNAME": "eth0"})
    n1 = nodes_factory.start(torch_image, "node-1", network=net, environment={"NCCL_SOCKET_IFNAME": "eth0"})
    code, doc, _ = doctor_json(*containers(n0, n1), "--checks", "interface")
    assert (code, statuses(doc)) == (0, {"interface": "pass"})
    assert check(doc, "interface")["message"] == "the interfaces NCCL/gloo would pick exist, are not loopback"


@pytest.mark.serial  # timed: alone, after the parallel pass (Makefile)
def test_interface_not_reachable_from_the_peer(docker_client, torch_image, nodes_factory):
    # node-0 also sits on a second network node-1 is not on, and NCCL is told to use it
    net = nodes_factory.network()
    other = nodes_factory.name("other")
    docker_client.sdk.networks.create(other, driver="bridge", labels=nodes_factory.labels)
    n0 = nodes_factory.start(torch_image, "node-0", network=net, environment={"NCCL_SOCKET_IFNAME": "eth1"})
    docker_client.sdk.networks.get(other).connect(n0)
    n1 = nodes_factory.start(torch_image, "node-1", network=net, environment={"NCCL_SOCKET_IFNAME": "eth0"})
    n0.reload()
    ip_other = n0.attrs["NetworkSettings"]["Networks"][other]["IPAddress"]
    code, doc, took = doctor_json(*containers(n0, n1), "--checks", "interface", "--connect-timeout", "3")
    assert code == 2
    [line] = check(doc, "interface")["details"]
    assert line.startswith(f"{n0.name}'s eth1 address {ip_other} is not reachable from {n1.name}: ")
    assert took < 45


def test_loopback_interface_fails(torch_image, nodes_factory):
    n0 = nodes_factory.start(torch_image, "node-0", environment={"NCCL_SOCKET_IFNAME": "lo"})
    n1 = nodes_factory.start(torch_image, "node-1")
    code, doc, _ = doctor_json(*containers(n0, n1), "--checks", "interface")
    assert code == 2
    assert check(doc, "interface")["details"] == [
        f"{n0.name}: NCCL would use loopback lo (127.0.0.1; NCCL_SOCKET_IFNAME=lo): other nodes cannot reach it"]


# --- /dev/shm -------------------------------------------------------------------------------------

def test_small_shm_fails(torch_image, nodes_factory):
    n0 = nodes_factory.start(torch_image, "node-0", shm_size="512m")
    n1 = nodes_factory.start(torch_image, "node-1", shm_size="1m")
    code, doc, _ = doctor_json(*containers(n0, n1), "--checks", "shm")
    assert code == 2
    assert check(doc, "shm")["message"] == f"{n1.name}: /dev/shm is 1.0 MiB, below 256.0 MiB"
    assert "--shm-size=1g" in check(doc, "shm")["fix"]


def test_large_enough_shm_passes(torch_image, nodes_factory):
    n0 = nodes_factory.start(torch_image, "node-0", shm_size="512m")
    n1 = nodes_factory.start(torch_image, "node-1", shm_size="512m")
    code, doc, _ = doctor_json(*containers(n0, n1), "--checks", "shm")
    assert (code, check(doc, "shm")["message"]) == (0, "/dev/shm >= 256.0 MiB on every node")
    code, doc, _ = doctor_json(*containers(n0, n1), "--checks", "shm", "--min-shm", "1g")
    assert code == 2  # the threshold is a setting


# --- straggler ------------------------------------------------------------------------------------

@pytest.mark.serial  # timed: alone, after the parallel pass (Makefile)
def test_cpu_limited_node_is_the_straggler(torch_image, nodes_factory):
    net = nodes_factory.network()
    a = nodes_factory.start(torch_image, "node-a", network=net)
    b = nodes_factory.start(torch_image, "node-b", network=net)
    slow = nodes_factory.start(torch_image, "node-slow", network=net, nano_cpus=200_000_000)  # --cpus=0.2
    c = nodes_factory.start(torch_image, "node-c", network=net)
    code, doc, _ = doctor_json(*containers(a, b, slow), "--checks", "straggler", "--straggler-ratio", "2")
    assert code == 2, doc
    st = check(doc, "straggler")
    assert st["message"].startswith(f"straggler: {slow.name} computes ")
    compute = st["data"]["compute"]
    assert compute[slow.name] > 2 * max(compute[a.name], compute[b.name])
    assert len(st["data"]["pairs"]) == 3 and all(p["error"] is None for p in st["data"]["pairs"])

    code, doc, _ = doctor_json(*containers(a, b, c), "--checks", "straggler", "--straggler-ratio", "2")
    assert (code, statuses(doc)) == (0, {"straggler": "pass"}), check(doc, "straggler")
    assert check(doc, "straggler")["message"] == "no node slower than 2x the median (3 nodes, 3 pairs)"


# --- stale containers ------------------------------------------------------------------------------

def test_fix_removes_the_leftover_and_nothing_else(docker_client, torch_image, nodes_factory):
    scope = f"{CASE_LABEL}={nodes_factory.case}"
    leftover = nodes_factory.start(torch_image, "leftover", labels={"envbuild": "1", "envbuild.run": "0123456789ab"})
    exited = nodes_factory.start(torch_image, "exited", labels={"envbuild": "1", "envbuild.run": "ba9876543210"})
    exited.stop(timeout=1)
    ours = nodes_factory.start(torch_image, "not-envbuild")  # the test's labels, not envbuild's
    bare = nodes_factory.start(torch_image, "bare", labelled=False)  # no labels at all
    args = ("--checks", "stale-containers", "--stale-label", scope, "--stale-after", "0")
    code, doc, _ = doctor_json(*args)
    assert code == 2
    stale = check(doc, "stale-containers")
    assert stale["data"]["stale"] == sorted([exited.name, leftover.name])
    assert stale["fix"] == "`envbuild doctor --fix` removes them (only containers and networks labelled envbuild)"
    assert (stale["cls"], stale["next_step"]) == (
        "workload", "look at the job that ran (an application fault); the GPU stays usable")

    code, doc, _ = doctor_json(*args, "--fix")
    assert code == 0
    assert check(doc, "stale-containers")["data"]["removed"] == sorted([exited.name, leftover.name])
    for gone in (leftover, exited):
        with pytest.raises(docker.errors.NotFound):
            docker_client.sdk.containers.get(gone.id)
    for kept in (ours, bare):
        assert docker_client.sdk.containers.get(kept.id).status == "running"
    code, doc, _ = doctor_json(*args)
    assert (code, check(doc, "stale-containers")["message"]) == (
        0, f"no stale containers or networks (label envbuild, {scope})")


def test_fix_removes_a_stale_network_and_keeps_live_ones(docker_client, torch_image, nodes_factory):
    """A run network as envbuild labels it whose deadline passed is stale and removed by
    --fix; a live run's network (deadline ahead), one still in use, and one without
    envbuild's labels are kept."""
    from builder.image import engine

    scope = f"{CASE_LABEL}={nodes_factory.case}"
    past, ahead = time.time() - 60, time.time() + 3600

    def run_network(suffix: str, deadline: float | None, run: str) -> str:
        labels = {**nodes_factory.labels, **engine.run_labels(run)}
        if deadline is not None:
            labels[engine.DEADLINE_LABEL] = engine.deadline_label(deadline)
        name = nodes_factory.name(suffix)
        docker_client.sdk.networks.create(name, driver="bridge", internal=True, labels=labels)
        return name

    stale = run_network("stale", past, "0123456789ab")
    live = run_network("live", ahead, "aaaaaaaaaaaa")
    busy = run_network("busy", past, "bbbbbbbbbbbb")
    nodes_factory.start(torch_image, "on-busy", network=busy)
    undated = run_network("undated", None, "cccccccccccc")
    plain = nodes_factory.network()  # the test's labels, not envbuild's
    args = ("--checks", "stale-containers", "--stale-label", scope, "--stale-after", "3600")
    code, doc, _ = doctor_json(*args)
    found = check(doc, "stale-containers")
    assert (code, found["message"], found["data"]["stale_networks"]) == (
        2, f"1 stale envbuild networks: {stale}", [stale])

    code, doc, _ = doctor_json(*args, "--fix")
    fixed = check(doc, "stale-containers")
    assert (code, fixed["data"]["removed_networks"]) == (0, [stale]), fixed
    with pytest.raises(docker.errors.NotFound):
        docker_client.sdk.networks.get(stale)
    for kept in (live, busy, undated, plain):
        assert docker_client.sdk.networks.get(kept).name == kept
    code, doc, _ = doctor_json(*args)
    assert (code, check(doc, "stale-containers")["message"]) == (
        0, f"no stale containers or networks (label envbuild, {scope})")


def test_recent_runs_are_not_stale(docker_client, torch_image, nodes_factory):
    scope = f"{CASE_LABEL}={nodes_factory.case}"
    running = nodes_factory.start(torch_image, "running", labels={"envbuild": "1", "envbuild.run": "aaaaaaaaaaaa"})
    sibling = nodes_factory.start(torch_image, "sibling", labels={"envbuild": "1", "envbuild.run": "aaaaaaaaaaaa"})
    sibling.stop(timeout=1)  # one node of a run ended, another still runs: the run is alive
    now = datetime.datetime.now(datetime.UTC)
    assert doctor.stale_containers(docker_client, (scope,), 3600, now=now) == []
    later = [c.name for c in doctor.stale_containers(docker_client, (scope,), 3600,
                                                     now=now + datetime.timedelta(seconds=3700))]
    assert later == sorted([running.name, sibling.name])
    # the nodes being checked are never stale
    assert doctor.stale_containers(docker_client, (scope,), 0, exclude=(running.id, sibling.id)) == []


# --- from reports: GPUs -----------------------------------------------------------------------------

def test_duplicate_gpu_uuid(tmp_path):
    dup = gpu_report(2)
    dup["gpus"][0]["uuid"] = gpu_report(1)["gpus"][0]["uuid"]
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": dup})
    code, doc, _ = doctor_json(*paths, "--checks", "gpu-uuid")
    assert code == 2
    assert check(doc, "gpu-uuid")["message"] == (
        "duplicate GPU: GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d01 on node-1 (GPU 0), node-2 (GPU 0)")
    twice = gpu_report(3)
    twice["gpus"].append(dict(twice["gpus"][0], index=1))
    paths = write_reports(tmp_path, {"n3.json": twice})
    code, doc, _ = doctor_json(*paths, "--checks", "gpu-uuid")
    assert code == 2
    assert check(doc, "gpu-uuid")["details"] == [
        "GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d03 on node-3 (GPU 0), node-3 (GPU 1)"]


def test_unique_gpu_uuids(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": gpu_report(2)})
    code, doc, _ = doctor_json(*paths, "--checks", "gpu-uuid")
    assert (code, check(doc, "gpu-uuid")["message"]) == (0, "2 GPUs, each UUID on one rank")


def test_gpu_processes_holding_memory(tmp_path):
    busy = gpu_report(2, gpu_processes=[{"gpu_index": 0, "gpu_uuid": "GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02",
                                         "pid": 48213, "used_memory_bytes": 10737418240, "name": "python3"}])
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": busy})
    code, doc, _ = doctor_json(*paths, "--checks", "gpu-processes")
    assert code == 2
    assert check(doc, "gpu-processes")["message"] == (
        "node-2 GPU 0 (GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02): pid 48213 (python3) holds 10.0 GiB")
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": gpu_report(2)})
    code, doc, _ = doctor_json(*paths, "--checks", "gpu-processes")
    assert (code, check(doc, "gpu-processes")["message"]) == (0, "no compute processes on 2 GPUs")


def test_report_files_skip_live_checks_and_name_bad_files(tmp_path):
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": gpu_report(2), "bad.json": "{"})
    code, doc, _ = doctor_json(*paths, "--checks", "nodes,port,interface,shm,straggler")
    assert code == 3
    assert statuses(doc) == {"nodes": "unknown", "port": "skip", "interface": "pass", "shm": "pass",
                             "straggler": "skip"}
    assert check(doc, "nodes")["details"] == [f"{paths[2]}: not valid JSON: Expecting property name enclosed in "
                                              "double quotes: line 1 column 2 (char 1)"]
    assert check(doc, "port")["message"] == "needs live nodes (report files give reports only)"


def test_unknown_check_is_a_usage_error():
    proc = run_envbuild("doctor", "--checks", "port,bogus")
    assert proc.returncode == 64
    assert "unknown bogus" in proc.stderr


# --- nothing checked, nothing masked (issue 8) ---------------------------------------------------

def test_doctor_that_checked_nothing_exits_3(tmp_path):
    missing = tmp_path / "missing.json"
    proc = run_envbuild("doctor", "--checks", "shm", str(missing))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        3, "", f"error: doctor checked nothing: no node answered (1 given): {missing}: no such node report\n")
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": gpu_report(2)})
    proc = run_envbuild("doctor", "--checks", "port,straggler", *paths)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        3, "", "error: doctor checked nothing: port: needs live nodes (report files give reports only); "
               "straggler: needs live nodes (report files give reports only)\n")
    old = {k: v for k, v in gpu_report(1).items() if k not in ("network", "shm")}
    proc = run_envbuild("doctor", "--checks", "shm,interface", *write_reports(tmp_path, {"old.json": old}))
    assert (proc.returncode, proc.stderr) == (
        3, "error: doctor checked nothing: interface: no report has a network section; "
           "shm: /dev/shm size not reported by node-1\n")
    # the passing twin: the same checks on reports that carry the data
    code, doc, _ = doctor_json("--checks", "shm", *paths)
    assert (code, statuses(doc)) == (0, {"shm": "pass"})


def test_a_node_that_did_not_answer_is_never_left_out(tmp_path):
    missing = tmp_path / "missing.json"
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1)})
    code, doc, _ = doctor_json("--checks", "shm", *paths, str(missing))
    assert (code, statuses(doc)) == (3, {"nodes": "unknown", "shm": "pass"})
    assert check(doc, "nodes")["message"] == f"1 of 2 nodes could not be checked: {missing}: no such node report"


def test_checks_without_any_source_are_a_usage_error():
    proc = run_envbuild("doctor", "--checks", "shm")
    assert (proc.returncode, proc.stderr) == (
        64, "envbuild doctor: give report files, --image/--container/--label, --hosts or --slurm; "
        "or --checks stale-containers for this engine alone\n")
    proc = run_envbuild("doctor", "--checks", "shm", "x.json", "--min-shm", "256m\n")
    assert proc.returncode == 64
    assert proc.stderr == "envbuild doctor: argument --min-shm: '256m\\n' is not a size such as 256m or 1g\n"


def test_doctor_output_is_escaped_never_markup(tmp_path):
    busy = gpu_report(2, gpu_processes=[{"gpu_index": 0, "gpu_uuid": "GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02",
                                         "pid": 48213, "used_memory_bytes": 1 << 30,
                                         "name": "[/][bold red]x\x1b[2J\u202e"}])
    paths = write_reports(tmp_path, {"n1.json": gpu_report(1), "n2.json": busy})
    proc = run_envbuild("doctor", "--checks", "gpu-processes", *paths, str(tmp_path / "[/]gone\x1b.json"))
    assert proc.returncode == 3, proc.stderr
    out = proc.stdout
    assert "\x1b" not in out and "\u202e" not in out
    assert ("  node-2 GPU 0 (GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02): pid 48213 ([/][bold red]x\\x1b[2J\\u202e) "
            "holds 1.0 GiB") in out.splitlines()
    assert f"  {tmp_path}/[/]gone\\x1b.json: no such node report" in out.splitlines()
    code, doc, _ = doctor_json("--checks", "gpu-processes", *paths)  # --json: the exact strings
    assert code == 2
    assert check(doc, "gpu-processes")["details"] == [
        "node-2 GPU 0 (GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02): pid 48213 ([/][bold red]x\x1b[2J\u202e) holds 1.0 GiB"]
