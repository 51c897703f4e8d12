"""envbuild verify --against REF (issue 11): every node compared with a certificate made by a
real certification of envbuild/cpu-torch2 (its rank probe is the reference), a node report or
an image; each rule with an injected fault and its passing twin; the CUDA requirement as a
hard driver floor; the certificate's validity; drift over a history folder."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from fixtures_gate import rank_probe, write_cert
from test_verify_against_units import messages  # noqa: F401

from fixtures_nodes import finding, gpu_report, run_envbuild, run_json, write_reports

pytest_plugins = ["fixtures_gate", "fixtures_nodes"]  # the certificate, nodes_factory

#: NVIDIA_REQUIRE_CUDA as the nvidia/cuda:12.6 bases set it (abridged to two brands).
REQUIRE_126 = "cuda>=12.6 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"


def gpu_cert(folder: Path, cert: dict, require: str | None, **changes) -> str:
    """The real certificate with a GPU node's probe (:func:`gpu_report` 0) as its rank 0 and
    the CUDA requirement ``require`` recorded (the torch variant's CUDA: 12.8)."""
    return write_cert(folder, cert, **{"probe.0": gpu_report(0), "lock.cuda": "12.8",
                                       "cuda_requirement.torch_cuda": "12.8",
                                       "cuda_requirement.nvidia_require_cuda": require, **changes})


# --- the certificate records what verify needs -----------------------------------------------

def test_certificate_records_time_version_and_cuda_requirement(certificate, torch_image):
    cert, _ = certificate
    assert cert["envbuild_version"] == "0.1.0"
    assert cert["finished_at"].endswith("Z")
    assert cert["cuda_requirement"] == {"torch_cuda": None, "nvidia_require_cuda": None,
                                        "nvidia_disable_require": None,
                                        "source": f"config Env of image {torch_image}"}


# --- must-match against a certificate -------------------------------------------------------

def test_certified_rank_probe_matches_its_certificate(certificate, tmp_path):
    cert, path = certificate
    [report] = write_reports(tmp_path, {"node.json": rank_probe(cert)})
    code, doc = run_json("verify", "--against", str(path), report)
    assert code == 0, doc["findings"]
    assert doc["findings"] == []
    assert doc["reference"]["kind"] == "certificate"
    assert doc["reference"]["lock_hash"] == cert["lock_hash"]
    proc = run_envbuild("verify", "--against", str(path), report)
    assert proc.returncode == 0
    assert "1 node matches the reference in every compared field" in proc.stdout


def test_single_drifted_node_fails_naming_certified_and_current_values(certificate, tmp_path):
    cert, path = certificate
    probe = rank_probe(cert)
    want_torch, want_python = probe["torch"]["version"], probe["python"]["version"]
    probe["hostname"] = "node-7"
    probe["torch"]["version"] = "2.5.1+cpu"
    probe["python"]["version"] = "3.10.14"
    [report] = write_reports(tmp_path, {"node.json": probe})
    code, doc = run_json("verify", "--against", str(path), report)
    assert code == 2
    assert messages(doc, "fail") == [f"torch.version: certified {want_torch}; 2.5.1+cpu on node-7",
                                     f"python.version: certified {want_python}; 3.10.14 on node-7"]
    f = finding(doc, "must-match", "torch.version")[0]
    assert f["reference"] == want_torch
    assert f["groups"] == [{"value": "2.5.1+cpu", "nodes": ["node-7"]}]
    proc = run_envbuild("verify", "--against", str(path), report)
    assert proc.returncode == 2
    assert want_torch in proc.stdout and "2.5.1+cpu" in proc.stdout and "(certified)" in proc.stdout


def test_json_prints_only_the_verify_document(certificate, tmp_path):
    cert, path = certificate
    [report] = write_reports(tmp_path, {"node.json": rank_probe(cert)})
    proc = run_envbuild("verify", "--against", str(path), report, "--json")
    doc = json.loads(proc.stdout)  # the whole of stdout is one document
    assert doc["schema"] == "envbuild.verify/1"
    assert proc.returncode == 0


def test_against_an_image_probed(torch_image, nodes_factory):
    nodes_factory.start(torch_image, "a")
    code, doc = run_json("verify", "--against", torch_image, "--label", f"envbuild.test-case={nodes_factory.case}",
                         timeout=600)
    assert code == 0, doc["findings"]
    assert doc["reference"]["kind"] == "image"
    assert doc["reference"]["name"] == torch_image


# --- scope: a host report is compared in its host fields -------------------------------------

def test_host_report_is_compared_in_host_fields_only(certificate, tmp_path):
    cert, path = certificate
    host = rank_probe(cert)
    host.update(scope="host", torch=None, hostname="host-1")
    host["python"]["version"] = "3.12.3"
    [report] = write_reports(tmp_path, {"host.json": host})
    code, doc = run_json("verify", "--against", str(path), report)
    assert code == 0, doc["findings"]
    assert doc["notes"][0].startswith("1 host reports (host-1) against the certificate's in-image report")
    image = dict(host, scope=None)  # its twin: the same report said to come from inside the image
    [report] = write_reports(tmp_path, {"image.json": image})
    code, doc = run_json("verify", "--against", str(path), report)
    assert code == 2
    assert [f["field"] for f in doc["findings"] if f["level"] == "fail"] == ["torch.version", "python.version"]


# --- the image's CUDA requirement: a hard floor from a host report alone ----------------------

@pytest.mark.parametrize(("driver", "code", "level", "message"), [
    ("550.142", 2, "fail",
     "driver: 550.142 on node-1 is below 560.28.03 (CUDA 12.6), which the image requires: NVIDIA_REQUIRE_CUDA "
     f"'{REQUIRE_126}' (config Env of image IMAGE of CERT); the NVIDIA container runtime will not start it"),
    ("535.183.01", 1, "warn",
     "driver: 535.183.01 on node-1 is below 560.28.03 (CUDA 12.6); the image's NVIDIA_REQUIRE_CUDA "
     f"'{REQUIRE_126}' (config Env of image IMAGE of CERT) accepts it only as brand=tesla,driver>=535,driver<536: "
     "a report cannot tell the GPU brand"),
])
def test_driver_below_nvidia_require_cuda(certificate, tmp_path, torch_image, driver, code, level, message):
    cert, _ = certificate
    path = gpu_cert(tmp_path, cert, REQUIRE_126, **{"lock.cuda": "12.6", "cuda_requirement.torch_cuda": "12.6",
                                                    "probe.0.torch.cuda": "12.6"})
    host = gpu_report(1, driver=driver, scope="host", torch=None)
    [report] = write_reports(tmp_path, {"host.json": host})
    got, doc = run_json("verify", "--against", path, report)
    assert got == code
    want = message.replace("IMAGE", torch_image).replace("CERT", path)
    floor = [f for f in doc["findings"] if f["rule"] == "floor"]
    assert floor[0]["message"] == want
    assert floor[0]["level"] == level
    # below the hard floor the variant's floor adds nothing; accepted by brand, it warns as well
    assert [f["message"] for f in floor[1:]] == ([] if level == "fail" else [
        f"driver: {driver} on node-1 is below 560.28.03 (CUDA 12.6 GA): minor-version compatibility only "
        "(no PTX JIT, some APIs fail)"])


def test_driver_meeting_nvidia_require_cuda_passes(certificate, tmp_path):
    cert, _ = certificate
    path = gpu_cert(tmp_path, cert, REQUIRE_126, **{"lock.cuda": "12.6", "cuda_requirement.torch_cuda": "12.6",
                                                    "probe.0.torch.cuda": "12.6"})
    [report] = write_reports(tmp_path, {"host.json": gpu_report(1, driver="560.35.03", scope="host", torch=None)})
    code, doc = run_json("verify", "--against", path, report)
    assert [f for f in doc["findings"] if f["rule"] == "floor"] == []
    assert code == 1  # driver.branch 560 against the certified node's 570: should-match only
    assert [f["field"] for f in doc["findings"]] == ["driver.branch"]


def test_nvidia_disable_require_turns_the_hard_floor_off(certificate, tmp_path):
    cert, _ = certificate
    path = gpu_cert(tmp_path, cert, REQUIRE_126, **{"cuda_requirement.nvidia_disable_require": "true"})
    [report] = write_reports(tmp_path, {"host.json": gpu_report(1, driver="550.142", scope="host", torch=None)})
    code, doc = run_json("verify", "--against", path, report)
    floor = [f for f in doc["findings"] if f["rule"] == "floor"]
    # no hard floor; the variant's (CUDA 12.8: GA 570.26, minor-version floor 525.60.13) warns
    assert [f["level"] for f in floor] == ["warn"]
    assert floor[0]["message"].startswith("driver: 550.142 on node-1 is below 570.26 (CUDA 12.8 GA)")


@pytest.mark.parametrize(("driver", "levels", "code"), [("520.61.05", ["fail"], 2), ("560.35.03", ["warn"], 1),
                                                        ("570.124.06", [], 0)])
def test_variant_floor_without_nvidia_require_cuda(certificate, tmp_path, driver, levels, code):
    cert, _ = certificate
    path = gpu_cert(tmp_path, cert, None)
    [report] = write_reports(tmp_path, {"host.json": gpu_report(1, driver=driver, scope="host", torch=None)})
    got, doc = run_json("verify", "--against", path, report)
    assert [f["level"] for f in doc["findings"] if f["rule"] == "floor"] == levels
    assert got == code


# --- validity ---------------------------------------------------------------------------------

def test_old_certificate_warns_naming_its_age(certificate, tmp_path):
    cert, _ = certificate
    path = write_cert(tmp_path, cert, finished_at="2026-01-01T00:00:00Z")
    [report] = write_reports(tmp_path, {"node.json": rank_probe(cert)})
    code, doc = run_json("verify", "--against", path, report, "--max-age", "30d")
    assert code == 1
    [msg] = messages(doc, "warn")
    assert msg.startswith(f"certificate {path}: made 2026-01-01T00:00:00Z by envbuild 0.1.0, ")
    assert msg.endswith(" days ago: older than --max-age 30 days; certify the image again")
    code, doc = run_json("verify", "--against", path, report, "--max-age", "3650d")  # its twin
    assert code == 0, doc["findings"]


def test_failed_certificate_fails(certificate, tmp_path):
    cert, _ = certificate
    path = write_cert(tmp_path, cert, **{"verdict.passed": False, "verdict.exit_code": 2,
                                         "verdict.failures": ["allreduce: wrong sum at 1 MiB"]})
    [report] = write_reports(tmp_path, {"node.json": rank_probe(cert)})
    code, doc = run_json("verify", "--against", path, report)
    assert code == 2
    assert messages(doc, "fail") == [f"certificate {path}: its certification failed: allreduce: wrong sum at 1 MiB"]


# --- drift over a history folder ----------------------------------------------------------------

def test_drift_since_the_certificate_and_the_previous_report(certificate, tmp_path):
    cert, path = certificate
    base = rank_probe(cert)
    want = base["torch"]["version"]
    first = dict(copy.deepcopy(base), hostname="node-1", probed_at="2026-11-30T10:00:00Z")
    second = dict(copy.deepcopy(first), probed_at="2026-11-30T11:00:00Z")
    third = copy.deepcopy(second)
    third["probed_at"] = "2026-11-30T12:00:00Z"
    third["torch"]["version"] = "2.5.1+cpu"
    hist = tmp_path / "node-1"
    hist.mkdir()
    paths = write_reports(hist, {"a.json": first, "b.json": second, "c.json": third})
    code, doc = run_json("verify", "--against", str(path), *paths)
    assert code == 2
    assert [n["name"] for n in doc["nodes"]] == ["node-1"]
    [d] = doc["drift"]
    assert d["node"] == "node-1" and d["reports"] == 3
    assert d["first_at"] == "2026-11-30T10:00:00Z" and d["previous_at"] == "2026-11-30T11:00:00Z"
    assert d["since_reference"] == [{"field": "torch.version", "before": want, "after": "2.5.1+cpu",
                                     "since": "2026-11-30T12:00:00Z"}]
    assert d["since_previous"] == [{"field": "torch.version", "before": want, "after": "2.5.1+cpu",
                                    "since": "2026-11-30T12:00:00Z"}]
    proc = run_envbuild("verify", "--against", str(path), *paths)
    assert "2026-11-30T12:00:00Z" in proc.stdout and "2.5.1+cpu" in proc.stdout


def test_no_drift_in_an_unchanged_history(certificate, tmp_path):
    cert, path = certificate
    base = dict(rank_probe(cert), hostname="node-1")
    paths = write_reports(tmp_path, {"a.json": dict(base, probed_at="2026-11-30T10:00:00Z"),
                                     "b.json": dict(base, probed_at="2026-11-30T11:00:00Z")})
    code, doc = run_json("verify", "--against", str(path), *paths)
    assert code == 0, doc["findings"]
    [d] = doc["drift"]
    assert d["since_reference"] == [] and d["since_previous"] == []


# --- build time: the base's NVIDIA_REQUIRE_CUDA becomes a label ---------------------------------

def test_build_labels_the_base_nvidia_require_cuda(docker_client, bootstrap_image, test_labels, test_session_id,
                                                   tmp_path):
    from builder.image import build

    (tmp_path / "Dockerfile").write_text(f"FROM {bootstrap_image}\nENV NVIDIA_REQUIRE_CUDA=\"{REQUIRE_126}\"\n")
    tag = f"envbuild-test/require-cuda:{test_session_id}"
    docker_client.build(tmp_path, tag, labels=test_labels)
    opts = build.BuildOptions(recipe="cpu-torch2", images_dir=tmp_path)
    for base, want in ((tag, REQUIRE_126), (bootstrap_image, None)):  # and its twin: a base without it
        base_id = docker_client.sdk.images.get(base).id
        labels = build.image_labels_for(opts, docker_client, "debian:bookworm", (base, base_id, "local"), b"{}",
                                        "0" * 64)
        assert labels.get("envbuild.cuda.require") == want
