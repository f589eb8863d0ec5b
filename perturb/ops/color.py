"""Colour and tone: light-source cast, hue, saturation, brightness, contrast, gamma.

* color_cast: a light-source / white-balance error of the video processor (the scope's lamp
  aged or swapped, xenon vs LED vs halogen, white balance not redone): von Kries per-channel
  gains in linear light. The gains lie at distance ``strength`` from grey in the chromatic plane,
  along the warm-cool axis that a wrong colour temperature moves them on (amber: red up, blue
  down; or blue: the reverse; a keyed sign) give or take ``CAST_TINT`` degrees of green-magenta,
  normalised so a grey surface keeps its Rec. 709 luminance: gains stay within about 0.5-1.7,
  the red/blue ratio of a halogen lamp (about 3200 K) under a xenon white balance (about 6000 K)
  or the reverse. Highlights the sensor clipped carry no colour: the
  processor shows them white whatever its gains, so pixels near clipping in every channel roll
  back to their input (``highlight_weight``) instead of turning cyan or yellow.
* hue_shift: a processor's hue (tint) control mis-set: rotation of the chroma plane of YIQ by
  ``degrees`` (keyed sign), as an NTSC-style tint control does, bounded to +-12.5 degrees so the
  mucosa stays between orange and pink (larger rotations make olive or magenta tissue that no
  light source or processor setting produces). Grey and clipped white have no chroma and stay.
* saturation: ``luma + s * (x - luma)``, s = 1 - amount (desaturate) or 1 + amount (keyed).
* brightness: additive offset (keyed sign); contrast: scaling around the image's mean luma;
  gamma: ``x ** exp(±log_gamma)``.

Torch path and Kornia: brightness runs on ``kornia.enhance.adjust_brightness`` (identical),
gamma on ``kornia.enhance.adjust_gamma``. The others keep their own torch kernels because Kornia
computes something else: its ``adjust_hue`` / ``adjust_saturation`` work in HSV (ours rotate
YIQ chroma and mix with Rec. 601 luma, as the OpenCV path's 3x3 ``cv2.transform``), its
``adjust_contrast`` scales around 0 (ours around the tissue's mean luma). color_cast's sRGB
decode/encode on a CPU device is ``perturb.ops._math.srgb_to_linear_lut`` / ``linear_to_srgb_lut``
(float32 interpolation in 4096-node tables of the float64 curve: batch-independent, within 2e-5);
on CUDA Kornia's float32 formula. The CPU path's uint8 tables stay built from the float64 curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import (
    LEVELS_U8,
    LUMA_REC601,
    apply_luts,
    gain_in_linear_u8,
    linear_to_srgb_lut,
    linear_to_srgb_np,
    luma,
    lut_u8,
    per_sample,
    plane2d,
    power,
    sample_mean,
    scratch,
    split_into,
    srgb_to_linear,
    srgb_to_linear_lut,
    srgb_to_linear_np,
)
from perturb.ops.exposure import (
    above_clip,
    clipped_pixels,
    highlight_headroom,
    pixel_values,
    write_pixels,
)
from perturb.ops.kernels import Level, Params, draw, draw_sign, register_kernel

_LUMINANCE_709 = np.array([0.2126, 0.7152, 0.0722])


def cast_gains(strength: float, angle: float) -> list[float]:
    """Per-channel gains: a point at ``strength`` and ``angle`` on the chromatic plane, scaled
    so luminance (Rec. 709) is unchanged."""
    e1 = np.array([2.0, -1.0, -1.0]) / math.sqrt(6.0)
    e2 = np.array([0.0, 1.0, -1.0]) / math.sqrt(2.0)
    gains = 1.0 + strength * (math.cos(angle) * e1 + math.sin(angle) * e2)
    gains = gains / float(_LUMINANCE_709 @ gains)
    return [float(g) for g in gains]


CAST_WARM = math.radians(30.0)  # chroma-plane angle of gains (1 + a, 1, 1 - a): amber
CAST_TINT = 20.0  # degrees of green-magenta spread around the warm-cool axis
HIGHLIGHT = (0.90, 0.98)  # display level of the darkest channel where clipped highlights begin, end


def _cast_sampler(rng: np.random.Generator, level: Level) -> Params:
    strength = draw(rng, level["strength"])
    axis = CAST_WARM if rng.random() < 0.5 else CAST_WARM + math.pi
    angle = axis + math.radians(float(rng.uniform(-CAST_TINT, CAST_TINT)))
    return {"strength": strength, "angle": angle, "gains": cast_gains(strength, angle)}


def highlight_weight(x: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) weight of the input kept where the sensor clipped: 0 below ``HIGHLIGHT[0]``
    in the darkest channel, 1 above ``HIGHLIGHT[1]``, linear between."""
    lo, hi = HIGHLIGHT
    return ((x.amin(dim=1, keepdim=True) - lo) / (hi - lo)).clamp(0.0, 1.0)


