"""Small statistics: McNemar tests, percentile intervals, logit-linear fits, severity areas.

McNemar on the discordant counts b (correct -> wrong) and c (wrong -> correct) of paired binary
outcomes: the exact p-value is the two-sided binomial test of min(b, c) ~ Bin(b + c, 1/2)
(as ``statsmodels.stats.contingency_tables.mcnemar(exact=True)``); the mid-p value subtracts the
probability of the observed count (Fagerland, Lydersen & Laake 2013, BMC Med Res Methodol 13:91).
Both treat pairs as independent. Pairs that share an image (several questions, variants or
views of one sample) are correlated, which makes those p-values too small; the clustered test
of Durkalski, Palesch, Lipsitz & Rust (2003, Stat Med 22:2417) takes each cluster's net count
d_k = b_k - c_k: X^2 = (sum d_k)^2 / sum d_k^2 on 1 degree of freedom, which is McNemar's
uncorrected chi-square when every cluster holds one pair.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as _st


def mcnemar(b: int, c: int) -> dict[str, float | int]:
    """Exact and mid-p McNemar p-values for discordant counts ``b`` and ``c``."""
    b, c = int(b), int(c)
    n = b + c
    if n == 0:
        return {"b": b, "c": c, "p_exact": 1.0, "p_mid": 1.0}
    k = min(b, c)
    cdf = float(_st.binom.cdf(k, n, 0.5))
    pmf = float(_st.binom.pmf(k, n, 0.5))
    return {"b": b, "c": c, "p_exact": min(1.0, 2.0 * cdf), "p_mid": min(1.0, 2.0 * cdf - pmf)}


def clustered_mcnemar(net_total: float, net_sq_total: float | None) -> float | None:
    """Durkalski's clustered McNemar p-value from ``sum_k d_k`` and ``sum_k d_k^2`` (d_k a
    cluster's correct->wrong minus wrong->correct count); None without the cluster totals, 1.0
    when no cluster has a net change."""
    if net_sq_total is None:
        return None
    if net_sq_total <= 0:
        return 1.0
    return float(_st.chi2.sf(float(net_total) ** 2 / float(net_sq_total), 1))


def percentile_ci(samples: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of each column of ``samples`` (B x m), ignoring NaN resamples.

    Linear interpolation between order statistics (numpy's default quantile method), per
    column over its finite values. A column with fewer than half of its resamples finite gets
    NaN bounds.
    """
    s = np.asarray(samples, dtype=np.float64)
    if s.ndim == 1:
        s = s[:, None]
    B, m = s.shape
    s = np.where(np.isfinite(s), s, np.nan)
    srt = np.sort(s, axis=0)  # NaN sort last
    k = np.isfinite(srt).sum(axis=0)
    a = (1.0 - level) / 2.0
    out = []
    for q in (a, 1.0 - a):
        pos = q * np.maximum(k - 1, 0)
        lo_i = np.floor(pos).astype(np.int64)
        hi_i = np.minimum(lo_i + 1, np.maximum(k - 1, 0))
        frac = pos - lo_i
        cols = np.arange(m)
        v_lo = srt[lo_i, cols]
        v_hi = srt[hi_i, cols]
        val = v_lo + (v_hi - v_lo) * frac
        val = np.where(frac == 0, v_lo, val)
        val[(k == 0) | (k < max(B, 1) / 2)] = np.nan
        out.append(val)
    return out[0], out[1]


def logit(p: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Logit with probabilities clipped to [eps, 1 - eps]."""
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1 - eps)
    return np.log(q / (1 - q))


def expit(x: np.ndarray) -> np.ndarray:
    """Inverse logit."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def effective_robustness(clean: np.ndarray, pert: np.ndarray) -> np.ndarray:
    """Effective robustness of each model (Taori et al. 2020, "Measuring robustness to natural
    distribution shifts in image classification").

    ``clean``/``pert`` have shape (..., n_models) with scores in [0, 1]. A line is fitted by least
    squares to logit(pert) against logit(clean) across models (separately per leading index, e.g.
    per bootstrap resample); a model's effective robustness is its perturbed score minus the score
    the line predicts from its clean score. Meaningful with at least 3 models.
    """
    x = logit(clean)
    y = logit(pert)
    xm = x.mean(axis=-1, keepdims=True)
    ym = y.mean(axis=-1, keepdims=True)
    sxx = ((x - xm) ** 2).sum(axis=-1, keepdims=True)
    sxy = ((x - xm) * (y - ym)).sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
    intercept = ym - slope * xm
    return np.asarray(pert, dtype=np.float64) - expit(intercept + slope * x)


def area_under_severity_curve(
    clean: np.ndarray, points: np.ndarray, severities: np.ndarray
) -> np.ndarray:
    """Normalised area under the score-vs-severity curve, severity 0 being the clean score.

    ``clean`` (...,), ``points`` (..., S) at ``severities`` (S,) >= 1, ascending. Trapezoids from 0
    to the largest severity divided by that severity: the curve's mean level, in metric units.
    """
    x = np.concatenate([[0.0], np.asarray(severities, dtype=np.float64)])
    y = np.concatenate([np.asarray(clean, dtype=np.float64)[..., None], points], axis=-1)
    area = ((y[..., 1:] + y[..., :-1]) / 2 * np.diff(x)).sum(axis=-1)
    return area / x[-1]
