"""Projection-radiography (chest X-ray) artifacts. Single-channel (gray) images.

Display model
-------------
An image holds MONOCHROME2 display values ``v`` in [0, 1] (white = attenuating). We assume the
usual logarithmic "for presentation" transform of the detector signal: the linear detector
signal (transmitted fluence, relative to the unattenuated beam) is

    I = exp(-MU * v),   v = -ln(I) / MU,   MU = 4 (the display spans e^4 ~ 55:1 in fluence),

so air behind the lungs (v ~ 0) receives the full beam and the densest white structures about
2 % of it. Physical effects act on ``I`` (invert the display transform, perturb, re-apply,
clip to [0, 1]); display-side effects (window/level, gamma, bit depth, inversion, burned-in
text and markers, collimation shutters, JPEG) act on ``v``. 8- and 16-bit inputs keep their
depth (only ``xray_bit_depth`` and ``xray_jpeg`` quantise by design): the result is the float32
result rounded back. On the CPU every op has a per-sample host path that reads uint8/uint16
natively and gives that same result: pointwise ops as one table of all 256 / 65,536 levels
(the kernel itself evaluated on the levels), heel effect and grid lines as a float64 display
shift field, overlays blended inside their mask's bounding box, quantum noise with perturb.rng's
NumPy twins of its fields; scatter, motion blur and JPEG use OpenCV (within 1/255 of torch).

Ops (physics after Bushberg et al., The Essential Physics of Medical Imaging, 3rd ed., ch. 7-9;
DICOM PS3.3 C.11.2 for VOI LINEAR windowing and C.7.6.3.1.2 for MONOCHROME1):

* quantum noise: ``Poisson(Q I) + sigma_e z`` quanta, divided by ``Q = f N0 (1024/side)^2``:
  dose fraction ``f`` of a full-dose ``N0`` quanta per pixel of a 1024 px film (scaled by the
  pixel area), plus electronic (read) noise ``sigma_e``; the signal is floored at half a
  quantum and shown through a film-like presentation curve (identity between TOE and SHOULDER,
  tanh toe and shoulder), so noise beyond the clean film's range compresses into the last gray
  levels instead of clipping to white "snow".
* grid lines: an anti-scatter grid of 40-80 lines/cm, ``I (1 - a s(x))``, point-sampled by
  the detector so frequencies above Nyquist alias into a low-frequency moire pattern.
* scatter haze (veiling glare): ``I + k (G * I)`` with a wide kernel (three box passes, a
  gaussian of the given sigma to within half a pixel).
* exposure (detector gain ``2^(+-stops)`` on ``I``), heel-effect gradient (``I (1 - a t^2)``
  along the anode-cathode axis), motion blur (line PSF on ``I``).
* window/level, gamma, too few gray levels (``round(2^bits)`` levels, nearest), MONOCHROME1
  shown as MONOCHROME2 (full inversion through a mis-set window), burned-in text (one
  annotation set per film), laterality marker,
  collimation borders (white: unexposed film-like shutter, black: electronic shutter), JPEG.

Sizes are fractions of the shorter side (grid frequency assumes that side spans ``FIELD_CM``),
so a severity means the same at any resolution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops import backend, blur, jpeg
from perturb.ops._math import lut_u8, per_sample, shorter_side
from perturb.ops.keyed_fields import normal_fields, uniform_fields
from perturb.ops.noise import (
    POISSON_EXACT_BELOW,
    poisson_counts,
    poisson_small,
    poisson_small_by_level,
)
from perturb.ops.registry import (
    Kernel,
    Level,
    Params,
    as_float32,
    draw,
    draw_int,
    draw_sign,
    register_kernel,
)
from perturb.scene import radiograph

MU = 4.0  # display range in natural-log units of fluence
FULL_DOSE_QUANTA = 10000.0  # N0: quanta per pixel of the unattenuated beam at full dose ...
REFERENCE_SIDE = 1024.0  # ... for a pixel of a film whose shorter side has this many pixels
FIELD_CM = 35.0  # physical extent of the shorter image side, for the grid frequency
PENUMBRA = 0.004  # collimator edge blur, fraction of the shorter side


def _wide(x: torch.Tensor) -> torch.Tensor:
    """float64 everywhere: transcendental results then do not depend on chunking or device
    beyond float64 rounding, which the final float32 rounding hides."""
    return x.double()


def to_linear(v: torch.Tensor) -> torch.Tensor:
    """Display value -> relative fluence ``exp(-MU v)`` (float64)."""
    return torch.exp(_wide(v) * -MU)


def to_display(i: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Relative fluence (float64) -> display value ``-ln(I) / MU`` clipped to [0, 1]."""
    v = torch.log(i.clamp_min(math.exp(-MU))) / -MU
    return v.clamp_(0.0, 1.0).to(like.dtype)


