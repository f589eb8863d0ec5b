"""Host (NumPy/OpenCV) building blocks of the endoscopy scene ops (glare, smoke, bubbles, fluid,
lens and video artifacts).

These ops are written once per sample in float32 NumPy/OpenCV: ``host_op`` registers that
function as the op's CPU path (its bytes are what the golden digests pin). The torch kernel is
a batched computation of the same model (``host_op(device=...)``, listed in ``DEVICE_KERNELS``),
built from the torch blocks at the end of this module, which reproduce the host helpers on a
whole batch: the View as (B, 1, H, W) masks (``view_masks``: from the engine's scenes, else the
pixel estimate ``estimate_tissue``), OpenCV's remap (``remap``), blur and resizes as per-axis
matrices (``gauss_t``, ``value_noise_t``), chamfer distances, connected components and masked
quantiles. An op without one still runs its host function as the torch kernel (a CUDA batch is
copied to the host and back). Every keyed field is a counter-based hash of (key, stream, index)
(``perturb.rng``; ``perturb.ops.keyed_fields`` for a batch of keys), so a sample's output
depends on its own image and key alone. Sizes are fractions of the shorter side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property, lru_cache
from typing import Any, Literal

import cv2
import numpy as np
import torch

from perturb import rng
from perturb.ops import backend, exact, keyed_fields
from perturb.ops._math import linear_to_srgb_np, srgb_to_linear_np
from perturb.ops.kernels import Geometry, Sampler, register_kernel, uniform_sampler

LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
DARK_LEVEL = 0.07  # a channel value below this is dark (the surround of the field of view)


class View:
    """Where an op may act on one frame: ``field`` (bool, H x W) is the field of view (for
    geometry: centre, radius), ``tissue`` (bool) the field minus on-screen overlays (where
    effects are drawn; of a text line over the tissue only its glyph strokes are excluded). Taken from the engine's ``perturb.scene.Scene`` when there is one, else
    estimated from the pixels (``tissue_mask``); computed on first use."""

    def __init__(self, img: np.ndarray, scene: Any | None = None) -> None:
        self._img = img
        self._scene = (
            scene if scene is not None and tuple(scene.size) == tuple(img.shape[-2:]) else None
        )

    @property
    def scene(self) -> Any | None:
        """The engine's scene of this frame (None: the masks are estimated from the pixels)."""
        return self._scene

    @property
    def has_scene(self) -> bool:
        """Whether the engine gave this frame's scene (its tissue layer: a border-protecting
        record), not an estimate from the pixels."""
        return self._scene is not None

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


DeviceKernel = Callable[
    [torch.Tensor, dict[str, torch.Tensor], Sequence[int], Sequence[Any] | None], torch.Tensor
]
# ops whose torch kernel is a batched computation of the model (the others run their host function)
DEVICE_KERNELS: set[str] = set()


