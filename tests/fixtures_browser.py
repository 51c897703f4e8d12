"""A real browser for the tests: Debian's headless Chromium (package ``chromium``), installed
with apt when absent (as the suite installs its other parts: :func:`fixtures_nodes.ensure_apt`;
``scripts/setup.sh --test`` installs it too).

:func:`screenshot` and :func:`dump_dom` run ``chromium --headless --no-sandbox`` on a local
file, each with its own throw-away profile folder (runs in parallel do not share one) and a
timeout; the page may load nothing from the network (the reports load nothing).
:class:`Dom` parses a dumped DOM into its elements and its text; :func:`above_the_fold` measures
where elements lie and which text a window shows without scrolling.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fixtures_nodes import ensure_apt

#: matplotlib's first two colours: algbw and busbw of the first data type.
C0, C1 = (31, 119, 180), (255, 127, 14)
#: The verdict box's borders (builder/certify/templates/report.html.j2): failed, passed.
VERDICT_RED, VERDICT_GREEN = (207, 34, 46), (45, 164, 78)
#: Seconds one headless Chromium run may take.
CHROMIUM_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's chromium (``apt-get install chromium`` first when absent)."""
    return shutil.which("chromium") or ensure_apt("chromium", "chromium")


def _chromium(exe: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="envbuild-chromium-") as profile:
        argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S)


def screenshot(exe: str, page: Path, out: Path, width: int, height: int) -> Path:
    """A PNG screenshot of the local file ``page`` at ``width`` x ``height`` CSS pixels."""
    res = _chromium(exe, f"--window-size={width},{height}", f"--screenshot={out}", page.resolve().as_uri())
    assert res.returncode == 0 and out.is_file(), res.stderr[-2000:]
    return out


def dump_dom(exe: str, page: Path) -> str:
    """The DOM of the local file ``page`` after it loaded, as Chromium serializes it."""
    res = _chromium(exe, "--dump-dom", page.resolve().as_uri())
    assert res.returncode == 0 and "<html" in res.stdout, res.stderr[-2000:]
    return res.stdout


#: The check a test copy of a page runs (a report itself holds no script): the box and text of the
#: first element of each selector, and every text node wholly within the first ``fold`` CSS pixels
#: of the page and shown (not in a closed ``<details>``), as JSON in ``<pre id="envbuild-fold">``.
_FOLD_SCRIPT = """<script>
(() => { const fold = %d, out = {boxes: {}, visible: []};
  for (const sel of %s) { const e = document.querySelector(sel);
    if (e) { const r = e.getBoundingClientRect(); out.boxes[sel] = {top: r.top, bottom: r.bottom, text: e.innerText}; } }
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT), range = document.createRange();
  for (let n; (n = walk.nextNode());) { range.selectNodeContents(n); const r = range.getBoundingClientRect();
    if (r.height > 0 && r.top >= 0 && r.bottom <= fold && n.textContent.trim()
        && n.parentElement.checkVisibility({visibilityProperty: true})) out.visible.push(n.textContent); }
  const p = document.createElement("pre"); p.id = "envbuild-fold"; p.textContent = JSON.stringify(out);
  document.body.appendChild(p); })();
</script>"""


def above_the_fold(exe: str, page: Path, width: int, height: int, selectors: list[str]) -> dict:
    """What a ``width`` x ``height`` window shows of ``page`` without scrolling: ``boxes`` (top,
    bottom in CSS pixels from the page's top, and text of the first element of each selector found)
    and ``visible`` (the text wholly above ``height``, whitespace collapsed). Measured on a copy
    of the page (beside it) without its Content-Security-Policy and with :data:`_FOLD_SCRIPT`."""
    probe = page.with_name(f"{page.stem}-fold.html")
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probe.write_text(text.replace("</body>", _FOLD_SCRIPT % (height, json.dumps(selectors)) + "</body>"))
    res = _chromium(exe, f"--window-size={width},{height}", "--dump-dom", probe.resolve().as_uri())
    found = re.search(r'<pre id="envbuild-fold">(.*?)</pre>', res.stdout, re.S)
    assert res.returncode == 0 and found, res.stderr[-2000:]
    out = json.loads(html.unescape(found.group(1)))
    return {**out, "visible": re.sub(r"\s+", " ", " ".join(out["visible"])).strip()}


class Dom(HTMLParser):
    """The elements (tag, attributes) and the text of a serialized DOM."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.parts: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.parts.append(data)

    @property
    def text(self) -> str:
        return re.sub(r"\s+", " ", " ".join(self.parts))


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
            "inked": float((flat.sum(axis=1) < 600).mean()), "C0": near(C0), "C1": near(C1),
            "red": near(VERDICT_RED), "green": near(VERDICT_GREEN)}


def drawn(pic: dict) -> bool:
    """Whether a screenshot shows a drawn page: many colours and ink on 1 % of it or more."""
    return pic["format"] == "PNG" and pic["colours"] >= 50 and pic["inked"] >= 0.01
