"""Noise grain relative to the shorter side (perturb.ops.grain)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.ops.backend import use_backend
from perturb.ops.grain import GRAIN_CELLS, area_matrix, cubic_matrix


def test_area_and_cubic_matrices_are_opencvs() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((90, 130)).astype(np.float32)
    down = cv2.resize(x, (57, 41), interpolation=cv2.INTER_AREA)
    assert np.abs(area_matrix(90, 41) @ x @ area_matrix(130, 57).T - down).max() < 1e-5
    up = cv2.resize(x, (301, 200), interpolation=cv2.INTER_CUBIC)
    ref = cubic_matrix(90, 200) @ x.astype(np.float64) @ cubic_matrix(130, 301).T
    assert np.abs(ref - up).max() < 1e-4


@pytest.mark.parametrize("op", ["gaussian_noise", "speckle_noise"])
def test_noise_seen_at_the_grain_grid_keeps_its_sigma(op: str) -> None:
    """On a large frame the noise, averaged back to the grain grid (what a model that resizes to
    448 px sees), has the table's sigma: the same as on a frame of that size."""
    h, w = 1080, 1440
    x = torch.full((1, 1, h, w), 0.5)
    out, rec = perturb.apply(x, op, 3, ["k"], protect_border=False)
    sigma = rec[0].params["sigma"] * (0.5 if op == "speckle_noise" else 1.0)
    seen = cv2.resize(out[0, 0].numpy() - 0.5, (round(w * GRAIN_CELLS / h), GRAIN_CELLS), interpolation=cv2.INTER_AREA)
    assert float(seen.std()) == pytest.approx(sigma, rel=0.05)
    small = torch.full((1, 1, GRAIN_CELLS, 600), 0.5)
    direct, _ = perturb.apply(small, op, 3, ["k"], protect_border=False)
    assert float((direct - 0.5).std()) == pytest.approx(sigma, rel=0.03)
    # spatially correlated at full resolution: neighbours share grain
    full = out[0, 0].numpy() - 0.5
    corr = np.corrcoef(full[:, :-1].ravel(), full[:, 1:].ravel())[0, 1]
    assert corr > 0.5


@pytest.mark.parametrize("op", ["gaussian_noise", "shot_noise", "speckle_noise", "impulse_noise"])
def test_grain_path_torch_matches_opencv(op: str) -> None:
    rng = np.random.default_rng(1)
    x = torch.from_numpy((rng.random((1, 3, 500, 620)) * 255).astype(np.uint8))
    out, recs = perturb.apply(x, op, 4, ["k"], protect_border=False)
    with use_backend("torch"):
        ref = perturb.replay(recs, x)
    diff = (out.int() - ref.int()).abs()
    # the grids agree to ~1e-7; a Poisson count can still flip at a rounding edge (one cell in
    # ~10^6), which the upsampled residual spreads over a few pixels by two levels at most
    assert int(diff.max()) <= 2 and float((diff > 1).float().mean()) < 1e-4
