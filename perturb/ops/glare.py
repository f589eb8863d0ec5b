"""Specular highlights on wet mucosa from a physical model of the endoscope's illumination,
the mucus film and the colour-sequential video chain (v8).

Geometry. The light guides sit beside the lens, so light source and camera are (nearly)
co-located at the origin, looking along +z. Under such a light the diffuse image is
``I = rho cos(theta) / d^2`` (Okatani & Deguchi, "Shape reconstruction from an endoscope image
by shape from shading technique for a point light source at the projection center", CVIU 66(2),
1997), so the smoothed luminance gives a relative distance ``d ~ I^(-1/2)``. Each pixel's
surface point is ``P = d (u, v, 1)`` with ``(u, v)`` its normalised image coordinates (focal
length about half the shorter side: wide-angle optics); the normal is ``P_u x P_v``. A keyed
micro-relief (mucus droplets and the crypt and villous pattern, cells of about 1.8 % of the
shorter side, relative depth about 1 %) is added to ``d`` before differentiation: where the
underlying surface nearly faces the camera (fold crests, polyp domes) its small facets break the
highlight into clusters of specks of many sizes.

Reflection. The specular term follows the dichromatic model (Shafer, 1985; ``I = m_d D + m_s L``:
the highlight has the colour of the illuminant ``L``) with a Blinn-Phong lobe (Blinn, SIGGRAPH
1977). With light and viewer co-located the half vector equals the view vector ``V = -P/|P|``, so
the lobe is ``(N . V)^shininess``: highlights sit where the surface faces the camera, not on walls
seen edge-on. The irradiance falls off with the inverse square of the distance, ``1/d^2``,
proportional to the smoothed diffuse luminance, so the far dark lumen gets almost none. The
mucus film is not even: its specular albedo ``wetness`` is weighted by keyed wet patches (a
smooth film-thickness noise of cells about 9 % of the shorter side, smoothstep over ``coverage``
below its highest value on the tissue whose lobe reaches ``WET_SEED`` of the frame's peak), so the
highlights of a frame gather in a few clusters on the surfaces facing the light instead of
spreading evenly over the field.

Sensor and video chain. Specular radiance ``wetness (N.V)^shininess / d^2`` is blurred by the lens
PSF and added in linear light; the sensor clips at full well and the charge that overflows spreads
in a short bloom. Light entering the mucosa round a highlight is scattered and re-emitted with the
tissue's diffuse colour: a halo (a gaussian of the highlight's light up to one full well, 0.4 % of
the shorter side) tinted by the pixel's own linear colour. A colour-sequential scope exposes its
R, G and B fields at successive instants, so scope or tissue motion moves them apart: the red
and blue light of each highlight are the green light moved by +/- a keyed 1-3 px at 1080 lines
(scaled with the frame) along a keyed direction, which leaves the clipped core white inside
coloured fringes (a red/magenta edge on one side, a blue/green one on the other). Highlights are
drawn on the tissue only: they fade out within 1 % of the shorter side of the field's edge; the
dark frame and anything drawn on it stay untouched.

Severity raises the wetness, the relief and the wet patches' extent and lowers the shininess (a
wider lobe); severity 1 adds a few specks, severity 5 clusters of clipped specks and streaks
along crests. On the real sample frames the new highlights' equivalent diameters stay within 2x
of the real ones on the same frames, and the wet patches confine them to 0.25 / 0.40 / 0.54 (at
severities 3 / 4 / 5) of the area an even film would light.
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
WET_CELL = 0.09  # wet patches of the mucus film (shorter side): highlights come in clusters
WET_SEED = 0.2  # the wettest patch is centred on tissue whose lobe reaches this share of the peak
FRINGE_PX = (1.0, 3.0)  # R/B offset from G of a colour-sequential scope at 1080 lines (keyed)
FRINGE_REF = 1080.0
HALO_SIGMA = 0.004  # light scattered in the tissue round a highlight (shorter side)
HALO_GAIN = 0.12
HALO_CAP = 1.0  # full wells of a highlight that feed its halo
SPEC_FLOOR = 1e-5  # specular light (fraction of full well) that moves no 8-bit level (1/30 of the darkest step)


def _glare_sampler(rng: np.random.Generator, level: Level) -> Params:
    tint = rng.uniform(0.95, 1.0, size=3)  # xenon / white LED: near-neutral illuminant
    return {
        "wetness": draw(rng, level["wetness"]),
        "relief": draw(rng, level["relief"]),
        "shininess": draw(rng, level["shininess"]),
        "illuminant": [float(t / tint.max()) for t in tint],
        "coverage": draw(rng, level["coverage"]),
        "fringe": float(rng.uniform(*FRINGE_PX)),
        "fringe_angle": float(rng.uniform(0.0, 2.0 * math.pi)),
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


def wet_patches(noise: np.ndarray, coverage: float, top: float) -> np.ndarray:
    """Weight (H, W) in [0, 1] of the mucus film's wet patches: 1 where the film noise reaches
    ``top`` (its highest value on the tissue that faces the light), falling to 0 at ``coverage``
    below it (smoothstep), so that every frame has a patch where highlights can form and they
    gather in a few clusters instead of spreading over the field."""
    t = noise - np.float32(top - coverage)
    t *= np.float32(1.0 / coverage)
    np.clip(t, np.float32(0.0), np.float32(1.0), out=t)
    return t * t * (np.float32(3.0) - np.float32(2.0) * t)


def wet_patches_t(noise: torch.Tensor, coverage: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """``wet_patches`` of a (B, H, W) batch (``top``: (B,))."""
    top = top - coverage
    t = ((noise - top.view(-1, 1, 1)) * (1.0 / coverage).view(-1, 1, 1)).clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def fringe_offsets(p: dict[str, Any], scale: int) -> list[tuple[float, float]]:
    """(dx, dy) in pixels of the R, G and B fields of a colour-sequential scope: R and B one
    field period before and after G along the keyed direction of the scope's motion."""
    r = float(p["fringe"]) * scale / FRINGE_REF
    a = float(p["fringe_angle"])
    dx, dy = r * math.cos(a), r * math.sin(a)
    return [(dx, dy), (0.0, 0.0), (-dx, -dy)]


