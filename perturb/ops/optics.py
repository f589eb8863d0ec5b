"""The endoscope's distal optics: condensation, water drops, lateral colour and distortion.

These act on the tissue seen through the lens, inside the field of view (the dark frame and what
is drawn on it stay untouched); radii are measured from the field's centre in units of the
field's radius (a disk of the field's area), so a severity means the same on round, octagonal
and letterboxed fields.

* ``lens_fog``: condensation on the cold distal lens when it enters the warm, humid colon. The
  film is a layer of droplets much smaller than a pixel: Mie scattering redistributes part of the
  light of each point over a wide forward lobe (a veiling glare ``I' = (1 - s) I + s (G * I)``
  with a wide gaussian ``G``) and adds a veil of scattered light, so contrast falls and the image
  looks milky. The film forms first at the lens rim (the coldest part), so the scattered fraction
  ``s`` grows with the radius, patchy (keyed noise, with clear gaps and dense patches), and
  beaded: as the mist coalesces into droplets of a few pixels the film scatters more where they
  sit and they glitter faintly with the light they scatter back, a fine mottle instead of a
  uniform veil. At severity 5 the film covers nearly all the field. (Forward scattering by
  droplets and the veiling-glare model: e.g. Narasimhan & Nayar, IJCV 48, 2002.)
* ``lens_droplets``: water drops on the lens (after rinsing). A drop is a plano-convex liquid
  lens sitting far inside the focal distance of the camera: the tissue behind it is seen
  through it displaced and minified towards the drop's centre (a bulge of the sampling
  positions), out of focus (the drop's surface is not in the focal plane: a gaussian blur), with
  a dark rim where the steep contact-angle edge refracts light out of the aperture and a small
  bright reflex of the light at the lens.
* ``chromatic_aberration``: lateral colour. The lens's magnification depends on the wavelength,
  so the red and blue images are scaled about the optical axis by ``1 +- k`` relative to green:
  colour fringes whose width ``k r`` grows linearly with the radius (Hecht, Optics, ch. 6.3).
* ``lens_distortion``: a change of the wide-angle lens's radial distortion (Brown-Conrady model,
  Brown 1966): an output point at normalised radius ``rho`` shows the tissue at radius
  ``rho (1 + k rho^2) / (1 + k)`` (radius 1 stays), barrel-like (more fisheye) for ``k > 0``
  and pincushion-like for ``k < 0``. A geometric op: boxes and masks move with it
  (its registered ``Geometry``: ``perturb.engine.annotations``, ``perturb.augment.targets``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch
from scipy import sparse

from perturb.ops import _host, _math, exact
from perturb.ops.kernels import Geometry, Level, Params, as_float32, draw, draw_int, draw_sign
from perturb.scene import masks

# ---------------------------------------------------------------------------------------------
# Lens fog

FOG_SIGMA = 0.06  # width of the forward-scatter lobe (shorter side)
FOG_PATCHY = (0.55, 0.7)  # film density = a + b * noise: clear gaps and dense patches
FOG_DROPLET = 0.005  # cell of the beaded droplets (shorter side)
FOG_BEADS = (0.0, 0.6)  # where the droplet noise makes beads (threshold, ramp)
FOG_SPARKLE = 0.2  # light the beads scatter back towards the lens, relative to the lobe


def _fog_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "fog": draw(rng, level["fog"]),
        "veil": float(rng.uniform(0.5, 0.8)),
        "reach": float(rng.uniform(0.35, 0.6)),
    }


def _lens_fog_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``lens_fog`` of a batch in one pass (the torch kernel): the film's density from the
    field geometry and batched keyed noise, the forward-scatter lobe as a batched gaussian."""
    _b, _c, h, w = x.shape
    scale = min(h, w)
    field, tissue = _host.view_masks(x, scenes)
    cx, cy, radius = (v.to(torch.float32).view(-1, 1, 1) for v in _host.field_geometry_t(field))
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, 1, w)
    rho = torch.sqrt((xs - cx) ** 2 + (ys - cy) ** 2) / radius
    reach = p["reach"].to(torch.float64)
    start = ((1.0 - reach) * 0.6).to(torch.float32).view(-1, 1, 1)
    grow = ((rho - start) / reach.to(torch.float32).view(-1, 1, 1)).clamp(0.0, 1.0)
    noise = _host.fractal_noise_t(keys, "fog-patches", h, w, 0.2 * scale, 3, x)
    patches = (FOG_PATCHY[0] + FOG_PATCHY[1] * noise).clamp(min=0.05)
    grains = _host.fractal_noise_t(keys, "fog-droplets", h, w, FOG_DROPLET * scale, 2, x)
    beads = ((grains - FOG_BEADS[0]) / FOG_BEADS[1]).clamp(0.0, 1.0)
    s = (
        (p["fog"].view(-1, 1, 1) * (0.5 + 0.5 * grow) * patches * (0.8 + 0.4 * beads))
        .clamp(0.0, 0.97)
        .unsqueeze(1)
    )
    lin = _math.srgb_to_linear(x)
    inside = tissue.to(torch.float32)
    sigma = FOG_SIGMA * scale
    weight = _host.gauss_t(inside, sigma) + 1e-6
    spread = _host.gauss_t(lin * inside, sigma) / weight
    mean = _host.masked_mean(_host.luma_t(lin), tissue[:, 0], 0.2)
    veil = (p["veil"] * mean).view(-1, 1, 1, 1)
    scattered = spread * 0.8 + veil * 0.6
    sparkle = FOG_SPARKLE * beads.unsqueeze(1) * s * spread
    out = lin * (1.0 - s) + scattered * s + sparkle
    res = _math.linear_to_srgb(out)
    return torch.where(tissue, res, x).clamp(0.0, 1.0)