def scale_linear(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """``to_display(to_linear(x) * gain)`` for a positive gain (field), evaluated as the exact
    display-domain shift ``v - ln(gain) / MU`` (one log of the gain instead of an exp and a
    log per pixel), clipped to [0, 1]."""
    return (_wide(x) - torch.log(gain) / MU).clamp_(0.0, 1.0).to(x.dtype)


def to_linear_np(v: np.ndarray) -> np.ndarray:
    return np.exp(v.astype(np.float64) * -MU)


def to_display_np(i: np.ndarray) -> np.ndarray:
    v = np.log(np.maximum(i, math.exp(-MU))) / -MU
    return np.clip(v, 0.0, 1.0).astype(np.float32)


_load = backend.load_float
_store = backend.store_float
_NATIVE = (np.uint8, np.uint16, np.float32)
_INTEGER = (np.uint8, np.uint16)


def _linear_np(src: np.ndarray) -> np.ndarray:
    """``to_linear_np`` of one sample's float32 values; integer levels go through a table of
    the same values (one exp per level instead of one per pixel)."""
    if src.dtype == np.float32:
        return to_linear_np(src)
    return np.take(to_linear_np(backend.levels(src.dtype)), src)


@lru_cache(maxsize=2)
def _linear_table_f32(dtype: np.dtype) -> np.ndarray:
    """``to_linear_np`` of every level of an integer dtype, rounded to float32; read-only."""
    table = to_linear_np(backend.levels(dtype)).astype(np.float32)
    table.flags.writeable = False
    return table


def _linear_f32(src: np.ndarray) -> np.ndarray:
    """``_linear_np(src)`` rounded to float32 (the same values); integer levels through a
    cached float32 table (uint8 by ``cv2.LUT``), a quarter of the float64 gather's traffic."""
    if src.dtype == np.float32:
        return to_linear_np(src).astype(np.float32)
    table = _linear_table_f32(src.dtype)
    if src.dtype == np.uint8 and src.flags.c_contiguous:
        flat = src.reshape(-1, src.shape[-1])
        return np.asarray(cv2.LUT(flat, table), dtype=np.float32).reshape(src.shape)
    return np.take(table, src)


def _host_params(p: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """One sample's host parameter row as the (1, ...) float32 tensors a kernel takes."""
    return {name: torch.from_numpy(np.ascontiguousarray(value)[None]) for name, value in p.items()}


def _apply_shift(src: np.ndarray, dst: np.ndarray, shift: np.ndarray) -> None:
    """``scale_linear`` on the host: ``clip(v - shift)`` in float64, rounded to float32 and
    stored in ``dst``'s dtype; ``shift`` (H, W float64) is ``ln(gain) / MU``."""
    table = backend.levels(src.dtype).astype(np.float64) if src.dtype != np.float32 else None
    for c in range(src.shape[0]):
        v = src[c].astype(np.float64) if table is None else np.take(table, src[c])
        np.subtract(v, shift, out=v)
        np.clip(v, 0.0, 1.0, out=v)
        _store(v.astype(np.float32), dst[c])


Box = tuple[slice, slice]
Box4 = tuple[int, int, int, int]  # x0, y0, x1, y1


def _quadrant_boxes(mask: np.ndarray) -> list[Box]:
    """Bounding boxes of the mask's nonzero pixels in each quadrant (text sits in the corners)."""
    h, w = mask.shape
    boxes = []
    for rows in (slice(0, h // 2), slice(h // 2, h)):
        for cols in (slice(0, w // 2), slice(w // 2, w)):
            part = mask[rows, cols]
            r = np.flatnonzero(part.any(axis=1))
            if r.size:
                c = np.flatnonzero(part.any(axis=0))
                boxes.append(
                    (
                        slice(rows.start + int(r[0]), rows.start + int(r[-1]) + 1),
                        slice(cols.start + int(c[0]), cols.start + int(c[-1]) + 1),
                    )
                )
    return boxes


def _blend_np(
    src: np.ndarray, dst: np.ndarray, mask: np.ndarray, value: float, boxes: list[Box]
) -> None:
    """``_blend`` of one sample on the host: float32 ``v (1 - m) + value m`` inside ``boxes``
    (disjoint, covering every nonzero of the mask); elsewhere ``m = 0`` and the result is ``v``
    itself (every level of an integer sample rounds back to itself), so those pixels are copied."""
    np.copyto(dst, src)
    for box in boxes:
        m = mask[box]
        keep = np.float32(1.0) - m
        paint = np.float32(value) * m
        for c in range(src.shape[0]):
            out = _load(src[c][box]) * keep
            out += paint
            np.clip(out, np.float32(0.0), np.float32(1.0), out=out)
            _store(out, dst[c][box])


def _register_lut(name: str, kernel: Kernel) -> None:
    """A pointwise op's CPU path for integer samples: the op's own kernel evaluated once per
    sample on every level (256 or 65,536 values), rounded as the engine rounds, then one gather.
    float32 batches keep the torch kernel."""

    def lut_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
        values = torch.from_numpy(backend.levels(src.dtype).copy()).view(1, 1, 1, -1)
        with torch.no_grad():
            out = kernel(values, _host_params(p), [key]).reshape(-1).numpy()
        table = np.empty(out.shape, dtype=src.dtype)
        _store(out, table)
        if src.dtype == np.uint8:
            lut_u8(src, dst, table)
            return
        for c in range(src.shape[0]):
            np.take(table, src[c], out=dst[c])

    backend.register_cpu(name, dtypes=_INTEGER)(lut_cpu)


def _coords(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates (1,1,H,1) and (1,1,1,W), float64, relative to the centre."""
    h, w = x.shape[-2:]
    ys = (torch.arange(h, device=x.device, dtype=torch.float64) + 0.5 - h / 2).view(1, 1, h, 1)
    xs = (torch.arange(w, device=x.device, dtype=torch.float64) + 0.5 - w / 2).view(1, 1, 1, w)
    return ys, xs


# ---------------------------------------------------------------------------------------------
# Quantum + electronic noise


def pixel_quanta(dose: float | torch.Tensor, side: int) -> float | torch.Tensor:
    """Quanta per pixel of the unattenuated beam at dose fraction ``dose``: ``f N0`` for a pixel
    of a ``REFERENCE_SIDE`` film, scaled by the pixel's area ``(REFERENCE_SIDE / side)^2`` (the
    detector area is fixed, so a film of fewer, larger pixels collects more quanta per pixel and
    a severity means the same noise after resizing)."""
    return dose * FULL_DOSE_QUANTA * (REFERENCE_SIDE / side) ** 2


SIGNAL_FLOOR = 0.5  # quanta: the offset-corrected detector signal is clamped here before the log
SHOULDER = 0.8  # display value where the presentation curve's shoulder starts (white end)
TOE = 0.1  # ... and where its toe ends (black end)


def curve_to_log(v: torch.Tensor) -> torch.Tensor:
    """Display value -> log exposure ``u`` (float64) through the inverse of the presentation
    curve ``curve_to_display``: identity on [TOE, SHOULDER], ``atanh`` in the toe and shoulder.
    Pure white and pure black (no exposure information) stay at the ends (+-1 of tanh is cut at
    1 - 1e-12)."""
    v = _wide(v)
    hi = (v - SHOULDER) / (1.0 - SHOULDER)
    lo = (TOE - v) / TOE
    lim = 1.0 - 1e-12
    u = torch.where(hi > 0, SHOULDER + (1.0 - SHOULDER) * torch.atanh(hi.clamp(max=lim)), v)
    return torch.where(lo > 0, TOE - TOE * torch.atanh(lo.clamp(max=lim)), u)


def curve_to_display(u: torch.Tensor) -> torch.Tensor:
    """Log exposure ``u`` -> display value: a film-like characteristic curve, linear (identity)
    between TOE and SHOULDER with tanh toe and shoulder (C1 at the joins) that approach black
    and white without reaching them, so a noisy signal beyond the clean film's range is
    compressed into the last levels instead of clipping to pure white or black."""
    hi = (u - SHOULDER) / (1.0 - SHOULDER)
    lo = (TOE - u) / TOE
    v = torch.where(hi > 0, SHOULDER + (1.0 - SHOULDER) * torch.tanh(hi.clamp(min=0)), u)
    return torch.where(lo > 0, TOE - TOE * torch.tanh(lo.clamp(min=0)), v)


@register_kernel("xray_quantum_noise")
def xray_quantum_noise(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Reduced-dose acquisition: ``(Poisson(Q I) + sigma_e z) / Q`` in linear fluence with
    ``Q = pixel_quanta(f, side)``: ``dose`` is the fraction ``f`` of the full dose of
    ``N0 = FULL_DOSE_QUANTA`` quanta per reference pixel; ``electronic`` the read-noise std in
    quanta. The variance in ``I`` is ``I / Q`` plus ``(sigma_e / Q)^2``. The detector is linear
    (counts) and the presentation log is re-applied to the noisy counts; the doses of the table
    stay where a real AEC-limited low-dose chest film goes (down to about 1/16 of the dose), so the
    mottle never turns the dense mediastinum into white snow.

    Kornia: own kernel: Kornia has no Poisson-plus-electronic detector noise, and its random ops are
    not keyed (``perturb.rng`` fields replay bit for bit)."""
    shape = tuple(x.shape[1:])
    z = normal_fields(keys, "xray_quantum/normal", shape, x.device)  # each: the whole batch at once
    u = uniform_fields(keys, "xray_quantum/uniform", shape, x.device)
    ze = normal_fields(keys, "xray_quantum/electronic", shape, x.device)
    quanta = pixel_quanta(per_sample(p["dose"]).double(), shorter_side(x))
    mean = (detector_signal(x) * quanta).float()
    read = per_sample(p["electronic"]).double() * (REFERENCE_SIDE / shorter_side(x))
    counts = poisson_counts(mean, z, u).double() + read * ze.double()
    return presented(counts.clamp_(min=SIGNAL_FLOOR) / quanta, x)


def detector_signal(v: torch.Tensor) -> torch.Tensor:
    """Display value -> linear detector signal (float64) through the presentation curve."""
    return torch.exp(curve_to_log(v) * -MU)


def presented(i: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Linear detector signal (float64) -> display value through the presentation curve."""
    u = torch.log(i.clamp_min(1e-300)) / -MU
    return curve_to_display(u).clamp_(0.0, 1.0).to(like.dtype)


@backend.register_cpu("xray_quantum_noise", dtypes=_NATIVE)
def xray_quantum_noise_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    """The kernel per sample on the host with the same fields (perturb.rng's NumPy twins) and
    operations in the same order; the mean ``Q I`` and its root are per-level tables for
    integer samples (the kernel's own torch expressions, evaluated on every level)."""
    n = src.size
    quanta = float(
        pixel_quanta(
            torch.tensor(float(np.float32(p["dose"])), dtype=torch.float64), shorter_side(src)
        )
    )
    flat = src.reshape(-1)
    if src.dtype == np.float32:
        mean_t = (detector_signal(torch.from_numpy(flat)) * quanta).float()
        mean, root = mean_t.numpy(), mean_t.clamp_min(0).sqrt().numpy()
    else:
        lut_t = (
            detector_signal(torch.from_numpy(backend.levels(src.dtype).copy())) * quanta
        ).float()
        mean = np.take(lut_t.numpy(), flat)
        root = np.take(lut_t.clamp_min(0).sqrt().numpy(), flat)
    counts = root * rng.normal_numpy(key, "xray_quantum/normal", n)  # floor(mean + root z + 0.5)
    counts += mean
    counts += np.float32(0.5)
    np.floor(counts, out=counts)
    np.maximum(counts, np.float32(0.0), out=counts)
    small = np.flatnonzero(mean < np.float32(POISSON_EXACT_BELOW))
    if small.size:
        u = rng.uniform_numpy_at(key, "xray_quantum/uniform", small).astype(np.float64)
        if src.dtype == np.float32:
            counts[small] = poisson_small(mean[small].astype(np.float64), u)
        else:
            counts[small] = poisson_small_by_level(lut_t.numpy(), flat[small], u)
    total = counts.astype(np.float64)
    read = float(np.float32(p["electronic"])) * (REFERENCE_SIDE / shorter_side(src))
    total += read * rng.normal_numpy(key, "xray_quantum/electronic", n).astype(np.float64)
    np.maximum(total, SIGNAL_FLOOR, out=total)
    total /= quanta
    out = presented(torch.from_numpy(total), torch.empty(0)).numpy()
    _store(out.reshape(src.shape), dst)


# ---------------------------------------------------------------------------------------------
# Anti-scatter grid lines


def _grid_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "strength": draw(rng_, level["strength"]),
        "lines_per_cm": draw(rng_, level["lines_per_cm"]),
        "angle": draw(rng_, level["angle"]),
        "phase": float(rng_.random()),
        "vertical": float(rng_.random() < 0.5),
    }


def grid_pattern(h: int, w: int, p: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Lead-strip shadow ``s`` in [0, 1] (B,1,H,W, float64), point-sampled at pixel centres:
    ``0.5 (1 + cos 2 pi (f u + phase))`` with ``f`` in cycles/pixel (above Nyquist it aliases)."""
    side = min(h, w)
    ys = (torch.arange(h, device=device, dtype=torch.float64) + 0.5 - h / 2).view(1, 1, h, 1)
    xs = (torch.arange(w, device=device, dtype=torch.float64) + 0.5 - w / 2).view(1, 1, 1, w)
    theta = torch.deg2rad(per_sample(p["angle"]).double()) + per_sample(p["vertical"]).double() * (
        math.pi / 2
    )
    freq = per_sample(p["lines_per_cm"]).double() * (FIELD_CM / side)  # cycles per pixel
    # phase = f (x cos t + y sin t) + phase0, split into a row term and a column term (each
    # reduced mod 1) so that cos(a + b) = cos a cos b - sin a sin b costs two outer products.
    a = xs * (freq * torch.cos(theta))
    b = ys * (freq * torch.sin(theta)) + per_sample(p["phase"]).double()
    a = (a - torch.floor(a)) * (2.0 * math.pi)
    b = (b - torch.floor(b)) * (2.0 * math.pi)
    s = torch.cos(a) * torch.cos(b)  # ((1 + cos a cos b) - sin a sin b) * 0.5, in place
    return s.add_(1.0).sub_(torch.sin(a) * torch.sin(b)).mul_(0.5)


def grid_gain(h: int, w: int, p: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Transmitted fraction ``1 - a s`` of the grid (B,1,H,W, float64)."""
    return grid_pattern(h, w, p, device).mul_(per_sample(p["strength"]).double()).neg_().add_(1.0)


@register_kernel("xray_grid_lines", sampler=_grid_sampler)
def xray_grid_lines(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Kornia: own kernel: no Kornia equivalent (an analytic anti-scatter grid pattern multiplied
    on the fluence)."""
    return scale_linear(x, grid_gain(x.shape[-2], x.shape[-1], p, x.device))


@backend.register_cpu("xray_grid_lines", dtypes=_NATIVE)
def xray_grid_lines_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    gain = grid_gain(src.shape[-2], src.shape[-1], _host_params(p), torch.device("cpu"))
    _apply_shift(src, dst, gain.log_().div_(MU)[0, 0].numpy())


# ---------------------------------------------------------------------------------------------
# Scatter haze (veiling glare): I + k * (G_sigma * I), G = three box passes


def box_radius(sigma_px: float, size: int) -> int:
    """Radius r of a box (width 2r + 1) whose three-fold convolution has std ``sigma_px``
    (variance of three boxes: (w^2 - 1) / 4), limited to ``size - 1`` for reflection."""
    width = math.sqrt(4.0 * sigma_px * sigma_px + 1.0)
    return max(1, min(round((width - 1.0) / 2.0), size - 1))


def _box_torch(i: torch.Tensor, r: int, dim: int) -> torch.Tensor:
    """Box mean of width 2r + 1 along ``dim`` (-1 or -2) of a (1,1,H,W) float64 tensor,
    reflected borders (OpenCV BORDER_REFLECT_101), through a cumulative sum."""
    pad = (r, r, 0, 0) if dim == -1 else (0, 0, r, r)
    padded = F.pad(i, pad, mode="reflect")
    c = torch.cumsum(padded, dim=dim)
    zero = torch.zeros_like(c.narrow(dim, 0, 1))
    c = torch.cat([zero, c], dim=dim)
    n = i.shape[dim]
    return (c.narrow(dim, 2 * r + 1, n) - c.narrow(dim, 0, n)) / (2 * r + 1)


def _scatter_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"fraction": draw(rng_, level["fraction"]), "sigma": draw(rng_, level["sigma"])}


@register_kernel("xray_scatter", sampler=_scatter_sampler)
def xray_scatter(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Scatter (and detector veiling glare) adds a wide blur of the primary fluence:
    ``I + k (G_sigma * I)``; ``fraction`` k is the scatter-to-primary ratio, ``sigma`` a
    fraction of the shorter side.

    Kornia: own kernel, because Kornia's ``box_blur`` convolves a (2r + 1)-tap kernel
    per axis (O(r) per pixel; r is about sigma, 6-12 % of the shorter side here) while
    ``_box_torch`` is a float64 cumulative sum (O(1) per pixel, the same values within 1e-14):
    one pass pair at r = 60 on a 512x512 CPU plane took 24 ms here, Kornia's 807 ms (and
    Kornia's kernel size is one per call, while the radius here is per sample). The batch runs
    as one computation: ``_box_batch`` reads each sample's window sums at its own radius."""
    side = shorter_side(x)
    lin = to_linear(x)
    r = box_radii(per_sample(p["sigma"]).double() * side, side)
    g = lin
    for _ in range(3):
        g = _box_batch(_box_batch(g, r, -1), r, -2)
    return to_display(lin + per_sample(p["fraction"]).double() * g, x)


def box_radii(sigma_px: torch.Tensor, size: int) -> torch.Tensor:
    """``box_radius`` of each sample, (B,1,1,1) int64 from (B,1,1,1) float64 sigmas (the same
    float64 square root and half-to-even rounding)."""
    width = torch.sqrt(4.0 * sigma_px * sigma_px + 1.0)
    return torch.round((width - 1.0) / 2.0).clamp_(1, size - 1).to(torch.int64)


def _box_batch(i: torch.Tensor, r: torch.Tensor, dim: int) -> torch.Tensor:
    """``_box_torch`` of a (B,1,H,W) float64 batch with a radius per sample (``r``: (B,1,1,1)
    int64, below the length along ``dim``): one cumulative sum of the batch, and each sample's
    window sums read at its own offsets, the parts of a window past an edge read where
    BORDER_REFLECT_101 takes them from (no padding, whatever the radii; the same sums as
    ``_box_torch`` within float64 rounding)."""
    n = i.shape[dim]
    c = torch.cumsum(i, dim=dim)
    c = torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c], dim=dim)  # c[k]: sum of i[:k]
    size = list(i.shape)

    def at(index: torch.Tensor) -> torch.Tensor:  # c at per-sample offsets along dim
        return torch.gather(c, dim, index.expand(size))

    shape = [1, 1, 1, 1]
    shape[dim] = n
    x = torch.arange(n, device=i.device).view(shape)
    lo, hi = x - r, x + r
    inside = at(hi.clamp(max=n - 1) + 1) - at(lo.clamp(min=0))
    before = (-lo).clamp_(min=0)  # window elements before index 0: mirrored to 1 .. before
    past = (hi - (n - 1)).clamp_(min=0)  # ... after index n - 1: mirrored to n-1-past .. n-2
    mirrored = (at(before + 1) - c.narrow(dim, 1, 1)) + (c.narrow(dim, n - 1, 1) - at(n - 1 - past))
    return (inside + mirrored) / (2 * r + 1).to(i.dtype)


@backend.register_cpu("xray_scatter", dtypes=_NATIVE)
def xray_scatter_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    r = box_radius(float(p["sigma"]) * shorter_side(src), shorter_side(src))
    res = np.empty(src.shape, dtype=np.float32)
    for c in range(src.shape[0]):
        lin = _linear_np(src[c])
        g = lin
        for _ in range(3):
            g = cv2.blur(g, (2 * r + 1, 2 * r + 1), borderType=cv2.BORDER_REFLECT_101)
        res[c] = to_display_np(lin + float(np.float32(p["fraction"])) * g)
    _store(res, dst)


# ---------------------------------------------------------------------------------------------
# Exposure, heel effect, window/level, gamma, bit depth, MONOCHROME1 (pointwise / smooth)


def _exposure_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"stops": draw(rng_, level["stops"]) * draw_sign(rng_)}


@register_kernel("xray_exposure", sampler=_exposure_sampler)
def xray_exposure(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Detector gain ``2^stops`` on the linear signal (over- or under-exposure that the
    processing failed to normalise): a display shift of ``-stops ln 2 / MU`` with clipping.

    Kornia: own kernel: no Kornia equivalent (a gain on the linear fluence is a clipped shift of the
    log display value, one elementwise pass)."""
    return scale_linear(x, torch.pow(2.0, per_sample(p["stops"]).double()))


def _heel_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "strength": draw(rng_, level["strength"]),
        "angle": draw(rng_, level["angle"]),
        "anode_top": float(rng_.random() < 0.5),
    }


def heel_gain(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Transmitted fraction ``1 - a t^2`` of the heel effect over ``x``'s pixel grid
    (B,1,H,W, float64)."""
    h, w = x.shape[-2:]
    ys, xs = _coords(x)
    theta = torch.deg2rad(per_sample(p["angle"]).double())
    # unit axis pointing towards the anode: up (-y) or down (+y), tilted by angle
    sign = 1.0 - 2.0 * per_sample(p["anode_top"]).double()
    # in-place steps (the same operations in the same order as written out in the docstring
    # formula, one full-size buffer fewer per step)
    t = (ys * torch.cos(theta) + xs * torch.sin(theta)).mul_(sign)  # projection on the axis
    half = 0.5 * math.hypot(h, w)
    t.div_(half).add_(1.0).div_(2.0).clamp_(0.0, 1.0)
    return (t * per_sample(p["strength"]).double()).mul_(t).neg_().add_(1.0)  # 1 - (a t) t


@register_kernel("xray_heel_effect", sampler=_heel_sampler)
def xray_heel_effect(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Anode heel effect: fluence ``I (1 - a t^2)``, t in [0, 1] from the cathode to the anode
    side along an axis near the image's vertical (the patient's long axis).

    Kornia: own kernel: no Kornia equivalent (an analytic gain field along the anode axis)."""
    return scale_linear(x, heel_gain(x, p))


@backend.register_cpu("xray_heel_effect", dtypes=_NATIVE)
def xray_heel_effect_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    gain = heel_gain(torch.empty(src.shape[-2:]), _host_params(p))
    _apply_shift(src, dst, gain.log_().div_(MU)[0, 0].numpy())


def _window_sampler(rng_: np.random.Generator, level: Level) -> Params:
    """A VOI window's keyed centre shift (either sign) and width (window level, MONOCHROME1)."""
    return {
        "center_shift": draw(rng_, level["center_shift"]) * draw_sign(rng_),
        "width": draw(rng_, level["width"]),
    }


@register_kernel("xray_window_level", sampler=_window_sampler)
def xray_window_level(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """DICOM VOI LINEAR window (continuous form, PS3.3 C.11.2.1.2.1) with centre
    ``0.5 + center_shift`` and ``width`` on the normalised display scale (the identity window
    is centre 0.5, width 1): ``clip((v - c) / w + 0.5)``.

    Kornia: own kernel: Kornia has no DICOM VOI window; the window is one fused affine map and clip."""
    c = 0.5 + per_sample(p["center_shift"])
    return ((x - c) / per_sample(p["width"]) + 0.5).clamp_(0.0, 1.0)


def _gamma_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"log2_gamma": draw(rng_, level["log2_gamma"]) * draw_sign(rng_)}


@register_kernel("xray_gamma", sampler=_gamma_sampler)
def xray_gamma(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Display LUT gamma ``v^gamma`` with ``gamma = 2^log2_gamma`` (mismatched presentation LUT).

    Kornia: own kernel, because its 8/16-bit CPU tables are this kernel evaluated on every level
    and must equal it bit for bit (tests/xray/test_xray_cpu_paths.py); Kornia's ``adjust_gamma``
    is a float32 pow, an ulp off the float64 one, which moves some 16-bit levels."""
    g = torch.pow(2.0, per_sample(p["log2_gamma"]).double())
    return torch.pow(_wide(x), g).clamp(0.0, 1.0).to(x.dtype)


def _bits_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"bits": draw(rng_, level["bits"])}


@register_kernel("xray_bit_depth", sampler=_bits_sampler)
def xray_bit_depth(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Too few gray levels in the display pipeline: the display range re-quantised to
    ``L = round(2^bits)`` evenly spaced levels, ``round(v (L - 1)) / (L - 1)`` (a LUT stage or
    store with an effective depth of ``bits``; non-integer ``bits`` grade the severity between
    whole bits). Nearest-level rounding keeps black, white and the mean brightness.

    Kornia: own kernel, because Kornia's ``posterize`` keeps the top integer bits (floor, whole bits
    only) while this op rounds to ``round(2^bits)`` evenly spaced levels with fractional ``bits``."""
    top = torch.round(torch.pow(2.0, per_sample(p["bits"]).double())) - 1.0
    return (torch.round(_wide(x) * top) / top).clamp_(0.0, 1.0).to(x.dtype)


@register_kernel("xray_monochrome1", sampler=_window_sampler)
def xray_monochrome1(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """MONOCHROME1 pixel data shown as MONOCHROME2 (DICOM PS3.3 C.7.6.3.1.2: in MONOCHROME1 the
    minimum value is white): the full inversion ``1 - v`` at every severity, seen through the
    VOI LINEAR window the viewer took for it, which is mis-set by more with severity (centre
    ``0.5 + center_shift``, ``width``): ``clip((1 - v - c) / w + 0.5)``. Contrast is never lost;
    a narrower window raises it and clips the ends.

    Kornia: own kernel: Kornia has no DICOM VOI window; inversion and window are one fused affine
    map and clip (``kornia.enhance.invert`` would only add a pass)."""
    c = 0.5 + per_sample(p["center_shift"])
    return ((1.0 - x - c) / per_sample(p["width"]) + 0.5).clamp_(0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Overlays rendered on the host (integer rasterisation, identical for CPU and CUDA)


def _blend(x: torch.Tensor, masks: list[np.ndarray], value: torch.Tensor | float) -> torch.Tensor:
    """``v (1 - m) + value m`` with one host-rendered float32 mask (H, W) per sample, uploaded
    as one (B,1,H,W) stack; ``value``: (B,) per sample, or one number."""
    m = torch.from_numpy(np.stack(masks)).unsqueeze(1).to(x.device)
    paint = per_sample(value) if isinstance(value, torch.Tensor) else value
    return (x * (1.0 - m) + paint * m).clamp_(0.0, 1.0)


def _host_rows(
    p: dict[str, torch.Tensor],
    host_params: Sequence[Mapping[str, Any]] | None,
    names: Sequence[str],
) -> list[list[float]]:
    """The named parameters as one host list per sample, as the kernel sees them (float32): the
    overlay ops rasterise with OpenCV on the host, which needs the values. From ``host_params``
    (the records' dicts the engine passes: no device read); a bare call without them reads the
    (B,) tensors back in one transfer."""
    if host_params is not None:
        return [[as_float32(hp[name]) for name in names] for hp in host_params]
    return torch.stack([p[name] for name in names], dim=1).tolist()


_PROJECTIONS = ("PA ERECT", "AP SUPINE", "AP ERECT", "AP SITTING", "PA INSP", "AP PORTABLE")
_SITES = ("ICU", "ED", "WARD 4", "OR", "BEDSIDE", "CLINIC")


def _text_lines(key: int, n: int) -> list[str]:
    """The burned-in annotation set of one film: at most one line of each kind (patient id,
    date, time, projection, technique, site, accession number, distance), the same values at
    every severity; ``n`` lines are its first ``n`` (at most 8)."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_text"))
    patient = int(g.integers(10**6, 10**7))
    day, month, year = int(g.integers(1, 29)), int(g.integers(1, 13)), int(g.integers(10, 25))
    hour, minute = int(g.integers(0, 24)), int(g.integers(0, 60))
    projection = _PROJECTIONS[int(g.integers(len(_PROJECTIONS)))]
    kvp, mas = int(g.integers(70, 125)), float(g.integers(5, 50)) / 10
    site = _SITES[int(g.integers(len(_SITES)))]
    accession = int(g.integers(10**7, 10**8))
    sid = (100, 150, 180)[int(g.integers(3))]
    lines = [
        f"ID {patient}",
        f"{day:02d}/{month:02d}/20{year}",
        projection,
        f"{kvp} kVp {mas:.1f} mAs",
        f"{hour:02d}:{minute:02d}",
        site,
        f"ACC {accession}",
        f"SID {sid} cm",
    ]
    return lines[: max(0, min(n, len(lines)))]


def annotation_boxes(scene: Any, h: int, w: int) -> list[Box4]:
    """The boxes (x0, y0, x1, y1) of the annotations already burned into a film: its
    radiograph scene's (``perturb.scene.radiograph``, given by the engine); none without one."""
    if scene is None or tuple(scene.size) != (h, w) or scene.kind != "radiograph":
        return []
    return [tuple(int(v) for v in a["box"]) for a in radiograph.annotations_of(scene.descriptor)]  # type: ignore[misc]


def _clear(box: Box4, taken: Sequence[Box4], gap: float) -> bool:
    """Whether ``box`` keeps ``gap`` pixels from every box of ``taken``."""
    x0, y0, x1, y1 = box
    return all(
        x1 + gap <= a0 or a1 + gap <= x0 or y1 + gap <= b0 or b1 + gap <= y0
        for a0, b0, a1, b1 in taken
    )


def text_layout(
    h: int, w: int, lines: list[str], height: float, avoid: Sequence[Box4] = ()
) -> list[tuple[str, int, int]]:
    """(text, x, y) origins of text lines stacked in the four corners in turn (line i goes to
    corner i % 4, below (above, at the bottom) the lines already there), each kept a line's
    height away from the boxes of ``avoid`` (annotations already on the film): a line that would
    touch one moves one row further from its corner, then to the next corner; a line that fits
    in no corner's band (the outer quarter of the film's height) is left out. Without ``avoid``
    line i sits at row i // 4 (while the band holds it)."""
    font = cv2.FONT_HERSHEY_SIMPLEX
    scale = max(height / 22.0, 0.1)  # SIMPLEX caps are about 22 px at scale 1
    thick = max(1, round(height / 9.0))
    margin = max(1, round(0.6 * height))
    step = round(1.6 * height) + 1
    rows = [0, 0, 0, 0]  # the next free row of each corner
    taken = list(avoid)
    out = []
    for i, text in enumerate(lines):
        (tw, th), base = cv2.getTextSize(text, font, scale, thick)
        for corner in [(i + k) % 4 for k in range(4)]:
            placed = None
            row = rows[corner]
            while placed is None:
                x0 = margin if corner in (0, 2) else w - margin - tw
                y0 = margin + th + row * step if corner in (0, 1) else h - margin - row * step
                box = (x0, y0 - th, x0 + tw, y0 + base)
                if (corner in (0, 1) and y0 + base > h // 4) or (
                    corner in (2, 3) and y0 - th < h - h // 4
                ):
                    break  # out of the corner's band (a quarter of the film): the next corner
                if _clear(box, avoid, height):
                    placed = (text, int(x0), int(y0))
                    taken.append(box)
                    rows[corner] = row + 1
                row += 1
            if placed is not None:
                out.append(placed)
                break
    return out


def text_mask(
    h: int, w: int, lines: list[str], height: float, avoid: Sequence[Box4] = ()
) -> np.ndarray:
    """Anti-aliased mask (float32, H x W) of text lines laid out by ``text_layout``; ``height``
    is the cap height in pixels."""
    canvas = np.zeros((h, w), dtype=np.uint8)
    font = cv2.FONT_HERSHEY_SIMPLEX
    scale = max(height / 22.0, 0.1)
    thick = max(1, round(height / 9.0))
    for text, x0, y0 in text_layout(h, w, lines, height, avoid):
        cv2.putText(canvas, text, (x0, y0), font, scale, 255, thick, cv2.LINE_AA)
    return canvas.astype(np.float32) / np.float32(255.0)


def _text_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "lines": draw_int(rng_, level["lines"]),
        "height": draw(rng_, level["height"]),
        "value": draw(rng_, level["value"]),
    }


@register_kernel("xray_burned_text", sampler=_text_sampler, host_params=True, uses_scene=True)
def xray_burned_text(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    host_params: Sequence[Mapping[str, Any]] | None = None,
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Burned-in annotation text (ID, date, projection, technique) in the corners; ``lines``
    grows with severity and the first lines of a sample are the same at every severity. Lines
    keep clear of the annotations already on the film (its radiograph scene: ``text_layout``).

    Kornia: own kernel: the glyph masks are rendered on the host (OpenCV text, identical on every
    device, the CPU path's pixels bit for bit) from the records' parameters on the host
    (``host_params``), uploaded once and blended in one pass; Kornia has no text rendering. A
    glyph bitmap scaled on the device would not be OpenCV's anti-aliased strokes at the sample's
    continuous height."""
    h, w = x.shape[-2:]
    side = min(h, w)
    rows = _host_rows(p, host_params, ("lines", "height"))
    given = list(scenes) if scenes is not None else [None] * len(keys)
    masks = [
        text_mask(
            h, w, _text_lines(int(k), round(lines)), height * side, annotation_boxes(sc, h, w)
        )
        for k, (lines, height), sc in zip(keys, rows, given, strict=True)
    ]
    return _blend(x, masks, p["value"])


@backend.register_cpu("xray_burned_text", dtypes=_NATIVE, uses_scene=True)
def xray_burned_text_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    lines = _text_lines(key, round(float(p["lines"])))
    avoid = annotation_boxes(scene, h, w)
    mask = text_mask(h, w, lines, float(p["height"]) * min(h, w), avoid)
    _blend_np(src, dst, mask, float(p["value"]), _quadrant_boxes(mask))


def marker_plan(
    h: int, w: int, letter: str, size: float, right_corner: bool, scene: Any = None
) -> tuple[str | None, int, int, str | None]:
    """Where the laterality marker goes: (letter or None for no marker, x0, y0 of its square,
    why it differs from the drawn letter and corner, or None). A film's detected markers
    (its radiograph scene) decide the letter: the added marker never contradicts them (one side
    read: that letter, on that marker's side of the film; both: no marker; a marker-like
    annotation whose side was not read (``radiograph.unread_markers``): no marker). The square
    starts in the drawn top corner (margin
    3 % of the shorter side) and keeps half its size from every detected annotation: it moves
    up to twice its size along the edge from the drawn corner, the other top corner, then the
    bottom ones, before it goes further towards the middle."""
    side = min(h, w)
    margin = round(0.03 * side)
    s = max(2, round(size))
    found = radiograph.annotations_of(scene.descriptor) if _fits(scene, h, w) else []
    sides = sorted({str(a["side"]) for a in found if a["type"] == "marker" and a["side"]})
    if len(sides) > 1:
        return None, 0, 0, "no marker added: the film already shows both an L and an R marker"
    if not sides and _fits(scene, h, w):
        unread = radiograph.unread_markers(scene.descriptor)
        if unread:
            box = ", ".join(str(a["box"]) for a in unread)
            return None, 0, 0, f"no marker added: marker-like annotation(s) at {box}, side not read"
    why = None
    if sides and sides[0] != letter:
        why = f"letter {sides[0]} (drawn {letter}): the film's detected marker is {sides[0]}"
        letter = sides[0]
    if sides:  # on the film's side of that marker: an L on the patient's left, wherever shown
        read = [a["box"] for a in found if a["type"] == "marker" and a["side"]]
        on_right = sum(b[0] + b[2] for b in read) / (2 * len(read)) > w / 2
        if on_right != right_corner:
            side_note = "on the side of the film's detected marker"
            why = side_note if why is None else f"{why}; {side_note}"
            right_corner = on_right
    avoid = [tuple(int(v) for v in a["box"]) for a in found]
    # the place is found for the largest marker (severity 5) and the square grows from the same
    # outer corner, so a film's marker at every severity sits at one place, nested
    big = max(s, round(PLAN_SIZE * side))
    step = max(1, big // 2)
    corners = [
        (right_corner, True),
        (not right_corner, True),
        (right_corner, False),
        (not right_corner, False),
    ]
    if sides:  # only the detected marker's side of the film
        corners = [c for c in corners if c[0] == right_corner]
    near = range(0, 2 * big + 1, step)  # first each corner's own neighbourhood, then further in
    far = range(2 * big + step, max(2 * big + step, w // 2 - big - margin), step)
    for shifts in (near, far):
        for k, (right, top) in enumerate(corners):
            for shift in shifts:
                x0 = w - margin - big - shift if right else margin + shift
                y0 = margin if top else h - margin - big
                if _clear((x0, y0, x0 + big, y0 + big), avoid, 0.5 * big):  # type: ignore[arg-type]
                    if k or shift:
                        moved = "moved clear of the film's annotations"
                        why = moved if why is None else f"{why}; {moved}"
                    # the marker's square in the outer corner of the planned one
                    return letter, x0 + (big - s if right else 0), y0 + (0 if top else big - s), why
    return None, 0, 0, "no marker added: no corner of the film is clear of its annotations"


PLAN_SIZE = 0.09  # the largest marker (catalog: severity 5's upper size), shorter side


def _fits(scene: Any, h: int, w: int) -> bool:
    return scene is not None and tuple(scene.size) == (h, w) and scene.kind == "radiograph"


def marker_mask(
    h: int, w: int, letter: str, size: float, right_corner: bool, scene: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """A lead laterality marker placed by ``marker_plan``: a square of ``size`` px, a faint
    holder (0.35) with a bright outline and the letter (1.0); all zeros where no marker is
    added. Returns (mask, value) float32 images."""
    mask = np.zeros((h, w), dtype=np.float32)
    value = np.ones((h, w), dtype=np.float32)
    letter_, x0, y0, _ = marker_plan(h, w, letter, size, right_corner, scene)
    if letter_ is None:
        return mask, value
    s = max(2, round(size))
    mask[y0 : y0 + s, x0 : x0 + s] = 0.35
    glyph = np.zeros((h, w), dtype=np.uint8)
    thick = max(1, round(s / 12.0))
    cv2.rectangle(glyph, (x0, y0), (x0 + s - 1, y0 + s - 1), 255, thick, cv2.LINE_AA)
    scale = max(0.7 * s / 22.0, 0.1)
    (tw, th), _ = cv2.getTextSize(letter_, cv2.FONT_HERSHEY_DUPLEX, scale, max(1, 2 * thick))
    org = (x0 + (s - tw) // 2, y0 + (s + th) // 2)
    cv2.putText(
        glyph, letter_, org, cv2.FONT_HERSHEY_DUPLEX, scale, 255, max(1, 2 * thick), cv2.LINE_AA
    )
    inside = (slice(y0, y0 + s), slice(x0, x0 + s))  # the marker never leaves its square
    np.maximum(mask[inside], glyph[inside].astype(np.float32) / np.float32(255.0), out=mask[inside])
    return mask, value


def laterality_note(params: Mapping[str, Any], scene: Any, h: int, w: int) -> str | None:
    """Why a record's marker differs from its drawn letter and corner (``marker_plan``), or
    None: what the engine writes in the record (``extra["note"]``)."""
    letter = "R" if float(params["letter_r"]) > 0.5 else "L"
    size = as_float32(params["size"]) * min(h, w)
    return marker_plan(h, w, letter, size, as_float32(params["right_corner"]) > 0.5, scene)[3]


# ops whose record says why their result differs from what their parameters alone would give,
# read from the film's scene: note(params, scene, h, w)
SCENE_NOTES = {"xray_laterality_marker": laterality_note}


def _marker_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "size": draw(rng_, level["size"]),
        "letter_r": float(rng_.random() < 0.5),
        "right_corner": float(rng_.random() < 0.5),
    }


@register_kernel(
    "xray_laterality_marker", sampler=_marker_sampler, host_params=True, uses_scene=True
)
def xray_laterality_marker(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    host_params: Sequence[Mapping[str, Any]] | None = None,
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """A radiopaque "L"/"R" marker in a top corner; the letter is keyed and need not match the
    anatomy (a wrong or misplaced marker is the failure mode it probes), but it never
    contradicts a marker already on the film and keeps clear of its annotations (``marker_plan``).

    Kornia: own kernel: the marker mask is rendered on the host (identical on every device, the
    CPU path's pixels bit for bit) from the records' parameters on the host (``host_params``),
    uploaded once and blended in one pass; Kornia has no text rendering."""
    h, w = x.shape[-2:]
    side = min(h, w)
    given = list(scenes) if scenes is not None else [None] * len(keys)
    masks = [
        marker_mask(h, w, "R" if letter_r > 0.5 else "L", size * side, right > 0.5, sc)[0]
        for (size, letter_r, right), sc in zip(
            _host_rows(p, host_params, ("size", "letter_r", "right_corner")), given, strict=True
        )
    ]
    return _blend(x, masks, 1.0)  # the marker's value image is all ones


@backend.register_cpu("xray_laterality_marker", dtypes=_NATIVE, uses_scene=True)
def xray_laterality_marker_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    letter = "R" if float(p["letter_r"]) > 0.5 else "L"
    mask, _ = marker_mask(
        h, w, letter, float(p["size"]) * min(h, w), float(p["right_corner"]) > 0.5, scene
    )
    _blend_np(src, dst, mask, 1.0, _quadrant_boxes(mask))  # the marker's value image is all ones


def collimation_mask(
    h: int, w: int, left: float, right: float, top: float, bottom: float
) -> np.ndarray:
    """Shutter mask (float32, H x W): 1 outside the open field, a linear penumbra of
    ``PENUMBRA`` x shorter side at each blade edge. Blade positions are fractions of the
    width (left/right) and height (top/bottom)."""
    pen = max(PENUMBRA * min(h, w), 1.0)
    xs = np.arange(w, dtype=np.float64) + 0.5
    ys = np.arange(h, dtype=np.float64) + 0.5

    def ramp(d: np.ndarray) -> np.ndarray:  # d: signed distance into the shutter, px
        return np.clip(0.5 + d / pen, 0.0, 1.0)

    mx = np.maximum(ramp(left * w - xs), ramp(xs - (1.0 - right) * w))
    my = np.maximum(ramp(top * h - ys), ramp(ys - (1.0 - bottom) * h))
    return np.maximum(mx[None, :], my[:, None]).astype(np.float32)


def _collimation_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "left": draw(rng_, level["left"]),
        "right": draw(rng_, level["right"]),
        "top": draw(rng_, level["top"]),
        "bottom": draw(rng_, level["bottom"]),
        "white": float(rng_.random() < 0.5),
    }


@register_kernel("xray_collimation", sampler=_collimation_sampler)
def xray_collimation(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Collimator shutters: borders of keyed width per side, white (unexposed, MONOCHROME2)
    or black (electronic shutter), with a soft penumbra.

    Kornia: own kernel: no Kornia equivalent (a host-rendered shutter mask with penumbra, blended in
    one pass)."""
    h, w = x.shape[-2:]
    mask = collimation_masks(h, w, p, x.device)
    return (x * (1.0 - mask) + per_sample(p["white"]) * mask).clamp_(0.0, 1.0)


def collimation_masks(
    h: int, w: int, p: dict[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """``collimation_mask`` of every sample at once, (B,1,H,W) float32: the same float64
    operations on the (B,) blade positions (bit for bit)."""
    pen = max(PENUMBRA * min(h, w), 1.0)
    xs = (torch.arange(w, dtype=torch.float64, device=device) + 0.5).view(1, 1, 1, w)
    ys = (torch.arange(h, dtype=torch.float64, device=device) + 0.5).view(1, 1, h, 1)

    def ramp(d: torch.Tensor) -> torch.Tensor:  # d: signed distance into the shutter, px
        return (0.5 + d / pen).clamp_(0.0, 1.0)

    def blade(name: str) -> torch.Tensor:
        return per_sample(p[name]).double()

    mx = torch.maximum(ramp(blade("left") * w - xs), ramp(xs - (1.0 - blade("right")) * w))
    my = torch.maximum(ramp(blade("top") * h - ys), ramp(ys - (1.0 - blade("bottom")) * h))
    return torch.maximum(mx, my).to(torch.float32)


@backend.register_cpu("xray_collimation", dtypes=_NATIVE)
def xray_collimation_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    h, w = src.shape[-2:]
    mask = collimation_mask(h, w, *(float(p[s]) for s in ("left", "right", "top", "bottom")))
    # the open field is the rectangle of rows and columns whose edge profile is zero
    rows, cols = np.flatnonzero(mask[:, w // 2] == 0), np.flatnonzero(mask[h // 2] == 0)
    if rows.size == 0 or cols.size == 0:
        boxes = [(slice(0, h), slice(0, w))]
    else:
        r0, r1, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        boxes = [(slice(0, r0), slice(0, w)), (slice(r1, h), slice(0, w))]
        boxes += [(slice(r0, r1), slice(0, c0)), (slice(r0, r1), slice(c1, w))]
    _blend_np(src, dst, mask, float(p["white"]), boxes)


# ---------------------------------------------------------------------------------------------
# Motion blur (linear domain) and JPEG (shared codec path)


def _motion_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"length": draw(rng_, level["length"]), "angle": draw(rng_, level["angle"])}


@register_kernel("xray_motion_blur", sampler=_motion_sampler)
def xray_motion_blur(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Patient motion during the exposure: a line PSF (perturb.ops.blur.line_psf) applied to
    the linear fluence, which is what the detector integrates.

    Kornia: ``kornia.filters.fft_conv`` (reflected borders) with per-sample PSFs, ``(B, K, K)``:
    ``perturb.ops.blur.line_psf``'s (see ``motion_blur`` for why not Kornia's motion kernel),
    built for the whole batch on the device (``line_psfs``) at one size, that of the longest
    PSF a recorded length can ask for, which the FFT's cost barely feels (``filter2d`` would
    sum about 25,000 taps a pixel at a 1024 px side)."""
    import kornia  # lazily: only the torch path needs it

    side = shorter_side(x)
    # the longest PSF a recorded length can ask for (the catalog's bound, with room for the
    # float32 rounding of a recorded value; a longer one given directly is cut to it), and its
    # radius as ``blur._crop_psf`` crops it: one kernel size and one point list serve every sample
    bound = MAX_MOTION_LENGTH * (1.0 + 1e-6)
    most = max(bound * side, 1.0)
    radius = min(side - 1, math.ceil(most / 2.0) + 1)
    length = p["length"].double().clamp(max=bound) * side
    psf = line_psfs(length, p["angle"].double(), radius, side - 1, most)
    out = kornia.filters.fft_conv(to_linear(x), psf, border_type="reflect")
    return to_display(out, x)


MAX_MOTION_LENGTH = 0.15  # the catalog's upper bound of xray_motion_blur's length (shorter sides)
_SPLAT_ONE = float(1 << 32)  # fixed-point unit of the PSF splat: integer sums, in any order


def line_psfs(
    length_px: torch.Tensor, angle_deg: torch.Tensor, radius: int, reach: int, most: float
) -> torch.Tensor:
    """``blur.line_psf`` of each sample (lengths ``length_px`` and angles ``angle_deg``, (B,)
    float64), cropped to offsets of at most ``reach`` px and renormalised as ``blur._crop_psf``
    does, centred in one (B, 2 radius + 1, 2 radius + 1) float64 stack (``radius``: at least
    every sample's cropped radius). ``most``: a bound of every length (px), which sizes the point
    list (each sample's points beyond its own count weigh nothing). The same points and bilinear
    weights as ``line_psf``; the splat sums fixed-point integers, so its result does not depend
    on the order of the additions (exact on any device)."""
    size = 2 * radius + 1
    device = length_px.device
    length = length_px.clamp_min(1.0).view(-1, 1)
    half = torch.ceil(length / 2.0) + 1.0
    count = torch.clamp_min(torch.ceil(length * 4.0) + 1.0, 2.0)  # points of each sample
    j = torch.arange(max(2, math.ceil(most * 4.0) + 1), dtype=torch.float64, device=device)
    # numpy.linspace(-L / 2, L / 2, n): j * step + start, the last point exactly at the stop
    t = j * (length / (count - 1.0)) + (-length / 2.0)
    t = torch.where(j == count - 1.0, length / 2.0, t)
    theta = angle_deg.view(-1, 1) * (math.pi / 180.0)
    px = half + t * torch.cos(theta)
    py = half - t * torch.sin(theta)
    x0, y0 = torch.floor(px), torch.floor(py)
    fx, fy = px - x0, py - y0
    live = j < count
    index, weight = [], []
    for dx, dy, wt in (
        (0, 0, (1 - fx) * (1 - fy)),
        (1, 0, fx * (1 - fy)),
        (0, 1, (1 - fx) * fy),
        (1, 1, fx * fy),
    ):
        ox, oy = x0 + dx - half, y0 + dy - half  # offsets from the PSF's centre
        kept = live & (ox.abs() <= reach) & (oy.abs() <= reach)
        index.append(torch.where(kept, (oy + radius) * size + (ox + radius), 0.0))
        weight.append(wt * kept.to(torch.float64))
    taps = torch.round(torch.cat(weight, dim=1) * _SPLAT_ONE).to(torch.int64)
    flat = torch.zeros(length.shape[0], size * size, dtype=torch.int64, device=device)
    flat.scatter_add_(1, torch.cat(index, dim=1).to(torch.int64), taps)
    psf = flat.to(torch.float64)
    return (psf / psf.sum(dim=1, keepdim=True)).view(-1, size, size)


@backend.register_cpu("xray_motion_blur", dtypes=_NATIVE)
def xray_motion_blur_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    """The line PSF correlated with the float32 linear fluence plane by plane as ``motion_blur``
    does it (``blur.correlate_plane``: the PSF's sparse taps in blocks OpenCV sums directly,
    reflected borders), then back to display values. A sum above 1 or below ``exp(-MU)`` maps
    to the display range's end as a clipped one would."""
    psf = blur.line_psf(float(p["length"]) * shorter_side(src), float(p["angle"]))
    blocks = blur.psf_blocks(psf)
    lin = _linear_f32(src)
    for c in range(src.shape[0]):
        _store(to_display_np(blur.correlate_plane(lin[c], psf, blocks)), dst[c])


def _quality_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"quality": draw_int(rng_, level["quality"])}


register_kernel("xray_jpeg", sampler=_quality_sampler, codec=jpeg.jpeg_backend)(jpeg.jpeg)


@lru_cache(maxsize=1)
def _u16_codec_tables() -> tuple[np.ndarray, np.ndarray]:
    """uint16 level -> the 8-bit level the codec path gives its float32 value (clamp, * 255,
    round half to even), and 8-bit level -> the uint16 level its float32 ``q / 255`` rounds to."""
    to_u8 = cv2.convertScaleAbs(
        backend.levels(np.dtype(np.uint16)).reshape(1, -1), alpha=255.0
    ).reshape(-1)
    to_u16 = np.empty(256, dtype=np.uint16)
    _store(backend.levels(np.dtype(np.uint8)), to_u16)
    return to_u8, to_u16


@backend.register_cpu("xray_jpeg", dtypes=_NATIVE)
def xray_jpeg_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """``jpeg.jpeg_cpu``; a uint16 sample goes to and from the codec's 8 bits by two tables
    (the same levels as its float32 route)."""
    if src.dtype != np.uint16:
        jpeg.jpeg_cpu(src, dst, p, key)
        return
    to_u8, to_u16 = _u16_codec_tables()
    decoded = np.empty(src.shape, dtype=np.uint8)
    jpeg.jpeg_cpu(np.take(to_u8, src), decoded, p, key)
    np.take(to_u16, decoded, out=dst)


for _name, _kernel in (
    ("xray_exposure", xray_exposure),
    ("xray_window_level", xray_window_level),
    ("xray_gamma", xray_gamma),
    ("xray_bit_depth", xray_bit_depth),
    ("xray_monochrome1", xray_monochrome1),
):
    _register_lut(_name, _kernel)
