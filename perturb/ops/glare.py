"""Specular highlights on wet mucosa from a physical model of the endoscope's illumination,
sensor and video processor (v7).

Geometry. The light guides sit beside the lens, so light source and camera are (nearly)
co-located at the origin, looking along +z. Under such a light the diffuse image is
``I = rho cos(theta) / d^2`` (Okatani & Deguchi, "Shape reconstruction from an endoscope image
by shape from shading technique for a point light source at the projection center", CVIU 66(2),
1997), so the smoothed luminance gives a relative distance ``d ~ I^(-1/2)``. Each pixel's
surface point is ``P = d (u, v, 1)`` with ``(u, v)`` its normalised image coordinates (focal
length about half the shorter side: wide-angle optics); the normal is ``P_u x P_v``.

The wet surface. Mucosa under its mucus film is not smooth: mucus droplets, villi, crypt openings
and the pits of granular mucosa make a field of small convex bumps (``relief_t``), raised off
``d`` before differentiation. A bump reflects the light back into the lens where its flank
cancels the tilt of the surface it sits on, so it gives one dot or oval, and the dots gather where
the underlying surface already nearly faces the camera: on fold crests (in lines along them) and
polyp domes. Three size classes of bumps, their apparent size shrinking as ``1/d`` (far tissue
only carries small dots); the film's keyed thickness moves the relief from clusters of small dots
(thin film over the relief) to fewer, larger smooth blobs (thick film pooled), and weights the
lobe (wet patches: highlights come in clumps). The lobe is further weighted by a crest term
(``crest_weight_t``: under a light at the lens a crest is brighter than its surround, a shadowed
valley darker, where no highlight forms).

Reflection. The specular term follows the dichromatic model (Shafer, 1985; ``I = m_d D + m_s L``:
the highlight has the colour of the illuminant ``L``) with a Blinn-Phong lobe (Blinn, SIGGRAPH
1977); with light and viewer co-located the half vector is the view vector ``V = -P/|P|``, so the
lobe is ``(N . V)^shininess``, sharp for a wet film (shininess hundreds). Its irradiance falls as
``1/d^2`` (the smoothed diffuse luminance), and a far highlight's peak by a further ``1/d``
(``FAR_EXTRA``): the light guide's mirror image in a bump shrinks with distance below the lens's
resolution. The lens PSF (``OPTICS_SIGMA``) blurs the radiance. How wet the film is (specular
albedo, ``wetness``) is held between the value that clips a keyed fraction ``coverage`` of the
tissue to white and the value that clips a first channel on ``COVERAGE_SPAN`` times that, at most
``WETNESS_MAX`` (a mirror-like film): every frame and severity gets highlights, in an amount
graded by severity, on frames of any size.

Sensor and processor. The specular light is added in linear light; each channel clips at full
well (on red mucosa red clips first: the warm rim of a highlight) and the overflow, up to
``BLOOM_CAP`` full wells (the anti-blooming drain takes the rest), blooms into the neighbours (a
soft glow round the clipped core). The video processor maps the clipped white to its own white:
the per-channel level of the frame's own clipped pixels, else a keyed slightly warm white (the
real cores of the realism reference set: R 248-254, G 248-255, B 232-247 of 255). The video
chain's resolution softens the added light (``VIDEO_SIGMA``), then the processor's edge
enhancement, an unsharp mask of the luma (``HALO_SIGMA``, ``HALO_GAIN``), leaves a dark
undershoot ring round each new highlight, at most ``RING_DEPTH`` of the luma deep (real rings:
luma 0.84-0.95 of the tissue a few pixels out); the frame's own highlights keep theirs.
Highlights are drawn on the tissue only and fade out within 1 % of the shorter side of the
field's edge; the dark frame and anything drawn on it stay untouched.

Severity raises the coverage, the wetness and the bumps' slope and lowers the shininess (a
rougher, wider lobe). Lengths are fractions of the shorter side with pixel floors
(``BUMP_MIN_PX``), so a frame of 32 pixels still resolves its bumps.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from perturb.ops import _host, _math
from perturb.ops.kernels import Level, Params, draw

FOCAL = 0.5  # focal length, fraction of the shorter side (wide-angle endoscope optics)
SHADING_SIGMA = 0.015  # smoothing of the luminance before shape from shading (shorter side)
OPTICS_SIGMA = 0.0015  # lens point-spread function (shorter side)
VIDEO_SIGMA = 0.0008  # the video chain's blur of the displayed highlight (shorter side)
BLOOM_SIGMA = 0.004  # blooming spread (shorter side)
BLOOM_GAIN = 0.8
BLOOM_CAP = 2.0  # overflow (full wells) that blooms: the anti-blooming drain takes the rest
EDGE_FADE = 0.01  # highlights fade out within this distance of the field's edge
SPEC_FLOOR = 1e-5  # specular light (fraction of full well) that moves no 8-bit level (1/30 of the darkest step)
BUMP_CELLS = (0.006, 0.013, 0.028)  # bump sizes on the nearest tissue (shorter side): dots, ovals, blobs
BUMP_MIN_PX = 1.5  # least cell of a bump octave in pixels (what the sensor still resolves)
BUMP_LEVEL = 0.5  # value-noise level above which a bump rises (its peaks: isolated bumps)
WET_CELL = 0.06  # mucus patches of the wet film (shorter side): highlights come in clumps
WET_LEVEL = -0.15  # film noise level at which a patch starts
WET_BAND = 0.5  # noise range over which the film goes from thin to thick
FILM_SPLIT = 0.6  # how far the film's thickness shifts the relief from dots (thin) to blobs (thick)
FILM_FLOOR = 0.25  # lobe weight where the film is thin (the mucosa is never dry)
CREST_FINE = 0.006  # local shading scale of a fold crest (shorter side)
CREST_WIDE = 0.04  # surrounding shading it is compared with (shorter side)
CREST_BAND = 0.3  # relative luminance excess from valley (0) to crest (1)
CLIP = 0.98  # linear peak at which a pixel counts as clipped for the coverage
NO_CLIP = 1e30  # wetness "needed" where the light cannot clip (no lobe, or clipped already)
FAR_EXTRA = 1.0  # extra fall-off of a far highlight's peak, power of 1/d
WETNESS_MAX = 300.0  # the coverage floor raises the wetness at most to this (a mirror-like film)
COVERAGE_SPAN = 4.0  # the wetness is lowered so that at most this many times `coverage` clips
HALO_SIGMA = 0.0035  # the processor's unsharp mask on luma (shorter side): ring deepest ~3 px out at 1048 px
HALO_GAIN = 3.0  # its gain: the ring's depth in display units is this times the blurred luma step
RING_DEPTH = 0.2  # deepest undershoot, fraction of the luma (real rings: 0.84-0.95 of the tissue)
RING_FLOOR = 1e-5  # an undershoot below this (display units) is no ring
NATIVE_LEVEL = 0.9  # display level of every channel of the frame's own clipped highlight pixels
NATIVE_MIN_PIXELS = 16  # fewer of them than this: the keyed processor white instead
NATIVE_CLIP = 0.8  # linear peak from which (to 1) the frame's own highlights are spared the ring


def _glare_sampler(rng: np.random.Generator, level: Level) -> Params:
    tint = rng.uniform(0.95, 1.0, size=3)  # xenon / white LED: near-neutral illuminant
    return {
        "wetness": draw(rng, level["wetness"]),
        "relief": draw(rng, level["relief"]),
        "shininess": draw(rng, level["shininess"]),
        "illuminant": [float(t / tint.max()) for t in tint],
        "coverage": draw(rng, level["coverage"]),
        "fine": draw(rng, level["fine"]),
        "white": draw(rng, level["white"]),
    }


def _gradient(d: torch.Tensor, dim: int) -> torch.Tensor:
    """``np.gradient`` of a float32 batch along ``dim`` (central inside, one-sided at the
    ends; at least two samples)."""
    n = d.shape[dim]
    inner = (d.narrow(dim, 2, n - 2) - d.narrow(dim, 0, n - 2)) / 2.0
    first = d.narrow(dim, 1, 1) - d.narrow(dim, 0, 1)
    last = d.narrow(dim, n - 1, 1) - d.narrow(dim, n - 2, 1)
    return torch.cat([first, inner, last], dim=dim)


@dataclass(frozen=True)
class _Fields:
    """The smooth fields the model needs, for a (B, H, W) batch: a gaussian blur (sigma in
    pixels), keyed value noise (keys, stream, H, W, cell in pixels, like), the soft tissue ramp
    (bool mask, inset in pixels) and per-sample quantiles over a mask ((B,) float64). The torch
    kernel's are ``perturb.ops._host``'s batched ones; the host path's are its OpenCV/NumPy ones
    on the one sample (the same fields to float32 rounding, much faster on a CPU)."""

    gauss: Callable[[torch.Tensor, float], torch.Tensor]
    noise: Callable[[Sequence[int], str, int, int, float, torch.Tensor], torch.Tensor]
    ramp: Callable[[torch.Tensor, float], torch.Tensor]
    quantile: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _quantile_t(values: torch.Tensor, mask: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    return _host.masked_quantile(values, mask, 0.0, qs=qs)


BATCHED = _Fields(
    gauss=_host.gauss_t,
    noise=_host.value_noise_t,
    ramp=lambda mask, inset: _host.soft_mask_t(mask.unsqueeze(1), inset)[:, 0],
    quantile=_quantile_t,
)


def _np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t[0].numpy())


def _gauss_host(planes: torch.Tensor, sigma_px: float) -> torch.Tensor:
    return torch.from_numpy(_host.gauss(_np(planes), sigma_px))[None]


def _noise_host(
    keys: Sequence[int], stream: str, h: int, w: int, cell_px: float, like: torch.Tensor
) -> torch.Tensor:
    return torch.from_numpy(_host.value_noise(int(keys[0]), stream, h, w, cell_px))[None]


def _ramp_host(mask: torch.Tensor, inset_px: float) -> torch.Tensor:
    return torch.from_numpy(_host.soft_mask(_np(mask), inset_px))[None]


def _quantile_host(values: torch.Tensor, mask: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    inside = _np(values)[_np(mask)]
    if inside.size == 0:
        return torch.full((1,), float("nan"), dtype=torch.float64)
    return torch.tensor([np.quantile(inside, float(qs[0]))], dtype=torch.float64)


HOST = _Fields(gauss=_gauss_host, noise=_noise_host, ramp=_ramp_host, quantile=_quantile_host)


def _smoothstep_t(t: torch.Tensor) -> torch.Tensor:
    t = t.clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _px(fraction: float, scale: int, least: float) -> float:
    """A length of ``fraction`` of the shorter side in pixels, at least ``least`` pixels (a small
    frame keeps structures the sensor can resolve)."""
    return max(fraction * scale, least)


def crest_weight_t(lum: torch.Tensor, scale: int, fields: _Fields = BATCHED) -> torch.Tensor:
    """(B, H, W) in [0, 1]: where the surface is a crest for a light at the lens. Under that light
    a fold crest or convex ridge faces the light and is brighter than its surround, a shadowed
    valley darker: the luminance smoothed at ``CREST_FINE`` over the luminance at ``CREST_WIDE``,
    from 0 (``CREST_BAND / 2`` darker) through 0.5 (flat) to 1 (``CREST_BAND / 2`` brighter)."""
    fine = fields.gauss(lum, _px(CREST_FINE, scale, 0.6))
    wide = fields.gauss(lum, _px(CREST_WIDE, scale, 3.0))
    return _smoothstep_t(0.5 + (fine / (wide + 1e-4) - 1.0) / CREST_BAND)


def relief_t(
    keys: Sequence[int],
    inv_d2: torch.Tensor,
    scale: int,
    fine: torch.Tensor,
    fields: _Fields = BATCHED,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, W) relative height of the wet mucosa's micro-relief and (B, H, W) film weight.

    The relief is a field of convex bumps (mucus droplets, villi, crypt openings, the pits of
    granular mucosa): the positive peaks of keyed value noise, squared (rounded tops), each
    bump's height proportional to its size so that every bump has about the same steepest slope.
    Under a light at the lens a bump reflects where its flank cancels the tilt of the surface it
    sits on: a dot or an oval, not the ridge-line worms of a noise relief. Three classes of bumps
    (``BUMP_CELLS``, their sizes on the nearest tissue), ``fine`` (B,) of the height on the
    smallest (many small dots), the rest on the larger two (fewer, larger blobs); a bump's image
    shrinks as ``1/d``, so each class is drawn on the octaves of cells (``BUMP_CELLS[-1]`` halved
    down to ``BUMP_MIN_PX``) nearest its apparent size, interpolated in ``log2`` of it: far
    tissue carries only small dots. The film (returned): keyed patches of thick mucus
    (``WET_CELL``, 0 thin to 1 thick), which move the height from the small dots to the larger
    blobs (``FILM_SPLIT``: thin film over the relief breaks the light into dot clusters, thick
    film pools into smooth blobs)."""
    _b, h, w = inv_d2.shape
    film_cell = _px(WET_CELL, scale, 4.0)
    film = fields.noise(keys, "glare-film/0", h, w, film_cell, inv_d2) * (2.0 / 3.0)
    film = film + fields.noise(keys, "glare-film/1", h, w, film_cell / 2, inv_d2) * (1.0 / 3.0)
    film = _smoothstep_t((film - WET_LEVEL) / WET_BAND)
    top = max(BUMP_CELLS[-1] * scale, BUMP_MIN_PX)
    octaves = max(1, 1 + math.floor(math.log2(max(top / BUMP_MIN_PX, 1.0))))
    half_log_d = torch.log2(inv_d2) * -0.5  # log2 of the distance (0 on the nearest tissue)
    weights = [torch.zeros_like(inv_d2) for _ in range(octaves)]
    for k, cell in enumerate(BUMP_CELLS):
        # thin film over the relief: clusters of small dots; thick film pools into broad blobs
        share = (fine if k == 0 else (1.0 - fine) / (len(BUMP_CELLS) - 1)).view(-1, 1, 1)
        share = share * (1.0 - FILM_SPLIT * film if k == 0 else 1.0 - FILM_SPLIT * (1.0 - film))
        octave = (half_log_d + math.log2(BUMP_CELLS[-1] / cell)).clamp(max=octaves - 1.0)
        for m in range(octaves):
            weights[m] = weights[m] + share * (1.0 - (octave - m).abs()).clamp(min=0.0)
    total = torch.zeros_like(film)
    for m in range(octaves):
        cell_px = top / 2**m
        peaks = fields.noise(keys, f"glare-bumps/{m}", h, w, cell_px, inv_d2)
        bumps = ((peaks - BUMP_LEVEL) * (1.0 / (1.0 - BUMP_LEVEL))).clamp(min=0.0)
        total = total + bumps * bumps * weights[m] * (cell_px / scale)
    return total, film


