"""Specular highlights on wet mucosa from a physical model of the endoscope's illumination.

Model. The light guides sit beside the lens, so light source and camera are (nearly) co-located
at the origin, looking along +z. Under such a light the diffuse image is
``I = rho cos(theta) / d^2`` (Okatani & Deguchi, "Shape reconstruction from an endoscope image
by shape from shading technique for a point light source at the projection center", CVIU 66(2),
1997), so the smoothed luminance gives a relative distance ``d ~ I^(-1/2)``. Each pixel's
surface point is ``P = d (u, v, 1)`` with ``(u, v)`` its normalised image coordinates (focal
length about half the shorter side: wide-angle optics); the normal is ``P_u x P_v``. A keyed
micro-relief (the mucus film and the crypt pattern, about 0.3 % of the shorter side) is added to
``d`` before differentiation.

The specular term follows the dichromatic model (Shafer, 1985; ``I = m_d D + m_s L``: the
highlight has the colour of the illuminant ``L``) with a Blinn-Phong lobe (Blinn, SIGGRAPH 1977).
With light and viewer co-located the half vector equals the view vector ``V = -P/|P|``, so the
lobe is ``(N . V)^shininess``: highlights sit where the surface faces the camera (fold crests,
polyp domes), not on walls seen edge-on. The irradiance falls off with the inverse square of the
distance, ``1/d^2``, proportional to the smoothed diffuse luminance, so the far dark lumen gets
almost none. Specular radiance ``wetness * (N.V)^shininess / d^2`` is added in linear light; the
sensor clips at full well and the charge that overflows spreads in a short bloom (a narrow
gaussian of the overflow). Highlights are drawn on the tissue only: they fade out within 1 % of
the shorter side of the field's edge; the dark frame and anything drawn on it stay untouched.

Severity raises the wetness (specular albedo of the fluid film) and the micro-relief (extent:
more facets face the camera) and lowers the shininess (a rougher, wider lobe); calibrated so that
highlight sizes stay those of real highlights on the same frames (median equivalent diameter
about 0.5 % of the shorter side, 90th percentile under 2 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch

from perturb.ops import _host, _math
from perturb.ops.kernels import Level, Params, draw

FOCAL = 0.5  # focal length, fraction of the shorter side (wide-angle endoscope optics)
SHADING_SIGMA = 0.015  # smoothing of the luminance before shape from shading (shorter side)
IRRADIANCE_SIGMA = 0.03  # large-scale illumination (distance fall-off cue)
RELIEF_CELL = 0.018  # micro-relief scale (shorter side)
OPTICS_SIGMA = 0.0015  # lens point-spread function (shorter side)
BLOOM_SIGMA = 0.0015  # blooming spread (shorter side)
BLOOM_GAIN = 0.6
EDGE_FADE = 0.01  # highlights fade out within this distance of the field's edge
LOBE_FLOOR = 1e-7  # a lobe below this is left out (its light stays under SPEC_FLOOR / 30)
SPEC_FLOOR = 1e-5  # specular light (fraction of full well) that moves no 8-bit level (1/30 of the darkest step)


def _glare_sampler(rng: np.random.Generator, level: Level) -> Params:
    tint = rng.uniform(0.95, 1.0, size=3)  # xenon / white LED: near-neutral illuminant
    return {
        "wetness": draw(rng, level["wetness"]),
        "relief": draw(rng, level["relief"]),
        "shininess": draw(rng, level["shininess"]),
        "illuminant": [float(t / tint.max()) for t in tint],
    }


def _quantile(a: np.ndarray, q: float) -> float:
    """``np.quantile(a, q)`` (linear method: the same value), for a large array without
    partitioning all of it: the two order statistics it interpolates are selected among the
    values between two quantiles of a subsample (the whole array where they miss them)."""
    flat = a.reshape(-1)
    n = flat.size
    virtual = n * q - q  # numpy's virtual index of the linear method
    k = math.floor(virtual)
    if n >= 1 << 14 and k + 1 < n:
        lo, hi = np.quantile(flat[::16], [max(q - 0.01, 0.0), min(q + 0.01, 1.0)])
        below = int(np.count_nonzero(flat < lo))
        band = flat[(flat >= lo) & (flat <= hi)]
        if below <= k and k + 1 < below + band.size:
            pair = np.partition(band, [k - below, k + 1 - below])[[k - below, k + 1 - below]]
            return float(np.quantile(pair, virtual - k))
    return float(np.quantile(flat, q))


def surface_normals(
    lum: np.ndarray, key: int, relief: float, scale: int
) -> tuple[np.ndarray, np.ndarray]:
    """(N . V, 1/d^2) per pixel from the linear luminance (H, W) by shape from shading under a
    light at the camera, with a keyed micro-relief of relative amplitude ``relief``."""
    h, w = lum.shape
    f = FOCAL * scale
    irr = _host.gauss(lum, SHADING_SIGMA * scale)
    ref = _quantile(irr, 0.98) + 1e-6
    inv_d2 = np.clip(irr * np.float32(1.0 / ref), np.float32(1e-3), np.float32(1.0))
    d = cv2.sqrt(inv_d2)
    d = cv2.divide(1.0, d)
    if relief > 0:
        noise = _host.fractal_noise(key, "glare-relief", h, w, RELIEF_CELL * scale, 2)
        noise *= np.float32(relief)
        noise += np.float32(1.0)
        d *= noise
    u = ((np.arange(w, dtype=np.float32) + 0.5 - w / 2) / f)[None, :]
    v = ((np.arange(h, dtype=np.float32) + 0.5 - h / 2) / f)[:, None]
    dy, dx = np.gradient(d)
    du, dv = (
        dx * np.float32(f),
        dy * np.float32(f),
    )  # derivatives per unit of normalised image coordinate
    # P = d q with q = (u, v, 1): P_u x P_v = d (-du, -dv, d + u du + v dv) and, V = -q / |q|,
    # N . V = d / (|(-du, -dv, d + u du + v dv)| |q|) (the normal taken facing the camera)
    t = du * u
    t += dv * v
    t += d
    np.multiply(t, t, out=t)
    np.multiply(du, du, out=du)
    np.multiply(dv, dv, out=dv)
    t += du
    t += dv
    norm = cv2.sqrt(t)
    norm *= np.sqrt(u * u + v * v + np.float32(1.0))
    n_dot_v = cv2.divide(d, norm)
    return np.minimum(n_dot_v, np.float32(1.0), out=n_dot_v), inv_d2


def _linear_at(flat: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Linear light (C, N) of the pixels ``index`` of a flattened (C, H*W) sRGB image."""
    if index.size == 0:
        return np.zeros((flat.shape[0], 0), dtype=np.float32)
    return _host.to_linear(flat[:, index])


