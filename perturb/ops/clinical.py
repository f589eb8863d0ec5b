"""What lies between the scope and the mucosa: cautery smoke, bubbles and foam, pooled fluid.

All three act on the tissue inside the field of view (the dark frame and what is drawn on it stay
untouched) and work in linear light (sRGB decoded, IEC 61966-2-1).

* ``surgical_smoke``: electrocautery plume, a drifting, turbulent aerosol. Radiative transfer in
  single scattering (Koschmieder's law, as in image dehazing: He, Sun & Tang, CVPR 2009):
  ``I = J t + A (1 - t)`` with transmission ``t = exp(-tau)``. The optical depth ``tau`` is a
  turbulent density field (fractal noise, domain-warped and stretched along a keyed drift
  direction) concentrated around a keyed plume source, so the smoke is wispy, not a uniform
  haze. The airlight ``A`` is the scope's own light scattered back by the smoke, so it is bright
  where the tissue is lit (close) and dim towards the lumen; forward scattering also blurs what
  is seen through the smoke (Mie particles of about 0.1-1 um; smoke from diathermy,
  e.g. Barrett & Garber, Surg Endosc 17, 2003, on plume composition).
* ``bubbles``: air bubbles and foam in the lumen (poor preparation, insufflation, simethicone not
  given). A bubble is a thin water film dome on the mucosa, transparent: the tissue behind it is
  seen through a weak lens, in its own colour, magnified (read closer to the centre,
  ``1 - k cos theta``) and shifted away from the optical axis (an off-axis dome is seen
  obliquely). Its film reflects more at grazing angles (Fresnel reflectance, Schlick's
  approximation ``F = F0 + (1 - F0)(1 - cos theta)^5``), and what it mirrors is the lit tissue
  around it (the scene's own colour, brightened; no grey film). The wall seen edge-on is a thin
  ring (about a pixel at least): dark all round where the light is refracted out of the camera's
  view (deepest away from the light), with a brighter arc on the side facing the light (the
  lamp mirrored by the wall, tinted by the tissue); inside it a faint refraction band, a faint
  crescent on the lit inner wall, a faint caustic opposite, and two-beam thin-film interference
  colour (``1 - a cos(4 pi n d cos theta_t / lambda)`` per channel, the film thinning on one
  side) only on the lit side. The scope's light guides sit beside the lens, so a bubble's glint
  lies where the dome's normal points back at the camera: off an off-axis bubble's centre
  towards the optical axis and towards the guide, the same light for every bubble of a frame;
  its peak and size vary per bubble (log-normal peak, clipped; some bubbles catch none), a dome
  under about 3 px mirrors a lamp image below a pixel and glints dimmer, and larger domes
  (radius over about 3-8 px) add a faint second reflex on the inner rim opposite the light. A
  keyed ``look`` per bubble varies its band, rim depth and width, mirror, cap, wall brightness,
  tint and glint (``BUBBLE_LOOK``): no stamp. Sizes are log-normal (sigma 0.55 around a median
  radius of 0.36 % of the shorter side, 1.8 px on a 512 px frame, a sixteenth of the cells 2.2 x
  larger: many small, a few large; clinicians' bubble boxes on EAD2019 frames, median side 5.8 %
  of the frame, enclose clusters of such cells), and the cells only heavy foam adds grow up to
  9 x (at most 3 % of the shorter side): heavy foam carries large bubbles. Cells come in
  irregular clusters: each cluster grows outward like packed foam (a cell at the radius
  enclosing the area of the cells before it, at the golden angle from the last, jittered by
  half its radius), stretched and bent by keyed amounts, each cell then slid against its nearest
  earlier neighbour; a cell that would sit on an earlier one is squeezed to share a wall with it
  (overlap up to 0.45 of the smaller radius), so cells of mixed sizes pack the gaps. Foam is
  carried by the liquid film that pools in the fold valleys, so each bubble is drawn as much as
  the frame's valley map at its centre says (``foam_folds``: where the luma is darker than its
  surround, standardised over the tissue); a severity's ``spread`` lets heavy foam overflow
  onto fainter relief. Where the cells crowd, foam floats in interstitial fluid (whitish mucus
  or blood-tinged water, a keyed mix, lit like the tissue under it) that veils the gaps. The
  cells' changes add up; where walls overlap the tissue keeps at least 30 % of its light. The
  bubble layer is blurred with the camera's own blur (a gaussian of about 0.13 % of the shorter
  side), so the bubbles are no sharper than the tissue. A severity adds cells to the same
  clusters and opens new ones (a sample's cells at one severity are among those at the next): a
  small cluster or two at severity 1, broad foam with large bubbles at severity 5.
* ``fluid_occlusion``: residual bile, stool suspension, blood or clear rinse water pooled over the
  mucosa (the fluid is a keyed choice recorded as ``fluid``: 0 bile, 1 stool, 2 blood, 3 clear).
  The pool lies in the dependent part of the field: a level set, at the ``coverage`` quantile, of
  a ramp falling towards a keyed side plus smooth noise plus the mucosa's relief as the frame
  shows it (the smoothed, standardised luma: fold valleys and the far lumen are low), so its
  shore runs along folds rather than cutting across them. Beer-Lambert absorption per channel in
  linear light: the tissue is seen through ``T_c = exp(-(mu_c + s) d)``, extinction being
  absorption (bile absorbs blue, blood green and blue, stool all three) plus scattering ``s``
  out of the beam, so deep turbid fluid hides the folds under it; turbid in-scattering towards
  the fluid's body colour (liquid stool ochre, bile golden), lit by the scope's falloff around
  it (the luma blurred over 8 % of the shorter side, not the folds' shading),
  through a depth ``d`` that grows from the shore as a shallow wedge (thin and clear at the
  edge, growing to a level deepest floor) and deeper over the fold valleys than over the crests
  (the smooth relief), so the tint is graded, not uniform; the carried matter (bile, stool, blood
  in rinse water) drifts in swirls, denser where the pool is deep, and dense drifts scatter more
  of the light back (higher albedo), so even the deep pool is not one flat colour; forward scattering blurs the tissue seen through turbid fluid, so its texture
  fades with depth; suspended particles block and scatter (fibre and seeds in stool, clots in
  blood). The liquid surface is a height field, a meniscus rising smoothly to the mucosa (its
  slope continued past the shore, so there is no one-pixel line) and low ripples on the body:
  it refracts the tissue seen through it (shifted by the surface's slope) and mirrors the light
  at the lens where its slope is the keyed tilt of the half vector: broken, clipped glints on
  the fine ripples of the open surface (a lobe narrow along the tilt and three times wider
  across it, so each glint is a thin streak along a ripple's crest; the lamp's image saturates
  even where the tissue is dim), a soft arc along the meniscus on the side facing the light,
  over water's 2 % Fresnel sheen, all fading in off the shore, broken into pieces by a keyed
  noise (capillary waves, floating film). Fine bubbles float on it (bile and stool froth most,
  rinse water least), in a few clumps mostly along the shore (suspended debris in the same
  clumps: never an even scatter over the pool), at most one per cell of a keyed jittered grid,
  each a faint refraction ring with a small glint of keyed brightness. The ripple glints crowd
  where the pool's swell faces the light and the meniscus rim is broken into pieces. It may hide
  findings: ``occludes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import scipy.spatial
import torch

from perturb import rng
from perturb.errors import InputError
from perturb.ops import _host, _math, exact, keyed_fields
from perturb.ops.kernels import Level, Params, draw, draw_int

# ---------------------------------------------------------------------------------------------
# Surgical smoke

SMOKE_CELL = 0.22  # largest turbulent eddies (shorter side)
SMOKE_OCTAVES = 4
SMOKE_BLUR = 0.004  # forward-scattering blur at full opacity (shorter side)


def _smoke_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "density": draw(rng, level["density"]),
        "spread": draw(rng, level["spread"]),
        "source": [float(rng.uniform(0.25, 0.75)), float(rng.uniform(0.25, 0.75))],
        "drift": float(rng.uniform(0.0, 2.0 * math.pi)),
        "airlight": float(rng.uniform(0.8, 0.95)),
        "tint": [
            float(rng.uniform(0.96, 1.0)),
            float(rng.uniform(0.95, 1.0)),
            float(rng.uniform(0.9, 1.0)),
        ],
    }


SMOKE_MAX_CANVAS = 4096 * 4096  # square noise canvas, pixels (64 MiB of float32)


def _smoke_canvas(h: int, w: int, cell: float) -> int:
    """Side of the plume's square noise canvas (the rotated frame with a margin for the warp);
    an image too elongated for it is refused before anything is allocated."""
    size = math.ceil(math.hypot(h, w) + cell)
    if size * size > max(4 * h * w, SMOKE_MAX_CANVAS):
        # a 3 x 100000 strip would need a 100000^2 canvas (37 GiB): refuse before allocating
        raise InputError(
            f"surgical_smoke: a {w}x{h} image is too elongated for the plume's square canvas "
            f"({size}x{size} px); crop or pad it to an aspect ratio below about 1:3.7"
        )
    return size


def smoke_optical_depth(key: int, h: int, w: int, p: dict[str, np.ndarray]) -> np.ndarray:
    """Optical depth (H, W) >= 0 of the plume: turbulent, drifting, around its source."""
    scale = min(h, w)
    cell = SMOKE_CELL * scale
    # domain warp: the density is read at positions displaced by a second noise (curling wisps)
    wx = _host.fractal_noise(key, "smoke-warp-x", h, w, cell, 2)
    wy = _host.fractal_noise(key, "smoke-warp-y", h, w, cell, 2)
    ang = float(p["drift"])
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    # stretch the turbulence along the drift direction (the plume is carried by the gas flow)
    along = (xs - w / 2) * math.cos(ang) + (ys - h / 2) * math.sin(ang)
    across = -(xs - w / 2) * math.sin(ang) + (ys - h / 2) * math.cos(ang)
    size = _smoke_canvas(h, w, cell)
    map_x = (size / 2 + along * 0.45 + 0.25 * cell * wx).astype(np.float32)
    map_y = (size / 2 + across + 0.25 * cell * wy).astype(np.float32)
    base = _host.fractal_noise(key, "smoke-density", size, size, cell, SMOKE_OCTAVES)
    turbulent = cv2.remap(base, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101)
    wisps = np.clip(0.5 + 1.6 * turbulent, 0.0, None)  # patchy: clear gaps between wisps
    sx, sy = float(p["source"][0]) * w, float(p["source"][1]) * h
    # the plume widens and thins downstream of its source
    dx, dy = xs - sx, ys - sy
    down = dx * math.cos(ang) + dy * math.sin(ang)
    side = -dx * math.sin(ang) + dy * math.cos(ang)
    reach = float(p["spread"]) * scale
    plume = np.exp(
        -0.5
        * (
            (side / (0.6 * reach + 0.35 * np.abs(down))) ** 2
            + (np.minimum(down, 0) / (0.5 * reach)) ** 2
        )
    )
    plume = plume * np.exp(-np.maximum(down, 0) / (3.0 * reach))
    return (np.float32(p["density"]) * wisps * plume).astype(np.float32)


def smoke_optical_depth_t(
    keys: Sequence[int], h: int, w: int, p: dict[str, torch.Tensor], like: torch.Tensor
) -> torch.Tensor:
    """(B, H, W) ``smoke_optical_depth`` of a batch: batched noise fields, the canvas read by one
    batched remap."""
    scale = min(h, w)
    cell = SMOKE_CELL * scale
    wx = _host.fractal_noise_t(keys, "smoke-warp-x", h, w, cell, 2, like)
    wy = _host.fractal_noise_t(keys, "smoke-warp-y", h, w, cell, 2, like)
    ang = p["drift"].to(torch.float64)
    cos, sin = (v.to(torch.float32).view(-1, 1, 1) for v in (torch.cos(ang), torch.sin(ang)))
    ys = torch.arange(h, device=like.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=like.device, dtype=torch.float32).view(1, 1, w)
    along = (xs - w / 2) * cos + (ys - h / 2) * sin
    across = -(xs - w / 2) * sin + (ys - h / 2) * cos
    size = _smoke_canvas(h, w, cell)
    map_x = size / 2 + along * 0.45 + 0.25 * cell * wx
    map_y = size / 2 + across + 0.25 * cell * wy
    base = _host.fractal_noise_t(keys, "smoke-density", size, size, cell, SMOKE_OCTAVES, like)
    turbulent = _host.remap(base.unsqueeze(1), map_x, map_y, "linear", "reflect101")[:, 0]
    wisps = (0.5 + 1.6 * turbulent).clamp(min=0.0)
    sx = (p["source"][:, 0].to(torch.float64) * w).to(torch.float32).view(-1, 1, 1)
    sy = (p["source"][:, 1].to(torch.float64) * h).to(torch.float32).view(-1, 1, 1)
    dx, dy = xs - sx, ys - sy
    down = dx * cos + dy * sin
    side = -dx * sin + dy * cos
    reach64 = p["spread"].to(torch.float64) * scale
    width = (0.6 * reach64).to(torch.float32).view(-1, 1, 1) + 0.35 * down.abs()
    back = (0.5 * reach64).to(torch.float32).view(-1, 1, 1)
    plume = torch.exp(-0.5 * ((side / width) ** 2 + (down.clamp(max=0.0) / back) ** 2))
    plume = plume * torch.exp(
        -down.clamp(min=0.0) / (3.0 * reach64).to(torch.float32).view(-1, 1, 1)
    )
    return p["density"].view(-1, 1, 1) * wisps * plume


def _surgical_smoke_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``surgical_smoke`` of a batch in one pass (the torch kernel)."""
    _b, c, h, w = x.shape
    scale = min(h, w)
    _field, tissue = _host.view_masks(x, scenes)
    tau = smoke_optical_depth_t(keys, h, w, p, x).unsqueeze(1) * _host.soft_mask_t(
        tissue, 0.01 * scale
    )
    t = torch.exp(-tau)
    lin = _math.srgb_to_linear(x)
    lit = _host.gauss_t(_host.luma_t(lin), 0.05 * scale)
    top = _host.masked_quantile(lit, tissue[:, 0], 0.98)
    norm = (top + 1e-6).to(torch.float32).view(-1, 1, 1)
    has = tissue.flatten(1).any(dim=1).view(-1, 1, 1)
    lit = torch.where(has, (lit / torch.where(has, norm, 1.0)).clamp(0.0, 1.0), lit)
    tint = p["tint"][:, :c].view(-1, c, 1, 1) if c == 3 else torch.ones(1, 1, 1, 1, device=x.device)
    air = (p["airlight"].view(-1, 1, 1) * (0.3 + 0.7 * torch.sqrt(lit))).unsqueeze(1)
    blurred = _host.gauss_t(lin, SMOKE_BLUR * scale)
    seen = lin * t + blurred * (1.0 - t)
    out = seen * t + (air * tint) * (1.0 - t)
    res = _math.linear_to_srgb(out)
    return torch.where(tissue, res, x).clamp(0.0, 1.0)


