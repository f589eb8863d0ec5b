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
    """Estimate, lower and upper bound of an estimate/CI dict, in percent (NaN when missing)."""
    if not d or d.get("estimate") is None:
        return np.nan, np.nan, np.nan
    estimate = 100 * float(d["estimate"])
    ci = d.get("ci") or [None, None]
    lo = 100 * float(ci[0]) if ci[0] is not None else estimate
    hi = 100 * float(ci[1]) if ci[1] is not None else estimate
    return estimate, lo, hi


def significant(lo: float, hi: float) -> bool:
    """A gap whose confidence interval excludes 0."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and (hi < 0 or lo > 0) and lo != hi)


def _hbars(
    labels: list[str], intervals: list[tuple[float, float, float]], title: str, xlabel: str
) -> bytes:
    """Horizontal bars with CI whiskers; a gap whose CI excludes 0 is solid and starred, the
    others pale and hatched."""
    plt = _plt()
    estimates = np.array([v[0] for v in intervals])
    lo = np.array([v[1] for v in intervals])
    hi = np.array([v[2] for v in intervals])
    sig = [significant(a, b) for a, b in zip(lo, hi, strict=True)]
    labels = [f"{name} *" if s else name for name, s in zip(labels, sig, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1.2))
    y = np.arange(len(labels))
    colors = ["#c0392b" if v < 0 else "#2e86c1" for v in np.nan_to_num(estimates)]
    bars = ax.barh(y, np.nan_to_num(estimates), color=colors, alpha=0.85)
    for bar, s in zip(bars, sig, strict=True):
        if not s:
            bar.set_alpha(0.35)
            bar.set_hatch("//")
    if any(sig):
        title = f"{title}\n* 95% CI excludes 0 (solid bars)"
    ax.errorbar(
        np.nan_to_num(estimates),
        y,
        xerr=[np.nan_to_num(estimates - lo), np.nan_to_num(hi - estimates)],
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


def _by_gap(cells: Mapping[str, Any], metric: str) -> list[tuple[str, Any]]:
    from perturb.report.document import by_gap

    return by_gap(cells, metric)


def delta_bars(model: Mapping[str, Any], metric: str) -> bytes | None:
    """Delta of ``metric`` per perturbation with 95% CI, largest drop first."""
    cells = [(ALL, model.get("overall")), *_by_gap(model.get("by_perturbation") or {}, metric)]
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
    """Delta of ``metric`` per question class (all perturbations pooled), largest drop first."""
    by_class = (model.get("by_question_class") or {}).get(ALL) or {}
    labels, vals = [], []
    for question_class, cell in _by_gap(by_class, metric):
        if metric in cell["metrics"]:
            labels.append(question_class)
            vals.append(_ci(cell["metrics"][metric]["delta"]))
    if not labels:
        return None
    return _hbars(
        labels, vals, f"{metric} delta by question class (95% CI)", "delta (percentage points)"
    )


def heatmap(model: Mapping[str, Any], metric: str) -> bytes | None:
    """Perturbation x severity heatmap of the delta of ``metric``."""
    by_severity = model.get("by_perturbation_severity") or {}
    perts = [p for p, _ in _by_gap(model.get("by_perturbation") or {}, metric) if p in by_severity]
    perts += [p for p in sorted(by_severity) if p not in perts]
    sevs = sorted({int(s) for d in by_severity.values() for s in d})
    if not perts or not sevs or sevs == [0]:  # variants only (a track): no severity axis
        return None
    deltas = np.full((len(perts), len(sevs)), np.nan)
    for i, p in enumerate(perts):
        for j, s in enumerate(sevs):
            scores = by_severity[p].get(str(s), {}).get("metrics", {}).get(metric)
            if scores and scores["delta"]["estimate"] is not None:
                deltas[i, j] = 100 * scores["delta"]["estimate"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.1 * len(sevs) + 3, 0.5 * len(perts) + 1.5))
    lim = float(np.nanmax(np.abs(deltas))) if np.isfinite(deltas).any() else 1.0
    lim = max(lim, 1e-6)
    im = ax.imshow(deltas, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(perts)):
        for j in range(len(sevs)):
            if np.isfinite(deltas[i, j]):
                dark = abs(deltas[i, j]) > 0.6 * lim
                ax.text(
                    j,
                    i,
                    f"{deltas[i, j]:+.1f}",
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
    """Small multiples: one panel per perturbation (largest drop first), score of ``metric``
    against severity (clean at 0) with its 95% CI band; shared y axis."""
    fig = curves_figure(model, metric)
    return None if fig is None else _png(fig)


def curves_figure(model: Mapping[str, Any], metric: str) -> Any:
    """The matplotlib figure of :func:`curves` (None when there is nothing to draw)."""
    severity_curves = model.get("severity_curves") or {}
    order = [
        p for p, _ in _by_gap(model.get("by_perturbation") or {}, metric) if p in severity_curves
    ]
    order += [p for p in sorted(severity_curves) if p not in order]
    series = [(p, severity_curves[p][metric]) for p in order if metric in severity_curves[p]]
    if not series:
        return None
    plt = _plt()
    ncol = min(4, len(series))
    nrow = -(-len(series) // ncol)
    fig, axes = plt.subplots(
        nrow, ncol, figsize=(2.6 * ncol, 2.1 * nrow + 0.6), sharex=True, sharey=True, squeeze=False
    )
    for ax, (p, curve) in zip(axes.flat, series, strict=False):
        x = [0, *list(curve["severities"])]
        pts = [_ci(curve["clean"])] + [_ci(v) for v in curve["perturbed"]]
        levels = np.array([v[0] for v in pts])
        lo = np.array([v[1] for v in pts])
        hi = np.array([v[2] for v in pts])
        ax.plot(x, levels, marker="o", color="#1f4e79", lw=1.5, ms=3)
        ax.fill_between(x, lo, hi, color="#1f4e79", alpha=0.18)
        ax.axhline(levels[0], color="#888", lw=0.8, ls="--")
        change = levels[-1] - levels[0]
        ax.set_title(f"{p}  ({change:+.1f} pp at s{x[-1]})", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("severity (0 = clean)", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{metric} (%)", fontsize=8)
    fig.suptitle(f"{metric} vs severity, one panel per perturbation (95% CI bands)", fontsize=10)
    # keep the top 0.32 inch for the title, so it never overlaps the first row's panel titles
    height = fig.get_figheight()
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - 0.32 / height))
    return fig


PLOTTERS = {
    "delta_bars": delta_bars,
    "class_bars": class_bars,
    "heatmap": heatmap,
    "curves": curves,
}


def render_plot(plot_id: str, scores: Mapping[str, Any]) -> bytes | None:
    """PNG of plot ``kind:model`` (None when there is nothing to draw)."""
    kind, _, model = plot_id.partition(":")
    model_scores = scores["models"].get(model)
    if model_scores is None:
        return None
    return PLOTTERS[kind](model_scores, scores["config"]["primary"])
