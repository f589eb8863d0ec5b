"""Exposure and light fall-off, in linear light (sRGB decoded, scaled, re-encoded).

* overexposure: gain > 1 with sensor clipping (auto-exposure lag, light too close).
* underexposure: gain < 1 with radial light fall-off ``1 - falloff * r^2`` (the light source
  cannot fill a distant lumen).
* vignetting: ``I * (1 - strength * r^2)``, r = distance from a keyed centre near the centre of
  the field of view (scene model), normalised by the field's radius (the whole image without a
  scene).
* haze: surgical smoke / fogged lens, the atmospheric scattering model
  ``I * t + A * (1 - t)`` with a smooth keyed transmission field around ``transmission`` and a
  near-white airlight A (He et al., Single Image Haze Removal Using Dark Channel Prior, 2009).

Highlights above the sensor's clip. A specular highlight (the light guide mirrored by wet
mucosa) is far brighter than the diffuse tissue, often by several stops, and the sensor clips it:
the frame shows only ``1`` where the radiance was ``H`` times the clip level. An op that lowers
the light (``underexposure``, ``haze``'s transmission, ``contrast`` in ``perturb.ops.color``)
must therefore leave such a pixel clipped unless it lowers it by more than its headroom ``H``,
as a real scope does (its highlights stay white when the picture darkens or greys). ``H`` is
estimated from the highlight's extent: a pixel at distance ``d`` inside a clipped highlight (its
brightest channel at the clip, ``CLIP_LEVEL``, and near-white, ``HIGHLIGHT_MIN``) gets ``H = HEADROOM_MAX ** min(1, (d - 1/2) / ramp)``, ``ramp`` the larger of ``D``, a small
fraction of the shorter side (``headroom_depth_px``), and ``HEADROOM_SPREAD`` times the
highlight's half-width there (a sheen rises gently, a glint steeply): the rim of a highlight is
barely above the clip and dims first, its core is ``HEADROOM_MAX`` (6 stops) above it. Pixels below the clip have
``H = 1`` and take the ops exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops import _host, backend, keyed_fields
from perturb.ops._math import (
    gain_in_linear_u8,
    linear_to_srgb,
    linear_to_srgb_lut,
    linear_to_srgb_np,
    lut_u8,
    per_sample,
    scratch,
    shorter_side,
    srgb_to_linear,
    srgb_to_linear_lut,
    srgb_to_linear_np,
    srgb_to_linear_u8,
)
from perturb.ops.kernels import Level, Params, draw, draw_sign, register_kernel
from perturb.ops.keyed_fields import uniform_fields
from perturb.ops.radiometry import (
    ALL_DTYPES,
    FULL_DOSE_QUANTA,
    MU,
    REFERENCE_SIDE,
    _apply_shift,
    _coords,
    _host_params,
    _register_lut,
    _wide,
    scale_linear,
    to_display,
    to_linear,
)

HAZE_GRID = 6

# ---------------------------------------------------------------------------------------------
# Highlights above the sensor's clip (module docstring)

CLIP_LEVEL = 249.5 / 255.0  # the brightest channel at least this: clipped (8-bit 250 and up)
# ... and the darkest at least this: a near-white highlight (the processor's white balance scales
# the clipped channels after the sensor, so a clipped highlight shows a tint such as 255/250/228;
# red mucosa clipped in its red channel alone is not a highlight)
HIGHLIGHT_MIN = 219.5 / 255.0
HEADROOM_MAX = 64.0  # a highlight's core: 6 stops above the clip
HEADROOM_DEPTH = (
    0.004  # distance inside a highlight at which it reaches HEADROOM_MAX (shorter side)
)
HEADROOM_DEPTH_MIN_PX = 2.0
# a broad highlight (a sheen) is a gentle hill of radiance, a small one (the light guide mirrored
# by a facet) a steep peak: the ramp to HEADROOM_MAX is this fraction of the highlight's
# half-width near the pixel, at least D, at most HEADROOM_REACH of the shorter side
HEADROOM_SPREAD = 0.7
HEADROOM_REACH = 0.03
HEADROOM_START = 0.5  # px: the radiance crosses the clip half a pixel outside the rim's centres


def headroom_reach_px(h: int, w: int) -> float:
    """The widest highlight half-width (pixels) the headroom's ramp follows."""
    return max(2.0 * HEADROOM_DEPTH_MIN_PX, HEADROOM_REACH * min(h, w))


def headroom_depth_px(h: int, w: int) -> float:
    """``D`` of an h x w frame in pixels: the depth inside a clipped region at which the
    radiance reaches ``HEADROOM_MAX`` times the clip."""
    return max(HEADROOM_DEPTH_MIN_PX, HEADROOM_DEPTH * min(h, w))


def highlight_headroom(x: torch.Tensor) -> torch.Tensor:
    """float32 (B, 1, H, W): each pixel's radiance over the clip level, ``H`` (module
    docstring; 1 below the clip), of a float32 BCHW batch in [0, 1]."""
    h, w = x.shape[-2:]
    depth, reach = headroom_depth_px(h, w), headroom_reach_px(h, w)
    clipped = (x.amax(dim=1, keepdim=True) >= CLIP_LEVEL) & (
        x.amin(dim=1, keepdim=True) >= HIGHLIGHT_MIN
    )
    dist = _host.chamfer_t(clipped, _host.CHAMFER3, reach).clamp(max=reach)
    # the highlight's half-width near each pixel: the largest depth within ``reach`` (a
    # separable max filter, as OpenCV's dilation with a square kernel)
    size = 2 * round(reach) + 1
    half = torch.where(clipped, dist, torch.zeros_like(dist))
    half = _host.window_max(_host.window_max(half, size, 2), size, 3)
    ramp = torch.clamp(HEADROOM_SPREAD * half, min=depth)
    power = ((dist - HEADROOM_START) / ramp).clamp(0.0, 1.0)
    return torch.where(clipped, torch.pow(HEADROOM_MAX, power), torch.ones_like(power))


