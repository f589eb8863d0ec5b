"""Physics of the endoscopy scene ops: specular glare (against the real highlights of the same
frames), smoke, bubbles, fluid, lens fog and drops, chromatic aberration, lens distortion (boxes
and masks follow), interlacing and H.264 macroblocking. Each op's kernel is checked against an
independent computation (OpenCV, SciPy) or the physical law it claims; frames are downscaled so
the file runs in seconds."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import scipy.fft
import scipy.ndimage
import torch

import perturb
from perturb import rng
from perturb.catalog.ops import get_op
from perturb.engine.annotations import transform_boxes
from perturb.ops import _host, glare
from perturb.ops.clinical import (
    BUBBLE_ENV,
    BUBBLE_FLOOR,
    BUBBLE_FLUID,
    BUBBLE_IRIDESCENCE,
    BUBBLE_PSF,
    BUBBLE_PSF_MIN,
    BUBBLE_REFRACTION,
    BUBBLE_ROW,
    BUBBLE_SHARE,
    FLUID_BREAK,
    FLUID_GLINT,
    FLUIDS,
    GLINT_AXIS,
    GLINT_CAP,
    _Ops,
    bubbles,
    fluid_colour,
    fluid_occlusion,
    fluid_relief,
    foam_folds,
    glint_lobe,
    glint_offset,
    pool_mask,
    recorded_rows,
    render_bubble,
    smoke_optical_depth,
    surgical_smoke,
)
from perturb.ops.glare import fringe_offsets, specular_glare, surface_normals
from perturb.ops.optics import (
    RADIANCE_REACH,
    channel_scale_maps,
    chromatic_aberration,
    distortion_forward,
    distortion_source,
    lens_distortion,
    lens_fog,
    render_drop,
    rim_px,
)
from perturb.ops.video import (
    dct4_matrix,
    interlacing,
    lost_macroblocks,
    qstep,
    quantise_plane,
    video_macroblocking,
)
from perturb.scene import Scene
from tests.helpers import ENDOSCOPY, require_samples, sample_tensor

_NP_OPS = _Ops(False)
HIGHLIGHT_LEVEL = 0.85  # a highlight pixel: every channel at least this bright


def _frame(i: int, scale: float) -> np.ndarray:
    """Real frame ``i`` as CHW float32, resized by ``scale`` (area averaging)."""
    require_samples()
    img = sample_tensor(ENDOSCOPY[i]).permute(1, 2, 0).numpy()
    img = cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(np.clip(img, 0, 1).transpose(2, 0, 1), dtype=np.float32)


def _flat(value: float, h: int = 120, w: int = 160) -> np.ndarray:
    return np.full((3, h, w), value, dtype=np.float32)


def _view(img: np.ndarray) -> _host.View:
    return _host.View(img)


def _lin(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def _diameters(mask: np.ndarray, side: int) -> np.ndarray:
    """Equivalent diameters (fraction of ``side``) of the 8-connected blobs of at least 2 px."""
    _, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    areas = stats[1:, cv2.CC_STAT_AREA]
    areas = areas[areas >= 2]
    return 2.0 * np.sqrt(areas / math.pi) / side


# ---------------------------------------------------------------------------------------------
# Specular glare


def test_glare_adds_light_on_tissue_only_with_clipped_cores() -> None:
    """The highlights only add light, clip to white at severity 5, and leave the frame and
    overlays as they are (tissue-layer op through the scene model)."""
    require_samples()
    for i in sorted({min(i, len(ENDOSCOPY) - 1) for i in (0, 3, 6, 10)}):
        x = torch.from_numpy(_frame(i, 0.35)).unsqueeze(0)
        out, _ = perturb.apply(x, "specular_glare", 5, [f"f{i}"])
        scene = perturb.scene(x[0])
        outside = torch.from_numpy(scene.tissue_of(x[0]) == 0)
        assert torch.equal(out[0][:, outside], x[0][:, outside]), "glare touched the frame or an overlay"
        assert float((out - x).min()) >= -1e-6, "specular reflection only adds light"
        assert int(((out >= 0.999).all(1) & ~(x >= 0.999).all(1)).sum()) > 0, "no clipped cores"


def _sphere_seen_from_the_camera(
    h: int, w: int, radius: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A sphere of ``radius`` centred 3 units in front of a pinhole camera (focal length half
    the shorter side): per pixel whether its ray hits the sphere, the distance to the hit (10
    where it misses) and the cosine between the surface normal and the ray back to the camera."""
    f = 0.5 * min(h, w)
    u = (np.arange(w) + 0.5 - w / 2) / f
    v = (np.arange(h) + 0.5 - h / 2) / f
    uu, vv = np.meshgrid(u, v)
    ray = np.stack([uu, vv, np.ones_like(uu)])
    ray /= np.linalg.norm(ray, axis=0)
    centre = np.array([0.0, 0.0, 3.0])
    b = ray[2] * centre[2]
    disc = b * b - (centre @ centre - radius**2)
    hit = disc > 0
    t = np.where(hit, b - np.sqrt(np.maximum(disc, 0.0)), 10.0)
    normal = (ray * t - centre[:, None, None]) / radius
    return hit, t, np.clip(-(normal * ray).sum(0), 0, 1)


def _dome(h: int = 161, w: int = 161) -> np.ndarray:
    """A reddish Lambertian dome under a light at the camera (I = rho cos(theta) / d^2), CHW
    float32 sRGB: its centre faces the camera, so the op puts a highlight there."""
    _hit, t, cos_true = _sphere_seen_from_the_camera(h, w, 2.5)
    shade = cos_true / (t / t.min()) ** 2
    albedo = np.array([0.55, 0.22, 0.16])[:, None, None]
    lin = albedo * shade
    srgb = np.where(lin <= 0.0031308, lin * 12.92, 1.055 * lin ** (1 / 2.4) - 0.055)
    return np.ascontiguousarray(srgb, dtype=np.float32)


def _f32(v: float) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


_DOME_P = {"wetness": _f32(0.05), "relief": _f32(0.0), "shininess": _f32(60.0),
           "illuminant": np.array([1.0, 1.0, 1.0], np.float32), "coverage": _f32(2.0),
           "fringe": _f32(2.5), "fringe_angle": _f32(0.6)}


def test_glare_fringe_offsets_the_red_and_blue_fields_along_the_scope_motion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Colour-sequential exposure: with the tissue halo off and no clipping, the red and blue
    light of a highlight are the green light moved by +/- the keyed offset (fringe px at 1080
    lines, scaled to the frame) along the keyed direction: centroids of the linear increments."""
    monkeypatch.setattr(glare, "HALO_GAIN", 0.0)
    img = _dome()
    out = specular_glare(img, _DOME_P, 3, _view(img))
    delta = _lin(out) - _lin(img)
    assert float(out.max()) < 0.99 and float(delta.max()) > 0.01, "want an unclipped highlight"
    yy, xx = np.mgrid[0 : img.shape[1], 0 : img.shape[2]]

    def centroid(plane: np.ndarray) -> np.ndarray:
        return np.array([(plane * xx).sum(), (plane * yy).sum()]) / plane.sum()

    offsets = fringe_offsets(_DOME_P, 161)
    assert math.hypot(*offsets[0]) == pytest.approx(2.5 * 161 / 1080)
    for ch in (0, 2):
        moved = centroid(delta[ch]) - centroid(delta[1])
        assert np.allclose(moved, offsets[ch], atol=0.02), (ch, moved, offsets[ch])


def test_glare_halo_takes_the_colour_of_the_tissue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Light scattered in the mucosa round a highlight comes back with the tissue's colour: the
    halo (the op with its halo less the op without it, linear, where nothing clips) has the
    tissue's linear R:G:B, while the highlight's own light is the illuminant's white."""
    img = _dome(481, 481)
    p = dict(_DOME_P, fringe=_f32(0.0), shininess=_f32(500.0), wetness=_f32(0.2))
    with_halo = _lin(specular_glare(img, p, 3, _view(img)))
    monkeypatch.setattr(glare, "HALO_GAIN", 0.0)
    without = _lin(specular_glare(img, p, 3, _view(img)))
    assert float(with_halo.max()) < 0.97, "want no clipping"
    halo = with_halo - without
    lin = _lin(img)
    seen = halo[1] > 1e-4
    assert int(seen.sum()) > 100
    got = halo[:, seen] / halo[:, seen].max(0, keepdims=True)
    want = lin[:, seen] / lin[:, seen].max(0, keepdims=True)
    assert np.allclose(np.median(got, axis=1), np.median(want, axis=1), atol=0.02)
    light = without - lin
    core = light[1] >= 0.5 * light[1].max()
    white = light[:, core] / light[:, core].max(0, keepdims=True)
    assert np.allclose(np.median(white, axis=1), 1.0, atol=0.02), "the highlight's light is white"


