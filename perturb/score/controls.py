"""Controls: how much of the clean score survives when the model does not get the image.

``perturb predict --controls`` asks every clean question three more times: with a blank grey
image (``control_blank``), with another sample's image (``control_other_image``) and with no
image (``control_no_image``). Their pairs are not perturbations: they are split off before the
robustness analysis (so no gap, headline or pooled cell counts them) and summarised per control
and question class as the share of the clean score they keep (``retained`` = control score /
clean score, on the primary metric, or the first per-item metric when the primary is a corpus
metric). A model that keeps most of its score without the image answers from the question's
text: its robustness gaps say little (a 2026 study found a model keeping 81% of its VQA-RAD
score on blank images).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from perturb.score.analysis import ModelData

CONTROL_PREFIX = "control_"
ALL = "(all)"
# a retained share above this is reported as "answers without looking"
BLIND_SHARE = 0.8


def is_control(names: np.ndarray) -> np.ndarray:
    """Which perturbation names are controls."""
    return np.array([isinstance(n, str) and n.startswith(CONTROL_PREFIX) for n in names], bool)


def split_controls(
    md: ModelData, resolver: Callable[[Any], Any]
) -> tuple[ModelData, ModelData | None]:
    """(the model's perturbation pairs, its control pairs or None); ``resolver(pairs)`` gives
    the thumbnail finder of the kept pairs."""
    mask = is_control(md.pairs["perturbation"].to_numpy(dtype=object))
    if not mask.any():
        return md, None
    return _subset(md, ~mask, resolver), _subset(md, mask, resolver)


def _subset(md: ModelData, keep: np.ndarray, resolver: Callable[[Any], Any]) -> ModelData:
    idx = np.flatnonzero(keep)
    pairs = md.pairs.iloc[idx].reset_index(drop=True)
    return replace(
        md,
        pairs=pairs,
        item_clean={k: v[idx] for k, v in md.item_clean.items()},
        item_perturbed={k: v[idx] for k, v in md.item_perturbed.items()},
        corpus_stats_clean={k: v[idx] for k, v in md.corpus_stats_clean.items()},
        corpus_stats_perturbed={k: v[idx] for k, v in md.corpus_stats_perturbed.items()},
        judge_by_class_clean=[md.judge_by_class_clean[i] for i in idx],
        judge_by_class_perturbed=[md.judge_by_class_perturbed[i] for i in idx],
        images=resolver(pairs),
        answer_changed=None if md.answer_changed is None else md.answer_changed[idx],
    )


def _cell(clean: np.ndarray, control: np.ndarray) -> dict[str, Any]:
    ok = ~np.isnan(clean) & ~np.isnan(control)
    c, k = float(clean[ok].mean()) if ok.any() else None, None
    if ok.any():
        k = float(control[ok].mean())
    retained = k / c if c and k is not None else None
    return {"n": int(ok.sum()), "clean": c, "control": k, "retained": retained}


def summarise(controls: ModelData, primary: str, item_metrics: Sequence[str]) -> dict[str, Any]:
    """Per control: the metric's clean and control means and the retained share, over all its
    pairs and per question class."""
    metric = (
        primary
        if primary in controls.item_clean
        else next((m for m in item_metrics if m in controls.item_clean), None)
    )
    if metric is None:
        return {}
    names = controls.pairs["perturbation"].to_numpy(dtype=object)
    classes = controls.pairs["question_class"].to_numpy(dtype=object)
    clean, control = controls.item_clean[metric], controls.item_perturbed[metric]
    out: dict[str, Any] = {"metric": metric, "by_control": {}}
    for name in sorted(set(names)):
        rows = names == name
        cells = {ALL: _cell(clean[rows], control[rows])}
        for qc in sorted({c for cs in classes[rows] for c in (cs or ())}):
            in_class = rows & np.array([qc in (cs or ()) for cs in classes], bool)
            cells[qc] = _cell(clean[in_class], control[in_class])
        out["by_control"][name] = cells
    return out
