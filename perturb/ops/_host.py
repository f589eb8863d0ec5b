"""Host (NumPy/OpenCV) building blocks of the endoscopy scene ops (glare, smoke, bubbles, fluid,
lens and video artifacts).

These ops are written once, per sample, in float32 NumPy/OpenCV: ``host_op`` registers the
function as the op's CPU path and builds the torch kernel from it (a CUDA batch is copied to the
host, run there and copied back, so CPU and CUDA outputs are identical). Every keyed field is a
counter-based hash of (key, stream, index) (``perturb.rng``), so a sample's output depends on its
own image and key alone. Sizes are fractions of the shorter side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import cv2
import numpy as np
import torch

from perturb import rng
from perturb.ops import backend
from perturb.ops._math import linear_to_srgb_np, srgb_to_linear_np
from perturb.ops.registry import Geometry, Sampler, register_kernel, uniform_sampler

LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
DARK_LEVEL = 0.07  # a channel value below this is dark (the surround of the field of view)


class View:
    """Where an op may act on one frame: ``field`` (bool, H x W) is the field of view (for
    geometry: centre, radius), ``tissue`` (bool) the field minus on-screen overlays (where
    effects are drawn; of a text line over the tissue only its glyph strokes are excluded). Taken from the engine's ``perturb.scene.Scene`` when there is one, else
    estimated from the pixels (``tissue_mask``); computed on first use."""

    def __init__(self, img: np.ndarray, scene: Any | None = None) -> None:
        self._img = img
        self._scene = scene if scene is not None and tuple(scene.size) == tuple(img.shape[-2:]) else None

    @cached_property
    def field(self) -> np.ndarray:
        if self._scene is None:
            return tissue_mask(self._img)
        return np.asarray(self._scene.field) > 0.5

    @cached_property
    def tissue(self) -> np.ndarray:
        if self._scene is None:
            return self.field
        from perturb.scene.masks import overlay_of  # text lines: their glyph strokes alone

        return self.field & ~overlay_of(self._scene.descriptor, self._img)


SampleFn = Callable[[np.ndarray, dict[str, np.ndarray], int, View], np.ndarray]


def host_op(
    name: str,
    sampler: Sampler = uniform_sampler,
    *,
    geometry: Geometry | None = None,
    dtypes: Sequence[type] = (np.float32,),
) -> Callable[[SampleFn], SampleFn]:
    """Register ``fn(img, params, key, view) -> out`` (CHW float32 in [0, 1] in and out, one
    sample) as op ``name``: its CPU path and its torch kernel (the same host function on every
    device: a CUDA batch is copied to the host and back). Both take the engine's scenes.
    ``dtypes``: the batch dtypes the CPU path takes (float32, and uint8 where listed: a uint8
    sample is read and rounded back per sample as the engine converts a batch; other integer
    batches take the torch kernel). ``geometry``: how the op moves coordinates
    (``perturb.ops.registry.Geometry``), for a geometric op."""

    def decorator(fn: SampleFn) -> SampleFn:
        @backend.register_cpu(name, dtypes=dtypes, uses_scene=True)
        def cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None) -> None:
            img = np.ascontiguousarray(backend.load_float(src), dtype=np.float32)
            res = fn(img, p, key, View(img, scene))
            if dst.dtype == np.float32:
                np.clip(res, np.float32(0.0), np.float32(1.0), out=dst)
            else:
                backend.store_float(np.clip(res, np.float32(0.0), np.float32(1.0)), dst)

        @register_kernel(name, sampler=sampler, uses_scene=True, geometry=geometry)
        def kernel(
            x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None = None
        ) -> torch.Tensor:
            src = x.detach().to("cpu", torch.float32).contiguous().numpy()
            dst = np.empty_like(src)
            host = {k: v.detach().cpu().numpy() for k, v in p.items()}
            per_sample = list(scenes) if scenes is not None else [None] * len(src)

            def work(i: int) -> None:
                cpu(src[i], dst[i], {k: v[i] for k, v in host.items()}, int(keys[i]), scene=per_sample[i])

            backend.map_samples(work, len(src))
            return torch.from_numpy(dst).to(x.device)

        kernel.__doc__ = fn.__doc__
        return fn

    return decorator


# ---------------------------------------------------------------------------------------------
# Image helpers


def luma(img: np.ndarray) -> np.ndarray:
    """Rec. 601 luma (H, W) of a CHW image (the plane itself for one channel)."""
    if img.shape[0] == 1:
        return img[0].copy()
    return (img[0] * LUMA[0] + img[1] * LUMA[1] + img[2] * LUMA[2]).astype(np.float32)


def side(img: np.ndarray) -> int:
    return int(min(img.shape[-2], img.shape[-1]))


def gauss(plane: np.ndarray, sigma_px: float) -> np.ndarray:
    """Gaussian blur of an (H, W) or (H, W, C) float32 array, reflected borders; large sigmas run
    on a downscaled copy (a smooth field loses nothing)."""
    if sigma_px < 0.3:
        return plane.copy()
    h, w = plane.shape[:2]
    factor = int(max(1, sigma_px // 6))
    if factor > 1:
        small = cv2.resize(plane, (max(1, w // factor), max(1, h // factor)), interpolation=cv2.INTER_AREA)
        res = cv2.GaussianBlur(small, (0, 0), sigma_px / factor, borderType=cv2.BORDER_REFLECT_101)
        return cv2.resize(res, (w, h), interpolation=cv2.INTER_LINEAR)
    return cv2.GaussianBlur(plane, (0, 0), sigma_px, borderType=cv2.BORDER_REFLECT_101)


def per_channel(img: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    return np.stack([fn(np.ascontiguousarray(c)) for c in img]).astype(np.float32)


def to_linear(img: np.ndarray) -> np.ndarray:
    return srgb_to_linear_np(np.ascontiguousarray(img, dtype=np.float32))


def to_display(lin: np.ndarray) -> np.ndarray:
    return linear_to_srgb_np(np.ascontiguousarray(lin, dtype=np.float32))


def dark_frame(img: np.ndarray, threshold: float = DARK_LEVEL) -> np.ndarray:
    """Bool (H, W): the endoscope's dark frame: pixels darker than ``threshold`` in every
    channel reached by a straight dark run from an image edge."""
    dark = (img.max(axis=0) < threshold).astype(np.uint8)
    left = np.minimum.accumulate(dark, axis=1)
    right = np.minimum.accumulate(dark[:, ::-1], axis=1)[:, ::-1]
    top = np.minimum.accumulate(dark, axis=0)
    bottom = np.minimum.accumulate(dark[::-1], axis=0)[::-1]
    return (left | right | top | bottom).astype(bool)


def tissue_mask(img: np.ndarray) -> np.ndarray:
    """Bool (H, W): the tissue seen through the optics, estimated from the pixels when the
    engine gives no scene (``perturb.scene`` is the reference model). The frame's level is read on the image's
    outer rows and columns (some processors draw a dark grey, noisy surround); pixels up to 0.06
    above it that reach an image edge are frame; of the rest, after an opening that cuts thin
    links, the largest connected region is the field (burned-in text, icons and boxes drawn on
    the frame are separate regions and left out)."""
    peak = img.max(axis=0)
    edges = np.concatenate([peak[0], peak[-1], peak[:, 0], peak[:, -1]])
    threshold = max(DARK_LEVEL, float(np.median(edges)) + 0.06)
    field = (~dark_frame(img, threshold)).astype(np.uint8)
    radius = max(1, min(img.shape[-2:]) // 200)
    disk = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
    opened = cv2.morphologyEx(field, cv2.MORPH_OPEN, disk)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(opened, connectivity=8)
    if n <= 1:
        return np.ones(img.shape[-2:], dtype=bool)
    return labels == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))


def soft_mask(mask: np.ndarray, inset_px: float) -> np.ndarray:
    """float32 (H, W) in [0, 1]: ``mask`` shrunk by ``inset_px`` with a smooth ramp of that width
    (effects fade out before the field's edge)."""
    if inset_px < 1.0:
        return mask.astype(np.float32)
    dist = cv2.distanceTransform(mask.astype(np.uint8), cv2.DIST_L2, 3)
    return np.clip(dist / np.float32(inset_px) - 1.0, 0.0, 1.0).astype(np.float32)


def field_geometry(mask: np.ndarray) -> tuple[float, float, float]:
    """(cx, cy, radius) in pixels of the field of view: centroid and the radius of a disk of the
    same area."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        h, w = mask.shape
        return w / 2.0, h / 2.0, min(h, w) / 2.0
    return float(xs.mean()) + 0.5, float(ys.mean()) + 0.5, math.sqrt(len(xs) / math.pi)


# ---------------------------------------------------------------------------------------------
# Keyed fields


def value_noise(key: int, stream: str, h: int, w: int, cell_px: float) -> np.ndarray:
    """Smooth keyed noise (H, W) in about [-1, 1]: uniform values on a grid of ``cell_px`` cells
    (at least 2x2) interpolated bicubically."""
    cell = max(cell_px, 1.0)
    gh, gw = max(2, math.ceil(h / cell) + 1), max(2, math.ceil(w / cell) + 1)
    coarse = rng.uniform_numpy(key, stream, gh * gw).reshape(gh, gw) * np.float32(2.0) - np.float32(1.0)
    # the grid covers the image with a margin of one cell; sample at pixel centres
    big = cv2.resize(coarse, (round(gw * cell), round(gh * cell)), interpolation=cv2.INTER_CUBIC)
    return np.ascontiguousarray(big[:h, :w], dtype=np.float32)


def fractal_noise(key: int, stream: str, h: int, w: int, cell_px: float, octaves: int, gain: float = 0.5) -> np.ndarray:
    """Sum of ``octaves`` value-noise layers, cells halving and amplitude times ``gain`` per
    octave, normalised to about [-1, 1] (turbulent structure of smoke and foam)."""
    total = np.zeros((h, w), dtype=np.float32)
    norm = 0.0
    amp = 1.0
    for o in range(octaves):
        total += np.float32(amp) * value_noise(key, f"{stream}/{o}", h, w, cell_px / 2**o)
        norm += amp
        amp *= gain
    return total / np.float32(norm)


def sample_bilinear(img: np.ndarray, map_x: np.ndarray, map_y: np.ndarray, border: int = cv2.BORDER_REFLECT_101) -> np.ndarray:
    """CHW image read at float32 pixel-index positions (H, W), bilinear."""
    return np.stack(
        [cv2.remap(np.ascontiguousarray(c), map_x, map_y, cv2.INTER_LINEAR, borderMode=border) for c in img]
    ).astype(np.float32)
