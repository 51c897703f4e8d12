"""The HTML report of a certificate (builder/certify/report.py; issue 10, item 5), opened in a
real browser: Debian's headless Chromium takes a screenshot (a real image of the size asked,
not blank, with the plots' line colours in it) and dumps the DOM (the verdict, the stack and
each collective's name in its text). Certificates of today's shape (all-reduce sweep, DDP)
and of issue 10's (six collectives, one unsupported; training checks against the reference;
scaling) are drawn; hostile strings stay text; the certification run writes the report next
to the certificate, and a report that cannot be written costs one warning, not the
certificate; ``envbuild report`` draws one again from a file read bounded and checked."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.console import Console
from test_certify_units import CPU_LOCK, FakeClient, FakeLauncher, _cert, _labels, rank_doc

from builder.certify import report
from builder.certify.model import load_certificate

from certify_helpers import certify_image
from fixtures_browser import Dom, dump_dom, screenshot

ROOT = Path(__file__).resolve().parent.parent
#: matplotlib's first two colours: algbw and busbw of the first data type.
C0, C1 = (31, 119, 180), (255, 127, 14)
#: Markup that must stay text wherever a certificate string lands.
HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">{{ 7*7 }}$x^2$'


def _row(size, dtype="float32", factor=1.0, wrong=0):
    alg = size / 1e9 / (1e-5 + size / 2e9)
    return {"size_bytes": size, "count": size // 4, "type": dtype, "redop": "sum", "time_us": 10.0 + size / 2e3,
            "rank_time_us": [10.0, 10.0], "algbw_gbps": alg, "busbw_gbps": alg * factor, "wrong": wrong,
            "wrong_by_rank": [wrong, 0]}


def issue10_doc(cert=None):
    """Today's certificate plus the sections of issue 10 (item 3), as w-i10a writes them."""
    doc = copy.deepcopy(cert or _cert())
    sizes = [1024, 65536, 1 << 20, 4 << 20]
    doc["collectives"] = {
        "all_reduce": [_row(s) for s in sizes] + [_row(s, "bfloat16") for s in sizes],
        "all_gather": [_row(s, factor=0.5) for s in sizes], "reduce_scatter": [_row(s, factor=0.5) for s in sizes],
        "broadcast": [_row(s) for s in sizes], "all_to_all": [_row(s, factor=0.5) for s in sizes],
        "send_recv": {"unsupported": "gloo has no batched isend/irecv ring in this torch"},
    }

    def check(**kw):
        base = {"unsupported": None, "needs_numpy": False, "reference_match": True, "losses_match": True,
                "params_match": True, "tolerance": {"rtol": 1e-5, "atol": 1e-6, "rule": "float32 sums"},
                "losses": [2.30, 2.10, 1.95, 1.80], "reference_losses": [2.30, 2.10, 1.95, 1.80],
                "max_param_diff": 1e-7, "samples_per_s": 120.0, "wall_s": 1.5, "steps": 4, "model": "mlp"}
        return {**base, **kw}

    doc["training"] = {"ddp": check(model="resnet18"), "fsdp": check(),
                       "pipeline": check(schedule="ScheduleGPipe", stages=2),
                       "tp": check(reference_match=False, losses=[2.30, 2.20, 2.15, 2.12]),
                       "moe": {"unsupported": "needs numpy", "needs_numpy": True}}
    doc["scaling"] = {"model": "resnet18", "batch_per_rank": 8, "image_size": 64, "steps": 3, "world_size": 2,
                      "throughput_1": 50.0, "throughput_n": 93.0, "time_1_s": 1.0, "time_n_s": 1.1,
                      "efficiency": 0.93}
    doc["stack"] = {"source": "probe", "recipe": None, "reference_rank": 0, "python": "3.11.2",
                    "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "glibc": "2.36",
                    "os": "Debian GNU/Linux 12 (bookworm)"}
    return doc


def injected(dom: Dom) -> list[str]:
    """What in a page is markup a certificate string could have planted: script, img,
    iframe, object or embed elements, event-handler attributes, javascript: URLs."""
    found = [t for t, _ in dom.tags if t in ("script", "img", "iframe", "object", "embed")]
    for tag, attrs in dom.tags:
        found += [f"{tag}[{k}]" for k, v in attrs.items()
                  if k.startswith("on") or "javascript:" in (v or "").lower()]
    return found


def external(dom: Dom, raw: str) -> list[str]:
    """What a page would load from elsewhere: src/href/srcset/action/data attributes that are
    not in-page fragments (``#id``), and CSS ``@import``/``url(...)``."""
    loads = ("src", "href", "xlink:href", "srcset", "action", "data", "poster")
    found = [f"{tag}[{k}={v}]" for tag, attrs in dom.tags for k, v in attrs.items()
             if k in loads and not (v or "").startswith("#")]
    return found + re.findall(r"@import|url\((?!#)[^)]*\)", raw)


