"""Calibration under perturbation: does a model's confidence drop with its accuracy?

When predictions carry a confidence (a ``confidence`` column in [0, 1], or ms-swift
``logprobs``: the answer's sequence probability exp(sum of token log-probabilities)), each pair
gives (confidence, correct) on the clean and on the perturbed image. Per cell (all headline
pairs, per perturbation, per perturbation x severity) this reports, clean and perturbed:

* ECE: expected calibration error with 10 equal-width confidence bins,
  sum_b |B_b|/n * |accuracy(B_b) - mean confidence(B_b)| (Guo et al. 2017);
* overconfidence: mean confidence minus accuracy (positive = overconfident);

and the paired shifts perturbed - clean, with percentile CIs from a cluster bootstrap over
img_id (the same resampling unit as every other gap). MedQ-Deg reports this calibration shift
growing with severity for every model it tested.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perturb.errors import InputError

N_BINS = 10


def confidence_of(v: Any) -> float | None:
    """A confidence in [0, 1] from a cell: a number, or ms-swift / OpenAI-style ``logprobs``
    (``{"content": [{"logprob": x, ...}, ...]}``, a list of such entries or of numbers):
    exp(sum of token log-probabilities). None when absent; ValueError when invalid."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return None
        if s[:1] in "[{":
            import json

            return confidence_of(json.loads(s))
        v = float(s)
    if isinstance(v, Mapping):
        if "content" in v:
            return confidence_of(v["content"])
        if "logprob" in v:
            return _from_logprobs([v])
        raise ValueError(f"no 'content' or 'logprob' in {str(v)[:80]}")
    if isinstance(v, (list, tuple, np.ndarray)):
        return _from_logprobs(list(v))
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{v!r} is not a confidence")
    x = float(v)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{x!r} is outside [0, 1]")
    return x


def _from_logprobs(items: list[Any]) -> float | None:
    if not items:
        return None
    total = 0.0
    for it in items:
        lp = it.get("logprob") if isinstance(it, Mapping) else it
        if lp is None:
            raise ValueError(f"token entry without 'logprob': {str(it)[:80]}")
        lp = float(lp)
        if lp > 1e-9 or math.isnan(lp):
            raise ValueError(f"log-probability {lp!r} > 0")
        total += lp
    return float(math.exp(total))


def confidence_column(values: np.ndarray, source: str, locs: np.ndarray) -> np.ndarray:
    """Float array of confidences (NaN where absent); InputError naming the first bad row."""
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        try:
            c = confidence_of(v)
        except (ValueError, TypeError) as exc:
            raise InputError(
                f"{source}: row {locs[i]}: confidence/logprobs {str(v)[:60]!r} unusable ({exc}); "
                "give a probability in [0, 1] or ms-swift logprobs"
            ) from None
        if c is not None:
            out[i] = c
    return out


def _ece_parts(conf: np.ndarray, correct: np.ndarray, w: np.ndarray) -> tuple[Any, Any]:
    """Weighted ECE and overconfidence; ``w`` is (B, n) or (n,)."""
    bins = np.minimum((conf * N_BINS).astype(np.int64), N_BINS - 1)
    onehot = np.zeros((len(conf), N_BINS))
    onehot[np.arange(len(conf)), bins] = 1.0
    n = w.sum(axis=-1)
    cnt = w @ onehot
    sc = (w * conf) @ onehot
    sa = (w * correct) @ onehot
    with np.errstate(invalid="ignore", divide="ignore"):
        ece = np.abs(sa - sc).sum(axis=-1) / n
        over = (w @ conf - w @ correct) / n
    del cnt
    return ece, over


def calibration_cells(
    pairs: pd.DataFrame,
    correct_c: np.ndarray,
    correct_p: np.ndarray,
    head: np.ndarray,
    metric: str,
    n_boot: int,
    seed: int,
    level: float,
) -> dict[str, Any] | None:
    """The ``calibration`` section of one model (None when no pair has both confidences)."""
    cc = pairs["conf_clean"].to_numpy(dtype=np.float64)
    cp = pairs["conf_pert"].to_numpy(dtype=np.float64)
    ok = head & np.isfinite(cc) & np.isfinite(cp) & np.isfinite(correct_c) & np.isfinite(correct_p)
    if not ok.any():
        return None
    ids, cluster = np.unique(
        pairs["img_id"].to_numpy(dtype=object)[ok].astype(str), return_inverse=True
    )
    cc, cp = cc[ok], cp[ok]
    yc, yp = correct_c[ok], correct_p[ok]
    pert = pairs["perturbation"].to_numpy(dtype=object)[ok]
    sev = pairs["severity"].to_numpy(np.int64)[ok]
    rng = np.random.default_rng(seed)
    # one set of cluster resamples shared by every cell (paired, like the other gaps)
    W = (
        rng.multinomial(len(ids), np.full(len(ids), 1.0 / len(ids)), size=n_boot).astype(np.float64)
        if n_boot > 0
        else None
    )
    alpha = (1 - level) / 2

    def cell(mask: np.ndarray, with_ci: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n_pairs": int(mask.sum()),
            "n_clusters": int(np.unique(cluster[mask]).size),
        }
        one = np.ones(int(mask.sum()))
        vals = {}
        for side, conf, y in (("clean", cc[mask], yc[mask]), ("perturbed", cp[mask], yp[mask])):
            e, o = _ece_parts(conf, y, one)
            vals[side] = (e, o)
            out[side] = {
                "ece": float(e),
                "overconfidence": float(o),
                "mean_confidence": float(conf.mean()),
                "accuracy": float(y.mean()),
            }
        for key, j in (("ece", 0), ("overconfidence", 1)):
            d: dict[str, Any] = {
                "estimate": float(vals["perturbed"][j] - vals["clean"][j]),
                "ci": None,
            }
            if with_ci and W is not None:
                w = W[:, cluster[mask]]
                bc = _ece_parts(cc[mask], yc[mask], w)[j]
                bp = _ece_parts(cp[mask], yp[mask], w)[j]
                diff = bp - bc
                diff = diff[np.isfinite(diff)]
                if diff.size:
                    d["ci"] = [float(np.quantile(diff, alpha)), float(np.quantile(diff, 1 - alpha))]
            out[f"delta_{key}"] = d
        return out

    sec: dict[str, Any] = {
        "metric": metric,
        "bins": N_BINS,
        "confidence": "confidence column, or exp(sum of token logprobs)",
        "overall": cell(np.ones(len(cc), dtype=bool), True),
        "by_perturbation": {},
        "by_perturbation_severity": {},
    }
    for p in sorted(set(pert.tolist())):
        m = pert == p
        sec["by_perturbation"][str(p)] = cell(m, True)
        for s in sorted(set(sev[m].tolist())):
            sec["by_perturbation_severity"].setdefault(str(p), {})[str(s)] = cell(
                m & (sev == s), False
            )
    return sec
