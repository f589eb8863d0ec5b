"""Display processing of a digital radiograph: what the console does to the stored values.

These ops act on the MONOCHROME2 display value ``v`` (perturb.ops.radiometry), not on the
fluence (DICOM PS3.3 C.11.2 for VOI LINEAR windowing and C.7.6.3.1.2 for MONOCHROME1):

* ``xray_window_level``: a mis-set VOI LINEAR window (centre and width), clipped.
* ``xray_gamma``: a presentation gamma ``v^gamma``.
* ``xray_bit_depth``: too few gray levels (``round(2^bits)`` levels, nearest).
* ``xray_monochrome1``: MONOCHROME1 shown as MONOCHROME2, the full inversion (a single-level
  op: the error is all or nothing; catalog ``single_level``).
* ``xray_edge_enhancement``: vendor unsharp-mask processing ``v + k (v - G_sigma * v)`` with a
  wide kernel: rebound halos (overshoot and undershoot) along every edge.

The four pointwise ops run on the CPU as one table of all 256 / 65,536 levels per sample
(``radiometry._register_lut``). Modality is catalog data, not this module's name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import per_sample, shorter_side
from perturb.ops.blur import _box_torch, box_mean, box_radius
from perturb.ops.kernels import Level, Params, draw, draw_sign, register_kernel
from perturb.ops.radiometry import _register_lut, _wide


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
    and must equal it bit for bit (tests/ops/test_xray_cpu_paths.py); Kornia's ``adjust_gamma``
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
    minimum value is white): the full inversion ``1 - v``, seen through the VOI LINEAR window
    the viewer applies (centre ``0.5 + center_shift``, ``width``):
    ``clip((1 - v - c) / w + 0.5)``. The catalog makes this a single-level op: the window is the
    film's own (identity) at every severity, since a photometric-interpretation error has no
    degrees (a mis-set window is ``xray_window_level``).

    Kornia: own kernel: Kornia has no DICOM VOI window; inversion and window are one fused affine
    map and clip (``kornia.enhance.invert`` would only add a pass)."""
    c = 0.5 + per_sample(p["center_shift"])
    return ((1.0 - x - c) / per_sample(p["width"]) + 0.5).clamp_(0.0, 1.0)


def _unsharp_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"amount": draw(rng_, level["amount"]), "sigma": draw(rng_, level["sigma"])}


def box_gaussian(v: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """Three box passes per axis (a gaussian of ``sigma_px`` to within half a pixel), reflected
    borders, float64 cumulative sums (exact summation order on every device)."""
    r = box_radius(sigma_px, min(v.shape[-2], v.shape[-1]))
    g = v
    for _ in range(3):
        g = _box_torch(_box_torch(g, r, -1), r, -2)
    return g


@register_kernel("xray_edge_enhancement", sampler=_unsharp_sampler)
def xray_edge_enhancement(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Unsharp masking of the display image, ``v + amount (v - G_sigma * v)`` (``sigma`` a
    fraction of the shorter side): overshoot on the bright side of every edge, undershoot on
    the dark side (the rebound halo around the heart, diaphragm and devices).

    Kornia: own kernel, because Kornia's ``unsharp_mask`` blurs with ``gaussian_blur2d`` (O(sigma)
    taps per pixel) while this op's low-pass is three box passes through ``_box_torch`` cumulative
    sums (O(1) per pixel; see ``xray_scatter`` for the measured speed) and is also the CPU path,
    whose bytes the golden outputs pin. The torch path runs the whole batch at once with
    per-sample radii (``box_mean``)."""
    side = shorter_side(x)

    def host() -> torch.Tensor:
        out = []
        for i in range(x.shape[0]):
            v = _wide(x[i : i + 1])
            low = box_gaussian(v, float(p["sigma"][i]) * side)
            out.append((v + float(p["amount"][i]) * (v - low)).clamp_(0.0, 1.0).to(x.dtype))
        return torch.cat(out)

    def device() -> torch.Tensor:
        v = _wide(x)
        sigma_px = p["sigma"].double() * side
        width = torch.sqrt(4.0 * sigma_px * sigma_px + 1.0)  # as box_radius, per sample
        r = torch.round((width - 1.0) / 2.0).clamp(1, side - 1).to(torch.int64)
        low = v
        for _ in range(3):
            low = box_mean(box_mean(low, r, -1), r, -2)
        amount = per_sample(p["amount"].double())
        return (v + amount * (v - low)).clamp_(0.0, 1.0).to(x.dtype)

    return backend.by_path(x, host=host, device=device)


for _name, _kernel in (
    ("xray_window_level", xray_window_level),
    ("xray_gamma", xray_gamma),
    ("xray_bit_depth", xray_bit_depth),
    ("xray_monochrome1", xray_monochrome1),
):
    _register_lut(_name, _kernel)