@_host.host_op(
    "lens_fog", sampler=_fog_sampler, dtypes=(np.uint8, np.float32), device=_lens_fog_batch
)
def lens_fog(img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View) -> np.ndarray:
    """Condensation veil: forward-scatter blur plus scattered light, growing from the rim with
    patchy density (module docstring)."""
    _c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    cx, cy, radius = _host.field_geometry(view.field)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    rho = np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2) / np.float32(radius)
    reach = float(p["reach"])  # how far in from the rim the film extends at full density
    grow = np.clip((rho - (1.0 - reach) * 0.6) / reach, 0.0, 1.0)
    noise = _host.fractal_noise(key, "fog-patches", h, w, 0.2 * scale, 3)
    patches = np.maximum(FOG_PATCHY[0] + FOG_PATCHY[1] * noise, np.float32(0.05))
    # the film is beaded: droplets coalesced from the mist scatter more, in a fine mottle
    grains = _host.fractal_noise(key, "fog-droplets", h, w, FOG_DROPLET * scale, 2)
    beads = np.clip((grains - FOG_BEADS[0]) / FOG_BEADS[1], 0.0, 1.0)
    density = np.float32(p["fog"]) * (0.5 + 0.5 * grow) * patches * (0.8 + 0.4 * beads)
    s = np.clip(density, 0.0, 0.97).astype(np.float32)
    lin = _host.to_linear(img)
    inside = tissue.astype(np.float32)
    # the scattered light stays within the field: normalised blur of the field's light only
    weight = _host.gauss(inside, FOG_SIGMA * scale) + 1e-6
    spread = (
        _host.per_channel(lin * inside[None], lambda z: _host.gauss(z, FOG_SIGMA * scale))
        / weight[None]
    )
    veil = np.float32(p["veil"]) * float(_host.luma(lin)[tissue].mean() if tissue.any() else 0.2)
    scattered = spread * 0.8 + veil * 0.6
    # the beads catch the light that the film scatters: a faint glitter where they sit
    sparkle = FOG_SPARKLE * (beads * s)[None] * spread
    out = lin * (1.0 - s[None]) + scattered * s[None] + sparkle
    res = _host.to_display(out)
    res[:, ~tissue] = img[:, ~tissue]
    return res


# ---------------------------------------------------------------------------------------------
# Water droplets on the lens

DROP_BULGE = 0.4  # how strongly a drop pulls the sampling positions to its centre
DROP_BLUR = 0.08  # defocus blur inside a drop, fraction of its radius
DROP_EDGE = 0.15  # width of the drop's defocused outline, fraction of its radius


def _droplet_sampler(rng: np.random.Generator, level: Level) -> Params:
    count = draw_int(rng, level["count"])
    radius = draw(rng, level["radius"])
    drops = []
    for _ in range(count):
        r_field = 0.95 * math.sqrt(float(rng.uniform()))  # uniform over the field's disk
        phi = float(rng.uniform(0.0, 2.0 * math.pi))
        drops.append(
            [
                r_field * math.cos(phi),
                r_field * math.sin(phi),
                radius * float(np.exp(rng.normal(0.0, 0.35))),
                float(rng.uniform(0.75, 1.0)),
            ]
        )
    return {"count": count, "radius": radius, "drops": drops}


def render_drop(
    src: np.ndarray, out: np.ndarray, cx: float, cy: float, r: float, aspect: float
) -> None:
    """One drop of radius ``r`` px (ellipse of ``aspect``) at (cx, cy) px: refracted, defocused
    tissue read from ``src`` (CHW linear), dark rim and reflex, drawn onto ``out``."""
    _c, h, w = src.shape
    x0, x1 = max(0, int(cx - r - 3)), min(w, int(cx + r + 4))
    y0, y1 = max(0, int(cy - r - 3)), min(h, int(cy + r + 4))
    if x0 >= x1 or y0 >= y1 or r < 2.0:
        return
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dx, dy = xs + 0.5 - cx, (ys + 0.5 - cy) / np.float32(aspect)
    rho = np.sqrt(dx * dx + dy * dy) / np.float32(r)
    # the drop sits on the lens, far from the focal plane: its outline is soft
    cover = np.clip((1.0 - rho) / DROP_EDGE + 0.5, 0.0, 1.0)
    cover = cover * cover * (3.0 - 2.0 * cover)
    if not cover.any():
        return
    inner = np.minimum(rho, 1.0)
    # a plano-convex drop: the sampling positions bulge towards the centre (minified view)
    pull = 1.0 - DROP_BULGE * np.sqrt(1.0 - inner * inner)
    pad = math.ceil(3 * DROP_BLUR * r) + 2
    bx0, bx1, by0, by1 = (
        max(0, x0 - pad - int(r)),
        min(w, x1 + pad + int(r)),
        max(0, y0 - pad - int(r)),
        min(h, y1 + pad + int(r)),
    )
    patch = _host.per_channel(src[:, by0:by1, bx0:bx1], lambda z: _host.gauss(z, DROP_BLUR * r))
    mx = (cx + dx * pull - 0.5 - bx0).astype(np.float32)
    my = (cy + dy * np.float32(aspect) * pull - 0.5 - by0).astype(np.float32)
    seen = _host.sample_bilinear(patch, mx, my)
    rim = 1.0 - 0.3 * np.exp(-0.5 * ((rho - 0.9) / 0.08) ** 2)  # light refracted out at the edge
    reflex = 0.25 * np.exp(-0.5 * (((dx / r) + 0.3) ** 2 + ((dy / r) + 0.3) ** 2) / 0.1**2)
    drop = seen * 1.05 * rim + reflex
    region = out[:, y0:y1, x0:x1]
    region[...] = region * (1.0 - cover) + drop * cover


