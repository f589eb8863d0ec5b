"""Noise grain relative to the field of view (resolution invariance of sensor noise).

An endoscope's sensor noise reaches the recorded frame after demosaicing and the video
processor's scaling, so it is spatially correlated at the scale of the sensor's pixels, not of
the stored file's. Noise ops therefore run their per-pixel model on a nominal sensor: a grid of
``GRAIN_CELLS`` cells across the image's shorter side (the extent of the endoscope's field of
view, which spans the frame's shorter side), whatever the frame's resolution:

1. the frame brought to the grid: averaged down (OpenCV's INTER_AREA) when larger, bicubic up
   when smaller, as is when it is the grid;
2. the per-pixel model on the grid; its residual (noisy minus clean) is the sensor's noise;
3. the residual resampled to the frame as a band-limited field (the sensor's samples, Shannon
   reconstruction: Fourier interpolation) integrated over each frame pixel's footprint (a box,
   as a pixel or an area resize integrates light), times a constant ``field_gain`` that keeps
   the table's per-pixel statistics at the grid's own size. Separable: one (n, g) real matrix
   per axis (``field_matrix``).

Why the field: "noise on a 1920x1080 frame, then resize to s" must equal "resize to s, then
noise" for every s. Box integration composes (a box of a box-integrated field is the coarser
box) and the band-limited field keeps every frequency of the grid, so both orders give the
field integrated over the size-s pixel, at any s. The earlier bicubic upsampling lost half the
residual's variance near the grid's Nyquist frequency and made it up with a frame-dependent
gain: right when measured at exactly the grid size (448 px, the project's own check), 1.47x too
strong at a 252 px shorter side (a 16:9 frame resized to 448 px on its longer side), where the
per-pixel model on small frames was in turn too strong: gaps of 0.05-0.12 field SSIM.

Both paths take the same grid: OpenCV's INTER_AREA on the host, the same area weights as a
matrix product in torch (large frames); float64 bicubic matrices rounded once (small frames).
The field matrices are float32 products on both paths (within ~1e-6 of each other).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch

from perturb.ops import backend, exact
from perturb.ops._math import _graph, plane2d, scratch, split_into

GRAIN_CELLS = 448


def grid_shape(h: int, w: int) -> tuple[int, int]:
    """(gh, gw) of the grain grid of an h x w frame: ``GRAIN_CELLS`` across the shorter side.
    A sliver (a shorter side of a few pixels beside a long one) would need a grid of billions
    of cells: where the grid passes four times both the frame and a square grid, the noise
    model runs on the frame's own pixels instead."""
    short = min(h, w)
    gh, gw = max(1, round(h * GRAIN_CELLS / short)), max(1, round(w * GRAIN_CELLS / short))
    if gh * gw > 4 * max(h * w, GRAIN_CELLS * GRAIN_CELLS):
        return h, w
    return gh, gw


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
    """(n_out, n_in) float64 weights of bicubic resampling along one axis as OpenCV's
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
    out.flags.writeable = False
    return out


def _field_weights(g: int, n: int) -> np.ndarray:
    """(n, g) float64: the band-limited field of g grid samples (periodic Fourier
    interpolation, the Nyquist term split evenly) seen by n pixels spanning the same extent.
    Pixels finer than the cells (n > g) sample it at their centres; pixels of a cell or coarser
    (n <= g) integrate it over their footprint of g / n cells (frequency response sinc(k / n);
    the frequencies above their Nyquist alias as an area resize aliases them). So an area
    resize of a finer frame to n <= g pixels (itself a box over each coarse pixel) and the
    field at n agree: sinc(k / n) both ways."""
    k = np.arange(-(g // 2), g // 2 + 1)
    weight = np.where(np.abs(k) * 2 == g, 0.5, 1.0) * (np.sinc(k / n) if n <= g else 1.0)
    centres = (np.arange(n) + 0.5) * (g / n) - 0.5  # pixel centres in cell units
    phase = 2 * np.pi * np.outer(centres, k) / g  # (n, K)
    cells = 2 * np.pi * np.outer(k, np.arange(g)) / g  # (K, g)
    # Re(sum_k w_k e^{i (phase - cells)}) / g, as two real products
    return ((np.cos(phase) * weight) @ np.cos(cells) + (np.sin(phase) * weight) @ np.sin(cells)) / g


DENSE_ENTRIES = 1 << 24  # an axis's (n, g) matrix up to this size is built; beyond, by FFT


@lru_cache(maxsize=16)
def field_gain(g: int) -> float:
    """Constant factor on the field along an axis of g cells: the inverse of the standard
    deviation of white noise the field keeps on a frame of the grid's own size (0.88 per axis),
    so a table's sigma is the per-pixel noise at the grid's size. It depends on the grid only
    (the frame's aspect), never on the frame's size: both resize orders share it. Large grids
    (an extreme aspect ratio) take the closed form of the same sum (Parseval; ``_kept_power``)."""
    if g * g > DENSE_ENTRIES:
        return float(1.0 / np.sqrt(_kept_power(g)))
    kept = float((_field_weights(g, g) ** 2).sum(axis=1).mean())
    return float(1.0 / np.sqrt(kept))


def _frequencies(g: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, w_k) of ``_field_weights``: the frequencies of g cells and their weights at n pixels."""
    k = np.arange(-(g // 2), g // 2 + 1)
    weight = np.where(np.abs(k) * 2 == g, 0.5, 1.0) * (np.sinc(k / n) if n <= g else 1.0)
    return k, weight


def _kept_power(g: int) -> float:
    """Mean over rows of the squared row sums of ``_field_weights(g, g)``, in closed form: each
    row is a trigonometric sum over k at integer cell centres, so by Parseval its power is
    sum_k w_k^2 / g, the two Nyquist halves (even g) adding into one bin of full weight."""
    k, weight = _frequencies(g, g)
    nyquist = np.abs(k) * 2 == g
    return float(((weight[~nyquist] ** 2).sum() + (weight[nyquist].sum()) ** 2) / g)


def _field_spectrum(g: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin, factor) mapping the DFT of g cells (numpy's order) onto the n-point inverse DFT
    whose real part is the field at n pixels: ``T[bin] += factor * R[k mod g]``; the field is
    ``Re(n * ifft(T))`` (``_field_fft``). Pixel centres (i + 0.5) g / n - 0.5 in cell units
    give the phase exp(i pi k / n - i pi k / g); frequencies fold modulo n where n <= g."""
    k, weight = _frequencies(g, n)
    factor = weight * np.exp(1j * np.pi * k * (1.0 / n - 1.0 / g)) * field_gain(g) / g
    return np.mod(k, n), factor


def _field_fft(residual: np.ndarray, n: int, axis: int) -> np.ndarray:
    """``field_matrix(g, n)`` applied along ``axis`` of a float32 array without the (n, g)
    matrix: the same trigonometric sum by FFT, in blocks of rows (memory bounded by the block).
    Within ~1e-6 of the matrix product (float64 FFTs rounded once)."""
    moved = np.moveaxis(residual, axis, -1)
    g = moved.shape[-1]
    flat = moved.reshape(-1, g)
    bins, factor = _field_spectrum(g, n)
    source = np.mod(np.arange(-(g // 2), g // 2 + 1), g)
    out = np.empty((flat.shape[0], n), np.float32)
    rows = max(1, (1 << 22) // max(n, g))
    for start in range(0, flat.shape[0], rows):
        block = np.fft.fft(flat[start : start + rows].astype(np.float64), axis=-1)
        spectrum = np.zeros((n, block.shape[0]), np.complex128)  # bins first: add.at folds
        np.add.at(spectrum, bins, (block[:, source] * factor).T)
        out[start : start + rows] = (np.fft.ifft(spectrum, axis=0).real.T * n).astype(np.float32)
    return np.moveaxis(out.reshape(*moved.shape[:-1], n), -1, axis)


@lru_cache(maxsize=16)
def field_matrix(g: int, n: int) -> np.ndarray:
    """(n, g) float32: the residual on g grid cells as the field seen by n frame pixels
    (``_field_weights``) times ``field_gain(g)``."""
    out = (_field_weights(g, n) * field_gain(g)).astype(np.float32)
    out.flags.writeable = False
    return out


def _to_grid_torch(x: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    """The frame on its grain grid (a fresh tensor): area weights when larger (float32
    products, as OpenCV's INTER_AREA), bicubic weights when smaller (float64, rounded once),
    as is when it is."""
    h, w = x.shape[-2:]
    if (h, w) == (gh, gw):
        return x.clone()
    if h > gh:
        return _area_axis_torch(_area_axis_torch(x, gh, -2), gw, -1)
    uh = torch.from_numpy(cubic_matrix(h, gh).copy()).to(x.device)
    uw = torch.from_numpy(cubic_matrix(w, gw).copy()).to(x.device)
    return exact.separable(uh, x.double(), uw).to(x.dtype)


def to_grid_torch(x: torch.Tensor) -> torch.Tensor:
    """The (..., H, W) frame on its grain grid (``grid_shape``; a fresh tensor): averaged down
    when larger, bicubic up when smaller, as is when it is the grid."""
    return _to_grid_torch(x, *grid_shape(*x.shape[-2:]))


def _area_axis_torch(x: torch.Tensor, n_out: int, dim: int) -> torch.Tensor:
    """Area downscaling along ``dim`` (-2 or -1): the ``area_matrix`` product, or for an axis
    whose matrix would pass ``DENSE_ENTRIES`` the same fractional-overlap means from a float64
    running sum read at each output pixel's bounds (no (n_out, n_in) matrix)."""
    n_in = x.shape[dim]
    if n_in * n_out <= DENSE_ENTRIES or exact.is_exact(x):  # exact sums: no running sum
        m = torch.from_numpy(area_matrix(n_in, n_out).copy()).to(x.device, x.dtype)
        return exact.rows_product(m, x) if dim == -2 else exact.cols_product(x, m.t())
    moved = x.movedim(dim, -1).to(torch.float64)
    total = torch.nn.functional.pad(moved.cumsum(-1), (1, 0))  # total[..., j] = sum of x[:j]
    bounds = np.arange(n_out + 1) * (n_in / n_out)
    whole = np.minimum(np.floor(bounds).astype(np.int64), n_in - 1)
    frac = torch.from_numpy(bounds - whole).to(x.device)
    at = torch.from_numpy(whole).to(x.device)
    step = total.index_select(-1, at + 1) - total.index_select(-1, at)  # x at each bound's cell
    running = total.index_select(-1, at) + frac * step  # the running sum at each bound
    out = ((running[..., 1:] - running[..., :-1]) * (n_out / n_in)).to(x.dtype)
    return out.movedim(-1, dim)


def _to_grid_numpy(full: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """``_to_grid_torch`` on the host for a (C, H, W) float32 frame."""
    c, h, w = full.shape
    if (h, w) == (gh, gw):
        return full.copy()
    if h > gh:
        small = np.empty((c, gh, gw), np.float32)
        _area_down(full, gh, gw, small)
        return small
    return np.matmul(np.matmul(cubic_matrix(h, gh), full.astype(np.float64)), cubic_matrix(w, gw).T).astype(np.float32)


def _field_axis_torch(residual: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """The field along ``dim`` (-2 or -1) at n pixels: the matrix product, or for an axis whose matrix would pass ``DENSE_ENTRIES`` the same sum by FFT
    (``_field_fft``, in torch)."""
    g = residual.shape[dim]
    if n * g <= DENSE_ENTRIES or exact.is_exact(residual):  # exact sums: no FFT
        m = torch.from_numpy(field_matrix(g, n).copy()).to(residual.device, residual.dtype)
        return exact.rows_product(m, residual) if dim == -2 else exact.cols_product(residual, m.t())
    bins, factor = _field_spectrum(g, n)
    source = torch.from_numpy(np.mod(np.arange(-(g // 2), g // 2 + 1), g)).to(residual.device)
    moved = residual.movedim(dim, -1).to(torch.float64)
    block = torch.fft.fft(moved, dim=-1).index_select(-1, source)
    block = block * torch.from_numpy(factor).to(residual.device)
    spectrum = torch.zeros((*moved.shape[:-1], n), dtype=torch.complex128, device=residual.device)
    spectrum.index_add_(-1, torch.from_numpy(bins).to(residual.device), block)
    out = (torch.fft.ifft(spectrum, dim=-1).real * n).to(residual.dtype)
    return out.movedim(-1, dim)


def _field_torch(residual: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The field of a grid residual on the h x w frame (a fresh tensor)."""
    return _field_axis_torch(_field_axis_torch(residual, h, -2), w, -1)


def grain_kernel(pixel_kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A batched noise kernel with grain relative to the field of view, from its per-pixel
    form (see the module docstring)."""

    def kernel(
        x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], **kw: Any
    ) -> torch.Tensor:
        h, w = x.shape[-2:]
        # off autograd the grid-sized steps run in place (same values): fresh grid-sized
        # blocks cost more page faults than arithmetic at B=32
        inplace = not _graph(x)
        grid = _to_grid_torch(x, *grid_shape(h, w)).clamp_(0.0, 1.0)
        noisy = pixel_kernel(grid, p, keys, **kw)
        residual = noisy.sub_(grid) if inplace and noisy.dtype == grid.dtype else noisy - grid
        field = _field_torch(residual, h, w)
        return (field.add_(x) if inplace and field.dtype == x.dtype else x + field).clamp_(0.0, 1.0)

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


@lru_cache(maxsize=16)
def _field_matrix64(g: int, n: int) -> np.ndarray:
    """``field_matrix(g, n)`` in float64 (the same values)."""
    out = field_matrix(g, n).astype(np.float64)
    out.flags.writeable = False
    return out


def field_into(residual: np.ndarray, out: np.ndarray) -> None:
    """``out`` (C, H, W) float32 = the grid ``residual`` (C, gh, gw) float32 as its field on the
    H x W frame (``field_matrix`` along each axis; for an axis whose matrix would pass
    ``DENSE_ENTRIES``, the same sum by FFT, ``_field_fft``).

    The products of float32 values sum in float64 and round once to float32: a float32 BLAS
    product sums in an order set by its kernel and thread count, and gave other bytes with one
    OpenBLAS thread than with two; in float64 those orders differ by about 1e-16 of a value,
    which moves its float32 rounding only when it lies within that of a rounding boundary."""
    h, w = out.shape[-2:]
    gh, gw = residual.shape[-2:]
    wide = residual.astype(np.float64)
    rows = np.matmul(_field_matrix64(gh, h), wide) if h * gh <= DENSE_ENTRIES else _field_fft(wide, h, 1)
    if w * gw <= DENSE_ENTRIES:
        out[...] = np.matmul(rows, _field_matrix64(gw, w).T)
    else:  # an extreme aspect ratio: the long axis by FFT (no (n, g) matrix)
        out[...] = _field_fft(rows, w, 2)


def field_torch(residual: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The field of a (..., gh, gw) grid residual on the h x w frame (a fresh tensor): the
    torch twin of ``field_into``."""
    return _field_torch(residual, h, w)


def add_field(residual: np.ndarray, full: np.ndarray, dst: np.ndarray) -> None:
    """``dst`` = the frame ``full`` (C, H, W) plus the grid ``residual`` (C, gh, gw) as its
    field (``field_matrix``), clipped and stored in ``dst``'s dtype."""
    c, h, w = full.shape
    out = scratch("grain_out", (c, h, w), np.float32)
    field_into(residual, out)
    out += full
    if dst.dtype == np.uint8 and dst.flags.c_contiguous:
        _store_u8(out, dst)
        return
    np.clip(out, np.float32(0.0), np.float32(1.0), out=out)
    backend.store_float(out, dst)


def grain_cpu(pixel_fn: backend.CpuFn) -> backend.CpuFn:
    """The CPU fast path with grain relative to the field of view, from its per-pixel form
    (which must read float32 samples)."""

    def fn(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, **kw: Any) -> None:
        h, w = src.shape[-2:]
        full = _load_float(src)
        grid = _to_grid_numpy(full, *grid_shape(h, w))
        np.clip(grid, np.float32(0.0), np.float32(1.0), out=grid)
        noisy = np.empty_like(grid)
        pixel_fn(grid, noisy, p, key, **kw)
        noisy -= grid
        add_field(noisy, full, dst)

    fn.__doc__ = pixel_fn.__doc__
    return fn
