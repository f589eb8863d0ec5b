"""The report's document model (sections, tables, flips) and the number formatting shared by
every section: what the Markdown and HTML renderers draw, and what content and glance build."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ALL = "(all)"


@dataclass
class Table:
    """A table of plain-text cells (renderers escape them)."""

    header: list[str]
    rows: list[list[str]]
    id: str = ""
    caption: str = ""


@dataclass
class Flip:
    """One correct -> wrong example, with optional image paths for thumbnails."""

    cells: list[str]
    image_clean: str | None
    image_perturbed: str | None


@dataclass
class Section:
    """A titled block: paragraphs, tables, plot ids and flip examples."""

    title: str
    id: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    flips: list[Flip] = field(default_factory=list)
    flip_header: list[str] = field(default_factory=list)
    level: int = 2


def pct(x: Any, signed: bool = False) -> str:
    """Percent with one decimal (``-`` for missing)."""
    if x is None:
        return "-"
    v = 100.0 * float(x)
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def est(d: Mapping[str, Any] | None, signed: bool = False, scale: bool = True) -> str:
    """``estimate [lo, hi]`` of an estimate/CI dict."""
    if not d:
        return "-"
    fmt = (
        (lambda v: pct(v, signed)) if scale else (lambda v: "-" if v is None else f"{float(v):.3f}")
    )
    text = fmt(d.get("estimate"))
    ci = d.get("ci")
    if ci and ci[0] is not None and ci[1] is not None:
        text += f" [{fmt(ci[0])}, {fmt(ci[1])}]"
    return text


def pval(p: Any) -> str:
    """A p-value in compact form."""
    if p is None:
        return "-"
    p = float(p)
    if p == 0:
        return "0"
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}"


def excludes_zero(d: Mapping[str, Any] | None) -> bool:
    """Whether an estimate/CI dict's interval excludes 0 (a significant gap)."""
    if not d or not d.get("ci") or d["ci"][0] is None or d["ci"][1] is None:
        return False
    lo, hi = d["ci"]
    return bool(lo > 0 or hi < 0)


def by_gap(cells: Mapping[str, Any] | None, metric: str) -> list[tuple[str, Any]]:
    """``(key, cell)`` items sorted by the delta of ``metric``, most negative first (cells
    without it last, by key)."""

    def key(item: tuple[str, Any]) -> tuple[float, str]:
        m = ((item[1] or {}).get("metrics") or {}).get(metric)
        d = m["delta"]["estimate"] if m else None
        return (d if d is not None else float("inf"), str(item[0]))

    return sorted((cells or {}).items(), key=key)


def pooled_cells(model: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The headline's pooled cell, then both pooled pair sets (all pairs, label-safe)."""
    return [
        (ALL, model.get("overall")),
        ("(all pairs)", model.get("overall_all_pairs")),
        ("(label-safe pairs)", model.get("overall_label_safe")),
    ]