def _gradient(d: torch.Tensor, dim: int) -> torch.Tensor:
    """``np.gradient`` of a float32 batch along ``dim`` (central inside, one-sided at the
    ends; at least two samples)."""
    n = d.shape[dim]
    inner = (d.narrow(dim, 2, n - 2) - d.narrow(dim, 0, n - 2)) / 2.0
    first = d.narrow(dim, 1, 1) - d.narrow(dim, 0, 1)
    last = d.narrow(dim, n - 1, 1) - d.narrow(dim, n - 2, 1)
    return torch.cat([first, inner, last], dim=dim)


def surface_normals_t(
    lum: torch.Tensor, keys: Sequence[int], relief: torch.Tensor, scale: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``surface_normals`` of a (B, H, W) batch of linear luminance: (N . V, 1/d^2)."""
    _b, h, w = lum.shape
    f = FOCAL * scale
    irr = _host.gauss_t(lum, SHADING_SIGMA * scale)
    everywhere = torch.ones_like(irr, dtype=torch.bool)
    ref = _host.masked_quantile(irr, everywhere, 0.98) + 1e-6
    inv_d2 = (irr * (1.0 / ref).to(torch.float32).view(-1, 1, 1)).clamp(1e-3, 1.0)
    d = 1.0 / torch.sqrt(inv_d2)
    noise = _host.fractal_noise_t(keys, "glare-relief", h, w, RELIEF_CELL * scale, 2, lum)
    d = d * (noise * relief.view(-1, 1, 1) + 1.0)  # relief 0: a factor of exactly 1
    u = ((torch.arange(w, device=lum.device, dtype=torch.float32) + 0.5 - w / 2) / f).view(1, 1, w)
    v = ((torch.arange(h, device=lum.device, dtype=torch.float32) + 0.5 - h / 2) / f).view(1, h, 1)
    du, dv = _gradient(d, 2) * f, _gradient(d, 1) * f
    t = du * u + dv * v + d
    norm = torch.sqrt(t * t + du * du + dv * dv) * torch.sqrt(u * u + v * v + 1.0)
    return (d / norm).clamp(max=1.0), inv_d2


def _specular_glare_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``specular_glare`` of a batch in one pass (the torch kernel): every field of the model
    for the whole batch, the lobe's floor and the clipping as masks."""
    _b, c, h, w = x.shape
    scale = min(h, w)
    _field, tissue = _host.view_masks(x, scenes)
    lin = _math.srgb_to_linear(x)
    n_dot_v, inv_d2 = surface_normals_t(_host.luma_t(lin), keys, p["relief"], scale)
    shininess = p["shininess"].view(-1, 1, 1)
    floor = torch.exp(math.log(LOBE_FLOOR) / shininess.to(torch.float64)).to(torch.float32)
    facing = n_dot_v > floor
    lobe = (
        torch.exp(torch.log(n_dot_v.clamp(min=1e-30)) * shininess)
        * inv_d2
        * p["wetness"].view(-1, 1, 1)
    )
    lobe = lobe * _host.soft_mask_t(tissue, EDGE_FADE * scale)[:, 0]
    lobe = torch.where(facing, lobe, torch.zeros((), device=x.device))
    spec = _host.gauss_t(lobe, OPTICS_SIGMA * scale).unsqueeze(1)
    gains = p["illuminant"].view(-1, 3, 1, 1) if c == 3 else torch.ones(1, 1, 1, 1, device=x.device)
    raw = lin + spec * gains
    zero = torch.zeros((), device=x.device)
    overflow = torch.where(
        spec > SPEC_FLOOR, (raw.amax(dim=1, keepdim=True) - 1.0).clamp(min=0.0), zero
    )
    bloom = _host.gauss_t(overflow, BLOOM_SIGMA * scale) * BLOOM_GAIN + spec
    changed = (bloom > SPEC_FLOOR) & tissue
    res = _math.linear_to_srgb((lin + bloom * gains).clamp(0.0, 1.0))
    return torch.where(changed, res, x).clamp(0.0, 1.0)


@_host.host_op(
    "specular_glare",
    sampler=_glare_sampler,
    dtypes=(np.uint8, np.float32),
    device=_specular_glare_batch,
)
def specular_glare(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Blinn-Phong highlights of a light at the camera on a surface from shading, inverse-square
    fall-off, sensor clipping and a short bloom (module docstring). Pixels whose specular light
    stays under ``SPEC_FLOOR`` keep their input values."""
    c, h, w = img.shape
    scale = _host.side(img)
    tissue = view.tissue
    lum = _host.luma(_host.to_linear(img))
    flat = img.reshape(c, -1)
    n_dot_v, inv_d2 = surface_normals(lum, key, float(p["relief"]), scale)
    # wetness (N . V)^shininess / d^2, where the lobe reaches LOBE_FLOOR (zero elsewhere)
    shininess = np.float32(p["shininess"])
    facing = np.flatnonzero(
        n_dot_v.reshape(-1) > np.float32(math.exp(math.log(LOBE_FLOOR) / float(shininess)))
    )
    lobe = np.zeros(h * w, dtype=np.float32)
    if facing.size:
        log_lobe = np.asarray(cv2.log(n_dot_v.reshape(-1)[facing]), dtype=np.float32)
        log_lobe *= shininess
        lobe_at = np.asarray(cv2.exp(log_lobe), dtype=np.float32).reshape(-1)
        lobe_at *= inv_d2.reshape(-1)[facing]
        lobe_at *= np.float32(p["wetness"])
        lobe_at *= _host.soft_mask(tissue, EDGE_FADE * scale).reshape(-1)[facing]
        lobe[facing] = lobe_at
    lobe = lobe.reshape(h, w)
    spec = _host.gauss(lobe, OPTICS_SIGMA * scale).reshape(
        -1
    )  # the lens PSF: hairline lobes stay below clipping
    illuminant = np.asarray(p["illuminant"], dtype=np.float32)
    gains = illuminant[:, None] if c == 3 else np.ones((1, 1), np.float32)
    lit = np.flatnonzero(spec > np.float32(SPEC_FLOOR))  # where the light may clip
    raw = _linear_at(flat, lit)
    raw += spec[lit] * gains
    overflow = np.zeros(h * w, dtype=np.float32)
    overflow[lit] = np.clip(raw.max(axis=0) - np.float32(1.0), np.float32(0.0), None)
    bloom = _host.gauss(overflow.reshape(h, w), BLOOM_SIGMA * scale).reshape(-1)
    bloom *= np.float32(BLOOM_GAIN)
    bloom += spec
    changed = np.flatnonzero((bloom > np.float32(SPEC_FLOOR)) & tissue.reshape(-1))
    out = _linear_at(flat, changed)
    out += bloom[changed] * gains
    res = img.copy()
    if changed.size:
        res.reshape(c, -1)[:, changed] = _host.to_display(
            np.clip(out, np.float32(0.0), np.float32(1.0))
        )
    return res
