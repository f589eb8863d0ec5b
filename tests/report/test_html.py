"""report.html / report.md: escaping, self-containment, plots, thumbnails, determinism."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from PIL import Image

from perturb.report import render_html, render_markdown, write_reports


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.starts: list[tuple[str, dict[str, str | None]]] = []
        self.ends: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self.ends.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(html: str) -> _Tags:
    t = _Tags()
    t.feed(html)
    return t


def test_model_text_is_escaped_in_html(hostile_run: dict[str, Any]) -> None:
    html = (hostile_run["dir"] / "report.html").read_text()
    tags = _parse(html)
    names = [t for t, _ in tags.starts]
    assert "script" not in names and "<script" not in html.lower()
    assert names.count("table") == tags.ends.count("table")
    assert "<b>broken" not in html  # stayed text
    assert not any("onerror" in a for _, a in tags.starts)
    text = "".join(tags.text)
    assert '<script>alert("pwned")</script>' in text  # shown as text
    assert "</table><b>broken</b><table>" in text
    flips = [s for s in hostile_run["scores"]["models"]["model"]["flips"]]
    assert any("<script>" in f["prediction_perturbed"] for f in flips)


def test_page_is_self_contained(hostile_run: dict[str, Any]) -> None:
    html = (hostile_run["dir"] / "report.html").read_text()
    tags = _parse(html)
    metas = [
        a
        for t, a in tags.starts
        if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert (
        metas
        and "default-src 'none'" in (metas[0]["content"] or "")
        and "img-src data:" in (metas[0]["content"] or "")
    )
    for t, a in tags.starts:
        if t in ("img", "script", "iframe", "link", "source", "video", "audio", "object", "embed"):
            assert t == "img" and (a.get("src") or "").startswith("data:image/"), (t, a)
        href = a.get("href")
        assert href is None or href.startswith("#"), href
    assert "url(" not in html  # no CSS fetches


def test_every_plot_and_thumbnail_is_a_valid_image(hostile_run: dict[str, Any]) -> None:
    html = (hostile_run["dir"] / "report.html").read_text()
    imgs = [a for t, a in _parse(html).starts if t == "img"]
    plots = [a for a in imgs if a.get("class") == "plot"]
    thumbs = [a for a in imgs if a.get("class") == "thumb"]
    assert len(plots) == 4  # delta bars, heatmap, severity curves, class bars
    kinds = {(a.get("alt") or "").split(":")[0] for a in plots}
    assert {"delta_bars", "heatmap", "curves", "class_bars"} <= kinds
    assert len(thumbs) >= 2 and len(thumbs) % 2 == 0  # clean + perturbed per flip row
    for a in imgs:
        src = a["src"] or ""
        head, b64 = src.split(",", 1)
        im = Image.open(io.BytesIO(base64.b64decode(b64)))
        im.load()
        assert im.format == ("PNG" if "png" in head else "JPEG") and im.width > 10


def test_markdown_escapes_and_keeps_tables_intact(hostile_run: dict[str, Any]) -> None:
    md = (hostile_run["dir"] / "report.md").read_text()
    assert "<script" not in md and "&lt;script&gt;" in md and "</table>" not in md
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            header = lines[i - 1]
            width = len(re.findall(r"(?<!\\)\|", header))
            j = i + 1
            while j < len(lines) and lines[j].startswith("| "):
                assert len(re.findall(r"(?<!\\)\|", lines[j])) == width, lines[j]
                j += 1


def test_headline_numbers_appear_in_both_reports(hostile_run: dict[str, Any]) -> None:
    s = hostile_run["scores"]
    prim = s["config"]["primary"]
    d = s["models"]["model"]["overall"]["metrics"][prim]["delta"]
    shown = f"{100 * d['estimate']:+.1f} [{100 * d['ci'][0]:+.1f}, {100 * d['ci'][1]:+.1f}]"
    md = (hostile_run["dir"] / "report.md").read_text().replace("\\[", "[").replace("\\]", "]")
    assert shown in md
    assert shown in (hostile_run["dir"] / "report.html").read_text()


def test_rendering_is_deterministic_and_reloadable(
    hostile_run: dict[str, Any], tmp_path: Path
) -> None:
    s = hostile_run["scores"]
    assert render_html(s) == render_html(s)
    assert render_markdown(s) == render_markdown(s)
    files = write_reports(hostile_run["dir"] / "scores.json", tmp_path)  # from the JSON file alone
    assert files["html"].read_text() == (hostile_run["dir"] / "report.html").read_text()