def picture(png: Path) -> dict:
    """Format, size, distinct colours, inked share (darker than light grey) and the pixels of
    each plot colour of a screenshot."""
    with Image.open(png) as img:
        fmt, rgb = img.format, np.asarray(img.convert("RGB")).astype(int)
    flat = rgb.reshape(-1, 3)

    def near(c):
        return int((np.abs(flat - np.array(c)) <= 24).all(axis=1).sum())

    packed = (flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]
    return {"format": fmt, "size": (rgb.shape[1], rgb.shape[0]), "colours": len(np.unique(packed)),
            "inked": float((flat.sum(axis=1) < 600).mean()), "C0": near(C0), "C1": near(C1)}


def drawn(pic: dict) -> bool:
    """Whether a screenshot shows a drawn page: many colours and ink on 1 % of it or more."""
    return pic["format"] == "PNG" and pic["colours"] >= 50 and pic["inked"] >= 0.01


def _open(chromium, html: Path, tmp_path: Path, height: int) -> tuple[dict, Dom]:
    pic = picture(screenshot(chromium, html, tmp_path / f"{html.stem}.png", 1280, height))
    return pic, Dom(dump_dom(chromium, html))


def test_report_of_todays_certificate_in_chromium(chromium, tmp_path):
    html = report.write_report(_cert(), tmp_path / "cert.html", source="cert.json")
    pic, dom = _open(chromium, html, tmp_path, 1600)
    assert pic["size"] == (1280, 1600) and drawn(pic), pic
    assert pic["C0"] > 20 and pic["C1"] > 200, pic  # the algbw line, the busbw line dashed over it (world 2)
    text = dom.text
    assert "verdict: PASSED (exit code 0)" in text
    assert "torch 2.13.0+cpu 2.13.0+cpu" in text and "Python 3.11.2 3.11" in text
    assert "OS Debian GNU/Linux 12 (bookworm) debian 12" in text and "CUDA - -" in text
    assert "reference: the image's recipe lock" in text
    assert re.search(r"all_reduce .*size \(B\) count type time \(us\) algbw \(GB/s\) busbw \(GB/s\) #wrong "
                     r"8 2 float32 101\.00 0\.05 0\.05 0", text), text
    assert "ddp no per-step losses in this certificate model resnet18" in text
    assert "0 0 node-0 cpu yes 5.00 12.00 6.9" in text and "1 1 node-1 cpu yes 5.00 13.00 6.9" in text
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
    doc = json.loads((ROOT / "tests/fixtures/certificate-profiles.json").read_text())
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
    doc = _cert()
    doc["allreduce"] = []
    pic, _ = _open(chromium, report.write_report(doc, tmp_path / "noplot.html"), tmp_path, 1600)
    assert drawn(pic) and pic["C0"] == 0 and pic["C1"] == 0, pic


def _hostile_cert() -> dict:
    doc = _cert()
    doc["image"]["ref"] = HOSTILE
    doc["run_id"] = "</title><script>alert(1)</script>"
    doc["ranks"]["0"]["hostname"] = HOSTILE
    doc["ranks"]["1"]["errors"] = [HOSTILE]
    doc["verdict"]["warnings"] = [HOSTILE + "\x1b[31m\u202e"]
    doc["probe"]["0"]["os"]["pretty_name"] = HOSTILE
    doc["allreduce"][0]["type"] = HOSTILE[:200]
    doc["ddp"]["model"] = HOSTILE
    return doc


def test_hostile_strings_stay_text_in_chromium(chromium, tmp_path):
    cert = tmp_path / "hostile.json"
    cert.write_text(json.dumps(_hostile_cert()))
    res = subprocess.run([sys.executable, "-m", "builder.cli", "report", str(cert)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, f"report: {tmp_path}/hostile.html\n", "")
    doc10 = issue10_doc(_hostile_cert())
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


def test_the_certification_run_writes_the_report_beside_the_certificate(tmp_path):
    buf = io.StringIO()
    cert, path = certify_image(FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=tmp_path, run_id="r1",
                               launcher=FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="r1")]),
                               console=Console(file=buf, width=400), ddp_steps=3)
    html = report.report_path(path)
    assert html == path.with_suffix(".html") and html.is_file()
    assert "warning" not in buf.getvalue()
    page = html.read_text()
    assert "verdict: PASSED (exit code 0)" in page and "<td class=\"mono\">r1</td>" in page and "<svg" in page
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, html.name])  # no temporary file left