def _occupancy(mask: np.ndarray, tissue: np.ndarray, cell: int) -> float:
    """Share of the tissue's whole ``cell``-pixel squares that hold a pixel of ``mask``."""
    gh, gw = mask.shape[0] // cell, mask.shape[1] // cell
    held = mask[: gh * cell, : gw * cell].reshape(gh, cell, gw, cell).any(axis=(1, 3))
    whole = tissue[: gh * cell, : gw * cell].reshape(gh, cell, gw, cell).all(axis=(1, 3))
    return float((held & whole).sum()) / max(int(whole.sum()), 1)


def test_glare_highlights_gather_in_wet_patches_not_over_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real highlights come in a few clusters, not evenly over every surface facing the light:
    on the real frames (half size) at severity 4, the new highlights reach at most 0.6 of the
    squares (5 % of the shorter side) that they reach with an even film (``wet_patches`` all 1);
    measured 0.40 (0.25 at severity 3, 0.54 at severity 5)."""
    patchy, even = 0.0, 0.0
    for i in range(0, len(ENDOSCOPY), 2):
        img = _frame(i, 0.5)
        x = torch.from_numpy(img).unsqueeze(0)
        tissue = perturb.scene(x[0]).tissue > 0.5
        before = img.min(0) >= HIGHLIGHT_LEVEL
        cell = max(4, round(0.05 * min(img.shape[1:])))
        for film in ("patchy", "even"):
            with monkeypatch.context() as m:
                if film == "even":
                    m.setattr(glare, "wet_patches", lambda noise, coverage, top: np.ones_like(noise))
                out, _ = perturb.apply(x, "specular_glare", 4, [f"f{i}"])
            new = (out[0].numpy().min(0) >= HIGHLIGHT_LEVEL) & ~before & tissue
            if film == "patchy":
                patchy += _occupancy(new, tissue, cell)
            else:
                even += _occupancy(new, tissue, cell)
    assert even > 0 and patchy > 0
    assert patchy <= 0.6 * even, f"patchy film {patchy:.2f} vs even film {even:.2f}"


def test_shape_from_shading_finds_surfaces_facing_the_camera() -> None:
    """A Lambertian sphere lit by a point light at the camera (I = cos(theta) / d^2): the
    recovered N.V follows the true one (high at the centre facing the camera, low at the limb)."""
    h = w = 241
    hit, t, cos_true = _sphere_seen_from_the_camera(h, w, 1.2)
    lum = np.where(hit, cos_true / t**2, 0.0).astype(np.float32)
    n_dot_v, inv_d2 = surface_normals(lum / lum.max(), key=0, relief=0.0, scale=min(h, w))
    core = hit & (cos_true > 0.2)
    corr = np.corrcoef(n_dot_v[core], cos_true[core])[0, 1]
    assert corr > 0.8, corr
    assert n_dot_v[h // 2, w // 2] > 0.97
    assert inv_d2[h // 2, w // 2] > inv_d2[hit].mean(), "the 1/d^2 cue is largest where the surface is nearest"


def test_glare_highlights_are_sized_like_the_real_ones_and_avoid_the_dark_lumen() -> None:
    """On real frames (downscaled to half size): the new highlights' median and 90th-percentile
    equivalent diameters are within 2x of the real highlights on the same frames, and at most 5 %
    of the new highlight pixels lie in the darkest 15 % of the field (issue 15)."""
    real, made = [], []
    dark, total = 0, 0
    for i in range(0, len(ENDOSCOPY), 2):
        img = _frame(i, 0.5)
        x = torch.from_numpy(img).unsqueeze(0)
        tissue = perturb.scene(x[0]).tissue > 0.5
        side = min(img.shape[1:])
        before = (img.min(0) >= HIGHLIGHT_LEVEL) & tissue
        real.extend(_diameters(before, side))
        out, _ = perturb.apply(x.expand(2, -1, -1, -1).contiguous(), "specular_glare", [3, 5], [f"f{i}"] * 2)
        lum = _host.luma(img)
        dark_level = np.quantile(lum[tissue], 0.15)
        for o in out.numpy():
            new = (o.min(0) >= HIGHLIGHT_LEVEL) & ~before & tissue
            made.extend(_diameters(new, side))
            dark += int((new & (lum <= dark_level)).sum())
            total += int(new.sum())
    real_d, made_d = np.array(real), np.array(made)
    for q in (0.5, 0.9):
        ratio = np.quantile(made_d, q) / np.quantile(real_d, q)
        assert 0.5 <= ratio <= 2.0, f"quantile {q}: op {np.quantile(made_d, q):.4f} vs real {np.quantile(real_d, q):.4f}"
    assert total > 0 and dark / total <= 0.05, f"{dark / max(total, 1):.3f} of new highlight pixels in the dark lumen"


# ---------------------------------------------------------------------------------------------
# Smoke, bubbles, fluid


def test_smoke_follows_koschmieder_with_a_wispy_optical_depth() -> None:
    """On a flat frame (no blur, airlight lit uniformly): linear output = J t + A (1 - t) with
    t = exp(-tau) of the op's optical depth; tau is patchy (not a uniform haze)."""
    img = _flat(0.4)
    p = {"density": np.float32(1.2), "spread": np.float32(0.3), "source": np.array([0.5, 0.5], np.float32),
         "drift": np.float32(0.7), "airlight": np.float32(0.9), "tint": np.array([1.0, 0.98, 0.95], np.float32)}
    out = surgical_smoke(img, p, 11, _view(img))
    tau = smoke_optical_depth(11, 120, 160, p)
    t = np.exp(-tau.astype(np.float64))
    j = _lin(img[:, :1, :1])[:, 0, 0]
    a = 0.9 * np.array([1.0, 0.98, 0.95])
    expected = j[:, None, None] * t[None] + a[:, None, None] * (1 - t[None])
    assert np.abs(_lin(out) - expected).max() < 2e-3
    plume = tau > 0.1 * tau.max()
    assert tau[plume].std() / tau[plume].mean() > 0.3, "smoke should be wispy, not uniform"


def _one_bubble(lin: np.ndarray, row: list[float], light: float, glint: float) -> np.ndarray:
    out = lin.copy()
    render_bubble(lin, out, row, light, glint, [0.6, 0.6, 0.6])
    return out