def _lens_droplets_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``lens_droplets`` of a batch (the torch kernel): the padded (B, N, 4) drops of every
    sample slot by slot, each slot one drop per sample drawn over the whole frame (``render_drop``'s
    formulas, its cover cut to the drop's box as there): the tissue behind read by a batched
    bilinear remap of the frame blurred with that drop's own sigma (``_host.gauss_spectra``: one
    spectrum of the batch, a per-sample gaussian per slot). The loop runs over the slots (at most
    the severity table's count), never over the samples."""
    b, _c, h, w = x.shape
    scale = min(h, w)
    field, tissue = _host.view_masks(x, scenes)
    fx, fy, fr = _host.field_geometry_t(field)
    lin = _math.srgb_to_linear(x)
    out = lin
    rows = p["drops"].reshape(b, -1, 4).to(torch.float64)
    spectrum = _host.reflected_spectrum(lin)
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, 1, w)
    yi = torch.arange(h, device=x.device).view(1, h, 1)
    xi = torch.arange(w, device=x.device).view(1, 1, w)
    for k in range(rows.shape[1]):
        ux, uy, dr, aspect = rows[:, k].unbind(1)
        cx, cy, r = fx + ux * fr, fy + uy * fr, dr * scale
        x0 = torch.trunc(cx - r - 3).clamp(min=0).view(-1, 1, 1)
        x1 = torch.trunc(cx + r + 4).clamp(max=w).view(-1, 1, 1)
        y0 = torch.trunc(cy - r - 3).clamp(min=0).view(-1, 1, 1)
        y1 = torch.trunc(cy + r + 4).clamp(max=h).view(-1, 1, 1)
        drawn = ((dr > 0) & (r >= 2.0)).view(-1, 1, 1)
        box = drawn & (xi >= x0) & (xi < x1) & (yi >= y0) & (yi < y1)
        cx32, cy32 = cx.to(torch.float32).view(-1, 1, 1), cy.to(torch.float32).view(-1, 1, 1)
        r32, a32 = r.to(torch.float32).view(-1, 1, 1), aspect.to(torch.float32).view(-1, 1, 1)
        r32 = torch.where(drawn, r32, 1.0)  # padding slots: finite fields, cut by ``box``
        a32 = torch.where(drawn, a32, 1.0)
        dx, dy = xs + 0.5 - cx32, (ys + 0.5 - cy32) / a32
        rho = torch.sqrt(dx * dx + dy * dy) / r32
        cover = ((1.0 - rho) / DROP_EDGE + 0.5).clamp(0.0, 1.0)
        cover = cover * cover * (3.0 - 2.0 * cover) * box
        inner = rho.clamp(max=1.0)
        pull = 1.0 - DROP_BULGE * torch.sqrt(1.0 - inner * inner)
        blurred = _host.blur_from_spectrum(spectrum, DROP_BLUR * r, h, w)
        map_x = cx32 + dx * pull - 0.5
        map_y = cy32 + dy * a32 * pull - 0.5
        seen = _host.remap(blurred, map_x, map_y, "linear", "reflect101")
        rim = 1.0 - 0.3 * torch.exp(-0.5 * ((rho - 0.9) / 0.08) ** 2)
        reflex = 0.25 * torch.exp(
            -0.5 * (((dx / r32) + 0.3) ** 2 + ((dy / r32) + 0.3) ** 2) / 0.1**2
        )
        drop = seen * 1.05 * rim.unsqueeze(1) + reflex.unsqueeze(1)
        cover = cover.unsqueeze(1)
        out = out * (1.0 - cover) + drop * cover
    res = _math.linear_to_srgb(out.clamp(0.0, 1.0))
    return torch.where(tissue, res, x).clamp(0.0, 1.0)


