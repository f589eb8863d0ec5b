"""The noise ops' CPU fast paths against a plain per-plane reference of the grain model.

The reference below is the straightforward form of ``perturb.ops.grain.grain_cpu``: each plane
area-averaged to the grain grid on its own, the per-pixel model, the residual resampled to the
frame plane by plane (``grain.field_matrix``), then the engine's float-to-level rounding
(``backend.store_float``). The fast path interleaves planes, reuses scratch buffers and rounds
with OpenCV; its bytes must be these.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from perturb.ops import backend, grain, noise

PARAMS = {
    "gaussian_noise_cpu": {"sigma": np.float32(0.065)},
    "speckle_noise_cpu": {"sigma": np.float32(0.13)},
    "impulse_noise_cpu": {"amount": np.float32(0.0225)},
    "shot_noise_cpu": {"photons": np.float32(100.0)},
}


def reference_grain(pixel_fn, src: np.ndarray, p: dict[str, np.ndarray], key: int) -> np.ndarray:
    c, h, w = src.shape
    gh, gw = grain.grid_shape(h, w)
    assert gh < h and gw < w
    full = backend.load_float(src)
    small = np.stack([cv2.resize(full[i], (gw, gh), interpolation=cv2.INTER_AREA) for i in range(c)])
    small = np.clip(small, np.float32(0.0), np.float32(1.0))
    noisy = np.empty_like(small)
    pixel_fn(small, noisy, p, key)
    residual = noisy - small
    rows = grain.field_matrix(gh, h).astype(np.float64)
    cols = grain.field_matrix(gw, w).astype(np.float64)
    # float64 sums rounded once to float32, plane by plane
    up = np.stack([(rows @ residual[i].astype(np.float64) @ cols.T).astype(np.float32) for i in range(c)])
    out = np.clip(up + full, np.float32(0.0), np.float32(1.0))
    res = np.empty_like(src)
    backend.store_float(out, res)
    return res


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("shape", [(3, 576, 720), (1, 460, 613), (2, 470, 500), (4, 457, 701)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_grain_fast_path_matches_per_plane_reference(name: str, shape: tuple[int, int, int], dtype: type) -> None:
    pixel_fn = getattr(noise, name)
    rng = np.random.default_rng(sum(shape))
    src = rng.integers(0, 256, shape, dtype=np.uint8)
    src[:, : shape[1] // 8] = 0  # dark and saturated bands: the clipping paths
    src[:, -shape[1] // 8 :] = 255
    if dtype == np.float32:
        src = backend.levels(np.dtype(np.uint8))[src]
    dst = np.empty_like(src)
    fast = backend.CPU_PATHS.get(name.removesuffix("_cpu")).fn  # the registered path
    for key in (3, 4):  # twice: the second call reuses the per-thread scratch buffers
        fast(src, dst, PARAMS[name], key)
        np.testing.assert_array_equal(dst, reference_grain(pixel_fn, src, PARAMS[name], key))


def test_store_u8_rounds_as_the_engine() -> None:
    """Values within a few thousand ulps of every level midpoint, out of range, and random."""
    mids = np.float32((np.arange(256) + 0.5) / 255.0).view(np.int32)
    near = (mids[:, None] + np.arange(-2000, 2000, dtype=np.int32)[None, :]).view(np.float32)
    rand = np.random.default_rng(0).uniform(-0.2, 1.2, 10**5).astype(np.float32)
    values = np.concatenate([near.ravel(), rand, np.float32([-1.0, -0.0, 0.0, 1.0, 2.0])])
    values = values[: values.size // 100 * 100].reshape(1, -1, 100)
    expected = np.empty(values.shape, np.uint8)
    backend.store_float(np.clip(values, np.float32(0.0), np.float32(1.0)), expected)
    got = np.empty(values.shape, np.uint8)
    grain._store_u8(values.copy(), got)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_impulse_pixel_path_sets_whole_pixels(dtype: type) -> None:
    """Salt and pepper hit all channels of a pixel; other pixels are untouched."""
    src = np.full((3, 64, 80), 100, np.uint8)
    if dtype == np.float32:
        src = backend.levels(np.dtype(np.uint8))[src]
    dst = np.empty_like(src)
    noise.impulse_noise_cpu(src, dst, {"amount": np.float32(0.2)}, 9)
    white = 255 if dtype == np.uint8 else 1.0
    pepper = (dst == 0).all(axis=0)
    salt = (dst == white).all(axis=0)
    assert 0.07 < pepper.mean() < 0.13 and 0.07 < salt.mean() < 0.13
    np.testing.assert_array_equal(dst[:, ~pepper & ~salt], src[:, ~pepper & ~salt])
    assert ((dst == src) | (dst == 0) | (dst == white)).all()
