#!/usr/bin/env python3
"""The steps of envbuild's GitHub Action (action.yml at the repository root; docs/ci.md).

    step.py check RECIPE|GLOB...   envbuild check --json of each recipe: ::error/::warning at the field's line
    step.py audit FILE|GLOB...     envbuild audit --json: one annotation per finding
    step.py certify                envbuild make RECIPE, or envbuild certify IMAGE [--recipe RECIPE]
                                   (the inputs: ENVBUILD_ACTION_*), then as summary
    step.py summary CERT [--report HTML] [--exit-code N]
                                   the verdict and the key table in $GITHUB_STEP_SUMMARY, the
                                   outputs in $GITHUB_OUTPUT

envbuild's own output is passed through between ``::stop-commands::`` markers, so nothing a recipe,
an image or a node wrote can act as a workflow command; the annotations come after. Exit code:
envbuild's, except 1 (warnings only) is 0 when ENVBUILD_ACTION_ALLOW_WARNINGS is ``true``.
Workflow command syntax: https://docs.github.com/actions/reference/workflows-and-actions/workflow-commands
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import html
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from builder.core.certificate import Certificate, load_certificate
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.inputs import MAX_RECIPE_BYTES, MAX_REPORT_BYTES, escape, read_json, read_text

#: envbuild's error lines: ``error: ...``, and a usage error's ``envbuild certify: argument ...``.
ERROR_LINE = re.compile(r"error: |envbuild [a-z0-9 -]{1,40}: ")
PRINTED = re.compile(r"(?P<key>certificate|report): (?P<path>\S.*)")
#: certify's options that the action has an input of (ENVBUILD_ACTION_<NAME>).
OPTIONS = {"PROFILE": "--profile", "NODES": "--nodes", "BACKEND": "--backend", "SIZES": "--sizes",
           "MIN_BUSBW": "--min-busbw"}
MARK = {True: "pass", False: "FAIL", None: "-"}


def envbuild() -> list[str]:
    """The envbuild of the running Python's environment (the action's venv), else PATH's."""
    found = shutil.which("envbuild", path=os.path.dirname(sys.executable)) or shutil.which("envbuild")
    return [found] if found else [sys.executable, "-m", "builder.cli"]