def test_bubble_refracts_the_tissue_with_a_thin_film_rim_and_glints_off_centre() -> None:
    """One bubble (radius 42 px, the largest drawn) over a grey frame with a vertical edge: the dome magnifies (the
    edge is seen where the pull 1 - k cos(theta) maps back onto it) and has a dark refraction
    band inside its outline; its one glint lies where the dome's normal points back at the
    camera, off centre towards the light guide and, for an off-axis bubble, towards the optical
    axis (the same light for every bubble); a bubble may catch no glint; the rim's colour is
    two-beam thin-film interference ``1 - a lit cos(4 pi n d cos(theta_t) / lambda)`` per
    channel, so it is grey on the side away from the light; the lit inner wall mirrors the lamp
    as a bright crescent cap."""
    side, r, mid = 1400, 0.03 * 1400, 700  # the largest bubble drawn (BUBBLE_MAX)
    lin = np.full((3, side, side), 0.2, dtype=np.float32)
    lin[:, :, mid + 20 :] = 0.3  # an edge 20 px right of the centre (rho 0.48)
    light, glint, film, phase = 0.0, 0.3, 420.0, 1.0
    row = [0.0, 0.0, 0.03, film, phase, 1.0, 0.0, 2.0, 0.08, 0.5]  # the reference look
    out = _one_bubble(lin, row, light, glint)
    ys, xs = np.mgrid[0:side, 0:side] + 0.5
    dx, dy = xs - mid, ys - mid
    rho = np.hypot(dx, dy) / r
    lum = out.mean(0)
    left = dx < -5  # the uniform tissue half, away from the glint
    band = lum[left & (rho > 0.82) & (rho < 0.86)].mean()
    assert band < 0.8 * lum[left & (rho > 0.3) & (rho < 0.4)].mean(), "dark refraction band"
    # refraction: the output pixel at dx reads dx (1 - k cos theta); the edge (dx = 20) is seen
    # where that read position crosses 20, solved here on a fine grid
    fine = np.linspace(0.0, r, 40001)
    seen = fine[np.argmax(fine * (1.0 - BUBBLE_REFRACTION * np.sqrt(1.0 - (fine / r) ** 2)) >= 20.0)]
    # (against the same bubble over the uniform grey: only the refracted tissue differs)
    flat = _one_bubble(np.full_like(lin, 0.2), row, light, glint)
    line = (out - flat)[0, mid - 20]  # a row clear of the glint
    edge = int(np.argmax(line[mid : mid + 40] > 0.02)) + 0.5
    # (within 1.5 px: the edge's one-pixel ramp is itself magnified, by up to 1 / (1 - k))
    assert abs(edge - seen) <= 1.5, (edge, seen)
    # one clipped glint, glint * r from the centre towards the guide, none opposite
    peak = np.unravel_index(np.argmax(lum), lum.shape)
    assert math.hypot(peak[1] + 0.5 - mid - glint * r, peak[0] + 0.5 - mid) <= 1.0, peak
    assert lum[peak] > 1.0
    assert lum[mid, int(mid - glint * r)] < 0.4, "a second glint opposite (one light only)"
    dull = _one_bubble(lin, [*row[:7], 0.0, 0.08, 0.5], light, glint)
    assert dull.mean(0)[peak] < 0.25, "a bubble that catches no glint has no bright spot"
    # an off-axis bubble: its glint moves towards the optical axis by GLINT_AXIS radius per
    # shorter side off axis (on a black frame only the film and the glint show)
    black = np.zeros_like(lin)
    bx, by, light2 = 0.2, -0.15, 2.0
    off = _one_bubble(black, [bx, by, 0.02, film, phase, 1.0, 0.0, 3.0, 0.06, 0.5], light2, glint).mean(0)
    rb = 0.02 * side
    gx, gy = glint_offset(bx, by, rb, light2, glint, _NP_OPS)
    expect = (mid + bx * side + gx, mid + by * side + gy)
    peak = np.unravel_index(np.argmax(off), off.shape)
    assert math.hypot(peak[1] + 0.5 - expect[0], peak[0] + 0.5 - expect[1]) <= 1.0, (peak, expect)
    inward = -(gx * bx + gy * by) / math.hypot(bx, by)
    assert inward > 0.8 * GLINT_AXIS * math.hypot(bx, by) * rb, "the glint leans towards the axis"
    # thin-film colour on a black frame (no glint): channel ratios follow the interference formula
    rim = _one_bubble(black, [*row[:7], 0.0, 0.08, 0.5], light, glint)
    sel = (rho > 0.9) & (rho < 0.985)
    phi = np.arctan2(dy, dx)[sel]
    cos_t = np.sqrt(1.0 - np.minimum(rho[sel], 1.0) ** 2 / 1.33**2)
    d = film * (1.0 + 0.35 * np.cos(phi + phase))
    gphi = math.atan2(glint * r * math.sin(light), glint * r * math.cos(light))
    lit = 0.5 + 0.5 * np.cos(phi - gphi)
    tint = [1.0 - BUBBLE_IRIDESCENCE * lit * np.cos(4 * np.pi * 1.33 * d * cos_t / lam) for lam in (610.0, 550.0, 465.0)]
    for ch in (0, 2):
        assert np.allclose(rim[ch][sel] / rim[1][sel], tint[ch] / tint[1], rtol=1e-3), ch
    # the lamp mirrored by the lit inner wall: a bright crescent cap (a lit dome, not an outline)
    cap_zone = (rho > 0.65) & (rho < 0.75)
    facing = np.cos(np.arctan2(dy, dx) - gphi)
    # (over uniform tissue: the wall mirrors the lit tissue around it, so the cap is the scene's
    # colour brightened, not a grey film; no glint)
    grey = _one_bubble(np.full_like(lin, 0.2), [*row[:7], 0.0, 0.08, 0.5], light, glint).mean(0)
    lit_cap, dark_cap = grey[cap_zone & (facing > 0.95)].mean(), grey[cap_zone & (facing < -0.95)].mean()
    assert lit_cap > 0.22 and lit_cap > 1.2 * dark_cap, (lit_cap, dark_cap)
    spread = rim[0][sel] / rim[2][sel]
    assert spread[lit > 0.8].std() > 0.1, "the film's colour changes around the lit rim"
    assert spread[lit < 0.05].std() < 0.03, "no rainbow on the side away from the light"
    assert np.array_equal(out[:, : mid - 50, :], lin[:, : mid - 50, :]), "outside the bubble nothing changes"


def test_a_foam_cell_is_a_transparent_film_whose_wall_is_bright_facing_the_light_and_dark_elsewhere() -> None:
    """A small cell (radius 12 px, no glint) over textured tissue, for three of its own looks:
    the film is mostly transparent, so the tissue seen through the cell's middle keeps its
    texture and barely changes brightness; the wall seen edge-on is a thin ring (radius
    fraction 0.8-1): an arc on the side facing the light (bright on some cells, dim on others)
    and, on the far side, a darker thin edge (the light refracted out of the camera's view) of
    the cell's own depth (version 8: it may take up to about three quarters of the tissue's
    light, never all of it: not a drawn black line) and only on the ring (version 5's drawn dark rims were wide bands)."""
    side, mid = 400, 200
    r = 0.03 * side  # the cell's radius in pixels (0.03 of the shorter side below)
    yy, xx = np.mgrid[0:side, 0:side]
    tex = 0.2 + 0.05 * np.sin(xx / 3.0) * np.cos(yy / 4.0)
    lin = np.stack([tex, tex * 0.8, tex * 0.7]).astype(np.float32)
    dist = np.hypot(xx + 0.5 - mid, yy + 0.5 - mid) / r
    core, cell = dist < 0.5, dist < 1.0
    ring = (dist > 0.8) & (dist < 1.0)
    lit_side, far_side = ring & (xx > mid + 0.6 * r), ring & (xx < mid - 0.6 * r)
    lit_gains: list[float] = []
    for look in (0.1, 0.5, 0.9):
        # the light (and the glint, here none) along +x
        out = _one_bubble(lin, [0.0, 0.0, 0.03, 400.0, 0.0, 1.0, 0.0, 0.0, 0.08, look], 0.0, 0.1)
        ratio = out[1][core].mean() / lin[1][core].mean()
        assert 0.9 < ratio < 1.15, (look, ratio)
        corr = np.corrcoef(out[1][core], lin[1][core])[0, 1]
        assert corr > 0.5, f"the tissue's texture is lost under the film ({corr:.2f})"
        darkest = np.quantile(out[1][cell] / lin[1][cell], 0.02)
        assert darkest > 0.2, f"a black rim ({look}: {darkest:.2f} of the tissue)"
        thin = (out[1] / lin[1] < 0.8) & cell
        assert (thin & (dist < 0.6)).sum() == 0, "the darkening is confined to the wall"
        lit_gain = np.quantile(out[1][lit_side] / lin[1][lit_side], 0.9)
        far_gain = np.quantile(out[1][far_side] / lin[1][far_side], 0.1)
        assert lit_gain > far_gain + 0.1 and far_gain < 0.85, (look, lit_gain, far_gain)
        lit_gains.append(lit_gain)
    # the lit arc's strength is each cell's own (version 8: fainter than v7's), brighter on some
    assert max(lit_gains) > 1.05 and min(lit_gains) < max(lit_gains) - 0.05, lit_gains


def test_bubbles_are_blurred_by_the_camera_like_the_frame() -> None:
    """The op's bubble layer (each bubble's cover * (film - tissue), weighted by the valley map
    at its centre) reaches the output through the camera's gaussian blur alone (SciPy's filter
    as the reference; no wider blurred copies), so a glint or rim is no sharper than the
    tissue; where the cells crowd (their cover blurred over ``BUBBLE_FLUID["blur"]``) it is
    mixed towards the interstitial fluid's colour by the level's ``fluid`` share in the gaps
    between the cells (a cell's own film stays clear)."""
    img = _frame(2, 0.5)
    spec = get_op("bubbles")
    p = spec.entry.sampler(rng.scalar_rng(7), spec.spec.level(3))
    params = {k: np.asarray(v, np.float32) for k, v in p.items()}
    view = _view(img)
    out = _lin(bubbles(img, params, 7, view))
    lin = _host.to_linear(img)
    layer = np.zeros_like(lin)
    rows = recorded_rows(params)
    env = lin.astype(np.float64).mean(axis=(1, 2)) * BUBBLE_ENV[0] + BUBBLE_ENV[1]
    assert 0.05 < (foam_folds(img, view.tissue) > 0.5).mean() < 0.8, "foam only along the folds"
    narrow, wide = foam_folds(img, view.tissue), foam_folds(img, view.tissue, 0.6)
    assert (wide >= narrow).all() and (wide > 0.5).mean() > (narrow > 0.5).mean() + 0.05, "spread"
    folds = foam_folds(img, view.tissue, float(params["spread"]))
    density = np.zeros(img.shape[1:], np.float32)
    for row in rows.tolist():
        iy, ix = int(img.shape[1] / 2 + row[1] * min(img.shape[1:])), int(img.shape[2] / 2 + row[0] * min(img.shape[1:]))
        if view.tissue[iy, ix]:
            render_bubble(lin, layer, row, float(params["light"]), float(params["glint"]), env.tolist(), float(folds[iy, ix]), density)
    assert np.abs(layer).max() > 0.1
    sigma = max(BUBBLE_PSF * min(img.shape[1:]), BUBBLE_PSF_MIN)
    blurred = np.stack(
        [scipy.ndimage.gaussian_filter(c.astype(np.float64), sigma, mode="mirror", truncate=4.0) for c in layer]
    )
    # heavy foam floats in interstitial fluid where its cells crowd (severity 3: a little)
    assert float(params["fluid"]) > 0.0
    crowd = scipy.ndimage.gaussian_filter(density.astype(np.float64), BUBBLE_FLUID["blur"] * min(img.shape[1:]), mode="mirror", truncate=4.0)
    wet = np.clip(crowd * BUBBLE_FLUID["gain"], 0.0, 1.0) * (1 - np.clip(density, 0, 1)) * float(params["fluid"])
    # (the fluid lit like the tissue under it: per pixel)
    base = np.maximum(lin + blurred, BUBBLE_FLOOR * lin)  # (stacked walls never cut to black)
    colour = np.asarray(fluid_colour(list(base), float(params["fluid_tint"])))
    expect = np.clip(base + wet * (colour - base), 0.0, 1.0)
    sel = view.tissue & (expect.max(0) < 0.98)
    assert np.abs(out[:, sel] - expect[:, sel]).max() < 2e-3
    sharp = np.abs(np.diff(np.clip(lin + layer, 0, 1), axis=2)).max()
    # the frame's own sharpest edge may bound both (float32 output against the float64 sum:
    # equal up to rounding on an AVX2 CPU), never the bubbles' unblurred rims
    assert np.abs(np.diff(out, axis=2))[:, view.tissue[:, 1:]].max() < sharp + 1e-6, "as sharp as unblurred"


