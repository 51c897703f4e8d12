"""The engine-free tests of tests/integration/test_gather.py: Gathering node reports: over ssh (a real sshd on loopback with key auth; a refused and a
silent host), under a real one-node Slurm, from running containers; the node-report
fields the probe adds for verify/doctor; and the in-node agent's helpers."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys

import msgspec
import pytest

from builder.agent import doctor_agent, payload
from builder.agent.probe import container, network, nvml
from builder.core.errors import EnvbuildError
from builder.nodes import report as nodereport
from builder.nodes import sources
from builder.nodes.sources import slurm, ssh

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("spec, parsed", [
    ("node-a", ("node-a", None)), ("root@10.0.0.5:2222", ("root@10.0.0.5", 2222)), ("h:22", ("h", 22))])
def test_split_host(spec, parsed):
    assert ssh.split_host(spec) == parsed


def test_ssh_argv_is_batch_mode():
    assert ssh.ssh_argv("h", 2222, "/cfg", ["StrictHostKeyChecking=yes"], 4) == [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=4", "-F", "/cfg",
        "-o", "StrictHostKeyChecking=yes", "-p", "2222", "--", "h"]


# --- arguments that reach ssh/srun (issue 8) ----------------------------------------------------------

@pytest.mark.parametrize("spec, parsed", [
    ("[fe80::1]:2200", ("fe80::1", 2200)), ("u_1@node-7.cluster", ("u_1@node-7.cluster", None)),
    ("10.0.0.5", ("10.0.0.5", None))])
def test_split_host_forms(spec, parsed):
    assert ssh.split_host(spec) == parsed


@pytest.mark.parametrize("spec", [
    "-oProxyCommand=touch /tmp/x", "-x", "node-a\n", "node a", "user@", "@h", "h:0", "h:65536", "h:22\n",
    "h;id", "h$(id)", "[fe80::1", "", "a" * 300])
def test_bad_hosts_are_usage_errors(spec):
    with pytest.raises(EnvbuildError) as err:
        ssh.split_host(spec)
    assert err.value.exit_code == 64


def test_ssh_argv_never_takes_a_host_as_an_option():
    with pytest.raises(EnvbuildError) as err:
        ssh.ssh_argv("-oProxyCommand=x")
    assert (err.value.exit_code, str(err.value)) == (64, "--hosts: '-oProxyCommand=x' is not a host (it starts with -)")
    assert ssh.ssh_argv("node-a")[-2:] == ["--", "node-a"]


@pytest.mark.parametrize("opt, ok", [
    ("ConnectTimeout=3", True), ("StrictHostKeyChecking=yes", True), ("ProxyJump=bastion:2222", True),
    ("IdentityFile=~/.ssh/id_ed25519", True), ("proxycommand=sh -c x", False), ("ProxyCommand=nc", False),
    ("LocalCommand=id", False), ("PermitLocalCommand=yes", False), ("KnownHostsCommand=id", False),
    ("PKCS11Provider=/tmp/evil.so", False), ("BatchMode=no", False), ("LocalForward=1:h:2", False),
    ("User=root ProxyCommand=x", False), ("ProxyJump=-oProxyCommand=x", False), ("User=root\n", False),
    ("ConnectTimeout", False), ("=x", False)])
def test_ssh_options_are_key_value_from_a_safe_set(opt, ok):
    if ok:
        assert sources.check_ssh_option(opt) == opt
        return
    with pytest.raises(EnvbuildError) as err:
        sources.check_ssh_option(opt)
    assert err.value.exit_code == 64


@pytest.mark.parametrize("check, value, ok", [
    ("check_partition", "debug", True), ("check_partition", "gpu,debug", True), ("check_partition", "debug\n", False),
    ("check_partition", "-w node", False), ("check_partition", "a b", False),
    ("check_srun_arg", "--account=ml", True), ("check_srun_arg", "--exclusive", True),
    ("check_srun_arg", "--time=00:10:00", True), ("check_srun_arg", "--prolog=/tmp/x", False),
    ("check_srun_arg", "--task-prolog=/tmp/x", False), ("check_srun_arg", "--output=/etc/x", False),
    ("check_srun_arg", "--export=LD_PRELOAD=/x.so", False), ("check_srun_arg", "-A ml", False),
    ("check_srun_arg", "--account=ml\n", False), ("check_srun_arg", "--account=a b", False),
    ("check_python", "python3", True), ("check_python", "/opt/venv/bin/python3.11", True),
    ("check_python", "./venv/bin/python", True), ("check_python", "--prolog=/x", False),
    ("check_python", "-c", False), ("check_python", "python3; id", False), ("check_python", "python3\n", False),
    ("check_python", "py thon", False), ("check_container", "node-1", True), ("check_container", "-x", False),
    ("check_container", "../x", False), ("check_label", "envbuild.test-case=ab12", True),
    ("check_label", "k=\x1b[2J", False), ("check_label", "=v", False)])
def test_srun_python_and_engine_values_match_whole(check, value, ok):
    fn = getattr(sources, check)
    if ok:
        assert fn(value) == value
        return
    with pytest.raises(EnvbuildError) as err:
        fn(value)
    assert err.value.exit_code == 64


def test_hostile_arguments_are_usage_errors_before_anything_runs(tmp_path):
    pwned = tmp_path / "pwned"
    for args, message in [
        (["--hosts=-oProxyCommand=touch " + str(pwned)],
         f"envbuild verify: argument --hosts: '-oProxyCommand=touch {pwned}' is not a host ([user@]host[:port]: "
         "letters, digits, _ . -, not starting with -)"),
        (["--hosts", "node-a", "--ssh-option", "ProxyCommand=touch " + str(pwned)],
         f"envbuild verify: argument --ssh-option: 'ProxyCommand=touch {pwned}' is not an ssh option Key=Value "
         "(printable, no blanks)"),
        (["--hosts", "node-a", "--ssh-option", "LocalCommand=touch"],
         "envbuild verify: argument --ssh-option: 'LocalCommand=touch' is refused: LocalCommand is not among the "
         "ssh options envbuild passes on (connection, authentication and host-key settings; no commands, "
         "forwardings or BatchMode); put it in an --ssh-config file"),
        (["--slurm", "--srun-arg=--prolog=" + str(pwned)],
         f"envbuild verify: argument --srun-arg: '--prolog={pwned}' is refused: --prolog is not among the srun "
         "options envbuild passes on (resources, placement and accounting; no prologs, file redirections or "
         "--export)"),
        (["--slurm", "--partition", "debug\n"],
         "envbuild verify: argument --partition: 'debug\\n' is not a Slurm partition name (letters, digits, "
         "_ . -; a comma list)"),
        (["--hosts", "node-a", "--python=--version"],
         "envbuild verify: argument --python: '--version' is not an interpreter name or path (letters, digits, "
         "_ . + - and /)"),
    ]:
        proc = run_envbuild("verify", *args, timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (64, "", message + "\n"), args
    assert not pwned.exists()


def test_split_labelled():
    text = '0: {"a":\n 1: {"b": 2}\n0:  1}\nsrun: warning\n10: x\n'
    assert slurm.split_labelled(text) == {0: '{"a":\n 1}\n', 1: '{"b": 2}\n', 10: 'x\n'}


# --- the probe's node-report fields --------------------------------------------------------------------

def _probe(env: dict | None = None) -> dict:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    proc = subprocess.run(payload.command(sys.executable, "probe"), input=payload.archive(), capture_output=True,
                          timeout=120, env={**base, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_host_report_is_valid_and_describes_this_host():
    doc = _probe({"ENVBUILD_IMAGE": "envbuild/x:1", "ENVBUILD_IMAGE_DIGEST": "sha256:" + "0" * 64,
                  "ENVBUILD_RUNTIME_VERSION": "20.10.24"})
    assert msgspec.to_builtins(nodereport.validate(doc, "host")) == doc
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
    """Read through ``ip -j`` before and after the ioctl reading: the engine's bridges and veths
    come and go as tests beside this one start containers, so a reading is compared only when
    the interfaces held still around it (at most 20 tries)."""
    # `ip` lists secondary IPv4 addresses too; ioctl only the primary one
    def primary(net):
        return [(i["name"], i["up"], i["loopback"], i["mtu"],
                 [a for a in i["addresses"] if a["family"] == "inet"][:1]) for i in net["interfaces"]]

    errors: list[str] = []
    for _ in range(20):
        before = primary(network.network_info(errors))
        network.USE_IP_COMMAND = False
        try:
            via_ioctl = primary(network.network_info(errors))
        finally:
            network.USE_IP_COMMAND = True
        if primary(network.network_info(errors)) == before:
            break
    assert errors == []
    assert via_ioctl == before


@pytest.mark.parametrize("text, out", [
    ("00000000000000000000000000000001 01 80 10 80       lo\n"
     "fe800000000000000042acfffe110002 0f 40 20 80     eth0\n",
     {"lo": [("::1", 128)], "eth0": [("fe80::42:acff:fe11:2", 64)]}),
    ("garbage\n", {}),
])
def test_parse_if_inet6(text, out):
    assert network.parse_if_inet6(text) == out


def test_small_parsers():
    route = ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
             "eth1\t00000000\t0100A8C0\t0003\t0\t0\t600\t00000000\n"
             "eth0\t00000000\t010011AC\t0003\t0\t0\t100\t00000000\n"
             "eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\n")
    assert network.parse_proc_net_route(route) == "eth0"
    assert network.parse_proc_net_route("Iface\tDestination\n") is None
    assert network.parse_proc_net_dev("Inter-|\n face |\n    lo: 1 2\n  eth0: 3 4\n") == ["lo", "eth0"]
    assert [network.prefixlen_from_netmask(m) for m in ("255.255.240.0", "255.0.255.0", "x")] == [20, None, None]
    assert container.parse_version_output("Docker version 20.10.24+dfsg1, build 297e128") == "20.10.24+dfsg1"
    assert container.parse_version_output("apptainer version v1.3.4") == "1.3.4"
    assert container.parse_version_output("") is None
    assert nvml.pci_id_from_device_id(0x233010DE) == "10de:2330"
    assert nvml.pci_id_from_device_id(None) is None


def test_parse_ip_json():
    text = json.dumps([{"ifindex": 2, "ifname": "eth0", "flags": ["BROADCAST", "UP"], "mtu": 1500,
                        "link_type": "ether", "addr_info": [
                            {"family": "inet", "local": "172.17.0.2", "prefixlen": 16},
                            {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]}])
    assert network.parse_ip_json(text) == [{
        "name": "eth0", "index": 2, "up": True, "loopback": False, "mtu": 1500,
        "addresses": [{"family": "inet", "address": "172.17.0.2", "prefixlen": 16},
                      {"family": "inet6", "address": "fe80::1", "prefixlen": 64}]}]


# --- the in-node agent ------------------------------------------------------------------------------

def test_agent_is_python38_syntax():
    import ast

    ast.parse(payload.files()["doctor_agent.py"], feature_version=(3, 8))


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
    listen = subprocess.Popen(payload.command(sys.executable, "doctor_agent", [
        "listen", "--ports", str(port), "--sample", "0", "--deadline-s", "20", "--expect-total", "1"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    listen.stdin.write(payload.archive())  # the payload on stdin, as docker exec, ssh and srun feed it
    listen.stdin.close()
    try:
        first = json.loads(listen.stdout.readline())
        assert first == {"ports": {str(port): "listening"}, "sample": []}
        closed = _free_port()
        targets = json.dumps([{"id": "ok", "host": "127.0.0.1", "port": port},
                              {"id": "closed", "host": "127.0.0.1", "port": closed}])
        out = subprocess.run(payload.command(sys.executable, "doctor_agent", [
            "connect", "--from", "me", "--targets", targets, "--timeout-s", "3"]),
            input=payload.archive(), capture_output=True, timeout=30)
        res = json.loads(out.stdout)["results"]
        assert (res["ok"]["status"], res["closed"]["status"]) == ("ok", "refused")
        assert json.loads(listen.stdout.readline()) == {"accepted": {str(port): ["me"]}}
        assert listen.wait(10) == 0
    finally:
        listen.kill()

