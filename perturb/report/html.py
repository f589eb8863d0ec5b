"""report.html: one self-contained page (inline CSS, inline PNG/JPEG, no script, no network).

A Content-Security-Policy meta tag forbids every fetch except ``data:`` images, and all text
from the inputs (questions, answers, file names) is HTML-escaped, so a prediction containing
``<script>`` or ``</table>`` shows as text.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perturb.report.content import build_sections
from perturb.report.document import Section, Table
from perturb.report.plots import render_plot

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;
padding:0 1rem;color:#1b1b1b;line-height:1.4}
table{border-collapse:collapse;margin:0.6rem 0 1.2rem;font-size:0.85rem;display:block;
max-width:100%;overflow-x:auto}
th,td{border:1px solid #ccc;padding:0.25rem 0.5rem;text-align:left;vertical-align:top}
th{background:#f2f4f7}
caption{caption-side:top;text-align:left;font-style:italic;padding-bottom:0.2rem}
td.text{max-width:22rem;white-space:pre-wrap;word-break:break-word}
figure{margin:0.5rem 0 1.5rem}
img.plot{max-width:100%;border:1px solid #eee}
img.thumb{width:128px;height:auto;display:block}
nav ul{columns:2;font-size:0.9rem}
p.problem{color:#a00}
p.warning{background:#fff4e5;border-left:4px solid #e67e22;padding:0.3rem 0.6rem}
p.takeaway{font-size:1.15rem;font-weight:600}
p.tested{font-size:1.05rem}
div.pair{display:flex;gap:4px}
span.noimg{display:inline-block;width:128px;font-size:0.75rem;color:#777}
section#glance{border:1px solid #ddd;border-radius:6px;padding:0.2rem 1rem;background:#fafbfc}
"""


def esc(text: Any) -> str:
    """HTML-escape any value's text."""
    return html.escape(str(text), quote=True)


def _table(t: Table, text_cols: set[int] | None = None) -> str:
    text_cols = text_cols or set()
    parts = [f'<table id="{esc(t.id)}">' if t.id else "<table>"]
    if t.caption:
        parts.append(f"<caption>{esc(t.caption)}</caption>")
    parts.append(
        "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in t.header) + "</tr></thead><tbody>"
    )
    for r in t.rows:
        parts.append(
            "<tr>"
            + "".join(
                f'<td class="text">{esc(c)}</td>' if i in text_cols else f"<td>{esc(c)}</td>"
                for i, c in enumerate(r)
            )
            + "</tr>"
        )
    parts.append("</tbody></table>")
    return "".join(parts)


def thumbnail(path: str | None, size: int = 160) -> str | None:
    """Base64 JPEG thumbnail of an image file, or None if it cannot be read."""
    if not path:
        return None
    file = Path(path)
    if not file.is_file():
        return None
    try:
        from PIL import Image

        with Image.open(file) as src:
            image = src.convert("RGB")
            image.thumbnail((size, size))
            buf = io.BytesIO()
            image.save(buf, format="JPEG", quality=80)
    except Exception:
        return None
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(b64: str | None, alt: str, missing: str) -> str:
    if b64 is None:
        return f'<span class="noimg">{esc(missing)}</span>'
    return f'<img class="thumb" alt="{esc(alt)}" src="data:image/jpeg;base64,{b64}">'


NO_CLEAN = "clean image not found: pass --dataset, or score where the clean paths resolve"
NO_PERT = "perturbed image not found: pass --manifest with the generated split"


def _flips(section: Section, thumbs: bool) -> str:
    """The flip gallery: clean and perturbed image side by side, then the row's text."""
    with_imgs = thumbs and any(flip.image_clean or flip.image_perturbed for flip in section.flips)
    header = (["clean | perturbed image"] if with_imgs else []) + list(section.flip_header)
    parts = [
        f'<table id="{esc(section.id)}-table" class="flips"><thead><tr>'
        + "".join(f"<th>{esc(h)}</th>" for h in header)
        + "</tr></thead><tbody>"
    ]
    for flip in section.flips:
        row = ""
        if with_imgs:
            row += (
                '<td class="pair"><div class="pair">'
                f"{_img(thumbnail(flip.image_clean), 'clean image', NO_CLEAN)}"
                f"{_img(thumbnail(flip.image_perturbed), 'perturbed image', NO_PERT)}"
                "</div></td>"
            )
        row += "".join(f'<td class="text">{esc(c)}</td>' for c in flip.cells)
        parts.append(f"<tr>{row}</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


def render_html(
    scores: Mapping[str, Any], sections: list[Section] | None = None, thumbs: bool = True
) -> str:
    """The self-contained HTML report of a scores.json dict."""
    sections = sections if sections is not None else build_sections(scores)
    body = [
        "<h1>Robustness report</h1>",
        f"<p>perturb {esc(scores['versions'].get('perturb'))}, scored {esc(scores.get('timestamp'))}; "
        f"primary metric <b>{esc(scores['config']['primary'])}</b>.</p>",
    ]
    nav = (
        "<nav><ul>"
        + "".join(
            f'<li><a href="#{esc(section.id)}">{esc(section.title)}</a></li>'
            for section in sections
        )
        + "</ul></nav>"
    )
    for index, section in enumerate(sections):
        if index == 1 or (index == 0 and section.id != "glance"):
            body.append(nav)
        level = min(max(section.level, 2), 4)
        body.append(f'<section id="{esc(section.id)}"><h{level}>{esc(section.title)}</h{level}>')
        for paragraph in section.paragraphs:
            kind = next(
                (
                    c
                    for pre, c in (
                        ("Problem:", "problem"),
                        ("Warning:", "warning"),
                        ("Takeaway:", "takeaway"),
                        ("Tested:", "tested"),
                    )
                    if paragraph.startswith(pre)
                ),
                None,
            )
            class_attr = f' class="{kind}"' if kind else ""
            body.append(f"<p{class_attr}>{esc(paragraph)}</p>")
        for table in section.tables:
            drops_text = {len(table.header) - 1} if table.id == "drops" else None
            body.append(_table(table, text_cols=drops_text))
        for plot_id in section.plots:
            png = render_plot(plot_id, scores)
            if png is None:
                continue
            b64 = base64.b64encode(png).decode("ascii")
            body.append(
                f'<figure class="plot" data-plot="{esc(plot_id)}"><img class="plot" alt="{esc(plot_id)}" '
                f'src="data:image/png;base64,{b64}"></figure>'
            )
        if section.flip_header and section.flips:
            body.append(_flips(section, thumbs))
        body.append("</section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>perturb robustness report</title><style>{STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
