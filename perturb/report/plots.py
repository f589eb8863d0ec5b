"""Report plots as PNG bytes (matplotlib, Agg backend, no metadata stamps)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np

ALL = "(all)"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)
    return buf.getvalue()


def _ci(d: Mapping[str, Any] | None) -> tuple[float, float, float]:
    if not d or d.get("estimate") is None:
        return np.nan, np.nan, np.nan
    e = 100 * float(d["estimate"])
    ci = d.get("ci") or [None, None]
    lo = 100 * float(ci[0]) if ci[0] is not None else e
    hi = 100 * float(ci[1]) if ci[1] is not None else e
    return e, lo, hi


def _hbars(
    labels: list[str], vals: list[tuple[float, float, float]], title: str, xlabel: str
) -> bytes:
    plt = _plt()
    e = np.array([v[0] for v in vals])
    lo = np.array([v[1] for v in vals])
    hi = np.array([v[2] for v in vals])
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1.2))
    y = np.arange(len(labels))
    colors = ["#c0392b" if v < 0 else "#2e86c1" for v in np.nan_to_num(e)]
    ax.barh(y, np.nan_to_num(e), color=colors, alpha=0.8)
    ax.errorbar(
        np.nan_to_num(e),
        y,
        xerr=[np.nan_to_num(e - lo), np.nan_to_num(hi - e)],
        fmt="none",
        ecolor="black",
        capsize=3,
        lw=1,
    )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def delta_bars(model: Mapping[str, Any], metric: str) -> bytes | None:
    """Delta of ``metric`` per perturbation with 95% CI."""
    cells = [(ALL, model.get("overall")), *sorted((model.get("by_perturbation") or {}).items())]
    labels, vals = [], []
    for name, cell in cells:
        if cell and metric in cell["metrics"]:
            labels.append(str(name))
            vals.append(_ci(cell["metrics"][metric]["delta"]))
    if not labels:
        return None
    return _hbars(
        labels, vals, f"{metric}: perturbed - clean (95% CI)", "delta (percentage points)"
    )


def class_bars(model: Mapping[str, Any], metric: str) -> bytes | None:
    """Delta of ``metric`` per question class (all perturbations pooled)."""
    d = (model.get("by_question_class") or {}).get(ALL) or {}
    labels, vals = [], []
    for k, cell in sorted(d.items()):
        if metric in cell["metrics"]:
            labels.append(k)
            vals.append(_ci(cell["metrics"][metric]["delta"]))
    if not labels:
        return None
    return _hbars(
        labels, vals, f"{metric} delta by question class (95% CI)", "delta (percentage points)"
    )


def heatmap(model: Mapping[str, Any], metric: str) -> bytes | None:
    """Perturbation x severity heatmap of the delta of ``metric``."""
    bps = model.get("by_perturbation_severity") or {}
    perts = sorted(bps)
    sevs = sorted({int(s) for d in bps.values() for s in d})
    if not perts or not sevs:
        return None
    M = np.full((len(perts), len(sevs)), np.nan)
    for i, p in enumerate(perts):
        for j, s in enumerate(sevs):
            m = bps[p].get(str(s), {}).get("metrics", {}).get(metric)
            if m and m["delta"]["estimate"] is not None:
                M[i, j] = 100 * m["delta"]["estimate"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.1 * len(sevs) + 3, 0.5 * len(perts) + 1.5))
    lim = float(np.nanmax(np.abs(M))) if np.isfinite(M).any() else 1.0
    lim = max(lim, 1e-6)
    im = ax.imshow(M, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(perts)):
        for j in range(len(sevs)):
            if np.isfinite(M[i, j]):
                dark = abs(M[i, j]) > 0.6 * lim
                ax.text(
                    j,
                    i,
                    f"{M[i, j]:+.1f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "black",
                )
    ax.set_xticks(range(len(sevs)), [f"s{s}" for s in sevs])
    ax.set_yticks(range(len(perts)), perts)
    ax.set_title(f"{metric}: delta (pp) by perturbation and severity")
    fig.colorbar(im, ax=ax, label="delta (pp)")
    return _png(fig)


def curves(model: Mapping[str, Any], metric: str) -> bytes | None:
    """Score of ``metric`` against severity per perturbation, clean at 0, with 95% CI bands."""
    sc = model.get("severity_curves") or {}
    series = [(p, c[metric]) for p, c in sorted(sc.items()) if metric in c]
    if not series:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for p, cur in series:
        x = [0, *list(cur["severities"])]
        pts = [_ci(cur["clean"])] + [_ci(v) for v in cur["perturbed"]]
        e = np.array([v[0] for v in pts])
        lo = np.array([v[1] for v in pts])
        hi = np.array([v[2] for v in pts])
        (line,) = ax.plot(x, e, marker="o", label=p)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("severity (0 = clean)")
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(f"{metric} vs severity (95% CI bands)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


PLOTTERS = {
    "delta_bars": delta_bars,
    "class_bars": class_bars,
    "heatmap": heatmap,
    "curves": curves,
}


def render_plot(plot_id: str, scores: Mapping[str, Any]) -> bytes | None:
    """PNG of plot ``kind:model`` (None when there is nothing to draw)."""
    kind, _, model = plot_id.partition(":")
    m = scores["models"].get(model)
    if m is None:
        return None
    return PLOTTERS[kind](m, scores["config"]["primary"])
