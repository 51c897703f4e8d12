"""The exit-code table (docs/commands.md, "Exit codes") holds for every command: one real case per
(command, code) pair that needs no engine here (the engine is ``DOCKER_HOST`` pointing at a
socket that does not exist, so reaching for it is 3), and :data:`COVERAGE` naming the test
of every pair, here or elsewhere; :func:`test_coverage_names_real_tests` keeps it honest."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from builder.cli import app

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "reg.example/x@sha256:" + "a" * 64
CERT = "tests/fixtures/certificate-profiles.json"
NO_ENGINE = "unix:///nonexistent/docker.sock"

#: (command, exit code) -> the test that asserts it (``file::name``; this file's are ``CASES``).
COVERAGE: dict[tuple[str, int], str] = {
    **{(c, 64): "tests/integration/hostile/test_cli.py::test_hostile_command_line"
       for c in ("check", "render", "build", "certify", "make", "probe", "verify", "doctor", "base", "lock",
                 "push", "pull", "k8s render", "audit", "report")},
    ("check", 0): "CASES", ("check", 1): "CASES", ("check", 2): "CASES", ("check", 3): "CASES",
    ("audit", 0): "tests/unit/test_audit.py::test_build_args_fill_what_the_file_leaves_open",
    ("audit", 1): "tests/unit/test_audit.py::test_build_args_fill_what_the_file_leaves_open",
    ("audit", 2): "tests/unit/test_audit.py::test_build_args_fill_what_the_file_leaves_open",
    ("audit", 3): "tests/unit/test_audit.py::test_json_report_follows_the_committed_schema",
    ("render", 0): "CASES", ("render", 1): "CASES", ("render", 2): "CASES", ("render", 3): "CASES",
    ("build", 0): "tests/integration/test_exit_codes_engine.py::test_build_0_and_1_with_the_bootstrapped_base_warning",
    ("build", 1): "tests/integration/test_exit_codes_engine.py::test_build_0_and_1_with_the_bootstrapped_base_warning",
    ("build", 2): "tests/integration/test_build_stamp.py::test_stale_rendered_files_are_refused_despite_a_stamp",
    ("build", 3): "CASES",
    ("certify", 0): "tests/integration/test_certify_profiles.py::test_foreign_image_with_every_profile",
    ("certify", 1): "tests/integration/test_exit_codes_engine.py::test_certify_of_an_image_without_numpy_is_1",
    ("certify", 2): "tests/integration/test_certify_profiles.py::test_image_without_python_or_torch_refused",
    ("certify", 3): "tests/integration/test_exit_codes_engine.py::test_a_missing_image_is_3",
    ("certify", 130): "tests/integration/test_certify_e2e.py::test_cli_interrupted_leaves_nothing",
    ("make", 0): "tests/integration/test_exit_codes_engine.py::test_make_with_its_base_named_is_0",
    ("make", 1): "tests/integration/test_cli_e2e.py::test_make_cpu_torch2_end_to_end",
    ("make", 2): "CASES", ("make", 3): "CASES",
    ("report", 0): "CASES", ("report", 2): "CASES", ("report", 3): "CASES",
    ("probe", 0): "CASES",
    ("probe", 70): "tests/integration/test_cli_e2e.py::test_unexpected_exception_is_escaped_and_exit_70",
    ("probe", 130): "tests/integration/test_cli_e2e.py::test_sigterm_is_130_with_one_line",
    ("verify", 0): "tests/integration/test_verify_against.py::test_certified_rank_probe_matches_its_certificate",
    ("verify", 1): "tests/integration/test_verify.py::test_report_strings_print_literally_and_escaped",
    ("verify", 2): "tests/integration/test_verify.py::test_missing_interface_fails",
    ("verify", 3): "tests/integration/test_exit_codes_engine.py::test_a_missing_image_is_3",
    ("doctor", 0): "tests/integration/test_doctor.py::test_fix_removes_the_leftover_and_nothing_else",
    ("doctor", 1): "tests/integration/test_gpu_health.py::test_doctor_with_a_gpu_health_warning_only_exits_1",
    ("doctor", 2): "tests/integration/test_doctor.py::test_blocked_rendezvous_port_is_named_with_the_host_pair",
    ("doctor", 3): "tests/integration/test_exit_codes_engine.py::test_a_missing_image_is_3",
    ("base", 0): "tests/integration/test_exit_codes_engine.py::test_base_bootstrap_of_the_kept_base_is_0",
    ("base", 3): "CASES",
    ("lock", 0): "CASES", ("lock", 1): "CASES", ("lock", 2): "CASES", ("lock", 3): "CASES",
    ("push", 0): "tests/integration/test_registry.py::test_push_then_pull_by_digest_on_a_clean_engine",
    ("push", 1): "tests/integration/test_registry.py::test_push_and_pull_with_warnings_only_exit_1",
    ("push", 2): "tests/integration/test_registry.py::test_push_refused_without_a_passing_certificate",
    ("push", 3): "tests/integration/test_exit_codes_engine.py::test_a_missing_image_is_3",
    ("pull", 0): "tests/integration/test_registry.py::test_push_then_pull_by_digest_on_a_clean_engine",
    ("pull", 1): "tests/integration/test_registry.py::test_push_and_pull_with_warnings_only_exit_1",
    ("pull", 2): "tests/integration/test_registry.py::test_pull_refused_when_no_certificate_is_published",
    ("pull", 3): "CASES",
    ("k8s render", 0): "CASES", ("k8s render", 1): "CASES", ("k8s render", 2): "CASES",
    ("k8s render", 3): "tests/integration/test_exit_codes_engine.py::test_a_missing_image_is_3",
    ("k8s gate", 0): "CASES",
    ("k8s gate", 2): "tests/integration/test_k8s_gate.py::test_k8s_gate_refuses_a_tag_without_allow_tag",
    ("k8s gate", 3): "CASES", ("k8s gate", 64): "CASES",
    ("config", 0): "tests/unit/test_conventions.py::test_a_config_file_that_is_no_regular_file_is_refused_not_skipped",
    ("config", 3): "tests/unit/test_conventions.py::test_a_config_file_that_is_no_regular_file_is_refused_not_skipped",
    ("config", 64): "tests/unit/test_conventions.py::test_config_file_errors_name_the_file",
    # gate: its codes are asserted by tests/integration/test_gate.py (the gate's own work)
    **{("gate", code): "tests/integration/test_gate.py" for code in (0, 1, 2, 3, 64)},
}


def _warning_recipe(tmp: Path) -> str:
    """cuda12-torch2 on a base whose CUDA differs in minor version: a warning, nothing failing."""
    text = (ROOT / "recipes/cuda12-torch2.yaml").read_text()
    path = tmp / "warny.yaml"
    path.write_text(re.sub(r"nvidia/cuda:12\.8\.\d+", "nvidia/cuda:12.6.3", text))
    return str(path)


def _bad_recipe(tmp: Path) -> str:
    path = tmp / "bad.yaml"
    path.write_text((ROOT / "recipes/cpu-torch2.yaml").read_text().replace("version: 2.13.0", "version: '2.8;rm'"))
    return str(path)


def _not_a_cert(tmp: Path) -> str:
    (tmp / "x.json").write_text('{"schema": "envbuild.certificate/1"}')
    return str(tmp / "x.json")


#: (command, argv given the test's tmp folder, exit code, a line of stderr or stdout).
CASES = [
    ("check", lambda t: ["check", "cpu-torch2"], 0, "ok: torch 2.13.0+cpu"),
    ("check", lambda t: ["check", _warning_recipe(t)], 1, "differ in minor version"),
    ("check", lambda t: ["check", _bad_recipe(t)], 2, "torch.version: '2.8;rm'"),
    ("check", lambda t: ["check", str(t / "nope.yaml")], 3, "nope.yaml: no such recipe"),
    ("render", lambda t: ["--images-dir", str(t), "render", "cpu-torch2"], 0, "wrote "),
    ("render", lambda t: ["--images-dir", str(t), "render", _warning_recipe(t)], 1, "differ in minor version"),
    ("render", lambda t: ["--images-dir", str(t), "render", _bad_recipe(t)], 2, "torch.version: '2.8;rm'"),
    ("render", lambda t: ["render", str(t / "nope.yaml")], 3, "no such recipe"),
    ("build", lambda t: ["build", str(t / "nope.yaml")], 3, "no such recipe"),
    ("make", lambda t: ["--images-dir", str(t), "make", _bad_recipe(t)], 2, "torch.version: '2.8;rm'"),
    ("make", lambda t: ["make", str(t / "nope.yaml")], 3, "no such recipe"),
    ("report", lambda t: ["report", CERT, "--out", str(t / "r.html")], 0, "report: "),
    ("report", lambda t: ["report", _not_a_cert(t)], 2, "x.json"),
    ("report", lambda t: ["report", str(t / "nope.json")], 3, "nope.json"),
    ("probe", lambda t: ["probe"], 0, '"schema"'),
    ("base", lambda t: ["base", "bootstrap"], 3, "no Docker engine answers"),
    ("lock", lambda t: ["--images-dir", str(t), "lock", "cpu-torch2", "--no-base", "--no-pip", "--no-apt"], 0,
     "unresolved; pip 0 package(s)"),
    ("lock", lambda t: ["--images-dir", str(t), "lock", "cpu-torch2", "--no-base", "--no-pip"], 1,
     "warning: apt: no Docker engine to query the base image"),
    ("lock", lambda t: ["--images-dir", str(t), "lock", _bad_recipe(t)], 2, "torch.version: '2.8;rm'"),
    ("lock", lambda t: ["lock", str(t / "nope.yaml")], 3, "no such recipe"),
    ("pull", lambda t: ["pull", "cpu-torch2", "--registry", "127.0.0.1:1", "--format", "sif", "--print-only"], 3,
     "registry 127.0.0.1:1 unreachable"),
    ("k8s render", lambda t: ["k8s", "render", "cpu-torch2", "--image", DIGEST, "--out", str(t / "m")], 0,
     "wrote "),
    ("k8s render", lambda t: ["k8s", "render", "cuda12-torch2", "--image", DIGEST, "--out", str(t / "m"),
                              "--backend", "gloo"], 1, "warning: recipe busbw floor 10 GB/s not applied on gloo"),
    ("k8s render", lambda t: ["k8s", "render", "cpu-torch2", "--image", "reg.example/x:1", "--out", str(t / "m")],
     2, "REPO@sha256:"),
    ("k8s gate", lambda t: ["k8s", "gate", CERT, "--image", DIGEST, "--out", str(t / "m")], 0, "wrote "),
    ("k8s gate", lambda t: ["k8s", "gate", str(t / "nope.json"), "--image", DIGEST, "--out", str(t / "m")], 3,
     "nope.json"),
    ("k8s gate", lambda t: ["k8s", "gate", CERT, "--image", DIGEST, "--out", str(t / "m"), "--interval", "-1"], 64,
     "--interval"),
]


@pytest.mark.parametrize("command, argv, code, line", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_exit_code(command, argv, code, line, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        got = app.main(argv(tmp_path))
    assert (got, line in err.getvalue() + out.getvalue()) == (code, True), err.getvalue() + out.getvalue()
    assert "Traceback" not in err.getvalue()


def test_a_warning_line_makes_a_0_a_1_and_leaves_a_failure_as_it_is(monkeypatch):
    from builder.cli import output

    monkeypatch.setattr(output, "warned", [0])
    assert [output.exit_code(c) for c in (0, 2, 3)] == [0, 2, 3]
    output.warn("base stands in")
    assert [output.exit_code(c) for c in (0, 2, 3)] == [1, 2, 3]


def test_coverage_names_real_tests():
    for (command, code), where in COVERAGE.items():
        if where == "CASES":
            assert (command, code) in {(c[0], c[2]) for c in CASES}, (command, code)
            continue
        path, _, name = where.partition("::")
        units = ROOT / "tests" / "unit" / Path(path).name.replace(".py", "_units.py")  # its engine-free half
        text = (ROOT / path).read_text() + (units.read_text() if units.exists() else "")
        assert not name or f"def {name}(" in text, where
    for command in ("check", "audit", "render", "build", "certify", "make", "report", "probe", "verify", "gate",
                    "doctor", "base", "lock", "push", "pull", "k8s render", "k8s gate", "config"):
        assert {0, 64} & {code for c, code in COVERAGE if c == command}, command
