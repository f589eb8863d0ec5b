"""report.html in headless Chromium: no console errors, headline table and every plot shown.

Needs Debian's ``chromium`` package (``apt-get install chromium``; CI installs it). Two loads:
the page as written (console must stay silent: any CSP violation, failed load or script would
log), and a copy with a nonce-allowed checker script that records, after ``load``, whether every
``<img>`` decoded (``complete`` and ``naturalWidth > 0``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package 'chromium'; CI installs it)"),
]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
]


def _load(page: Path) -> tuple[str, list[str]]:
    """(DOM after load, console messages) of ``page``."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],  # type: ignore[list-item]
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.rows_in: dict[str, int] = {}
        self._table: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table.append(a.get("id") or "")
        if tag == "tr" and self._table:
            self.rows_in[self._table[-1]] = self.rows_in.get(self._table[-1], 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._table:
            self._table.pop()


def test_report_renders_in_chromium(hostile_run: dict[str, Any], tmp_path: Path) -> None:
    page = hostile_run["dir"] / "report.html"
    source = page.read_text()
    dom, console = _load(page)
    assert console == [], console
    d = _Dom()
    d.feed(dom)
    tables = {a.get("id"): a for t, a in d.tags if t == "table"}
    assert "headline-table-0" in tables
    scores = hostile_run["scores"]
    n_perts = len(scores["models"]["model"]["by_perturbation"])
    model = scores["models"]["model"]
    pooled = sum(
        model.get(k) is not None for k in ("overall", "overall_all_pairs", "overall_label_safe")
    )
    # header, the pooled rows (headline, all pairs, label-safe), one per perturbation
    assert d.rows_in["headline-table-0"] == 1 + pooled + n_perts
    flips = scores["models"]["model"]["flips"]
    assert d.rows_in["flips-0-table"] == 1 + len(flips)  # hostile '</table>' text did not split it
    assert not any(t == "script" for t, _ in d.tags)
    plots_in_source = len(re.findall(r'<img class="plot"', source))
    plots = [a for t, a in d.tags if t == "img" and a.get("class") == "plot"]
    assert len(plots) == plots_in_source == 4
    # every image decodes: reload a copy whose CSP admits one nonce'd checker script
    checker = (
        "<script nonce=\"t3st\">window.addEventListener('load',()=>{const r=[...document.images]"
        ".map(i=>i.complete&&i.naturalWidth>0);document.body.setAttribute('data-imgs',JSON.stringify(r));});</script>"
    )
    probe = tmp_path / "probe.html"
    probe.write_text(
        source.replace(
            "default-src 'none';", "default-src 'none'; script-src 'nonce-t3st';", 1
        ).replace("</body>", checker + "</body>", 1)
    )
    dom2, console2 = _load(probe)
    assert console2 == [], console2
    m = re.search(r'data-imgs="([^"]*)"', dom2)
    assert m, "checker did not run"
    loaded = json.loads(m.group(1).replace("&quot;", '"'))
    n_imgs = len(re.findall(r"<img ", source))
    assert len(loaded) == n_imgs and all(loaded), loaded


def test_console_errors_are_detected(tmp_path: Path) -> None:
    """The harness itself: a page that violates the CSP does log to the console."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
        '</head><body><img src="http://127.0.0.1:9/x.png"><script>console.error("x")</script></body></html>'
    )
    _, console = _load(bad)
    assert console, "expected console messages from a CSP-violating page"
