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
* ``bubbles``: air bubbles and foam in the lumen (poor preparation, insufflation). A bubble is a
  thin-walled sphere on the mucosa: the tissue behind it is seen through a weak lens (slightly
  magnified), its film reflects more at grazing angles (Fresnel reflectance, Schlick's
  approximation ``F = F0 + (1 - F0)(1 - cos theta)^5``) so the rim is bright with a thin dark
  refraction line inside it, and the light at the lens makes a clipped specular spot where the
  sphere faces the camera (its centre). Bubbles come in clusters (foam) with log-normal radii.
* ``fluid_occlusion``: residual fluid, stool or blood pooled over the mucosa (a keyed blob
  reaching in from a keyed side, covering ``coverage`` of the field). Beer-Lambert absorption per
  channel ``T_c = exp(-mu_c depth)`` (bilious fluid absorbs blue, blood absorbs green and blue,
  stool all three) with depth growing from the pool's edge, turbid in-scattering towards the
  fluid's body colour, and a bright meniscus line where the fluid surface curves up to the
  mucosa (specular reflection of the light at the lens). It may hide findings: ``occludes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch

from perturb.errors import InputError
from perturb.ops import _host, _math
from perturb.ops.registry import Level, Params, draw, draw_int

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
BUBBLE_REFRACTION = 0.25  # magnification of the tissue seen through a bubble (weak lens)


