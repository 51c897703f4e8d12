"""The HTML report of a certificate (builder/certify/report.py; issue 10, item 5) in a real
browser: Debian's headless Chromium takes a screenshot (a real image of the size asked, not
blank, with the plots' line colours in it) and dumps the DOM (the verdict, the stack and each
collective's name in its text). Certificates of today's shape (all-reduce sweep, DDP), of
issue 10's (six collectives, one unsupported; training checks against the reference;
scaling) and of a real ``--profile all`` run are drawn; hostile strings stay text; the page
loads nothing from elsewhere. The checks' twins: a blank page, a page without plots, markup
pasted raw. (Without a browser: tests/unit/test_report_units.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from builder.certify import report

from fixtures_browser import Dom, drawn, dump_dom, picture, screenshot
from fixtures_report import (
    HOSTILE,
    ROOT,
    external,
    hostile_certificate,
    injected,
    issue10_doc,
    profiles_certificate,
    todays_certificate,
)


def _open(chromium, html: Path, tmp_path: Path, height: int) -> tuple[dict, Dom]:
    pic = picture(screenshot(chromium, html, tmp_path / f"{html.stem}.png", 1280, height))
    return pic, Dom(dump_dom(chromium, html))


def test_report_of_todays_certificate_in_chromium(chromium, tmp_path):
    html = report.write_report(todays_certificate(), tmp_path / "cert.html", source="cert.json")
    pic, dom = _open(chromium, html, tmp_path, 1600)
    assert pic["size"] == (1280, 1600) and drawn(pic), pic
    assert pic["C0"] > 20 and pic["C1"] > 200, pic  # the algbw line, the busbw line dashed over it (world 2)
    text = dom.text
    assert "verdict: PASSED (exit code 0)" in text
    assert "torch 2.13.0+cpu 2.13.0+cpu" in text and "Python 3.11.2 3.11" in text
    assert "OS Debian GNU/Linux 12 (bookworm) debian 12" in text and "CUDA - (not recorded)" in text
    assert "reference: the image's recipe lock" in text
    assert re.search(r"all_reduce .*size \(B\) count type time \(us\) algbw \(GB/s\) busbw \(GB/s\) #wrong "
                     r"8 2 float32 101\.00 0\.05 0\.05 0", text), text
    assert "training This certificate holds no training check." in text  # the legacy DDP table is not carried
    assert "0 0 node-0 cpu yes 5.00 1 1 node-1 cpu yes 5.00 collectives" in text
    assert sum(1 for t, _ in dom.tags if t == "svg") == 1 and injected(dom) == []


def test_report_of_an_issue10_certificate_in_chromium(chromium, tmp_path):
    html = report.write_report(issue10_doc(), tmp_path / "cert10.html", source="cert10.json")
    pic, dom = _open(chromium, html, tmp_path, 4000)
    assert pic["size"] == (1280, 4000) and drawn(pic) and pic["C0"] > 1000 and pic["C1"] > 1000, pic
    text = dom.text
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"):
        assert f" {name} " in text, name
    assert "send_recv unsupported: gloo has no batched isend/irecv ring in this torch" in text
    assert "bfloat16" in text and "reference: no recipe lock: discovered by rank 0's probe" in text
    for name in ("ddp", "fsdp", "pipeline", "tp"):
        assert re.search(rf" {name} reference_match: (true|false) ", text), name
    assert "tp reference_match: false" in text and "moe unsupported: needs numpy" in text
    assert "tolerance.rtol 1e-05" in text and "schedule ScheduleGPipe" in text
    assert "efficiency: 0.930 (93.0 %)" in text and "throughput_n 93" in text
    # five collectives drawn (send_recv unsupported), four loss plots (moe unsupported)
    assert sum(1 for t, _ in dom.tags if t == "svg") == 9 and injected(dom) == []
    assert external(dom, html.read_text()) == []  # readable without a network


def test_report_of_a_real_profiles_run_in_chromium(chromium, tmp_path):
    """A certificate written by a real run (tests/fixtures/certificate-profiles.json: w-i10a's
    `certify` of cpu-torch2 with every profile on 2 gloo nodes, sizes 8 B to 1 MiB)."""
    doc = profiles_certificate()
    html = report.write_report(doc, tmp_path / "real.html")
    pic, dom = _open(chromium, html, tmp_path, 3000)
    assert pic["size"] == (1280, 3000) and drawn(pic) and pic["C0"] > 1000 and pic["C1"] > 1000, pic
    text = dom.text
    assert "verdict: PASSED (exit code 0)" in text and "reference: the image's recipe lock" in text
    assert "torch 2.13.0+cpu 2.13.0+cpu" in text and "OS Debian GNU/Linux 12 (bookworm) debian 12" in text
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"):
        assert f" {name} " in text, name
    for name in ("ddp", "fsdp", "tp", "pipeline", "moe"):
        assert f" {name} reference_match: true " in text, name
    assert "efficiency: 0.283 (28.3 %)" in text
    assert sum(1 for t, _ in dom.tags if t == "svg") == 11 and injected(dom) == []  # 6 collectives, 5 losses


def test_a_blank_or_plotless_page_fails_the_screenshot_checks_twin(chromium, tmp_path):
    """The twins of the screenshot checks: a blank page is not drawn; a report without a
    collective has no line colour in it."""
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    pic = picture(screenshot(chromium, blank, tmp_path / "blank.png", 1280, 800))
    assert pic["size"] == (1280, 800) and not drawn(pic), pic
    doc = todays_certificate()
    doc["collectives"] = {}
    pic, _ = _open(chromium, report.write_report(doc, tmp_path / "noplot.html"), tmp_path, 1600)
    assert drawn(pic) and pic["C0"] == 0 and pic["C1"] == 0, pic


def test_hostile_strings_stay_text_in_chromium(chromium, tmp_path):
    cert = tmp_path / "hostile.json"
    cert.write_text(json.dumps(hostile_certificate()))
    res = subprocess.run([sys.executable, "-m", "builder.cli", "report", str(cert)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, f"report: {tmp_path}/hostile.html\n", "")
    doc10 = issue10_doc(hostile_certificate())
    doc10["collectives"][HOSTILE] = doc10["collectives"].pop("broadcast")
    doc10["training"][HOSTILE] = doc10["training"].pop("fsdp")
    doc10["training"]["tp"]["losses"] = {HOSTILE: [1.0, 0.5]}
    page10 = report.write_report(doc10, tmp_path / "hostile10.html")
    for page in (tmp_path / "hostile.html", page10):
        dom = Dom(dump_dom(chromium, page))
        assert injected(dom) == [], page
        assert dom.text.count(HOSTILE) >= 4 and "</title><script>alert(1)</script>" in dom.text, page
        assert "{{ 7*7 }}" in dom.text and " 49 " not in dom.text
        raw = page.read_text()
        assert "<script" not in raw and "<img" not in raw and "\x1b" not in raw and "\u202e" not in raw
    assert "\\x1b[31m\\u202e" in Dom(dump_dom(chromium, tmp_path / "hostile.html")).text  # shown escaped


def test_markup_planted_in_a_page_is_found_twin(chromium, tmp_path):
    """The twins of the inertness and offline checks: the same strings pasted raw are
    elements; a stylesheet, a font and an image from elsewhere are found."""
    page = tmp_path / "raw.html"
    page.write_text(f"<!DOCTYPE html><html><head><link rel=stylesheet href='https://cdn.example/x.css'>"
                    f"<style>@font-face {{src: url(https://f.example/a.woff)}}</style></head>"
                    f"<body><p>{HOSTILE}</p></body></html>")
    dom = Dom(dump_dom(chromium, page))
    assert injected(dom) == ["script", "img", "img[onerror]"]
    assert external(dom, page.read_text()) == ["link[href=https://cdn.example/x.css]", "img[src=x]",
                                                "url(https://f.example/a.woff)"]