def fringe_reach(offsets: Sequence[tuple[float, float]]) -> int:
    """Pixels (Chebyshev) by which the fields' offsets may move light: the bilinear taps of the
    largest."""
    return math.ceil(max(abs(v) for o in offsets for v in o))


def _shifted_at(
    plane: np.ndarray, offsets: Sequence[tuple[float, float]], ys: np.ndarray, xs: np.ndarray
) -> np.ndarray:
    """(len(offsets), N): ``plane`` (H, W) moved by each (dx, dy) in pixels (bilinear, zeros
    shifted in), read at the pixels (ys, xs) only."""
    h, w = plane.shape
    pad = fringe_reach(offsets) + 1
    big = np.zeros((h + 2 * pad, w + 2 * pad), dtype=np.float32)
    big[pad : pad + h, pad : pad + w] = plane
    flat = big.reshape(-1)
    stride = w + 2 * pad
    at_pixels = (ys + pad) * stride + (xs + pad)
    out = np.empty((len(offsets), ys.size), dtype=np.float32)
    for k, (dx, dy) in enumerate(offsets):
        if dx == 0.0 and dy == 0.0:
            out[k] = plane[ys, xs]
            continue
        ix, iy = math.floor(dx), math.floor(dy)
        fx, fy = np.float32(dx - ix), np.float32(dy - iy)

        def at(ox: int, oy: int) -> np.ndarray:
            return np.take(flat, at_pixels - (oy * stride + ox))

        top = at(ix, iy) * (np.float32(1.0) - fx) + at(ix + 1, iy) * fx
        bottom = at(ix, iy + 1) * (np.float32(1.0) - fx) + at(ix + 1, iy + 1) * fx
        out[k] = top * (np.float32(1.0) - fy) + bottom * fy
    return out


def fringe_bound(scale: int) -> int:
    """Pixels (Chebyshev) a field's offset may move light at this frame size, for any key: the
    bilinear taps of the largest offset ``FRINGE_PX`` allows. One bound for every sample, so a
    sample's changed pixels do not depend on the batch it is in."""
    return math.ceil(FRINGE_PX[1] * scale / FRINGE_REF)


