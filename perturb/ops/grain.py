"""Noise grain relative to the shorter side (resolution invariance of sensor noise).

An endoscope's sensor noise reaches the recorded frame after demosaicing and the video
processor's scaling, so it is spatially correlated at the scale of the sensor's pixels, not of
the stored file's. Noise ops therefore draw their per-pixel model on a grid of
``GRAIN_CELLS`` cells across the image's shorter side: on a larger frame the model runs on the
frame averaged to that grid (INTER_AREA), and the residual (noisy minus clean, on the grid) is
upsampled bicubically and added to the full-resolution frame. A frame whose shorter side is at
most ``GRAIN_CELLS`` gets the per-pixel model directly. So "noise on a 1920x1080 frame, then
resize to 448 px" and "resize, then noise" agree (perturb calibrate measures it).

Both paths take the same grid: OpenCV's INTER_AREA on the host, the same area weights as a
matrix product in torch; OpenCV's INTER_CUBIC and torch's bicubic (A = -0.75, half-pixel
centres) agree to ~1e-4 of the residual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb.ops import backend
from perturb.ops._math import plane2d, scratch, split_into

GRAIN_CELLS = 448


def grid_shape(h: int, w: int) -> tuple[int, int] | None:
    """(gh, gw) of the grain grid of an h x w frame, or None where the frame is small enough
    to take the per-pixel model."""
    short = min(h, w)
    if short <= GRAIN_CELLS:
        return None
    return max(1, round(h * GRAIN_CELLS / short)), max(1, round(w * GRAIN_CELLS / short))


@lru_cache(maxsize=16)
def area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float32 weights of OpenCV's INTER_AREA downscaling along one axis: output
    pixel i averages input [i s, (i + 1) s), s = n_in / n_out, by fractional overlap."""
    s = n_in / n_out
    lo = np.arange(n_out)[:, None] * s
    hi = lo + s
    j = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(hi, j + 1) - np.maximum(lo, j), 0.0, None) / s
    out = overlap.astype(np.float32)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=16)
def cubic_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float64 weights of bicubic upsampling along one axis as OpenCV's
    INTER_CUBIC and torch's bicubic compute it (A = -0.75, half-pixel centres, edge clamped)."""
    a = -0.75
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    base = np.floor(src)
    t = src - base
    coeffs = [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]
    out = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    for k, c in enumerate(coeffs):
        np.add.at(out, (rows, np.clip(base.astype(np.int64) - 1 + k, 0, n_in - 1)), c)
    return out


@lru_cache(maxsize=16)
def gain(h: int, w: int) -> float:
    """Factor on the upsampled residual that keeps the noise's standard deviation when the
    frame is averaged back to the grain grid: bicubic upsampling then area averaging keeps a
    fraction of white noise's variance (about 0.5 at 2x-4x), computed per axis from the weights."""
    grid = grid_shape(h, w)
    if grid is None:
        return 1.0
    kept = 1.0
    for n, g in ((h, grid[0]), (w, grid[1])):
        chain = area_matrix(n, g).astype(np.float64) @ cubic_matrix(g, n)
        kept *= float((chain**2).sum(axis=1).mean())
    return float(np.float32(1.0 / np.sqrt(kept)))