def _pool_rows(p: dict[str, np.ndarray]) -> np.ndarray:
    """A bubbles draw's rows in pool order (the pool's even rows are ``bubbles``, odd ``foam``)."""
    even, odd = np.asarray(p["bubbles"]).reshape(-1, BUBBLE_ROW), np.asarray(p["foam"]).reshape(-1, BUBBLE_ROW)
    rows = np.empty((len(even) + len(odd), BUBBLE_ROW))
    rows[0::2], rows[1::2] = even, odd
    return rows


def test_bubbles_cluster_as_foam_of_log_normal_sizes_and_nest_across_severities() -> None:
    """Cells gather in foam: most touch or share a wall with a neighbour (a neighbour within a
    fifth of their radii's sum beyond touching) but none sits on another (overlap
    at most ``BUBBLE_SHARE`` of the smaller radius); radii are log-normal around the level's
    median (0.5 % of the shorter side: many small, a few large, skewed), the cells only heavy
    foam adds are larger, outlines are squashed towards the optical axis, glints vary (about
    half the cells none, no peak above ``GLINT_CAP``), every cell has its own look, and a
    severity's bubbles are the first ones of the next severity's (one perturbation at five
    strengths)."""
    spec = get_op("bubbles")
    sampler = spec.entry.sampler
    radii, aspects, dists, peaks, looks = [], [], [], [], []
    near_share, growth = [], []
    for key in range(8):
        draws = [sampler(rng.scalar_rng(key), spec.spec.level(sev)) for sev in (1, 3, 5)]
        rows = [_pool_rows(d) for d in draws]
        assert rows[0].shape[0] >= 40, "a small but visible cluster at severity 1"
        assert rows[0].shape[1] == BUBBLE_ROW
        assert np.array_equal(rows[0], rows[1][: len(rows[0])])
        assert np.array_equal(rows[1], rows[2][: len(rows[1])])
        b = rows[2]
        assert len(b) >= 300, len(b)
        x, y, r, asp = (b[:, i] for i in (0, 1, 2, 5))
        apart = np.hypot(x[:, None] - x[None, :], y[:, None] - y[None, :]) + np.eye(len(b)) * 10
        least = np.minimum(r[:, None], r[None, :])
        assert (apart - r[:, None] - r[None, :] + BUBBLE_SHARE * least).min() >= -1e-12, "stacked"
        nearest = np.argmin(apart, axis=1)
        # a neighbour within a fifth of their radii's sum beyond touching: foam, not a scatter
        near_share.append(
            float(np.mean(apart[np.arange(len(b)), nearest] < 1.2 * (r + r[nearest])))
        )
        radii += rows[0][:, 2].tolist()  # severity 1: cells before heavy foam's growth
        growth.append(float(np.median(r[len(rows[1]) :]) / np.median(rows[0][:, 2])))
        aspects += asp.tolist()
        dists += np.hypot(x, y).tolist()
        peaks += b[:, 7].tolist()
        looks += b[:, 9].tolist()
    assert np.median(near_share) > 0.7, near_share
    rad = np.asarray(radii)
    # (real cells on the reference frames: diameters of 0.4-2 % of the shorter side, most under 1 %)
    assert 0.0032 <= float(np.median(rad)) <= 0.0042, np.median(rad)
    logs = np.log(rad)
    assert 0.35 < logs.std() < 0.6, logs.std()  # log-normal spread (clipped below)
    assert np.quantile(rad, 0.95) > 2.0 * np.median(rad), "a few large among many small"
    assert rad.mean() > np.median(rad), "sizes skewed towards a few large ones"
    assert np.median(growth) > 1.2, growth  # heavy foam carries larger cells
    assert min(aspects) >= 0.7 and np.corrcoef(dists, aspects)[0, 1] < -0.5, "no perspective"
    none = float(np.mean(np.asarray(peaks) == 0.0))
    assert 0.4 < none < 0.6, none  # glints are not in every cell
    lit = np.asarray(peaks)[np.asarray(peaks) > 0]
    assert lit.std() / lit.mean() > 0.3 and lit.max() <= GLINT_CAP, "glint peaks do not vary"
    look = np.asarray(looks)
    assert look.min() >= 0.0 and look.max() < 1.0 and 0.25 < look.std() < 0.32, "one look"


def _fluid_params(kind: int, tilt: tuple[float, float] = (0.05, 0.0)) -> dict[str, np.ndarray]:
    return {
        "coverage": np.float32(0.35),
        "opacity": np.float32(1.5),
        "fluid": np.float32(kind),
        "side": np.float32(1.0),
        "tilt": np.array(tilt, np.float32),
    }


def _pool(img: np.ndarray, side: float = 1.0) -> np.ndarray:
    tissue = np.ones(img.shape[1:], bool)
    return pool_mask(5, tissue, 0.35, side, fluid_relief(img, tissue))


def test_fluid_absorbs_by_beer_lambert_per_channel() -> None:
    """Two flat frames under the same pool: the linear difference is the transmitted part,
    (J1 - J2) exp(-mu_c d) (1 - particles); in the logs the particles and the depth's patchiness
    cancel between channels, so (log T_b - log T_g) / (log T_r - log T_g) equals
    (mu_b - mu_g) / (mu_r - mu_g) at every pixel of the pool (blood absorbs green and blue
    far more than red)."""
    p = _fluid_params(2)
    a, b = _flat(0.3, 200, 240), _flat(0.5, 200, 240)
    out_a = fluid_occlusion(a, p, 5, _view(a))
    out_b = fluid_occlusion(b, p, 5, _view(b))
    pool = _pool(a)
    assert abs(pool.mean() - 0.35) < 0.04, pool.mean()
    trans = (_lin(out_b) - _lin(out_a)) / (_lin(b) - _lin(a))
    inner = cv2.distanceTransform(pool.astype(np.uint8), cv2.DIST_L2, 5) > 0.04 * 200
    # where the fluid absorbs measurably (its depth thins to nothing at the shore)
    sel = inner & (out_b.max(0) < 0.99) & (trans.min(0) > 1e-3) & (trans[1] < 0.9 * trans[0])
    assert sel.sum() > 1000
    logs = np.log(trans[:, sel])
    mu = np.asarray(FLUIDS[2][0])
    got = (logs[2] - logs[1]) / (logs[0] - logs[1])
    assert np.allclose(got, (mu[2] - mu[1]) / (mu[0] - mu[1]), atol=0.02), np.quantile(got, [0.01, 0.99])
    far = cv2.dilate(pool.astype(np.uint8), np.ones((9, 9), np.uint8)) == 0
    assert np.abs(out_a[:, far] - a[:, far]).max() < 1e-5, "outside the pool nothing changes"


