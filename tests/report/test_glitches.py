"""Issue 30's report glitches: the severity-curve title clear of the panel titles, no
single-cell "s0" heatmap for a track of variants, significant gaps marked in the bars, and the
inputs table naming the model as the headline does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from perturb.report import plots
from perturb.report.content import build_sections
from perturb.score import score_runs
from perturb.score.synthetic import make_predictions


@pytest.fixture(scope="module")
def scores() -> dict[str, Any]:
    c, p, m = make_predictions(n_images=30, questions_per_image=3, seed=5)
    c["model"] = "qwen-vl-7b"
    p["model"] = "qwen-vl-7b"
    return dict(score_runs(c, p, manifest=m, bootstrap=200).scores)


@pytest.fixture(scope="module")
def variant_scores() -> dict[str, Any]:
    """A track of variants: every output at severity 0."""
    c, p, m = make_predictions(
        n_images=30, questions_per_image=3, seed=6, severities=(0,), variants=3,
        perturbations={"kvasir_transformed": 0.3},
    )  # fmt: skip
    return dict(score_runs(c, p, manifest=m, bootstrap=100).scores)


def test_curve_title_clears_the_first_row_of_panel_titles(scores: dict[str, Any]) -> None:
    model = scores["models"]["qwen-vl-7b"]
    fig = plots.curves_figure(model, scores["config"]["primary"])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    top = fig._suptitle.get_window_extent(renderer)
    panel_tops = [ax.title.get_window_extent(renderer).y1 for ax in fig.axes if ax.get_title()]
    assert panel_tops and top.y0 >= max(panel_tops), (top.y0, max(panel_tops))


def test_variants_get_no_severity_heatmap(variant_scores: dict[str, Any]) -> None:
    model = next(iter(variant_scores["models"].values()))
    prim = variant_scores["config"]["primary"]
    assert plots.heatmap(model, prim) is None
    sections = build_sections(variant_scores)
    variants = [s for s in sections if s.title.startswith("Variants:")]
    assert variants and not variants[0].tables and not variants[0].plots
    assert all(not p.startswith(("heatmap:", "curves:")) for s in sections for p in s.plots)


def test_bars_mark_the_significant_gaps(scores: dict[str, Any]) -> None:
    assert plots.significant(-5.0, -1.0) and plots.significant(1.0, 3.0)
    assert not plots.significant(-2.0, 1.0) and not plots.significant(np.nan, 1.0)
    assert not plots.significant(-1.0, -1.0)  # no interval (bootstrap off): nothing to claim
    model = scores["models"]["qwen-vl-7b"]
    png = plots.delta_bars(model, scores["config"]["primary"])
    assert png is not None and png.startswith(b"\x89PNG")


def test_inputs_table_names_the_model(scores: dict[str, Any]) -> None:
    assert {r["model"] for r in scores["reading"]} == {"qwen-vl-7b"}
    inputs = next(t for s in build_sections(scores) for t in s.tables if t.id == "inputs")
    assert {row[1] for row in inputs.rows} == {"qwen-vl-7b"}