def _headroom_fields(
    clipped: np.ndarray, box: tuple[int, int, int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """(distance into the clipped area capped at the reach, its local maximum over the reach,
    the ramp's minimum depth) of a bool (H, W) clip mask: what ``headroom_np`` and
    ``_headroom_at`` share. ``box`` (x0, y0, x1, y1): the local maximum only there (the
    rectangle around every clipped pixel: the distance is 0 outside it, as the dilation's
    constant border, so the maximum inside is the frame's); the distance is always computed
    over the frame (OpenCV's distance transform of a crop differs in the last bit where two
    paths tie)."""
    h, w = clipped.shape
    depth, reach = headroom_depth_px(h, w), headroom_reach_px(h, w)
    dist = np.minimum(
        cv2.distanceTransform(clipped.view(np.uint8), cv2.DIST_L2, 3), np.float32(reach)
    )
    size = 2 * round(reach) + 1
    x0, y0, x1, y1 = (0, 0, w, h) if box is None else box
    half = cv2.dilate(
        dist[y0:y1, x0:x1],
        np.ones((size, size), np.uint8),
        borderType=cv2.BORDER_CONSTANT,
        borderValue=0.0,
    )
    return dist, half, depth


def headroom_np(clipped: np.ndarray) -> np.ndarray:
    """``highlight_headroom`` of one sample's bool (H, W) clip mask, float32 (H, W)."""
    dist, half, depth = _headroom_fields(clipped)
    ramp = np.maximum(np.float32(HEADROOM_SPREAD) * half, np.float32(depth))
    power = np.clip((dist - np.float32(HEADROOM_START)) / ramp, np.float32(0.0), np.float32(1.0))
    head = torch.pow(HEADROOM_MAX, torch.from_numpy(np.ascontiguousarray(power))).numpy()
    return np.where(clipped, head, np.float32(1.0)).astype(np.float32)


def above_clip(x: torch.Tensor, headroom: torch.Tensor) -> torch.Tensor:
    """Display values of the radiance ``H`` times the pixel (``x`` BCHW in [0, 1], ``headroom``
    broadcastable): the sRGB curve continued above 1 where ``H > 1``, ``x`` itself elsewhere."""
    lifted = 1.055 * torch.pow(srgb_to_linear(x) * headroom, 1.0 / 2.4) - 0.055
    return torch.where(headroom > 1.0, lifted, x)


def clipped_pixels(src: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(ys, xs, H) of one sample's clipped highlight pixels (CHW, uint8, uint16 or float32) and
    their headroom, or None where there is none."""
    high, low = src.max(axis=0), src.min(axis=0)
    if src.dtype == np.uint8:
        clipped = (high >= 250) & (low >= 220)
    else:  # the kernel's float32 comparison of the engine's float32 values
        table = None if src.dtype == np.float32 else backend.levels(src.dtype)
        high_f = high if table is None else table[high]
        low_f = low if table is None else table[low]
        clipped = (high_f >= np.float32(CLIP_LEVEL)) & (low_f >= np.float32(HIGHLIGHT_MIN))
    points = cv2.findNonZero(clipped.view(np.uint8))  # (x, y) in row-major order, as np.nonzero
    if points is None:
        return None
    xy = points.reshape(-1, 2)
    xs, ys = xy[:, 0], xy[:, 1]
    return ys, xs, _headroom_at(clipped, ys, xs)


def _headroom_at(clipped: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """``headroom_np(clipped)[ys, xs]`` at the clipped pixels (ys, xs) alone: the distances over
    the frame, the ramp and the power at those pixels (the same float32 operations; the power
    on a copy padded to whole 64-element blocks, as on a frame); the local maximum of the
    distance on the clipped pixels' bounding box alone (``_headroom_fields``). ``ys``: in
    raster order (``cv2.findNonZero``)."""
    x0, x1 = int(xs.min()), int(xs.max()) + 1
    dist, half, depth = _headroom_fields(clipped, (x0, int(ys[0]), x1, int(ys[-1]) + 1))
    at = half[ys - ys[0], xs - x0]
    ramp = np.maximum(np.float32(HEADROOM_SPREAD) * at, np.float32(depth))
    power = np.zeros(-(-len(ys) // 64) * 64, np.float32)
    np.clip((dist[ys, xs] - np.float32(HEADROOM_START)) / ramp, 0.0, 1.0, out=power[: len(ys)])
    return torch.pow(HEADROOM_MAX, torch.from_numpy(power)).numpy()[: len(ys)]


def write_pixels(dst: np.ndarray, ys: np.ndarray, xs: np.ndarray, values: torch.Tensor) -> None:
    """Write float values (C, N) in [0, 1] to ``dst`` (CHW) at (ys, xs), rounded as the engine
    rounds integer levels."""
    v = values.clamp(0.0, 1.0).numpy().astype(np.float32)
    if dst.dtype == np.float32:
        dst[:, ys, xs] = v
        return
    top = 255.0 if dst.dtype == np.uint8 else 65535.0
    dst[:, ys, xs] = np.clip(np.rint(v * np.float32(top)), 0, top).astype(dst.dtype)


def pixel_values(src: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> torch.Tensor:
    """float32 (C, N) values of one sample's pixels (ys, xs), as the engine converts levels."""
    picked = np.ascontiguousarray(src[:, ys, xs])
    if picked.dtype != np.float32:
        picked = backend.levels(picked.dtype)[picked]
    return torch.from_numpy(np.ascontiguousarray(picked, dtype=np.float32))


def radial_r2(x: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor) -> torch.Tensor:
    """Squared distance (B,1,H,W) from per-sample centres (fractions of width/height),
    normalised so a corner of a centred image is at r = 1."""
    h, w = x.shape[-2:]
    half_diag = 0.5 * float(np.hypot(h, w))
    ys = (torch.arange(h, device=x.device, dtype=x.dtype) + 0.5).view(1, 1, h, 1)
    xs = (torch.arange(w, device=x.device, dtype=x.dtype) + 0.5).view(1, 1, 1, w)
    dy = (ys - per_sample(cy) * h) / half_diag
    dx = (xs - per_sample(cx) * w) / half_diag
    return dx * dx + dy * dy


def _centre(rng_: np.random.Generator) -> dict[str, float]:
    return {"cx": float(rng_.uniform(0.45, 0.55)), "cy": float(rng_.uniform(0.45, 0.55))}


def _falloff(x: torch.Tensor, p: dict[str, torch.Tensor], strength: torch.Tensor) -> torch.Tensor:
    return (1.0 - per_sample(strength) * radial_r2(x, p["cx"], p["cy"])).clamp_min(0.0)


@register_kernel("overexposure")
def overexposure(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: ``kornia.color.rgb_to_linear_rgb`` / ``linear_rgb_to_rgb`` on CUDA (through
    ``perturb.ops._math``); the gain is one multiply."""
    return linear_to_srgb(srgb_to_linear(x) * per_sample(p["gain"]))


def _under_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "gain": draw(rng_, level["gain"]),
        "falloff": draw(rng_, level["falloff"]),
        **_centre(rng_),
    }


@register_kernel("underexposure", sampler=_under_sampler)
def underexposure(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Clipped highlights keep their headroom above the clip (module docstring).

    Kornia: ``kornia.color.rgb_to_linear_rgb`` / ``linear_rgb_to_rgb`` on CUDA (through
    ``perturb.ops._math``); the scale is one multiply."""
    scale = per_sample(p["gain"]) * _falloff(x, p, p["falloff"])
    return linear_to_srgb(srgb_to_linear(x) * scale * highlight_headroom(x))


def _vignetting_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"strength": draw(rng_, level["strength"]), **_centre(rng_)}


def field_frame(h: int, w: int, scene: Any) -> tuple[float, float, float, float]:
    """(x0, y0, width, height) of the image circle a radial fall-off is centred in: the field of
    view's bounding box from the scene, else the whole image."""
    if scene is None:
        return 0.0, 0.0, float(w), float(h)
    x0, y0, x1, y1 = scene.bbox
    return float(x0), float(y0), float(x1 - x0), float(y1 - y0)


def _field_terms(
    h: int, w: int, cx: float, cy: float, scene: Any, box: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """float64 squared distances (in field radii) of ``field_falloff_np``: of the columns (x0..x1)
    and of the rows (y0..y1) of ``box``."""
    fx, fy, fw, fh = field_frame(h, w, scene)
    radius = 0.5 * float(np.sqrt(0.5 * (fw * fw + fh * fh)))
    bx0, by0, bx1, by1 = box
    dy = (np.arange(h, dtype=np.float64) + 0.5 - (fy + cy * fh)) / radius
    dx = (np.arange(w, dtype=np.float64) + 0.5 - (fx + cx * fw)) / radius
    return (dx * dx)[bx0:bx1], (dy * dy)[by0:by1]


def field_falloff_np(
    h: int,
    w: int,
    cx: float,
    cy: float,
    strength: float,
    scene: Any,
    out: np.ndarray | None = None,
    box: tuple[int, int, int, int] | None = None,
) -> np.ndarray:
    """float32 (H, W) ``max(0, 1 - strength r^2)``, r = distance from the keyed centre (fractions
    of the field box) over the field's radius (the RMS of its half sides), so the fall-off
    reaches ``1 - strength`` at the aperture's edge whatever the frame's layout. Evaluated in
    float64, a band of rows at a time (into ``out`` where given); ``box`` (x0, y0, x1, y1): only
    that rectangle, the same values as there in the whole map."""
    bx0, by0, bx1, by1 = (0, 0, w, h) if box is None else box
    dx2_cols, dy2_rows = _field_terms(h, w, cx, cy, scene, (bx0, by0, bx1, by1))
    dx2, dy2 = dx2_cols[None, :], dy2_rows[:, None]
    bh, bw = by1 - by0, bx1 - bx0
    res = np.empty((bh, bw), np.float32) if out is None else out
    if bh == 0 or bw == 0:
        return res
    band = max(1, min(bh, (1 << 15) // max(bw, 1)))  # 256 KB of float64: stays in cache
    work = scratch("field_falloff_np", (band, bw), np.float64)
    rows_dx2 = scratch("field_falloff_np_dx2", (band, bw), np.float64)  # dx2 repeated: a plain add
    rows_dx2[...] = dx2
    for y0 in range(0, bh, band):
        rows = min(band, bh - y0)
        r2 = work[:rows]
        np.add(rows_dx2[:rows], dy2[y0 : y0 + rows], out=r2)
        np.multiply(r2, -strength, out=r2)  # -(strength r^2): the same rounding, negated
        np.add(r2, 1.0, out=r2)  # 1 - strength r^2
        res[y0 : y0 + rows] = r2
    # max(0, .) after the cast to float32 gives the same values (rounding is monotone, keeps 0,
    # and 1 - strength r^2 is 0 or at least 2^-53 in magnitude: no -0). 1 - strength r^2 is
    # monotone in r^2, and the rounded sums too, so its extremes are at the extreme sums: skip the
    # pass where none is negative
    ends = np.add(np.array([dx2.min(), dx2.max()]), np.array([dy2.min(), dy2.max()]))
    if float(np.add(np.multiply(ends, -strength), 1.0).min()) < 0.0:
        if res.flags.c_contiguous:  # OpenCV writes into the given array
            cv2.max(res, 0.0, dst=res)  # type: ignore[call-overload]  # a scalar bound
        else:
            np.maximum(res, np.float32(0.0), out=res)
    return res


def field_falloff(
    x: torch.Tensor,
    cx: torch.Tensor,
    cy: torch.Tensor,
    strength: torch.Tensor,
    frames: Sequence[tuple[float, float, float, float]],
) -> torch.Tensor:
    """``field_falloff_np`` of the whole batch at once, (B,1,H,W) float64: the same float64
    operations in the same order (bit for bit), each sample centred in its own field box
    ``frames[i]`` (``field_frame``, host-side scene data) with its own (B,) parameters."""
    h, w = x.shape[-2:]
    # (B, 4): each field box's x0, y0, width and height
    box = torch.tensor(frames, dtype=torch.float64, device=x.device)
    fx, fy, fw, fh = (per_sample(box[:, i]) for i in range(4))
    radius = 0.5 * torch.sqrt(0.5 * (fw * fw + fh * fh))
    ys = (torch.arange(h, dtype=torch.float64, device=x.device) + 0.5).view(1, 1, h, 1)
    xs = (torch.arange(w, dtype=torch.float64, device=x.device) + 0.5).view(1, 1, 1, w)
    dy = (ys - (fy + per_sample(cy).double() * fh)) / radius
    dx = (xs - (fx + per_sample(cx).double() * fw)) / radius
    r2 = dx * dx + dy * dy  # the one (B, 1, H, W) float64 batch; the rest in place
    return r2.mul_(-per_sample(strength).double()).add_(1.0).clamp_min_(0.0)


@register_kernel("vignetting", sampler=_vignetting_sampler, uses_scene=True)
def vignetting(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Radial fall-off of light over the field of view (cos^4 law, ~ 1 - a r^2) in linear light.

    Kornia: ``kornia.color.rgb_to_linear_rgb`` / ``linear_rgb_to_rgb`` on CUDA (through
    ``perturb.ops._math``; on a CPU device its float32 tables, ``srgb_to_linear_lut``); own
    fall-off field (no Kornia equivalent of a field-of-view cos^4 law)."""
    h, w = x.shape[-2:]
    frames = [field_frame(h, w, s) for s in (scenes if scenes is not None else [None] * x.shape[0])]
    scale = field_falloff(x, p["cx"], p["cy"], p["strength"], frames).to(x.dtype)
    return linear_to_srgb_lut(srgb_to_linear_lut(x).mul_(scale))


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
    coarse = uniform_fields(keys, stream, (1, grid, grid), x.device)  # the whole batch at once
    field = F.interpolate(coarse * 2.0 - 1.0, size=(h, w), mode="bicubic", align_corners=True)
    return field.clamp_(-1.0, 1.0)


def _cubic_weights(size_in: int, size_out: int) -> np.ndarray:
    """(size_out, size_in) bicubic interpolation matrix (A = -0.75, align_corners=True, edge
    indices clamped), the weights torch's ``upsample_bicubic2d`` applies."""
    a = -0.75
    scale = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    real = np.arange(size_out, dtype=np.float64) * scale
    base = np.floor(real)
    t = real - base

    def near(x: np.ndarray) -> np.ndarray:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    coeffs = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    weights = np.zeros((size_out, size_in), dtype=np.float64)
    rows = np.arange(size_out)
    for j, coeff in enumerate(coeffs):
        idx = np.clip(base.astype(np.int64) - 1 + j, 0, size_in - 1)
        np.add.at(weights, (rows, idx), coeff)
    return weights


def smooth_field_np(key: int, stream: str, grid: int, h: int, w: int) -> np.ndarray:
    """``smooth_field`` of one sample on the host (float64 separable bicubic, within float32
    rounding of torch's), as float32 (H, W)."""
    coarse = rng.uniform_numpy(key, stream, grid * grid).reshape(grid, grid).astype(np.float64)
    coarse = coarse * 2.0 - 1.0
    field = _cubic_weights(grid, h) @ coarse @ _cubic_weights(grid, w).T
    return np.clip(field, -1.0, 1.0).astype(np.float32)


@register_kernel("haze", sampler=_haze_sampler)
def haze(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Clipped highlights enter with their headroom above the clip (module docstring).

    Kornia: own kernel: no Kornia equivalent of a keyed transmission field with airlight; the
    field's bicubic upsampling is ``F.interpolate``, which ``kornia.geometry.transform.resize``
    would only wrap."""
    t = (
        per_sample(p["transmission"]) * (1.0 + 0.15 * smooth_field(x, keys, "haze", HAZE_GRID))
    ).clamp(0.0, 1.0)
    airlight = per_sample(p["airlight"]) * p["tint"].view(-1, 3, 1, 1)[:, : x.shape[1]]
    if x.shape[1] == 1:
        airlight = per_sample(p["airlight"])
    radiance = above_clip(x, highlight_headroom(x))
    return (radiance * t + airlight * (1.0 - t)).clamp_(0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# CPU fast paths (one sample). uint8: exact lookup tables for the pointwise op; the radial ops
# scale in the encoded domain (within one level, see ``_ENCODED_ROOT``). float32: float32
# OpenCV/NumPy arithmetic (within 1e-6 of the kernels).


def _radial_terms(h: int, w: int, cx: np.float32, cy: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """float32 squared x (W,) and y (H,) distances of ``radial_r2`` for one sample."""
    half_diag = np.float32(0.5 * float(np.hypot(h, w)))
    dy = (np.arange(h, dtype=np.float32) + np.float32(0.5) - cy * np.float32(h)) / half_diag
    dx = (np.arange(w, dtype=np.float32) + np.float32(0.5) - cx * np.float32(w)) / half_diag
    return dx * dx, dy * dy


def _radial_r2_np(
    h: int, w: int, cx: np.float32, cy: np.float32, out: np.ndarray | None = None
) -> np.ndarray:
    """``radial_r2`` of one sample as float32 (H, W) (into ``out`` where given)."""
    dx2, dy2 = _radial_terms(h, w, cx, cy)
    return np.add(dx2[None, :], dy2[:, None], out=out)


def _falloff_np(h: int, w: int, p: dict[str, np.ndarray], strength: np.float32) -> np.ndarray:
    """``_falloff`` of one sample as float32 (H, W), in a per-thread buffer (valid until the
    thread's next call)."""
    dx2, dy2 = _radial_terms(h, w, np.float32(p["cx"]), np.float32(p["cy"]))
    r2 = np.add(dx2[None, :], dy2[:, None], out=scratch("falloff_np", (h, w), np.float32))
    r2 *= -strength
    r2 += np.float32(1.0)
    # 1 - strength r^2 is monotone in r^2 and the rounded sums are monotone in their terms: its
    # extremes are at the terms' extremes, so the clip is skipped where none is negative (and
    # 1 + x is exactly 0 or at least 2^-24 in magnitude: OpenCV's max cannot meet a -0)
    ends = np.array([dx2.min(), dx2.max()]) + np.array([dy2.min(), dy2.max()])
    ends *= -strength
    ends += np.float32(1.0)
    if float(ends.min()) < 0.0:
        cv2.max(r2, 0.0, dst=r2)  # type: ignore[call-overload]  # a scalar bound
    return r2


# uint8 radial path. With v = 255 * 1.055 * (lin * scale)^(1/2.4), the sRGB encoding of
# lin * scale is exactly v - 255 * 0.055 levels above the curve's linear foot and
# 255 * 12.92 * (v / (255 * 1.055))^2.4 on it; v = g(x) * root is the product of a per-level
# table g(x) = 255 * 1.055 * lin(x)^(1/2.4) (which holds the decoding's own linear foot) and the
# gain field's root = scale^(1/2.4). So each plane is a float32 lookup, one multiply, and two
# OpenCV conversions to bytes: the affine level v - 14.025 (exact away from the foot) and v on a
# fine grid (1 / _FINE_STEPS) indexing a table of the foot's levels.
_ENCODED_ROOT = 255.0 * 1.055  # v of linear 1
_ENCODED_OFFSET = 255.0 * 0.055  # level = v - _ENCODED_OFFSET above the foot
# the affine level is used from 11 up (v > 24.525, above the foot's top, v = 24.34); below, the
# fine index (saturating at 255 only above that) gives the level
_AFFINE_FROM = 11
_FINE_STEPS = 10.25  # fine index = round(v * _FINE_STEPS); 24.525 * 10.25 < 254.5


def _srgb_encode_levels(lin: np.ndarray) -> np.ndarray:
    """float64 sRGB encoding of linear values in [0, 1], in levels (0..255, unrounded)."""
    enc = np.where(
        lin <= 0.0031308, 12.92 * lin, 1.055 * np.maximum(lin, 0.0031308) ** (1.0 / 2.4) - 0.055
    )
    return enc * 255.0


@lru_cache(maxsize=1)
def _level_tables() -> tuple[np.ndarray, np.ndarray]:
    """(affine, fine) uint8 tables: the level is ``min(affine[a], fine[f])`` for the affine byte
    a = |v - 14.025| and the fine byte f = round(v * _FINE_STEPS), both saturated. A byte a below
    _AFFINE_FROM may be |v - 14.025| folded from v < 14.025, so it defers (255) to the fine table;
    the fine table gives the exact level of its grid point where v may be at most 24.525 (the foot
    and the affine bytes below 11) and defers (255) above."""
    affine = np.arange(256, dtype=np.uint8)
    affine[:_AFFINE_FROM] = 255
    steps = np.arange(256, dtype=np.float64)
    v = steps / _FINE_STEPS
    levels = _srgb_encode_levels((v / _ENCODED_ROOT) ** 2.4)
    fine = np.clip(np.rint(levels), 0, 255).astype(np.uint8)
    fine[(steps - 0.5) / _FINE_STEPS >= _ENCODED_OFFSET + _AFFINE_FROM - 0.5] = 255
    affine.flags.writeable = False
    fine.flags.writeable = False
    return affine, fine


@lru_cache(maxsize=64)
def _encoded_root_table(gain: float) -> np.ndarray:
    """float32 g(x) = 255 * 1.055 * (lin(x) * gain)^(1/2.4) of the 256 levels x, lin the
    kernels' float32 decoding (float64 evaluation)."""
    lin = srgb_to_linear_u8().astype(np.float64) * gain
    table = (_ENCODED_ROOT * lin ** (1.0 / 2.4)).astype(np.float32)
    table.flags.writeable = False
    return table


# a fall-off this small or less leaves v = g(x) * root below 0.003, level 0 (fine byte 0)
_ROOT_FLOOR = np.float32(1e-12)


def _root_field(dx2: np.ndarray, dy2: np.ndarray, strength: float) -> np.ndarray:
    """float32 (H, W) ``max(0, 1 - strength (dx2 + dy2))^(1/2.4)`` for squared distances of the
    columns ``dx2`` (W,) and rows ``dy2`` (H,), in a per-thread buffer (valid until the thread's
    next call): the fall-off ``(1 - strength dx2) + (-strength dy2)`` (float32, within an ulp of
    the kernels' order of operations), its root by OpenCV's log and exp (within 1e-7)."""
    cols = (1.0 - strength * dx2.astype(np.float64)).astype(np.float32)
    rows = (-strength * dy2.astype(np.float64)).astype(np.float32)
    field = scratch("radial_root", (rows.size, cols.size), np.float32)
    # an outer sum: torch's broadcast add is ~3x NumPy's here (one rounding either way)
    torch.add(
        torch.from_numpy(rows)[:, None],
        torch.from_numpy(cols)[None, :],
        out=torch.from_numpy(field),
    )
    # clipped not at 0 but at _ROOT_FLOOR, whose root sends every level to 0 too: OpenCV's log
    # and exp take a slow path at log 0 = -inf (~8 ns a value)
    if rows.size and cols.size and float(rows.min() + cols.min()) < _ROOT_FLOOR:  # the least sum
        cv2.max(field, float(_ROOT_FLOOR), dst=field)  # type: ignore[call-overload]  # ~3x NumPy's
    cv2.log(field, dst=field)
    np.multiply(field, np.float32(1.0 / 2.4), out=field)
    cv2.exp(field, dst=field)
    return field


def _scale_in_linear_u8(
    src: np.ndarray, dst: np.ndarray, root: np.ndarray, gain: float = 1.0
) -> None:
    """uint8 ``linear_to_srgb(srgb_to_linear(src) * gain * root^2.4)`` (CHW planes, possibly
    views of a larger frame; ``root`` (H, W) float32), within one level of the kernels (see
    the comment above ``_ENCODED_ROOT``)."""
    table = _encoded_root_table(gain)
    affine_table, fine_table = _level_tables()
    v = scratch("radial_u8_v", root.shape, np.float32)
    affine = scratch("radial_u8_affine", root.shape, np.uint8)
    fine = scratch("radial_u8_fine", root.shape, np.uint8)
    for c in range(src.shape[0]):
        cv2.LUT(src[c], table, dst=v)
        cv2.multiply(v, root, dst=v)
        cv2.convertScaleAbs(v, dst=affine, alpha=1.0, beta=-_ENCODED_OFFSET)
        cv2.convertScaleAbs(v, dst=fine, alpha=_FINE_STEPS)
        lut_u8(affine, affine, affine_table)
        lut_u8(fine, fine, fine_table)
        cv2.min(affine, fine, dst=dst[c])


def _scale_in_linear(src: np.ndarray, dst: np.ndarray, scale: np.ndarray) -> None:
    """float32 dst = linear_to_srgb(srgb_to_linear(src) * scale) with a per-pixel (H, W) scale
    (CHW planes, possibly views of a larger frame)."""
    if not (src.flags.c_contiguous and dst.flags.c_contiguous):  # the float path reshapes
        region = np.ascontiguousarray(src)
        out = np.empty_like(region)
        _scale_in_linear(region, out, scale)
        dst[...] = out
        return
    lin = srgb_to_linear_np(src)
    lin *= scale
    linear_to_srgb_np(lin, out=dst)


@backend.register_cpu("overexposure")
def overexposure_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    if src.dtype == np.uint8:
        gain_in_linear_u8(src, dst, [float(np.float32(p["gain"]))])
        return
    lin = srgb_to_linear_np(src)
    lin *= np.float32(p["gain"])
    linear_to_srgb_np(lin, out=dst)


@backend.register_cpu("underexposure", uses_scene=True)
def underexposure_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    """The scene (given only with border protection, whose composite keeps the source outside
    the field's bbox) only bounds the uint8 work to that bbox; the fall-off is the kernel's,
    centred in the whole image. Clipped highlights are then recomputed with their headroom
    (``_underexposed_highlights``)."""
    h, w = src.shape[-2:]
    if src.dtype == np.uint8:
        x0, y0, x1, y1 = 0, 0, w, h
        if scene is not None:
            x0, y0, x1, y1 = (int(v) for v in scene.bbox)
            np.copyto(dst, src)
            if x1 <= x0 or y1 <= y0:
                return
        dx2, dy2 = _radial_terms(h, w, np.float32(p["cx"]), np.float32(p["cy"]))
        root = _root_field(dx2[x0:x1], dy2[y0:y1], float(np.float32(p["falloff"])))
        _scale_in_linear_u8(
            src[:, y0:y1, x0:x1], dst[:, y0:y1, x0:x1], root, float(np.float32(p["gain"]))
        )
        _underexposed_highlights(src, dst, p, (x0, y0, x1, y1))
        return
    scale = _falloff_np(h, w, p, np.float32(p["falloff"]))
    scale *= np.float32(p["gain"])
    _scale_in_linear(src, dst, scale)
    _underexposed_highlights(src, dst, p, (0, 0, w, h))


def _underexposed_highlights(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], box: tuple[int, int, int, int]
) -> None:
    """``underexposure``'s clipped pixels inside ``box`` (x0, y0, x1, y1) with their headroom:
    the kernel's float32 formula on those pixels alone (a few per mille of a frame)."""
    found = clipped_pixels(src)
    if found is None:
        return
    ys, xs, head = found
    x0, y0, x1, y1 = box
    keep = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
    ys, xs, head = ys[keep], xs[keep], head[keep]
    h, w = src.shape[-2:]
    dx2, dy2 = _radial_terms(h, w, np.float32(p["cx"]), np.float32(p["cy"]))
    r2 = torch.from_numpy(dx2[xs] + dy2[ys])
    falloff = (1.0 - torch.tensor(np.float32(p["falloff"])) * r2).clamp_min(0.0)
    scale = torch.tensor(np.float32(p["gain"])) * falloff
    lin = srgb_to_linear(pixel_values(src, ys, xs))
    write_pixels(dst, ys, xs, linear_to_srgb(lin * scale * torch.from_numpy(head)))


@backend.register_cpu("vignetting", uses_scene=True)
def vignetting_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    cx, cy, strength = float(p["cx"]), float(p["cy"]), float(p["strength"])
    x0, y0, x1, y1 = 0, 0, w, h
    if scene is not None:
        # a scene comes only with border protection, whose composite keeps the source outside
        # the field's bbox: the fall-off is computed inside it, the rest copied from the source
        x0, y0, x1, y1 = (int(v) for v in scene.bbox)
        np.copyto(dst, src)
    box = (x0, y0, x1, y1)
    if x1 <= x0 or y1 <= y0:
        return
    region_src, region_dst = src[:, y0:y1, x0:x1], dst[:, y0:y1, x0:x1]
    if src.dtype == np.uint8:
        _scale_in_linear_u8(
            region_src, region_dst, _root_field(*_field_terms(h, w, cx, cy, scene, box), strength)
        )
        return
    scale = scratch("vignetting_scale", (y1 - y0, x1 - x0), np.float32)
    field_falloff_np(h, w, cx, cy, strength, scene, out=scale, box=box)
    _scale_in_linear(region_src, region_dst, scale)


@backend.register_cpu("haze")
def haze_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """I t + A (1 - t); the smooth field is the kernel's own (torch bicubic, per sample);
    clipped highlights recomputed with their headroom."""
    c_count, h, w = src.shape
    field = smooth_field_np(key, "haze", HAZE_GRID, h, w)
    field *= np.float32(0.15)
    field += np.float32(1.0)
    field *= np.float32(p["transmission"])
    t = np.clip(field, np.float32(0.0), np.float32(1.0), out=field)
    rest = np.float32(1.0) - t
    airlight = np.float32(p["airlight"])
    tint = np.asarray(p["tint"], dtype=np.float32)
    for c in range(c_count):
        a = airlight if c_count == 1 else airlight * tint[c]
        if src.dtype == np.uint8:  # level units, rounded once
            glow = rest * (a * np.float32(255.0))
            lit = cv2.multiply(src[c], t, dtype=cv2.CV_32F)
            cv2.add(lit, glow, dst=dst[c], dtype=cv2.CV_8U)
        else:  # the kernel's order: x * t + a * (1 - t)
            np.multiply(src[c], t, out=dst[c])
            dst[c] += a * rest
            np.clip(dst[c], np.float32(0.0), np.float32(1.0), out=dst[c])
    found = clipped_pixels(src)
    if found is None:
        return
    # clipped highlights enter with their headroom above the clip (module docstring)
    ys, xs, head = found
    lights = torch.tensor(
        [airlight] if c_count == 1 else [airlight * tint[c] for c in range(c_count)],
        dtype=torch.float32,
    ).view(-1, 1)
    pixel_t = torch.from_numpy(np.ascontiguousarray(t[ys, xs]))
    radiance = above_clip(pixel_values(src, ys, xs), torch.from_numpy(head))
    write_pixels(dst, ys, xs, radiance * pixel_t + lights * (1.0 - pixel_t))


# ---------------------------------------------------------------------------------------------
# Chest X-ray exposure on the linear fluence I (display model: perturb.ops.radiometry):
# * ``xray_exposure``: detector gain ``2^(+-stops)`` on ``I``.
# * ``xray_heel_effect``: the anode heel gradient ``I (1 - a t^2)`` along the anode-cathode axis.
# * ``xray_under_penetration`` / ``xray_over_penetration``: a tube voltage below / above the
#   technique's. Attenuation coefficients scale roughly as ``kVp^-n`` (``n = KVP_EXPONENT``), so
#   the line integrals become ``m = (kVp/kVp0)^-n`` times larger (``v' = m v``); the quanta
#   reaching the detector change with the transmission and the tube output (``~ kVp^2`` at
#   fixed mAs), and the added quantum noise is the difference between the new and the old
#   noise variance (never negative).
# * ``xray_double_exposure``: the same plate exposed twice with the patient moved in between:
#   the detector adds the fluences ``(I + w I(x - d)) / (1 + w)``.
# ---------------------------------------------------------------------------------------------


def _exposure_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"stops": draw(rng_, level["stops"]) * draw_sign(rng_)}


@register_kernel("xray_exposure", sampler=_exposure_sampler)
def xray_exposure(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Detector gain ``2^stops`` on the linear signal (over- or under-exposure that the
    processing failed to normalise): a display shift of ``-stops ln 2 / MU`` with clipping.

    Kornia: own kernel: no Kornia equivalent (a gain on the linear fluence is a clipped shift of the
    log display value, one elementwise pass)."""
    return scale_linear(x, torch.pow(2.0, per_sample(p["stops"]).double()))


def _heel_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "strength": draw(rng_, level["strength"]),
        "angle": draw(rng_, level["angle"]),
        "anode_top": float(rng_.random() < 0.5),
    }


def heel_gain(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Transmitted fraction ``1 - a t^2`` of the heel effect over ``x``'s pixel grid
    (B,1,H,W, float64)."""
    h, w = x.shape[-2:]
    ys, xs = _coords(x)
    theta = torch.deg2rad(per_sample(p["angle"]).double())
    # unit axis pointing towards the anode: up (-y) or down (+y), tilted by angle
    sign = 1.0 - 2.0 * per_sample(p["anode_top"]).double()
    # in-place steps (the same operations in the same order as written out in the docstring
    # formula, one full-size buffer fewer per step)
    t = (ys * torch.cos(theta) + xs * torch.sin(theta)).mul_(sign)  # projection on the axis
    half = 0.5 * math.hypot(h, w)
    t.div_(half).add_(1.0).div_(2.0).clamp_(0.0, 1.0)
    return (t * per_sample(p["strength"]).double()).mul_(t).neg_().add_(1.0)  # 1 - (a t) t


@register_kernel("xray_heel_effect", sampler=_heel_sampler)
def xray_heel_effect(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Anode heel effect: fluence ``I (1 - a t^2)``, t in [0, 1] from the cathode to the anode
    side along an axis near the image's vertical (the patient's long axis).

    Kornia: own kernel: no Kornia equivalent (an analytic gain field along the anode axis)."""
    return scale_linear(x, heel_gain(x, p))


@backend.register_cpu("xray_heel_effect", dtypes=ALL_DTYPES)
def xray_heel_effect_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    gain = heel_gain(torch.empty(src.shape[-2:]), _host_params(p))
    _apply_shift(src, dst, gain.log_().div_(MU)[0, 0].numpy())


KVP_EXPONENT = 1.2  # effective mu ~ kVp^-n over the diagnostic range (soft tissue and bone mixed)


def _kvp_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"kvp_ratio": draw(rng_, level["kvp_ratio"])}


def penetration(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], stream: str
) -> torch.Tensor:
    """``v' = m v`` with ``m = kvp_ratio^-KVP_EXPONENT``, plus the extra quantum noise: display
    noise std ``1 / (MU sqrt(Q I))`` at full dose with ``Q = N0 ratio^2`` after and ``N0``
    before; the old noise is scaled by ``m`` with the image, the new one is added as the
    gaussian difference ``sqrt(max(s_new^2 - m^2 s_old^2, 0))``."""
    ratio = per_sample(p["kvp_ratio"]).double()
    m = torch.pow(ratio, -KVP_EXPONENT)
    v = _wide(x)
    q_old = FULL_DOSE_QUANTA * (REFERENCE_SIDE / shorter_side(x)) ** 2
    q_new = q_old * ratio * ratio
    v_new = v * m
    var_old = torch.exp(v * MU) / (MU * MU * q_old)
    var_new = torch.exp(v_new * MU) / (MU * MU * q_new)
    extra = (var_new - m * m * var_old).clamp_(min=0.0).sqrt_()
    shape = tuple(x.shape[1:])
    z = backend.by_path(
        x,
        host=lambda: torch.stack([rng.normal_field(k, stream, shape, x.device) for k in keys]),
        device=lambda: keyed_fields.normal_fields(keys, stream, shape, x.device),
    ).double()
    return (v_new + extra * z).clamp_(0.0, 1.0).to(x.dtype)


@register_kernel("xray_under_penetration", sampler=_kvp_sampler)
def xray_under_penetration(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Too low a tube voltage (``kvp_ratio`` < 1): more contrast, white mediastinum, more noise
    behind the dense parts (see ``penetration``).

    Kornia: own kernel: no Kornia equivalent (kVp-scaled attenuation and keyed quantum noise)."""
    return penetration(x, p, keys, "xray_under_penetration/noise")


@register_kernel("xray_over_penetration", sampler=_kvp_sampler)
def xray_over_penetration(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Too high a tube voltage (``kvp_ratio`` > 1): flat, dark, gray film; lower contrast (the
    op claims it); the noise falls, but in the lungs less than the contrast does, so a little is
    added there (see ``penetration``).

    Kornia: own kernel: no Kornia equivalent (kVp-scaled attenuation and keyed quantum noise)."""
    return penetration(x, p, keys, "xray_over_penetration/noise")


def _double_sampler(rng_: np.random.Generator, level: Level) -> Params:
    angle = float(rng_.random()) * 2.0 * math.pi
    return {
        "weight": draw(rng_, level["weight"]),
        "shift": draw(rng_, level["shift"]),
        "angle": angle,
    }


def shifted_clamped(v: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    """``v(x - dx, y - dy)`` with edge replication (the second exposure of the same field)."""
    h, w = v.shape[-2:]
    cols = (torch.arange(w, device=v.device) - dx).clamp_(0, w - 1)
    rows = (torch.arange(h, device=v.device) - dy).clamp_(0, h - 1)
    return v.index_select(-1, cols).index_select(-2, rows)


@register_kernel("xray_double_exposure", sampler=_double_sampler)
def xray_double_exposure(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """The plate integrates two exposures, the second ``weight`` as strong and shifted by
    ``shift`` (fraction of the shorter side) along ``angle``; the processing renormalises the
    sum: ``I' = (I + w I(x - d)) / (1 + w)``.

    Kornia: own kernel, because the second exposure is an integer shift with edge replication (an
    index gather, exact); Kornia's ``translate`` resamples every pixel through ``grid_sample``."""
    side = shorter_side(x)

    def host() -> torch.Tensor:
        out = []
        for i in range(x.shape[0]):
            lin = to_linear(x[i])
            d = float(p["shift"][i]) * side
            a = float(p["angle"][i])
            second = shifted_clamped(lin, round(d * math.cos(a)), round(d * math.sin(a)))
            wgt = float(p["weight"][i])
            out.append(to_display((lin + wgt * second) / (1.0 + wgt), x))
        return torch.stack(out)

    def device() -> torch.Tensor:
        b = x.shape[0]
        h, w = x.shape[-2:]
        lin = to_linear(x)
        d = p["shift"].double() * side
        a = p["angle"].double()
        dx = torch.round(d * torch.cos(a)).to(torch.int64).view(b, 1)
        dy = torch.round(d * torch.sin(a)).to(torch.int64).view(b, 1)
        cols = (torch.arange(w, device=x.device).view(1, w) - dx).clamp_(0, w - 1)
        rows = (torch.arange(h, device=x.device).view(1, h) - dy).clamp_(0, h - 1)
        second = torch.take_along_dim(lin, cols.view(b, 1, 1, w), dim=-1)
        second = torch.take_along_dim(second, rows.view(b, 1, h, 1), dim=-2)
        wgt = per_sample(p["weight"].double())
        return to_display((lin + wgt * second) / (1.0 + wgt), x)

    return backend.by_path(x, host=host, device=device)


_register_lut("xray_exposure", xray_exposure)