def test_fluid_turbidity_grows_from_the_edge_and_the_meniscus_mirrors_the_light() -> None:
    """On a black frame only the fluid's own scattering shows: a stool suspension is brighter
    deep in the pool than at its edge (the depth grows from the edge). On a flat lit frame the
    surface adds light along the meniscus on the side whose outward normal faces the keyed tilt,
    not on the opposite side."""
    black = np.zeros((3, 200, 240), np.float32)
    out = _lin(fluid_occlusion(black, _fluid_params(1), 5, _view(black)))
    pool = _pool(black)
    dist = cv2.distanceTransform(pool.astype(np.uint8), cv2.DIST_L2, 5)
    edge, deep = pool & (dist < 0.02 * 200), dist > 0.12 * 200
    assert out[0][deep].mean() > 2.0 * out[0][edge].mean(), "turbidity should grow with depth"
    flat = _flat(0.4, 200, 240)
    soft = cv2.GaussianBlur(pool.astype(np.float32), (0, 0), 3.0)
    outward = -np.stack([cv2.Sobel(soft, cv2.CV_32F, 1, 0), cv2.Sobel(soft, cv2.CV_32F, 0, 1)])
    outward /= np.linalg.norm(outward, axis=0) + 1e-6
    band = pool & (dist < 0.015 * 200)
    axis = np.array([math.cos(1.0), math.sin(1.0)])  # the pool reaches in from this side
    cosine = outward[0] * axis[0] + outward[1] * axis[1]
    edge_px = band & (np.abs(cosine) > 0.5)
    assert edge_px.sum() > 100
    added = {}
    for sign in (1.0, -1.0):
        tilt = (sign * 0.05 * axis[0], sign * 0.05 * axis[1])
        lit = _lin(fluid_occlusion(flat, _fluid_params(3, tilt), 5, _view(flat)))
        added[sign] = lit.mean(0) - float(_lin(flat).mean())
    # the tilt along each edge pixel's outward normal lights it, the opposite tilt does not
    # the rim is broken into pieces: judge it where it is whole
    h, w = pool.shape
    rim = 2.0 * _host.value_noise(5, "fluid-rim-break", h, w, 1.5 * FLUID_BREAK[0] * min(h, w))
    edge_px &= rim > 1.0
    assert edge_px.sum() > 30
    toward = np.where(cosine > 0, added[1.0], added[-1.0])[edge_px]
    opposite = np.where(cosine > 0, added[-1.0], added[1.0])[edge_px]
    assert (toward - opposite).mean() > 0.05, (toward.mean(), opposite.mean())


def test_fluid_shore_follows_the_relief_and_has_no_bright_outline() -> None:
    """The pool is a level set of the dependent side's ramp plus the mucosa's relief: on a frame
    whose left half is darker (a fold's shadowed valley) the fluid, pooling from below, climbs
    higher on the dark half than on the lit one. Its shore has no one-pixel bright line: the
    meniscus is continued past the shore, so the shore's pixels step no more than a soft band."""
    img = _flat(0.55, 200, 240)
    img[:, :, :120] = 0.25
    pool = _pool(img, math.pi / 2)  # the ramp grows downwards: the pool lies at the bottom
    dark, lit = pool[:, 20:100].mean(), pool[:, 140:220].mean()
    assert dark > lit + 0.1, (dark, lit)
    flat = _flat(0.5, 200, 240)
    for kind in range(len(FLUIDS)):
        for tilt in ((0.05, 0.0), (0.0, -0.05), (-0.035, 0.035)):
            out = fluid_occlusion(flat, _fluid_params(kind, tilt), 5, _view(flat))
            pool = _pool(flat)
            shore = pool & (cv2.distanceTransform(pool.astype(np.uint8), cv2.DIST_L2, 5) < 2)
            step = np.maximum(
                np.abs(np.diff(out, axis=1, append=out[:, -1:])).max(0),
                np.abs(np.diff(out, axis=2, append=out[:, :, -1:])).max(0),
            )
            # (fine bubbles gather on the shore and their rings and glints step; a line would
            # step all along it: version 2's meniscus line stepped 0.10-0.16 at the median)
            assert np.median(step[shore]) < 0.05, (kind, tilt, np.median(step[shore]))


def test_foam_gathers_along_the_folds_not_on_flat_mucosa() -> None:
    """Foam is carried by the liquid film along the folds: on a flat frame crossed by one fold
    (a dark band) the fold map is high along the band and zero on the flat mucosa, and the op
    draws bubbles only near the fold."""
    img = _flat(0.5, 240, 320)
    img[:, 110:130, :] = 0.3  # a fold's shadowed valley across the frame
    view = _view(img)
    folds = foam_folds(img, view.tissue)
    assert folds[115:125].mean() > 0.9, folds[115:125].mean()
    assert folds[:60].max() == 0.0 and folds[-60:].max() == 0.0, "no foam on the flat mucosa"
    spec = get_op("bubbles")
    p = spec.entry.sampler(rng.scalar_rng(4), spec.spec.level(5))
    params = {k: np.asarray(v, np.float32) for k, v in p.items()}
    changed = np.abs(bubbles(img, params, 4, view) - img).max(0) > 1e-3
    rows = np.flatnonzero(changed.any(axis=1))
    assert rows.size > 0, "no bubble drawn on the fold"
    assert rows.min() > 60 and rows.max() < 180, (rows.min(), rows.max())
    flat = _flat(0.5, 240, 320)
    # nothing drawn: only the round trip through linear light, an ulp on some CPUs (AVX2)
    assert np.abs(bubbles(flat, params, 4, _view(flat)) - flat).max() < 1e-6, "foam on a featureless frame"


DEEP_OPACITY = 2.5  # a severity 5 pool (its table: 2.3-2.8)


def test_deep_turbid_fluid_hides_the_folds_under_it() -> None:
    """Extinction is absorption plus scattering, ``exp(-(mu_c + s) d)``: two striped frames (a
    fold pattern) a constant apart get the same pool, and the linear difference of their outputs
    over theirs is what the fluid transmits of the tissue: under the deep part of a severe bile,
    stool or blood pool less than 15 % (the folds are hidden), under clear rinse water (little
    absorption, little scattering) most of it."""
    a = _flat(0.3, 200, 240)
    for k in range(3):
        a[:, :, k::16] = 0.15
    b = a + np.float32(0.2)
    pool = _pool(a)
    # the deepest part of the pool (its depth grows from the shore to there)
    dist = cv2.distanceTransform(pool.astype(np.uint8), cv2.DIST_L2, 5)
    deep = dist > 0.75 * dist.max()
    assert deep.sum() > 500
    for kind in range(len(FLUIDS)):
        p = {**_fluid_params(kind), "opacity": np.float32(DEEP_OPACITY)}
        out_a, out_b = (_lin(fluid_occlusion(f, p, 5, _view(f))) for f in (a, b))
        trans = ((out_b - out_a) / (_lin(b) - _lin(a)))[0][deep].mean()
        mu_r, turbid = FLUIDS[kind][0][0], FLUIDS[kind][2]
        if kind == 3:
            assert trans > 0.4, ("clear water hides the folds", trans)
        else:
            assert trans < 0.15, (kind, trans)
        # no deeper than the full optical depth (patchiness aside), no shallower than the pool
        assert trans > 0.2 * math.exp(-(mu_r + turbid) * DEEP_OPACITY * 2.0), (kind, trans)


def test_fluid_glints_are_streaks_along_the_ripples() -> None:
    """The surface mirrors the lamp where its slope is near the tilt: the lobe falls by
    exp(-1/2) one slope width along the tilt and only ``FLUID_GLINT[2]`` widths across it (a
    glint runs along a ripple's crest instead of a round spot)."""
    tx, ty = 0.03, 0.04
    norm = math.hypot(tx, ty)
    width = FLUID_GLINT[1]
    along = glint_lobe(np.float64(tx + width * tx / norm), np.float64(ty + width * ty / norm), tx, ty, _NP_OPS)
    across = glint_lobe(np.float64(tx - FLUID_GLINT[2] * width * ty / norm), np.float64(ty + FLUID_GLINT[2] * width * tx / norm), tx, ty, _NP_OPS)
    assert abs(float(along) - math.exp(-0.5)) < 1e-4 and abs(float(across) - math.exp(-0.5)) < 1e-4
    assert float(glint_lobe(np.float64(tx), np.float64(ty), tx, ty, _NP_OPS)) > 1.0 - 1e-9


def test_fluid_kind_is_keyed_and_recorded() -> None:
    spec = get_op("fluid_occlusion")
    kinds = {
        spec.entry.sampler(rng.scalar_rng(k), spec.spec.level(3))["fluid"] for k in range(40)
    }
    assert kinds == {0.0, 1.0, 2.0, 3.0}, kinds


# ---------------------------------------------------------------------------------------------
# Lens: fog, drops, lateral colour, distortion


