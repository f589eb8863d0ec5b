"""Exposure and light fall-off, in linear light (sRGB decoded, scaled, re-encoded).

* overexposure: gain > 1 with sensor clipping (auto-exposure lag, light too close).
* underexposure: gain < 1 with radial light fall-off ``1 - falloff * r^2`` (the light source
  cannot fill a distant lumen).
* vignetting: ``I * (1 - strength * r^2)``, r = distance from a keyed centre near the image
  centre, normalised by the half-diagonal.
* haze: surgical smoke / fogged lens, the atmospheric scattering model
  ``I * t + A * (1 - t)`` with a smooth keyed transmission field around ``transmission`` and a
  near-white airlight A (He et al., Single Image Haze Removal Using Dark Channel Prior, 2009).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops._math import linear_to_srgb, srgb_to_linear
from perturb.ops.registry import Level, Params, draw, register_kernel

HAZE_GRID = 6


def _b(p: torch.Tensor) -> torch.Tensor:
    return p.view(-1, 1, 1, 1)


def radial_r2(x: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor) -> torch.Tensor:
    """Squared distance (B,1,H,W) from per-sample centres (fractions of width/height),
    normalised so a corner of a centred image is at r = 1."""
    h, w = x.shape[-2:]
    half_diag = 0.5 * float(np.hypot(h, w))
    ys = (torch.arange(h, device=x.device, dtype=x.dtype) + 0.5).view(1, 1, h, 1)
    xs = (torch.arange(w, device=x.device, dtype=x.dtype) + 0.5).view(1, 1, 1, w)
    dy = (ys - _b(cy) * h) / half_diag
    dx = (xs - _b(cx) * w) / half_diag
    return dx * dx + dy * dy


def _centre(rng_: np.random.Generator) -> dict[str, float]:
    return {"cx": float(rng_.uniform(0.45, 0.55)), "cy": float(rng_.uniform(0.45, 0.55))}


def _falloff(x: torch.Tensor, p: dict[str, torch.Tensor], strength: torch.Tensor) -> torch.Tensor:
    return (1.0 - _b(strength) * radial_r2(x, p["cx"], p["cy"])).clamp_min(0.0)


@register_kernel("overexposure")
def overexposure(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    return linear_to_srgb(srgb_to_linear(x) * _b(p["gain"]))


def _under_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"gain": draw(rng_, level["gain"]), "falloff": draw(rng_, level["falloff"]), **_centre(rng_)}


@register_kernel("underexposure", sampler=_under_sampler)
def underexposure(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    scale = _b(p["gain"]) * _falloff(x, p, p["falloff"])
    return linear_to_srgb(srgb_to_linear(x) * scale)


def _vignetting_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"strength": draw(rng_, level["strength"]), **_centre(rng_)}


@register_kernel("vignetting", sampler=_vignetting_sampler)
def vignetting(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    return linear_to_srgb(srgb_to_linear(x) * _falloff(x, p, p["strength"]))


def _haze_sampler(rng_: np.random.Generator, level: Level) -> Params:
    tint = rng_.uniform(0.96, 1.0, size=3)
    return {
        "transmission": draw(rng_, level["transmission"]),
        "airlight": draw(rng_, level["airlight"]),
        "tint": [float(t / tint.max()) for t in tint],
    }


def smooth_field(x: torch.Tensor, keys: Sequence[int], stream: str, grid: int) -> torch.Tensor:
    """Keyed smooth field (B,1,H,W) in [-1, 1]: a grid x grid uniform field, bicubically
    upsampled to the image size."""
    h, w = x.shape[-2:]
    coarse = torch.stack([rng.uniform_field(k, stream, (1, grid, grid), x.device) for k in keys])
    field = F.interpolate(coarse * 2.0 - 1.0, size=(h, w), mode="bicubic", align_corners=True)
    return field.clamp_(-1.0, 1.0)


@register_kernel("haze", sampler=_haze_sampler)
def haze(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    t = (_b(p["transmission"]) * (1.0 + 0.15 * smooth_field(x, keys, "haze", HAZE_GRID))).clamp(0.0, 1.0)
    airlight = _b(p["airlight"]) * p["tint"].view(-1, 3, 1, 1)[:, : x.shape[1]]
    if x.shape[1] == 1:
        airlight = _b(p["airlight"])
    return (x * t + airlight * (1.0 - t)).clamp_(0.0, 1.0)