def _down_torch(x: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    h, w = x.shape[-2:]
    dh = torch.from_numpy(area_matrix(h, gh).copy()).to(x.device, x.dtype)
    dw = torch.from_numpy(area_matrix(w, gw).copy()).to(x.device, x.dtype)
    return torch.matmul(torch.matmul(dh, x), dw.t())


def grain_kernel(pixel_kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A batched noise kernel with grain relative to the shorter side, from its per-pixel form."""

    def kernel(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], **kw: Any) -> torch.Tensor:
        h, w = x.shape[-2:]
        grid = grid_shape(h, w)
        if grid is None:
            return pixel_kernel(x, p, keys, **kw)
        small = _down_torch(x, *grid).clamp_(0.0, 1.0)
        residual = pixel_kernel(small, p, keys, **kw) - small
        up = F.interpolate(residual, size=(h, w), mode="bicubic", align_corners=False)
        return (x + up * gain(h, w)).clamp_(0.0, 1.0)

    kernel.__doc__ = pixel_kernel.__doc__
    return kernel


@lru_cache(maxsize=16)
def _interleaved_area_exact(c: int, h: int, w: int, gh: int, gw: int) -> bool:
    """Whether OpenCV's INTER_AREA of a c-channel interleaved h x w image gives, bit for bit,
    the per-plane results (checked once per shape on a seeded random probe)."""
    probe = np.random.default_rng(0).random((c, h, w), dtype=np.float32)
    planes = [cv2.resize(probe[i], (gw, gh), interpolation=cv2.INTER_AREA) for i in range(c)]
    merged = cv2.resize(cv2.merge(list(probe)), (gw, gh), interpolation=cv2.INTER_AREA)
    return bool(np.array_equal(np.stack(planes, axis=-1), merged.reshape(gh, gw, c)))


def _area_down(full: np.ndarray, gh: int, gw: int, out: np.ndarray) -> None:
    """``out`` (C, gh, gw) = OpenCV's INTER_AREA of each plane of ``full`` (C, H, W), float32.

    2 to 4 planes are resized as one interleaved image, at about half the cost of resizing
    plane by plane: OpenCV computes each channel of a pixel with a single plane's weights in
    the same order, so the values are the per-plane ones (``_interleaved_area_exact`` checks
    it once per shape; plane by plane where it does not hold)."""
    c, h, w = full.shape
    if not 1 < c <= 4 or not _interleaved_area_exact(c, h, w, gh, gw):
        for i in range(c):
            cv2.resize(full[i], (gw, gh), dst=out[i], interpolation=cv2.INTER_AREA)
        return
    merged = scratch("grain_area_in", (h, w, c), np.float32)
    cv2.merge(list(full), dst=merged)
    small = scratch("grain_area_out", (gh, gw, c), np.float32)
    cv2.resize(merged, (gw, gh), dst=small, interpolation=cv2.INTER_AREA)
    split_into(small, out)


def _store_u8(res: np.ndarray, dst: np.ndarray) -> None:
    """``backend.store_float(res, dst)`` for a contiguous uint8 ``dst``, overwriting ``res``:
    negative values to 0, then OpenCV's rounding (half to even) and saturation of 255 * x,
    which is the engine's ``round(255 * clip(x, 0, 1))``."""
    flat = plane2d(res)
    cv2.max(flat, 0.0, dst=flat)  # type: ignore[call-overload]  # a scalar bound
    cv2.convertScaleAbs(flat, dst=plane2d(dst), alpha=255.0)


def _load_float(src: np.ndarray) -> np.ndarray:
    """``backend.load_float(src)``, a uint8 sample's into a per-thread scratch array."""
    if src.dtype != np.uint8 or not src.flags.c_contiguous:
        return backend.load_float(src)
    full = scratch("grain_full", src.shape, np.float32)
    cv2.LUT(plane2d(src), backend.levels(src.dtype), dst=plane2d(full))
    return full


def _add_residual(residual: np.ndarray, full: np.ndarray, dst: np.ndarray) -> None:
    """``dst`` = the frame ``full`` plus the grid ``residual`` upsampled bicubically (times
    ``gain``), clipped and stored in ``dst``'s dtype."""
    c, h, w = full.shape
    out = scratch("grain_out", (c, h, w), np.float32)
    for i in range(c):
        cv2.resize(residual[i], (w, h), dst=out[i], interpolation=cv2.INTER_CUBIC)
    out *= np.float32(gain(h, w))
    out += full
    if dst.dtype == np.uint8 and dst.flags.c_contiguous:
        _store_u8(out, dst)
        return
    np.clip(out, np.float32(0.0), np.float32(1.0), out=out)
    backend.store_float(out, dst)


def grain_cpu(pixel_fn: backend.CpuFn) -> backend.CpuFn:
    """The CPU fast path with grain relative to the shorter side, from its per-pixel form (which
    must read float32 samples)."""

    def fn(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, **kw: Any) -> None:
        c, h, w = src.shape
        grid = grid_shape(h, w)
        if grid is None:
            pixel_fn(src, dst, p, key, **kw)
            return
        gh, gw = grid
        full = _load_float(src)
        small = scratch("grain_small", (c, gh, gw), np.float32)
        _area_down(full, gh, gw, small)
        np.clip(small, np.float32(0.0), np.float32(1.0), out=small)
        noisy = scratch("grain_noisy", (c, gh, gw), np.float32)
        pixel_fn(small, noisy, p, key, **kw)
        noisy -= small
        _add_residual(noisy, full, dst)

    fn.__doc__ = pixel_fn.__doc__
    return fn


@lru_cache(maxsize=16)
def area_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's INTER_AREA weights along one axis as it applies them: (n_out, K) source indices
    and float32 weights of each output, in its summation order (increasing source index),
    padded with weight 0. Read from OpenCV itself: a column whose ones are ``period`` rows
    apart, area-resized, gives each output's weight of each source row (at most one one falls
    in an output's window)."""
    period = min(n_in, 2 * int(np.ceil(n_in / n_out)) + 4)
    comb = (np.arange(n_in)[:, None] % period == np.arange(period)[None, :]).astype(np.float32)
    resized = cv2.resize(comb, (period, n_out), interpolation=cv2.INTER_AREA)  # (n_out, period)
    weights = resized[:, np.arange(n_in) % period]  # (n_out, n_in), the window's weights and aliases
    src = np.arange(n_in)[None, :]
    out = np.arange(n_out)[:, None]
    near = (src * n_out >= out * n_in - n_out) & (src * n_out < (out + 1) * n_in + n_out)  # window +- 1
    weights = np.where(near, weights, np.float32(0.0))
    width = int((weights > 0).sum(axis=1).max())
    index = np.zeros((n_out, width), dtype=np.intp)
    taps = np.zeros((n_out, width), dtype=np.float32)
    for i in range(n_out):
        sources = np.flatnonzero(weights[i] > 0)
        index[i, :] = sources[0]
        index[i, : sources.size] = sources
        taps[i, : sources.size] = weights[i, sources]
    for a in (index, taps):
        a.flags.writeable = False
    return index, taps


def area_at(full: np.ndarray, gh: int, gw: int, cells: np.ndarray) -> np.ndarray:
    """(C, n) values of OpenCV's INTER_AREA of ``full`` (C, H, W) to (gh, gw) at the flat grid
    cells ``cells`` only, with its arithmetic: each source row's weighted sum across, then the
    rows' weighted sum, float32 in OpenCV's order (``_area_at_exact`` checks it per shape)."""
    c, h, w = full.shape
    ys, xs = np.divmod(cells, gw)
    rows, beta = area_taps(h, gh)
    cols, alpha = area_taps(w, gw)
    flat = (rows[ys][:, :, None] * w + cols[xs][:, None, :]).reshape(cells.size, rows.shape[1] * cols.shape[1])
    values = np.take(full.reshape(c, -1), flat, axis=1).reshape(c, cells.size, rows.shape[1], cols.shape[1])
    a = alpha[xs][None, :, None, :]
    across = values[..., 0] * a[..., 0]
    for k in range(1, cols.shape[1]):
        across += values[..., k] * a[..., k]
    b = beta[ys][None, :, :]
    out = across[..., 0] * b[..., 0]
    for k in range(1, rows.shape[1]):
        out += across[..., k] * b[..., k]
    return out


@lru_cache(maxsize=16)
def _area_at_exact(h: int, w: int, gh: int, gw: int) -> bool:
    """Whether ``area_at`` gives OpenCV's INTER_AREA values bit for bit for this shape (every
    cell of a seeded random probe)."""
    probe = np.random.default_rng(1).random((1, h, w), dtype=np.float32)
    expected = cv2.resize(probe[0], (gw, gh), interpolation=cv2.INTER_AREA).reshape(1, -1)
    got = np.concatenate([area_at(probe, gh, gw, cells) for cells in np.array_split(np.arange(gh * gw), 16)], axis=1)
    return bool(np.array_equal(got, expected))


SitesFn = Callable[[int, int, dict[str, np.ndarray], int], tuple[np.ndarray, np.ndarray]]


def grain_cpu_sites(pixel_fn: backend.CpuFn, sites_fn: SitesFn) -> backend.CpuFn:
    """``grain_cpu(pixel_fn)`` for a model that sets some pixels to black or white (all
    channels) and leaves the others as they are; ``sites_fn(h, w, params, key)`` gives those
    pixels' flat indices (black, white; white wins where both), as ``pixel_fn`` sets them. The
    residual on the grid is then zero but at those cells, so the frame's grid average is
    computed there only (``area_at``): the same bytes as ``grain_cpu(pixel_fn)``."""
    dense = grain_cpu(pixel_fn)

    def fn(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, **kw: Any) -> None:
        c, h, w = src.shape
        grid = grid_shape(h, w)
        if grid is None or not _area_at_exact(h, w, *grid):
            dense(src, dst, p, key, **kw)
            return
        gh, gw = grid
        full = _load_float(src)
        black, white = sites_fn(gh, gw, p, key)
        cells = np.concatenate([black, white])
        small = area_at(full, gh, gw, cells)
        np.clip(small, np.float32(0.0), np.float32(1.0), out=small)
        residual = scratch("grain_noisy", (c, gh, gw), np.float32)
        residual.fill(0.0)
        flat = residual.reshape(c, -1)
        flat[:, black] = np.float32(0.0) - small[:, : black.size]
        flat[:, white] = np.float32(1.0) - small[:, black.size :]
        _add_residual(residual, full, dst)

    fn.__doc__ = pixel_fn.__doc__
    return fn
