"""Noise grain relative to the shorter side (perturb.ops.grain)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.ops import grain
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
    # the grids agree to ~1e-7 (the torch path's exact sums round each sample to 2**-24 of its
    # peak); a Poisson count can still flip at a rounding edge (one cell in ~10^6), which the
    # upsampled residual spreads over a few pixels by three levels at most
    assert int(diff.max()) <= 3 and float((diff > 1).float().mean()) < 1e-4


@pytest.mark.parametrize("short", [252, 336, 448])
def test_noise_resized_after_equals_noise_on_the_resized_frame(short: int) -> None:
    """A 1080x1920 frame noised then area-resized to ``short`` px shows the noise of the frame
    resized first and then noised: the same realisation (correlation) at the same strength, for
    sizes below the grain grid too (448 px on the longer side of 16:9 is a 252 px shorter side)."""
    x = np.full((1080, 1920, 3), 128, np.uint8)

    def noised(img: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(img).permute(2, 0, 1)[None].contiguous()
        out, _ = perturb.apply(t, "gaussian_noise", 5, ["k"], protect_border=False)
        return out[0].permute(1, 2, 0).numpy().astype(np.float32) - 128

    def resized(img: np.ndarray) -> np.ndarray:
        w = round(img.shape[1] * short / img.shape[0])
        return cv2.resize(img, (w, short), interpolation=cv2.INTER_AREA)

    after = resized(noised(x).__add__(128).astype(np.uint8)).astype(np.float32) - 128
    before = noised(resized(x))
    assert float(np.corrcoef(after.ravel(), before.ravel())[0, 1]) > 0.99
    assert float(after.std()) == pytest.approx(float(before.std()), rel=0.08)


def test_field_of_the_grid_size_is_the_grid_low_passed_by_its_pixel() -> None:
    """At the grid's own size the field is the residual integrated over each cell (a box:
    sinc response), scaled so white noise keeps its standard deviation; above it, the
    band-limited interpolation passes the grid samples through at the cell centres."""
    g = 64
    m = grain.field_matrix(g, g).astype(np.float64)
    white = np.random.default_rng(3).standard_normal((g, 4000))
    assert float((m @ white).std()) == pytest.approx(1.0, rel=0.03)
    up = grain.field_matrix(g, 3 * g).astype(np.float64) / grain.field_gain(g)
    assert np.allclose(up[1::3], np.eye(g), atol=1e-5)  # centres of the fine pixels 1, 4, ...


@pytest.mark.slow
@pytest.mark.parametrize("op", ["gaussian_noise", "shot_noise"])
def test_resolution_invariance_on_every_sample_frame_and_severity(op: str) -> None:
    """On each real frame with a shorter side of at least 1000 px (PERTURB_SAMPLES_DIR), at every
    severity: field SSIM of "op on the stored frame, then resize" and "resize, then op" within
    INVARIANCE_TOLERANCE, at the calibration's 448 px shorter side and at 252 px (a 16:9 frame
    resized to 448 px on its longer side)."""
    from perturb.calibrate.metrics import Reference, resize_short
    from perturb.calibrate.run import INVARIANCE_TOLERANCE, _perturb, load_images
    from perturb.scene import scene as scene_of
    from tests.helpers import SAMPLES, require_samples

    require_samples()
    frames = [(n, img) for n, img in load_images(SAMPLES / "endoscopy") if min(img.shape[:2]) >= 1000]
    assert frames, "no frame of 1000 px or more in the sample set"
    bad = []
    for name, img in frames:
        s = scene_of(img)
        big = _perturb(img, op, [1, 2, 3, 4, 5], f"{name}#inv", s)
        for short in (448, 252):
            ref = Reference.of(img, s.tissue, short=short)
            small = resize_short(img, short)
            after = _perturb(small, op, [1, 2, 3, 4, 5], f"{name}#inv", scene_of(small))
            for sev, (b, a) in enumerate(zip(big, after, strict=True), start=1):
                gap = abs(ref.score("field_ssim", b) - ref.score("field_ssim", a))
                if gap > INVARIANCE_TOLERANCE:
                    bad.append(f"{name} s{sev} at {short} px: {gap:.3f}")
    assert not bad, bad


@pytest.mark.parametrize(("g", "n"), [(448, 1001), (448, 300), (449, 1000), (96, 50), (95, 95)])
def test_field_and_area_without_matrices_equal_the_matrix_products(
    g: int, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An axis whose (n, g) matrix would pass ``DENSE_ENTRIES`` (a 65000x900 frame: 65000 x
    32356 entries) takes the same sums by FFT and by a running sum: equal within float32."""
    rng = np.random.default_rng(g + n)
    residual = rng.standard_normal((3, 5, g)).astype(np.float32)
    dense = residual @ grain.field_matrix(g, n).T
    frame = torch.from_numpy(rng.random((2, 3, 2 * n + 3, 7)).astype(np.float32))
    area = grain._area_axis_torch(frame, n, -2)
    monkeypatch.setattr(grain, "DENSE_ENTRIES", 0)
    assert np.abs(grain._field_fft(residual, n, 2) - dense).max() < 2e-5
    torch_field = grain._field_axis_torch(torch.from_numpy(residual), n, -1).numpy()
    assert np.abs(torch_field - dense).max() < 2e-5
    assert torch.allclose(grain._area_axis_torch(frame, n, -2), area, atol=1e-6)
    kept = float((grain._field_weights(g, g) ** 2).sum(axis=1).mean())
    assert grain._kept_power(g) == pytest.approx(kept, rel=1e-12)


def test_noise_on_an_extreme_aspect_frame_needs_no_dense_matrix() -> None:
    """900 x 20000 (grid 448 x 9956): the long axis by FFT; the result is noise of the table's
    strength (not the 15 GB matrix a 65000 x 900 frame used to ask for)."""
    x = torch.full((1, 3, 900, 20000), 128, dtype=torch.uint8)
    out, _ = perturb.apply(x, "gaussian_noise", 3, ["strip"])
    diff = out.float() - x.float()
    assert 1.0 < float(diff.std()) < 40.0 and abs(float(diff.mean())) < 1.0
