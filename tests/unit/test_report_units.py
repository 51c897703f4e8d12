"""The HTML report of a certificate (builder/certify/report.py) and the node logs beside it, without a
browser: the certification run writes it next to the certificate, and a report that cannot
be written costs one warning, not the certificate; ``envbuild report`` draws one again from a
file read bounded and checked against the model (exit 0/2/3/64); writing is atomic; work is
bounded on huge certificates; seeded hostile certificates of both shapes are drawn and stay
inert; values out of any plot range stay in the tables. (In Chromium:
tests/integration/test_report.py.)"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console
from test_certify_units import CPU_LOCK, FakeClient, FakeLauncher, _labels, rank_doc

from builder.certify import report
from builder.certify.run import logs_path
from builder.core.certificate import load_certificate
from builder.core.errors import ManyErrors
from builder.core.events import event

from certify_helpers import certify_image
from fixtures_browser import Dom
from fixtures_report import HOSTILE, ROOT, injected, issue10_doc, row, todays_certificate
from helpers import tmpfs

LOG_LINE = event("log", "torchrun: hi", run="r1", node="node-1", rank=1, ts="2026-05-12T10:00:01.000Z")


def test_the_certification_run_writes_the_report_and_node_logs_beside_the_certificate(tmp_path):
    buf = io.StringIO()
    cert, path = certify_image(FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=tmp_path, run_id="r1",
                               launcher=FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="r1")],
                                                     log_events=[LOG_LINE]),
                               console=Console(file=buf, width=400))
    html, logs = report.report_path(path), logs_path(path)
    assert html == path.with_suffix(".html") and html.is_file()
    assert "warning" not in buf.getvalue()
    page = html.read_text()
    assert "verdict: PASSED (exit code 0)" in page and "<td class=\"mono\">r1</td>" in page and "<svg" in page
    assert logs.name == path.name.removesuffix(".json") + ".logs.jsonl" and logs.stat().st_mode & 0o777 == 0o600
    assert logs.read_text() == ('{"ts":"2026-05-12T10:00:01.000Z","level":"info","run":"r1","node":"node-1",'
                                '"rank":1,"event":"log","msg":"torchrun: hi"}\n')
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, html.name, logs.name])  # no temporary


@pytest.fixture
def small_disk(tmp_path):
    """A 16 KiB tmpfs (root only): room for a certificate (~5 KiB), not for its report (~45 KiB)."""
    with tmpfs(tmp_path / "small", "16k") as mnt:
        yield mnt


def test_a_report_and_node_logs_that_cannot_be_written_keep_the_certificate(small_disk):
    buf = io.StringIO()
    cert, path = certify_image(FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=small_disk, run_id="r1",
                               launcher=FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="r1")],
                                                     log_events=[LOG_LINE] * 1000),  # 120 KB
                               console=Console(file=buf, width=10_000))
    assert cert["verdict"]["passed"] and load_certificate(json.loads(path.read_text())).run_id == "r1"
    lines = [line for line in buf.getvalue().splitlines() if "warning" in line]
    html, logs = path.with_suffix(".html"), path.with_suffix(".logs.jsonl")
    assert lines == [f"warning: report not written: {html}: cannot write: No space left on device (the certificate {path} is kept)",
                     f"warning: node logs not written: {logs}: cannot write: No space left on device (the certificate "
                     f"{path} is kept)"]
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no report, no logs, no temporary file


def _report_cli(*args: str) -> tuple[int, str, str]:
    res = subprocess.run([sys.executable, "-m", "builder.cli", "report", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    return res.returncode, res.stdout, res.stderr


def test_report_command_draws_again_and_refuses_bad_certificates(tmp_path):
    cert = tmp_path / "c.json"
    cert.write_text(json.dumps(todays_certificate()))
    assert _report_cli(str(cert), "--out", str(tmp_path / "o.html")) == (0, f"report: {tmp_path}/o.html\n", "")
    assert "verdict: PASSED" in (tmp_path / "o.html").read_text()
    failing = todays_certificate()
    failing["verdict"] = {"passed": False, "exit_code": 2, "failures": ["rank 1: 3 wrong elements"], "warnings": []}
    cert.write_text(json.dumps(failing))
    assert _report_cli(str(cert)) == (0, f"report: {tmp_path}/c.html\n", "")  # drawn: whatever the verdict
    assert "verdict: FAILED (exit code 2)" in (tmp_path / "c.html").read_text()
    assert _report_cli(str(cert), "--out", str(cert)) == (
        64, "", f"envbuild report: the report would replace the certificate {cert}; give --out FILE\n")
    assert _report_cli(str(tmp_path / "none.json")) == (3, "", f"error: {tmp_path}/none.json: no such certificate\n")
    os.mkfifo(tmp_path / "fifo.json")
    assert _report_cli(str(tmp_path / "fifo.json")) == (
        3, "", f"error: {tmp_path}/fifo.json: is not a regular file (a FIFO); give a certificate\n")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((16 << 20) + 1))
    assert _report_cli(str(big)) == (
        3, "", f"error: {big}: is {(16 << 20) + 1} bytes, over the 16777216-byte limit of a certificate\n")
    (tmp_path / "nan.json").write_text('{"schema": NaN}')
    code, out, err = _report_cli(str(tmp_path / "nan.json"))
    assert (code, out) == (2, "") and err.startswith(f"error: {tmp_path}/nan.json: not valid JSON: "), err
    bad = todays_certificate()
    bad["world_size"] = "\x1b[2Jtwo"
    cert.write_text(json.dumps(bad))
    assert _report_cli(str(cert), "--out", str(tmp_path / "bad.html")) == (
        2, "", f"error: {cert}: world_size: '\\x1b[2Jtwo' is not an integer\n")
    assert not (tmp_path / "bad.html").exists()
    cert.write_text(json.dumps(todays_certificate()))
    assert _report_cli(str(cert), "--out", str(tmp_path / "no" / "x.html")) == (
        3, "", f"error: {tmp_path}/no: no such folder\n")


def test_writing_replaces_a_report_atomically(tmp_path):
    """A report drawn again replaces the old one whole (os.replace of a complete temporary file)."""
    target = tmp_path / "r.html"
    target.write_text("old")
    report.write_report(todays_certificate(), target)
    assert target.read_text().startswith("<!DOCTYPE html>") and target.read_text().rstrip().endswith("</html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_work_is_bounded_on_a_huge_certificate():
    """100 000 sizes and 10 000 ranks: at most MAX_ROWS rows and MAX_RANKS ranks shown."""
    doc = todays_certificate()
    doc["collectives"] = {"all_reduce": [row(8 + i) for i in range(100_000)]}
    doc["ranks"] = {str(r): {"node": r, "reported": True} for r in range(10_000)}
    page = report.render_html(doc)
    assert page.count("<td class=\"num\">float32") == 0 and page.count("<td>float32</td>") == report.MAX_ROWS
    assert f"{100_000 - report.MAX_ROWS} more row(s) not shown" in page
    assert f"{10_000 - report.MAX_RANKS} more rank(s) not shown" in page


#: Strings and values a hostile or broken certificate may hold where a string or number is due.
HOSTILE_VALUES = [
    HOSTILE, '"><svg onload=alert(1)>', "'><iframe src=javascript:alert(1)>", "</style><script>x()</script>",
    "<!-- -->", "]]><script>y()</script>", "{% raw %}{{ config }}", "\x1b[2J\x1b]0;pwned\x07", "\u202e\u2028\x00",
    "x" * 100_000, "$\\frac{a}{b}$", 10**40, -1, 1e308, True, None, [], {}, [[1, 2], {"a": "<b>"}], {"<i>": "<u>"},
]


def _leaves(node, path=()):
    """Every (path, value) of the scalars and empty containers of ``node``."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list) and node:
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    else:
        yield path, node


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def test_generated_hostile_certificates_draw_or_are_refused_and_stay_inert():
    """Seeded: 16 certificates (12 of today's shape, 4 of issue 10's) with 12 leaves each
    replaced by a hostile value of any type (also where a number or a list is due). The report
    reads a document through the Certificate model: one the model refuses raises ManyErrors
    (exit 2, one line per violation, no page); one it takes is drawn without a warning, and
    nothing in it is markup."""
    import random
    import warnings

    rng = random.Random(20261201)
    bases = [todays_certificate(), issue10_doc()]
    drawn = refused = 0
    for n in range(16):
        doc = copy.deepcopy(bases[int(n % 4 == 1)])
        leaves = list(_leaves(doc))
        strings_only = n % 2 == 0  # half: hostile strings where free text is (not the probe's or lock's patterns)
        pool = [(p, v) for p, v in leaves if isinstance(v, str) and p[0] not in ("probe", "lock", "schema")
                and p[-1] not in ("source", "busbw_source")] if strings_only else leaves
        for path, _ in rng.sample(pool, 12):
            _set(doc, path, copy.deepcopy(rng.choice(HOSTILE_VALUES[:9] if strings_only else HOSTILE_VALUES)))
        if n % 3 == 0:  # a hostile key as well
            doc["collectives"][rng.choice(HOSTILE_VALUES[:7])] = (
                {"unsupported": rng.choice(HOSTILE_VALUES[:9])} if strings_only else rng.choice(HOSTILE_VALUES))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. numpy's overflow of a 1e308 bandwidth on a log axis
            try:
                page = report.render_html(doc)
            except ManyErrors as e:
                assert e.exit_code == 2 and e.errors and all("\n" not in str(x) for x in e.errors), n
                refused += 1
                continue
        drawn += 1
        dom = Dom(page)
        assert injected(dom) == [] and "<script" not in page and "\x1b" not in page, n
        assert page.rstrip().endswith("</html>") and "verdict: " in dom.text, n
    assert (drawn, refused) == (7, 9)  # one free-text refusal: a stamp over its 64 characters