def _bubble_sampler(rng: np.random.Generator, level: Level) -> Params:
    count = draw_int(rng, level["count"])
    radius = draw(rng, level["radius"])
    clusters = max(1, 1 + count // 20)
    centres = [
        [float(rng.uniform(0.2, 0.8)), float(rng.uniform(0.2, 0.8))] for _ in range(clusters)
    ]
    bubbles: list[list[float]] = []
    for i in range(count):
        cx, cy = centres[i % clusters]
        spread = radius * (0.6 + 0.45 * math.sqrt(count / clusters))
        r = radius * float(np.exp(rng.normal(0.0, 0.45)))
        bubbles.append(
            [float(cx + rng.normal(0.0, spread)), float(cy + rng.normal(0.0, spread)), r]
        )
    return {"count": count, "radius": radius, "bubbles": bubbles}


def render_bubble(lin: np.ndarray, out: np.ndarray, cx: float, cy: float, r: float) -> None:
    """Draw one bubble of radius ``r`` px centred at (cx, cy) px onto ``out`` (CHW linear), reading
    the tissue behind it from ``lin``."""
    _c, h, w = lin.shape
    x0, x1 = max(0, int(cx - r - 2)), min(w, int(cx + r + 3))
    y0, y1 = max(0, int(cy - r - 2)), min(h, int(cy + r + 3))
    if x0 >= x1 or y0 >= y1 or r < 1.5:
        return
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dx, dy = xs + 0.5 - cx, ys + 0.5 - cy
    rho = np.sqrt(dx * dx + dy * dy) / np.float32(r)
    cover = np.clip((1.0 - rho) * r + 0.5, 0.0, 1.0)  # anti-aliased disk
    if not cover.any():
        return
    inside = np.minimum(rho, 0.999)
    cos_t = np.sqrt(1.0 - inside * inside)
    # refraction through the dome: the tissue is read closer to the centre (magnified)
    pull = 1.0 - BUBBLE_REFRACTION * cos_t
    mx = (cx + dx * pull - 0.5).astype(np.float32)
    my = (cy + dy * pull - 0.5).astype(np.float32)
    behind = _host.sample_bilinear(lin, mx, my)
    fresnel = BUBBLE_F0 + (1.0 - BUBBLE_F0) * (1.0 - cos_t) ** 5
    env = float(lin.mean()) * 2.5 + 0.15  # the film mirrors the lit surroundings
    film = behind * (1.0 - fresnel) * 1.04 + env * fresnel
    # thin dark line just inside the rim: light refracted out of the camera's view
    dark_line = 1.0 - 0.45 * np.exp(-0.5 * ((rho - 0.9) / 0.03) ** 2)
    film = film * dark_line
    # specular spot of the light at the lens, where the sphere faces the camera
    spot = 2.5 * np.exp(-0.5 * (rho / 0.07) ** 2)
    film = film + spot
    region = out[:, y0:y1, x0:x1]
    region[...] = region * (1.0 - cover) + film * cover


def _bubbles_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``bubbles`` of a batch (the torch kernel): the padded (B, N, 3) bubbles of every sample
    in its drawing order (largest first, stable), slot by slot: each slot is one bubble per
    sample as fields over the whole frame (its disk cover, refraction by a batched remap of the
    tissue behind, Fresnel film, dark line, specular spot) composited over the previous slots; a
    sample with fewer bubbles has an empty cover in the remaining slots. The loop runs over the
    slots (at most the severity table's count), never over the samples."""
    b, _c, h, w = x.shape
    scale = min(h, w)
    _field, tissue = _host.view_masks(x, scenes)
    lin = _math.srgb_to_linear(x)
    out = lin
    rows = p["bubbles"].reshape(b, -1, 3).to(torch.float64)
    order = torch.sort(-rows[:, :, 2], dim=1, stable=True).indices
    rows = rows.gather(1, order.unsqueeze(2).expand(-1, -1, 3))
    cx, cy, radius = rows[:, :, 0] * w, rows[:, :, 1] * h, rows[:, :, 2] * scale
    radius = torch.where(
        radius > 0, radius, 1.0
    )  # padding slots (drawn below is false): finite fields
    ix, iy = torch.trunc(cx).long(), torch.trunc(cy).long()
    on_image = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    flat = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).view(b, -1)
    on_tissue = tissue.view(b, h * w).gather(1, flat)
    drawn = (rows[:, :, 2] > 0) & on_image & on_tissue & (radius >= 1.5)
    # the mean in float64: its float32 value does not move with the batch's thread chunking
    env = (
        (lin.to(torch.float64).mean(dim=(1, 2, 3)) * 2.5 + 0.15).to(torch.float32).view(-1, 1, 1, 1)
    )
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, 1, w)
    for k in range(rows.shape[1]):
        bx, by = (
            cx[:, k].to(torch.float32).view(-1, 1, 1),
            cy[:, k].to(torch.float32).view(-1, 1, 1),
        )
        r = radius[:, k].to(torch.float32).view(-1, 1, 1)
        dx, dy = xs + 0.5 - bx, ys + 0.5 - by
        rho = torch.sqrt(dx * dx + dy * dy) / r
        cover = ((1.0 - rho) * r + 0.5).clamp(0.0, 1.0) * drawn[:, k].view(-1, 1, 1)
        cos_t = torch.sqrt(1.0 - rho.clamp(max=0.999) ** 2)
        pull = 1.0 - BUBBLE_REFRACTION * cos_t
        behind = _host.remap(
            lin, bx + dx * pull - 0.5, by + dy * pull - 0.5, "linear", "reflect101"
        )
        fresnel = (BUBBLE_F0 + (1.0 - BUBBLE_F0) * (1.0 - cos_t) ** 5).unsqueeze(1)
        film = behind * (1.0 - fresnel) * 1.04 + env * fresnel
        dark_line = 1.0 - 0.45 * torch.exp(-0.5 * ((rho - 0.9) / 0.03) ** 2)
        film = film * dark_line.unsqueeze(1) + (
            2.5 * torch.exp(-0.5 * (rho / 0.07) ** 2)
        ).unsqueeze(1)
        cover = cover.unsqueeze(1)
        out = out * (1.0 - cover) + film * cover
    res = _math.linear_to_srgb(out.clamp(0.0, 1.0))
    return torch.where(tissue, res, x).clamp(0.0, 1.0)


@_host.host_op(
    "bubbles", sampler=_bubble_sampler, dtypes=(np.uint8, np.float32), device=_bubbles_batch
)
def bubbles(img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View) -> np.ndarray:
    """Clusters of thin-film bubbles: refracted tissue, Fresnel rim, dark refraction line and a
    clipped specular spot (module docstring)."""
    _c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    lin = _host.to_linear(img)
    out = lin.copy()
    rows = np.asarray(p["bubbles"], dtype=np.float64).reshape(-1, 3)
    # larger bubbles first, smaller ones sit on top of them in the foam
    for bx, by, br in sorted(rows[rows[:, 2] > 0].tolist(), key=lambda b: -b[2]):
        px, py = bx * w, by * h
        inside = 0 <= int(py) < h and 0 <= int(px) < w and tissue[int(py), int(px)]
        if inside:
            render_bubble(lin, out, px, py, br * scale)
    res = _host.to_display(np.clip(out, 0.0, 1.0))
    res[:, ~tissue] = img[:, ~tissue]
    return res


