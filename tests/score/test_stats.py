"""Paired statistics: McNemar vs statsmodels/scipy, intervals, bootstrap coverage, fits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sst
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

from perturb.score.bootstrap import CellEngine, resample_counts
from perturb.score.stats import (
    area_under_severity_curve,
    clustered_mcnemar,
    effective_robustness,
    mcnemar,
    percentile_ci,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 400), st.integers(0, 400))
def test_mcnemar_exact_matches_statsmodels_and_mid_p_matches_scipy(b: int, c: int) -> None:
    got = mcnemar(b, c)
    table = np.array([[50, b], [c, 50]])
    assert got["p_exact"] == pytest.approx(
        sm_mcnemar(table, exact=True).pvalue, rel=1e-9, abs=1e-300
    )
    if b + c:
        assert got["p_exact"] == pytest.approx(
            sst.binomtest(b, b + c, 0.5).pvalue, rel=1e-9, abs=1e-300
        )
        # mid-p: two-sided tail probability with half weight on the observed count
        k, n = min(b, c), b + c
        mid = 2 * (sst.binom.cdf(k - 1, n, 0.5) + 0.5 * sst.binom.pmf(k, n, 0.5))
        assert got["p_mid"] == pytest.approx(min(1.0, mid), rel=1e-9, abs=1e-300)
        assert got["p_mid"] <= got["p_exact"]
    else:
        assert got["p_exact"] == 1.0 and got["p_mid"] == 1.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 400), st.integers(0, 400))
def test_clustered_mcnemar_of_one_pair_per_image_is_mcnemars_chi_square(b: int, c: int) -> None:
    """Every cluster one pair: d_k is +1 (b) or -1 (c), so sum d_k^2 = b + c and Durkalski's
    statistic is McNemar's uncorrected chi-square (statsmodels, exact=False, correction=False)."""
    got = clustered_mcnemar(b - c, b + c)
    if b + c == 0:
        assert got == 1.0
        return
    want = sm_mcnemar(np.array([[50, b], [c, 50]]), exact=False, correction=False).pvalue
    assert got == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_clustered_mcnemar_keeps_its_level_when_pairs_share_an_image() -> None:
    """No true gap, but the pairs of one image flip together (each image leans one way, either
    way with probability 1/2): McNemar on the pooled counts rejects far more often than 5%,
    the clustered test about 5% of the time."""
    rng = np.random.default_rng(11)
    n_sets, n_images, per_image = 2000, 30, 10
    lean = rng.random((n_sets, n_images)) < 0.5
    flips = rng.random((n_sets, n_images, per_image)) < 0.3
    to_wrong = rng.random((n_sets, n_images, per_image)) < np.where(lean, 0.85, 0.15)[..., None]
    b_k = (flips & to_wrong).sum(axis=2)
    c_k = (flips & ~to_wrong).sum(axis=2)
    d_k = b_k - c_k
    pooled = np.mean([mcnemar(b, c)["p_exact"] < 0.05 for b, c in zip(b_k.sum(1), c_k.sum(1), strict=True)])
    clustered = np.mean(
        [(clustered_mcnemar(d.sum(), (d**2).sum()) or 1.0) < 0.05 for d in d_k]
    )
    assert pooled > 0.12, pooled  # over twice the nominal 5%
    assert 0.02 <= clustered <= 0.08, clustered


def test_mcnemar_hand_example() -> None:
    # b=1, c=9: exact p = 2 * P(X<=1 | n=10) = 2 * 11/1024; mid-p subtracts P(X=1) = 10/1024
    got = mcnemar(1, 9)
    assert got["p_exact"] == pytest.approx(22 / 1024)
    assert got["p_mid"] == pytest.approx(12 / 1024)


def test_percentile_ci_matches_numpy_and_handles_nan() -> None:
    rng = np.random.default_rng(0)
    s = rng.normal(size=(1000, 6))
    s[:100, 2] = np.nan  # 10% failed resamples: ignored
    s[:, 3] = np.nan  # all failed: no interval
    s[:600, 4] = np.nan  # most failed: no interval
    lo, hi = percentile_ci(s)
    for j in (0, 1, 2, 5):
        assert lo[j] == pytest.approx(np.nanquantile(s[:, j], 0.025))
        assert hi[j] == pytest.approx(np.nanquantile(s[:, j], 0.975))
    assert np.isnan(lo[3]) and np.isnan(hi[4])


