"""Radiometry of projection radiography (chest X-ray): the display model every X-ray op shares.

An image holds MONOCHROME2 display values ``v`` in [0, 1] (white = attenuating). We assume the
usual logarithmic "for presentation" transform of the detector signal: the linear detector
signal (transmitted fluence, relative to the unattenuated beam) is

    I = exp(-MU * v),   v = -ln(I) / MU,   MU = 4 (the display spans e^4 ~ 55:1 in fluence),

so air behind the lungs (v ~ 0) receives the full beam and the densest white structures about
2 % of it. Physical effects act on ``I`` (invert the display transform, perturb, re-apply,
clip to [0, 1]); display-side effects (window/level, gamma, bit depth, inversion, burned-in
text and markers, collimation shutters, JPEG) act on ``v``. Attenuating objects add to the
display value (``v + mu t / MU``: the Beer-Lambert attenuation of an object is a factor on
``I``, a shift in ``v``). The quanta per pixel of a film scale with the pixel area
(``pixel_quanta``), and the film-like presentation curve (``curve_to_log`` /
``curve_to_display``: identity between TOE and SHOULDER, tanh toe and shoulder) maps detector
signals beyond the clean film's range into the last gray levels.

8- and 16-bit inputs keep their depth (only ``xray_bit_depth`` and ``xray_jpeg`` quantise by
design): the result is the float32 result rounded back. On the CPU every X-ray op has a
per-sample host path that reads uint8/uint16 directly and gives that same result: pointwise ops
as one table of all 256 / 65,536 levels (``_register_lut``: the kernel itself evaluated on the
levels), smooth gain fields as a float64 display shift (``_apply_shift``). Sizes are fractions
of the shorter side (a grid frequency assumes that side spans ``FIELD_CM``), so a severity means
the same at any resolution. Physics after Bushberg et al., The Essential Physics of Medical
Imaging, 3rd ed., ch. 7-9. The X-ray ops themselves live in their physics families (noise,
blur, exposure, display, detector, overlay, attenuation, geometry, jpeg); their modality is
catalog data (``perturb/catalog/xray*.yaml``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import cv2
import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import lut_u8
from perturb.ops.kernels import Kernel

MU = 4.0  # display range in natural-log units of fluence
FULL_DOSE_QUANTA = 10000.0  # N0: quanta per pixel of the unattenuated beam at full dose ...
REFERENCE_SIDE = 1024.0  # ... for a pixel of a film whose shorter side has this many pixels
FIELD_CM = 35.0  # physical extent of the shorter image side, for the grid frequency


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
ALL_DTYPES = (np.uint8, np.uint16, np.float32)  # every sample dtype: what the X-ray host paths read
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


def pixel_quanta(dose: float | torch.Tensor, side: int) -> float | torch.Tensor:
    """Quanta per pixel of the unattenuated beam at dose fraction ``dose``: ``f N0`` for a pixel
    of a ``REFERENCE_SIDE`` film, scaled by the pixel's area ``(REFERENCE_SIDE / side)^2`` (the
    detector area is fixed, so a film of fewer, larger pixels collects more quanta per pixel and
    a severity means the same noise after resizing)."""
    return dose * FULL_DOSE_QUANTA * (REFERENCE_SIDE / side) ** 2


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