# ---------------------------------------------------------------------------------------------
# Pooled fluid, stool or blood

# Absorption (per unit depth, linear RGB) and body colour of each fluid: bilious/clear fluid,
# stool suspension, blood. Blood absorbs green and blue strongly (haemoglobin's Soret and Q bands),
# bile absorbs blue (bilirubin), stool absorbs broadly with a brown body colour.
FLUIDS = {
    0: ((0.25, 0.45, 2.2), (0.55, 0.50, 0.12)),
    1: ((1.6, 2.2, 3.2), (0.32, 0.20, 0.07)),
    2: ((1.2, 6.0, 5.5), (0.35, 0.02, 0.02)),
}
MENISCUS_WIDTH = 0.003  # shorter side


def _fluid_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "coverage": draw(rng, level["coverage"]),
        "opacity": draw(rng, level["opacity"]),
        "fluid": float(rng.integers(0, len(FLUIDS))),
        "side": float(rng.uniform(0.0, 2.0 * math.pi)),
    }


def pool_mask(key: int, tissue: np.ndarray, coverage: float, side_angle: float) -> np.ndarray:
    """Bool (H, W): the pooled fluid, ``coverage`` of the tissue, reaching in from the keyed side
    with an irregular edge."""
    h, w = tissue.shape
    scale = min(h, w)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    cx, cy, radius = _host.field_geometry(tissue)
    ramp = ((xs - cx) * math.cos(side_angle) + (ys - cy) * math.sin(side_angle)) / np.float32(
        radius
    )
    level = ramp + 0.35 * _host.fractal_noise(key, "fluid-shape", h, w, 0.3 * scale, 2)
    values = level[tissue]
    if values.size == 0 or coverage <= 0:
        return np.zeros_like(tissue)
    threshold = float(np.quantile(values, 1.0 - coverage))
    pool = (level > threshold) & tissue
    # keep the largest connected pool (one puddle, not scattered islands)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(pool.astype(np.uint8), connectivity=8)
    if n > 2:
        pool = labels == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    # fill islands left inside the puddle (a liquid surface has no holes at this scale)
    holes = (~pool).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(holes, connectivity=4)
    small = np.flatnonzero(stats[:, cv2.CC_STAT_AREA] < 0.02 * tissue.sum())
    return (pool | np.isin(labels, small)) & tissue