@register_kernel("color_cast", sampler=_cast_sampler)
def color_cast(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: ``kornia.color.rgb_to_linear_rgb`` / ``linear_rgb_to_rgb`` on CUDA (through
    ``perturb.ops._math``; on a CPU device its float32 tables, ``srgb_to_linear_lut``); the
    per-channel gain is one multiply; clipped highlights stay white (``highlight_weight``)."""
    gains = p["gains"].view(-1, 3, 1, 1)
    cast = linear_to_srgb_lut(srgb_to_linear_lut(x).mul_(gains))
    if x.device.type != "cpu" or _recorded(x):
        out = torch.sub(x, cast).mul_(highlight_weight(x))
        return out.add_(cast)  # cast + (x - cast) w, in place
    # on the CPU the roll-back at the pixels whose weight is positive alone (a few per frame):
    # elsewhere cast + (x - cast) 0 is cast itself, so the bytes are the same
    lo, hi = HIGHLIGHT
    darkest = x.amin(dim=1, keepdim=True)
    near = (darkest > lo).expand_as(x)
    weight = ((darkest - lo) / (hi - lo)).clamp_(0.0, 1.0).expand_as(x)
    picked = cast[near]
    cast[near] = (x[near] - picked).mul_(weight[near]).add_(picked)
    return cast


def yiq_hue_matrix(degrees: float) -> np.ndarray:
    """3x3 RGB->RGB matrix rotating hue by ``degrees`` in YIQ."""
    to_yiq = np.array(
        [[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]]
    )
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    rot = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])
    return np.linalg.inv(to_yiq) @ rot @ to_yiq


def _mix(x: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """Per-sample 3x3 colour matrix (B,3,3) applied to BCHW."""
    m = matrices.view(-1, 3, 3, 1, 1)
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    # (m0 r + m1 g) + m2 b, the sums in place (a batch-sized temporary per term and per sum
    # made B=32 slower per sample than B=1)
    out = m[:, :, 0] * r
    out += m[:, :, 1] * g
    out += m[:, :, 2] * b
    return out.clamp_(0.0, 1.0)


def _hue_sampler(rng: np.random.Generator, level: Level) -> Params:
    degrees = draw(rng, level["degrees"]) * draw_sign(rng)
    return {"degrees": degrees, "matrix": yiq_hue_matrix(degrees).tolist()}


@register_kernel("hue_shift", sampler=_hue_sampler)
def hue_shift(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: own kernel, because Kornia's ``adjust_hue`` rotates the hue in HSV (hexcone) while
    this op rotates the YIQ chroma plane (one 3x3 matrix, the OpenCV path's ``cv2.transform``):
    a different image, not a rounding difference."""
    return _mix(x, p["matrix"].view(-1, 3, 3))


def _saturation_sampler(rng: np.random.Generator, level: Level) -> Params:
    amount = draw(rng, level["amount"])
    factor = 1.0 - amount if rng.random() < 0.5 else 1.0 + amount
    return {"amount": amount, "factor": factor}


@register_kernel("saturation", sampler=_saturation_sampler)
def saturation(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """``luma + factor (x - luma)`` with Rec. 601 luma, clipped.

    Kornia: own kernel, because ``adjust_saturation_with_gray_subtraction`` allocates a new
    batch per operation; this writes the same blend (``(1 - factor) luma + factor x`` with
    Rec. 601 grey via ``kornia.color.rgb_to_grayscale``, bit for bit; a 1-channel batch is
    returned unchanged) into one output batch in place."""
    if x.shape[1] == 1:
        return x
    factor = per_sample(p["factor"].to(x.dtype))
    grey = luma(x)
    grey *= 1.0 - factor  # luma(x) of an RGB batch is a new tensor
    out = torch.mul(factor, x)
    out += grey  # (1 - f) luma + f x: the same sum, added in the other order
    return out.clamp_(0.0, 1.0)


def _brightness_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"delta": draw(rng, level["delta"]) * draw_sign(rng)}


@register_kernel("brightness", sampler=_brightness_sampler)
def brightness(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: ``kornia.enhance.adjust_brightness`` (the same sum and clip, bit for bit)."""
    import kornia  # lazily: only the torch path needs it

    return kornia.enhance.adjust_brightness(x, p["delta"].to(x.dtype))


def tissue_weight(scene: Any) -> np.ndarray | None:
    """The tissue alpha (H, W) of a sample's scene (field of view minus overlays), or None for
    the whole image. A scene whose tissue is empty counts as absent."""
    if scene is None:
        return None
    from perturb.scene.masks import tissue_alpha, tissue_alpha_sum

    key = getattr(scene, "key", None)  # the descriptor's canonical text, where the scene keeps it
    # the alpha lies in [0, 1]: its (cached) sum is positive exactly where its maximum is
    if tissue_alpha_sum(scene.descriptor, key) > 0.0:
        return tissue_alpha(scene.descriptor, key)
    return None


@register_kernel("contrast", uses_scene=True)
def contrast(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Scale around the mean luma of the tissue (field of view minus overlays, from the scene;
    the whole image without one). Clipped highlights enter with their headroom above the clip
    (``perturb.ops.exposure``): lowering the contrast leaves them white, as on a real scope.

    Kornia: own kernel, because Kornia's ``adjust_contrast`` scales around 0 and
    ``adjust_contrast_with_mean_subtraction`` around the whole image's mean grey; this op scales
    around the mean luma of the tissue (the scene's field of view minus overlays)."""
    y = luma(x)
    weights = [tissue_weight(s) for s in scenes] if scenes is not None else []
    if all(w is None for w in weights):
        mean = sample_mean(y)
    else:  # the tissue alphas as one (B,1,H,W) weight, all ones for a sample without one
        ones = np.ones(y.shape[-2:], dtype=np.float32)
        stacked = np.stack([ones if w is None else w for w in weights])
        mean = tissue_mean(y, torch.from_numpy(stacked).unsqueeze(1).to(x.device))
    radiance = _radiance(x, highlight_headroom(x))
    factor = per_sample(p["factor"])
    if _recorded(x):
        return (mean + factor * (radiance - mean)).clamp_(0.0, 1.0)
    # mean + factor (radiance - mean), in place on the batch ``_radiance`` made
    return radiance.sub_(mean).mul_(factor).add_(mean).clamp_(0.0, 1.0)


def _recorded(x: torch.Tensor) -> bool:
    """Whether autograd records operations on ``x`` (then no in-place steps)."""
    return torch.is_grad_enabled() and x.requires_grad


def _radiance(x: torch.Tensor, headroom: torch.Tensor) -> torch.Tensor:
    """``above_clip(x, headroom)`` for the contrast kernel: on a CPU device (no autograd) the
    curve is evaluated at the clipped pixels alone (``headroom > 1``, a few per frame), in
    float64 rounded once (``power``), instead of decoding the whole batch in float64."""
    if x.device.type != "cpu" or _recorded(x):
        return above_clip(x, headroom)
    mask = (headroom > 1.0).expand_as(x)
    out = x.clone()
    lin = srgb_to_linear(x[mask]).mul_(headroom.expand_as(x)[mask])
    out[mask] = power(lin, 1.0 / 2.4).mul_(1.055).sub_(0.055)
    return out


def tissue_mean(y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B,1,1,1) mean of the luma ``y`` (B,1,H,W) weighted by ``weight`` (B,1,H,W): float64
    sums of ``y * weight`` and of the weights over each sample, rounded to ``y``'s dtype (the
    sums of the CPU path's ``tissue_mean_luma``; a weight of ones gives the plain mean)."""
    w = weight.double()
    total = (y.double() * w).sum(dim=(1, 2, 3), keepdim=True)
    return (total / w.sum(dim=(1, 2, 3), keepdim=True)).to(y.dtype)


def _gamma_sampler(rng: np.random.Generator, level: Level) -> Params:
    log_gamma = draw(rng, level["log_gamma"]) * draw_sign(rng)
    return {"log_gamma": log_gamma, "gamma": math.exp(log_gamma)}


@register_kernel("gamma", sampler=_gamma_sampler)
def gamma(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: own kernel, because ``adjust_gamma`` adds a gain multiply and a second clip that
    change nothing here (a power of [0, 1] with a positive exponent stays in [0, 1]), each a new
    batch: this is its float32 pow with gain 1, bit for bit, in place on one clipped copy (the
    CPU path's uint8 tables use float64 pow, and no level rounds differently over gammas 0.5-2)."""
    return x.clamp(0.0, 1.0).pow_(per_sample(p["gamma"].to(x.dtype)))


# ---------------------------------------------------------------------------------------------
# CPU fast paths (one sample). uint8: lookup tables built from the torch kernels on the 256
# levels (exact) or OpenCV's 3x3 transform; float32: float32 NumPy/OpenCV arithmetic.


def _mean_luma(src: np.ndarray) -> np.float32:
    """Mean Rec. 601 luma of one CHW sample in [0, 1] (per-channel sums in float64)."""
    scale = 255.0 if src.dtype == np.uint8 else 1.0
    sums = [cv2.sumElems(src[c])[0] for c in range(src.shape[0])]
    total = sums[0] if len(sums) == 1 else float(np.dot(LUMA_REC601, sums))
    return np.float32(total / (src.shape[-2] * src.shape[-1]) / scale)


@backend.register_cpu("color_cast")
def color_cast_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    gains = np.asarray(p["gains"], dtype=np.float32)
    lo, hi = HIGHLIGHT
    if src.dtype == np.uint8:
        gain_in_linear_u8(src, dst, [float(g) for g in gains])
        # pixels near clipping (few): the float formula with the roll-back to the input
        near = src.min(axis=0) > int(lo * 255)
        if near.any():
            x = src[:, near].astype(np.float32)[:, None, :] / np.float32(255.0)
            res = _cast_float(np.ascontiguousarray(x), gains, lo, hi)
            dst[:, near] = np.clip(np.rint(res[:, 0, :] * np.float32(255.0)), 0, 255)
        return
    dst[...] = _cast_float(src, gains, lo, hi)


def _cast_float(x: np.ndarray, gains: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """float32 ``color_cast`` of a (3, H, W) sample: gains in linear light, clipped highlights
    rolled back to the input."""
    lin = srgb_to_linear_np(x)
    for c, gain in enumerate(gains):
        lin[c] *= gain
    cast = linear_to_srgb_np(lin)
    weight = np.clip((x.min(axis=0) - np.float32(lo)) / np.float32(hi - lo), 0.0, 1.0)
    return cast + (x - cast) * weight[None]


def _transform(src: np.ndarray, dst: np.ndarray, matrix: np.ndarray) -> None:
    """dst = clip(matrix @ rgb) per pixel with OpenCV's 3x3 transform (uint8: rounded and
    saturated; float32: clipped to [0, 1]), merged to HWC and split back into ``dst``'s planes."""
    m = np.asarray(matrix, dtype=np.float32).reshape(3, 3)
    hwc = (*src.shape[1:], 3)
    merged = cv2.merge([src[0], src[1], src[2]], dst=scratch("transform_in", hwc, src.dtype))
    mixed = cv2.transform(merged, m, dst=scratch("transform_out", hwc, src.dtype))
    if dst.dtype != np.uint8:
        np.clip(mixed, np.float32(0.0), np.float32(1.0), out=mixed)
    split_into(mixed, dst)


@backend.register_cpu("hue_shift")
def hue_shift_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    _transform(src, dst, p["matrix"])


def _saturation_matrix(p: dict[str, np.ndarray]) -> np.ndarray:
    """The 3x3 matrix ``saturation_cpu`` applies (float32): ``f I + (1 - f)`` luma weights."""
    f = float(np.float32(p["factor"]))
    weights = np.array(LUMA_REC601)
    return np.asarray((1.0 - f) * np.tile(weights, (3, 1)) + f * np.eye(3), dtype=np.float32)


@backend.register_cpu("saturation")
def saturation_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    _transform(src, dst, _saturation_matrix(p))


def _u8_table(values: np.ndarray) -> np.ndarray:
    """float32 results on the 256 levels rounded as the engine rounds (half to even)."""
    return np.clip(np.rint(values * np.float32(255.0)), 0, 255).astype(np.uint8)


@lru_cache(maxsize=1024)
def _brightness_table(delta: float) -> np.ndarray:
    """The kernel's float32 arithmetic on the 256 levels, rounded: the uint8 table."""
    levels = LEVELS_U8 + np.float32(delta)
    np.minimum(levels, np.float32(1.0), out=levels)
    np.maximum(levels, np.float32(0.0), out=levels)
    levels *= np.float32(255.0)
    table = np.rint(levels, out=levels).astype(np.uint8)  # in [0, 255]: no clip
    table.flags.writeable = False
    return table


@backend.register_cpu("brightness")
def brightness_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    if src.dtype == np.uint8:
        table = _brightness_table(float(np.float32(p["delta"])))
        offset = int(table[128]) - 128
        if np.array_equal(table, np.clip(np.arange(256) + offset, 0, 255)):
            # a saturated integer offset (all but measure-zero deltas): cv2.add
            if offset >= 0:
                cv2.add(plane2d(src), offset, dst=plane2d(dst))  # type: ignore[call-overload]
            else:
                cv2.subtract(plane2d(src), -offset, dst=plane2d(dst))  # type: ignore[call-overload]
            return
        lut_u8(src, dst, table)
        return
    np.add(src, np.float32(p["delta"]), out=dst)
    np.clip(dst, np.float32(0.0), np.float32(1.0), out=dst)


def _luma_u8(src: np.ndarray) -> np.ndarray:
    """float32 (H, W): the kernel's luma ``w0 L[r] + w1 L[g] + w2 L[b]`` of a uint8 CHW sample
    (``L`` the engine's float32 levels), each product looked up in a float32 table (OpenCV LUT),
    the sums in the kernel's order: the same values as converting the sample first. RGB: a
    per-thread buffer, valid until the thread's next call."""
    lv = backend.levels(np.dtype(np.uint8))
    if src.shape[0] == 1:
        return np.asarray(cv2.LUT(src[0], lv))
    t0, t1, t2 = (np.ascontiguousarray(lv * np.float32(w)) for w in LUMA_REC601)
    y = scratch("luma_u8", src.shape[1:], np.float32)  # per-thread buffers: no page faults
    part = scratch("luma_u8_part", src.shape[1:], np.float32)
    cv2.LUT(src[0], t0, dst=y)
    np.add(y, cv2.LUT(src[1], t1, dst=part), out=y)
    np.add(y, cv2.LUT(src[2], t2, dst=part), out=y)
    return y


def tissue_weight_sum(desc: dict[str, Any]) -> float:
    """float64 sum of the tissue alpha of ``desc`` (cached)."""
    from perturb.scene.masks import tissue_alpha_sum

    return tissue_alpha_sum(desc)


def tissue_mean_luma(src: np.ndarray, scene: Any, weight: np.ndarray) -> np.float32:
    """float32 mean of the kernel's luma of ``src`` (CHW) weighted by the tissue alpha
    ``weight`` of ``scene``: a float64 sum of ``y * weight`` over the frame, over the float64 sum
    of the weights."""
    if src.dtype == np.uint8:  # the same float32 products, read from 256-entry tables
        y = _luma_u8(src)
    else:
        f = backend.load_float(src)
        y = (
            f[0]
            if f.shape[0] == 1
            else f[0] * np.float32(LUMA_REC601[0]) + f[1] * np.float32(LUMA_REC601[1])
        )
        if f.shape[0] == 3:
            y = y + f[2] * np.float32(LUMA_REC601[2])
    # (y64 * weight).sum(), one pass fewer, into a reused buffer (the same pairwise sum)
    product = scratch("contrast_product", y.shape, np.float64)
    total = float(np.multiply(y, weight, out=product, dtype=np.float64).sum())
    return np.float32(total / tissue_weight_sum(scene.descriptor))


def _contrast_mean(src: np.ndarray, scene: Any) -> np.float32:
    """The kernel's mean luma of a sample: of the whole frame, or weighted by the tissue."""
    weight = None if scene is None else tissue_weight(scene)
    return _mean_luma(src) if weight is None else tissue_mean_luma(src, scene, weight)


def _contrast_affine(
    src: np.ndarray, p: dict[str, np.ndarray], scene: Any, mean: np.float32 | None = None
) -> tuple[float, float]:
    """(factor, offset) of round(255 * (mean + factor * (x / 255 - mean))) = round(factor * x +
    255 mean (1 - factor)) on uint8 levels (within float rounding of the kernel's value);
    ``mean``: the sample's mean where the caller already has it."""
    factor = float(np.float32(p["factor"]))
    mean = _contrast_mean(src, scene) if mean is None else mean
    return factor, float(np.float32(255.0) * mean) * (1.0 - factor)


@backend.register_cpu("contrast", uses_scene=True)
def contrast_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    mean = _contrast_mean(src, scene)
    if src.dtype == np.uint8:
        factor, offset = _contrast_affine(src, p, scene, mean)
        cv2.convertScaleAbs(plane2d(src), plane2d(dst), alpha=factor, beta=offset)
    else:
        np.subtract(src, mean, out=dst)
        dst *= np.float32(p["factor"])
        dst += mean
        np.clip(dst, np.float32(0.0), np.float32(1.0), out=dst)
    found = clipped_pixels(src)
    if found is not None:  # clipped highlights with their headroom above the clip
        ys, xs, head = found
        radiance = above_clip(pixel_values(src, ys, xs), torch.from_numpy(head))
        mean_t = torch.tensor(mean, dtype=torch.float32)
        factor_t = torch.tensor(np.float32(p["factor"]))
        write_pixels(dst, ys, xs, mean_t + factor_t * (radiance - mean_t))


@lru_cache(maxsize=1024)
def _gamma_table(gamma: float) -> np.ndarray:
    """The kernel's float64 power on the 256 levels, rounded: the uint8 table."""
    table = _u8_table((LEVELS_U8.astype(np.float64) ** gamma).astype(np.float32))
    table.flags.writeable = False
    return table


@backend.register_cpu("gamma")
def gamma_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    if src.dtype == np.uint8:
        apply_luts(src, dst, _gamma_table(float(np.float32(p["gamma"]))))
        return
    cv2.pow(plane2d(src), float(np.float32(p["gamma"])), dst=plane2d(dst))
