"""report.md: the report's tables as GitHub-flavoured Markdown (model text escaped)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from perturb.report.content import build_sections
from perturb.report.document import Section, Table

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#])")


def md_escape(text: str) -> str:
    """Escape Markdown / inline-HTML specials and flatten newlines (safe in a table cell)."""
    text = text.replace("&", "&amp;")
    text = _MD_SPECIAL.sub(
        lambda m: {"<": "&lt;", ">": "&gt;"}.get(m.group(1), "\\" + m.group(1)), text
    )
    return " ".join(text.split())


def _table(t: Table) -> list[str]:
    lines = []
    if t.caption:
        lines += [f"*{md_escape(t.caption)}*", ""]
    lines.append("| " + " | ".join(md_escape(h) for h in t.header) + " |")
    lines.append("|" + "---|" * len(t.header))
    for r in t.rows:
        lines.append("| " + " | ".join(md_escape(c) for c in r) + " |")
    if not t.rows:
        lines.append("| " + " | ".join("-" for _ in t.header) + " |")
    return [*lines, ""]


def render_markdown(scores: Mapping[str, Any], sections: list[Section] | None = None) -> str:
    """The Markdown report of a scores.json dict."""
    sections = sections if sections is not None else build_sections(scores)
    lines = [
        "# Robustness report",
        "",
        f"perturb {md_escape(str(scores['versions'].get('perturb')))}, scored {md_escape(str(scores.get('timestamp')))}. "
        "Plots and thumbnails: report.html.",
        "",
    ]
    for s in sections:
        lines += ["#" * s.level + " " + md_escape(s.title), ""]
        for p in s.paragraphs:
            lines += [md_escape(p), ""]
        for t in s.tables:
            lines += _table(t)
        if s.flip_header:
            lines += _table(Table(s.flip_header, [f.cells for f in s.flips]))
    return "\n".join(lines).rstrip() + "\n"
