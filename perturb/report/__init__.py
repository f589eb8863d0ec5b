"""Robustness reports from scores.json: report.md and a self-contained report.html."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perturb.report.content import build_sections
from perturb.report.html import render_html
from perturb.report.markdown import render_markdown

__all__ = ["render_html", "render_markdown", "write_reports"]


def write_reports(scores: Mapping[str, Any] | str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md and report.html for ``scores`` (a dict or a scores.json path)."""
    if not isinstance(scores, Mapping):
        scores = json.loads(Path(scores).read_text(encoding="utf-8"))
    assert isinstance(scores, Mapping)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = build_sections(scores)
    md = out / "report.md"
    md.write_text(render_markdown(scores, sections), encoding="utf-8")
    page = out / "report.html"
    page.write_text(render_html(scores, sections), encoding="utf-8")
    return {"markdown": md, "html": page}