@_host.host_op(
    "surgical_smoke",
    sampler=_smoke_sampler,
    dtypes=(np.uint8, np.float32),
    device=_surgical_smoke_batch,
)
def surgical_smoke(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Wispy cautery smoke: I t + A (1 - t) in linear light, t = exp(-tau) over a turbulent
    drifting plume; airlight lit by the scope, forward-scatter blur (module docstring)."""
    c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    tau = smoke_optical_depth(key, h, w, p) * _host.soft_mask(tissue, 0.01 * scale)
    t = np.exp(-tau).astype(np.float32)
    lin = _host.to_linear(img)
    lit = _host.gauss(_host.luma(lin), 0.05 * scale)
    lit = (
        np.clip(lit / (float(np.quantile(lit[tissue], 0.98)) + 1e-6), 0.0, 1.0)
        if tissue.any()
        else lit
    )
    tint = np.asarray(p["tint"], dtype=np.float32)[:c] if c == 3 else np.ones(1, np.float32)
    air = np.float32(p["airlight"]) * (0.3 + 0.7 * np.sqrt(lit))
    blurred = _host.per_channel(lin, lambda z: _host.gauss(z, SMOKE_BLUR * scale))
    seen = lin * t + blurred * (1.0 - t)  # forward scattering mixes in the blurred scene
    out = seen * t + (air[None] * tint[:, None, None]) * (1.0 - t)
    res = _host.to_display(out)
    res[:, ~tissue] = img[:, ~tissue]
    return res


# ---------------------------------------------------------------------------------------------
# Bubbles and foam

BUBBLE_F0 = 0.02  # normal-incidence reflectance of a water film (n = 1.33)
BUBBLE_N = 1.33  # refractive index of the film
BUBBLE_REFRACTION = 0.32  # magnification of the tissue seen through a bubble (weak lens)
BUBBLE_SHIFT = 0.12  # sideways shift of that view (radius fraction), away from the optical axis
BUBBLE_LAMBDA = (610.0, 550.0, 465.0)  # nm: red, green, blue of the thin-film interference
BUBBLE_IRIDESCENCE = 0.15  # swing of the film's colour around grey on the lit side of the rim
BUBBLE_ENV = (1.6, 0.03)  # the scene's lit surroundings: env_c = a * mean_c + b (linear; the fluid)
# the film mirrors the tissue around it, lit by the scope: mirror_c = a * tissue_c + b (linear, the
# scene's own colour, no grey), and the lamp mirrored by the wall and cap: lamp_c = c * tissue_c + d
BUBBLE_MIRROR = (1.15, 0.004, 2.2, 0.03)
# the wall seen edge-on: a thin ring at radius fraction ``at``, ``width + px / r`` wide (at least
# about a pixel); bright (``bright`` x the lit surroundings) where it faces the light, darker
# (the tissue x (1 - ``dark``)) elsewhere, where the light is refracted out of the camera's view
# (the dark edge all round, deeper away from the light, its depth ``dark`` + ``dark_k`` frac(13 u)
# and its width x ``BUBBLE_RIM_WIDE[0]`` + ``[1]`` frac(17 u) per cell: rims of varying weight)
BUBBLE_RIM = {
    "bright": 0.35,
    "dark": 0.3,
    "dark_k": 0.45,
    "at": 0.86,
    "width": 0.05,
    "px": 0.45,
}
BUBBLE_RIM_WIDE = (0.7, 1.0)
# the glint's faint second reflex on the opposite inner rim (the dome's back face): its share of
# the glint's peak, its distance from the centre (radius fraction) and the radius (px) over which
# it fades in (small bubbles show one glint only)
BUBBLE_REFLEX = (0.35, 0.62, (3.0, 8.0))
BUBBLE_DARK = (0.4, 0.86, 0.1)  # faint refraction band: depth, radius fraction, width (a thin
# film is mostly transparent: the tissue through a small cell barely darkens)
BUBBLE_CAP = (0.1, 0.7, 0.14)  # bright crescent on the lit inner wall: strength, radius, width
BUBBLE_CAUSTIC = 0.15  # light focused by the dome onto the inner rim opposite the light
GLINT_AXIS = 0.9  # glint offset towards the optical axis (radius fraction per shorter side off it)
GLINT_ELONGATION = 1.3  # a glint's length over its width (the light guide's exit is oblong)
GLINT_MIN_PX = 0.6  # a pixel's footprint added to a glint's sigma (pixels)
GLINT_NONE = 0.45  # share of bubbles whose glint misses the lens (no glint): glints are few
GLINT_PEAK = (0.6, 0.7)  # log-normal median and sigma of a glint's peak (linear, clipped at 1)
GLINT_SIZE = (0.04, 0.1)  # a glint's gaussian sigma, radius fraction
# a dome smaller than this radius (px) mirrors a lamp image below a pixel: its glint's peak falls
# with the radius (at least the floor share), so the finest cells are faint specks, not sparkles
GLINT_SMALL = (3.0, 0.3)
GLINT_CAP = 1.5  # brightest glint peak (linear): beyond it the sensor is saturated anyway
BUBBLE_PSF = 0.0013  # the camera's blur on the bubble layer: gaussian sigma (shorter side) ...
BUBBLE_PSF_MIN = 0.5  # ... at least this many pixels
BUBBLE_RANGE = 2.5  # radii at least 1/2.5 x the level's median
BUBBLE_SPREAD = 0.55  # log-normal sigma of the radii: many small, a few large
BUBBLE_BIG = (0.06, 2.2)  # share of cells that are larger still, and by how much (heavy tail)
# cells from this pool index on grow, up to (1 + this) x at the last one: heavy foam has larger
# cells as well as more of them
BUBBLE_GROWTH = (350, 8.0)
BUBBLE_MAX = 0.03  # largest radius drawn (shorter side); recorded radii are clamped to it
BUBBLE_ASPECT = (0.35, 0.07, 0.7)  # perspective squash per shorter side off axis, jitter, floor
BUBBLE_POOL = 800  # bubbles drawn per sample; a severity keeps the first ``count`` (a record's
# parameter holds at most 4096 values: the rows alternate between ``bubbles`` and ``foam``, 400
# rows of BUBBLE_ROW each)
# share of new bubbles each foam cluster takes once open, and the pool share where it opens
BUBBLE_GROUPS = (0.2, 0.16, 0.14, 0.12, 0.1, 0.09, 0.08, 0.07, 0.06, 0.05)
BUBBLE_OPEN = (0.0, 0.0, 0.04, 0.1, 0.18, 0.28, 0.38, 0.5, 0.62, 0.75)
BUBBLE_PACK = 1.2  # share of a cluster's disc its cells cover (foam with reddish gaps)
BUBBLE_GOLDEN = math.pi * (3.0 - math.sqrt(5.0))  # angle between a cluster's successive cells
# a cluster's length over its width (keyed range): its cells spread along it
BUBBLE_STRETCH = (1.0, 2.2)
BUBBLE_BEND = 0.6  # keyed bend of a cluster (sideways offset ~ bend * along**2 / scale) ...
BUBBLE_BEND_SCALE = 0.1  # ... over this length (shorter side)
BUBBLE_JITTER = 0.5  # keyed jitter of a cell's place (its radius): no lattice
# settling: rounds, the neighbourhood searched (x the 90th percentile radius), the wall share
# of the smaller radius two settled cells share
BUBBLE_SETTLE = (2.0, 2.5, 0.15)
# a cell squeezed between earlier ones to less than this share of its radius is dropped
BUBBLE_SQUEEZE = 0.5
BUBBLE_SHARE = 0.45  # neighbours may overlap by this share of the smaller radius (shared wall)
# recorded per bubble: x, y (shorter side from the image centre), r (semi-major axis), film nm,
# phase, aspect (minor over major axis), orientation of the minor axis, glint peak, glint size,
# look (uniform in [0, 1): this bubble's own shading, see ``BUBBLE_LOOK``)
BUBBLE_ROW = 10
# how a bubble's ``look`` u varies its rendering (no two cells of a foam alike): the dark band's
# depth scales by ``depth[0] + depth[1] u``, its width by ``width[0] + width[1] frac(3 u)``, the
# film's mirror of the surroundings (how opaque it reads) by ``mirror[0] + mirror[1] frac(5 u)``,
# the cap by ``cap[0] + cap[1] (1 - u)``; the film's tint ``tint (frac(7 u) - 1/2)`` per channel
# (red up, blue down: bile-stained or clear film); the glint slides ``glint`` radius across the
# light's direction by ``u - 1/2``; the rim's depth and width (``BUBBLE_RIM``) and the wall's
# brightness (``0.3 + 1.2 frac(11 u)``) vary too. At u = 1/2 the bubble is the reference rendering.
BUBBLE_LOOK: dict[str, tuple[float, ...]] = {
    "depth": (0.7, 0.6),
    "width": (0.6, 0.8),
    "mirror": (0.35, 0.7),
    "cap": (0.2, 1.6),
    "tint": (0.16, 0.0, -0.16),
    "glint": (0.5,),
}
# where foam collects: the frame's valley map (band-pass of the luma, where it is darker than
# its surround) standardised by its ``quantile`` over the tissue (at least ``floor``); a bubble is
# drawn as much as the map at its centre passes ``(lo, hi)``; blurs (shorter side)
# (the fine blur is about a cluster's width, so a valley keeps its cluster whole: cells are not
# thinned out one by one into isolated rings)
FOAM_FOLDS = {"fine": 0.014, "coarse": 0.05, "quantile": 0.9, "floor": 0.02, "lo": 0.05, "hi": 0.3}
# interstitial fluid: the mucus and rinse water the foam floats in, where the cells crowd (their
# cover, weighted by the fold map, blurred over ``blur`` of the shorter side, times ``gain``,
# clipped at 1) mixed towards a keyed colour between whitish mucus and blood-tinged reddish
# water (linear, relative to the lit surroundings) by the level's ``fluid`` share, in the gaps
# between the cells (a cell's own film stays clear)
BUBBLE_FLUID: dict[str, Any] = {
    "blur": 0.008,
    "gain": 2.0,
    "white": (1.25, 1.2, 1.1),
    "red": (0.9, 0.45, 0.4),
}
# the least share of the tissue's light that comes through where walls overlap (the cells' changes
# add up, and two dark edges on one pixel would otherwise cut it to black)
BUBBLE_FLOOR = 0.3
BUBBLE_MIN_PX = 1.0  # smallest radius drawn (pixels): on small images a bubble is at least a pixel


def ellipse_reach(r: Any, aspect: Any, orient: Any, angle: Any, ops: Any = np) -> Any:
    """Distance from an elliptic bubble's centre to its outline along ``angle`` (semi-major
    axis ``r``, minor axis ``r * aspect`` along ``orient``)."""
    along, across = ops.cos(angle - orient), ops.sin(angle - orient)
    return r * aspect / ops.sqrt(along * along + (aspect * across) ** 2)


def _cluster_of(rng: np.random.Generator) -> np.ndarray:
    """Cluster index of each pool bubble: cluster k opens at pool share ``BUBBLE_OPEN[k]`` and
    from then on takes new bubbles in proportion to ``BUBBLE_GROUPS[k]``, so a light severity
    (the pool's first bubbles) fills a few clusters and heavier ones add new clusters while the
    first grow (no thin sprinkle of every cluster at severity 1)."""
    share = np.asarray(BUBBLE_GROUPS, np.float64)
    t = np.arange(BUBBLE_POOL, dtype=np.float64) / BUBBLE_POOL
    weights = (np.asarray(BUBBLE_OPEN)[None, :] <= t[:, None]) * share[None, :]
    cum = np.cumsum(weights, axis=1)
    u = rng.random(BUBBLE_POOL) * cum[:, -1]
    return np.minimum((cum <= u[:, None]).sum(axis=1), len(share) - 1)


def _settle(
    x: np.ndarray, y: np.ndarray, sizes: np.ndarray, group: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cells moved against their cluster's foam: each cell slides straight towards the nearest
    earlier cell of its cluster (within ``BUBBLE_SETTLE[1]`` x the pool's 90th percentile radius) until their
    walls touch, sharing ``BUBBLE_SETTLE[2]`` of the smaller radius, ``BUBBLE_SETTLE[0]`` rounds.
    A cell's place depends on earlier pool cells only (pairs within a fixed distance, whatever
    else lies near), so a severity's cells stay among the next one's."""
    # (the neighbourhood from the cells before heavy foam's growth: a grown cell settles only
    # against a neighbour that near, and the search stays small)
    reach = BUBBLE_SETTLE[1] * float(np.quantile(sizes[: BUBBLE_GROWTH[0]], 0.9))
    for _ in range(int(BUBBLE_SETTLE[0])):
        pairs = scipy.spatial.cKDTree(np.stack([x, y], axis=1)).query_pairs(
            reach, output_type="ndarray"
        )
        if len(pairs) == 0:
            break
        early, late = pairs[:, 0], pairs[:, 1]  # (query_pairs lists each pair as i < j)
        same = group[early] == group[late]
        early, late = early[same], late[same]
        apart = np.hypot(x[early] - x[late], y[early] - y[late])
        touch = (
            sizes[early] + sizes[late] - BUBBLE_SETTLE[2] * np.minimum(sizes[early], sizes[late])
        )
        gap = apart - touch
        # the nearest earlier cell of each later one (least gap first, then by cell)
        order = np.lexsort((gap, late))
        late, early, gap, apart = late[order], early[order], gap[order], apart[order]
        first = np.ones(len(late), dtype=bool)
        first[1:] = late[1:] != late[:-1]
        late, early, gap, apart = late[first], early[first], gap[first], apart[first]
        move = np.where(gap > 0.0, gap / np.maximum(apart, 1e-12), 0.0)
        x, y = x.copy(), y.copy()
        x[late] += move * (x[early] - x[late])
        y[late] += move * (y[early] - y[late])
    return x, y


def _clash_pairs(x: np.ndarray, y: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(K, 2) int: every pair i < j of cells whose discs meet (centres closer than the sum of
    their radii), and some farther: pairs of cells up to the 95th percentile radius within
    twice that radius, and pairs with a larger cell within the largest radius plus its own
    (two small k-d tree searches instead of one over twice the largest radius)."""
    points = np.stack([x, y], axis=1)
    tree = scipy.spatial.cKDTree(points)
    small = float(np.quantile(sizes, 0.95))
    pairs = [tree.query_pairs(2.0 * small, output_type="ndarray").reshape(-1, 2)]
    big = np.flatnonzero(sizes > small)
    if len(big):
        near = tree.query_ball_point(points[big], sizes[big] + float(sizes.max()))
        counts = np.asarray([len(n) for n in near], dtype=np.int64)
        others = np.concatenate([np.asarray(n, dtype=np.int64) for n in near])
        mine = np.repeat(big, counts)
        pairs.append(np.stack([np.minimum(mine, others), np.maximum(mine, others)], axis=1))
    both = np.concatenate(pairs)
    return both[both[:, 0] != both[:, 1]]  # (a pair may come twice: harmless for a minimum)


def _bubble_sampler(rng: np.random.Generator, level: Level) -> Params:
    """The first ``count`` bubbles of a keyed pool of ``BUBBLE_POOL`` (vectorised NumPy, no loop
    per bubble). Radii are log-normal (``BUBBLE_SPREAD``; a few ``BUBBLE_BIG`` cells larger
    still): many small, a few large. Each bubble belongs to one of ``len(BUBBLE_GROUPS)``
    clusters (``_cluster_of``) and is laid where its cluster grows: the m-th cell of a cluster
    sits on the cluster's rim, at the radius that encloses the area of the cells before it
    (packed at ``BUBBLE_PACK``), at the golden angle from the previous one with a keyed jitter,
    the cluster stretched along a keyed heading and bent (clusters are irregular, not discs).
    Each cell is slid against its nearest earlier neighbour (``_settle``); a cell that overlaps
    an earlier pool cell by more than ``BUBBLE_SHARE`` of the smaller radius is squeezed to the
    largest radius that only shares a wall (dropped when that is under ``BUBBLE_SQUEEZE`` of its
    own): packed foam, none sitting on another; the test looks only at earlier pool cells, so a
    sample's cells at one severity are among those at the next.
    Per bubble a perspective ellipse squashed towards the optical axis, film thickness and
    phase, a glint's peak (none for some) and size, and the cell's own look (shading). The rows
    alternate between ``bubbles`` and ``foam`` (a record's list holds at most 4096 values)."""
    count = min(draw_int(rng, level["count"]), BUBBLE_POOL)
    radius = draw(rng, level["radius"])
    light = float(rng.uniform(0.0, 2.0 * math.pi))
    glint = float(rng.uniform(0.2, 0.45))
    sizes = radius * np.exp(rng.normal(0.0, BUBBLE_SPREAD, size=BUBBLE_POOL))
    big = rng.random(BUBBLE_POOL) < BUBBLE_BIG[0]
    sizes = np.clip(np.where(big, sizes * BUBBLE_BIG[1], sizes), radius / BUBBLE_RANGE, BUBBLE_MAX)
    # heavy foam (the cells only the top severities add) carries larger cells too
    late = np.clip(
        (np.arange(BUBBLE_POOL) - BUBBLE_GROWTH[0]) / (BUBBLE_POOL - BUBBLE_GROWTH[0]), 0, 1
    )
    sizes = np.minimum(sizes * (1.0 + BUBBLE_GROWTH[1] * late * late), BUBBLE_MAX)
    group = _cluster_of(rng)
    clusters = len(BUBBLE_GROUPS)
    seeds = rng.uniform(-1.0, 1.0, size=(clusters, 2)) * (0.3, 0.26)
    heading = rng.uniform(0.0, 2.0 * math.pi, size=clusters)
    stretch = rng.uniform(*BUBBLE_STRETCH, size=clusters)
    bend = rng.normal(0.0, BUBBLE_BEND, size=clusters)
    jitter = rng.normal(0.0, 1.0, size=(BUBBLE_POOL, 2))
    film = rng.uniform(250.0, 700.0, size=BUBBLE_POOL)
    phase = rng.uniform(0.0, 2.0 * math.pi, size=BUBBLE_POOL)
    squash = np.abs(rng.normal(0.0, BUBBLE_ASPECT[1], size=BUBBLE_POOL))
    tilt = rng.normal(0.0, 0.3, size=BUBBLE_POOL)
    peaks = np.exp(rng.normal(math.log(GLINT_PEAK[0]), GLINT_PEAK[1], size=BUBBLE_POOL))
    peaks = np.where(rng.random(BUBBLE_POOL) < GLINT_NONE, 0.0, np.minimum(peaks, GLINT_CAP))
    spots = rng.uniform(*GLINT_SIZE, size=BUBBLE_POOL)
    look = rng.random(BUBBLE_POOL)  # each cell's own shading (``BUBBLE_LOOK``)
    # the area of the cells laid before each one in its cluster (its rank's packed disc)
    onehot = group[:, None] == np.arange(clusters)[None, :]
    area = (sizes * sizes)[:, None] * onehot
    before = (np.cumsum(area, axis=0) - area)[np.arange(BUBBLE_POOL), group]
    rank = (np.cumsum(onehot, axis=0) - onehot)[np.arange(BUBBLE_POOL), group]
    reach = np.sqrt(before / BUBBLE_PACK) + sizes
    angle = rank * BUBBLE_GOLDEN
    along = reach * np.cos(angle) * stretch[group] + BUBBLE_JITTER * sizes * jitter[:, 0]
    across = reach * np.sin(angle) + BUBBLE_JITTER * sizes * jitter[:, 1]
    across = across + bend[group] * along * along / BUBBLE_BEND_SCALE
    ch, sh = np.cos(heading[group]), np.sin(heading[group])
    x = seeds[group, 0] + along * ch - across * sh
    y = seeds[group, 1] + along * sh + across * ch
    x, y = _settle(x, y, sizes, group)
    aspect = np.maximum(1.0 - BUBBLE_ASPECT[0] * np.hypot(x, y) - squash, BUBBLE_ASPECT[2])
    orient = np.arctan2(y, x) + tilt
    # a cell that sits on an earlier pool cell (more than a shared wall's overlap) is squeezed
    # to the largest radius that only shares a wall with every earlier neighbour (packed foam:
    # cells of mixed sizes fill the gaps); one squeezed below ``BUBBLE_SQUEEZE`` of its radius
    # is dropped. (Candidate pairs from a k-d tree: only cells within two of the largest radii
    # can clash; the earlier cell's own radius before any squeeze bounds it, so the recorded
    # cells never overlap by more than a shared wall.)
    pairs = _clash_pairs(x, y, sizes)
    first, second = pairs[:, 0], pairs[:, 1]
    apart = np.hypot(x[first] - x[second], y[first] - y[second])
    # apart >= r1 + r2 - share * min(r1, r2), solved for the later radius r2
    small = (apart - sizes[first]) / (1.0 - BUBBLE_SHARE)
    fits = np.where(small <= sizes[first], small, apart - (1.0 - BUBBLE_SHARE) * sizes[first])
    squeezed = sizes.copy()
    np.minimum.at(squeezed, second, fits)
    keep = squeezed >= BUBBLE_SQUEEZE * sizes
    sizes = np.maximum(squeezed, 0.0)
    table = np.stack([x, y, sizes, film, phase, aspect, orient, peaks, spots, look], axis=1)
    rows = table[:count][keep[:count]].tolist()
    spread = draw(rng, level["spread"])
    fluid = draw(rng, level["fluid"])
    return {
        "count": count,
        "radius": radius,
        "light": light,
        "glint": glint,
        "spread": spread,
        "fluid": fluid,
        "fluid_tint": float(rng.random()) ** 2,
        "bubbles": rows[0::2],
        "foam": rows[1::2],
    }


def recorded_rows(p: dict[str, Any]) -> np.ndarray:
    """(N, BUBBLE_ROW) float64: a sample's recorded bubbles (``bubbles`` then ``foam``: the
    pool's even and odd rows; drawing is additive, so their order does not matter)."""
    return np.concatenate(
        [
            np.asarray(p[name], dtype=np.float64).reshape(-1, BUBBLE_ROW)
            for name in ("bubbles", "foam")
        ]
    )


class _Ops:
    """The elementwise functions the bubble film needs, for NumPy and torch arrays alike (one
    formula for the CPU and torch paths)."""

    def __init__(self, torch_like: bool) -> None:
        self.exp = torch.exp if torch_like else np.exp
        self.sqrt = torch.sqrt if torch_like else np.sqrt
        self.cos = torch.cos if torch_like else np.cos
        self.sin = torch.sin if torch_like else np.sin
        self.atan2 = torch.atan2 if torch_like else np.arctan2
        self.minimum = torch.clamp_max if torch_like else np.minimum
        self.clip01 = (
            (lambda v: v.clamp(0.0, 1.0)) if torch_like else (lambda v: np.clip(v, 0.0, 1.0))
        )


def bubble_geometry(
    dx: Any, dy: Any, r: Any, aspect: Any, orient: Any, ops: _Ops
) -> tuple[Any, Any, Any]:
    """(rho, cover, cos_theta) of pixels at (dx, dy) px from an elliptic bubble's centre: radius
    fraction in the dome's own (circular) frame, anti-aliased cover, cosine of the angle between
    the dome's normal and the view."""
    co, so = ops.cos(orient), ops.sin(orient)
    u = (dx * co + dy * so) / aspect  # the minor axis stretched back to the dome's circle
    v = dy * co - dx * so
    rho = ops.sqrt(u * u + v * v) / r
    cover = ops.clip01((1.0 - rho) * r * aspect + 0.5)
    inside = ops.minimum(rho, 0.999)
    return rho, cover, ops.sqrt(1.0 - inside * inside)


def glint_offset(
    x: Any, y: Any, r: Any, light: Any, glint: Any, ops: _Ops, look: Any = 0.5
) -> tuple[Any, Any]:
    """(gx, gy) px from a bubble's centre to its glint. The light guides sit beside the lens, so
    the glint is where the dome's normal points back at the camera: off an off-axis bubble's
    centre towards the optical axis (``GLINT_AXIS`` radius per shorter side off axis) and a little
    towards the guide (``glint`` radius along ``light``): one light direction for every bubble.
    (x, y): the bubble's centre in shorter-side units from the image centre. A cell's ``look``
    slides it across the light's direction (``BUBBLE_LOOK["glint"]``: domes are not perfect)."""
    slide = BUBBLE_LOOK["glint"][0] * (look - 0.5)
    gx = r * (glint * ops.cos(light) - GLINT_AXIS * x - slide * ops.sin(light))
    gy = r * (glint * ops.sin(light) - GLINT_AXIS * y + slide * ops.cos(light))
    return gx, gy


def bubble_film(
    behind: Any,
    dx: Any,
    dy: Any,
    shape: Sequence[Any],
    glint_at: tuple[Any, Any],
    light: Any,
    env: Sequence[Any],
    ops: _Ops,
    channels: int,
) -> list[Any]:
    """Linear radiance (C, ...) of a bubble at (dx, dy) px from its centre (``behind``: the
    refracted tissue, (C, ...)); ``shape``: r (px), aspect, orientation, film nm, phase, glint
    peak, glint size, look (``BUBBLE_LOOK``); ``glint_at``: ``glint_offset``. Every scalar broadcasts against dx; shared
    by both paths."""
    r, aspect, orient, film_nm, phase, peak, size, look = shape
    # this cell's own rendering: no two cells of a foam alike
    depth = BUBBLE_DARK[0] * (BUBBLE_LOOK["depth"][0] + BUBBLE_LOOK["depth"][1] * look)
    spread = BUBBLE_LOOK["width"]
    width = BUBBLE_DARK[2] * (spread[0] + spread[1] * ((3.0 * look) % 1.0))
    mirror = BUBBLE_LOOK["mirror"][0] + BUBBLE_LOOK["mirror"][1] * ((5.0 * look) % 1.0)
    cap_k = BUBBLE_LOOK["cap"][0] + BUBBLE_LOOK["cap"][1] * (1.0 - look)
    hue = (7.0 * look) % 1.0 - 0.5
    stain = BUBBLE_LOOK["tint"] if channels == 3 else (0.0,)
    gx, gy = glint_at
    rho, _cover, cos_t = bubble_geometry(dx, dy, r, aspect, orient, ops)
    phi = ops.atan2(dy, dx)
    # the side of the rim facing the light (towards the glint) mirrors it; the dome focuses the
    # light through onto the inner rim opposite (a faint caustic)
    lit = 0.5 + 0.5 * ops.cos(phi - ops.atan2(gy, gx))
    shade = 0.35 + 0.65 * lit
    fresnel = BUBBLE_F0 + (1.0 - BUBBLE_F0) * (1.0 - cos_t) ** 5
    # thin-film interference: phase difference 4 pi n d cos(theta_t) / lambda of the two film
    # faces, the film thinner on one side of the dome (drainage); colour only where lit
    cos_film = ops.sqrt(1.0 - ops.minimum(rho, 1.0) ** 2 / (BUBBLE_N * BUBBLE_N))
    thickness = film_nm * (1.0 + 0.35 * ops.cos(phi + phase))
    lams = BUBBLE_LAMBDA if channels == 3 else (550.0,)
    tint = [
        1.0
        - BUBBLE_IRIDESCENCE * lit * ops.cos(4.0 * math.pi * BUBBLE_N * thickness * cos_film / lam)
        for lam in lams
    ]
    # the wall seen edge-on at the outline: a thin line mirroring the light where it faces it,
    # and all round a dark edge where the light is refracted out of the camera's view (deepest
    # away from the light), its depth and width the cell's own; inside it a faint dark band
    edge_w = (BUBBLE_RIM["width"] + BUBBLE_RIM["px"] / r) * (
        BUBBLE_RIM_WIDE[0] + BUBBLE_RIM_WIDE[1] * ((17.0 * look) % 1.0)
    )
    ring = ops.exp(-0.5 * ((rho - BUBBLE_RIM["at"]) / edge_w) ** 2)
    wall = BUBBLE_RIM["bright"] * ring * lit * lit * (0.3 + 1.2 * ((11.0 * look) % 1.0))
    rim_dark = BUBBLE_RIM["dark"] + BUBBLE_RIM["dark_k"] * ((13.0 * look) % 1.0)
    band = ops.exp(-0.5 * ((rho - BUBBLE_DARK[1]) / width) ** 2)
    dark = (1.0 - depth * (0.5 + 0.5 * (1.0 - lit)) * band) * (
        1.0 - rim_dark * (0.45 + 0.55 * (1.0 - lit)) * ring
    )
    # the lamp mirrored by the curved inner wall on the lit side: a bright crescent cap (what
    # makes real small bubbles read as lit domes rather than outlines)
    cap = (
        cap_k
        * BUBBLE_CAP[0]
        * lit**3
        * ops.exp(-0.5 * ((rho - BUBBLE_CAP[1]) / BUBBLE_CAP[2]) ** 2)
    )
    caustic = 1.0 + BUBBLE_CAUSTIC * (1.0 - lit) * ops.exp(-0.5 * ((rho - 0.68) / 0.12) ** 2)
    # what the film mirrors is the scene's own tissue, lit by the scope (no grey overlay)
    ma, mb, la, lb = BUBBLE_MIRROR
    # the glint: the light guide's exit mirrored by the dome, oblong along the guides' axis,
    # its own size convolved with a pixel's footprint; clipped by the sensor
    var = (r * size) ** 2 + GLINT_MIN_PX * GLINT_MIN_PX
    ex, ey = dx - gx, dy - gy
    along = (ex * ops.cos(light) + ey * ops.sin(light)) / GLINT_ELONGATION
    across = ey * ops.cos(light) - ex * ops.sin(light)
    peak = peak * ops.minimum(GLINT_SMALL[1] + (1.0 - GLINT_SMALL[1]) * r / GLINT_SMALL[0], 1.0)
    spot = peak * ops.exp(-0.5 * (along * along + across * across) / var)
    # larger domes also show a faint second reflex on the inner rim opposite the light
    lo, hi = BUBBLE_REFLEX[2]
    back = BUBBLE_REFLEX[0] * peak * ops.clip01((r - lo) / (hi - lo))
    fx = dx + BUBBLE_REFLEX[1] * r * ops.cos(light)
    fy = dy + BUBBLE_REFLEX[1] * r * ops.sin(light)
    spot = spot + back * ops.exp(-0.5 * (fx * fx + fy * fy) / var)
    return [
        (
            behind[ch] * (1.0 - fresnel * mirror) * caustic
            + ((behind[ch] * ma + mb) * fresnel * mirror * shade + (behind[ch] * la + lb) * (wall + cap))
            * tint[ch]
        )
        * (1.0 + stain[ch] * hue)
        * dark
        + spot
        for ch in range(channels)
    ]


def _bubble_pixels(rows: np.ndarray, h: int, w: int) -> np.ndarray:
    """(N, 3) float64 centre x, y and radius (at most ``BUBBLE_MAX``) in pixels of recorded
    rows (N, BUBBLE_ROW)."""
    scale = min(h, w)
    return np.stack(
        [
            w / 2 + rows[:, 0] * scale,
            h / 2 + rows[:, 1] * scale,
            np.maximum(np.minimum(rows[:, 2], BUBBLE_MAX) * scale, BUBBLE_MIN_PX),
        ],
        axis=1,
    )


def _view_shift(x: Any, y: Any, ops: _Ops) -> tuple[Any, Any]:
    """Unit vector from the optical axis to a bubble at (x, y) (shorter-side units; zero at
    the axis): the refracted view shifts along it."""
    norm = ops.sqrt(x * x + y * y) + 1e-6
    return x / norm, y / norm


def render_bubble(
    lin: np.ndarray,
    out: np.ndarray,
    row: Sequence[float],
    light: float,
    glint: float,
    env: Sequence[float],
    weight: float = 1.0,
    density: np.ndarray | None = None,
) -> None:
    """Add one recorded bubble's change ``weight * cover * (film - tissue)`` to ``out`` (CHW),
    reading the tissue behind from ``lin`` (CHW linear). row: ``BUBBLE_ROW`` values (x, y from
    the image centre and r in shorter-side units, film nm, phase, aspect, orientation, glint
    peak and size, look). ``density``: (H, W), if given, gains ``weight * cover`` (where the
    foam's cells lie, for the interstitial fluid)."""
    c, h, w = lin.shape
    ops = _Ops(False)
    cx, cy, r = _bubble_pixels(np.asarray([row], np.float64), h, w)[0]
    reach = math.ceil(r) + 2
    x0, x1 = max(0, math.floor(cx) - reach), min(w, math.floor(cx) + reach + 1)
    y0, y1 = max(0, math.floor(cy) - reach), min(h, math.floor(cy) + reach + 1)
    if x0 >= x1 or y0 >= y1 or r < BUBBLE_MIN_PX:
        return
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    bx, by, rf = np.float32(cx), np.float32(cy), np.float32(r)
    dx, dy = xs + np.float32(0.5) - bx, ys + np.float32(0.5) - by
    f32 = [np.float32(v) for v in row]
    aspect, orient = f32[5], f32[6]
    _rho, cover, cos_t = bubble_geometry(dx, dy, rf, aspect, orient, ops)
    ux, uy = _view_shift(f32[0], f32[1], ops)
    # refraction through the dome: the tissue is read closer to the centre (magnified) and
    # shifted away from the axis (the bubble is seen obliquely)
    pull = 1.0 - BUBBLE_REFRACTION * cos_t
    shift = BUBBLE_SHIFT * rf * cos_t
    mx = (bx + dx * pull - shift * ux - 0.5).astype(np.float32)
    my = (by + dy * pull - shift * uy - 0.5).astype(np.float32)
    behind = _host.sample_bilinear(lin, mx, my)
    lf, gf = np.float32(light), np.float32(glint)
    film = bubble_film(
        behind,
        dx,
        dy,
        (rf, aspect, orient, f32[3], f32[4], f32[7], f32[8], f32[9]),
        glint_offset(f32[0], f32[1], rf, lf, gf, ops, f32[9]),
        lf,
        [np.float32(e) for e in env],
        ops,
        c,
    )
    region = out[:, y0:y1, x0:x1]
    for ch in range(c):
        region[ch] += np.float32(weight) * (cover * (film[ch] - lin[ch, y0:y1, x0:x1]))
    if density is not None:
        density[y0:y1, x0:x1] += np.float32(weight) * cover


def foam_folds(img: np.ndarray, tissue: np.ndarray, spread: float = 0.0) -> np.ndarray:
    """float32 (H, W) in [0, 1]: where foam collects on this frame. Foam is carried by the
    liquid film that pools in the valleys between the mucosal folds (shadowed, darker than
    their surround), so the map is the frame's valleys: the positive part of a band-pass of the
    luma (``FOAM_FOLDS``: coarse minus fine blur), standardised by its upper quantile over the
    tissue (at least an absolute floor, so a flat frame has no folds) and ramped between
    ``lo`` and ``hi``, both lowered by the share ``spread`` (abundant foam overflows the folds
    onto fainter relief; a flat frame still has none)."""
    scale = min(tissue.shape)
    lum = _host.luma(img)
    band = np.maximum(
        _host.gauss(lum, FOAM_FOLDS["coarse"] * scale)
        - _host.gauss(lum, FOAM_FOLDS["fine"] * scale),
        0.0,
    )
    vals = band[tissue]
    if vals.size == 0:
        return np.zeros_like(band)
    top = np.float32(max(float(np.quantile(vals, FOAM_FOLDS["quantile"])), FOAM_FOLDS["floor"]))
    keep = np.float32(1.0 - spread)
    lo, hi = np.float32(FOAM_FOLDS["lo"]) * keep, np.float32(FOAM_FOLDS["hi"]) * keep
    return np.clip((band / top - lo) / (hi - lo), 0.0, 1.0)


def foam_folds_t(x: torch.Tensor, tissue: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """(B, H, W) ``foam_folds`` of a batch (tissue: bool (B, 1, H, W), spread (B,))."""
    scale = min(x.shape[-2:])
    lum = _host.luma_t(x)
    band = (
        _host.gauss_t(lum, FOAM_FOLDS["coarse"] * scale)
        - _host.gauss_t(lum, FOAM_FOLDS["fine"] * scale)
    ).clamp(min=0.0)
    top = _host.masked_quantile(band, tissue[:, 0], FOAM_FOLDS["quantile"])
    top = torch.where(torch.isnan(top), 1.0, top.clamp(min=FOAM_FOLDS["floor"]))
    top = top.to(torch.float32).view(-1, 1, 1)
    keep = (1.0 - spread.to(torch.float64)).to(torch.float32).view(-1, 1, 1)
    lo, hi = FOAM_FOLDS["lo"] * keep, FOAM_FOLDS["hi"] * keep
    return ((band / top - lo) / (hi - lo)).clamp(0.0, 1.0)


def _drawn_rows(rows: np.ndarray, tissue: np.ndarray) -> np.ndarray:
    """The recorded rows whose centre pixel lies on the tissue."""
    h, w = tissue.shape
    px = _bubble_pixels(rows, h, w)
    ix, iy = np.trunc(px[:, 0]).astype(np.int64), np.trunc(px[:, 1]).astype(np.int64)
    ok = (rows[:, 2] > 0) & (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    ok &= px[:, 2] >= BUBBLE_MIN_PX
    ok[ok] = tissue[iy[ok], ix[ok]]
    return rows[ok]


BUBBLE_SLOTS = 256  # bubble slots of the torch kernel come in multiples of this


def _camera_sigma(h: int, w: int) -> float:
    """The camera's blur on the bubble layer (pixels): what the optics and sensor do to the rest
    of the frame, so the bubbles are no sharper than the tissue."""
    return max(BUBBLE_PSF * min(h, w), BUBBLE_PSF_MIN)


def _bubbles_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``bubbles`` of a batch (the torch kernel): every bubble of every sample as a square
    patch (B, N, P, P) around its centre, P sized by the largest radius a bubble may have; the
    film formulas of ``bubble_film`` on the patches, the tissue behind read by one batched
    remap, each patch's change cover * (film - tissue) scattered back into a layer, blurred by
    the camera and added. Padding slots and bubbles off the tissue have no cover. No loop over
    samples or bubbles."""
    b, c, h, w = x.shape
    scale = min(h, w)
    ops = _Ops(True)
    _field, tissue = _host.view_masks(x, scenes)
    lin = _math.srgb_to_linear(x)
    rows = torch.cat(
        [p[name].reshape(b, -1, BUBBLE_ROW).to(torch.float64) for name in ("bubbles", "foam")],
        dim=1,
    )
    if rows.shape[1] == 0:
        return x.clone()
    # pad the bubble slots to a multiple of BUBBLE_SLOTS (empty rows draw nothing): a sample's
    # slot count then does not depend on the longest row list of its batch, so the patch
    # tensors, and the float32 rounding of the remap and scatter over them, are the same alone
    # and in any batch
    n = -(-rows.shape[1] // BUBBLE_SLOTS) * BUBBLE_SLOTS
    rows = torch.nn.functional.pad(rows, (0, 0, 0, n - rows.shape[1]))
    cx, cy = w / 2 + rows[:, :, 0] * scale, h / 2 + rows[:, :, 1] * scale
    radius = (rows[:, :, 2].clamp(max=BUBBLE_MAX) * scale).clamp(min=BUBBLE_MIN_PX)
    ix, iy = torch.trunc(cx).long(), torch.trunc(cy).long()
    on_image = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    flat = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).view(b, -1)
    on_tissue = tissue.view(b, h * w).gather(1, flat)
    drawn = (rows[:, :, 2] > 0) & on_image & on_tissue & (radius >= BUBBLE_MIN_PX)
    # foam gathers along the folds: each bubble drawn as much as the fold map at its centre
    folds = foam_folds_t(x, tissue, p["spread"]).view(b, h * w).gather(1, flat).view(b, n, 1, 1)
    # patch side from the largest radius a bubble may have at this size (shapes only)
    reach = math.ceil(BUBBLE_MAX * scale) + 2
    side = 2 * reach + 1
    offs = torch.arange(side, device=x.device, dtype=torch.int64) - reach
    px = torch.floor(cx).long().view(b, n, 1, 1) + offs.view(1, 1, 1, side)  # (B, N, 1, P)
    py = torch.floor(cy).long().view(b, n, 1, 1) + offs.view(1, 1, side, 1)  # (B, N, P, 1)
    bx, by = cx.to(torch.float32).view(b, n, 1, 1), cy.to(torch.float32).view(b, n, 1, 1)
    r = torch.where(drawn, radius, 1.0).to(torch.float32).view(b, n, 1, 1)
    dx = px.to(torch.float32) + 0.5 - bx
    dy = py.to(torch.float32) + 0.5 - by
    dx, dy = dx.expand(b, n, side, side), dy.expand(b, n, side, side)
    col = [rows[:, :, i].to(torch.float32).view(b, n, 1, 1) for i in range(BUBBLE_ROW)]
    aspect = torch.where(drawn.view(b, n, 1, 1), col[5], 1.0)
    _rho, cover, cos_t = bubble_geometry(dx, dy, r, aspect, col[6], ops)
    ux, uy = _view_shift(col[0], col[1], ops)
    pull = 1.0 - BUBBLE_REFRACTION * cos_t
    shift = BUBBLE_SHIFT * r * cos_t
    mx = (bx + dx * pull - shift * ux - 0.5).reshape(b, n * side, side)
    my = (by + dy * pull - shift * uy - 0.5).reshape(b, n * side, side)
    behind = _host.remap(lin, mx, my, "linear", "reflect101").view(b, c, n, side, side)
    # the mean in float64: its float32 value does not move with the batch's thread chunking
    env_c = (lin.to(torch.float64).mean(dim=(2, 3)) * BUBBLE_ENV[0] + BUBBLE_ENV[1]).to(
        torch.float32
    )
    env = [env_c[:, ch].view(b, 1, 1, 1) for ch in range(c)]
    light = p["light"].to(torch.float32).view(b, 1, 1, 1)
    glint = p["glint"].to(torch.float32).view(b, 1, 1, 1)
    film = bubble_film(
        behind.transpose(0, 1),
        dx,
        dy,
        (r, aspect, col[6], col[3], col[4], col[7], col[8], col[9]),
        glint_offset(col[0], col[1], r, light, glint, ops, col[9]),
        light,
        env,
        ops,
        c,
    )
    inside = (px >= 0) & (px < w) & (py >= 0) & (py < h) & drawn.view(b, n, 1, 1)
    index = torch.where(inside, py.clamp(0, h - 1) * w + px.clamp(0, w - 1), 0)
    weight = torch.where(inside, cover * folds, 0.0)
    tissue_here = (
        lin.reshape(b, c, h * w)
        .gather(2, index.reshape(b, 1, -1).expand(b, c, -1))
        .view(b, c, n, side, side)
    )
    delta = torch.stack([weight * (film[ch] - tissue_here[:, ch]) for ch in range(c)], dim=1)
    added = torch.zeros(b, c, h * w, device=x.device, dtype=lin.dtype)
    # exact sums off the CPU: a GPU's float scatter-add adds in the threads' arrival order
    exact.scatter_sum_(added, 2, index.reshape(b, 1, -1).expand(b, c, -1), delta.reshape(b, c, -1), 64.0)
    out = lin + _host.gauss_t(added.view(b, c, h, w), _camera_sigma(h, w))
    # (overlapping walls dim the tissue seen through both, never to black)
    out = torch.maximum(out, lin * BUBBLE_FLOOR)
    # the interstitial fluid where the cells crowd
    density = torch.zeros(b, h * w, device=x.device, dtype=lin.dtype)
    exact.scatter_sum_(density, 1, index.reshape(b, -1), weight.reshape(b, -1), 64.0)
    crowd = _host.gauss_t(density.view(b, h, w), BUBBLE_FLUID["blur"] * scale)
    wet = (
        (crowd * BUBBLE_FLUID["gain"]).clamp(0.0, 1.0)
        * (1.0 - density.view(b, h, w).clamp(0.0, 1.0))
        * p["fluid"].to(torch.float32).view(b, 1, 1)
    )
    tint = p["fluid_tint"].to(torch.float32).view(b, 1, 1)
    colour = fluid_colour([out[:, ch] for ch in range(c)], tint)
    out = torch.stack([out[:, ch] + wet * (colour[ch] - out[:, ch]) for ch in range(c)], dim=1)
    res = _math.linear_to_srgb(out.clamp(0.0, 1.0))
    return torch.where(tissue, res, x).clamp(0.0, 1.0)


def fluid_colour(env: Sequence[Any], tint: Any) -> list[Any]:
    """Linear colour per channel of the foam's interstitial fluid: whitish mucus (``tint`` 0) to
    blood-tinged reddish water (``tint`` 1), lit like the tissue under it (``env``: the frame's
    linear channels, per pixel; a dim lumen's mucus is dim, not a grey veil)."""
    white = sum(env) / len(env)
    if len(env) == 1:
        return [white * (1.0 - 0.3 * tint)]
    return [
        (1.0 - tint) * white * BUBBLE_FLUID["white"][ch] + tint * env[ch] * BUBBLE_FLUID["red"][ch]
        for ch in range(len(env))
    ]


@_host.host_op(
    "bubbles", sampler=_bubble_sampler, dtypes=(np.uint8, np.float32), device=_bubbles_batch
)
def bubbles(img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View) -> np.ndarray:
    """Foam along the fold valleys (models air bubbles trapped in the mucus and rinse-water film
    on the mucosa, seen through the scope's own light): packed clusters of transparent thin-film
    domes of log-normal sizes, each refracting the tissue behind it in the tissue's own colour,
    a dark edge of its own weight all round and a brighter arc on its lit side, a glint in most
    cells (dimmer on the finest, a second faint reflex in larger ones); interstitial fluid
    between crowded cells of heavy foam; blurred by the camera like the tissue (module
    docstring)."""
    tissue = view.tissue
    lin = _host.to_linear(img)
    layer = np.zeros_like(lin)
    h, w = tissue.shape
    rows = _drawn_rows(recorded_rows(p), tissue)
    env = lin.astype(np.float64).mean(axis=(1, 2)) * BUBBLE_ENV[0] + BUBBLE_ENV[1]
    folds = foam_folds(img, tissue, float(p["spread"]))
    centres = _bubble_pixels(rows, h, w)
    density = np.zeros((h, w), np.float32)
    for row, (bx, by, _r) in zip(rows.tolist(), centres.tolist(), strict=True):
        gate = float(folds[math.trunc(by), math.trunc(bx)])
        render_bubble(
            lin, layer, row, float(p["light"]), float(p["glint"]), env.tolist(), gate, density
        )
    sigma = _camera_sigma(h, w)
    out = lin + _host.per_channel(layer, lambda z: _host.gauss(z, sigma))
    out = np.maximum(out, lin * np.float32(BUBBLE_FLOOR))  # (stacked walls: never black)
    share = np.float32(p["fluid"])
    if share > 0:
        # (in the gaps between the cells: a cell's own film stays clear)
        crowd = _host.gauss(density, BUBBLE_FLUID["blur"] * min(h, w)) * BUBBLE_FLUID["gain"]
        wet = np.clip(crowd, 0, 1) * (1 - np.clip(density, 0, 1)) * share
        colour = fluid_colour(list(out), np.float32(p["fluid_tint"]))
        for ch in range(lin.shape[0]):
            out[ch] += wet * (np.asarray(colour[ch], np.float32) - out[ch])
    res = _host.to_display(np.clip(out, 0.0, 1.0))
    res[:, ~tissue] = img[:, ~tissue]
    return res


# ---------------------------------------------------------------------------------------------
# Pooled fluid, stool or blood

# Each fluid: absorption per unit depth (linear RGB), body colour of the light it scatters back,
# how strongly it scatters (turbidity), how patchy its concentration is, how many suspended
# particles it carries and their colour. Blood absorbs green and blue strongly (haemoglobin's
# Soret and Q bands) and mixes with the rinse water in swirls; bile absorbs blue (bilirubin) and is
# translucent; a stool suspension absorbs broadly, is turbid and full of particles (fibre, seeds);
# rinse water barely absorbs (a little red), is faintly milky with fine debris and shows itself
# mostly by its surface. Last: how much fine foam floats on it (bile and stool froth, blood
# stirred with air by the rinse; rinse water little).
FLUID_NAMES = ("bile", "stool", "blood", "clear")
FLUIDS = {
    0: ((0.25, 0.45, 2.2), (1.0, 0.56, 0.08), 1.5, 0.35, 0.08, (0.25, 0.17, 0.03), 0.6),
    1: ((1.6, 2.2, 3.2), (0.6, 0.3, 0.045), 1.4, 0.5, 0.5, (0.16, 0.10, 0.03), 0.8),
    2: ((1.2, 6.0, 5.5), (0.35, 0.02, 0.02), 0.35, 0.8, 0.35, (0.08, 0.0, 0.0), 0.7),
    3: ((0.08, 0.04, 0.03), (0.5, 0.5, 0.46), 0.2, 0.5, 0.1, (0.3, 0.27, 0.15), 0.3),
}
FLUID_RAMP = 0.12  # the pool deepens from its edge over about twice this (shorter side)
FLUID_DEEP = 0.7  # the floor is level (full depth) where it is this share of its deepest
FLUID_VALLEY = (0.45, 0.3, 1.8)  # depth x (1 - this x relief), clipped: deepest in fold valleys
# turbidity drifts: their cell (shorter side) and how much denser deep fluid carries them
FLUID_DRIFT = (0.11, 0.6, 0.3)  # ... and how much more light dense drifts scatter back
FLUID_CLUMP = (0.09, 3.0, 1.6)  # clumps of debris and froth: cell (shorter side), gain, offset
FLUID_GLINT_ZONE = (0.2, 2.5, 0.3)  # the swell facing the light: cell, gain, offset
FLUID_WEDGE = 1.5  # depth ~ floor ** this: a shallow wedge at the shore, no abrupt turbid edge
FLUID_MURK_CELL = 0.08  # patches of concentration (shorter side)
FLUID_FLECK_CELL = 0.012  # suspended particles (shorter side)
FLUID_MENISCUS = (0.004, 0.014)  # meniscus height and width (shorter side)
FLUID_RIPPLE = (0.0007, 0.03)  # ripple height and wavelength (shorter side)
FLUID_REFRACTION = 0.015  # tissue shift (shorter side) per unit slope of the surface
FLUID_GLINT = (6.0, 0.006, 3.0)  # specular lobe of the surface: peak (linear, clipped), slope
# width along the tilt and the factor it is wider across (a glint runs along a ripple's crest)
FLUID_ARC = (0.35, 0.15)  # meniscus arc: brightness (linear) and the slope at which it is full
FLUID_BREAK = (0.02, 2.5)  # the glints' breaks: noise cell (shorter side) and contrast
FLUID_SHEEN = 0.02  # Fresnel reflectance of water at normal incidence, the surface's sheen
FLUID_RELIEF = (0.3, 0.012)  # weight of the relief in the pool's level; its blur (shorter side)
# the relief is rounded to 1/256: the two paths' blurs differ by float32 rounding, and the pool
# is a threshold of it (the steps move the shore by well under a pixel)
FLUID_RELIEF_STEPS = 256
FLUID_SCATTER_BLUR = 0.006  # blur of the tissue seen through turbid fluid (shorter side)
FLUID_LIGHT_BLUR = 0.08  # the fluid's body is lit by the scope's falloff, not the folds' shading
# fine bubbles floating on the pool: one at most per cell of a jittered grid (cell, shorter
# side), radii a share of the cell, and the cell of their clumps (shorter side)
FLUID_FOAM = (0.011, (0.08, 0.32), 0.05)
FLUID_FOAM_SHARE = 0.35  # share of the grid's cells that hold a fine bubble
FLUID_FOAM_LOOK = (0.35, 2.5)  # their dark ring's depth and their glint's peak (linear)


def foam_look(dx: Any, dy: Any, rad: Any, present: Any, peak: Any, ops: _Ops) -> tuple[Any, Any]:
    """(shade, glint) of a fine bubble at (dx, dy) px from its centre (radius ``rad`` px,
    ``present`` 0/1): a dark refraction ring and a small glint at the centre (a tiny dome seen
    from the light guide's side), its peak ``peak`` (0-1, keyed per bubble: most glint faintly).
    Shared by both paths."""
    d = ops.sqrt(dx * dx + dy * dy) / rad
    ring = ops.exp(-0.5 * ((d - 0.8) / 0.2) ** 2) * present
    spot = ops.exp(-0.5 * (d / 0.3) ** 2) * present
    return 1.0 - FLUID_FOAM_LOOK[0] * ring, FLUID_FOAM_LOOK[1] * peak * spot


def _foam_grid(h: int, w: int, cell: float) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Grid size (gh, gw) and each pixel's row and column cell index of the foam's grid."""
    gh, gw = math.ceil(h / cell) + 1, math.ceil(w / cell) + 1
    rows = np.floor((np.arange(h) + 0.5) / cell).astype(np.int64)
    cols = np.floor((np.arange(w) + 0.5) / cell).astype(np.int64)
    return gh, gw, rows, cols


def fine_foam(key: int, h: int, w: int, gate: np.ndarray, ops: _Ops) -> tuple[Any, Any]:
    """(shade, glint) (H, W) of the fine foam: one bubble at most per grid cell, present where
    the cell's keyed uniform is under ``FLUID_FOAM_SHARE``, centre jittered inside the cell, keyed
    radius, seen as much as ``gate`` (H, W) says (a continuous weight: no pixel flips between
    the paths on a rounding of the gate)."""
    cell = FLUID_FOAM[0] * min(h, w)
    gh, gw, rows, cols = _foam_grid(h, w, cell)
    grid = {
        name: rng.uniform_numpy(key, f"fluid-foam/{name}", gh * gw).reshape(gh, gw)
        for name in ("present", "x", "y", "r")
    }
    u = grid["present"][np.ix_(rows, cols)]
    present = (u < np.float32(FLUID_FOAM_SHARE)).astype(np.float32) * np.clip(gate, 0.0, 1.0)
    # a pixel without a bubble (present +0: the gate is >= 0) has shade 1 - 0.35 (+0) = 1 and
    # glint +0: the look is computed at the other pixels alone, each with the same operations
    # on the same values as over the whole frame (flat, contiguous operands)
    at = np.flatnonzero(present)
    y, x = np.divmod(at, w)
    r, c = rows[y], cols[x]
    jx, jy, rs = grid["x"][r, c], grid["y"][r, c], grid["r"][r, c]
    lo, hi = FLUID_FOAM[1]
    rad = np.float32(cell) * (np.float32(lo) + np.float32(hi - lo) * rs)
    span = np.float32(1.0 - 2.0 * hi)  # the centre keeps the bubble inside its cell
    cx = (c + np.float32(hi) + span * jx) * np.float32(cell)
    cy = (r + np.float32(hi) + span * jy) * np.float32(cell)
    xs = x.astype(np.float32) + np.float32(0.5)
    ys = y.astype(np.float32) + np.float32(0.5)
    ua = u.reshape(-1)[at]
    look = foam_look(
        xs - cx, ys - cy, rad, present.reshape(-1)[at], ua * ua / np.float32(FLUID_FOAM_SHARE**2), ops
    )
    shade_at, glint_at = (np.asarray(v) for v in look)
    shade = np.ones(h * w, dtype=shade_at.dtype)
    glint = np.zeros(h * w, dtype=glint_at.dtype)
    shade[at], glint[at] = shade_at, glint_at
    return shade.reshape(h, w), glint.reshape(h, w)


def fine_foam_t(
    keys: Sequence[int], h: int, w: int, gate: torch.Tensor, ops: _Ops
) -> tuple[Any, Any]:
    """``fine_foam`` of a batch (gate: (B, 1, H, W)); (shade, glint) (B, 1, H, W)."""
    cell = FLUID_FOAM[0] * min(h, w)
    gh, gw, rows_np, cols_np = _foam_grid(h, w, cell)
    rows = torch.from_numpy(rows_np).to(gate.device)
    cols = torch.from_numpy(cols_np).to(gate.device)
    u, jx, jy, rs = (
        keyed_fields.uniform_fields(keys, f"fluid-foam/{name}", (gh, gw), gate.device)[:, rows][
            :, :, cols
        ].unsqueeze(1)
        for name in ("present", "x", "y", "r")
    )
    lo, hi = FLUID_FOAM[1]
    rad = cell * (lo + (hi - lo) * rs)
    span = 1.0 - 2.0 * hi
    cx = (cols.view(1, 1, 1, w).to(torch.float32) + hi + span * jx) * cell
    cy = (rows.view(1, 1, h, 1).to(torch.float32) + hi + span * jy) * cell
    xs = torch.arange(w, device=gate.device, dtype=torch.float32).view(1, 1, 1, w) + 0.5
    ys = torch.arange(h, device=gate.device, dtype=torch.float32).view(1, 1, h, 1) + 0.5
    present = (u < FLUID_FOAM_SHARE).to(torch.float32) * gate.clamp(0.0, 1.0)
    return foam_look(xs - cx, ys - cy, rad, present, u * u / FLUID_FOAM_SHARE**2, ops)


def glint_lobe(gx: Any, gy: Any, tx: Any, ty: Any, ops: _Ops) -> Any:
    """The liquid surface's specular lobe where its slope (gx, gy) is near the tilt (tx, ty)
    that mirrors the lamp into the lens: narrow along the tilt, ``FLUID_GLINT[2]`` x wider
    across it, so the glints are thin streaks along the ripples' crests (shared by both
    paths)."""
    norm = ops.sqrt(tx * tx + ty * ty) + 1e-6
    ux, uy = tx / norm, ty / norm
    ex, ey = gx - tx, gy - ty
    along, across = ex * ux + ey * uy, (ey * ux - ex * uy) / FLUID_GLINT[2]
    return ops.exp(-0.5 * (along * along + across * across) / FLUID_GLINT[1] ** 2)


def _fluid_sampler(rng: np.random.Generator, level: Level) -> Params:
    """Pool size and depth from the table; the fluid (``FLUID_NAMES``), the side it pools on
    and the surface tilt that mirrors the light into the lens, keyed."""
    tilt, angle = float(rng.uniform(0.04, 0.06)), float(rng.uniform(0.0, 2.0 * math.pi))
    return {
        "coverage": draw(rng, level["coverage"]),
        "opacity": draw(rng, level["opacity"]),
        "fluid": float(rng.integers(0, len(FLUIDS))),
        "side": float(rng.uniform(0.0, 2.0 * math.pi)),
        "tilt": [tilt * math.cos(angle), tilt * math.sin(angle)],
    }


def fluid_relief(img: np.ndarray, tissue: np.ndarray, stepped: bool = True) -> np.ndarray:
    """float32 (H, W): the mucosa's relief as the frame shows it, the smoothed luma standardised
    over the tissue (low in fold valleys and the far lumen, where liquid collects; zero on a
    uniform frame); ``stepped``: rounded to ``1 / FLUID_RELIEF_STEPS`` (for the pool's
    threshold), else smooth (for the depth)."""
    scale = min(tissue.shape)
    lum = _host.gauss(_host.luma(img), FLUID_RELIEF[1] * scale)
    vals = lum[tissue].astype(np.float64)
    if vals.size == 0:
        return np.zeros_like(lum)
    mean = vals.mean()
    std = np.sqrt(((vals - mean) ** 2).mean())
    relief = ((lum - mean) / (std + 1e-3)).astype(np.float32)
    if not stepped:
        return relief
    return np.round(relief * np.float32(FLUID_RELIEF_STEPS)) / np.float32(FLUID_RELIEF_STEPS)


def pool_mask(
    key: int, tissue: np.ndarray, coverage: float, side_angle: float, relief: np.ndarray
) -> np.ndarray:
    """Bool (H, W): the pooled fluid, ``coverage`` of the tissue: a level set of a field that
    falls towards the keyed (dependent) side, with an irregular edge, and follows the mucosa's
    ``relief`` (``fluid_relief``), so the shore runs along folds instead of cutting across."""
    h, w = tissue.shape
    scale = min(h, w)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    cx, cy, radius = _host.field_geometry(tissue)
    ramp = ((xs - cx) * math.cos(side_angle) + (ys - cy) * math.sin(side_angle)) / np.float32(
        radius
    )
    level = ramp + 0.3 * _host.fractal_noise(key, "fluid-shape", h, w, 0.3 * scale, 2)
    level = level - np.float32(FLUID_RELIEF[0]) * np.clip(relief, -1.5, 1.5)
    values = level[tissue]
    if values.size == 0 or coverage <= 0:
        return np.zeros_like(tissue)
    threshold = float(np.quantile(values, 1.0 - coverage))
    pool = (level > threshold) & tissue
    # an opening (3 x 3) drops one-pixel slivers along edges: the shore is the level set's, and
    # thin diagonal strips are where the batched components of the torch path need more rounds
    pool = cv2.morphologyEx(pool.astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8)) > 0
    # keep the largest connected pool (one puddle, not scattered islands)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(pool.astype(np.uint8), connectivity=8)
    if n > 2:
        pool = labels == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    # fill islands left inside the puddle (a liquid surface has no holes at this scale)
    holes = (~pool).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(holes, connectivity=4)
    small = np.flatnonzero(stats[:, cv2.CC_STAT_AREA] < 0.02 * tissue.sum())
    return (pool | np.isin(labels, small)) & tissue


def fluid_relief_t(x: torch.Tensor, tissue: torch.Tensor, stepped: bool = True) -> torch.Tensor:
    """(B, H, W) ``fluid_relief`` of a batch (tissue: bool (B, 1, H, W)); mean and spread in
    float64."""
    scale = min(x.shape[-2:])
    lum = _host.gauss_t(_host.luma_t(x), FLUID_RELIEF[1] * scale)
    inside = tissue[:, 0]
    count = inside.sum(dim=(1, 2)).clamp(min=1).to(torch.float64).view(-1, 1, 1)
    lum64 = lum.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    mean = torch.where(inside, lum64, zero).sum(dim=(1, 2), keepdim=True) / count
    var = torch.where(inside, (lum64 - mean) ** 2, zero).sum(dim=(1, 2), keepdim=True) / count
    relief = (lum - mean.to(torch.float32)) / (torch.sqrt(var) + 1e-3).to(torch.float32)
    if not stepped:
        return relief
    return torch.round(relief * FLUID_RELIEF_STEPS) / FLUID_RELIEF_STEPS


def pool_mask_t(
    keys: Sequence[int],
    tissue: torch.Tensor,
    coverage: torch.Tensor,
    side_angle: torch.Tensor,
    relief: torch.Tensor,
) -> torch.Tensor:
    """bool (B, 1, H, W): ``pool_mask`` of a batch (tissue: bool (B, 1, H, W)); the largest
    pool and its small holes by batched connected components."""
    b, _, h, w = tissue.shape
    scale = min(h, w)
    cx, cy, radius = (v.to(torch.float32).view(-1, 1, 1) for v in _host.field_geometry_t(tissue))
    ys = torch.arange(h, device=tissue.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=tissue.device, dtype=torch.float32).view(1, 1, w)
    angle = side_angle.to(torch.float64)
    cos, sin = (v.to(torch.float32).view(-1, 1, 1) for v in (torch.cos(angle), torch.sin(angle)))
    ramp = ((xs - cx) * cos + (ys - cy) * sin) / radius
    level = ramp + 0.3 * _host.fractal_noise_t(keys, "fluid-shape", h, w, 0.3 * scale, 2, tissue)
    level = level - FLUID_RELIEF[0] * relief.clamp(-1.5, 1.5)
    inside = tissue[:, 0]
    threshold = _host.masked_quantile(level, inside, 0.0, 1.0 - coverage.to(torch.float64))
    threshold = threshold.to(torch.float32).view(-1, 1, 1)
    pool = (level > threshold) & inside
    # an opening (3 x 3) drops one-pixel slivers (OpenCV's borders: outside counts as set for
    # the erosion, unset for the dilation)
    solid = pool.unsqueeze(1).to(torch.float32)
    eroded = 1.0 - torch.nn.functional.max_pool2d(1.0 - solid, 3, 1, 1)
    pool = torch.nn.functional.max_pool2d(eroded, 3, 1, 1)[:, 0] > 0
    # keep the largest connected pool (one puddle, not scattered islands)
    labels = _host.components_t(pool.unsqueeze(1).to(torch.float32), 8)
    area = _host.component_area(labels)
    area[:, 0] = -1
    pool = pool & (labels == area.argmax(dim=1).view(-1, 1, 1))
    # fill islands left inside the puddle (4-connected holes under 2 % of the tissue)
    holes = _host.components_t((~pool).unsqueeze(1).to(torch.float32), 4)
    hole_area = _host.component_area(holes).gather(1, holes.reshape(b, -1)).view(b, h, w)
    small = hole_area < 0.02 * inside.sum(dim=(1, 2)).view(-1, 1, 1)
    keep = (coverage > 0).view(-1, 1, 1) & inside.flatten(1).any(dim=1).view(-1, 1, 1)
    return ((pool | small) & inside & keep).unsqueeze(1)


def _slope(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Central differences (x, y) per pixel of an (H, W) plane, edges replicated."""
    zp = np.pad(z, 1, mode="edge")
    half = np.float32(0.5)
    return (zp[1:-1, 2:] - zp[1:-1, :-2]) * half, (zp[2:, 1:-1] - zp[:-2, 1:-1]) * half


def _slope_t(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_slope`` of every plane of a (B, 1, H, W) batch."""
    zp = torch.nn.functional.pad(z, (1, 1, 1, 1), mode="replicate")
    return (zp[..., 1:-1, 2:] - zp[..., 1:-1, :-2]) * 0.5, (
        zp[..., 2:, 1:-1] - zp[..., :-2, 1:-1]
    ) * 0.5


FLUID_TABLE = torch.tensor(
    [
        [*mu, *body, turbid, patchy, particles, *fleck, foam]
        for mu, body, turbid, patchy, particles, fleck, foam in (
            FLUIDS[i] for i in range(len(FLUIDS))
        )
    ]
)


def _fluid_occlusion_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``fluid_occlusion`` of a batch in one pass (the torch kernel)."""
    _b, c, h, w = x.shape
    scale = min(h, w)
    _field, tissue = _host.view_masks(x, scenes)
    relief = fluid_relief_t(x, tissue, stepped=False)
    stepped = torch.round(relief * FLUID_RELIEF_STEPS) / FLUID_RELIEF_STEPS
    pool = pool_mask_t(keys, tissue, p["coverage"], p["side"], stepped)
    poolf = pool.to(torch.float32)
    inner = (_host.gauss_t(poolf, FLUID_RAMP * scale) - 0.5).clamp(min=0.0) * poolf
    floor = (inner / (FLUID_DEEP * inner.amax(dim=(1, 2, 3), keepdim=True) + 1e-6)).clamp(0.0, 1.0)
    valley = (1.0 - FLUID_VALLEY[0] * relief.unsqueeze(1)).clamp(*FLUID_VALLEY[1:])
    depth = p["opacity"].view(-1, 1, 1, 1) * _math.power(floor, FLUID_WEDGE) * valley
    table = FLUID_TABLE.to(x.device)[torch.round(p["fluid"]).long()]
    mu, body, fleck = table[:, 0:3], table[:, 3:6], table[:, 9:12]
    turbid, patchy, particles, foam = (table[:, i].view(-1, 1, 1, 1) for i in (6, 7, 8, 12))
    if c == 1:
        luma = torch.from_numpy(_host.LUMA).to(x.device).view(3, 1)
        mu, body, fleck = mu.mean(dim=1, keepdim=True), body @ luma, fleck @ luma
    mu, body, fleck = mu.view(-1, c, 1, 1), body.view(-1, c, 1, 1), fleck.view(-1, c, 1, 1)
    drift = _host.fractal_noise_t(keys, "fluid-drift", h, w, FLUID_DRIFT[0] * scale, 3, x)
    swirl = _host.fractal_noise_t(keys, "fluid-murk", h, w, FLUID_MURK_CELL * scale, 4, x)
    murk = (1.0 + patchy * (swirl + drift).unsqueeze(1)).clamp(min=0.1) * (
        (1.0 - FLUID_DRIFT[1]) + FLUID_DRIFT[1] * floor
    )
    clump = _host.value_noise_t(keys, "fluid-foam-clump", h, w, FLUID_CLUMP[0] * scale, x)
    clumps = (FLUID_CLUMP[1] * clump.unsqueeze(1) - FLUID_CLUMP[2]).clamp(0.0, 1.0)
    grains = _host.fractal_noise_t(keys, "fluid-flecks", h, w, FLUID_FLECK_CELL * scale, 2, x)
    flecks = (
        ((grains.unsqueeze(1) - 0.35) / 0.15).clamp(0.0, 1.0)
        * particles
        * clumps
        * (4.0 * floor).clamp(max=1.0)
    )
    dens = depth * murk
    # the meniscus rises smoothly to the shore (continued past it, so its slope has no step at
    # the pool's edge: no one-pixel line)
    rise = _host.gauss_t(1.0 - poolf, FLUID_MENISCUS[1] * scale)
    men = rise * poolf
    ripple = _host.fractal_noise_t(
        keys, "fluid-ripple", h, w, FLUID_RIPPLE[1] * scale, 2, x
    ).unsqueeze(1)
    height = (FLUID_MENISCUS[0] * rise + FLUID_RIPPLE[0] * ripple * floor) * scale
    gx, gy = _slope_t(height)
    lin = _math.srgb_to_linear(x)
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, 1, w)
    shift = FLUID_REFRACTION * scale
    behind = _host.remap(lin, xs - shift * gx[:, 0], ys - shift * gy[:, 0], "linear", "reflect101")
    # forward scattering in the turbid fluid blurs the tissue seen through it
    hazy = 1.0 - torch.exp(-turbid * dens)
    behind = behind + (_host.gauss_t(behind, FLUID_SCATTER_BLUR * scale) - behind) * hazy
    lit = _host.gauss_t(_host.luma_t(lin), FLUID_LIGHT_BLUR * scale)
    top = _host.masked_quantile(lit, tissue[:, 0], 0.98)
    lit = (lit / (top + 1e-6).to(torch.float32).view(-1, 1, 1)).clamp(0.0, 1.0).unsqueeze(1)
    light = 0.02 + 0.98 * lit  # the fluid is lit like the tissue around it
    # extinction is absorption plus scattering out of the beam: deep, turbid fluid hides the
    # folds under it
    trans = torch.exp(-(mu + turbid) * dens) * (1.0 - flecks)
    # dense drifts scatter more of the light back (higher albedo): swirls even where deep
    albedo = 1.0 + FLUID_DRIFT[2] * drift.unsqueeze(1)
    scatter = body * (1.0 - torch.exp(-turbid * dens)) * light * albedo + fleck * flecks * light
    tx, ty = (p["tilt"][:, i].view(-1, 1, 1, 1) for i in (0, 1))
    lobe = glint_lobe(gx, gy, tx, ty, _Ops(True))
    steep = torch.sqrt(gx * gx + gy * gy)
    facing = (gx * tx + gy * ty) / (steep * torch.sqrt(tx * tx + ty * ty) + 1e-6)
    arc = FLUID_ARC[0] * (steep / FLUID_ARC[1]).clamp(0.0, 1.0) * (0.5 + 0.5 * facing) ** 2
    wet = (1.0 - 2.0 * rise).clamp(0.0, 1.0)  # the surface fades in off the shore: no line
    # the sharp glints on the ripples of the open surface; the meniscus shows its soft arc
    # (a mirrored image of the lamp saturates the sensor even where the tissue is dim)
    # the surface is broken (capillary waves, floating film): its glints come in pieces
    broken = (
        (
            FLUID_BREAK[1]
            * _host.value_noise_t(keys, "fluid-glint-break", h, w, FLUID_BREAK[0] * scale, x)
            + 0.5
        )
        .clamp(0.0, 1.0)
        .unsqueeze(1)
    )
    zone = (
        (
            FLUID_GLINT_ZONE[1]
            * _host.value_noise_t(keys, "fluid-glint-zone", h, w, FLUID_GLINT_ZONE[0] * scale, x)
            + FLUID_GLINT_ZONE[2]
        )
        .clamp(0.0, 1.0)
        .unsqueeze(1)
    )
    glints = FLUID_GLINT[0] * lobe * (3.0 * floor).clamp(max=1.0) * broken * zone * torch.sqrt(lit)
    rim = (
        (
            2.0
            * _host.value_noise_t(keys, "fluid-rim-break", h, w, 1.5 * FLUID_BREAK[0] * scale, x)
            + 0.0
        )
        .clamp(0.0, 1.0)
        .unsqueeze(1)
    )
    surface = (glints + (arc * rim + FLUID_SHEEN) * lit) * wet
    surface = surface * poolf
    # fine foam floating on the pool in a few clumps, most along the meniscus
    shore = (men / 0.3).clamp(max=1.0)
    gate = foam * clumps * (0.15 + 0.85 * shore) * poolf
    shade, spark = fine_foam_t(keys, h, w, gate, _Ops(True))
    fluid = (behind * trans + scatter) * shade + surface + spark * torch.sqrt(lit)
    res = _math.linear_to_srgb(torch.where(pool, fluid, lin).clamp(0.0, 1.0))
    res = torch.where(tissue & pool, res, x)
    return res.clamp(0.0, 1.0)


@_host.host_op(
    "fluid_occlusion",
    sampler=_fluid_sampler,
    dtypes=(np.uint8, np.float32),
    device=_fluid_occlusion_batch,
)
def fluid_occlusion(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Fluid, stool, blood or clear water pooled over ``coverage`` of the field (module
    docstring): Beer-Lambert absorption and turbid scattering through a depth that grows from
    the pool's edge, patchy concentration and suspended particles of the fluid, the tissue
    refracted by the surface, a meniscus and ripples mirroring the light."""
    c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    # the relief rounded to steps for the pool's threshold (the same shore on both paths),
    # smooth for the depth (a step would differ between the paths' float32 roundings)
    relief = fluid_relief(img, tissue, stepped=False)
    stepped = np.round(relief * np.float32(FLUID_RELIEF_STEPS)) / np.float32(FLUID_RELIEF_STEPS)
    pool = pool_mask(key, tissue, float(p["coverage"]), float(p["side"]), stepped)
    if not pool.any():
        return img.copy()
    mu_, body_, turbid, patchy, particles, fleck_, foam = FLUIDS[round(float(p["fluid"]))]
    mu, body, fleck = (np.asarray(v, dtype=np.float32) for v in (mu_, body_, fleck_))
    if c == 1:
        mu, body, fleck = (
            mu.mean(keepdims=True),
            (body @ _host.LUMA)[None],
            (fleck @ _host.LUMA)[None],
        )
    poolf = pool.astype(np.float32)
    # the pool deepens from its edge to its deepest point (its floor is the mucosa sloping down
    # under it) and is deeper over the fold valleys than over the crests
    inner = np.maximum(_host.gauss(poolf, FLUID_RAMP * scale) - np.float32(0.5), 0.0) * poolf
    floor = np.clip(inner / (np.float32(FLUID_DEEP) * inner.max() + np.float32(1e-6)), 0.0, 1.0)
    valley = np.clip(1.0 - np.float32(FLUID_VALLEY[0]) * relief, *FLUID_VALLEY[1:])
    depth = np.float32(p["opacity"]) * floor**FLUID_WEDGE * valley
    # the carried matter (bile, stool, blood) drifts in swirls, denser where the pool is deep
    drift = _host.fractal_noise(key, "fluid-drift", h, w, FLUID_DRIFT[0] * scale, 3)
    murk = np.maximum(
        1.0
        + np.float32(patchy)
        * (_host.fractal_noise(key, "fluid-murk", h, w, FLUID_MURK_CELL * scale, 4) + drift),
        np.float32(0.1),
    ) * (np.float32(1.0 - FLUID_DRIFT[1]) + np.float32(FLUID_DRIFT[1]) * floor)
    # debris and froth gather in a few clumps, most of them near the shore
    clump = _host.value_noise(key, "fluid-foam-clump", h, w, FLUID_CLUMP[0] * scale)
    clumps = np.clip(np.float32(FLUID_CLUMP[1]) * clump - np.float32(FLUID_CLUMP[2]), 0.0, 1.0)
    grains = _host.fractal_noise(key, "fluid-flecks", h, w, FLUID_FLECK_CELL * scale, 2)
    flecks = (
        np.clip((grains - 0.35) / 0.15, 0.0, 1.0)
        * np.float32(particles)
        * clumps
        * np.minimum(np.float32(4.0) * floor, np.float32(1.0))
    )
    dens = depth * murk
    # the liquid surface (px): a meniscus rising to the mucosa at the edge, ripples on the body
    # (continued past the shore, so its slope has no step at the pool's edge: no one-pixel line)
    rise = _host.gauss(1.0 - poolf, FLUID_MENISCUS[1] * scale)
    men = rise * poolf
    ripple = _host.fractal_noise(key, "fluid-ripple", h, w, FLUID_RIPPLE[1] * scale, 2)
    height = (FLUID_MENISCUS[0] * rise + FLUID_RIPPLE[0] * ripple * floor) * scale
    gx, gy = _slope(height.astype(np.float32))
    lin = _host.to_linear(img)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    shift = np.float32(FLUID_REFRACTION * scale)
    behind = _host.sample_bilinear(lin, xs - shift * gx, ys - shift * gy)
    # forward scattering in the turbid fluid blurs the tissue seen through it
    hazy = 1.0 - np.exp(-np.float32(turbid) * dens)
    blurred = _host.per_channel(behind, lambda z: _host.gauss(z, FLUID_SCATTER_BLUR * scale))
    behind = behind + (blurred - behind) * hazy[None]
    lit = _host.gauss(_host.luma(lin), FLUID_LIGHT_BLUR * scale)
    lit = np.clip(lit / (float(np.quantile(lit[tissue], 0.98)) + 1e-6), 0.0, 1.0)
    light = 0.02 + 0.98 * lit  # the fluid is lit like the tissue around it
    # extinction is absorption plus scattering out of the beam: deep, turbid fluid hides the
    # folds under it
    # dense drifts scatter more of the light back (higher albedo): swirls even where deep
    albedo = np.float32(1.0) + np.float32(FLUID_DRIFT[2]) * drift
    trans = np.exp(-(mu[:, None, None] + np.float32(turbid)) * dens[None]) * (1.0 - flecks)[None]
    scatter = (
        body[:, None, None] * ((1.0 - np.exp(-np.float32(turbid) * dens)) * light * albedo)[None]
        + fleck[:, None, None] * (flecks * light)[None]
    )
    # the surface mirrors the light where its slope is the keyed tilt (meniscus arc, ripple
    # glints), clipped by the sensor, over a faint Fresnel sheen
    tx, ty = (np.float32(v) for v in np.asarray(p["tilt"]).reshape(2))
    lobe = glint_lobe(gx, gy, tx, ty, _Ops(False))
    # the meniscus, curving steeply up to the mucosa, mirrors the light along the arc facing it
    steep = np.sqrt(gx * gx + gy * gy)
    facing = (gx * tx + gy * ty) / (steep * np.sqrt(tx * tx + ty * ty) + np.float32(1e-6))
    arc = FLUID_ARC[0] * np.clip(steep / FLUID_ARC[1], 0.0, 1.0) * (0.5 + 0.5 * facing) ** 2
    wet = np.clip(1.0 - 2.0 * rise, 0.0, 1.0)  # the surface fades in off the shore: no line
    # the sharp glints on the ripples of the open surface; the meniscus shows its soft arc
    # (a mirrored image of the lamp saturates the sensor even where the tissue is dim)
    # the surface is broken (capillary waves, floating film): its glints come in pieces
    broken = np.clip(
        np.float32(FLUID_BREAK[1])
        * _host.value_noise(key, "fluid-glint-break", h, w, FLUID_BREAK[0] * scale)
        + np.float32(0.5),
        0.0,
        1.0,
    )
    # the glints crowd where the pool's swell faces the light, not evenly over the surface
    zone = np.clip(
        np.float32(FLUID_GLINT_ZONE[1])
        * _host.value_noise(key, "fluid-glint-zone", h, w, FLUID_GLINT_ZONE[0] * scale)
        + np.float32(FLUID_GLINT_ZONE[2]),
        0.0,
        1.0,
    )
    glints = (
        FLUID_GLINT[0]
        * lobe
        * np.minimum(np.float32(3.0) * floor, np.float32(1.0))
        * broken
        * zone
        * np.sqrt(lit)
    )
    # the meniscus rim is broken and of varying width (the same breaks, coarser)
    rim = np.clip(
        np.float32(2.0)
        * _host.value_noise(key, "fluid-rim-break", h, w, 1.5 * FLUID_BREAK[0] * scale)
        + np.float32(0.0),
        0.0,
        1.0,
    )
    surface = (glints + (arc * rim + FLUID_SHEEN) * lit) * wet
    surface = surface * poolf
    # fine foam floating on the pool in a few clumps, most along the meniscus: each bubble a
    # dark ring with a glint of the light
    shore = np.minimum(men / np.float32(0.3), np.float32(1.0))
    gate = np.float32(foam) * clumps * (0.15 + 0.85 * shore) * poolf
    shade, spark = fine_foam(key, h, w, gate, _Ops(False))
    fluid = (behind * trans + scatter) * shade[None] + (surface + spark * np.sqrt(lit))[None]
    out = np.where(pool[None], fluid, lin)
    res = _host.to_display(np.clip(out, 0.0, 1.0))
    keep = ~(tissue & pool)
    res[:, keep] = img[:, keep]
    return res
