"""Specular highlights on wet mucosa from a physical model of the endoscope's illumination.

Model. The light guides sit beside the lens, so light source and camera are (nearly) co-located
at the origin, looking along +z. Under such a light the diffuse image is
``I = rho cos(theta) / d^2`` (Okatani & Deguchi, "Shape reconstruction from an endoscope image
by shape from shading technique for a point light source at the projection center", CVIU 66(2),
1997), so the smoothed luminance gives a relative distance ``d ~ I^(-1/2)``. Each pixel's
surface point is ``P = d (u, v, 1)`` with ``(u, v)`` its normalised image coordinates (focal
length about half the shorter side: wide-angle optics); the normal is ``P_u x P_v``. A keyed
micro-relief (the crypt pattern under the mucus film: relative depth 0.4-0.85 % by severity, cells
of 1 % of the shorter side, its amplitude varied by ``roughness``) multiplies ``d`` before
differentiation.

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

Where the light finds a mirror (v6, issue 32 round 4c: real highlights follow the folds and
clump). The lobe is weighted by ``crest_weight``: under a light at the lens a fold crest or
convex ridge is brighter than its surround and a shadowed valley darker, so the luminance
smoothed at ``CREST_FINE`` over the luminance at ``CREST_WIDE`` puts the highlights on the
crests, in lines along them, and none in the valleys. The wet film is patchy: a keyed field of
mucus patches (``WET_CELL``) weights the lobe (normalised to a mean of 1: the film's water is
moved, not removed), so highlights come in clumps. Its thickness also varies the micro-relief's
amplitude (``roughness``): thin film over the crypt pattern breaks the light into clusters of
small dots, thick film smooths it into broader blobs and streaks (a heavy-tailed size mix).

What the endoscope's processor then shows (issue 32 round 3): a highlight is opaque where the
light reaches full well (a steep smoothstep of the linear peak over the top ``CLIP_BAND``; the
translucent sub-clipping lobe is left out), in the colour of the frame's own clipped highlights
(their mean linear colour; the illuminant's where the frame has none), grey-opened by a small disc
(thin worm strokes go, dots, ovals and fold streaks stay), and ringed by the processor's edge
enhancement (v6): an unsharp mask of the video signal's luma, applied to the step ``s`` that the
new highlight adds to the displayed luma: ``HALO_GAIN (G_sigma * s - s)^+`` is taken from every
channel in display units (a neutral dark ring outside the edge, deepest ~3-4 px out at 1048 px,
gone by ~8 px, as measured on the real glare crops of the realism reference set: luma 0.84 of the
surrounding tissue at 3-4 px on the 1048 px frames, 0.97-0.99 on the HD ones; native highlights
and their rings are left as they are).

The clipped core is then seen through the lens (a gaussian PSF of ``EDGE_SIGMA``): its light adds
to the tissue's in linear light, ``RIM_GAIN`` times its blurred opacity, and each channel clips at
the tint, so on red mucosa the rim's red reaches the clip before its green and blue (the warm
rim of real highlights) and the core is the tint.

Coverage (issue 32): every severity must add highlights on every frame, also where the frame's
shading finds few surfaces facing the camera. The film's wetness is raised at least to the value
at which a fraction ``coverage`` of the tissue turns half opaque and lowered at most to the value
at which ``COVERAGE_SPAN`` times that does (quantiles over the tissue of each pixel's wetness
needed, ``coverage_wetness``): the highlights stay where the lobe is strongest against the
pixel's headroom (convex, near, bright tissue) and their area grows with the severity.

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
import torch.nn.functional as F

from perturb.ops import _host, _math
from perturb.ops.kernels import Level, Params, draw

FOCAL = 0.5  # focal length, fraction of the shorter side (wide-angle endoscope optics)
SHADING_SIGMA = 0.015  # smoothing of the luminance before shape from shading (shorter side)
IRRADIANCE_SIGMA = 0.03  # large-scale illumination (distance fall-off cue)
RELIEF_CELL = 0.010  # micro-relief scale (shorter side)
ROUGH_CELL = 0.08  # patches of smooth (thick film) and rough (thin film) mucosa (shorter side)
ROUGH_SPREAD = 1.5  # the relief's amplitude varies as 1 + ROUGH_SPREAD * noise ...
ROUGH_MIN = 0.1  # ... but not below this (the film never makes the surface a perfect mirror)
OPTICS_SIGMA = 0.0015  # lens point-spread function (shorter side)
BLOOM_SIGMA = 0.0015  # blooming spread (shorter side)
BLOOM_GAIN = 0.6
EDGE_FADE = 0.01  # highlights fade out within this distance of the field's edge
LOBE_FLOOR = 1e-7  # a lobe below this is left out (its light stays under SPEC_FLOOR / 30)
SPEC_FLOOR = 1e-5  # specular light (fraction of full well) that moves no 8-bit level (1/30 of the darkest step)
CLIP_BAND = 0.08  # the highlight's edge: linear peak from 1 - CLIP_BAND (transparent) to 1 (opaque)
NATIVE_LEVEL = 0.92  # sRGB luma of the frame's own clipped specular pixels (their tint is measured)
NATIVE_MIN_PIXELS = 16  # fewer native highlight pixels than this: the illuminant's colour instead
OPEN_RADIUS = 0.0012  # morphological opening of the highlights (shorter side): no thin worm strokes
HALO_SIGMA = 0.004  # the video processor's unsharp mask on luma (shorter side): ring deepest ~3 px out at 1048 px
HALO_GAIN = (
    1.2  # unsharp-mask gain: the ring's depth in display units is this times the blurred luma step
)
CREST_FINE = 0.006  # local shading scale of a fold crest (shorter side)
CREST_WIDE = 0.04  # surrounding shading it is compared with (shorter side)
CREST_BAND = 0.3  # relative luminance excess from valley (0) to crest (1)
WET_CELL = 0.06  # mucus patches of the wet film (shorter side): highlights come in clumps
WET_LEVEL = -0.1  # film noise level at which a patch starts (about half the tissue is wet)
WET_BAND = 0.4  # noise range over which the film goes from dry to fully wet
WEIGHT_FLOOR = (
    1e-3  # least mean of the film weight it is normalised by (a frame all valley and dry)
)
EDGE_SIGMA = (
    0.0012  # lens PSF on the clipped highlight: a real rim falls to the tissue in ~3 px at 1080p
)
RIM_GAIN = 3.0  # light at the edge, per unit of blurred opacity, in units of the clip (channels clip one by one)
RING_FLOOR = 1e-5  # an unsharp-mask undershoot below this (display units) is no ring
ALPHA_FLOOR = 1e-4  # blurred opacity below this is no highlight (the blur's far tail)
WETNESS_MAX = 20.0  # the coverage floor raises the wetness at most to this (the table's bound)
COVERAGE_SPAN = (
    8.0  # the wetness is lowered so that at most this many times `coverage` of the tissue clips
)
NO_CLIP = 1e30  # wetness "needed" where the light cannot clip (no lobe, or already clipped)


def _glare_sampler(rng: np.random.Generator, level: Level) -> Params:
    """Film, relief, lobe and illuminant, then the coverage (drawn last: the v4 draws unchanged)."""
    tint = rng.uniform(0.95, 1.0, size=3)  # xenon / white LED: near-neutral illuminant
    return {
        "wetness": draw(rng, level["wetness"]),
        "relief": draw(rng, level["relief"]),
        "shininess": draw(rng, level["shininess"]),
        "illuminant": [float(t / tint.max()) for t in tint],
        "coverage": draw(rng, level["coverage"]),
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


def roughness(key: int, h: int, w: int, scale: int) -> np.ndarray:
    """(H, W) keyed factor on the micro-relief's amplitude, ``ROUGH_MIN`` to about
    ``1 + ROUGH_SPREAD``: where the mucus film is thick it smooths the crypts (broad mirror-like
    highlights and streaks), where it is thin the relief breaks the light into clusters of dots
    (a heavy-tailed mix of highlight sizes)."""
    rough = _host.fractal_noise(key, "glare-rough", h, w, ROUGH_CELL * scale, 1)
    rough *= np.float32(ROUGH_SPREAD)
    rough += np.float32(1.0)
    return np.maximum(rough, np.float32(ROUGH_MIN))


def roughness_t(
    keys: Sequence[int], h: int, w: int, scale: int, like: torch.Tensor
) -> torch.Tensor:
    """``roughness`` of every key: (B, H, W)."""
    rough = _host.fractal_noise_t(keys, "glare-rough", h, w, ROUGH_CELL * scale, 1, like)
    return (rough * ROUGH_SPREAD + 1.0).clamp(min=ROUGH_MIN)


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
        noise *= roughness(key, h, w, scale)
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


def _smoothstep(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, np.float32(0.0), np.float32(1.0))
    return (t * t * (np.float32(3.0) - np.float32(2.0) * t)).astype(np.float32)


def _smoothstep_t(t: torch.Tensor) -> torch.Tensor:
    t = t.clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _opacity(peak: np.ndarray) -> np.ndarray:
    """Opacity of a highlight from the linear peak (max over channels) of its light: 0 below
    ``1 - CLIP_BAND``, 1 (clipped) from 1 on, a steep smooth edge between."""
    return _smoothstep((peak - np.float32(1.0 - CLIP_BAND)) * np.float32(1.0 / CLIP_BAND))


def _opacity_t(peak: torch.Tensor) -> torch.Tensor:
    return _smoothstep_t((peak - (1.0 - CLIP_BAND)) * (1.0 / CLIP_BAND))


def crest_weight(lum: np.ndarray, scale: int) -> np.ndarray:
    """(H, W) in [0, 1]: where the surface is a crest for a light at the lens. Under that light a
    fold crest or convex ridge faces the light and is brighter than its surround, a shadowed
    valley darker: the luminance smoothed at ``CREST_FINE`` over the luminance at ``CREST_WIDE``,
    from 0 (``CREST_BAND / 2`` darker) through 0.5 (flat) to 1 (``CREST_BAND / 2`` brighter)."""
    fine = _host.gauss(lum, CREST_FINE * scale)
    wide = _host.gauss(lum, CREST_WIDE * scale)
    ratio = fine / (wide + np.float32(1e-4))
    return _smoothstep(np.float32(0.5) + (ratio - np.float32(1.0)) / np.float32(CREST_BAND))


def crest_weight_t(lum: torch.Tensor, scale: int) -> torch.Tensor:
    """``crest_weight`` of a (B, H, W) batch."""
    fine = _host.gauss_t(lum, CREST_FINE * scale)
    wide = _host.gauss_t(lum, CREST_WIDE * scale)
    return _smoothstep_t(0.5 + (fine / (wide + 1e-4) - 1.0) / CREST_BAND)


def film_weight(lum: np.ndarray, key: int, scale: int) -> np.ndarray:
    """(H, W) weight of the specular lobe: ``crest_weight`` times the keyed mucus patches of the
    wet film (highlights clump where the film is thick), normalised to a mean of 1 over the frame
    (the film's water is redistributed, not removed)."""
    h, w = lum.shape
    film = _host.fractal_noise(key, "glare-film", h, w, WET_CELL * scale, 2)
    weight = crest_weight(lum, scale) * _smoothstep(
        (film - np.float32(WET_LEVEL)) / np.float32(WET_BAND)
    )
    mean = float(weight.astype(np.float64).mean())
    return (weight * np.float32(1.0 / max(mean, WEIGHT_FLOOR))).astype(np.float32)


def film_weight_t(lum: torch.Tensor, keys: Sequence[int], scale: int) -> torch.Tensor:
    """``film_weight`` of a (B, H, W) batch of linear luminance."""
    _b, h, w = lum.shape
    film = _host.fractal_noise_t(keys, "glare-film", h, w, WET_CELL * scale, 2, lum)
    weight = crest_weight_t(lum, scale) * _smoothstep_t((film - WET_LEVEL) / WET_BAND)
    mean = weight.to(torch.float64).mean(dim=(1, 2)).clamp(min=WEIGHT_FLOOR)
    return weight * (1.0 / mean).to(torch.float32).view(-1, 1, 1)


def _open_radius(scale: int) -> int:
    return max(1, round(OPEN_RADIUS * scale))


def _disc(radius: int) -> np.ndarray:
    """OpenCV's elliptic structuring element of side ``2 radius + 1`` (uint8)."""
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


def _opening(alpha: np.ndarray, radius: int) -> np.ndarray:
    """Grey opening of an (H, W) opacity by a disc of radius ``radius``: strokes thinner than
    it go, dots, ovals and thick streaks stay, rounded (outside the image counts as neutral)."""
    kernel = _disc(radius)
    return cv2.dilate(cv2.erode(alpha, kernel), kernel)


def _min_max_filter(planes: torch.Tensor, radius: int, take_max: bool) -> torch.Tensor:
    """Erosion (min) or dilation (max) of a (B, H, W) batch by ``_disc(radius)``: the extreme of
    the shifted copies, padded with the neutral value (as OpenCV's default border)."""
    _b, h, w = planes.shape
    fill = -math.inf if take_max else math.inf
    padded = F.pad(planes, (radius, radius, radius, radius), value=fill)
    res: torch.Tensor | None = None
    for dy, dx in zip(*np.nonzero(_disc(radius)), strict=True):
        shifted = padded[:, int(dy) : int(dy) + h, int(dx) : int(dx) + w]
        if res is None:
            res = shifted
        else:
            res = torch.maximum(res, shifted) if take_max else torch.minimum(res, shifted)
    assert res is not None
    return res


def _opening_t(alpha: torch.Tensor, radius: int) -> torch.Tensor:
    """``_opening`` of a (B, H, W) batch."""
    return _min_max_filter(_min_max_filter(alpha, radius, False), radius, True)


def native_tint(img: np.ndarray, tissue: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """(C,) linear colour of the frame's own clipped highlights (tissue pixels of sRGB luma at
    least ``NATIVE_LEVEL``), scaled to a peak of 1; ``fallback`` where it has too few."""
    native = (_host.luma(img) >= np.float32(NATIVE_LEVEL)) & tissue
    if img.shape[0] != 3 or int(native.sum()) < NATIVE_MIN_PIXELS:
        return fallback
    mean = _host.to_linear(img[:, native]).astype(np.float64).mean(axis=1)
    return (mean / max(float(mean.max()), 1e-6)).astype(np.float32)


def native_tint_t(x: torch.Tensor, tissue: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``native_tint`` of a (B, C, H, W) batch and its (B, H, W) tissue masks: (B, C, 1, 1)."""
    if x.shape[1] != 3:
        return torch.ones(x.shape[0], x.shape[1], 1, 1, device=x.device)
    native = (_host.luma_t(x) >= NATIVE_LEVEL) & tissue
    lin = _math.srgb_to_linear(x)
    mean = torch.stack([_host.masked_mean(lin[:, k], native, 0.0) for k in range(3)], dim=1)
    mean = mean.to(torch.float64)
    measured = (mean / mean.amax(dim=1, keepdim=True).clamp(min=1e-6)).to(torch.float32)
    enough = (native.sum(dim=(1, 2)) >= NATIVE_MIN_PIXELS).view(-1, 1)
    return torch.where(enough, measured, fallback).view(-1, 3, 1, 1)


def coverage_wetness(
    lin: np.ndarray, spec_unit: np.ndarray, gains: np.ndarray, tissue: np.ndarray, coverage: float
) -> float:
    """The least wetness at which a fraction ``coverage`` of the tissue (C, N linear light, N
    unit-wetness specular light, N tissue mask) turns into highlight: the ``coverage`` quantile
    over the tissue of each pixel's wetness for a first channel half way into the clipping band,
    ``min_c (1 - CLIP_BAND / 2 - lin_c) / (gain_c spec)`` (``NO_CLIP`` where no light falls or a
    channel is in the band already, as the opacity counts it), at most ``WETNESS_MAX``."""
    need = np.full(spec_unit.shape, np.float32(NO_CLIP), dtype=np.float32)
    lit = np.flatnonzero(spec_unit > 0)
    if lit.size:
        head = (np.float32(1.0 - CLIP_BAND / 2) - lin[:, lit]) / (gains * spec_unit[lit])
        low = head.min(axis=0)
        dim = lin[:, lit].max(axis=0) < np.float32(1.0 - CLIP_BAND)
        need[lit] = np.where(dim, low, np.float32(NO_CLIP))
    inside = need[tissue]
    if inside.size == 0:
        return 0.0
    return min(float(np.quantile(inside, coverage)), WETNESS_MAX)


def coverage_wetness_t(
    lin: torch.Tensor,
    spec_unit: torch.Tensor,
    gains: torch.Tensor,
    tissue: torch.Tensor,
    coverage: torch.Tensor,
) -> torch.Tensor:
    """``coverage_wetness`` of a batch: (B, C, H, W) linear light, (B, H, W) unit-wetness
    specular light and tissue masks, (B,) coverages; (B,) float32 wetness floors."""
    lit = (spec_unit > 0) & (lin.amax(dim=1) < 1.0 - CLIP_BAND)
    head = (((1.0 - CLIP_BAND / 2) - lin) / (gains * spec_unit.unsqueeze(1))).amin(dim=1)
    need = torch.where(lit, head, torch.full((), NO_CLIP, device=lin.device))
    floor = _host.masked_quantile(need, tissue, 0.0, qs=coverage.to(torch.float64))
    floor = torch.nan_to_num(floor, nan=0.0).clamp(max=WETNESS_MAX)
    return floor.to(torch.float32)


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
    noise = noise * roughness_t(keys, h, w, scale, lum)
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
    lum = _host.luma_t(lin)
    n_dot_v, inv_d2 = surface_normals_t(lum, keys, p["relief"], scale)
    shininess = p["shininess"].view(-1, 1, 1)
    floor = torch.exp(math.log(LOBE_FLOOR) / shininess.to(torch.float64)).to(torch.float32)
    facing = n_dot_v > floor
    lobe = torch.exp(torch.log(n_dot_v.clamp(min=1e-30)) * shininess) * inv_d2
    lobe = (
        lobe * _host.soft_mask_t(tissue, EDGE_FADE * scale)[:, 0] * film_weight_t(lum, keys, scale)
    )
    lobe = torch.where(facing, lobe, torch.zeros((), device=x.device))
    spec_unit = _host.gauss_t(lobe, OPTICS_SIGMA * scale)
    gains = p["illuminant"].view(-1, 3, 1, 1) if c == 3 else torch.ones(1, 1, 1, 1, device=x.device)
    floor = coverage_wetness_t(lin, spec_unit, gains, tissue[:, 0], p["coverage"])
    ceiling = coverage_wetness_t(lin, spec_unit, gains, tissue[:, 0], p["coverage"] * COVERAGE_SPAN)
    wetness = torch.minimum(torch.maximum(p["wetness"].to(torch.float32), floor), ceiling)
    spec = (spec_unit * wetness.view(-1, 1, 1)).unsqueeze(1)
    raw = lin + spec * gains
    zero = torch.zeros((), device=x.device)
    overflow = torch.where(
        spec > SPEC_FLOOR, (raw.amax(dim=1, keepdim=True) - 1.0).clamp(min=0.0), zero
    )
    bloom = _host.gauss_t(overflow, BLOOM_SIGMA * scale) * BLOOM_GAIN + spec
    on_tissue = tissue[:, 0]
    tint = native_tint_t(x, on_tissue, p["illuminant"]) if c == 3 else gains
    before = _opacity_t(lin.amax(dim=1))
    alpha = _opacity_t((lin + bloom * gains).amax(dim=1)) - before
    alpha = torch.where(on_tissue & (bloom[:, 0] > SPEC_FLOOR), alpha.clamp(min=0.0), zero)
    alpha = _host.gauss_t(_opening_t(alpha, _open_radius(scale)), EDGE_SIGMA * scale)
    alpha = torch.where(on_tissue & (alpha > ALPHA_FLOOR), alpha.clamp(max=1.0), zero)
    a = alpha.unsqueeze(1)
    lit = torch.maximum(lin, torch.minimum(tint, lin + a * (RIM_GAIN * tint)))
    shown = torch.where(a > 0, _math.linear_to_srgb(lit.clamp(0.0, 1.0)), x)
    step = torch.where(alpha > 0, (_host.luma_t(shown) - _host.luma_t(x)).clamp(min=0.0), zero)
    ring = (_host.gauss_t(step, HALO_SIGMA * scale) - step).clamp(min=0.0) * (1.0 - before)
    ring = torch.where(on_tissue & (ring > RING_FLOOR), ring * HALO_GAIN, zero)
    changed = ((alpha > 0) | (ring > 0)).unsqueeze(1)
    return torch.where(changed, (shown - ring.unsqueeze(1)).clamp(0.0, 1.0), x)


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
    fall-off, sensor clipping and a short bloom, painted opaque in the frame's highlight tint with
    a processor halo (module docstring). Pixels outside the highlights and their rings keep their
    input values."""
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
        lobe_at *= _host.soft_mask(tissue, EDGE_FADE * scale).reshape(-1)[facing]
        lobe_at *= film_weight(lum, key, scale).reshape(-1)[facing]
        lobe[facing] = lobe_at
    # the lens PSF: hairline lobes stay below clipping
    spec = _host.gauss(lobe.reshape(h, w), OPTICS_SIGMA * scale).reshape(-1)
    illuminant = np.asarray(p["illuminant"], dtype=np.float32)
    gains = illuminant[:, None] if c == 3 else np.ones((1, 1), np.float32)
    lin = _host.to_linear(flat)
    # the film wet enough that a fraction `coverage` of the tissue clips, dry enough that at most
    # COVERAGE_SPAN times that does: every severity adds highlights, in a graded amount
    coverage = float(np.float32(p["coverage"]))
    floor = coverage_wetness(lin, spec, gains, tissue.reshape(-1), coverage)
    ceiling = coverage_wetness(lin, spec, gains, tissue.reshape(-1), coverage * COVERAGE_SPAN)
    spec *= np.float32(min(max(float(np.float32(p["wetness"])), floor), ceiling))
    lit = np.flatnonzero(spec > np.float32(SPEC_FLOOR))  # where the light may clip
    raw = lin[:, lit].copy()
    raw += spec[lit] * gains
    overflow = np.zeros(h * w, dtype=np.float32)
    overflow[lit] = np.clip(raw.max(axis=0) - np.float32(1.0), np.float32(0.0), None)
    bloom = _host.gauss(overflow.reshape(h, w), BLOOM_SIGMA * scale).reshape(-1)
    bloom *= np.float32(BLOOM_GAIN)
    bloom += spec
    # the highlight: opaque (clipped) where the light reaches full well, in the tint of the
    # frame's own highlights, with the processor's dark unsharp-mask ring outside its edge
    tint = native_tint(img, tissue, illuminant) if c == 3 else gains[:, 0]
    before = _opacity(lin.max(axis=0))
    alpha = np.zeros(h * w, dtype=np.float32)
    lit = np.flatnonzero((bloom > np.float32(SPEC_FLOOR)) & tissue.reshape(-1))
    if lit.size:
        peak = (lin[:, lit] + bloom[lit] * gains).max(axis=0)
        alpha[lit] = np.maximum(_opacity(peak) - before[lit], np.float32(0.0))
    alpha = _opening(alpha.reshape(h, w), _open_radius(scale))
    alpha = _host.gauss(alpha, EDGE_SIGMA * scale).reshape(-1)  # the lens PSF: a soft rim
    alpha[(alpha <= np.float32(ALPHA_FLOOR)) | ~tissue.reshape(-1)] = 0.0
    np.minimum(alpha, np.float32(1.0), out=alpha)
    res = img.copy()
    shown = np.flatnonzero(alpha > 0)
    step = np.zeros(h * w, dtype=np.float32)
    if shown.size:
        a = alpha[shown]
        # the light adds in linear light and each channel clips at the frame's clip colour: the
        # core is the tint, the rim warm where the mucosa's red clips before its green and blue
        base = lin[:, shown]
        lit_at = np.maximum(
            base, np.minimum(tint[:, None], base + a * np.float32(RIM_GAIN) * tint[:, None])
        )
        res.reshape(c, -1)[:, shown] = _host.to_display(
            np.clip(lit_at, np.float32(0.0), np.float32(1.0))
        )
        step[shown] = np.maximum(
            _host.luma(res.reshape(c, -1)[:, shown][:, None, :])[0]
            - _host.luma(flat[:, shown][:, None, :])[0],
            np.float32(0.0),
        )
    # the processor's unsharp mask on luma: a dark undershoot ring outside each new highlight,
    # the same in every channel (native highlights keep theirs)
    blurred = _host.gauss(step.reshape(h, w), HALO_SIGMA * scale).reshape(-1)
    ring = np.maximum(blurred - step, np.float32(0.0))
    ring *= np.float32(1.0) - before
    ringed = np.flatnonzero((ring > np.float32(RING_FLOOR)) & tissue.reshape(-1))
    if ringed.size:
        res.reshape(c, -1)[:, ringed] = np.clip(
            res.reshape(c, -1)[:, ringed] - ring[ringed] * np.float32(HALO_GAIN),
            np.float32(0.0),
            np.float32(1.0),
        )
    return res