def inverse_square_t(lum: torch.Tensor, scale: int, fields: _Fields = BATCHED) -> torch.Tensor:
    """(B, H, W) ``1/d^2`` relative to the nearest tissue, from a batch of linear luminance: under
    a light at the lens the diffuse image is ``rho cos(theta) / d^2``, so the smoothed luminance
    over its 98th percentile (at least 1e-3)."""
    irr = fields.gauss(lum, SHADING_SIGMA * scale)
    everywhere = torch.ones_like(irr, dtype=torch.bool)
    top = torch.full((lum.shape[0],), 0.98, dtype=torch.float64, device=lum.device)
    ref = fields.quantile(irr, everywhere, top) + 1e-6
    return (irr * (1.0 / ref).to(torch.float32).view(-1, 1, 1)).clamp(1e-3, 1.0)


def surface_normals_t(inv_d2: torch.Tensor, relief: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, H, W) N . V by shape from shading under a light at the camera: each pixel's surface
    point is ``P = d (u, v, 1)`` with ``d = (1/d^2)^(-1/2)`` lowered by the bumps ``relief``
    (relative height toward the camera) and ``(u, v)`` its normalised image coordinates; the
    normal is ``P_u x P_v``."""
    _b, h, w = inv_d2.shape
    f = FOCAL * scale
    d = (1.0 / torch.sqrt(inv_d2)) * (1.0 - relief)
    u = ((torch.arange(w, device=d.device, dtype=torch.float32) + 0.5 - w / 2) / f).view(1, 1, w)
    v = ((torch.arange(h, device=d.device, dtype=torch.float32) + 0.5 - h / 2) / f).view(1, h, 1)
    du, dv = _gradient(d, 2) * f, _gradient(d, 1) * f
    # P = d q with q = (u, v, 1): P_u x P_v = d (-du, -dv, d + u du + v dv) and, V = -q / |q|,
    # N . V = d / (|(-du, -dv, d + u du + v dv)| |q|) (the normal taken facing the camera)
    t = du * u + dv * v + d
    norm = torch.sqrt(t * t + du * du + dv * dv) * torch.sqrt(u * u + v * v + 1.0)
    return (d / norm).clamp(max=1.0)


def _glare(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    tissue: torch.Tensor,
    fields: _Fields = BATCHED,
) -> torch.Tensor:
    """The model (module docstring) on a (B, C, H, W) batch in [0, 1] with its (B, H, W) bool
    tissue masks."""
    b, c, h, w = x.shape
    scale = min(h, w)
    zero = torch.zeros((), device=x.device)
    lin = _math.srgb_to_linear(x)
    lum = _host.luma_t(lin)
    inv_d2 = inverse_square_t(lum, scale, fields)
    bumps, film = relief_t(keys, inv_d2, scale, p["fine"].to(torch.float32), fields)
    n_dot_v = surface_normals_t(inv_d2, bumps * p["relief"].view(-1, 1, 1), scale)
    shininess = p["shininess"].view(-1, 1, 1)
    # the irradiance falls as 1/d^2; the light guide's mirror image in a bump shrinks as 1/d,
    # so once it is under the lens's resolution its peak falls by a further (1/d)^FAR_EXTRA
    lobe = torch.exp(torch.log(n_dot_v.clamp(min=1e-30)) * shininess) * inv_d2 ** (1.0 + FAR_EXTRA / 2)
    weight = crest_weight_t(lum, scale, fields) * (FILM_FLOOR + (1.0 - FILM_FLOOR) * film)
    fade = fields.ramp(tissue, EDGE_FADE * scale)
    lobe = torch.where(tissue, lobe * weight * fade, zero)
    spec_unit = fields.gauss(lobe, OPTICS_SIGMA * scale)  # the lens PSF
    gains = p["illuminant"].view(-1, 3, 1, 1) if c == 3 else torch.ones(b, 1, 1, 1, device=x.device)
    # the film's wetness: at least what clips a fraction `coverage` of the tissue, at most what
    # clips COVERAGE_SPAN times that (every frame and severity gets highlights, in graded amount)
    # (the wetness at which every channel of a pixel clips, a white core; the ceiling counts a
    # pixel from its first clipped channel: the warm rims count too)
    peak = lin.amax(dim=1)
    head = ((CLIP - lin) / gains).amax(dim=1)
    need = torch.where(
        (spec_unit > 0) & (lin.amin(dim=1) < CLIP),
        head.clamp(min=0.0) / spec_unit.clamp(min=1e-30),
        NO_CLIP,
    )
    cover = p["coverage"].to(torch.float64)
    first = ((CLIP - lin) / gains).amin(dim=1)  # the wetness at which a first channel clips
    need_first = torch.where(
        (spec_unit > 0) & (peak < CLIP), first.clamp(min=0.0) / spec_unit.clamp(min=1e-30), NO_CLIP
    )
    floor = fields.quantile(need, tissue, cover)
    ceiling = fields.quantile(need_first, tissue, (cover * COVERAGE_SPAN).clamp(max=1.0))
    floor = torch.nan_to_num(floor, nan=0.0).clamp(max=WETNESS_MAX).to(torch.float32)
    ceiling = torch.nan_to_num(ceiling, nan=0.0).clamp(max=WETNESS_MAX).to(torch.float32)
    wetness = torch.minimum(torch.maximum(p["wetness"].to(torch.float32), floor), ceiling)
    spec = (spec_unit * wetness.view(-1, 1, 1)).unsqueeze(1)
    # the sensor clips each channel at full well; the overflow blooms into the neighbours
    overflow = (lin + spec * gains).amax(dim=1, keepdim=True) - 1.0
    overflow = overflow.clamp(0.0, BLOOM_CAP)
    bloom = fields.gauss(overflow[:, 0], _px(BLOOM_SIGMA, scale, 0.5)).unsqueeze(1) * BLOOM_GAIN
    light = spec + bloom
    light = torch.where(tissue.unsqueeze(1) & (light > SPEC_FLOOR), light, zero)
    shown = _math.linear_to_srgb((lin + light * gains).clamp(0.0, 1.0))
    if c == 3:  # the processor's white: each display channel saturates at the frame's own level
        shown = torch.maximum(torch.minimum(shown, _saturation(x, tissue, p, fields)), x)
    # the video chain's resolution (demosaicing, scaling to the output raster) softens the
    # clipped edge: the added light blurred in display units
    soft = _px(VIDEO_SIGMA, scale, 0.0)
    added = torch.stack([fields.gauss(shown[:, k] - x[:, k], soft) for k in range(c)], dim=1)
    added = torch.where(tissue.unsqueeze(1) & (added > SPEC_FLOOR), added, zero)
    shown = (x + added).clamp(0.0, 1.0)
    # the processor's unsharp mask of the luma: a dark undershoot ring round each new highlight
    step = (_host.luma_t(shown) - _host.luma_t(x)).clamp(min=0.0)
    ring = (fields.gauss(step, _px(HALO_SIGMA, scale, 1.0)) - step).clamp(min=0.0) * HALO_GAIN
    ring = ring * _smoothstep_t((1.0 - peak) * (1.0 / (1.0 - NATIVE_CLIP)))  # native ones keep theirs
    # (an undershoot takes at most RING_DEPTH of the luma: no black specks between close dots)
    ring = torch.minimum(ring, _host.luma_t(shown) * RING_DEPTH)
    ring = torch.where(tissue & (ring > RING_FLOOR), ring, zero)
    out = (shown - ring.unsqueeze(1)).clamp(0.0, 1.0)
    changed = ((added.amax(dim=1) > 0) | (ring > 0)).unsqueeze(1)
    return torch.where(changed, out, x)


def _saturation(
    x: torch.Tensor, tissue: torch.Tensor, p: dict[str, torch.Tensor], fields: _Fields
) -> torch.Tensor:
    """(B, 3, 1, 1) display level at which each channel of a clipped highlight saturates. The
    video processor's colour matrix and white balance map the sensor's clipped white to a slightly
    warm white (the real highlight cores of the realism reference set: R 248-254, G 248-255,
    B 232-247 of 255): the per-channel median of the frame's own clipped pixels (tissue pixels
    of every channel at least ``NATIVE_LEVEL``) where it has ``NATIVE_MIN_PIXELS`` of them, else
    the keyed ``white`` (its blue; green half way to 1)."""
    b = x.shape[0]
    native = (x.amin(dim=1) >= NATIVE_LEVEL) & tissue
    enough = native.sum(dim=(1, 2)) >= NATIVE_MIN_PIXELS
    half = torch.full((b,), 0.5, dtype=torch.float64, device=x.device)
    measured = torch.stack([fields.quantile(x[:, k], native, half) for k in range(3)], dim=1)
    blue = p["white"].to(torch.float32).view(b, 1)
    keyed = torch.cat([torch.ones_like(blue), (1.0 + blue) / 2.0, blue], dim=1)
    measured = torch.nan_to_num(measured.to(torch.float32), nan=1.0)
    measured = measured / measured.amax(dim=1, keepdim=True).clamp(min=1e-6)
    return torch.where(enough.view(b, 1), measured, keyed).view(b, 3, 1, 1)


def _specular_glare_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``specular_glare`` of a batch in one pass (the torch kernel)."""
    _field, tissue = _host.view_masks(x, scenes)
    return _glare(x.to(torch.float32), p, keys, tissue[:, 0])


@_host.host_op(
    "specular_glare",
    sampler=_glare_sampler,
    dtypes=(np.uint8, np.float32),
    device=_specular_glare_batch,
)
def specular_glare(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Highlights of the light at the lens on the wet, bumpy mucosa (module docstring): the
    batched model on this one sample (the same arithmetic as the torch kernel)."""
    x = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32))[None]
    params = {k: torch.as_tensor(np.asarray(v, dtype=np.float32))[None] for k, v in p.items()}
    tissue = torch.from_numpy(np.ascontiguousarray(view.tissue))[None]
    return _glare(x, params, [key], tissue, HOST)[0].numpy()
