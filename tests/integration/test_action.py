"""The action's certify step (scripts/action/step.py certify, as action.yml runs it) on the real
engine: the session's cpu-torch2 image certified on 2 gloo nodes, the job summary and outputs
naming the certificate and report it wrote; its failing twin misses an unreachable busbw floor."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from test_action_units import commands_off, step


def certify(tmp_path: Path, image: str, labels: dict[str, str], **inputs: str):
    env = {"ENVBUILD_ACTION_IMAGE": image, "ENVBUILD_ACTION_SIZES": "8,1M",
           "ENVBUILD_ACTION_IMAGES_DIR": str(tmp_path / "images"),
           "ENVBUILD_EXTRA_LABELS": ",".join(f"{k}={v}" for k, v in
                                             {**labels, "envbuild.test-case": uuid.uuid4().hex[:12]}.items()),
           **{f"ENVBUILD_ACTION_{k.upper()}": v for k, v in inputs.items()}}
    return step(tmp_path, "certify", env=env)


def outputs_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


@pytest.mark.parametrize("floor, code, verdict, busbw", [
    ("", 0, "passed", "| not gated | - |"),
    ("1000", 2, "failed", "| >= 1000 GB/s (argument) | FAIL |"),
])
def test_certify_step_writes_summary_and_outputs(tmp_path, docker_client, torch_image, test_labels,
                                                 floor, code, verdict, busbw):
    res, summary, outputs = certify(tmp_path, torch_image, test_labels, min_busbw=floor)
    assert res.returncode == code, res.stdout[-3000:]
    shown, after = commands_off(res.stdout)
    assert any(line.startswith("certificate: ") for line in shown) and after == []
    out = outputs_of(outputs)
    cert, report = Path(out.pop("certificate")), Path(out.pop("report"))
    assert out == {"verdict": verdict, "exit-code": str(code), "artifact": "envbuild-" + cert.stem}
    assert cert.parent.parent.parent == tmp_path / "images" and cert.parent.name == "certificates"
    assert json.loads(cert.read_text())["verdict"]["passed"] is (code == 0)
    assert report == cert.with_suffix(".html") and report.read_text().startswith("<!DOCTYPE html>")
    lines = summary.splitlines()
    assert lines[0] == ("### envbuild certify: PASSED" if code == 0 else "### envbuild certify: FAILED (exit 2)")
    assert lines[4] == f"| image | {torch_image} |  | - |"
    assert lines[6] == "| ranks | 2 of 2 reported (2 node(s) x 1, backend gloo) | 2 | pass |"
    assert lines[7].startswith("| all-reduce busbw at 1048576 B | ") and lines[7].endswith(busbw)
    if code:
        assert [x for x in lines if x.startswith("- fail: ")] == [
            x for x in lines if x.startswith("- fail: all-reduce busbw ") and "below the floor of 1000 GB/s" in x]