@pytest.fixture
def small_disk(tmp_path):
    """A 16 KiB tmpfs (root only): room for a certificate (~5 KiB), not for its report (~45 KiB)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_report_that_cannot_be_written_keeps_the_certificate(small_disk):
    buf = io.StringIO()
    cert, path = certify_image(FakeClient(_labels(CPU_LOCK)), "img:1", images_dir=small_disk, run_id="r1",
                               launcher=FakeLauncher([rank_doc(0, run_id="r1"), rank_doc(1, run_id="r1")]),
                               console=Console(file=buf, width=10_000), ddp_steps=3)
    assert cert["verdict"]["passed"] and load_certificate(json.loads(path.read_text())).run_id == "r1"
    lines = [line for line in buf.getvalue().splitlines() if "warning" in line]
    html = path.with_suffix(".html")
    assert lines == [f"warning: report not written: {html}: No space left on device (the certificate {path} is kept)"]
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no report, no temporary file


def _report_cli(*args: str) -> tuple[int, str, str]:
    res = subprocess.run([sys.executable, "-m", "builder.cli", "report", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    return res.returncode, res.stdout, res.stderr


def test_report_command_draws_again_and_refuses_bad_certificates(tmp_path):
    cert = tmp_path / "c.json"
    cert.write_text(json.dumps(_cert()))
    assert _report_cli(str(cert), "--out", str(tmp_path / "o.html")) == (0, f"report: {tmp_path}/o.html\n", "")
    assert "verdict: PASSED" in (tmp_path / "o.html").read_text()
    failing = _cert()
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
    bad = _cert()
    bad["world_size"] = "\x1b[2Jtwo"
    cert.write_text(json.dumps(bad))
    assert _report_cli(str(cert), "--out", str(tmp_path / "bad.html")) == (
        2, "", f"error: {cert}: world_size: '\\x1b[2Jtwo' Expected `int`, got `str`\n")
    assert not (tmp_path / "bad.html").exists()
    cert.write_text(json.dumps(_cert()))
    assert _report_cli(str(cert), "--out", str(tmp_path / "no" / "x.html")) == (
        3, "", f"error: {tmp_path}/no/x.html: cannot write the report: No such file or directory\n")


def test_writing_replaces_a_report_atomically(tmp_path):
    """A report drawn again replaces the old one whole (os.replace of a complete temporary file)."""
    target = tmp_path / "r.html"
    target.write_text("old")
    report.write_report(_cert(), target)
    assert target.read_text().startswith("<!DOCTYPE html>") and target.read_text().rstrip().endswith("</html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_work_is_bounded_on_a_huge_certificate():
    """100 000 sizes and 10 000 ranks: at most MAX_ROWS rows and MAX_RANKS ranks shown."""
    doc = _cert()
    doc["allreduce"] = [_row(8 + i) for i in range(100_000)]
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


def test_generated_hostile_certificates_draw_and_stay_inert():
    """Seeded: 16 certificates (12 of today's shape, 4 of issue 10's) with 12 leaves each
    replaced by a hostile value of any type (also where a number or a list is due:
    render_html gets the raw JSON data; the CLI checks it against the model first). Each is
    drawn without a warning, and nothing in it is markup."""
    import random
    import warnings

    rng = random.Random(20261201)
    bases = [_cert(), issue10_doc()]
    for n in range(16):
        doc = copy.deepcopy(bases[int(n % 4 == 1)])
        leaves = list(_leaves(doc))
        for path, _ in rng.sample(leaves, 12):
            _set(doc, path, copy.deepcopy(rng.choice(HOSTILE_VALUES)))
        if n % 3 == 0:  # a hostile key as well
            doc["collectives" if "collectives" in doc else "probe"][rng.choice(HOSTILE_VALUES[:7])] = \
                rng.choice(HOSTILE_VALUES)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. numpy's overflow of a 1e308 bandwidth on a log axis
            page = report.render_html(doc)
        dom = Dom(page)
        assert injected(dom) == [] and "<script" not in page and "\x1b" not in page, n
        assert page.rstrip().endswith("</html>") and "verdict: " in dom.text, n


def test_values_out_of_any_plot_range_stay_in_the_table_only():
    """A 1e308 GB/s bandwidth, a 1e308-byte size and a 1e308 loss are left out of the plots
    (no overflow in matplotlib's tick and log-axis arithmetic: warnings are errors here) and
    still shown in the table."""
    import warnings

    doc = issue10_doc()
    doc["collectives"]["broadcast"][0]["busbw_gbps"] = 1e308
    doc["collectives"]["broadcast"][1]["size_bytes"] = 1e308
    doc["training"]["ddp"]["losses"][1] = 1e308
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = Dom(report.render_html(doc)).text
    assert text.count(" 1e+308 ") == 2  # the size and the busbw, in the broadcast table
