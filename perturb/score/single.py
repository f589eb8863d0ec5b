"""Unpaired scores of one prediction file, as the Kvasir-VQA-x1 evaluation scripts report them.

``evaluate_predictions`` gives, per complexity level and overall, the mean of each item metric
and the corpus value of each corpus metric (upstream ``evaluation/compute_metrics.py``), and
for LLM-judge files the per-question-class accuracy over (row, class) pairs (upstream
``evaluation/make_figures.py``). All values are fractions in [0, 1] (upstream prints chrF and
the judge accuracies in percent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from perturb.errors import InputError
from perturb.score.inputs import read_predictions
from perturb.score.metrics import (
    METRICS,
    compute_item_metrics,
    corpus_score,
    corpus_stats,
    resolve_metrics,
)
from perturb.score.read import PredictionSource


def evaluate_predictions(
    source: PredictionSource, metrics: Sequence[str] | None = ("upstream",)
) -> dict[str, Any]:
    """Per-complexity and overall scores of one file (no pairing, no resampling)."""
    df, rep = read_predictions(source)
    use = df[df["prediction"].notna() & df["reference"].notna()].reset_index(drop=True)
    if len(use) == 0:
        raise InputError(f"{rep.source}: no row has both a prediction and a reference answer")
    names = resolve_metrics(metrics)
    pred = use["prediction"].to_numpy(dtype=object)
    ref = use["reference"].to_numpy(dtype=object)
    item = compute_item_metrics(
        pred,
        ref,
        [m for m in names if METRICS[m].kind == "item"],
        options=use["options"].to_numpy(dtype=object),
        judge=use["judge"].to_numpy(dtype=object),
        question_class=use["question_class"].to_numpy(dtype=object),
    )
    stats = {m: corpus_stats(pred, ref, m) for m in names if METRICS[m].kind == "corpus"}

    def summarize(idx: np.ndarray) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for m in names:
            if m in item:
                v = item[m][idx]
                v = v[~np.isnan(v)]
                out[m] = float(v.mean()) if v.size else None
            else:
                out[m] = float(corpus_score(m, stats[m][idx].sum(axis=0)))
        return out

    comp = use["complexity"]
    result: dict[str, Any] = {
        "n": len(use),
        "rows_read": rep.rows_in,
        "overall": summarize(np.arange(len(use))),
        "per_complexity": {
            str(int(c)): summarize(np.flatnonzero((comp == c).fillna(False).to_numpy()))
            for c in sorted(comp.dropna().unique())
        },
    }
    judged = use["judge"].notna()
    if judged.any():
        result["judge"] = _judge_by_class(use[judged])
    return result


def _judge_by_class(df: pd.DataFrame) -> dict[str, Any]:
    overall: dict[str, list[int]] = {}
    by_comp: dict[str, dict[str, list[int]]] = {}
    for ev, classes, comp in zip(df["judge"], df["question_class"], df["complexity"], strict=True):
        for qc in classes:
            if qc not in ev:
                continue
            hit = int(ev[qc] == 1)
            overall.setdefault(qc, [0, 0])
            overall[qc][0] += hit
            overall[qc][1] += 1
            if not pd.isna(comp):
                d = by_comp.setdefault(str(int(comp)), {}).setdefault(qc, [0, 0])
                d[0] += hit
                d[1] += 1
    return {
        "overall": {k: v[0] / v[1] for k, v in sorted(overall.items())},
        "per_complexity": {
            c: {k: v[0] / v[1] for k, v in sorted(d.items())} for c, d in sorted(by_comp.items())
        },
    }