def test_lens_fog_lowers_contrast_most_at_the_rim() -> None:
    img = np.zeros((3, 240, 240), np.float32)
    checks = ((np.indices((240, 240)) // 6).sum(0) % 2).astype(np.float32)
    img[:] = 0.25 + 0.5 * checks
    out = lens_fog(img, {"fog": np.float32(0.6), "veil": np.float32(0.6), "reach": np.float32(0.5)}, 3, _view(img))

    def contrast(z: np.ndarray, sel: np.ndarray) -> float:
        vals = z[1][sel]
        return float(vals.std() / vals.mean())

    rr = np.hypot(*(np.indices((240, 240)) + 0.5 - 120))
    centre, rim = rr < 25, (rr > 100) & (rr < 115)
    assert contrast(out, centre) < contrast(img, centre)
    assert contrast(out, rim) < contrast(out, centre), "the film forms first at the cold rim"


def test_lens_fog_is_patchy_and_beaded_not_a_uniform_veil() -> None:
    """On a flat frame a uniform veil would leave a smooth ramp; the film has clear gaps and
    dense patches (coarse spread) and a fine mottle of droplets a few pixels across."""
    img = _flat(0.35, 300, 300)
    params = {"fog": np.float32(1.4), "veil": np.float32(0.6), "reach": np.float32(0.5)}
    out = _lin(lens_fog(img, params, 3, _view(img))).mean(0)
    rr = np.hypot(*(np.indices((300, 300)) + 0.5 - 150))
    inner = rr < 110
    fine = out - cv2.GaussianBlur(out.astype(np.float32), (0, 0), 3.0)
    coarse = cv2.GaussianBlur(out.astype(np.float32), (0, 0), 6.0)
    # (the veil of the previous model: 3e-5 fine, 0.0013 coarse)
    assert fine[inner].std() > 0.002, f"no droplet mottle: {fine[inner].std():.4f}"
    assert coarse[inner].std() > 0.0025, f"no patches: {coarse[inner].std():.4f}"


def test_drop_is_a_minifying_lens_with_a_dark_rim() -> None:
    src = np.tile(np.linspace(0.1, 0.9, 200, dtype=np.float32), (3, 200, 1))
    out = src.copy()
    render_drop(src, out, 100.0, 100.0, 30.0, 1.0)
    row = out[0, 100]
    inside = slice(80, 121)
    # the view through the drop is squeezed towards the centre: a flatter ramp inside
    slope_in = np.polyfit(np.arange(80, 121), row[inside], 1)[0]
    slope_out = np.polyfit(np.arange(0, 60), row[:60], 1)[0]
    assert slope_in < 0.8 * slope_out
    assert np.array_equal(out[:, :, :60], src[:, :, :60]), "outside the drop nothing changes"
    assert out[0, 100, 128] < src[0, 100, 128], "dark rim"


def test_chromatic_aberration_scales_red_and_blue_about_the_field_centre() -> None:
    """Red equals an OpenCV affine scaling by 1 + k of the red plane about the field centre (an
    independent warp), blue by 1 - k, green untouched, wherever the aperture is clear and the
    source lies in the clear part; fringes grow linearly with radius."""
    img = _frame(2, 0.3)
    view = _view(img)
    k = 0.01
    out = chromatic_aberration(img, {"shift": np.float32(k)}, 0, view)
    cx, cy, radius = _host.field_geometry(view.field)
    # distance to the field's edge and to the image's border (the frame is read as it is
    # beyond RADIANCE_REACH rims of both, fully beyond twice that; the aperture is clear beyond
    # two rims; the source lies at most k R further in or out)
    dist = cv2.distanceTransform(np.pad(view.tissue, 1).astype(np.uint8), cv2.DIST_L2, 3)[1:-1, 1:-1]
    rim = rim_px(*img.shape[1:])
    inner = view.tissue & (dist > 2 * RADIANCE_REACH * rim + k * radius * 1.5 + 2)
    assert inner.mean() > 0.5 * view.field.mean()
    for channel, m in ((0, 1 + k), (2, 1 - k)):
        matrix = np.array([[m, 0, cx * (1 - m)], [0, m, cy * (1 - m)]])
        matrix[:, 2] += 0.5 * (m - 1)  # pixel centres: x_out + 0.5 = m (x_in + 0.5 - cx) + cx
        ref = cv2.warpAffine(img[channel], matrix, img.shape[:0:-1], flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT_101)
        assert np.abs(out[channel][inner] - ref[inner]).max() < 0.02
    assert np.array_equal(out[1], img[1])
    # a dot at radius r appears k r further out in red
    dot = np.zeros((3, 201, 201), np.float32)
    dot[:, 100, 180] = 1.0
    shifted = chromatic_aberration(dot, {"shift": np.float32(0.05)}, 0, _host.View(dot))
    red_x = (shifted[0, 100] * np.arange(201)).sum() / shifted[0, 100].sum()
    assert red_x + 0.5 - 100.5 == pytest.approx((180.5 - 100.5) * 1.05, abs=0.3)


def _rimmed_disk(size: int = 240) -> tuple[np.ndarray, np.ndarray]:
    """A grey textured disk field whose aperture darkens a rim a few pixels wide (as a real
    frame's anti-aliased edge), in a black surround: (CHW float32 image, bool field)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    r = np.hypot(xx + 0.5 - size / 2, yy + 0.5 - size / 2)
    edge = 0.45 * size
    field = r < edge
    tissue = 0.45 + 0.1 * np.sin(xx / 5.0) * np.cos(yy / 7.0)
    shade = np.clip((edge - r) / 5.0, 0.0, 1.0)  # the rim: dark over its last 5 px
    img = np.stack([tissue * shade] * 3).astype(np.float32)
    return img, field


@pytest.mark.parametrize("op", ["chromatic_aberration", "lens_distortion"])
def test_optics_act_on_the_tissue_behind_a_fixed_aperture(op: str) -> None:
    """The aperture and the surround are on the sensor side of the lens: its dark rim stays
    where it is (no coloured line along the field's edge, no black sliver moved into the
    tissue) and nothing reaches the surround."""
    img, field = _rimmed_disk()
    x = torch.from_numpy(img)[None]
    out, (rec,) = perturb.apply(x, op, 5, ["rim"])
    assert rec.protect_border
    res = out[0].numpy()
    seen = np.asarray(Scene.from_descriptor(rec.extra["scene"]).field) > 0.5  # the op's field
    assert (seen != field).mean() < 0.03  # the analysis puts the edge within the dark rim
    dist = cv2.distanceTransform(seen.astype(np.uint8), cv2.DIST_L2, 3)
    outside = cv2.distanceTransform((~field).astype(np.uint8), cv2.DIST_L2, 3) > 2
    assert np.abs(res[:, outside] - img[:, outside]).max() < 1.0 / 255, "the surround is untouched"
    rim = (dist > 0) & (dist <= rim_px(*img.shape[1:]))
    assert np.abs(res[:, rim] - img[:, rim]).max() < 2.0 / 255, "the aperture's rim stays"
    near = field & (dist < 30)
    chroma = np.abs(res[0] - res[1]) + np.abs(res[2] - res[1])
    assert chroma[near].max() < 0.06, "no coloured line along the field's edge"
    # no dark sliver: just inside the rim the frame stays as bright as the tissue there
    band = field & (dist > 12) & (dist < 30)
    assert res[1][band].min() > 0.3
    # the legacy model, a warp of the frame with its rim: the line it drew
    if op == "chromatic_aberration":
        k = float(rec.params["shift"])
        cx = cy = img.shape[1] / 2
        red = cv2.remap(img[0], *channel_scale_maps(*img.shape[1:], cx, cy, 1 + abs(k)),
                        cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT_101)
        assert np.abs(red - img[1])[near].max() > 0.1, "the check would see the old line"


def test_lens_distortion_sends_source_points_past_the_barrel_fold_out_of_the_frame() -> None:
    """With k < 0 no output pixel reads a source radius past the fold's peak: such points (a
    wide frame's corners, a box reaching out of the frame) go outside the frame along their own
    ray, finite and without warnings (they ran off to infinity, and to NaN on an axis, so a
    narrow box above the frame came back the frame's whole width); points inside the fold still
    invert the source map."""
    import warnings

    w, h, k = 640, 480, -0.2
    fold = 1.0 / np.sqrt(-3.0 * k)
    peak = fold * (1.0 + k * fold * fold) / (1.0 + k) * (h / 2)  # source radius, pixels
    angles = np.linspace(0.0, 2.0 * np.pi, 16, endpoint=False)
    far = np.array([w / 2, h / 2]) + 1.3 * peak * np.stack([np.cos(angles), np.sin(angles)], 1)
    axis = np.array([[w / 2, h / 2 - 4.0 * peak], [w / 2 + 4.0 * peak, h / 2]])
    points = np.concatenate([far, axis])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fx, fy = distortion_forward(points[:, 0], points[:, 1], k, w, h)
    assert np.isfinite(fx).all() and np.isfinite(fy).all()
    assert ((fx < 0) | (fx > w) | (fy < 0) | (fy > h)).all(), "past the fold: outside the frame"
    direction = np.arctan2(fy - h / 2, fx - w / 2) - np.arctan2(points[:, 1] - h / 2, points[:, 0] - w / 2)
    assert np.abs(np.angle(np.exp(1j * direction))).max() < 1e-9, "along its own ray"
    assert fx[-2] == w / 2, "a point on the vertical axis stays on it (was NaN)"
    xs, ys = np.meshgrid(np.linspace(1, w - 1, 17), np.linspace(1, h - 1, 13))
    inside = np.hypot(xs - w / 2, ys - h / 2) < 0.95 * fold * (h / 2)  # the map's monotone part
    xs, ys = xs[inside], ys[inside]
    sx, sy = distortion_source(xs, ys, k, w, h)
    bx, by = distortion_forward(sx, sy, k, w, h)
    assert np.abs(bx - xs).max() < 1e-9 and np.abs(by - ys).max() < 1e-9


def test_lens_distortion_is_the_radial_model_and_moves_boxes_and_masks() -> None:
    w, h = 160, 120
    k = 0.05
    xs, ys = np.meshgrid(np.linspace(1, w - 1, 17), np.linspace(1, h - 1, 13))
    sx, sy = distortion_source(xs, ys, k, w, h)
    bx, by = distortion_forward(sx, sy, k, w, h)
    assert np.abs(bx - xs).max() < 1e-9 and np.abs(by - ys).max() < 1e-9, "forward inverts the source map"
    rho = np.hypot(xs - w / 2, ys - h / 2) / (h / 2)
    rho_s = np.hypot(sx - w / 2, sy - h / 2) / (h / 2)
    assert np.allclose(rho_s, rho * (1 + k * rho**2) / (1 + k))
    # against SciPy: bilinear reading at the model's source positions of a smooth image
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    smooth = (0.5 + 0.3 * np.sin(xx / 9.0) * np.cos(yy / 7.0)).astype(np.float32)
    img = np.stack([smooth] * 3)
    out = lens_distortion(img, {"k": np.float32(k)}, 0, _host.View(img))
    sxx, syy = distortion_source(xx + 0.5, yy + 0.5, float(np.float32(k)), w, h)
    ref = scipy.ndimage.map_coordinates(smooth.astype(np.float64), [syy - 0.5, sxx - 0.5], order=3, mode="nearest")
    keep = (sxx > 2) & (sxx < w - 2) & (syy > 2) & (syy < h - 2)
    assert np.abs(out[0][keep] - ref[keep]).max() < 0.01
    # a box and its mask follow the pixels: the engine's record moves the box to where the mask goes
    x = torch.from_numpy(img).unsqueeze(0)
    _, rec = perturb.apply(x, "lens_distortion", 5, ["k"], protect_border=False)
    mask = torch.zeros(1, 1, h, w, dtype=torch.uint8)
    mask[0, 0, 10:40, 15:50] = 1
    geometry = get_op("lens_distortion").geometry
    assert geometry is not None
    moved = geometry.label_maps(mask, {"k": torch.tensor([rec[0].params["k"]], dtype=torch.float32)})
    ys_m, xs_m = np.nonzero(moved[0, 0].numpy())
    box = transform_boxes([[15, 10, 50, 40]], rec[0], (w, h))[0].box
    assert abs(box[0] - xs_m.min()) <= 1.5 and abs(box[2] - (xs_m.max() + 1)) <= 1.5
    assert abs(box[1] - ys_m.min()) <= 1.5 and abs(box[3] - (ys_m.max() + 1)) <= 1.5


def test_scope_roll_turns_the_tissue_inside_the_fixed_mask_and_overlays() -> None:
    """A scope roll turns the image of the tissue about the optical centre (the field's
    centroid): inside the clear aperture the frame equals an independent OpenCV rotation of the
    clean frame about that centre; the mask, the surround and the overlays stay put; a box
    around a finding moves to where the finding went."""
    img = _frame(3, 0.3)
    x = torch.from_numpy(img)[None]
    out, (rec,) = perturb.apply(x, "scope_roll", 5, ["roll"])
    assert rec.protect_border and abs(rec.params["degrees"]) >= 12
    res = out[0].numpy()
    scene = Scene.from_descriptor(rec.extra["scene"])
    field = np.asarray(scene.field) > 0.5
    cx, cy, _ = _host.field_geometry(field)
    degrees = float(np.float32(rec.params["degrees"]))
    # forward map (input -> output) about (cx, cy), counter-clockwise as displayed (y down)
    forward = cv2.getRotationMatrix2D((cx - 0.5, cy - 0.5), degrees, 1.0)
    ref = np.stack([cv2.warpAffine(p, forward, img.shape[:0:-1], flags=cv2.INTER_CUBIC) for p in img])
    # where both the output pixel and its source lie well inside the clear tissue
    tissue = field & ~np.asarray(scene.overlay).astype(bool)
    # the frame is read as it is that far from the tissue's edge and from the image's border
    framed = np.pad(tissue, 1).astype(np.uint8)
    reach = 4 * RADIANCE_REACH * rim_px(*img.shape[1:]) + 2
    deep = cv2.distanceTransform(framed, cv2.DIST_L2, 3)[1:-1, 1:-1] > reach
    source_deep = cv2.warpAffine(deep.astype(np.uint8), forward, img.shape[:0:-1], flags=cv2.INTER_NEAREST) > 0
    both = deep & source_deep
    assert both.mean() > 0.3
    # warpAffine quantises source positions to 1/32 px: sharp highlight edges differ a little
    err = np.abs(res[:, both] - ref[:, both])
    assert np.percentile(err, 99) < 0.01 and err.max() < 0.1
    # the surround and the overlays stay exactly where they are
    fixed = ~cv2.dilate(field.astype(np.uint8), np.ones((5, 5))).astype(bool)
    assert np.abs(res[:, fixed] - img[:, fixed]).max() < 1e-6
    # a bright finding's box follows it (boxes through the record, about the scene's centre)
    h, w = img.shape[1:]
    spot = img.copy()
    fx, fy = int(cx + 0.25 * w * 0.5), int(cy)
    spot[:, fy - 3 : fy + 4, fx - 3 : fx + 4] = 1.0
    moved, (rec2,) = perturb.apply(torch.from_numpy(spot)[None], "scope_roll", 5, ["roll"])
    diff = np.abs(moved[0].numpy() - perturb.apply(x, "scope_roll", 5, ["roll"])[0][0].numpy()).sum(0)
    ys, xs = np.nonzero(diff > 0.5)
    (box,) = transform_boxes([[fx - 3, fy - 3, fx + 4, fy + 4]], rec2, (w, h))
    bx0, by0, bx1, by1 = box.box
    assert bx0 - 1 <= xs.min() and xs.max() + 1 <= bx1 + 1 and by0 - 1 <= ys.min() and ys.max() + 1 <= by1 + 1
    assert abs((bx0 + bx1) / 2 - (xs.mean() + 0.5)) < 1.5 and abs((by0 + by1) / 2 - (ys.mean() + 0.5)) < 1.5
    # the whole-frame rotation turns about the image centre instead: another box where the
    # field's centre is off the image's
    (plain,) = transform_boxes([[fx - 3, fy - 3, fx + 4, fy + 4]], {"op": "rotation", "params": rec2.params}, (w, h))
    assert abs(cy - h / 2) < 1 or plain.box != box.box


def test_scope_roll_boxes_turn_about_the_off_centre_field() -> None:
    """On a frame whose octagon sits right of centre with text on the left (an Olympus-like
    layout), a finding's box turns with the tissue about the field's centre (the record's
    scene), not the image's; the text box and the field stay; a whole-frame record (no scene)
    turns about the image centre."""
    h, w = 180, 260
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    field = (np.abs(xx - 160) < 85) & (np.abs(yy - 90) < 85) & (np.abs(xx - 160) + np.abs(yy - 90) < 115)
    tissue = 0.4 + 0.1 * np.sin(xx / 6.0) * np.cos(yy / 9.0)
    img = np.stack([tissue * field, 0.7 * tissue * field, 0.5 * tissue * field]).astype(np.float32)
    img[:, 20:26, 8:60] = 1.0  # an on-screen text bar in the surround
    img[:, 95:101, 205:211] = np.array([0.1, 0.9, 0.1], np.float32)[:, None, None]  # a green finding
    x = torch.from_numpy(img)[None]
    out, (rec,) = perturb.apply(x, "scope_roll", 5, ["off-centre"])
    res = out[0].numpy()
    scene = Scene.from_descriptor(rec.extra["scene"])
    cx, _, _ = _host.field_geometry(np.asarray(scene.field) > 0.5)
    assert cx > w / 2 + 20, "the field is right of centre"
    np.testing.assert_array_equal(res[:, 20:26, 8:60], img[:, 20:26, 8:60])
    green = (res[1] - res[0] > 0.4) & (res[1] - res[2] > 0.4)
    ys, xs = np.nonzero(green)
    assert len(ys) > 10
    (box,) = transform_boxes([[205, 95, 211, 101]], rec, (w, h))
    bx0, by0, bx1, by1 = box.box
    assert abs((bx0 + bx1) / 2 - (xs.mean() + 0.5)) < 1.5 and abs((by0 + by1) / 2 - (ys.mean() + 0.5)) < 1.5
    # the dict form of the record carries the scene as well
    as_dict = {"op": rec.op, "params": rec.params, "protect_border": True, "extra": rec.extra}
    assert transform_boxes([[205, 95, 211, 101]], as_dict, (w, h))[0].box == box.box
    # without a scene (the whole frame) the turn is about the image centre
    _, (bare,) = perturb.apply(x, "scope_roll", 5, ["off-centre"], protect_border=False)
    (plain,) = transform_boxes([[205, 95, 211, 101]], bare, (w, h))
    theta = math.radians(float(np.float32(bare.params["degrees"])))
    px, py = 208.0 - w / 2, 98.0 - h / 2  # the box centre turned counter-clockwise as displayed
    ex = w / 2 + math.cos(theta) * px + math.sin(theta) * py
    ey = h / 2 - math.sin(theta) * px + math.cos(theta) * py
    assert abs((plain.box[0] + plain.box[2]) / 2 - ex) < 0.5 and abs((plain.box[1] + plain.box[3]) / 2 - ey) < 0.5


# ---------------------------------------------------------------------------------------------
# Video: interlacing, macroblocking


def test_interlacing_takes_odd_lines_from_the_displaced_field_and_adds_a_ghost() -> None:
    img = _frame(4, 0.25)
    c, h, w = img.shape
    p = {"shift": np.float32(0.02), "ghost": np.float32(0.0), "direction": np.float32(0.0), "odd_first": np.float32(0.0)}
    view = _host.View(img, None)
    out = interlacing(img, p, 0, view)
    step = 0.02 * min(h, w)
    later = np.stack([scipy.ndimage.shift(img[i].astype(np.float64), (0, step), order=1, mode="nearest") for i in range(c)])
    t = view.tissue
    assert np.array_equal(out[:, 0::2][:, t[0::2]], img[:, 0::2][:, t[0::2]]), "the first field is the frame"
    odd = t[1::2] & (np.arange(w)[None, :] > step + 2)
    assert np.abs(out[:, 1::2][:, odd] - later[:, 1::2][:, odd]).max() < 0.01
    p["ghost"] = np.float32(0.2)
    ghosted = interlacing(img, p, 0, view)
    earlier = np.stack([scipy.ndimage.shift(img[i].astype(np.float64), (0, -step), order=1, mode="nearest") for i in range(c)])
    keep = t & (np.arange(w)[None, :] < w - step - 2)
    assert np.abs(ghosted[:, keep] - (0.8 * out[:, keep] + 0.2 * earlier[:, keep])).max() < 0.01


def test_h264_qstep_and_4x4_transform_quantisation() -> None:
    """Qstep is 1 at QP 4 and doubles every 6 QP (ITU-T H.264); a macroblock's residual is the
    orthonormal 4x4 DCT (SciPy) quantised with the dead zone 1/3."""
    assert qstep(4) == 1.0 and qstep(0) == 0.625
    for q in range(0, 46):
        assert qstep(q + 6) == pytest.approx(2 * qstep(q))
    assert np.allclose(dct4_matrix() @ dct4_matrix().T, np.eye(4))
    gen = np.random.default_rng(0)
    plane = gen.uniform(0, 255, size=(16, 16))
    step = qstep(30)
    coded = quantise_plane(plane, step, 16)
    res = plane - 128.0  # the frame's first macroblock is predicted by 128
    expected = np.zeros_like(plane)
    for by in range(0, 16, 4):
        for bx in range(0, 16, 4):
            coef = scipy.fft.dctn(res[by : by + 4, bx : bx + 4], norm="ortho")
            q = np.sign(coef) * np.floor(np.abs(coef) / step + 1 / 3) * step
            expected[by : by + 4, bx : bx + 4] = scipy.fft.idctn(q, norm="ortho") + 128.0
    assert np.abs(coded - np.clip(expected, 0, 255)).max() < 1e-9


def test_lost_slices_are_concealed_from_the_displaced_previous_frame() -> None:
    img = _frame(5, 0.3)
    _c, h, w = img.shape
    shift = 8  # whole pixels, so the nearest-neighbour concealment copy is an exact roll
    base = {"qp": np.float32(30.0), "motion": np.array([shift / min(h, w), 0.0], np.float32), "slice_quantile": np.float32(0.5)}
    clean = video_macroblocking(img, {**base, "loss": np.float32(0.0)}, 9, _host.View(img))
    lossy = video_macroblocking(img, {**base, "loss": np.float32(0.1)}, 9, _host.View(img))
    lost = lost_macroblocks(9, math.ceil(h / 16), math.ceil(w / 16), 0.1)
    assert 0.03 < lost.mean() < 0.25
    mask = np.repeat(np.repeat(lost, 16, 0), 16, 1)[:h, :w]
    assert np.array_equal(lossy[:, ~mask], clean[:, ~mask])
    prev = np.roll(clean, shift, axis=2)
    cols = np.arange(w)[None, :] >= shift + 1
    sel = mask & cols
    assert np.abs(lossy[:, sel] - prev[:, sel]).max() < 1e-6
    assert rng.uniform_numpy(9, "mb-slices", 4).shape == (4,)


def test_endoscopy_catalog_covers_the_clinical_artifacts() -> None:
    from perturb.catalog.specs import load_specs

    endo = {n: s for n, s in load_specs().items() if "endoscopy" in s.modalities}
    assert len(endo) >= 30, sorted(endo)
    new = {"surgical_smoke", "bubbles", "fluid_occlusion", "lens_fog", "lens_droplets", "interlacing",
           "chromatic_aberration", "lens_distortion", "video_macroblocking"}
    assert new <= set(endo)
    assert "occludes" in endo["fluid_occlusion"].risk_tags
    assert {"moves_geometry", "crops_border"} <= set(endo["lens_distortion"].risk_tags)
    assert endo["specular_glare"].version == 8


def test_smoke_refuses_a_strip_before_allocating_its_canvas() -> None:
    """A 3 x 20000 strip would need a 20000^2 noise canvas (1.5 GiB): a clear error instead."""
    from perturb.errors import InputError
    from perturb.ops.clinical import smoke_optical_depth

    params = {"drift": 0.3, "source": np.array([0.5, 0.5]), "spread": 0.3, "density": 1.0}
    with pytest.raises(InputError, match="too elongated"):
        smoke_optical_depth(1, 3, 20_000, params)
    assert smoke_optical_depth(1, 90, 160, params).shape == (90, 160)  # ordinary frames pass


def test_fluid_is_deeper_over_a_fold_valley_than_beside_it() -> None:
    """The pool is deeper in a fold's valley (a dark band of the relief) than over the mucosa
    beside it: two frames a constant apart share the pool, and per pixel
    ``log T_r - log T_b = (mu_b - mu_r) d`` (bile; particles cancel between channels) measures
    the depth ``d``; under the valley it is clearly larger than beside it, inside the pool."""
    h, w = 200, 240
    cols = np.arange(w, dtype=np.float32)
    dip = 0.12 * np.exp(-0.5 * ((cols - 120.0) / 10.0) ** 2)
    a = np.broadcast_to(np.float32(0.4) - dip[None, None, :], (3, h, w)).astype(np.float32)
    b = a + np.float32(0.2)
    p = {**_fluid_params(0), "opacity": np.float32(0.6)}
    out_a, out_b = (_lin(fluid_occlusion(f, p, 5, _view(f))) for f in (a, b))
    trans = (out_b - out_a) / (_lin(b) - _lin(a))
    pool = _pool(a)
    dist = cv2.distanceTransform(pool.astype(np.uint8), cv2.DIST_L2, 5)
    ok = (dist > 0.25 * dist.max()) & (trans.min(0) > 1e-3) & (out_b.max(0) < 0.99)
    depth = (np.log(trans[0]) - np.log(trans[2])) / (FLUIDS[0][0][2] - FLUIDS[0][0][0])
    valley = ok & (np.abs(cols - 120.0) < 6.0)[None, :]
    beside = ok & (np.abs(cols - 120.0) > 40.0)[None, :]
    assert valley.sum() > 100 and beside.sum() > 100, (valley.sum(), beside.sum())
    assert depth[valley].mean() > 1.3 * depth[beside].mean(), (depth[valley].mean(), depth[beside].mean())
