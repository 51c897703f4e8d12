"""envbuild verify: every rule on hand-written report files (failing case and passing
twin), unreadable and invalid reports, and two real images that differ in one pinned
package run as two container nodes."""

from __future__ import annotations

import time

from test_verify_units import failing  # noqa: F401

from fixtures_nodes import (  # noqa: F401 - pytest fixtures
    bumped_torch_image,
    finding,
    gpu_report,
    nodes_factory,
    run_envbuild,
    run_json,
    write_reports,
)

# --- two real images, two container nodes -------------------------------------------------------

def test_two_images_differing_in_torch(docker_client, torch_image, bumped_torch_image, nodes_factory):
    a = nodes_factory.start(torch_image, "a")
    b = nodes_factory.start(bumped_torch_image, "b")
    code, doc = run_json("verify", "--image", torch_image, "--image", bumped_torch_image,
                         "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert code == 2, doc
    assert failing(doc) == ["torch.version"]
    assert finding(doc, "must-match", "torch.version")[0]["groups"] == [
        {"value": "2.13.0+cpu", "nodes": [a.name]}, {"value": "2.13.1+cpu", "nodes": [b.name]}]
    # the engine knows the images apart too: a warning, not a second failure
    assert [f["field"] for f in doc["findings"] if f["level"] == "warn"] == ["image.id"]
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert (by_name[a.name]["image_ref"], by_name[b.name]["image_ref"]) == (torch_image, bumped_torch_image)
    assert by_name[a.name]["runtime"] == "docker"
    # the same containers named one by one; and the human output
    proc = run_envbuild("verify", "--container", a.name, "--container", b.name)
    assert proc.returncode == 2
    table = proc.stdout.split("fields that differ", 1)[1].splitlines()
    rows = [" ".join(line.replace("│", " ").split()) for line in table]
    assert f"must-match torch.version 2.13.0+cpu {a.name}" in rows
    assert f"2.13.1+cpu {b.name}" in rows


def test_two_containers_of_one_image_match(docker_client, torch_image, nodes_factory):
    nodes_factory.start(torch_image, "a")
    nodes_factory.start(torch_image, "b")
    code, doc = run_json("verify", "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert (code, doc["findings"]) == (0, [])


def test_expected_node_count(docker_client, torch_image, nodes_factory):
    c = nodes_factory.start(torch_image, "a")
    proc = run_envbuild("verify", "--label", f"envbuild.test-case={nodes_factory.case}", "--nodes", "2")
    assert proc.returncode == 3
    assert f"expected 2 running containers of label envbuild.test-case={nodes_factory.case}, found 1: {c.name}" \
        in " ".join(proc.stderr.split())


# --- linear in nodes and fields (issue 8) ----------------------------------------------------------

def test_20k_env_entries_and_2000_interfaces_finish(tmp_path):
    interfaces = [{"name": f"veth{i}", "index": 10 + i, "up": True, "loopback": False, "mtu": 1500,
                   "addresses": [{"family": "inet", "address": f"10.1.{i // 250}.{i % 250 + 1}", "prefixlen": 16}]}
                  for i in range(2000)]
    ifname = ",".join(f"ib{i}" for i in range(10000)) + ",veth1999"  # 68k characters
    docs = {}
    for n in (1, 2):
        doc = gpu_report(n)
        doc["env"] = {f"NCCL_KNOB_{i}": str(i + n) for i in range(20000)}
        doc["env"]["NCCL_SOCKET_IFNAME"] = ifname
        doc["network"]["interfaces"] += interfaces
        docs[f"n{n}.json"] = doc
    paths = write_reports(tmp_path, docs)
    t0 = time.monotonic()
    proc = run_envbuild("verify", *paths, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr[-500:]
    assert proc.stdout.splitlines()[-1] == ("verify: 2 of 2 nodes checked; 0 failed, 20000 warnings, "
                                            "0 not checked -> exit 1")
    assert took < 20, f"verify took {took:.0f} s for 20000 differing variables"
    t0 = time.monotonic()
    code, doc = run_json("doctor", *paths, "--checks", "interface,shm", timeout=300)
    took = time.monotonic() - t0
    assert (code, statuses(doc)) == (0, {"interface": "pass", "shm": "pass"})
    assert took < 20, f"doctor took {took:.0f} s"


def statuses(doc: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in doc["checks"]}