def pool_mask_t(
    keys: Sequence[int], tissue: torch.Tensor, coverage: torch.Tensor, side_angle: torch.Tensor
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
    level = ramp + 0.35 * _host.fractal_noise_t(keys, "fluid-shape", h, w, 0.3 * scale, 2, tissue)
    inside = tissue[:, 0]
    threshold = _host.masked_quantile(level, inside, 0.0, 1.0 - coverage.to(torch.float64))
    threshold = threshold.to(torch.float32).view(-1, 1, 1)
    pool = (level > threshold) & inside
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


FLUID_TABLE = torch.tensor(
    [[*absorb, *body] for absorb, body in (FLUIDS[i] for i in range(len(FLUIDS)))]
)


def _fluid_occlusion_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``fluid_occlusion`` of a batch in one pass (the torch kernel)."""
    _b, c, h, w = x.shape
    scale = min(h, w)
    _field, tissue = _host.view_masks(x, scenes)
    pool = pool_mask_t(keys, tissue, p["coverage"], p["side"])
    dist = _host.chamfer_t(pool, _host.CHAMFER5, 0.04 * scale) / (0.04 * scale)
    opacity = p["opacity"].view(-1, 1, 1, 1)
    depth = _host.gauss_t(opacity * dist.clamp(0.0, 1.0) ** 0.7, 0.002 * scale)
    lin = _math.srgb_to_linear(x)
    lit = _host.gauss_t(_host.luma_t(lin), 0.03 * scale)
    top = _host.masked_quantile(lit, tissue[:, 0], 0.98)
    lit = (lit / (top + 1e-6).to(torch.float32).view(-1, 1, 1)).clamp(0.0, 1.0).unsqueeze(1)
    table = FLUID_TABLE.to(x.device)[torch.round(p["fluid"]).long()]
    mu, colour = table[:, :3], table[:, 3:]
    if c == 1:
        mu = mu.mean(dim=1, keepdim=True)
        colour = colour @ torch.from_numpy(_host.LUMA).to(x.device).view(3, 1)
    mu, colour = mu.view(-1, c, 1, 1), colour.view(-1, c, 1, 1)
    trans = torch.exp(-mu * depth)
    murk = 1.0 + 0.5 * _host.fractal_noise_t(
        keys, "fluid-murk", h, w, 0.08 * scale, 4, x
    ).unsqueeze(1)
    scatter = colour * (1.0 - torch.exp(-0.8 * depth * murk)) * (0.08 + 0.92 * lit) * murk
    out = lin * trans + scatter
    # meniscus: a thin bright curve along the pool's edge
    solid = pool.to(torch.float32)
    eroded = -torch.nn.functional.max_pool2d(
        -torch.nn.functional.pad(solid, (1, 1, 1, 1), value=1.0), 3, 1
    )
    line = _host.gauss_t(solid - eroded, MENISCUS_WIDTH * scale)
    line = line / (line.amax(dim=(1, 2, 3), keepdim=True) + 1e-6) * lit
    out = out + 0.9 * line * opacity.clamp(max=1.0)
    res = _math.linear_to_srgb(out.clamp(0.0, 1.0))
    res = torch.where(tissue, res, x)
    return torch.where(pool.flatten(1).any(dim=1).view(-1, 1, 1, 1), res, x).clamp(0.0, 1.0)


@_host.host_op(
    "fluid_occlusion",
    sampler=_fluid_sampler,
    dtypes=(np.uint8, np.float32),
    device=_fluid_occlusion_batch,
)
def fluid_occlusion(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Fluid, stool or blood pooled over ``coverage`` of the field: Beer-Lambert absorption,
    turbid in-scattering, bright meniscus (module docstring)."""
    c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    pool = pool_mask(key, tissue, float(p["coverage"]), float(p["side"]))
    if not pool.any():
        return img.copy()
    absorb, body = FLUIDS[round(float(p["fluid"]))]
    dist = cv2.distanceTransform(pool.astype(np.uint8), cv2.DIST_L2, 5) / np.float32(0.04 * scale)
    depth = np.float32(p["opacity"]) * np.clip(dist, 0.0, 1.0) ** 0.7
    depth = _host.gauss(depth.astype(np.float32), 0.002 * scale)
    lin = _host.to_linear(img)
    lit = _host.gauss(_host.luma(lin), 0.03 * scale)
    lit = np.clip(lit / (float(np.quantile(lit[tissue], 0.98)) + 1e-6), 0.0, 1.0)
    mu = np.asarray(absorb, dtype=np.float32)
    colour = np.asarray(body, dtype=np.float32)
    if c == 1:
        mu, colour = mu.mean(keepdims=True), (colour @ _host.LUMA)[None]
    trans = np.exp(-mu[:, None, None] * depth[None])
    # light scattered back by the turbid fluid, lit by the scope (as bright as the mucosa there)
    # suspended particles make the turbidity patchy
    murk = 1.0 + 0.5 * _host.fractal_noise(key, "fluid-murk", h, w, 0.08 * scale, 4)
    scatter = (
        colour[:, None, None]
        * (1.0 - np.exp(-0.8 * depth * murk))[None]
        * (0.08 + 0.92 * lit[None])
    )
    scatter = scatter * murk[None]
    out = lin * trans + scatter
    # meniscus: a thin bright curve along the pool's edge (the fluid surface bends towards the lens)
    edge = pool.astype(np.uint8) - cv2.erode(pool.astype(np.uint8), np.ones((3, 3), np.uint8))
    line = _host.gauss(edge.astype(np.float32), MENISCUS_WIDTH * scale)
    line = line / (float(line.max()) + 1e-6) * lit
    out = out + (0.9 * line * np.float32(min(1.0, float(p["opacity"]))))[None]
    res = _host.to_display(np.clip(out, 0.0, 1.0))
    res[:, ~tissue] = img[:, ~tissue]
    return res