def host_op(
    name: str,
    sampler: Sampler = uniform_sampler,
    *,
    geometry: Geometry | None = None,
    dtypes: Sequence[type] = (np.float32,),
    device: DeviceKernel | None = None,
) -> Callable[[SampleFn], SampleFn]:
    """Register ``fn(img, params, key, view) -> out`` (CHW float32 in [0, 1] in and out, one
    sample) as op ``name``'s CPU path, and its torch kernel: ``device(x, params, keys, scenes)``
    (one batched computation of the same model) where given, else the host function itself (a
    CUDA batch is copied to the host and back). Both take the engine's scenes.
    ``dtypes``: the batch dtypes the CPU path takes (float32, and uint8 where listed: a uint8
    sample is read and rounded back per sample as the engine converts a batch; other integer
    batches take the torch kernel). ``geometry``: how the op moves coordinates
    (``perturb.ops.kernels.Geometry``), for a geometric op."""

    def decorator(fn: SampleFn) -> SampleFn:
        @backend.register_cpu(name, dtypes=dtypes, uses_scene=True)
        def cpu(
            src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
        ) -> None:
            img = np.ascontiguousarray(backend.load_float(src), dtype=np.float32)
            res = fn(img, p, key, View(img, scene))
            if dst.dtype == np.float32:
                np.clip(res, np.float32(0.0), np.float32(1.0), out=dst)
            elif dst.dtype == np.uint8 and res.dtype == np.float32 and res.shape == dst.shape:
                # store_float clips below 0 and saturates above 255: the clip to [0, 1] first
                # would be one more pass over the sample for the same bytes
                backend.store_float(res, dst)
            else:
                backend.store_float(np.clip(res, np.float32(0.0), np.float32(1.0)), dst)

        if device is not None:

            def batched(
                x: torch.Tensor,
                p: dict[str, torch.Tensor],
                keys: Sequence[int],
                scenes: Sequence[Any] | None = None,
            ) -> torch.Tensor:
                return device(x, p, keys, scenes)

            batched.__doc__ = fn.__doc__
            register_kernel(name, sampler=sampler, uses_scene=True, geometry=geometry)(batched)
            DEVICE_KERNELS.add(name)
            return fn

        @register_kernel(name, sampler=sampler, uses_scene=True, geometry=geometry)
        def kernel(
            x: torch.Tensor,
            p: dict[str, torch.Tensor],
            keys: Sequence[int],
            scenes: Sequence[Any] | None = None,
        ) -> torch.Tensor:
            src = x.detach().to("cpu", torch.float32).contiguous().numpy()
            dst = np.empty_like(src)
            host = {k: v.detach().cpu().numpy() for k, v in p.items()}
            per_sample = list(scenes) if scenes is not None else [None] * len(src)

            def work(i: int) -> None:
                cpu(
                    src[i],
                    dst[i],
                    {k: v[i] for k, v in host.items()},
                    int(keys[i]),
                    scene=per_sample[i],
                )

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
        small = cv2.resize(
            plane, (max(1, w // factor), max(1, h // factor)), interpolation=cv2.INTER_AREA
        )
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
    return dark_runs_from_edges(img.max(axis=0) < threshold)


def dark_runs_from_edges(dark: np.ndarray) -> np.ndarray:
    """Bool (H, W): the pixels of ``dark`` joined to an image edge by a straight run of dark
    pixels along their row or column: before a row's first lit pixel or after its last, above
    a column's first or below its last (found by ``argmax``, one pass per direction)."""
    h, w = dark.shape
    lit = ~dark
    lit_rows, lit_cols = lit.any(axis=1), lit.any(axis=0)
    first_x = np.where(lit_rows, lit.argmax(axis=1), w)[:, None]
    last_x = np.where(lit_rows, w - 1 - lit[:, ::-1].argmax(axis=1), -1)[:, None]
    first_y = np.where(lit_cols, lit.argmax(axis=0), h)[None, :]
    last_y = np.where(lit_cols, h - 1 - lit[::-1].argmax(axis=0), -1)[None, :]
    xs, ys = np.arange(w)[None, :], np.arange(h)[:, None]
    edge = (xs < first_x) | (xs > last_x)
    edge |= ys < first_y
    edge |= ys > last_y
    return edge


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
    # dist / inset - 1 clipped to [0, 1], in place in the transform's own float32 buffer (the
    # same float32 operations as the expression, without its three temporary frames)
    np.divide(dist, np.float32(inset_px), out=dist)
    np.subtract(dist, np.float32(1.0), out=dist)
    return np.clip(dist, np.float32(0.0), np.float32(1.0), out=dist)


def field_geometry(mask: np.ndarray) -> tuple[float, float, float]:
    """(cx, cy, radius) in pixels of the field of view: centroid and the radius of a disk of the
    same area."""
    h, w = mask.shape
    per_column = np.count_nonzero(mask, axis=0)
    count = int(per_column.sum())
    if count == 0:
        return w / 2.0, h / 2.0, min(h, w) / 2.0
    # exact integer sums of the coordinates (the mean of the pixels' indices, without listing them)
    sum_x = int(per_column @ np.arange(w, dtype=np.int64))
    sum_y = int(np.count_nonzero(mask, axis=1) @ np.arange(h, dtype=np.int64))
    return sum_x / count + 0.5, sum_y / count + 0.5, math.sqrt(count / math.pi)


# ---------------------------------------------------------------------------------------------
# Keyed fields


def value_noise(key: int, stream: str, h: int, w: int, cell_px: float) -> np.ndarray:
    """Smooth keyed noise (H, W) in about [-1, 1]: uniform values on a grid of ``cell_px`` cells
    (at least 2x2) interpolated bicubically."""
    cell = max(cell_px, 1.0)
    gh, gw = max(2, math.ceil(h / cell) + 1), max(2, math.ceil(w / cell) + 1)
    coarse = rng.uniform_numpy(key, stream, gh * gw).reshape(gh, gw) * np.float32(2.0) - np.float32(
        1.0
    )
    # the grid covers the image with a margin of one cell; sample at pixel centres
    big = cv2.resize(coarse, (round(gw * cell), round(gh * cell)), interpolation=cv2.INTER_CUBIC)
    return np.ascontiguousarray(big[:h, :w], dtype=np.float32)


def fractal_noise(
    key: int, stream: str, h: int, w: int, cell_px: float, octaves: int, gain: float = 0.5
) -> np.ndarray:
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


def sample_bilinear(
    img: np.ndarray, map_x: np.ndarray, map_y: np.ndarray, border: int = cv2.BORDER_REFLECT_101
) -> np.ndarray:
    """CHW image read at float32 pixel-index positions (H, W), bilinear."""
    return np.stack(
        [
            cv2.remap(np.ascontiguousarray(c), map_x, map_y, cv2.INTER_LINEAR, borderMode=border)
            for c in img
        ]
    ).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Torch building blocks of the batched kernels (the same model as the host functions above, one
# set of tensor operations per batch: masks (B, 1, H, W), per-sample values (B,))

Interp = Literal["linear", "cubic"]
Border = Literal["reflect101", "replicate", "constant"]
CUBIC_A = -0.75  # OpenCV's bicubic kernel
ROUNDS = 6  # label-spreading rounds of ``_largest_component``


def _morph_rows(radius: int) -> list[int]:
    """Half widths of the rows of OpenCV's elliptic structuring element of ``radius``."""
    element = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
    return [int(n) // 2 for n in element.sum(axis=1)]


def _dilate(mask: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """Dilation of a float (B, 1, H, W) 0/1 mask by a symmetric element of row half-widths
    ``rows`` (outside the image counts as 0, as OpenCV's default border for dilation)."""
    r = len(rows) // 2
    height = mask.shape[-2]
    padded = torch.nn.functional.pad(mask, (0, 0, r, r))
    out = torch.zeros_like(mask)
    by_width: dict[int, torch.Tensor] = {}
    for dy, half in enumerate(rows):
        if half not in by_width:
            by_width[half] = torch.nn.functional.max_pool2d(padded, (1, 2 * half + 1), 1, (0, half))
        out = torch.maximum(out, by_width[half][:, :, dy : dy + height])
    return out


def _run_max(labels: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """Each pixel of a (B, H, W) label map takes the largest label of its horizontal run of
    ``inside`` pixels (one segment reduction over the whole batch)."""
    b, h, w = labels.shape
    start = inside.clone()
    start[:, :, 1:] &= ~inside[:, :, :-1]
    start[:, :, 0] = True  # a run never continues across rows (or samples)
    run = torch.cumsum(start.view(-1).to(torch.int64), dim=0) - 1
    best = torch.zeros(b * h * w, device=labels.device, dtype=labels.dtype)
    best = best.scatter_reduce(0, run, labels.reshape(-1), reduce="amax")
    return best[run].view(b, h, w) * inside


def components_t(mask: torch.Tensor, connectivity: int = 8) -> torch.Tensor:
    """int64 (B, H, W) labels of the 4- or 8-connected regions of a float (B, 1, H, W) 0/1
    mask (0 outside it; a region's label is one of its pixel indices + 1). Labels spread for a
    fixed number of rounds (no host sync to test convergence): each round takes the largest
    label along every horizontal and vertical run, then (8-connected) of the 3x3 neighbours,
    then follows each label to the label of the pixel it names (pointer jumping); a compact
    region of a frame is one label after a few rounds."""
    b, _, h, w = mask.shape
    n = h * w
    dtype = torch.float32 if b * n < 1 << 24 else torch.float64
    m = mask[:, 0].to(dtype)
    inside = m > 0
    inside_t = inside.transpose(1, 2).contiguous()
    labels = torch.arange(1, n + 1, device=mask.device, dtype=dtype).view(1, h, w) * m
    for _ in range(ROUNDS):
        labels = _run_max(labels, inside)
        labels = _run_max(labels.transpose(1, 2).contiguous(), inside_t).transpose(1, 2)
        if connectivity == 8:
            labels = torch.nn.functional.max_pool2d(labels.unsqueeze(1), 3, 1, 1)[:, 0] * m
        flat = labels.reshape(b, n)
        flat = flat.gather(1, (flat.long() - 1).clamp_(min=0)) * m.view(b, n)
        labels = flat.view(b, h, w)
    return labels.long()


def component_area(labels: torch.Tensor) -> torch.Tensor:
    """(B, H * W + 1) pixel count of every label of a (B, H, W) label map (index 0: outside)."""
    b = labels.shape[0]
    index = labels.reshape(b, -1)
    area = torch.zeros(b, index.shape[1] + 1, device=labels.device, dtype=torch.int64)
    return area.scatter_add_(1, index, torch.ones_like(index))


def _largest_component(mask: torch.Tensor) -> torch.Tensor:
    """bool (B, 1, H, W): the largest 8-connected region of a float 0/1 mask (all true where
    the mask is empty), as ``tissue_mask`` keeps it."""
    b, _, h, w = mask.shape
    labels = components_t(mask)
    area = component_area(labels)
    area[:, 0] = -1
    best = area.argmax(dim=1)
    inside = mask.reshape(b, -1) > 0
    largest = (labels.reshape(b, -1) == best[:, None]) & inside
    empty = ~inside.any(dim=1)
    return torch.where(empty[:, None], torch.ones_like(largest), largest).view(b, 1, h, w)


def estimate_tissue(x: torch.Tensor) -> torch.Tensor:
    """bool (B, 1, H, W): ``tissue_mask`` of every sample of a batch (BCHW in [0, 1]), on its
    device: the dark frame (threshold from the median of the outer rows and columns, straight
    dark runs from an edge), an opening by OpenCV's elliptic element, the largest region."""
    _b, _c, h, w = x.shape
    peak = x.to(torch.float32).amax(dim=1)
    edges = torch.cat([peak[:, 0], peak[:, -1], peak[:, :, 0], peak[:, :, -1]], dim=1)
    ordered = edges.sort(dim=1).values
    half = ordered.shape[1] // 2  # 2 (H + W) values: the median is the mean of the middle two
    median = (ordered[:, half - 1] + ordered[:, half]) / 2.0
    threshold = (median.to(torch.float64) + 0.06).clamp(min=DARK_LEVEL).to(torch.float32)
    dark = (peak < threshold[:, None, None]).to(torch.float32)
    frame = torch.maximum(
        torch.maximum(dark.cummin(dim=2).values, dark.flip(2).cummin(dim=2).values.flip(2)),
        torch.maximum(dark.cummin(dim=1).values, dark.flip(1).cummin(dim=1).values.flip(1)),
    )
    field = (1.0 - frame).unsqueeze(1)
    rows = _morph_rows(max(1, min(h, w) // 200))
    eroded = 1.0 - _dilate(1.0 - field, rows)
    opened = _dilate(eroded, rows)
    return _largest_component(opened)


def _scene_masks(scene: Any, image: Callable[[], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(field, tissue) bool (H, W) of a sample with an engine scene, as ``View`` reads them:
    the scene's cached field; its overlays, of a text line only the glyph strokes, read from
    ``image()`` (the sample, CHW on the host), asked for only where the scene has text."""
    from perturb.scene.masks import overlay_of, text_boxes

    field = np.asarray(scene.field) > 0.5
    if not text_boxes(scene.descriptor):
        return field, field & ~np.asarray(scene.overlay)
    return field, field & ~overlay_of(scene.descriptor, image())


def scene_held(
    x: torch.Tensor,
    scenes: Sequence[Any],
    name: str,
    host: Callable[[], np.ndarray],
    build: Callable[[Any, np.ndarray | None], np.ndarray],
    shape: tuple[int, ...],
    dtype: Any,
) -> list[torch.Tensor | None]:
    """Per sample, what its scene keeps on ``x``'s device under ``name`` (``Scene.held_on``; None
    without a scene). What is missing is built on the host once per image, ``build(scene,
    image)`` -> ``shape`` array, with the sample's clean pixels (``host()[i]``, the batch copied
    to the host once) only where the scene ``reads_pixels``, else None; the missing ones are
    uploaded in one transfer and kept on the device where they read no pixels, so the later ops
    of a chain copy nothing to the host and upload nothing."""
    held: list[torch.Tensor | None] = [
        None if s is None else s.held_on(name, x.device) for s in scenes
    ]
    todo = [i for i, s in enumerate(scenes) if s is not None and held[i] is None]
    if not todo:
        return held
    pixels = host() if any(scenes[i].reads_pixels for i in todo) else None
    stack = np.empty((len(todo), *shape), dtype=dtype)
    for j, i in enumerate(todo):
        stack[j] = build(scenes[i], None if pixels is None else pixels[i])
    uploaded = torch.from_numpy(stack).to(x.device)
    for i, one in zip(todo, uploaded.unbind(0), strict=True):  # views, one aten call
        held[i] = one
        scenes[i].held_on(name, x.device, one)
    return held


def view_masks(x: torch.Tensor, scenes: Sequence[Any] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(field, tissue): bool (B, 1, H, W) masks of ``View.field`` and ``View.tissue`` for every
    sample: from its scene where the engine gives one of the image's size (built on the host
    from the scene's cached masks, uploaded once per batch; the batch comes to the host once, for
    the glyph strokes of text lines, which are read from the pixels), else estimated
    from the pixels on the device (``estimate_tissue``)."""
    b, _c, h, w = x.shape
    given = (
        [None] * b
        if scenes is None
        else [s if s is not None and tuple(s.size) == (h, w) else None for s in scenes]
    )
    if all(s is None for s in given):
        field = estimate_tissue(x)
        return field, field
    pixels: list[np.ndarray] = []

    def host() -> np.ndarray:
        if not pixels:
            pixels.append(x.detach().to("cpu", torch.float32).numpy())
        return pixels[0]

    def build(scene: Any, image: np.ndarray | None) -> np.ndarray:
        def pixels_of() -> np.ndarray:  # asked for only where the scene has text lines
            assert image is not None
            return image

        return np.stack(_scene_masks(scene, pixels_of))

    held = scene_held(x, given, "view", host, build, (2, h, w), bool)
    ones = torch.ones((2, h, w), dtype=torch.bool, device=x.device)
    both = torch.stack([ones if m is None else m for m in held])  # a fresh batch: callers may write
    field, tissue = both[:, :1], both[:, 1:]
    if any(s is None for s in given):
        estimated = estimate_tissue(x)
        missing = (
            torch.from_numpy(np.array([s is None for s in given])).to(x.device).view(b, 1, 1, 1)
        )
        field = torch.where(missing, estimated, field)
        tissue = torch.where(missing, estimated, tissue)
    return field, tissue


def field_geometry_t(field: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``field_geometry`` of every mask of a bool (B, 1, H, W) batch: (cx, cy, radius), each
    float64 (B,)."""
    _b, _, h, w = field.shape
    m = field[:, 0].to(torch.float64)
    count = m.sum(dim=(1, 2))
    xs = torch.arange(w, device=field.device, dtype=torch.float64)
    ys = torch.arange(h, device=field.device, dtype=torch.float64)
    safe = count.clamp(min=1.0)
    cx = (m.sum(dim=1) * xs).sum(dim=1) / safe + 0.5
    cy = (m.sum(dim=2) * ys).sum(dim=1) / safe + 0.5
    radius = torch.sqrt(count / math.pi)
    empty = count <= 0
    return (
        torch.where(empty, w / 2.0, cx),
        torch.where(empty, h / 2.0, cy),
        torch.where(empty, min(h, w) / 2.0, radius),
    )


def _border_index(p: torch.Tensor, n: int, border: Border) -> torch.Tensor:
    """Indices into 0..n-1 of integer positions ``p`` under OpenCV's border rule."""
    if border == "reflect101" and n > 1:
        period = 2 * (n - 1)
        q = torch.remainder(p, period)
        return torch.where(q >= n, period - q, q)
    return p.clamp(0, n - 1)


def _taps(t: torch.Tensor, interp: Interp) -> tuple[list[int], list[torch.Tensor]]:
    """Tap offsets and their float32 weights for fractional positions ``t`` in [0, 1)."""
    if interp == "linear":
        return [0, 1], [1.0 - t, t]
    a = CUBIC_A
    u = t + 1.0
    w0 = ((a * u - 5.0 * a) * u + 8.0 * a) * u - 4.0 * a
    w1 = ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0
    v = 1.0 - t
    w2 = ((a + 2.0) * v - (a + 3.0)) * v * v + 1.0
    return [-1, 0, 1, 2], [w0, w1, w2, 1.0 - w0 - w1 - w2]


def remap(
    x: torch.Tensor,
    map_x: torch.Tensor,
    map_y: torch.Tensor,
    interp: Interp,
    border: Border,
    value: float = 0.0,
) -> torch.Tensor:
    """``cv2.remap`` of a batch: ``x`` (B, C, H, W) read at float pixel-index positions
    ``map_x``, ``map_y`` (B, Ho, Wo), bilinear or bicubic (OpenCV's kernel), with OpenCV's
    border rule (``constant`` reads ``value`` outside)."""
    b, c, h, w = x.shape
    n_out = map_x.shape[1] * map_x.shape[2]
    fx, fy = torch.floor(map_x), torch.floor(map_y)
    ox, wx = _taps((map_x - fx).to(torch.float32), interp)
    oy, wy = _taps((map_y - fy).to(torch.float32), interp)
    ix, iy = fx.to(torch.int64), fy.to(torch.int64)
    flat = x.reshape(b, c, h * w)
    out = torch.zeros(b, c, n_out, device=x.device, dtype=x.dtype)
    for dy, weight_y in zip(oy, wy, strict=True):
        py = iy + dy
        row = _border_index(py, h, border) * w
        for dx, weight_x in zip(ox, wx, strict=True):
            px = ix + dx
            index = (row + _border_index(px, w, border)).view(b, 1, n_out).expand(b, c, n_out)
            tap = flat.gather(2, index)
            if border == "constant":
                outside = ((px < 0) | (px >= w) | (py < 0) | (py >= h)).view(b, 1, n_out)
                tap = torch.where(
                    outside, torch.full((), value, dtype=x.dtype, device=x.device), tap
                )
            out = out + tap * (weight_y * weight_x).view(b, 1, n_out).to(x.dtype)
    return out.view(b, c, *map_x.shape[1:])


# Smooth fields: ``gauss`` and ``value_noise`` are linear maps along each axis (resizes and a
# separable gaussian with OpenCV's kernels and borders), so a batch takes them as two matrix
# products with per-axis matrices built once per size.


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """OpenCV's bicubic weights (float32) of fractional positions ``t``."""
    a = np.float32(CUBIC_A)
    one, two, three = np.float32(1.0), np.float32(2.0), np.float32(3.0)
    u = t + one
    w0 = ((a * u - np.float32(5.0) * a) * u + np.float32(8.0) * a) * u - np.float32(4.0) * a
    w1 = ((a + two) * t - (a + three)) * t * t + one
    v = one - t
    w2 = ((a + two) * v - (a + three)) * v * v + one
    return [w0, w1, w2, one - w0 - w1 - w2]


def _resize_matrix(src: int, dst: int, interp: str) -> np.ndarray:
    """float64 (dst, src): ``cv2.resize`` along one axis, ``INTER_LINEAR``, ``INTER_CUBIC`` or
    ``INTER_AREA`` (edge samples replicated)."""
    out = np.zeros((dst, src), dtype=np.float64)
    scale = 1.0 / (dst / src)
    rows = np.arange(dst)
    if interp == "area":
        if abs(scale - round(scale)) < np.finfo(np.float64).eps:
            k = round(scale)
            for i in range(dst):
                out[i, i * k : i * k + k] = np.float32(1.0 / k)
            return out
        for i in range(dst):
            f1 = i * scale
            f2 = f1 + scale
            cell = min(scale, src - f1)
            s2 = min(math.floor(f2), src - 1)
            s1 = min(math.ceil(f1), s2)
            if s1 - f1 > 1e-3:
                out[i, s1 - 1] += np.float32((s1 - f1) / cell)
            out[i, s1:s2] += np.float32(1.0 / cell)
            if f2 - s2 > 1e-3:
                out[i, s2] += np.float32(min(min(f2 - s2, 1.0), cell) / cell)
        return out
    pos = ((rows + 0.5) * scale - 0.5).astype(np.float32)
    base = np.floor(pos).astype(np.int64)
    frac = pos - base.astype(np.float32)
    if interp == "linear":
        low, high = base < 0, base >= src - 1
        frac[low | high] = 0.0
        base = np.where(low, 0, np.where(high, src - 1, base))
        taps, weights = [0, 1], [np.float32(1.0) - frac, frac]
    else:
        taps, weights = [-1, 0, 1, 2], _cubic_weights(frac)
    for tap, weight in zip(taps, weights, strict=True):
        np.add.at(out, (rows, np.clip(base + tap, 0, src - 1)), weight.astype(np.float64))
    return out


def _gauss_axis(n: int, sigma: float) -> np.ndarray:
    """float64 (n, n): ``cv2.GaussianBlur`` of float32 data along one axis (its kernel size and
    float32 kernel, reflected borders)."""
    size = round(sigma * 4 * 2 + 1) | 1
    kernel = cv2.getGaussianKernel(size, sigma, cv2.CV_32F)[:, 0].astype(np.float64)
    half = size // 2
    out = np.zeros((n, n), dtype=np.float64)
    rows = np.arange(n)
    for j, weight in enumerate(kernel):
        p = rows + j - half
        if n > 1:
            period = 2 * (n - 1)
            p = np.remainder(p, period)
            p = np.where(p >= n, period - p, p)
        else:
            p = np.zeros_like(p)
        np.add.at(out, (rows, p), weight)
    return out


@lru_cache(maxsize=64)
def gauss_axis_matrix(n: int, sigma_px: float, device: str = "cpu") -> torch.Tensor:
    """float32 (n, n) on ``device`` (cached: treat as read-only): ``gauss`` along one axis of
    length ``n`` (large sigmas on a copy downscaled by the same factor, area in and bilinear
    out)."""
    factor = int(max(1, sigma_px // 6))
    if factor > 1:
        small = max(1, n // factor)
        down = _resize_matrix(n, small, "area")
        m = _resize_matrix(small, n, "linear") @ _gauss_axis(small, sigma_px / factor) @ down
    else:
        m = _gauss_axis(n, sigma_px)
    return torch.from_numpy(m.astype(np.float32)).to(device)


@lru_cache(maxsize=64)
def noise_axis_matrix(n: int, cells: int, cell_px: float, device: str = "cpu") -> torch.Tensor:
    """float32 (n, cells) on ``device`` (cached: treat as read-only): ``value_noise``'s bicubic
    resize of ``cells`` grid values to ``round(cells * cell_px)`` samples along one axis, the
    first ``n`` of them."""
    m = _resize_matrix(cells, round(cells * cell_px), "cubic")[:n]
    return torch.from_numpy(m.astype(np.float32)).to(device)


def gauss_t(planes: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """``gauss`` of every (H, W) plane of a float32 (..., H, W) batch: two matrix products."""
    if sigma_px < 0.3:
        return planes.clone()
    h, w = planes.shape[-2:]
    rows = gauss_axis_matrix(h, sigma_px, str(planes.device))
    cols = gauss_axis_matrix(w, sigma_px, str(planes.device))
    return exact.separable(rows, planes, cols)


def value_noise_t(
    keys: Sequence[int], stream: str, h: int, w: int, cell_px: float, like: torch.Tensor
) -> torch.Tensor:
    """(B, H, W) ``value_noise`` of every key, on ``like``'s device: the keyed grids hashed in
    one pass (``keyed_fields.uniform_fields``) and resized by two matrix products."""
    cell = max(cell_px, 1.0)
    gh, gw = max(2, math.ceil(h / cell) + 1), max(2, math.ceil(w / cell) + 1)
    coarse = keyed_fields.uniform_fields(keys, stream, (gh, gw), like.device) * 2.0 - 1.0
    rows = noise_axis_matrix(h, gh, cell, str(like.device))
    cols = noise_axis_matrix(w, gw, cell, str(like.device))
    return exact.separable(rows, coarse, cols)


def fractal_noise_t(
    keys: Sequence[int],
    stream: str,
    h: int,
    w: int,
    cell_px: float,
    octaves: int,
    like: torch.Tensor,
    gain: float = 0.5,
) -> torch.Tensor:
    """(B, H, W) ``fractal_noise`` of every key (``value_noise_t`` octaves)."""
    total = torch.zeros(len(keys), h, w, device=like.device, dtype=torch.float32)
    norm = 0.0
    amp = 1.0
    for o in range(octaves):
        total = total + amp * value_noise_t(keys, f"{stream}/{o}", h, w, cell_px / 2**o, like)
        norm += amp
        amp *= gain
    return total / norm


def luma_t(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) Rec. 601 luma of a BCHW batch (``luma``'s float32 arithmetic)."""
    if x.shape[1] == 1:
        return x[:, 0].clone()
    return x[:, 0] * float(LUMA[0]) + x[:, 1] * float(LUMA[1]) + x[:, 2] * float(LUMA[2])


def masked_mean(values: torch.Tensor, mask: torch.Tensor, empty: float) -> torch.Tensor:
    """(B,) mean of each sample's ``values`` (B, H, W) over its bool ``mask`` (B, H, W),
    ``empty`` where the mask is empty; summed in float64, so that its float32 value does not move
    with how a batch's reduction is split over threads."""
    count = mask.sum(dim=(1, 2))
    zero = torch.zeros((), dtype=torch.float64, device=values.device)
    total = torch.where(mask, values.to(torch.float64), zero).sum(dim=(1, 2))
    mean = torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, empty))
    return mean.to(values.dtype)


CHAMFER3 = ((0, 1, 0.955), (1, 1, 1.3693))  # OpenCV's DIST_L2 steps (dy, dx, length), 3x3
CHAMFER5 = ((0, 1, 1.0), (1, 1, 1.4), (1, 2, 2.1969))  # and 5x5


def chamfer_t(
    mask: torch.Tensor, steps: Sequence[tuple[int, int, float]], reach: float
) -> torch.Tensor:
    """float32 (B, 1, H, W): ``cv2.distanceTransform`` (DIST_L2, the chamfer ``steps``) of a
    bool (B, 1, H, W) mask, the distance of each pixel of the mask to the nearest pixel outside it
    (outside the image counts as inside, as OpenCV's), exact up to ``reach`` px: the steps are
    relaxed as many times as that distance takes (farther pixels may stay infinite)."""
    h, w = mask.shape[-2:]
    moves: list[tuple[int, int, float]] = []
    for dy, dx, length in steps:
        for sy, sx in {
            (dy, dx),
            (-dy, dx),
            (dy, -dx),
            (-dy, -dx),
            (dx, dy),
            (-dx, dy),
            (dx, -dy),
            (-dx, -dy),
        }:
            moves.append((sy, sx, length))
    pad = max(max(abs(dy), abs(dx)) for dy, dx, _ in moves)
    inf = float("inf")
    rounds = math.ceil(reach / steps[0][2]) + 1
    # the sparse path and the early stop read a count and a comparison back to the host: on the
    # CPU that is free, on an accelerator each is a sync, so there every round runs (same bits)
    on_host = mask.device.type == "cpu"
    if on_host and int(mask.count_nonzero()) * SPARSE_CHAMFER <= mask.numel():
        return _chamfer_sparse(mask, sorted(moves), pad, rounds)
    dist = torch.where(
        mask, torch.tensor(inf, device=mask.device), torch.zeros((), device=mask.device)
    )
    lengths = {
        length: torch.tensor(length, dtype=torch.float32, device=mask.device)
        for _, _, length in moves
    }
    for _ in range(rounds):
        padded = torch.nn.functional.pad(dist, (pad, pad, pad, pad), value=inf)
        best = dist
        for dy, dx, length in sorted(moves):
            best = torch.minimum(
                best,
                padded[:, :, pad + dy : pad + dy + h, pad + dx : pad + dx + w] + lengths[length],
            )
        if on_host and torch.equal(best, dist):  # a fixed point: further rounds return it
            break
        dist = best
    return dist


def window_max(x: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The maximum over a centred window of odd ``size`` along ``dim`` (outside the tensor
    ignored): ``F.max_pool2d`` with a (size, 1) or (1, size) kernel, stride 1 and padding
    ``size // 2``, in log2(size) elementwise maxima instead of ``size`` comparisons per pixel:
    maxima over spans doubling up to the largest power of two ``span <= size``, then the maximum
    of the two (overlapping) spans that cover each window. Exact (a maximum rounds nothing)."""
    n, half = x.shape[dim], size // 2
    if half == 0:
        return x.clone()
    shape = list(x.shape)
    shape[dim] = half
    fill = torch.full(shape, -math.inf, dtype=x.dtype, device=x.device)
    spans = torch.cat([fill, x, fill], dim=dim)
    span = 1
    while 2 * span <= size:
        length = spans.shape[dim] - span
        spans = torch.maximum(spans.narrow(dim, 0, length), spans.narrow(dim, span, length))
        span *= 2
    return torch.maximum(spans.narrow(dim, 0, n), spans.narrow(dim, size - span, n))


SPARSE_CHAMFER = 4  # a mask covering at most a quarter of the frame relaxes only its own pixels


def _chamfer_sparse(
    mask: torch.Tensor, moves: Sequence[tuple[int, int, float]], pad: int, rounds: int
) -> torch.Tensor:
    """``chamfer_t``'s rounds on the mask's pixels alone (the others are 0 and stay 0): the
    distances in a frame padded by ``pad`` with infinity, flattened, each round every mask
    pixel's minimum over itself and its neighbours' previous distances plus the step lengths,
    read at fixed index offsets. The same float32 sums and minima (a minimum is exact and
    order-free) as the whole-frame rounds, so the same bits, and the same stop at a fixed
    point."""
    b, c, h, w = mask.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    dist = torch.full((b, c, hp, wp), float("inf"), device=mask.device)
    dist[:, :, pad : pad + h, pad : pad + w] = torch.where(
        mask, torch.tensor(float("inf"), device=mask.device), torch.zeros((), device=mask.device)
    )
    flat = dist.view(-1)
    at = torch.nn.functional.pad(mask, (pad, pad, pad, pad)).view(-1).nonzero().view(-1)
    lengths = {
        length: torch.tensor(length, dtype=torch.float32, device=mask.device)
        for _, _, length in moves
    }
    for _ in range(rounds):
        now = flat[at]
        best = now
        for dy, dx, length in moves:
            best = torch.minimum(best, flat[at + (dy * wp + dx)] + lengths[length])
        if torch.equal(best, now):
            break
        flat[at] = best
    return dist[:, :, pad : pad + h, pad : pad + w].contiguous()


def soft_mask_t(mask: torch.Tensor, inset_px: float) -> torch.Tensor:
    """``soft_mask`` of a bool (B, 1, H, W) batch (OpenCV's 3x3 chamfer distance, needed up to
    ``2 inset_px``: beyond it the ramp is 1)."""
    if inset_px < 1.0:
        return mask.to(torch.float32)
    return (chamfer_t(mask, CHAMFER3, 2.0 * inset_px) / inset_px - 1.0).clamp(0.0, 1.0)


def masked_quantile(
    values: torch.Tensor, mask: torch.Tensor, q: float, qs: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) ``np.quantile(values[i][mask[i]], q)`` (linear) of every sample of (B, H, W)
    ``values`` (``qs``: float64 (B,) quantiles instead, one per sample); NaN where a mask is
    empty."""
    b = values.shape[0]
    flat = torch.where(
        mask, values, torch.full((), float("inf"), dtype=values.dtype, device=values.device)
    )
    ordered = flat.reshape(b, -1).sort(dim=1).values
    count = mask.reshape(b, -1).sum(dim=1)
    quantile = torch.full((b,), q, dtype=torch.float64, device=values.device) if qs is None else qs
    pos = (count - 1).clamp(min=0).to(torch.float64) * quantile
    low = pos.floor()
    t = pos - low
    lo = low.to(torch.int64)
    hi = torch.minimum(lo + 1, (count - 1).clamp(min=0))
    a = ordered.gather(1, lo[:, None])[:, 0].to(torch.float64)
    bb = ordered.gather(1, hi[:, None])[:, 0].to(torch.float64)
    diff = bb - a
    value = torch.where(t >= 0.5, bb - diff * (1.0 - t), a + diff * t)
    return torch.where(count > 0, value, torch.full_like(value, float("nan")))


# Gaussians of a per-sample sigma: ``gauss`` with reflected borders is a circular convolution of
# the frame's reflect-101 extension (period 2 (n - 1) along each axis), so one spectrum of the
# batch takes, per blur, a product with each sample's kernel spectrum and an inverse transform.

GAUSS_TAPS = 48  # half width of OpenCV's kernel for the largest sigma ``gauss`` filters directly
GAUSS_DIRECT = 12.0  # ``gauss`` downscales from this sigma on (``factor = sigma // 6 > 1``)


def _reflect_extend(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` extended along ``dim`` (length n >= 2) to one period 2 (n - 1) of its reflect-101
    continuation: x[0], ..., x[n-1], x[n-2], ..., x[1]."""
    n = x.shape[dim]
    return torch.cat([x, x.narrow(dim, 1, n - 2).flip(dim)], dim=dim)


def reflected_spectrum(planes: torch.Tensor) -> torch.Tensor:
    """Complex spectrum (..., 2 (H - 1), W) of every (H, W) plane's reflect-101 extension
    (real transform along W, full along H), for ``blur_from_spectrum``; H, W >= 2."""
    along_w = torch.fft.rfft(_reflect_extend(planes.to(torch.float32), -1), dim=-1)
    return torch.fft.fft(_reflect_extend(along_w, -2), dim=-2)


def gauss_kernel_spectrum(n: int, sigma: torch.Tensor, bins: int) -> torch.Tensor:
    """float32 (B, bins): the spectrum, over a period 2 (n - 1), of ``gauss``'s kernel along one
    axis for every sigma of float64 (B,): OpenCV's truncated float32 kernel (size
    ``round(8 sigma + 1) | 1``) below ``GAUSS_DIRECT``, the identity below 0.3, and above it the
    gaussian itself (where ``gauss`` blurs a downscaled copy, an approximation of the same)."""
    period = 2 * (n - 1)
    device = sigma.device
    s = sigma.clamp(min=0.3).view(-1, 1)
    taps = torch.arange(GAUSS_TAPS + 1, device=device, dtype=torch.float64).view(1, -1)
    half = torch.div(torch.round(s * 8.0 + 1.0).to(torch.int64) | 1, 2, rounding_mode="floor")
    weights = torch.exp(-0.5 * taps * taps / (s * s)) * (taps <= half)
    total = weights[:, :1] + 2.0 * weights[:, 1:].sum(dim=1, keepdim=True)
    kernel = (weights / total).to(torch.float32).to(torch.float64)
    freq = torch.arange(bins, device=device, dtype=torch.float64).view(1, -1)
    angle = (2.0 * math.pi / period) * freq.view(-1, 1) * taps.view(1, -1)  # (bins, taps)
    cosines = torch.cos(angle)
    cosines[:, 1:] *= 2.0
    direct = kernel @ cosines.T
    alias = torch.minimum(freq, period - freq)  # a full transform's upper half: negative bins
    wide = torch.exp(-2.0 * (math.pi * s * alias / period) ** 2)
    out = torch.where(s >= GAUSS_DIRECT, wide, direct)
    return torch.where(sigma.view(-1, 1) < 0.3, torch.ones_like(out), out).to(torch.float32)


def blur_from_spectrum(spectrum: torch.Tensor, sigma: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``gauss`` of every plane of (B, ..., H, W) with its sample's sigma (float64 (B,)), from
    ``reflected_spectrum`` of the planes: float32 (B, ..., H, W)."""
    b = spectrum.shape[0]
    lead = (b,) + (1,) * (spectrum.dim() - 3)
    rows = gauss_kernel_spectrum(h, sigma, spectrum.shape[-2]).view(*lead, -1, 1)
    cols = gauss_kernel_spectrum(w, sigma, spectrum.shape[-1]).view(*lead, 1, -1)
    along_h = torch.fft.ifft(spectrum * (rows * cols), dim=-2).narrow(-2, 0, h)
    return torch.fft.irfft(along_h, n=2 * (w - 1), dim=-1).narrow(-1, 0, w).contiguous()