def _shift_t(planes: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, reach: int) -> torch.Tensor:
    """``_shifted_at`` of every (H, W) plane of a (B, H, W) batch by its own (dx, dy) ((B,)
    float64, ``|dx|, |dy| <= reach``), for the whole plane: four gathers from one zero-padded
    copy, whatever B."""
    b, h, w = planes.shape
    pad = reach + 1
    big = torch.nn.functional.pad(planes, (pad, pad, pad, pad))
    ix, iy = torch.floor(dx), torch.floor(dy)
    fx = (dx - ix).to(torch.float32).view(-1, 1, 1)
    fy = (dy - iy).to(torch.float32).view(-1, 1, 1)
    ix, iy = ix.to(torch.long), iy.to(torch.long)
    batch = torch.arange(b, device=planes.device).view(-1, 1, 1)
    rows = torch.arange(h, device=planes.device).view(1, -1) + pad
    cols = torch.arange(w, device=planes.device).view(1, -1) + pad

    def at(ox: int, oy: int) -> torch.Tensor:
        r = (rows - (iy + oy).view(-1, 1)).view(b, h, 1)
        q = (cols - (ix + ox).view(-1, 1)).view(b, 1, w)
        return big[batch, r, q]

    top = at(0, 0) * (1.0 - fx) + at(1, 0) * fx
    bottom = at(0, 1) * (1.0 - fx) + at(1, 1) * fx
    return top * (1.0 - fy) + bottom * fy


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
    film = _host.fractal_noise_t(keys, "glare-wet", h, w, WET_CELL * scale, 2, lin)
    shininess = p["shininess"].view(-1, 1, 1)
    floor = torch.exp(math.log(LOBE_FLOOR) / shininess.to(torch.float64)).to(torch.float32)
    facing = n_dot_v > floor
    zero = torch.zeros((), device=x.device)
    lobe = (
        torch.exp(torch.log(n_dot_v.clamp(min=1e-30)) * shininess)
        * inv_d2
        * p["wetness"].view(-1, 1, 1)
    )
    lobe = lobe * _host.soft_mask_t(tissue, EDGE_FADE * scale)[:, 0]
    lobe = torch.where(facing, lobe, zero)
    peak = lobe.amax(dim=(1, 2), keepdim=True)
    strong = facing & (lobe >= WET_SEED * peak)
    top = torch.where(strong, film, torch.full((), -math.inf, device=x.device)).amax(dim=(1, 2))
    lobe = lobe * wet_patches_t(film, p["coverage"], top)
    spec = _host.gauss_t(lobe, OPTICS_SIGMA * scale)
    gains = p["illuminant"].view(-1, 3, 1, 1) if c == 3 else torch.ones(1, 1, 1, 1, device=x.device)
    raw = lin + spec.unsqueeze(1) * gains
    overflow = torch.where(
        spec.unsqueeze(1) > SPEC_FLOOR, (raw.amax(dim=1, keepdim=True) - 1.0).clamp(min=0.0), zero
    )[:, 0]
    light = _host.gauss_t(overflow, BLOOM_SIGMA * scale) * BLOOM_GAIN + spec
    halo = _host.gauss_t(light.clamp(max=HALO_CAP), HALO_SIGMA * scale) * HALO_GAIN
    grow = fringe_bound(scale) if c == 3 else 0
    if c == 3:
        r = p["fringe"].to(torch.float64) * (scale / FRINGE_REF)
        a = p["fringe_angle"].to(torch.float64)
        dx, dy = r * torch.cos(a), r * torch.sin(a)
        fields = torch.stack(
            [_shift_t(light, dx, dy, grow), light, _shift_t(light, -dx, -dy, grow)], dim=1
        )
    else:
        fields = light.unsqueeze(1)
    support = (light > SPEC_FLOOR).to(torch.float32).unsqueeze(1)
    if grow:
        support = torch.nn.functional.max_pool2d(support, 2 * grow + 1, stride=1, padding=grow)
    changed = ((support[:, 0] > 0) | (halo > SPEC_FLOOR)).unsqueeze(1) & tissue
    tint = lin / lin.amax(dim=1, keepdim=True).clamp(min=1e-4)
    out = lin + fields * gains + halo.unsqueeze(1) * tint
    res = _math.linear_to_srgb(out.clamp(0.0, 1.0))
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
    """Blinn-Phong highlights of a light at the camera on a surface from shading, gathered in the
    film's wet patches, inverse-square fall-off, sensor clipping, a short bloom, a tissue-tinted
    scattering halo and colour-sequential R/B fringes (module docstring). Pixels no light
    reaches (under ``SPEC_FLOOR``) keep their input values."""
    c, h, w = img.shape
    scale = _host.side(img)
    tissue = view.tissue
    lin = _host.to_linear(img)
    lum = _host.luma(lin)
    n_dot_v, inv_d2 = surface_normals(lum, key, float(p["relief"]), scale)
    film = _host.fractal_noise(key, "glare-wet", h, w, WET_CELL * scale, 2)
    # wetness (N . V)^shininess / d^2 on the wet patches, where the lobe reaches LOBE_FLOOR
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
        film_at = film.reshape(-1)[facing]
        strong = lobe_at >= np.float32(WET_SEED * float(lobe_at.max()))
        lobe_at *= wet_patches(film_at, float(p["coverage"]), float(film_at[strong].max()))
        lobe[facing] = lobe_at
    # the lens PSF: hairline lobes stay below clipping
    spec = _host.gauss(lobe.reshape(h, w), OPTICS_SIGMA * scale)
    illuminant = np.asarray(p["illuminant"], dtype=np.float32)
    gains = illuminant[:, None] if c == 3 else np.ones((1, 1), np.float32)
    flat_spec = spec.reshape(-1)
    lit = np.flatnonzero(flat_spec > np.float32(SPEC_FLOOR))  # where the light may clip
    raw = lin.reshape(c, -1)[:, lit]
    raw += flat_spec[lit] * gains
    overflow = np.zeros(h * w, dtype=np.float32)
    overflow[lit] = np.clip(raw.max(axis=0) - np.float32(1.0), np.float32(0.0), None)
    light = _host.gauss(overflow.reshape(h, w), BLOOM_SIGMA * scale)
    light *= np.float32(BLOOM_GAIN)
    light += spec
    res = img.copy()
    # the fringe and the halo within the box of the light (and their reach) only
    rows = np.flatnonzero((light > np.float32(SPEC_FLOOR)).any(axis=1))
    if rows.size == 0:
        return res
    cols = np.flatnonzero((light[rows[0] : rows[-1] + 1] > np.float32(SPEC_FLOOR)).any(axis=0))
    offsets = fringe_offsets(p, scale) if c == 3 else [(0.0, 0.0)]
    margin = math.ceil(4.0 * HALO_SIGMA * scale + max(abs(v) for o in offsets for v in o)) + 2
    y0, y1 = max(0, int(rows[0]) - margin), min(h, int(rows[-1]) + 1 + margin)
    x0, x1 = max(0, int(cols[0]) - margin), min(w, int(cols[-1]) + 1 + margin)
    win = np.ascontiguousarray(light[y0:y1, x0:x1])
    halo = _host.gauss(np.minimum(win, np.float32(HALO_CAP)), HALO_SIGMA * scale)
    halo *= np.float32(HALO_GAIN)
    # every pixel a shifted field may reach: the light's support grown by the largest offset
    grow = fringe_bound(scale) if c == 3 else 0
    support = (win > np.float32(SPEC_FLOOR)).view(np.uint8)
    if grow:
        support = np.asarray(
            cv2.dilate(support, np.ones((2 * grow + 1, 2 * grow + 1), np.uint8)), dtype=np.uint8
        )
    inside = ((support > 0) | (halo > np.float32(SPEC_FLOOR))) & tissue[y0:y1, x0:x1]
    ys, xs = np.nonzero(inside)
    if ys.size:
        flat_win = ys * (x1 - x0) + xs
        changed = (ys + y0) * w + (xs + x0)
        base = lin.reshape(c, -1)[:, changed]
        tint = base / np.maximum(base.max(axis=0), np.float32(1e-4))
        out = _shifted_at(win, offsets, ys, xs) * gains
        out += halo.reshape(-1)[flat_win] * tint
        out += base
        res.reshape(c, -1)[:, changed] = _host.to_display(
            np.clip(out, np.float32(0.0), np.float32(1.0))
        )
    return res
