"""Gathering node reports: over ssh (a real sshd on loopback with key auth; a refused and a
silent host), under a real one-node Slurm, from running containers; the node-report
fields the probe adds for verify/doctor; and the in-node agent's helpers."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder import doctor_agent, gather, nodereport, probe
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

PROBE = Path(probe.__file__)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("spec, parsed", [
    ("node-a", ("node-a", None)), ("root@10.0.0.5:2222", ("root@10.0.0.5", 2222)), ("h:22", ("h", 22))])
def test_split_host(spec, parsed):
    assert gather.split_host(spec) == parsed


def test_ssh_argv_is_batch_mode():
    assert gather.ssh_argv("h", 2222, "/cfg", ["StrictHostKeyChecking=yes"], 4) == [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=4", "-F", "/cfg",
        "-o", "StrictHostKeyChecking=yes", "-p", "2222", "h"]


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
    [node] = gather.gather(gather.Sources(slurm=True))
    out = node.target.run(gather.agent_source(), ["compute", "--iters", "1", "--repeats", "1"], 60)
    assert out.rc == 0 and json.loads(out.stdout)["compute"]["backend"] in ("python", "torch-cpu")


def test_slurm_unknown_partition_cannot_check(slurm_node):
    proc = run_envbuild("verify", "--slurm", "--partition", "no-such-partition", "--timeout", "60")
    assert proc.returncode == 3
    assert proc.stderr.strip() == ("error: slurm: srun gave no node reports (exit status 1): srun: error: "
                                   "Unable to allocate resources: Invalid partition name specified")


def test_split_labelled():
    text = '0: {"a":\n 1: {"b": 2}\n0:  1}\nsrun: warning\n10: x\n'
    assert gather.split_labelled(text) == {0: '{"a":\n 1}\n', 1: '{"b": 2}\n', 10: 'x\n'}


# --- containers ---------------------------------------------------------------------------------------

def test_container_reports_name_image_and_runtime(docker_client, torch_image, nodes_factory):
    c = nodes_factory.start(torch_image, "node-0", shm_size="128m", environment={"GLOO_SOCKET_IFNAME": "eth0"})
    [node] = gather.from_containers(docker_client, names=[c.name])
    assert node.ok, node.error
    r = node.report
    image = docker_client.images.get(torch_image)
    assert r["image"] == {"ref": torch_image, "digest": None, "id": image.id}
    assert r["container"]["runtime"] == "docker"
    assert r["container"]["version"] == docker_client.version()["Version"]
    assert r["shm"]["size_bytes"] == 134217728
    assert r["env"] == {"GLOO_SOCKET_IFNAME": "eth0"}
    ip = c.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
    assert node.address == ip
    eth0 = [i for i in r["network"]["interfaces"] if i["name"] == "eth0"][0]
    assert [a["address"] for a in eth0["addresses"] if a["family"] == "inet"] == [ip]
    assert r["network"]["default_route_interface"] == "eth0"
    assert r["network"]["hostname_addresses"] == [ip]
    assert r["torch"]["version"] == "2.13.0+cpu"


def test_no_running_container_cannot_check(docker_client, nodes_factory):
    proc = run_envbuild("verify", "--label", f"envbuild.test-case={nodes_factory.case}")
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"error: no running container of label envbuild.test-case={nodes_factory.case}"


# --- the probe's node-report fields --------------------------------------------------------------------

def _probe(env: dict | None = None) -> dict:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    with open(PROBE, "rb") as src:
        proc = subprocess.run([sys.executable, "-"], stdin=src, capture_output=True, timeout=120,
                              env={**base, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_host_report_is_valid_and_describes_this_host():
    doc = _probe({"ENVBUILD_IMAGE": "envbuild/x:1", "ENVBUILD_IMAGE_DIGEST": "sha256:" + "0" * 64,
                  "ENVBUILD_RUNTIME_VERSION": "20.10.24"})
    assert nodereport.validate(doc, "host") is doc
    assert doc["image"] == {"ref": "envbuild/x:1", "digest": "sha256:" + "0" * 64, "id": None}
    assert doc["container"]["version"] == "20.10.24"
    st = os.statvfs("/dev/shm")
    assert doc["shm"]["size_bytes"] == st.f_frsize * st.f_blocks
    lo = [i for i in doc["network"]["interfaces"] if i["name"] == "lo"][0]
    assert (lo["loopback"], {"family": "inet", "address": "127.0.0.1", "prefixlen": 8} in lo["addresses"]) == \
        (True, True)
    lo_range = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
    assert doc["network"]["ip_local_port_range"] == [int(x) for x in lo_range]
    assert doc["gpu_processes"] == [] if not os.path.exists("/dev/nvidiactl") else True
    assert doc["kernel"] == platform.release()


def test_interfaces_from_ioctl_match_ip_json():
    from builder import probe as p

    errors: list[str] = []
    via_ip = p._network(errors)
    p.USE_IP_COMMAND = False
    try:
        via_ioctl = p._network(errors)
    finally:
        p.USE_IP_COMMAND = True
    assert errors == []
    # `ip` lists secondary IPv4 addresses too; ioctl only the primary one
    def primary(net):
        return [(i["name"], i["up"], i["loopback"], i["mtu"],
                 [a for a in i["addresses"] if a["family"] == "inet"][:1]) for i in net["interfaces"]]
    assert primary(via_ioctl) == primary(via_ip)


@pytest.mark.parametrize("text, out", [
    ("00000000000000000000000000000001 01 80 10 80       lo\n"
     "fe800000000000000042acfffe110002 0f 40 20 80     eth0\n",
     {"lo": [("::1", 128)], "eth0": [("fe80::42:acff:fe11:2", 64)]}),
    ("garbage\n", {}),
])
def test_parse_if_inet6(text, out):
    assert probe.parse_if_inet6(text) == out


def test_small_parsers():
    route = ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
             "eth1\t00000000\t0100A8C0\t0003\t0\t0\t600\t00000000\n"
             "eth0\t00000000\t010011AC\t0003\t0\t0\t100\t00000000\n"
             "eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\n")
    assert probe.parse_proc_net_route(route) == "eth0"
    assert probe.parse_proc_net_route("Iface\tDestination\n") is None
    assert probe.parse_proc_net_dev("Inter-|\n face |\n    lo: 1 2\n  eth0: 3 4\n") == ["lo", "eth0"]
    assert [probe.prefixlen_from_netmask(m) for m in ("255.255.240.0", "255.0.255.0", "x")] == [20, None, None]
    assert probe.parse_version_output("Docker version 20.10.24+dfsg1, build 297e128") == "20.10.24+dfsg1"
    assert probe.parse_version_output("apptainer version v1.3.4") == "1.3.4"
    assert probe.parse_version_output("") is None
    assert probe.pci_id_from_device_id(0x233010DE) == "10de:2330"
    assert probe.pci_id_from_device_id(None) is None


def test_parse_ip_json():
    text = json.dumps([{"ifindex": 2, "ifname": "eth0", "flags": ["BROADCAST", "UP"], "mtu": 1500,
                        "link_type": "ether", "addr_info": [
                            {"family": "inet", "local": "172.17.0.2", "prefixlen": 16},
                            {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]}])
    assert probe.parse_ip_json(text) == [{
        "name": "eth0", "index": 2, "up": True, "loopback": False, "mtu": 1500,
        "addresses": [{"family": "inet", "address": "172.17.0.2", "prefixlen": 16},
                      {"family": "inet6", "address": "fe80::1", "prefixlen": 64}]}]


# --- the in-node agent ------------------------------------------------------------------------------

def test_agent_is_python38_syntax():
    import ast

    ast.parse(gather.agent_source(), feature_version=(3, 8))


def test_round_robin_covers_every_pair_once():
    assert doctor_agent.round_robin(4) == [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    for n in (2, 3, 5, 8):
        pairs = [p for r in doctor_agent.round_robin(n) for p in r]
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
        for r in doctor_agent.round_robin(n):
            flat = [x for p in r for x in p]
            assert len(flat) == len(set(flat))


def test_sample_ports():
    assert doctor_agent.sample_ports(32768, 60999, 3) == [32768, 46884, 60999]
    assert doctor_agent.sample_ports(40000, 40000, 2) == [40000]
    assert doctor_agent.sample_ports(10, 5, 2) == []


def test_agent_listen_and_connect_locally():
    port = _free_port()
    script = gather.agent_source()
    listen = subprocess.Popen([sys.executable, "-c", script, "listen", "--ports", str(port), "--sample", "0",
                               "--deadline-s", "20", "--expect-total", "1"], stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(listen.stdout.readline())
        assert first == {"ports": {str(port): "listening"}, "sample": []}
        closed = _free_port()
        targets = json.dumps([{"id": "ok", "host": "127.0.0.1", "port": port},
                              {"id": "closed", "host": "127.0.0.1", "port": closed}])
        out = subprocess.run([sys.executable, "-c", script, "connect", "--from", "me", "--targets", targets,
                              "--timeout-s", "3"], capture_output=True, text=True, timeout=30)
        res = json.loads(out.stdout)["results"]
        assert (res["ok"]["status"], res["closed"]["status"]) == ("ok", "refused")
        assert json.loads(listen.stdout.readline()) == {"accepted": {str(port): ["me"]}}
        assert listen.wait(10) == 0
    finally:
        listen.kill()