def run(argv: list[str], echo: bool = True) -> tuple[int, list[str]]:
    """Run envbuild, its output (stdout and stderr, in order) passed through as it comes (``echo``)."""
    lines: list[str] = []
    off = commands_off() if echo else contextlib.nullcontext()
    with off, subprocess.Popen(envbuild() + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if echo:
                print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
    return proc.returncode, lines


@contextlib.contextmanager
def commands_off() -> Iterator[None]:
    """What is printed inside cannot act as a workflow command (``::stop-commands::``)."""
    token = secrets.token_hex(16)
    print(f"::stop-commands::{token}", flush=True)
    try:
        yield
    finally:
        print(f"::{token}::", flush=True)


def prop(value: object) -> str:
    return data(value).replace(":", "%3A").replace(",", "%2C")


def data(value: object) -> str:
    return escape(value, 1000).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotate(level: str, file: str, line: int | None, title: str, message: str) -> None:
    """One annotation; a path under the working folder (the workspace) made relative, as GitHub maps them."""
    path, cwd = Path(file), Path.cwd()
    shown = path.relative_to(cwd) if path.is_absolute() and path.is_relative_to(cwd) else file
    where = f"file={prop(shown)}" + (f",line={line}" if line else "")
    print(f"::{level} {where},title={prop(title)}::{data(message)}", flush=True)


def field_line(path: str, field: str | None) -> int | None:
    """The 1-based line of ``field`` (``torch.version``, ``packages[2]``) in the YAML file, or of its
    deepest key found; None when the file does not compose (its error is its own line)."""
    try:
        node = yaml.compose(read_text(path, MAX_RECIPE_BYTES, "recipe"), Loader=yaml.SafeLoader)
    except (EnvbuildError, yaml.YAMLError):
        return None
    line = 1
    for part in re.findall(r"[^.\[\]]+", field or ""):
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
    return line


def expand(words: list[str]) -> list[str]:
    """Each word as a glob (sorted matches), or as itself when it matches nothing (envbuild says why)."""
    return [hit for w in words for hit in (sorted(glob.glob(w)) or [w])]


def allowed(rc: int) -> int:
    return 0 if rc == 1 and os.environ.get("ENVBUILD_ACTION_ALLOW_WARNINGS", "true") == "true" else rc


def annotate_findings(command: str, findings: list[dict]) -> None:
    """Each error and warning (audit's finding: level, rule, file, line, fields, message) as an annotation
    at its line, else, in a YAML file, at the line of its first field."""
    for f in findings:
        if f.get("level") not in ("error", "warning"):
            continue
        file, fields = str(f.get("file")), f.get("fields") or [None]
        line = f["line"] if isinstance(f.get("line"), int) else (
            field_line(file, str(fields[0])) if fields[0] and file.endswith((".yaml", ".yml")) else None)
        annotate(f["level"], file, line, f"envbuild {command}" + (f": {f['rule']}" if f.get("rule") else ""),
                 str(f.get("message")))


def run_json(argv: list[str]) -> tuple[int, dict]:
    """Run ``envbuild ... --json``: its exit code and document (``{}`` when it printed none); what it
    writes on stderr (its findings, as a terminal shows them) is passed through."""
    proc = subprocess.run(envbuild() + [*argv, "--json"], capture_output=True, text=True, errors="replace")
    print(proc.stderr, end="", flush=True)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    return proc.returncode, doc if isinstance(doc, dict) else {}


def check_text(f: dict) -> str:
    """A check finding's words as check prints them: ``torch.version: '2.13;rm' is not a version``."""
    said = f"{f['value']!r} {f.get('message')}" if f.get("value") is not None else str(f.get("message"))
    return f"{', '.join(f['fields'])}: {said}" if f.get("fields") else said


def cmd_check(recipes: list[str]) -> int:
    """``envbuild check --json`` of each recipe: its findings (or error) annotated at their field's line."""
    worst = 0
    for recipe in expand(recipes):
        with commands_off():
            rc, doc = run_json(["check", recipe])
            if doc.get("ok"):
                stack = doc.get("stack") or {}
                print(escape(f"{doc.get('file')}: ok: " + ", ".join(f"{k} {v or 'none'}" for k, v in stack.items()),
                             1000))
        worst = max(worst, rc)
        found = doc.get("findings") or doc.get("errors") or []
        annotate_findings("check", [{**f, "message": check_text(f)} for f in found])
    return allowed(worst)


def cmd_audit(files: list[str]) -> int:
    """``envbuild audit --json``: its findings shown as audit prints them, errors and warnings annotated."""
    with commands_off():
        rc, doc = run_json(["audit", *expand(files)])
    found = [{"file": e.get("file"), **f} for e in doc.get("files") or [] for f in e.get("findings") or []]
    annotate_findings("audit", found + list(doc.get("errors") or []))
    return allowed(rc) if doc else rc or ExitCode.UNREACHABLE


def certify_argv(env: os._Environ[str] | dict[str, str]) -> list[str]:
    """envbuild's command line of the inputs: make RECIPE, or certify IMAGE [--recipe RECIPE]."""
    argv = ["--images-dir", env["ENVBUILD_ACTION_IMAGES_DIR"]] if env.get("ENVBUILD_ACTION_IMAGES_DIR") else []
    recipe, image = env.get("ENVBUILD_ACTION_RECIPE", ""), env.get("ENVBUILD_ACTION_IMAGE", "")
    if image:
        argv += ["certify", image] + (["--recipe", recipe] if recipe else [])
    else:
        argv += ["make", recipe]
    for name, flag in OPTIONS.items():
        if env.get(f"ENVBUILD_ACTION_{name}"):
            argv += [flag, env[f"ENVBUILD_ACTION_{name}"]]
    return argv + shlex.split(env.get("ENVBUILD_ACTION_ARGS", ""))


def cmd_certify() -> int:
    if not (os.environ.get("ENVBUILD_ACTION_RECIPE") or os.environ.get("ENVBUILD_ACTION_IMAGE")):
        print("error: envbuild action: give the input recipe or image", file=sys.stderr)
        return ExitCode.USAGE
    try:
        argv = certify_argv(os.environ)
    except ValueError as e:  # shlex: an unbalanced quote
        print(f"error: envbuild action: input args: {escape(e)}: {escape(os.environ['ENVBUILD_ACTION_ARGS'])}",
              file=sys.stderr)
        return ExitCode.USAGE
    rc, lines = run(argv)
    printed = {m["key"]: m["path"] for m in filter(None, (PRINTED.fullmatch(x) for x in lines))}
    if "certificate" not in printed:
        errors = [x for x in lines if ERROR_LINE.match(x)][-5:]
        write_results(no_certificate(rc, errors), {"verdict": "error", "exit-code": str(rc)})
        return rc or ExitCode.UNREACHABLE
    return summarize(printed["certificate"], printed.get("report"), rc)


def no_certificate(rc: int, errors: list[str]) -> str:
    lines = [f"### envbuild: no certificate (exit {rc})", ""] + [f"- {md(e)}" for e in errors]
    return "\n".join(lines) + "\n"


def summarize(cert_path: str, report: str | None, rc: int) -> int:
    """The summary and outputs of the certificate at ``cert_path``; the step's exit code."""
    try:
        cert = load_certificate(read_json(cert_path, MAX_REPORT_BYTES, "certificate", ExitCode.CHECK_FAILED),
                                file=cert_path)
    except EnvbuildError as e:
        print(f"error: {e.message}", file=sys.stderr)
        write_results(no_certificate(e.exit_code, [e.message]), {"verdict": "error", "exit-code": str(e.exit_code)})
        return e.exit_code
    report = report if report and Path(report).is_file() else None
    outputs = {"verdict": "passed" if cert.verdict.passed else "failed", "exit-code": str(rc),
               "certificate": cert_path, "report": report or "",
               "artifact": "envbuild-" + re.sub(r"[^A-Za-z0-9._-]", "_", Path(cert_path).stem)[:200]}
    write_results(summary(cert, cert_path, report), outputs)
    return allowed(rc)


def write_results(markdown: str, outputs: dict[str, str]) -> None:
    """Append to $GITHUB_STEP_SUMMARY (else print) and $GITHUB_OUTPUT (one ``key=value`` line each)."""
    where = os.environ.get("GITHUB_STEP_SUMMARY")
    if where:
        with open(where, "a", encoding="utf-8") as f:
            f.write(markdown)
    else:
        print(markdown, end="")
    lines = [f"{k}={v}" for k, v in outputs.items() if "\n" not in v and "\r" not in v]
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write("".join(x + "\n" for x in lines))


def md(value: object, limit: int = 300) -> str:
    """One escaped line of Markdown text: no HTML, no emphasis, links or table cells planted."""
    return re.sub(r"([\\`*_\[\]|~#!])", r"\\\1", html.escape(escape(value, limit), quote=False))


def summary(cert: Certificate, cert_path: str, report: str | None) -> str:
    v = cert.verdict
    head = "PASSED" + (f" with {len(v.warnings)} warning(s)" if v.warnings else "") if v.passed \
        else f"FAILED (exit {v.exit_code})"
    out = [f"### envbuild certify: {head}", "", "| | value | threshold | result |", "|---|---|---|---|"]
    out += [f"| {md(k)} | {val} | {th} | {MARK[ok]} |" for k, val, th, ok in key_rows(cert)]
    out += [""] + [f"- fail: {md(f, 1000)}" for f in v.failures] + [f"- warning: {md(w, 1000)}" for w in v.warnings]
    out += ["", f"certificate: {md(cert_path)}" + (f", report: {md(report)}" if report else ""), ""]
    return "\n".join(x for i, x in enumerate(out) if x or (out[i - 1] if i else ""))  # no double blank lines


def key_rows(cert: Certificate) -> Iterator[tuple[str, str, str, bool | None]]:
    """(key, value, threshold, pass/fail/None) of the figures the verdict rests on."""
    st, s = cert.stack, cert.settings
    yield "image", md(cert.image.ref), "", None
    stack = ", ".join(f"{k} {md(getattr(st, k), 80)}" for k in ("torch", "python", "cuda", "nccl", "os")
                      if st is not None and getattr(st, k) is not None)
    ref = f"lock of {md(cert.recipe, 80)}" if cert.lock is not None else "rank 0's probe (no lock)"
    probes_ok = not any(r.lock_mismatches for r in cert.ranks.values() if isinstance(r.lock_mismatches, list))
    yield "stack", stack or "-", f"every rank equal to the {ref}", probes_ok
    reported = sum(1 for r in cert.ranks.values() if r.reported)
    yield "ranks", (f"{reported} of {cert.world_size} reported ({cert.nodes} node(s) x {cert.nproc_per_node}, "
                    f"backend {md(cert.backend.used, 80)})"), f"{cert.world_size}", reported == cert.world_size
    sweep = cert.collectives.get("all_reduce")
    rows = sweep if isinstance(sweep, list) else []
    gate = next((r for r in rows if r.size_bytes == s.busbw_size and r.type == "float32"), None)
    floor = s.min_busbw_gbps
    yield (f"all-reduce busbw at {s.busbw_size} B", f"{gate.busbw_gbps:.3f} GB/s" if gate else "-",
           f">= {floor:g} GB/s ({s.busbw_source})" if floor is not None else "not gated",
           None if floor is None else gate is not None and gate.busbw_gbps >= floor)
    measured = {n: rs for n, rs in cert.collectives.items() if isinstance(rs, list)}
    wrong = sum(r.wrong for rs in measured.values() for r in rs)
    yield "#wrong", f"{wrong} in {len(measured)} collective(s)", "0", wrong == 0 if measured else None
    checks = {n: c for n, c in cert.training.items() if c.unsupported is None}
    yield ("training checks", ", ".join(f"{n} {'yes' if c.reference_match else 'NO'}" for n, c in checks.items())
           or "-", "match the single-process reference", all(c.reference_match for c in checks.values())
           if checks else None)
    sc, e = cert.scaling, s.min_scaling_efficiency
    if sc is not None and sc.efficiency is not None:
        yield ("scaling efficiency", f"{sc.efficiency:.3f} ({sc.throughput_n:.1f} images/s at {sc.world_size})",
               f">= {e:g}" if e is not None else "not gated", None if e is None else sc.efficiency >= e)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="step.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    sub.add_parser("check").add_argument("recipes", nargs="+")
    sub.add_parser("audit").add_argument("files", nargs="+")
    sub.add_parser("certify")
    s = sub.add_parser("summary")
    s.add_argument("certificate")
    s.add_argument("--report")
    s.add_argument("--exit-code", type=int, default=0)
    args = p.parse_args(argv)
    if args.step == "check":
        return cmd_check(args.recipes)
    if args.step == "audit":
        return cmd_audit(args.files)
    if args.step == "certify":
        return cmd_certify()
    return summarize(args.certificate, args.report, args.exit_code)


if __name__ == "__main__":
    sys.exit(main())
