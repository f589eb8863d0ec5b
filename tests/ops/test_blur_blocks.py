"""The CPU path of the 2-D PSF blurs (motion_blur, defocus_blur): the PSF split into blocks
that OpenCV correlates directly, summed, against an independent reference (SciPy's
``ndimage.correlate`` in float64, ``mirror`` = OpenCV's BORDER_REFLECT_101)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.ops import blur


def _reference(src: np.ndarray, psf: np.ndarray) -> np.ndarray:
    planes = src.astype(np.float64)
    return np.stack([scipy.ndimage.correlate(p, psf.astype(np.float64), mode="mirror") for p in planes])


def _psf(kind: str, size: float, angle: float) -> np.ndarray:
    return blur.line_psf(size, angle) if kind == "line" else blur.disk_psf(size / 4.0)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["line", "disk"]),
    size=st.floats(1.0, 120.0),
    angle=st.floats(0.0, 180.0),
)
def test_blocks_cover_the_psf_exactly_under_the_direct_size(kind: str, size: float, angle: float) -> None:
    psf = _psf(kind, size, angle)
    blocks = blur.psf_blocks(psf)
    if blocks is None:  # left to the DFT: a PSF with many taps
        assert np.count_nonzero(psf) > blur._DIRECT_MAX_TAPS
        return
    rebuilt = np.zeros_like(psf)
    for row, col, block in blocks:
        assert block.size <= blur._DIRECT_AREA  # OpenCV correlates it directly, not by DFT
        assert not rebuilt[row : row + block.shape[0], col : col + block.shape[1]].any()  # disjoint
        rebuilt[row : row + block.shape[0], col : col + block.shape[1]] = block
    np.testing.assert_array_equal(rebuilt, psf)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["line", "disk"]),
    size=st.floats(1.0, 80.0),
    angle=st.floats(0.0, 180.0),
    height=st.integers(2, 48),
    width=st.integers(2, 48),
    seed=st.integers(0, 2**16),
)
def test_correlation_matches_scipy(
    kind: str, size: float, angle: float, height: int, width: int, seed: int
) -> None:
    """uint8 within rounding of the float64 sums, float32 within float error (tiny images too:
    the PSF may be larger than the image, reflected more than once)."""
    psf = _psf(kind, size, angle)
    src = np.random.default_rng(seed).integers(0, 256, (3, height, width), dtype=np.uint8)
    ref = _reference(src, psf)
    out = np.empty_like(src)
    blur.correlate_sample(src, out, psf)
    assert np.abs(out - ref).max() <= 0.5 + 1e-3
    as_float = src.astype(np.float32) / np.float32(255.0)
    out_f = np.empty_like(as_float)
    blur.correlate_sample(as_float, out_f, psf)
    assert np.abs(out_f - np.clip(ref / 255.0, 0.0, 1.0)).max() < 1e-5


@pytest.mark.parametrize("psf", [blur.line_psf(17.0, 33.0), blur.line_psf(58.0, 10.0), blur.disk_psf(6.0), blur.disk_psf(18.0)])
def test_frame_sized_correlation_matches_scipy(psf: np.ndarray) -> None:
    """A frame-sized plane through both paths (blocks; the DFT for the large disk), and a second
    call of another size on the same thread's buffers."""
    rng = np.random.default_rng(0)
    for shape in [(1, 200, 260), (1, 120, 90)]:
        src = rng.integers(0, 256, shape, dtype=np.uint8)
        out = np.empty_like(src)
        blur.correlate_sample(src, out, psf)
        assert np.abs(out - _reference(src, psf)).max() <= 0.5 + 1e-3
    assert (blur.psf_blocks(psf) is None) == (np.count_nonzero(psf) > blur._DIRECT_MAX_TAPS)
