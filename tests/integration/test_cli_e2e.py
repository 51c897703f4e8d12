"""The command line as a user meets it: `envbuild make cpu-torch2` end to end on the real
engine, and bad input giving one clear line, exit 2, and no traceback."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest
from test_cli_e2e_units import NO_ENGINE, ROOT, envbuild  # noqa: F401

from fixtures_browser import Dom, dump_dom


def leftovers(client, label):
    return ([c.name for c in client.sdk.containers.list(all=True, filters={"label": label})],
            [n.name for n in client.sdk.networks.list(filters={"label": label})])


def test_make_cpu_torch2_end_to_end(tmp_path, docker_client, torch_image, test_labels, chromium):
    """check -> render -> build -> certify with 2 containers. The session's torch image
    (same rendered files, same base) makes the build a cache hit; the build check (probe
    against lock) still runs on it. The certificate's HTML report lies next to it and
    Chromium reads the run's verdict, stack and collective in it. The base stands in for
    debian:bookworm-slim: that one warning line makes the passing run exit 1."""
    images = tmp_path / "images"
    (images / "cpu-torch2").mkdir(parents=True)
    for name in ("Dockerfile", "Singularity.def", "envbuild.lock.json"):
        shutil.copy(ROOT / "images/cpu-torch2" / name, images / "cpu-torch2" / name)
    case = uuid.uuid4().hex[:12]
    labels = ",".join(f"{k}={v}" for k, v in {**test_labels, "envbuild.test-case": case}.items())
    res = envbuild("--images-dir", str(images), "make", "cpu-torch2", env={"ENVBUILD_EXTRA_LABELS": labels})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert [line.split(":")[:2] for line in res.stderr.splitlines() if line.startswith("warning:")] == [
        ["warning", " debian"]]  # debian:bookworm-slim is not available locally: ...
    assert f"reused {torch_image}" in res.stdout  # the session fixture built it
    assert "verdict: PASSED" in res.stdout
    certs = list((images / "cpu-torch2" / "certificates").glob("*.json"))
    assert len(certs) == 1
    cert = json.loads(certs[0].read_text())
    assert cert["schema"] == "envbuild.certificate/2"
    assert cert["world_size"] == 2 and cert["nodes"] == 2
    assert cert["backend"]["used"] == "gloo"
    # the default profile (ddp) runs the numpy features too; the recipe pins numpy
    assert cert["verdict"] == {"passed": True, "exit_code": 0, "failures": [], "warnings": [], "failure_class": None,
                               "next_step": None}
    assert cert["profiles"] == ["ddp"] and cert["training"]["ddp"]["reference_match"] is True
    sizes = [row["size_bytes"] for row in cert["collectives"]["all_reduce"]]
    assert sizes == [8, 1024, 65536, 1048576, 4194304]
    for row in cert["collectives"]["all_reduce"]:
        assert row["wrong_ranks"] == [] and row["wrong"] == 0
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert sorted(cert["probe"]) == ["0", "1"]
    assert [cert["ranks"][r]["lock_mismatches"] for r in ("0", "1")] == [[], []]  # probe matches the lock
    for p in cert["probe"].values():
        assert p["torch"]["version"] == "2.13.0+cpu"
        assert p["python"]["version"].startswith("3.11.")
        assert (p["os"]["id"], p["os"]["version_id"]) == ("debian", "12")
        assert p["image"]["ref"] == torch_image
    assert cert["base_used"] == "envbuild/bootstrap-debian:bookworm"
    html = certs[0].with_suffix(".html")
    assert f"report: {html}\n" in res.stdout and "report not written" not in res.stderr
    dom = Dom(dump_dom(chromium, html))
    assert "verdict: PASSED (exit code 0)" in dom.text and "torch 2.13.0+cpu 2.13.0+cpu" in dom.text, dom.text
    assert " all_reduce " in dom.text and f"run {cert['run_id']}" in dom.text
    # the default profile (ddp): its collectives all_reduce and broadcast, and its training losses
    assert " broadcast " in dom.text and [t for t, _ in dom.tags].count("svg") == 3
    assert leftovers(docker_client, f"envbuild.test-case={case}") == ([], [])


def test_engine_unreachable_is_one_line_exit_3(tmp_path):
    res = envbuild("certify", "envbuild/cpu-torch2:none", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert res.returncode == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr


def test_bad_arguments_valid_twins(tmp_path):
    res = envbuild("--images-dir", str(tmp_path), "render", "cpu-torch2")
    assert res.returncode == 0, res.stderr
    res = envbuild("doctor", "--checks", "stale-containers", "--stale-after", "0", "--stale-label", f"envbuild.test-case={uuid.uuid4().hex}")
    assert res.returncode == 0, res.stdout + res.stderr


def test_usage_errors_twin_reaches_the_engine(tmp_path):
    """The same options with good values get past the arguments: the missing engine, exit 3."""
    res = envbuild("certify", "envbuild/x:1", "--launcher", "slurm", "--pending-timeout", "5", "--slurm-nodes", "1",
                   "--time-limit", "10", "--port", "29500", "--min-busbw", "1", cwd=tmp_path, env=NO_ENGINE)
    assert res.returncode == 3
    assert res.stderr.startswith("error: no Docker engine answers at unix:///nonexistent/envbuild-e2e.sock")


def test_a_key_file_that_reads_but_is_no_key_is_64_twin(tmp_path):
    (tmp_path / "junk.key").write_text("not a key\n")
    res = envbuild("push", "cpu-torch2", "--registry", "localhost:5000", "--sign-key", "junk.key", cwd=tmp_path,
                   env=NO_ENGINE)
    assert res.returncode == 64 and res.stderr.startswith("error: junk.key: is not a usable PEM private key ("), \
        res.stderr