@_host.host_op(
    "lens_droplets",
    sampler=_droplet_sampler,
    dtypes=(np.uint8, np.float32),
    device=_lens_droplets_batch,
)
def lens_droplets(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Water drops on the lens: refracted, defocused tissue inside each drop, dark rim, small
    reflex (module docstring)."""
    _c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    cx, cy, radius = _host.field_geometry(view.field)
    lin = _host.to_linear(img)
    out = lin.copy()
    rows = np.asarray(p["drops"], dtype=np.float64).reshape(-1, 4)
    for ux, uy, dr, aspect in rows[rows[:, 2] > 0].tolist():
        render_drop(lin, out, cx + ux * radius, cy + uy * radius, dr * scale, aspect)
    res = _host.to_display(np.clip(out, 0.0, 1.0))
    res[:, ~tissue] = img[:, ~tissue]
    return res


# ---------------------------------------------------------------------------------------------
# The tissue behind the fixed aperture (lateral colour, distortion, scope roll)
#
# The field stop (the octagonal or round aperture) and the processor's overlays sit on the sensor
# side of the distal lens: they neither distort nor fringe, only the image of the tissue does. A
# frame is the tissue radiance T seen through the optics and then through a fixed aperture whose
# rim darkens it (the anti-aliased edge a few pixels wide, plus its JPEG ringing). An op that
# moves the tissue image (a warp W of T) changes the frame by ``w (W(T) - T)``, ``w`` the
# aperture's clear part (1 inside the field, 0 on the rim and outside): the rim and the surround
# stay as they are, no dark rim is pulled into the tissue (no coloured line along the edge, no
# black sliver) and nothing is pushed out into the surround. T inside the clear part is the frame;
# on the rim, beyond it and under the on-screen overlays it is a smooth extension of the tissue
# (normalised convolutions of the clear tissue, fine to coarse), so the content a warp brings in
# at the field's edge is tissue and no overlay moves with it. The ops read the clean frame (they
# are not ``spatial``: the engine's own extension would blend its fill into the rim's pixels).

RIM_WIDTH = 0.005  # the aperture's dark rim (analysis of the 21 shared frames: 4-7 px at 1080 px)
RIM_MIN_PX = 3.0  # ... and at least this many pixels (the anti-aliased edge of small frames)
FILL_SIGMAS = (0.012, 0.04, 0.15)  # normalised-convolution fills, fine to coarse (shorter side)
FILL_COVER = 0.25  # a finer fill is trusted where its blurred weight reaches this
# the fills are smooth: they run on a grid downscaled (area) by the largest integer factor that
# keeps the finest fill's sigma at least this many cells, and come back bilinear (1 on frames
# under 250 px, 4 at 512 px, 8 at 1080p: the blurs and the fill arithmetic 16-64x cheaper). The
# fill shows only where the aperture is not clear (the rim band, the surround, under overlays),
# smooth there at the finest sigma's scale: 1.5 cells of it (3 until lens_distortion v5) change
# <= 10 levels on ~2% of the pixels of a 512 px frame, all within a few px of the field's edge
FILL_GRID_PX = 1.5
# ... and each fill's blur runs on a grid coarser still, by the largest integer factor that keeps
# its sigma at least this many cells (area down, bilinear up: ``_fill_gauss``)
FILL_BLUR_PX = 3.0
# T is read from the frame only beyond twice the rim: the field's polygon may sit a few pixels off
# the real edge, and small marks on the edge (scope markers) must not move with the tissue
RADIANCE_REACH = 2.0


def rim_px(h: int, w: int) -> float:
    """Width in pixels of the aperture's rim of an h x w frame: the clear part starts this far
    inside the field and is fully clear at twice the distance."""
    return max(RIM_MIN_PX, RIM_WIDTH * min(h, w))


def aperture_weight(field: np.ndarray, reach: float = 1.0, framed: bool = False) -> np.ndarray:
    """float32 (H, W) in [0, 1], read-only: the clear part of the aperture of the bool field
    ``field`` (its rim ``reach`` times ``rim_px`` wide). ``framed``: the image's border is an
    edge too (frames often carry a dark line along it where the field touches it)."""
    weight = _aperture_weight(np.ascontiguousarray(field, dtype=bool), reach, framed)
    weight.flags.writeable = False
    return weight


def view_aperture(
    view: _host.View, of: str = "field", reach: float = 1.0, framed: bool = False
) -> np.ndarray:
    """``aperture_weight`` of the frame's field of view (``of="field"``) or tissue
    (``"tissue"``). Where the mask follows from the scene's descriptor alone (the field; the
    tissue of a frame without text lines) it is derived data of the scene, kept with its masks
    (``masks.derived``, keyed by the descriptor): a frame's weights come back with every optics
    and geometric op on it. Otherwise (no scene, or glyph strokes read from the pixels) it is
    computed."""
    mask = view.field if of == "field" else view.tissue
    scene = view.scene
    if scene is None or (of != "field" and scene.reads_pixels):
        return aperture_weight(mask, reach, framed)
    return masks.derived(
        f"aperture/{of}/{float(reach)!r}/{bool(framed)}",
        scene.key,
        lambda: aperture_weight(mask, reach, framed),
    )


def _aperture_weight(field: np.ndarray, reach: float, framed: bool) -> np.ndarray:
    h, w = field.shape
    if framed:
        padded = np.pad(field, 1, constant_values=False)
        return np.ascontiguousarray(_host.soft_mask(padded, reach * rim_px(h, w))[1:-1, 1:-1])
    return _host.soft_mask(field, reach * rim_px(h, w))


def _fill_gauss(planes: np.ndarray, sigma_px: float) -> np.ndarray:
    """Gaussian blur (reflected borders) of float32 (H, W) or (H, W, C) ``planes`` for a fill:
    on a copy downscaled (area) by ``sigma_px // FILL_BLUR_PX``, bilinear back."""
    factor = max(1, int(sigma_px // FILL_BLUR_PX))
    if factor == 1:
        return _host.gauss(planes, sigma_px)
    h, w = planes.shape[:2]
    small = cv2.resize(
        planes, (max(1, w // factor), max(1, h // factor)), interpolation=cv2.INTER_AREA
    )
    blurred = cv2.GaussianBlur(
        small, (0, 0), sigma_px / factor, borderType=cv2.BORDER_REFLECT_101
    )
    return cv2.resize(blurred, (w, h), interpolation=cv2.INTER_LINEAR)


@lru_cache(maxsize=64)
def _fill_gauss_axis(n: int, sigma_px: float, device: str) -> torch.Tensor:
    """float32 (n, n): ``_fill_gauss`` along one axis of length ``n`` (cached, read-only)."""
    factor = max(1, int(sigma_px // FILL_BLUR_PX))
    if factor == 1:
        return _host.gauss_axis_matrix(n, sigma_px, device)
    small = max(1, n // factor)
    m = (
        _host._resize_matrix(small, n, "linear")
        @ _host._gauss_axis(small, sigma_px / factor)
        @ _host._resize_matrix(n, small, "area")
    )
    return torch.from_numpy(m.astype(np.float32)).to(device)


def _fill_gauss_t(planes: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """``_fill_gauss`` of every (H, W) plane of a float32 (..., H, W) batch."""
    h, w = planes.shape[-2:]
    rows = _fill_gauss_axis(h, sigma_px, str(planes.device))
    cols = _fill_gauss_axis(w, sigma_px, str(planes.device))
    return exact.separable(rows, planes, cols)


def fill_factor(h: int, w: int) -> int:
    """The integer factor the fills of an h x w frame are downscaled by (``FILL_GRID_PX``)."""
    return max(1, int(FILL_SIGMAS[0] * min(h, w) // FILL_GRID_PX))


def resize_planes(planes: np.ndarray, size: tuple[int, int], interpolation: int) -> np.ndarray:
    """``cv2.resize`` of every (H, W) plane of float32 (C, H, W) ``planes`` to ``size`` (width,
    height), each written straight into its slot of the (C, height, width) result."""
    out = np.empty((planes.shape[0], size[1], size[0]), dtype=np.float32)
    for plane, slot in zip(planes, out, strict=True):
        cv2.resize(plane, size, dst=slot, interpolation=interpolation)
    return out


def tissue_radiance(img: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """float32 (C, H, W): the tissue behind the aperture, ``w img + (1 - w) F`` with ``F`` the
    normalised convolution of the clear tissue (``FILL_SIGMAS``, a finer one wherever its weight
    covers ``FILL_COVER``; on a grid ``fill_factor`` coarser, each blur on a coarser grid still:
    ``_fill_gauss``); ``weight``:
    ``aperture_weight(field, RADIANCE_REACH)``."""
    h, w = img.shape[-2:]
    scale = min(h, w)
    weighted = img * weight[None]
    factor = fill_factor(h, w)
    grid_weight, grid_weighted = weight, weighted
    if factor > 1:
        small = (max(1, w // factor), max(1, h // factor))
        grid_weight = cv2.resize(weight, small, interpolation=cv2.INTER_AREA)
        grid_weighted = resize_planes(weighted, small, cv2.INTER_AREA)
    fill: np.ndarray | None = None
    for sigma in reversed(FILL_SIGMAS):  # float32 arithmetic, in place
        sigma_px = sigma * scale / factor
        cover = _fill_gauss(grid_weight, sigma_px)
        level = np.empty_like(grid_weighted)
        for z, blurred in zip(grid_weighted, level, strict=True):
            blurred[...] = _fill_gauss(z, sigma_px)
        level /= np.maximum(cover, np.float32(1e-6))[None]
        if fill is None:
            fill = level
        else:
            level -= fill
            level *= np.clip(cover / np.float32(FILL_COVER), 0.0, 1.0)[None]
            fill += level
    assert fill is not None
    if factor > 1:
        fill = resize_planes(fill, (w, h), cv2.INTER_LINEAR)
    fill *= (np.float32(1.0) - weight)[None]
    fill += weighted
    return fill.astype(np.float32, copy=False)


def remap_planes(
    planes: np.ndarray, map_x: np.ndarray, map_y: np.ndarray, border: int, value: float = 0.0
) -> np.ndarray:
    """float32 (C, H, W) ``planes`` resampled bicubic through the pixel-index maps: one
    ``cv2.remap`` of the interleaved image (the same values as one call per plane, the maps'
    interpolation set up once)."""
    c, h, w = planes.shape
    moved = cv2.remap(
        cv2.merge(list(planes)), map_x, map_y, cv2.INTER_CUBIC, borderMode=border,
        borderValue=(value,) * 4,
    )
    return np.ascontiguousarray(moved.reshape(h, w, c).transpose(2, 0, 1))


def aperture_weight_t(
    field: torch.Tensor, reach: float = 1.0, framed: bool = False
) -> torch.Tensor:
    """``aperture_weight`` of a bool (B, 1, H, W) batch: float32 (B, 1, H, W)."""
    h, w = field.shape[-2:]
    if framed:
        padded = torch.nn.functional.pad(field, (1, 1, 1, 1), value=False)
        return _host.soft_mask_t(padded, reach * rim_px(h, w))[..., 1:-1, 1:-1]
    return _host.soft_mask_t(field, reach * rim_px(h, w))


def tissue_radiance_t(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``tissue_radiance`` of a batch: ``x`` (B, C, H, W), ``weight`` (B, 1, H, W); the grid
    resizes as OpenCV's (``_fill_axes``), two matrix products each."""
    h, w = x.shape[-2:]
    scale = min(h, w)
    weighted = x * weight
    factor = fill_factor(h, w)
    grid_weight, grid_weighted = weight, weighted
    if factor > 1:
        down_rows, up_rows = _fill_axes(h, factor, str(x.device))
        down_cols, up_cols = _fill_axes(w, factor, str(x.device))
        grid_weight = down_rows @ weight @ down_cols.T
        grid_weighted = down_rows @ weighted @ down_cols.T
    fill: torch.Tensor | None = None
    for sigma in reversed(FILL_SIGMAS):
        sigma_px = sigma * scale / factor
        cover = _fill_gauss_t(grid_weight, sigma_px)
        level = _fill_gauss_t(grid_weighted, sigma_px) / cover.clamp(min=1e-6)
        if fill is None:
            fill = level
        else:
            fill = fill + (cover / FILL_COVER).clamp(0.0, 1.0) * (level - fill)
    assert fill is not None
    if factor > 1:
        fill = up_rows @ fill @ up_cols.T
    return weighted + (1.0 - weight) * fill


@lru_cache(maxsize=32)
def _fill_axes(n: int, factor: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (n // factor, n) area downscale and (n, n // factor) bilinear upscale along one
    axis, as ``cv2.resize`` (cached: treat as read-only)."""
    small = max(1, n // factor)
    down = _host._resize_matrix(n, small, "area").astype(np.float32)
    up = _host._resize_matrix(small, n, "linear").astype(np.float32)
    return torch.from_numpy(down).to(device), torch.from_numpy(up).to(device)


def warp_tissue_t(
    x: torch.Tensor,
    field: torch.Tensor,
    tissue: torch.Tensor,
    map_x: torch.Tensor,
    map_y: torch.Tensor,
) -> torch.Tensor:
    """The tissue of ``x`` resampled through (map_x, map_y) inside the fixed field stop: the
    tissue's radiance (extended beyond the field) is warped and the change enters through the
    aperture weight; pixels outside the tissue (surround, overlays) stay as they are."""
    weight = aperture_weight_t(field)
    radiance = tissue_radiance_t(x, aperture_weight_t(tissue, RADIANCE_REACH, framed=True))
    moved = _host.remap(radiance, map_x, map_y, "cubic", "reflect101")
    return torch.where(tissue, x + weight * (moved - radiance), x)


def scene_flags(x: torch.Tensor, scenes: Sequence[Any] | None) -> torch.Tensor:
    """bool (B, 1, 1, 1) on ``x``'s device: which samples come with an engine scene of their
    size (the tissue layer of a border-protecting record), from host-side data alone."""
    h, w = x.shape[-2:]
    given = (
        [False] * x.shape[0]
        if scenes is None
        else [s is not None and tuple(s.size) == (h, w) for s in scenes]
    )
    return torch.tensor(given, dtype=torch.bool).to(x.device).view(-1, 1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Lateral chromatic aberration


def _ca_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"shift": draw(rng, level["shift"]) * draw_sign(rng)}


def channel_scale_maps(
    h: int, w: int, cx: float, cy: float, magnification: float
) -> tuple[np.ndarray, np.ndarray]:
    """Source pixel-index maps of an image magnified by ``magnification`` about (cx, cy) px."""
    xs = (np.arange(w, dtype=np.float64) + 0.5 - cx) / magnification + cx - 0.5
    ys = (np.arange(h, dtype=np.float64) + 0.5 - cy) / magnification + cy - 0.5
    map_x = np.broadcast_to(xs[None, :], (h, w)).astype(np.float32)
    map_y = np.broadcast_to(ys[:, None], (h, w)).astype(np.float32)
    return map_x, map_y


def _cubic_axis(positions: np.ndarray, n: int) -> sparse.csr_matrix:
    """float32 (len, n) resampling matrix of a 1-D bicubic read (OpenCV's kernel,
    ``_host._cubic_weights``) at float32 pixel-index ``positions`` on an axis of ``n`` pixels,
    reflect-101 border: 4 taps a row (a tap folded onto another adds to it)."""
    base = np.floor(positions)
    weights = _host._cubic_weights((positions - base).astype(np.float32))
    taps = base.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    if n == 1:
        taps = np.zeros_like(taps)
    else:
        period = 2 * (n - 1)
        taps = np.mod(taps, period)
        taps = np.where(taps >= n, period - taps, taps)
    return sparse.csr_matrix(
        (np.stack(weights, axis=1).ravel(), taps.ravel(), np.arange(0, 4 * len(positions) + 1, 4)),
        shape=(len(positions), n),
        dtype=np.float32,
    )


def scale_plane(plane: np.ndarray, cx: float, cy: float, magnification: float) -> np.ndarray:
    """float32 (H, W) ``plane`` magnified by ``magnification`` about (cx, cy) px, bicubic with
    reflect-101 borders, at the positions of ``channel_scale_maps``. A scale about a point moves
    columns and rows independently, so the bicubic sum over 4 x 4 taps is a pass of 4 taps down
    the columns and one of 4 along the rows: two sparse matrix products (the same interpolation
    as the dense remap, the products summed in another order: within 1e-6)."""
    h, w = plane.shape
    map_x, map_y = (
        ((np.arange(n, dtype=np.float64) + 0.5 - c) / magnification + c - 0.5).astype(np.float32)
        for n, c in ((w, cx), (h, cy))
    )
    down = np.asarray(_cubic_axis(map_y, h) @ plane, dtype=np.float32)
    across = np.asarray(_cubic_axis(map_x, w) @ cv2.transpose(down), dtype=np.float32)
    return cv2.transpose(across)


def _chromatic_aberration_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``chromatic_aberration`` of a batch in one pass (the torch kernel): the tissue behind the
    aperture (batched fills), its red and blue planes scaled about each field's centre by one
    batched bicubic remap, the change added inside the clear aperture."""
    _b, c, h, w = x.shape
    if c == 1:
        return x.clone()
    field, tissue = _host.view_masks(x, scenes)
    cx, cy, _ = _host.field_geometry_t(field)
    weight = aperture_weight_t(field)
    radiance = tissue_radiance_t(x, aperture_weight_t(tissue, RADIANCE_REACH, framed=True))
    k = p["shift"].to(torch.float64)
    m = torch.cat([1.0 + k, 1.0 - k])[:, None]  # red of every sample, then blue
    cx2, cy2 = torch.cat([cx, cx])[:, None], torch.cat([cy, cy])[:, None]
    xs = torch.arange(w, device=x.device, dtype=torch.float64)[None, :]
    ys = torch.arange(h, device=x.device, dtype=torch.float64)[None, :]
    map_x = ((xs + 0.5 - cx2) / m + cx2 - 0.5).to(torch.float32)[:, None, :].expand(-1, h, w)
    map_y = ((ys + 0.5 - cy2) / m + cy2 - 0.5).to(torch.float32)[:, :, None].expand(-1, h, w)
    sources = torch.cat([radiance[:, 0:1], radiance[:, 2:3]])
    planes = _host.remap(sources, map_x, map_y, "cubic", "reflect101")
    change = (planes - sources).chunk(2)
    out = torch.cat(
        [x[:, 0:1] + weight * change[0], x[:, 1:2], x[:, 2:3] + weight * change[1]], dim=1
    )
    return torch.where(tissue, out, x).clamp(0.0, 1.0)


@_host.host_op(
    "chromatic_aberration",
    sampler=_ca_sampler,
    dtypes=(np.uint8, np.float32),
    device=_chromatic_aberration_batch,
)
def chromatic_aberration(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Red image of the tissue scaled by ``1 + shift``, blue by ``1 - shift`` about the field's
    centre (``shift`` is the fringe width at the field's radius, as a fraction of that radius),
    behind the fixed aperture (section comment above)."""
    c = img.shape[0]
    if c == 1:
        return img.copy()
    tissue = view.tissue
    cx, cy, _ = _host.field_geometry(view.field)
    weight = view_aperture(view) * tissue  # 0 off the tissue: those pixels stay exactly
    # the red and blue planes alone: green does not move, and each plane's fill is its own
    red_blue = tissue_radiance(img[0::2], view_aperture(view, "tissue", RADIANCE_REACH, framed=True))
    k = float(p["shift"])
    out = img.copy()
    for channel, plane, m in ((0, red_blue[0], 1.0 + k), (2, red_blue[1], 1.0 - k)):
        moved = scale_plane(plane, cx, cy, m)
        moved -= plane
        moved *= weight
        out[channel] += moved
    return out


# ---------------------------------------------------------------------------------------------
# Radial distortion (geometric)


def _distortion_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"k": draw(rng, level["k"]) * draw_sign(rng)}


def distortion_frame(width: int, height: int) -> tuple[float, float, float]:
    """(cx, cy, R): the optical centre (image centre) and the unit radius (half the shorter side)
    of ``lens_distortion``, in continuous pixel coordinates. The frame depends on the image size
    alone, so boxes and masks move exactly as the pixels."""
    return width / 2.0, height / 2.0, min(width, height) / 2.0


def distortion_source(
    x: np.ndarray, y: np.ndarray, k: float, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """Continuous source coordinates of output points (x, y): radius ``rho`` reads ``rho (1 + k
    rho^2) / (1 + k)``."""
    cx, cy, radius = distortion_frame(width, height)
    u, v = (x - cx) / radius, (y - cy) / radius
    factor = (1.0 + k * (u * u + v * v)) / (1.0 + k)
    return cx + u * factor * radius, cy + v * factor * radius


def distortion_forward(
    x: np.ndarray, y: np.ndarray, k: float, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """Output coordinates of source points (x, y): the inverse of ``distortion_source``, solved
    for the radius by Newton's method (the map is monotone for ``k > -1 / (3 rho^2)``).

    With ``k < 0`` the source radius an output radius reads peaks at the fold ``rho_f = 1 /
    sqrt(-3 k)``: a source point beyond that peak appears nowhere in the output, so it is put
    outside the frame along its own ray (twice the frame's corner radius out), where a box
    reaching it is clipped to the frame edge in that direction only (it had no finite inverse:
    Newton ran off to infinity, and a point on an axis came back as NaN)."""
    cx, cy, radius = distortion_frame(width, height)
    u, v = (np.asarray(x, np.float64) - cx) / radius, (np.asarray(y, np.float64) - cy) / radius
    s = np.sqrt(u * u + v * v)
    beyond = np.zeros(s.shape, dtype=bool)
    if k < 0.0:
        fold = 1.0 / math.sqrt(-3.0 * k)
        beyond = s > fold * (1.0 + k * fold * fold) / (1.0 + k)
    target = np.where(beyond, 0.0, s)
    rho = target.copy()
    for _ in range(30):
        f = rho * (1.0 + k * rho * rho) / (1.0 + k) - target
        df = (1.0 + 3.0 * k * rho * rho) / (1.0 + k)
        rho = np.maximum(rho - f / np.maximum(df, 1e-9), 0.0)
    outside = 2.0 * math.hypot(cx, cy) / radius  # beyond every corner of the output frame
    rho = np.where(beyond, outside, rho)
    ratio = np.where(s > 1e-12, rho / np.maximum(s, 1e-12), 1.0 + k)
    return cx + u * ratio * radius, cy + v * ratio * radius


def distortion_maps(k: float, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Source pixel-index maps (float32, H x W) of every output pixel: ``distortion_source`` at
    the pixel centres, minus 0.5, the same float64 operations in the same order (in place, on
    the frame's cached normalised coordinates). The frame's coordinates are exactly symmetric
    about its centre (``u`` of column j is minus that of column W-1-j), so the radial factor is
    computed on a quarter and mirrored, ``map_x`` on the top half (it repeats in mirrored rows)
    and ``map_y`` on the left half: the same bits as the whole-frame arithmetic. On a square
    frame ``v`` is ``u`` transposed and ``u u + v v`` symmetric (float addition commutes), so
    ``map_y`` is ``map_x`` transposed, bit for bit, and is copied rather than computed."""
    cx, cy, radius = distortion_frame(width, height)
    u, v, r2 = _distortion_grid(width, height)
    rows, cols = (height + 1) // 2, (width + 1) // 2
    factor = np.multiply(r2[:rows, :cols], k)  # (1 + k (u u + v v)) / (1 + k)
    factor += 1.0
    factor /= 1.0 + k
    top = np.concatenate([factor, factor[:, : width // 2][:, ::-1]], axis=1)
    left = np.concatenate([factor, factor[: height // 2][::-1]], axis=0)
    square = width == height
    halves = []
    for centre, axis, half in ((cx, u, top), (cy, v, left))[: 1 if square else 2]:
        source = np.multiply(axis, half)
        source *= radius  # centre + u factor radius - 0.5
        np.add(centre, source, out=source)
        source -= 0.5
        halves.append(source.astype(np.float32))
    map_x = np.concatenate([halves[0], halves[0][: height // 2][::-1]], axis=0)
    if square:
        return map_x, np.ascontiguousarray(map_x.T)
    map_y = np.concatenate([halves[1], halves[1][:, : width // 2][:, ::-1]], axis=1)
    return map_x, map_y


@lru_cache(maxsize=8)
def _distortion_grid(width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 normalised coordinates of the pixel centres of a frame (``distortion_source``'s
    ``u`` (1, W), ``v`` (H, 1) and ``u u + v v`` (H, W)); read-only."""
    cx, cy, radius = distortion_frame(width, height)
    u = (np.arange(width, dtype=np.float64)[None, :] + 0.5 - cx) / radius
    v = (np.arange(height, dtype=np.float64)[:, None] + 0.5 - cy) / radius
    r2 = u * u + v * v
    for a in (u, v, r2):
        a.flags.writeable = False
    return u, v, r2


def _distortion_points(
    p: Mapping[str, Any], points: np.ndarray, width: int, height: int
) -> np.ndarray:
    x, y = distortion_forward(points[:, 0], points[:, 1], as_float32(p["k"]), width, height)
    return np.stack([x, y], axis=1)


def distortion_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label maps (B, C, H, W, any dtype) through ``lens_distortion`` (collated ``k``): each
    output pixel takes the source pixel nearest to where the image kernel reads it, 0 where that
    lies outside the image (where the image turns black)."""
    height, width = m.shape[-2:]
    out = []
    for sample, k in zip(m, p["k"].tolist(), strict=True):
        map_x, map_y = distortion_maps(float(k), width, height)
        ix = torch.from_numpy(np.floor(map_x.astype(np.float64) + 0.5)).long().to(m.device)
        iy = torch.from_numpy(np.floor(map_y.astype(np.float64) + 0.5)).long().to(m.device)
        keep = (ix >= 0) & (ix < width) & (iy >= 0) & (iy < height)
        res = sample[:, iy.clamp(0, height - 1), ix.clamp(0, width - 1)]
        out.append(torch.where(keep, res, torch.zeros((), dtype=res.dtype, device=res.device)))
    return torch.stack(out)


def _lens_distortion_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``lens_distortion`` of a batch in one pass (the torch kernel): every sample's source
    maps (``distortion_maps``, float64 then float32 as on the host) and one batched bicubic
    remap of the tissue behind the aperture (samples with a scene) and one of the whole frame,
    black outside (samples without)."""
    _b, _c, h, w = x.shape
    cx, cy, radius = distortion_frame(w, h)
    k = p["k"].to(torch.float64).view(-1, 1, 1)
    u = ((torch.arange(w, device=x.device, dtype=torch.float64) + 0.5 - cx) / radius).view(1, 1, w)
    v = ((torch.arange(h, device=x.device, dtype=torch.float64) + 0.5 - cy) / radius).view(1, h, 1)
    factor = (1.0 + k * (u * u + v * v)) / (1.0 + k)
    map_x = (cx + u * factor * radius - 0.5).to(torch.float32)
    map_y = (cy + v * factor * radius - 0.5).to(torch.float32)
    whole = _host.remap(x, map_x, map_y, "cubic", "constant", 0.0)
    field, tissue = _host.view_masks(x, scenes)
    inside = warp_tissue_t(x, field, tissue, map_x, map_y)
    return torch.where(scene_flags(x, scenes), inside, whole).clamp(0.0, 1.0)


@_host.host_op(
    "lens_distortion",
    sampler=_distortion_sampler,
    dtypes=(np.uint8, np.float32),
    geometry=Geometry(distortion_label_maps, points=_distortion_points),
    device=_lens_distortion_batch,
)
def lens_distortion(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Radial distortion change ``rho -> rho (1 + k rho^2) / (1 + k)`` about the image centre,
    bicubic. With the engine's scene (the tissue layer): the tissue behind the fixed aperture
    moves, the aperture and the overlays stay (section comment above); without one (the whole
    frame, ``protect_border=False``): every pixel moves, black where the source lies outside
    the image (module docstring)."""
    _c, h, w = img.shape
    map_x, map_y = distortion_maps(float(p["k"]), w, h)
    if view.has_scene:
        # the change enters through the aperture, on the tissue alone: a weight of 0 elsewhere
        # leaves those pixels exactly as they were (img + 0 * change)
        weight = view_aperture(view) * view.tissue
        radiance = tissue_radiance(img, view_aperture(view, "tissue", RADIANCE_REACH, framed=True))
        change = remap_planes(radiance, map_x, map_y, cv2.BORDER_REFLECT_101)
        change -= radiance
        change *= weight[None]
        change += img
        return change
    return remap_planes(img, map_x, map_y, cv2.BORDER_CONSTANT, 0.0)
