"""The CPU paths' 8-bit lookup (``perturb.ops._math.lut_u8``, OpenCV's LUT) gives NumPy's
``table[src]`` on every layout, and refuses arrays it would not read whole."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from perturb.ops import _math
from perturb.ops._math import LEVELS_ROW_U8, gain_table_u8, lut_u8


def _case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (3, 37, 53), dtype=np.uint8), rng.integers(0, 256, 256, dtype=np.uint8)


def test_whole_sample_and_planes() -> None:
    src, table = _case(0)
    dst = np.zeros_like(src)
    lut_u8(src, dst, table)
    assert np.array_equal(dst, table[src])
    plane = np.zeros_like(src[1])
    lut_u8(src[1], plane, table)
    assert np.array_equal(plane, table[src[1]])


def test_strided_views_and_in_place() -> None:
    src, table = _case(1)
    dst = np.full_like(src, 7)
    lut_u8(src[:, 3:20, 5:40], dst[:, 3:20, 5:40], table)  # a box of a frame: not contiguous
    expected = np.full_like(src, 7)
    expected[:, 3:20, 5:40] = table[src[:, 3:20, 5:40]]
    assert np.array_equal(dst, expected)
    work = src.copy()
    lut_u8(work, work, table)
    assert np.array_equal(work, table[src])


def test_read_only_table_and_source() -> None:
    src, table = _case(2)
    src.flags.writeable = False
    table.flags.writeable = False
    dst = np.empty_like(src)
    lut_u8(src, dst, table)
    assert np.array_equal(dst, table[src])


@pytest.mark.parametrize("gain", [0.55, 0.8, 0.97, 1.0, 1.08, 1.6, 2.5])
def test_gain_table_gives_the_transform_or_exact_bytes(gain: float) -> None:
    """The table of one gain is either OpenCV's affine transform on the 256 levels (the bytes it
    writes on any plane) or the exact linear-light table, and within one level of the latter."""
    table = gain_table_u8(gain)
    exact = _math.linear_gain_table_u8(np.float32(gain))
    assert int(np.abs(table.astype(np.int16) - exact).max()) <= 1
    k = float(np.float32(gain)) ** (1.0 / 2.4)
    affine = np.array([[k, 255.0 * 0.055 * (k - 1.0)]], dtype=np.float32)
    plane = np.random.default_rng(3).integers(0, 256, (41, 67), dtype=np.uint8)
    if not np.array_equal(table, exact):
        assert np.array_equal(table[plane], cv2.transform(plane, affine))
    assert np.array_equal(cv2.transform(LEVELS_ROW_U8, affine)[0][plane], cv2.transform(plane, affine))


@pytest.mark.parametrize(
    "src, dst, table",
    [
        (np.zeros(1000, np.uint16), np.zeros(1000, np.uint16), np.arange(256, dtype=np.uint8)),
        (np.zeros(1000, np.uint8), np.zeros(999, np.uint8), np.arange(256, dtype=np.uint8)),
        (np.zeros((2, 500), np.uint8), np.zeros(1000, np.uint8), np.arange(256, dtype=np.uint8)),
        (np.zeros(1000, np.uint8), np.zeros(1000, np.uint8), np.arange(100, dtype=np.uint8)),
    ],
    ids=["uint16", "short-dst", "other-shape", "short-table"],
)
def test_misuse_raises(src: np.ndarray, dst: np.ndarray, table: np.ndarray) -> None:
    """A uint16 sample, arrays of two shapes, a short table: refused with the reason."""
    with pytest.raises(ValueError, match="lut_u8 takes uint8 arrays of one shape"):
        lut_u8(src, dst, table)
