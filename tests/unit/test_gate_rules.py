"""The gate's and verify's rules that need no engine: loopback socket settings, another image
ID against a certificate, the age wording, the drain reason's head, plain tags, a path-like
``--against``, the k8s gate's lock hash, the in-pod gate's age warning and its failures' class and
next step. Each refusal has a passing twin."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import msgspec
import pytest

from builder.agent.nodegate import check as podcheck
from builder.core.errors import EnvbuildError, ExitCode
from builder.nodes import gate, gatespec, reference
from builder.nodes import report as nodereport
from builder.nodes.doctor import base as doctor_base
from builder.nodes.report import Node
from builder.nodes.verify import verify

from factories import gpu_report

CERT = Path(__file__).resolve().parents[1] / "fixtures" / "certificate-profiles.json"
MADE = datetime.datetime(2026, 12, 1, 12, 40, 23, tzinfo=datetime.UTC)  # its finished_at


def nodes(*docs: dict) -> list[Node]:
    return [Node(name=d["hostname"], source="file", report=nodereport.validate(d, d["hostname"])) for d in docs]


@pytest.mark.parametrize("var", ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])
def test_verify_of_two_nodes_on_loopback_fails(var):
    docs = [gpu_report(n, env={var: "lo"}) for n in (1, 2)]
    result = verify(nodes(*docs))
    assert result.exit_code == 2
    assert [(f.rule, f.field, f.message) for f in result.findings if f.level == "fail"] == [
        ("interface", f"env.{var}", f"{var}=lo on node-{n} selects the loopback interface lo (127.0.0.1): other "
                                    "nodes cannot reach it; name the interface the nodes share, or leave it unset")
        for n in (1, 2)]
    twin = verify(nodes(*[gpu_report(n, env={var: "eth0"}) for n in (1, 2)]))
    assert (twin.exit_code, twin.findings) == (0, [])
    alone = verify(nodes(docs[0]))  # one node alone reaches itself over loopback
    assert alone.exit_code == 0


def test_another_image_id_than_certified_fails():
    ref = reference.from_certificate(str(CERT))
    probe = msgspec.to_builtins(ref.report)
    same = verify(nodes({**probe, "hostname": "n1"}), reference=ref, now=MADE)
    assert same.exit_code == 0, same.findings
    other = {**probe, "hostname": "n1", "image": {**probe["image"], "id": "sha256:" + "e" * 64}}
    result = verify(nodes(other), reference=ref, now=MADE)
    assert result.exit_code == 2
    assert [(f.level, f.rule, f.field) for f in result.findings] == [("fail", "must-match", "image.id")]
    # between nodes (no reference) another ID stays a warning
    between = verify(nodes({**probe, "hostname": "n1"}, {**other, "hostname": "n2"}))
    assert [(f.level, f.field) for f in between.findings] == [("warn", "image.id")]


@pytest.mark.parametrize("age_s, max_age_s, text", [
    (36 * 60, 60, "36 min ago: older than --max-age 60 s"),
    (3 * 86400, 86400, "3 days ago: older than --max-age 24 hours"),
    (5 * 3600 + 59, 7200, "5 hours ago: older than --max-age 2 hours"),
])
def test_certificate_age_is_worded_in_its_unit(age_s, max_age_s, text):
    ref = reference.from_certificate(str(CERT))
    now = MADE + datetime.timedelta(seconds=age_s)
    result = verify(nodes({**msgspec.to_builtins(ref.report), "hostname": "n1"}), reference=ref,
                    max_age_s=max_age_s, now=now)
    [f] = result.findings
    assert f.message == (f"certificate {CERT}: made 2026-12-01T12:40:23Z by envbuild 0.1.0, {text}; "
                         "certify the image again")
    fresh = verify(nodes({**msgspec.to_builtins(ref.report), "hostname": "n1"}), reference=ref,
                   max_age_s=age_s + 1, now=now)
    assert fresh.findings == []


def test_drain_reason_starts_with_the_check_and_its_value():
    ref = reference.from_certificate(str(CERT))
    probe = msgspec.to_builtins(ref.report)
    other = {**probe, "hostname": "n1", "image": {**probe["image"], "id": "sha256:" + "e" * 64}}
    result = verify(nodes(other), reference=ref, now=MADE)
    lines = gate.gate_lines(result, [])
    head, line = gate.first_failure(result, [], lines)
    assert head == "image.id sha256:eeeeeee.."
    assert line.startswith("fail: must-match: image.id: certified sha256:")  # the drain reason: no step
    assert lines[0] == line + " [image] next: fix the image (or the node image) and run again"
    shm = doctor_base.Check("shm", doctor_base.FAIL, "n1: /dev/shm is 64.0 MiB, below 1.0 GiB")
    ok = verify(nodes({**probe, "hostname": "n1"}), reference=ref, now=MADE)
    assert gate.first_failure(ok, [shm], []) == ("shm", "fail: shm: n1: /dev/shm is 64.0 MiB, below 1.0 GiB")


@pytest.mark.parametrize("image, status", [
    ("envbuild/cpu-torch2:abc", "warn"),
    ("localhost:5000/envbuild/cpu-torch2", "warn"),
    ("localhost:5000/envbuild/cpu-torch2@sha256:" + "a" * 64, "pass"),
    ("sha256:" + "b" * 64, "pass"),
])
def test_a_plain_tag_warns_that_it_moves(image, status):
    assert gate.image_check(image).status == status


@pytest.mark.parametrize("path, shown", [("/nonexistent", "/nonexistent"), ("./nope", "nope"),
                                         ("../nope/cert", "../nope/cert")])
def test_a_path_that_is_no_file_could_not_be_checked(path, shown):
    with pytest.raises(EnvbuildError) as e:
        reference.load_reference(path)
    assert e.value.exit_code == ExitCode.UNREACHABLE
    assert str(e.value) == f"{shown}: no such certificate or node report"


def test_k8s_gate_refuses_a_malformed_lock_hash(tmp_path):
    ref = reference.from_certificate(str(CERT))
    assert gatespec.lock_label(ref) == "c4ee94a7bde4"  # the twin
    doc = json.loads(CERT.read_text())
    for bad in ("sha256:zz", "c4ee94a7bde47749c7ca6055e49f0c2e", "sha256:" + "A" * 64):
        (tmp_path / "c.json").write_text(json.dumps({**doc, "lock_hash": bad}))
        with pytest.raises(EnvbuildError) as e:
            gatespec.lock_label(reference.from_certificate(str(tmp_path / "c.json")))
        assert e.value.exit_code == ExitCode.UNREACHABLE
        assert str(e.value) == f"{tmp_path / 'c.json'}: lock_hash: {bad!r} is not a lock hash (sha256: and 64 hex)"


def test_pod_gate_warns_on_an_old_certificate():
    spec = {"made_at": "2026-12-01T12:40:23Z", "max_age_s": 60.0}
    assert podcheck.age_warnings(spec, MADE + datetime.timedelta(seconds=59)) == []
    assert podcheck.age_warnings(spec, MADE + datetime.timedelta(minutes=36)) == [
        "certificate: made 2026-12-01T12:40:23Z, 2160 s ago: older than max_age_s 60 s; certify the image again"]
    assert podcheck.age_warnings({"made_at": None, "max_age_s": 60.0}) == [
        "certificate: no valid made_at ((absent)): its age is unknown"]
    _, warnings = podcheck.evaluate(spec, {}, MADE + datetime.timedelta(minutes=36))
    assert warnings == podcheck.age_warnings(spec, MADE + datetime.timedelta(minutes=36))


def test_pod_gate_failure_carries_its_class_and_next_step():
    ref = reference.from_certificate(str(CERT))
    spec = gatespec.gate_spec(ref)
    step = "fix the image (or the node image) and run again"
    assert spec["next_steps"]["torch.version"] == spec["next_steps"]["driver"] == ["image", step]
    probe = msgspec.to_builtins(ref.report)
    assert podcheck.evaluate(spec, probe, MADE)[0] == []  # the twin
    failures, _ = podcheck.evaluate(spec, {**probe, "torch": {**probe["torch"], "version": "2.13.1+cpu"}}, MADE)
    assert failures == [("torch.version", f"torch.version: certified {probe['torch']['version']}, this node "
                                          f"2.13.1+cpu [image] next: {step}")]
    bare = podcheck.evaluate({**spec, "next_steps": {}}, {**probe, "torch": None}, MADE)[0]
    assert bare == [("torch.version", f"torch.version: certified {probe['torch']['version']}, this node (absent)")]