def test_values_out_of_any_plot_range_stay_in_the_table_only():
    """A 1e308 GB/s bandwidth, a 1e308 loss and the model's largest size (2**40 B) with a 0 GB/s
    bandwidth (no point on a log axis) are left out of the plots (no overflow in matplotlib's
    tick and log-axis arithmetic: warnings are errors here) and still shown in the table."""
    import warnings

    doc = issue10_doc()
    doc["collectives"]["broadcast"][0]["busbw_gbps"] = 1e308
    doc["collectives"]["broadcast"][1].update(size_bytes=2**40, algbw_gbps=0.0, busbw_gbps=0.0)
    doc["training"]["ddp"]["losses"][1] = 1e308
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = Dom(report.render_html(doc)).text
    assert text.count(" 1e+308 ") == 2 and " 1099511627776 " in text  # broadcast: its best busbw, its table


def test_key_figures_fail_each_miss_against_its_floor():
    """The summary's key figures: a rank whose probe reports another torch (and its lock
    mismatch), a busbw floor at a size never measured and a scaling floor without a measurement
    each FAIL, saying what was measured; the twin, today's certificate, passes or is not gated."""
    doc = todays_certificate()
    assert (" ranks reported 2 of 2 every rank pass stack no difference every rank as the reference pass wrong "
            "elements 0 in 3 measurement(s) of 1 collective(s) 0 pass all-reduce busbw at 64KB, float32 0.05 GB/s "
            "not gated (no --min-busbw) not gated stack against the reference ") in Dom(report.render_html(doc)).text
    doc["probe"]["1"]["torch"]["version"] = "2.12.0+cpu"
    doc["ranks"]["1"]["lock_mismatches"] = ["torch 2.12.0+cpu, the lock pins 2.13.0+cpu"]
    doc["settings"].update(min_busbw_gbps=1.0, busbw_size=4096, busbw_source="argument", min_scaling_efficiency=0.5)
    text = Dom(report.render_html(doc)).text
    assert " stack ranks differ in torch; 1 difference(s) from the lock every rank as the reference FAIL " in text
    assert " all-reduce busbw at 4KB, float32 not measured >= 1 GB/s (argument) FAIL " in text
    assert " scaling efficiency at 2 ranks not measured >= 0.5 FAIL " in text
    assert " torch 2.13.0+cpu (rank 0); 2.12.0+cpu (rank 1) 2.13.0+cpu " in text
    assert " rank 1: torch 2.12.0+cpu, the lock pins 2.13.0+cpu " in text
