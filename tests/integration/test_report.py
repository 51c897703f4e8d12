"""The HTML report of a certificate (builder/certify/report.py) in a real browser: Debian's
headless Chromium takes a screenshot (a real image of the size asked, not blank, with the
plots' line colours in it) and dumps the DOM (the verdict, the stack and each collective's name
in its text). Certificates of today's shape (all-reduce sweep, DDP), of issue 10's (six
collectives, one unsupported; training checks against the reference; scaling) and of a real
``--profile all`` run are drawn; at 1400x900 the passing ``--profile all`` report and a failing
one show the verdict, the first failure, the failing node's log line and the key figures
without scrolling (screenshots kept under the test's tmp folder); hostile strings stay text;
the page loads nothing from elsewhere. The checks' twins: a blank page, a page without plots,
a page whose verdict is pushed below the fold, markup pasted raw. (Without a browser:
tests/unit/test_report_units.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from builder.certify import report

from fixtures_browser import Dom, above_the_fold, drawn, dump_dom, picture, screenshot
from fixtures_report import (
    FAILURES,
    HOSTILE,
    ROOT,
    external,
    failing_certificate,
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
    assert pic["C0"] > 20 and pic["C1"] == 0, pic  # one line: busbw = algbw for all-reduce at world 2
    text = dom.text
    assert "verdict: PASSED (exit code 0)" in text
    assert "torch 2.13.0+cpu 2.13.0+cpu" in text and "Python 3.11.2 3.11" in text
    assert "OS Debian GNU/Linux 12 (bookworm) debian 12" in text and "CUDA - (not recorded)" in text
    assert "reference: the image's recipe lock" in text
    assert "all_reduce pass : 0 wrong element(s) in 3 measurement(s); best busbw 0.05 GB/s at 8B float32 " in text
    assert ("3 measurement(s) size (B) count type time (us) algbw (GB/s) busbw (GB/s) #wrong wrong on ranks "
            "8 2 float32 101.00 0.05 0.05 0 1024 256 float32 ") in text, text
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
    assert "all_reduce pass : 0 wrong element(s) in 8 measurement(s); best busbw " in text
    for name in ("ddp", "fsdp", "pipeline"):
        assert f" {name} pass " in text and f" {name}: pass " in text, name
    assert " tp FAIL mlp 4 2.12 / 1.8 1e-07 rtol 1e-05, atol 1e-06 120.0 1.50 - " in text
    assert " moe unsupported needs numpy " in text and " moe: unsupported unsupported: needs numpy " in text
    assert " pipeline pass mlp 4 1.8 / 1.8 1e-07 rtol 1e-05, atol 1e-06 120.0 1.50 schedule ScheduleGPipe, stages 2 " in text
    assert (" training checks 3 of 4 match, 1 unsupported within tolerance of the single-process reference FAIL "
            "scaling efficiency at 2 ranks 0.930 (93.0 %) not gated (no --min-scaling-efficiency) not gated ") in text
    assert " throughput at 2 ranks 93.00 images/s (1.100 s); ideal 100.00 " in text
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
        assert f" {name} pass " in text and f" {name}: pass " in text, name
    assert " scaling not gated : efficiency 0.283 (28.3 %) , threshold not gated (no --min-scaling-efficiency) " in text
    assert sum(1 for t, _ in dom.tags if t == "svg") == 11 and injected(dom) == []  # 6 collectives, 5 losses


#: The window a reader opens a report in (CSS pixels), and what its first screen must show.
WINDOW = (1400, 900)
FOLD = ["#verdict", "#failures li"]


def _first_screen(chromium, html: Path, tmp_path: Path) -> tuple[dict, dict]:
    """The screenshot (kept as ``<name>-1400x900.png`` in the test's tmp folder) and the
    measured first screen (:func:`above_the_fold`) of a report at :data:`WINDOW`."""
    pic = picture(screenshot(chromium, html, tmp_path / f"{html.stem}-1400x900.png", *WINDOW))
    return pic, above_the_fold(chromium, html, *WINDOW, FOLD)


def test_a_passing_profile_all_report_fits_its_summary_on_the_first_screen(chromium, tmp_path):
    """The real ``--profile all`` certificate at 1400x900: the green verdict, every key figure
    against its threshold, the stack against the lock and the contents, without scrolling."""
    html = report.write_report(profiles_certificate(), tmp_path / "profile-all.html", source="profile-all.json")
    pic, fold = _first_screen(chromium, html, tmp_path)
    assert pic["size"] == WINDOW and drawn(pic) and pic["green"] > 1000 and pic["red"] == 0, pic
    box = fold["boxes"]
    assert list(box) == ["#verdict"] and box["#verdict"]["text"] == "verdict: PASSED (exit code 0)", box
    assert box["#verdict"]["bottom"] <= 150, box
    seen = fold["visible"]
    for line in ("verdict: PASSED (exit code 0)", "ranks reported 2 of 2 every rank pass",
                 "stack no difference every rank as the reference pass",
                 "wrong elements 0 in 24 measurement(s) of 6 collective(s) 0 pass",
                 "all-reduce busbw at 1MB, float32 0.735 GB/s not gated (no --min-busbw) not gated",
                 "training checks 5 of 5 match within tolerance of the single-process reference pass",
                 "scaling efficiency at 2 ranks 0.283 (28.3 %) not gated (no --min-scaling-efficiency) not gated",
                 "torch 2.13.0+cpu 2.13.0+cpu", "reference: the image's recipe lock",
                 "collectives : all_reduce , all_gather , reduce_scatter , broadcast , all_to_all , send_recv",
                 "training : ddp , fsdp , tp , pipeline , moe scaling"):
        assert line in seen, (line, seen)


def test_a_failing_report_shows_the_verdict_and_first_failure_on_the_first_screen(chromium, tmp_path):
    """A failing ``--profile all`` certificate at 1400x900: the red verdict, every failure (the
    first one first), the failing node's error line from its log and the failed key figures,
    without scrolling; its 12 warnings are one closed line below them."""
    html = report.write_report(failing_certificate(), tmp_path / "failing.html", source="failing.json")
    pic, fold = _first_screen(chromium, html, tmp_path)
    assert pic["size"] == WINDOW and drawn(pic) and pic["red"] > 1000 and pic["green"] < 200, pic
    box = fold["boxes"]
    assert box["#verdict"]["text"] == "verdict: FAILED (exit code 2)" and box["#verdict"]["bottom"] <= 150, box
    assert box["#failures li"]["text"] == FAILURES[0] and box["#failures li"]["bottom"] <= 200, box
    seen = fold["visible"]
    for line in ("verdict: FAILED (exit code 2)", *FAILURES,
                 "node 1 (node-1) exited with 1 ; its log: [rank1]: RuntimeError: fsdp: shard 3 of 4 lost its gradient",
                 "ranks reported 1 of 2 every rank FAIL", "wrong elements 2 in 24 measurement(s) of 6 collective(s) 0 FAIL",
                 "all-reduce busbw at 1MB, float32 0.735 GB/s >= 5 GB/s (argument) FAIL",
                 "training checks 4 of 5 match within tolerance of the single-process reference FAIL",
                 "scaling efficiency at 2 ranks 0.283 (28.3 %) >= 0.5 FAIL", "12 warning(s)"):
        assert line in seen, (line, seen)
    assert "container 0 still stopping" not in seen  # the warnings stay folded


def test_a_verdict_pushed_below_the_fold_fails_the_first_screen_checks_twin(chromium, tmp_path):
    """The twin: the same failing page with 1000 px of blank above its verdict shows a blank
    first screen, and the verdict and first failure are measured below the fold."""
    page = report.write_report(failing_certificate(), tmp_path / "pushed.html")
    page.write_text(page.read_text().replace("<body>", '<body><div style="height: 1000px"></div>', 1))
    pic, fold = _first_screen(chromium, page, tmp_path)
    assert pic["size"] == WINDOW and not drawn(pic) and pic["red"] == 0, pic
    assert fold["boxes"]["#verdict"]["top"] > WINDOW[1] and fold["boxes"]["#failures li"]["top"] > WINDOW[1]
    assert "verdict" not in fold["visible"] and FAILURES[0] not in fold["visible"], fold["visible"]


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
    doc10["training"]["tp"].update(model=HOSTILE, tolerance={"rtol": 1e-5, "rule": HOSTILE})
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