def test_resamples_are_seeded_and_independent_of_each_other() -> None:
    a = resample_counts(50, 20, 3)
    b = resample_counts.__wrapped__(50, 30, 3)  # uncached, more resamples: same first 20
    assert np.array_equal(a, b[:20])
    assert (a.sum(axis=1) == 50).all()
    assert not np.array_equal(a, resample_counts.__wrapped__(50, 20, 4))


def _coverage(cluster_level: bool, sims: int = 200, clusters: int = 60, per: int = 6) -> float:
    """Share of 95% CIs for the mean paired gap that contain the true gap."""
    rng = np.random.default_rng(1234)
    true = 0.3
    hits = 0
    n = clusters * per
    cl = np.repeat(np.arange(clusters), per)
    for _ in range(sims):
        u = rng.normal(size=clusters)[cl]  # image difficulty (cancels in the gap)
        v = rng.normal(size=clusters)[cl]  # image-level share of the perturbation effect
        clean = 1.0 + u + rng.normal(size=n)
        pert = clean + true + v + rng.normal(size=n)
        vals = np.column_stack([np.ones(n), clean, pert])
        units = cl if cluster_level else np.arange(n)
        eng = CellEngine(n_clusters=int(units.max()) + 1, n_boot=1000, seed=0)
        eng.add([("all",)], np.zeros(n, dtype=np.int64), units, vals)
        eng.run()
        bt = eng.cells[("all",)].boot
        assert bt is not None
        delta = (bt[:, 2] - bt[:, 1]) / bt[:, 0]
        lo, hi = percentile_ci(delta)
        hits += int(lo[0] <= true <= hi[0])
    return hits / sims


def test_cluster_bootstrap_ci_covers_the_true_gap_about_95_percent() -> None:
    cov = _coverage(cluster_level=True)
    assert 0.90 <= cov <= 0.99, cov
    # resampling rows instead of images ignores the correlation and under-covers badly
    naive = _coverage(cluster_level=False)
    assert naive < 0.85, naive


def test_engine_totals_equal_direct_sums() -> None:
    rng = np.random.default_rng(5)
    n = 500
    cl = rng.integers(0, 40, n)
    code = rng.integers(-1, 3, n)
    vals = rng.random((n, 4))
    eng = CellEngine(n_clusters=40, n_boot=50, seed=1)
    eng.add([("x",), ("y",), ("z",)], code, cl, vals)
    eng.run()
    W = resample_counts(40, 50, 1).astype(float)
    for k, key in enumerate([("x",), ("y",), ("z",)]):
        sel = code == k
        cell = eng.cells[key]
        assert np.allclose(cell.point, vals[sel].sum(axis=0))
        assert cell.n_rows == sel.sum() and cell.n_clusters == len(np.unique(cl[sel]))
        per_cluster = np.zeros((40, 4))
        np.add.at(per_cluster, cl[sel], vals[sel])
        assert cell.boot is not None and np.allclose(cell.boot, W @ per_cluster)
        assert cell.cluster_sq is not None
        assert np.allclose(cell.cluster_sq, (per_cluster**2).sum(axis=0))


def test_effective_robustness_on_and_off_the_line() -> None:
    from perturb.score.stats import expit, logit

    clean = np.array([0.6, 0.7, 0.8, 0.9])
    pert = expit(0.9 * logit(clean) - 0.5)  # exactly on a logit-linear trend
    assert np.allclose(effective_robustness(clean, pert), 0.0, atol=1e-12)
    pert2 = pert.copy()
    pert2[1] += 0.05  # one model above the trend
    er = effective_robustness(clean, pert2)
    assert er[1] > 0.02 and er[1] == er.max()
    # vectorised over resamples (leading axis)
    both = effective_robustness(np.stack([clean, clean]), np.stack([pert, pert2]))
    assert np.allclose(both[1], er)


def test_area_under_severity_curve_hand_checked() -> None:
    # clean 0.8, severities 1..5 at 0.7, 0.6, 0.5, 0.4, 0.3: trapezoid area 2.75 over [0, 5]
    a = area_under_severity_curve(
        np.array(0.8), np.array([0.7, 0.6, 0.5, 0.4, 0.3]), np.array([1, 2, 3, 4, 5])
    )
    assert float(a) == pytest.approx(2.75 / 5)
    # uneven severities: only 2 and 4
    a2 = area_under_severity_curve(np.array(1.0), np.array([0.5, 0.5]), np.array([2, 4]))
    assert float(a2) == pytest.approx((1.5 + 1.0) / 4)
