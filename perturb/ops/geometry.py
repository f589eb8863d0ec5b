"""Geometry: resized crop, rotation and translation, and the one-warp affine chain behind them.

Coordinates are continuous: pixel ``(x, y)`` covers ``[x, x+1) x [y, y+1)`` and its centre is
``(x + 0.5, y + 0.5)`` (PIL's and torchvision's convention). A geometric chain (e.g. crop ->
resize -> rotate -> translate) is composed into ONE affine map from output coordinates to the
coordinates of the readable source rectangle and resampled once (bicubic, a = -0.75):
``cv2.warpAffine`` on CPU (``cv2.resize`` when the chain is a crop resized and nothing else), Kornia's ``warp_affine`` (bicubic ``grid_sample``) on CUDA. Source taps outside the
source rectangle clamp to its edge (as PIL's resize of a crop does); black fill lies exactly
where the sequential chain would put it: a pixel is black when, at any fill step of the chain,
its point falls outside that step's input image. Those regions are convex, so the mask is a span
of columns per row, computed on the host in float64 and shared by both devices.

OpenCV (5.x) evaluates float images at exact source positions with the a = -0.75 cubic, as
``grid_sample`` does, so both paths agree to float rounding (<= 1e-4; 0.013/255 measured on
the endoscopy samples at 288x384).

Catalog ops (severity tables in ``perturb/catalog/geometry.yaml``):

* ``resized_crop``: a crop of ``scale`` of the area with aspect ``exp(log_ratio)`` times the
  image's, resized back to the image size (RandomResizedCrop-like): a zoom about a keyed point
  in the middle 40 % of each axis (that point stays in place); up to 20 % of the area is cut,
  where SSIM to the clean frame still falls steadily (stronger zooms flatten out).
* ``rotation``: rotation by a keyed signed angle about the centre, black corners.
* ``translation``: an integer pixel shift of ``shift`` times the width/height along a keyed
  direction, black fill (exact: no resampling).

Each op registers its ``Geometry`` (forward matrix for boxes and ``<loc>`` tags, label-map warp
for masks) with its kernel; flips named by other tools' records (``hflip``, ``vflip``, ...)
register a geometry alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb.ops import _host, backend, optics
from perturb.ops.kernels import (
    Geometry,
    Level,
    Params,
    as_float32,
    draw,
    draw_sign,
    register_foreign_geometry,
    register_kernel,
)
from perturb.ops.radiometry import FIELD_CM


@dataclass(frozen=True)
class Warp:
    """One sample's composed geometric chain.

    ``matrix`` (2x3, float64) maps output continuous coordinates to continuous coordinates of
    the source rectangle ``crop`` = (x0, y0, x1, y1) of the input image. ``constraints`` are rows
    ``(a, b, c, lo, hi)``: an output point ``p`` is kept only if ``lo <= a p.x + b p.y + c < hi``
    for every row, else it is black (fill 0).
    """

    matrix: np.ndarray
    crop: tuple[int, int, int, int]
    constraints: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))


def _affine(matrix: np.ndarray) -> np.ndarray:
    """2x3 -> 3x3 homogeneous."""
    return np.vstack([np.asarray(matrix, dtype=np.float64), [0.0, 0.0, 1.0]])


def inside_constraints(matrix: np.ndarray, width: float, height: float) -> np.ndarray:
    """Rows stating that ``matrix @ p`` lies inside a ``width`` x ``height`` image."""
    m = np.asarray(matrix, dtype=np.float64)
    return np.array(
        [
            [m[0, 0], m[0, 1], m[0, 2], 0.0, float(width)],
            [m[1, 0], m[1, 1], m[1, 2], 0.0, float(height)],
        ]
    )


def rotation_matrix(angle_deg: float, width: int, height: int) -> np.ndarray:
    """Output -> input map of a rotation by ``angle_deg`` counter-clockwise (as displayed, y
    down) about the image centre, as PIL's ``Image.rotate`` and torchvision's ``rotate``."""
    t = math.radians(angle_deg)
    c, s = math.cos(t), math.sin(t)
    cx, cy = width / 2.0, height / 2.0
    return np.array([[c, -s, cx - c * cx + s * cy], [s, c, cy - s * cx - c * cy]])


def translation_matrix(tx: float, ty: float) -> np.ndarray:
    """Output -> input map of a shift by (tx, ty): content moves right/down for positive values."""
    return np.array([[1.0, 0.0, -tx], [0.0, 1.0, -ty]])


def resize_matrix(crop_w: int, crop_h: int, out_w: int, out_h: int) -> np.ndarray:
    """Output -> crop map of resizing a ``crop_w`` x ``crop_h`` crop to ``out_w`` x ``out_h``."""
    return np.array([[crop_w / out_w, 0.0, 0.0], [0.0, crop_h / out_h, 0.0]])


def chain_warp(
    size: tuple[int, int],
    crop: tuple[int, int, int, int] | None = None,
    steps: Sequence[np.ndarray] = (),
) -> Warp:
    """Compose ``crop`` (x0, y0, w, h) resized back to ``size`` = (W, H), followed by fill
    ``steps`` (output -> input maps of images of size ``size``, in the order they are applied)."""
    width, height = size
    x0, y0, cw, ch = crop if crop is not None else (0, 0, width, height)
    total = np.eye(3)
    rows = []
    for step in reversed(list(steps)):  # from the output back towards the source
        total = _affine(step) @ total
        rows.append(inside_constraints(total[:2], width, height))
    total = _affine(resize_matrix(cw, ch, width, height)) @ total
    constraints = np.vstack(rows) if rows else np.zeros((0, 5))
    return Warp(total[:2].copy(), (x0, y0, x0 + cw, y0 + ch), constraints)


def row_spans(constraints: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output row, the columns ``[lo, hi)`` whose centres satisfy every constraint."""
    yc = np.arange(height, dtype=np.float64) + 0.5
    lo = np.zeros(height, dtype=np.float64)
    hi = np.full(height, float(width), dtype=np.float64)
    for a, b, c, low, high in np.asarray(constraints, dtype=np.float64):
        rest = b * yc + c
        if abs(a) < 1e-12:
            ok = (rest >= low) & (rest < high)
            hi = np.where(ok, hi, 0.0)
            continue
        t1, t2 = (low - rest) / a, (high - rest) / a
        if a > 0:  # x + 0.5 in [t1, t2)
            first, stop = np.ceil(t1 - 0.5), np.ceil(t2 - 0.5)
        else:  # x + 0.5 in (t2, t1]
            first, stop = np.floor(t2 - 0.5) + 1.0, np.floor(t1 - 0.5) + 1.0
        lo = np.maximum(lo, first)
        hi = np.minimum(hi, stop)
    lo = np.clip(lo, 0, width).astype(np.int64)
    hi = np.clip(hi, 0, width).astype(np.int64)
    return lo, np.maximum(hi, lo)


def _index_matrix(warp: Warp) -> np.ndarray:
    """The warp as OpenCV wants it: output pixel index -> source-crop pixel index."""
    a = warp.matrix
    b = a[:, 2] + 0.5 * (a[:, 0] + a[:, 1]) - 0.5
    return np.concatenate([a[:, :2], b[:, None]], axis=1)


def _is_resize(warp: Warp, width: int, height: int) -> bool:
    """Whether ``warp`` is its crop resized to ``width`` x ``height`` and nothing else (no
    rotation, no shift, no black fill): ``cv2.resize`` then reads the same source positions."""
    x0, y0, x1, y1 = warp.crop
    want = resize_matrix(x1 - x0, y1 - y0, width, height)
    return not len(warp.constraints) and bool(np.array_equal(warp.matrix, want))


def _warp_opencv(img: np.ndarray, warp: Warp, width: int, height: int) -> np.ndarray:
    x0, y0, x1, y1 = warp.crop
    src = img[y0:y1, x0:x1]
    if _is_resize(warp, width, height):
        # separable, the same a = -0.75 cubic at the same positions with clamped taps, 5-6x
        # faster than warpAffine's 4x4 taps per pixel; equal to float32 rounding
        return cv2.resize(src, (width, height), interpolation=cv2.INTER_CUBIC)
    flags = cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP
    return cv2.warpAffine(
        src, _index_matrix(warp), (width, height), flags=flags, borderMode=cv2.BORDER_REPLICATE
    )


def _mask_rows_numpy(img: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    width = img.shape[1]
    for y in np.flatnonzero((lo > 0) | (hi < width)):
        img[y, : lo[y]] = 0.0
        img[y, hi[y] :] = 0.0


def _warp_u8(img: np.ndarray, warp: Warp) -> np.ndarray:
    """``warp_array`` of a float32 image rounded to uint8 as the engine rounds (round(255 x),
    half to even), the same bytes in fewer passes: negatives to 0 and OpenCV's saturating
    conversion (which also does the clip at 1), then the black outside the constraints set on
    the 8-bit result through one row-span mask."""
    height, width = img.shape[:2]
    res = _warp_opencv(img, warp, width, height)
    cv2.max(res, 0.0, dst=res)  # type: ignore[call-overload]
    out = cv2.convertScaleAbs(res, alpha=255.0)
    if len(warp.constraints):
        lo, hi = row_spans(warp.constraints, width, height)
        if bool(((lo > 0) | (hi < width)).any()):
            # the comparisons in 16-bit integers where the width fits (the same mask, a quarter
            # of the int64 compare's memory traffic: 0.24 -> 0.07 ms at 512 px)
            kind = np.dtype(np.int16 if width < 1 << 15 else np.int64)
            cols = np.arange(width, dtype=kind)
            keep = (cols >= lo.astype(kind)[:, None]) & (cols < hi.astype(kind)[:, None])
            out = cv2.bitwise_and(out, out, mask=keep.view(np.uint8))
    return out


def warp_array(img: np.ndarray, warp: Warp) -> np.ndarray:
    """The OpenCV path for one HWC (or HW) float32 image in [0, 1]: same size out, bicubic,
    clamped to [0, 1], black outside the warp's constraints."""
    height, width = img.shape[:2]
    res = _warp_opencv(img, warp, width, height)
    np.clip(res, 0.0, 1.0, out=res)
    if len(warp.constraints):
        _mask_rows_numpy(res, *row_spans(warp.constraints, width, height))
    return res


def warp_batch(x: torch.Tensor, warps: Sequence[Warp]) -> torch.Tensor:
    """Resample each sample of ``x`` (BCHW float32 in [0, 1]) through its ``Warp`` into an image
    of the same size; bicubic, clamped to [0, 1], black outside each warp's constraints. The
    backend picks the path (``perturb.ops.backend.per_sample_hwc``): ``warp_array`` per sample
    (OpenCV) or ``warp_batch_torch``."""
    return backend.per_sample_hwc(x, warp_array, warps, warp_batch_torch)


def warp_batch_torch(x: torch.Tensor, warps: Sequence[Warp]) -> torch.Tensor:
    """The torch path of ``warp_batch`` (Kornia's bicubic ``warp_affine``), on any device: the
    host-side ``Warp``s become (B, ...) tensors and the batch is warped in one computation."""
    matrices, crops, constraints = warp_tensors(warps, x.device)
    return warp_torch(x, matrices, crops, constraints)


def warp_tensors(
    warps: Sequence[Warp], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Warp``s as the batched kernel takes them: matrices (B, 2, 3) float64, crops (B, 4)
    int64 and constraints (B, K, 5) float64 (rows padded with ones that always hold)."""
    rows = max((len(w.constraints) for w in warps), default=0)
    padded = np.tile(_ALWAYS, (len(warps), rows, 1))
    for i, w in enumerate(warps):
        padded[i, : len(w.constraints)] = w.constraints
    matrices = np.stack([w.matrix for w in warps]).astype(np.float64)
    crops = np.array([w.crop for w in warps], dtype=np.int64).reshape(len(warps), 4)
    return (
        torch.from_numpy(matrices).to(device),
        torch.from_numpy(crops).to(device),
        torch.from_numpy(padded).to(device),
    )


_ALWAYS = np.array([0.0, 0.0, 0.0, -1.0, 1.0])  # a constraint row every point satisfies


def index_matrices(matrices: torch.Tensor) -> torch.Tensor:
    """(B, 2, 3) continuous output -> source maps as pixel-index maps (``_index_matrix``)."""
    b = matrices[..., 2] + 0.5 * (matrices[..., 0] + matrices[..., 1]) - 0.5
    return torch.cat([matrices[..., :2], b.unsqueeze(-1)], dim=-1)


def _affine_inverse(m: torch.Tensor) -> torch.Tensor:
    """Inverses of (B, 2, 3) affine maps, in their dtype."""
    a, b, c, d = m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1]
    det = a * d - b * c
    inv = torch.stack([torch.stack([d, -b], -1), torch.stack([-c, a], -1)], -2) / det[:, None, None]
    shift = -(inv @ m[:, :, 2:])
    return torch.cat([inv, shift], dim=-1)


_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _gather(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``x.gather(dim, index)`` for every dtype: torch's gather has no kernel for uint16/32/64,
    so those are gathered as their signed twins of the same bytes (a copy moves bits only)."""
    twin = _SIGNED_TWIN.get(x.dtype)
    if twin is None:
        return x.gather(dim, index)
    return x.view(twin).gather(dim, index).view(x.dtype)


def replicate_crops(x: torch.Tensor, crops: torch.Tensor) -> torch.Tensor:
    """Each sample of ``x`` with the pixels outside its crop (x0, y0, x1, y1) replaced by the
    crop's nearest edge pixel: the crop stays where it is and reads as if clamped at its own
    edge (OpenCV's ``BORDER_REPLICATE`` on the cropped image). Two gathers for the batch."""
    bsz, channels, height, width = x.shape
    rows = torch.arange(height, device=x.device)
    cols = torch.arange(width, device=x.device)
    iy = torch.minimum(torch.maximum(rows[None, :], crops[:, 1:2]), crops[:, 3:4] - 1)
    ix = torch.minimum(torch.maximum(cols[None, :], crops[:, 0:1]), crops[:, 2:3] - 1)
    out = _gather(x, 2, iy[:, None, :, None].expand(bsz, channels, height, width))
    return _gather(out, 3, ix[:, None, None, :].expand(bsz, channels, height, width))


def keep_mask(constraints: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(B, 1, H, W) bool: the output pixels whose centres satisfy every constraint row of their
    sample (B, K, 5): ``row_spans`` in the same float64 arithmetic, for the whole batch."""
    device = constraints.device
    yc = torch.arange(height, dtype=torch.float64, device=device) + 0.5
    a, b, c, low, high = (constraints[..., k, None] for k in range(5))  # (B, K, 1)
    rest = b * yc + c  # (B, K, H)
    flat = a.abs() < 1e-12
    safe = torch.where(flat, torch.ones_like(a), a)
    t1, t2 = (low - rest) / safe, (high - rest) / safe
    rising = a > 0
    first = torch.where(rising, torch.ceil(t1 - 0.5), torch.floor(t2 - 0.5) + 1.0)
    stop = torch.where(rising, torch.ceil(t2 - 0.5), torch.floor(t1 - 0.5) + 1.0)
    inside = (rest >= low) & (rest < high)
    first = torch.where(flat, torch.zeros_like(first), first)
    stop = torch.where(flat, torch.where(inside, float(width), 0.0), stop)
    lo = (
        first.amax(dim=1).clamp(0, width)
        if first.shape[1]
        else torch.zeros_like(yc).expand(len(a), -1)
    )
    hi = stop.amin(dim=1).clamp(0, width) if stop.shape[1] else torch.full_like(lo, float(width))
    cols = torch.arange(width, dtype=torch.float64, device=device)
    return ((cols >= lo[..., None]) & (cols < hi[..., None])).unsqueeze(1)


def warp_torch(
    x: torch.Tensor,
    matrices: torch.Tensor,
    crops: torch.Tensor | None = None,
    constraints: torch.Tensor | None = None,
) -> torch.Tensor:
    """Resample BCHW float32 ``x`` through per-sample maps in one batched computation.

    ``matrices`` (B, 2, 3, float64): output continuous coordinates -> continuous coordinates of
    each sample's source rectangle ``crops`` (B, 4: x0, y0, x1, y1; None: the whole frame). Taps
    outside the rectangle clamp to its edge; bicubic (a = -0.75) through Kornia's ``warp_affine``
    with each sample's forward (index) map, inverted here in float64; clamped to [0, 1]; black
    where a row of ``constraints`` (B, K, 5) fails (``Warp``)."""
    import kornia  # lazily: only the torch path needs it

    height, width = x.shape[-2:]
    index = index_matrices(matrices.to(torch.float64))
    src = x
    if crops is not None:
        src = replicate_crops(x, crops)
        index = torch.cat(
            [index[..., :2], index[..., 2:] + crops[:, :2, None].to(torch.float64)], dim=-1
        )
    forward = _affine_inverse(index).to(x.dtype)
    out = kornia.geometry.transform.warp_affine(
        src, forward, (height, width), mode="bicubic", padding_mode="border", align_corners=True
    ).clamp_(0.0, 1.0)
    if constraints is not None and constraints.shape[1]:
        out = out * keep_mask(constraints, width, height).to(out.dtype)
    return out


def shift_slices(
    tx: int, ty: int, width: int, height: int
) -> tuple[tuple[slice, slice], tuple[slice, slice]] | None:
    """(destination, source) (rows, columns) slices of an integer shift (tx, ty) of a
    ``width`` x ``height`` image; None when nothing stays in the frame."""
    if abs(tx) >= width or abs(ty) >= height:
        return None
    dst = (slice(max(ty, 0), height + min(ty, 0)), slice(max(tx, 0), width + min(tx, 0)))
    src = (slice(max(-ty, 0), height - max(ty, 0)), slice(max(-tx, 0), width - max(tx, 0)))
    return dst, src


# ---------------------------------------------------------------------------------------------
# Catalog ops


def crop_box(
    width: int, height: int, scale: float, log_ratio: float, u: float, v: float
) -> tuple[int, int, int, int]:
    """(x0, y0, w, h) of a crop with ``scale`` of the area, aspect ``exp(log_ratio)`` times the
    image's, clipped to the image, placed at quantiles (u, v) of the free range."""
    r = math.exp(log_ratio)
    w = min(width, max(1, round(width * math.sqrt(scale * r))))
    h = min(height, max(1, round(height * math.sqrt(scale / r))))
    x0 = min(width - w, int(u * (width - w + 1)))
    y0 = min(height - h, int(v * (height - h + 1)))
    return x0, y0, w, h


ANCHOR_RANGE = (0.3, 0.7)  # the zoom centre stays in the middle 40 % of each axis


def _crop_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "scale": draw(rng, level["scale"]),
        "log_ratio": draw(rng, level["log_ratio"]),
        "u": float(rng.uniform(*ANCHOR_RANGE)),
        "v": float(rng.uniform(*ANCHOR_RANGE)),
    }


def _crop_matrix(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    """Forward map of ``resized_crop``: the crop box scaled back to the whole frame."""
    args = (as_float32(p[k]) for k in ("scale", "log_ratio", "u", "v"))
    x0, y0, w, h = crop_box(width, height, *args)
    sx, sy = width / w, height / h
    return np.array([[sx, 0.0, -x0 * sx], [0.0, sy, -y0 * sy], [0.0, 0.0, 1.0]])


def crop_tensors(
    p: dict[str, torch.Tensor], width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched ``crop_warp`` of collated ``resized_crop`` parameters, on their device: the
    (B, 2, 3) float64 output -> crop maps and the (B, 4) int64 crops (x0, y0, x1, y1), in
    ``crop_box``'s float64 arithmetic (Python's round half to even is ``torch.round``'s)."""
    scale, log_ratio, u, v = (p[k].to(torch.float64) for k in ("scale", "log_ratio", "u", "v"))
    r = torch.exp(log_ratio)
    w = (width * torch.sqrt(scale * r)).round().clamp(1, width)
    h = (height * torch.sqrt(scale / r)).round().clamp(1, height)
    x0 = torch.minimum(width - w, torch.floor(u * (width - w + 1)))
    y0 = torch.minimum(height - h, torch.floor(v * (height - h + 1)))
    zero = torch.zeros_like(w)
    matrices = torch.stack(
        [torch.stack([w / width, zero, zero], -1), torch.stack([zero, h / height, zero], -1)], -2
    )
    crops = torch.stack([x0, y0, x0 + w, y0 + h], -1).to(torch.int64)
    return matrices, crops


def _crop_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    height, width = m.shape[-2:]
    return nearest_torch(m, *crop_tensors(p, width, height))


@register_kernel(
    "resized_crop", sampler=_crop_sampler, geometry=Geometry(_crop_label_maps, matrix=_crop_matrix)
)
def resized_crop(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Crop (``scale`` of the area, relative aspect ``exp(log_ratio)``, keyed position) resized
    back to the input size, bicubic.

    Kornia: ``kornia.geometry.transform.warp_affine`` (through ``warp_torch``: one warp for
    the batch, the crop and resize of each sample as its affine map)."""
    height, width = x.shape[-2:]
    return warp_torch(x, *crop_tensors(p, width, height))


def crop_warp(width: int, height: int, scale: float, log_ratio: float, u: float, v: float) -> Warp:
    return chain_warp((width, height), crop_box(width, height, scale, log_ratio, u, v))


def crop_warps(p: dict[str, torch.Tensor], width: int, height: int) -> list[Warp]:
    """One ``Warp`` per sample of collated ``resized_crop`` parameters."""
    columns = (p[k].tolist() for k in ("scale", "log_ratio", "u", "v"))
    return [crop_warp(width, height, *row) for row in zip(*columns, strict=True)]


def _rotation_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"degrees": draw(rng, level["degrees"]) * draw_sign(rng)}


def _rotation_matrix(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    """Forward map of ``rotation``: the inverse of its output -> input map."""
    inverse = np.vstack([rotation_matrix(as_float32(p["degrees"]), width, height), [0.0, 0.0, 1.0]])
    return np.linalg.inv(inverse)


def rotation_tensors(
    degrees: torch.Tensor, width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched ``rotation_warp``: the (B, 2, 3) float64 output -> input maps of rotations by
    ``degrees`` (B,) and their (B, 2, 5) inside-the-frame constraints, in the float64
    arithmetic of ``rotation_matrix`` and ``chain_warp``."""
    t = degrees.to(torch.float64) * (math.pi / 180.0)
    c, s = torch.cos(t), torch.sin(t)
    cx, cy = width / 2.0, height / 2.0
    matrices = torch.stack(
        [
            torch.stack([c, -s, cx - c * cx + s * cy], -1),
            torch.stack([s, c, cy - s * cx - c * cy], -1),
        ],
        -2,
    )
    bounds = torch.tensor(
        [[0.0, float(width)], [0.0, float(height)]], dtype=torch.float64, device=degrees.device
    )
    constraints = torch.cat([matrices, bounds.expand(len(degrees), 2, 2)], dim=-1)
    return matrices, constraints


def _rotation_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    height, width = m.shape[-2:]
    matrices, constraints = rotation_tensors(p["degrees"], width, height)
    return nearest_torch(m, matrices, None, constraints)


@register_kernel(
    "rotation",
    sampler=_rotation_sampler,
    geometry=Geometry(_rotation_label_maps, matrix=_rotation_matrix),
)
def rotation(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Rotation by ``degrees`` (counter-clockwise positive) about the centre, black corners.

    Kornia: ``kornia.geometry.transform.warp_affine`` (through ``warp_torch``: one warp for
    the batch with per-sample matrices)."""
    height, width = x.shape[-2:]
    matrices, constraints = rotation_tensors(p["degrees"], width, height)
    return warp_torch(x, matrices, None, constraints)


def rotation_warp(width: int, height: int, degrees: float) -> Warp:
    return chain_warp((width, height), None, [rotation_matrix(degrees, width, height)])


def rotation_warps(p: dict[str, torch.Tensor], width: int, height: int) -> list[Warp]:
    """One ``Warp`` per sample of collated ``rotation`` parameters."""
    return [rotation_warp(width, height, d) for d in p["degrees"].tolist()]


def _translation_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"shift": draw(rng, level["shift"]), "direction": float(rng.uniform(0.0, 360.0))}


def translation_pixels(
    width: int, height: int, shift: float, direction_deg: float
) -> tuple[int, int]:
    """Integer (tx, ty) of a shift by ``shift`` of the width/height along ``direction_deg``; at
    least one pixel along the dominant axis, so the op always moves the image."""
    t = math.radians(direction_deg)
    fx, fy = shift * width * math.cos(t), shift * height * math.sin(t)
    tx, ty = round(fx), round(fy)
    if tx == 0 and ty == 0:
        if abs(fx) >= abs(fy):
            tx = 1 if fx >= 0 else -1
        else:
            ty = 1 if fy >= 0 else -1
    return int(tx), int(ty)


def _translation_matrix(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    """Forward map of ``translation``: the integer shift."""
    tx, ty = translation_pixels(width, height, as_float32(p["shift"]), as_float32(p["direction"]))
    return np.array([[1.0, 0.0, float(tx)], [0.0, 1.0, float(ty)], [0.0, 0.0, 1.0]])


def translation_tensor(p: dict[str, torch.Tensor], width: int, height: int) -> torch.Tensor:
    """Batched ``translation_pixels``: (B, 2) int64 (tx, ty) of collated ``translation``
    parameters, on their device, in the same float64 arithmetic."""
    shift = p["shift"].to(torch.float64)
    t = p["direction"].to(torch.float64) * (math.pi / 180.0)
    fx, fy = shift * width * torch.cos(t), shift * height * torch.sin(t)
    tx, ty = fx.round(), fy.round()
    still = (tx == 0) & (ty == 0)
    along_x = fx.abs() >= fy.abs()
    tx = torch.where(still & along_x, torch.where(fx >= 0, 1.0, -1.0), tx)
    ty = torch.where(still & ~along_x, torch.where(fy >= 0, 1.0, -1.0), ty)
    return torch.stack([tx, ty], -1).to(torch.int64)


def shift_torch(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Integer shifts (B, 2: tx, ty) of a batch of any dtype in one computation, black fill:
    output(x, y) = input(x - tx, y - ty); exact (gathers, no arithmetic on the pixels)."""
    bsz, channels, height, width = x.shape
    iy = torch.arange(height, device=x.device)[None, :] - shifts[:, 1:2]
    ix = torch.arange(width, device=x.device)[None, :] - shifts[:, 0:1]
    keep = ((iy >= 0) & (iy < height))[:, None, :, None] & ((ix >= 0) & (ix < width))[
        :, None, None, :
    ]
    rows = iy.clamp(0, height - 1)[:, None, :, None].expand(bsz, channels, height, width)
    cols = ix.clamp(0, width - 1)[:, None, None, :].expand(bsz, channels, height, width)
    moved = _gather(_gather(x, 2, rows), 3, cols)
    return torch.where(keep, moved, torch.zeros((), dtype=x.dtype, device=x.device))


def _translation_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    height, width = m.shape[-2:]
    return shift_torch(m, translation_tensor(p, width, height))


@register_kernel(
    "translation",
    sampler=_translation_sampler,
    geometry=Geometry(_translation_label_maps, matrix=_translation_matrix),
)
def translation(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Integer shift by ``shift`` of the width/height along ``direction`` degrees, black fill.

    Kornia: own kernel, because an integer shift is a copy (exact, no arithmetic): two
    batched gathers; Kornia's ``translate`` resamples every pixel through ``grid_sample``."""
    height, width = x.shape[-2:]
    return shift_torch(x, translation_tensor(p, width, height))


def translation_shifts(
    p: dict[str, torch.Tensor], width: int, height: int
) -> list[tuple[int, int]]:
    """Integer (tx, ty) per sample of collated ``translation`` parameters."""
    return [
        translation_pixels(width, height, s, d)
        for s, d in zip(p["shift"].tolist(), p["direction"].tolist(), strict=True)
    ]


# ---------------------------------------------------------------------------------------------
# CPU fast paths: one sample at a time on the engine's thread pool, the same float32 arithmetic
# as the batched OpenCV path above (uint8 -> float32 / 255, warp, clip, black fill, rounded back
# half to even), so the bytes are identical while the conversions stay per sample and in cache.


_U8_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255.0)  # the engine's u8 -> float32


def _warp_sample(src: np.ndarray, dst: np.ndarray, warp: Warp) -> None:
    channels = src.shape[0]
    hwc = cv2.merge(list(src)) if channels > 1 else np.ascontiguousarray(src[0])
    img = cv2.LUT(hwc, _U8_LEVELS) if src.dtype == np.uint8 else hwc
    res = _warp_u8(img, warp) if dst.dtype == np.uint8 else warp_array(img, warp)
    if channels > 1:
        for c, plane in enumerate(cv2.split(res)):
            dst[c] = plane
    else:
        dst[0] = res


@backend.register_cpu("resized_crop")
def resized_crop_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    height, width = src.shape[-2:]
    args = (float(p[k]) for k in ("scale", "log_ratio", "u", "v"))
    _warp_sample(src, dst, crop_warp(width, height, *args))


@backend.register_cpu("rotation")
def rotation_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    height, width = src.shape[-2:]
    _warp_sample(src, dst, rotation_warp(width, height, float(p["degrees"])))


@backend.register_cpu("translation")
def translation_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    height, width = src.shape[-2:]
    tx, ty = translation_pixels(width, height, float(p["shift"]), float(p["direction"]))
    dst[...] = 0
    spans = shift_slices(tx, ty, width, height)
    if spans is not None:
        (dst_y, dst_x), (src_y, src_x) = spans
        dst[:, dst_y, dst_x] = src[:, src_y, src_x]


# ---------------------------------------------------------------------------------------------
# Label maps (segmentation masks) through the same geometry


def nearest_warp_batch(m: torch.Tensor, warps: Sequence[Warp]) -> torch.Tensor:
    """Label-map twin of ``warp_batch`` for host-side ``Warp``s (``nearest_torch``)."""
    return nearest_torch(m, *warp_tensors(warps, m.device))


def nearest_torch(
    m: torch.Tensor,
    matrices: torch.Tensor,
    crops: torch.Tensor | None = None,
    constraints: torch.Tensor | None = None,
) -> torch.Tensor:
    """Label-map twin of ``warp_torch``: each sample of ``m`` (B, C, H, W, any dtype) is read
    at the same source positions as the image kernel reads, taking the nearest pixel (ties
    round up) instead of the bicubic mix, clamped to the source rectangle, and set to 0
    outside the constraints (where the image turns black). Exact on every device; one gather
    for the batch."""
    bsz, channels, height, width = m.shape
    device = m.device
    index = index_matrices(matrices.to(torch.float64))[:, :, None, None, :]  # (B, 2, 1, 1, 3)
    x = torch.arange(width, dtype=torch.float64, device=device)[None, :]
    y = torch.arange(height, dtype=torch.float64, device=device)[:, None]
    px = index[:, 0, ..., 0] * x + (index[:, 0, ..., 1] * y + index[:, 0, ..., 2])
    py = index[:, 1, ..., 0] * x + (index[:, 1, ..., 1] * y + index[:, 1, ..., 2])
    if crops is None:
        crops = torch.tensor([0, 0, width, height], device=device).expand(bsz, 4)
    x0, y0, x1, y1 = (crops[:, k, None, None] for k in range(4))
    ix = (
        torch.minimum(
            torch.maximum(torch.floor(px + 0.5).long(), torch.zeros_like(x0)), x1 - x0 - 1
        )
        + x0
    )
    iy = (
        torch.minimum(
            torch.maximum(torch.floor(py + 0.5).long(), torch.zeros_like(y0)), y1 - y0 - 1
        )
        + y0
    )
    flat = (iy * width + ix).reshape(bsz, 1, height * width).expand(bsz, channels, -1)
    res = _gather(m.reshape(bsz, channels, height * width), 2, flat).reshape(m.shape)
    if constraints is not None and constraints.shape[1]:
        keep = keep_mask(constraints, width, height)
        res = torch.where(keep, res, torch.zeros((), dtype=res.dtype, device=device))
    return res


# Flips named by other tools' records (not catalog ops): boxes, tags and masks follow them


def _hflip_matrix(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    return np.array([[-1.0, 0.0, float(width)], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def _vflip_matrix(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    return np.array([[1.0, 0.0, 0.0], [0.0, -1.0, float(height)], [0.0, 0.0, 1.0]])


register_foreign_geometry(
    Geometry(lambda m, p: m.flip(-1), matrix=_hflip_matrix), "hflip", "horizontal_flip"
)
register_foreign_geometry(
    Geometry(lambda m, p: m.flip(-2), matrix=_vflip_matrix), "vflip", "vertical_flip"
)


# ---------------------------------------------------------------------------------------------
# ``xray_patient_rotation``: the patient turned about the long axis (an oblique projection of the
# anatomy under a fixed annotation layer). Turning the thorax by ``theta`` about a vertical axis
# through the spine moves a structure at depth ``z`` laterally by about ``(z_spine - z) sin theta``
# on the film: the spinous processes (posterior, on the axis) stay, anterior structures (the
# medial clavicle heads, sternum and anterior mediastinum, ``DEPTH_SPAN_CM`` in front of them)
# move the most, so the spinous processes come to lie off-centre between the clavicle heads and
# one hemithorax and clavicle look wider than the other (Bushberg ch. 7; the classic sign of
# rotation on a PA film). A film has no depth per pixel, so the model is a horizontal,
# depth-dependent shift of the body content: none on the spine column (``SPINE_HALF_CM`` either
# side of the spine line), rising to the full anterior shift ``DEPTH_SPAN_CM sin theta`` by
# ``ANTERIOR_CM`` from it, and falling back to none at the body outline (``BODY_HALF`` of the
# width either side), so the outline, the air and the corners stay where they were. The catalog
# makes it an acquisition op (``protects_border``): the film's burned-in text and markers
# (perturb.scene.radiograph) are composited back unchanged, and anatomy boxes, ``<loc>`` tags and
# label maps follow the shift (``Geometry.points``). The ramps are smoothsteps whose steepest
# slope ``1.5 DEPTH_SPAN_CM sin theta / ramp width`` stays below 1 up to 20 degrees, so the map is
# monotone along every row (no fold) and is inverted exactly by interpolation.
# ---------------------------------------------------------------------------------------------


DEPTH_SPAN_CM = 12.0  # depth from the spinous processes to the medial clavicle heads / sternum
SPINE_HALF_CM = 0.8  # half-width of the spine column that stays on the rotation axis
ANTERIOR_CM = 9.0  # lateral distance from the spine line where the full anterior shift is reached
BODY_HALF = 0.44  # half-width of the body (fraction of the film's width) where the shift ends
BODY_TAPER = 0.4  # the shift falls to none over this outer fraction of the body half-width


def _smoothstep(t: torch.Tensor) -> torch.Tensor:
    t = t.clamp(0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def rotation_shift(
    xs: torch.Tensor, degrees: torch.Tensor, pivot: torch.Tensor, width: int, height: int
) -> torch.Tensor:
    """Forward lateral displacement (pixels, float64) of the anatomy at continuous column
    positions ``xs`` ((..., N) float64) for per-sample ``degrees`` and ``pivot`` (the spine line,
    fraction of the width from the centre), broadcast as (..., 1)."""
    cm = FIELD_CM / min(width, height)  # cm per pixel
    spine = width / 2.0 + pivot.double() * width
    r = (xs - spine).abs() * cm  # lateral distance from the spine line, cm
    body = BODY_HALF * width * cm
    rise = _smoothstep((r - SPINE_HALF_CM) / (ANTERIOR_CM - SPINE_HALF_CM))
    fall = 1.0 - _smoothstep((r - (1.0 - BODY_TAPER) * body) / (BODY_TAPER * body))
    full = DEPTH_SPAN_CM * torch.sin(degrees.double() * (math.pi / 180.0)) / cm
    return full * rise * fall


def _columns(width: int, device: torch.device) -> torch.Tensor:
    return torch.arange(width, dtype=torch.float64, device=device) + 0.5


def source_columns(degrees: torch.Tensor, pivot: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(B, W) float64 source column (continuous) of every output pixel centre: the inverse of
    the monotone forward map ``x + rotation_shift(x)``, by linear interpolation between the
    forward images of the pixel centres (batched ``searchsorted``, no per-sample loop)."""
    xs = _columns(width, degrees.device).expand(degrees.shape[0], width)
    fwd = (xs + rotation_shift(xs, degrees.view(-1, 1), pivot.view(-1, 1), width, height)).contiguous()
    target = xs.contiguous()
    hi = torch.searchsorted(fwd, target).clamp_(1, width - 1)
    lo = hi - 1
    f_lo, f_hi = fwd.gather(1, lo), fwd.gather(1, hi)
    t = ((target - f_lo) / (f_hi - f_lo)).clamp_(0.0, 1.0)
    src = xs.gather(1, lo) + t
    # beyond the outermost forward images the map is the identity (no shift at the film edges)
    return torch.where((target < fwd[:, :1]) | (target > fwd[:, -1:]), target, src)


def _remap_rows(x: torch.Tensor, src: torch.Tensor, mode: str) -> torch.Tensor:
    """Resample every row of ``x`` (B, C, H, W) at the (B, W) source columns ``src``
    (continuous pixel coordinates), rows unchanged: one ``grid_sample`` for the batch (float64
    grid), border padding."""
    b, _c, h, w = x.shape
    gx = (src * (2.0 / w) - 1.0).view(b, 1, w).expand(b, h, w)
    gy = ((torch.arange(h, dtype=torch.float64, device=x.device) + 0.5) * (2.0 / h) - 1.0).view(1, h, 1)
    grid = torch.stack([gx, gy.expand(b, h, w)], dim=-1).to(x.dtype)
    return F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)


def rotation_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label maps (B, C, H, W, any dtype) moved as ``xray_patient_rotation`` moves the anatomy:
    nearest sampling."""
    if m.shape[0] == 0:
        return m.clone()
    h, w = m.shape[-2:]
    src = source_columns(p["degrees"].to(m.device), p["pivot"].to(m.device), w, h)
    return _remap_rows(m.to(torch.float64), src, "nearest").to(m.dtype)


def _rotation_points(p: Mapping[str, Any], points: np.ndarray, width: int, height: int) -> np.ndarray:
    """(N, 2) continuous points of the anatomy moved by the op: ``x + rotation_shift(x)``."""
    pts = np.asarray(points, dtype=np.float64).copy()
    xs = torch.from_numpy(np.ascontiguousarray(pts[:, 0]))
    deg = torch.tensor(as_float32(p["degrees"]), dtype=torch.float64)
    piv = torch.tensor(as_float32(p["pivot"]), dtype=torch.float64)
    pts[:, 0] += rotation_shift(xs, deg, piv, width, height).numpy()
    return pts


def _patient_rotation_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "degrees": draw(rng_, level["degrees"]) * draw_sign(rng_),
        "pivot": draw(rng_, level["pivot"]) * draw_sign(rng_),
    }


@register_kernel(
    "xray_patient_rotation",
    sampler=_patient_rotation_sampler,
    geometry=Geometry(rotation_label_maps, points=_rotation_points),
)
def xray_patient_rotation(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Oblique projection of a rotated patient: the anatomy's depth-dependent lateral shift
    about the spine (see the section comment), bicubic along each row.

    Kornia: ``kornia.geometry.transform.remap`` on the torch path (one call for the batch with
    its (B, H, W) maps, float32 bicubic); the CPU path (no OpenCV one: ``cv2.remap`` is float32
    and clips its cubic taps differently) resamples one film at a time through a float64
    ``grid_sample`` grid, whose bytes the golden outputs pin. They agree within 1e-4."""
    h, w = x.shape[-2:]

    def host() -> torch.Tensor:
        out = []
        for i in range(x.shape[0]):
            src = source_columns(p["degrees"][i : i + 1], p["pivot"][i : i + 1], w, h)
            out.append(_remap_rows(x[i : i + 1], src, "bicubic"))
        return torch.cat(out).clamp_(0.0, 1.0)

    def device() -> torch.Tensor:
        import kornia  # lazily: only the torch path needs it

        src = source_columns(p["degrees"], p["pivot"], w, h)  # (B, W), continuous
        b = x.shape[0]
        map_x = (src - 0.5).to(x.dtype).view(b, 1, w).expand(b, h, w)
        map_y = torch.arange(h, dtype=x.dtype, device=x.device).view(1, h, 1).expand(b, h, w)
        out = kornia.geometry.transform.remap(
            x, map_x, map_y, mode="bicubic", padding_mode="border", align_corners=True
        )
        return out.clamp_(0.0, 1.0)

    return backend.by_path(x, host=host, device=device)


# ---------------------------------------------------------------------------------------------
# Scope roll (clinical; endoscopy tissue layer)
#
# The endoscopist torques the insertion tube: the distal tip turns about its optical axis, so the
# image of the tissue rotates about the optical centre (the centre of the field of view), while
# the field stop and the processor's overlays (text, scope-position boxes, insets), fixed to the
# sensor and to the screen, stay where they are. Unlike ``rotation`` (the whole screen turned, as
# the Kvasir-VQA-x1 track does), the octagonal mask, the dark surround and the overlays do not
# move: the tissue turns inside them. The tissue behind the aperture is the one the lens ops use
# (``perturb.ops.optics``: the frame in the clear part, a smooth extension of it under the rim,
# beyond the field and under the overlays), so where the rotated field's corners reach beyond the
# field they show that extension, never the surround or an overlay. Boxes and masks of findings
# rotate with the tissue about the same centre (``perturb.engine.annotations`` reads it from the scene a
# border-protecting record stores; without a scene the centre is the image's).


def _roll_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"degrees": draw(rng, level["degrees"]) * draw_sign(rng)}


def roll_centre(scene: Mapping[str, Any] | None, width: int, height: int) -> tuple[float, float]:
    """The optical centre (continuous pixel coordinates) ``scope_roll`` turns about: the
    centroid of the scene's field of view (descriptor ``scene``), else the image's centre."""
    if scene is None:
        return width / 2.0, height / 2.0
    from perturb.scene import Scene  # the scene package imports the ops: not at module level

    field = np.asarray(Scene.from_descriptor(dict(scene)).field) > 0.5
    cx, cy, _ = _host.field_geometry(field)
    return cx, cy


def roll_matrix(degrees: float, cx: float, cy: float) -> np.ndarray:
    """Output -> input map (2x3) of a turn by ``degrees`` counter-clockwise (as displayed) about
    (cx, cy): ``rotation_matrix``'s convention about another centre."""
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    return np.array([[c, -s, cx - c * cx + s * cy], [s, c, cy - s * cx - c * cy]])


def _roll_forward(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    """Forward map of ``scope_roll`` (boxes): the inverse of its output -> input map about the
    centre of the record's scene (``p["scene"]``, given by ``perturb.engine.annotations``)."""
    cx, cy = roll_centre(p.get("scene"), width, height)
    return np.linalg.inv(_affine(roll_matrix(as_float32(p["degrees"]), cx, cy)))


def _roll_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label maps turned about the image centre (collated parameters carry no scene), nearest,
    0 where they come from outside the image."""
    height, width = m.shape[-2:]
    matrices, constraints = rotation_tensors(p["degrees"], width, height)
    return nearest_torch(m, matrices, None, constraints)


def roll_maps(
    degrees: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (B, H, W) source pixel-index maps of turns by ``degrees`` (B,) about (cx, cy)
    (B,) px, evaluated in float64 (the host path's arithmetic)."""
    t = degrees.to(torch.float64) * (math.pi / 180.0)
    c, s = torch.cos(t).view(-1, 1, 1), torch.sin(t).view(-1, 1, 1)
    cx64, cy64 = cx.to(torch.float64).view(-1, 1, 1), cy.to(torch.float64).view(-1, 1, 1)
    xs = (torch.arange(width, device=degrees.device, dtype=torch.float64) + 0.5).view(1, 1, -1)
    ys = (torch.arange(height, device=degrees.device, dtype=torch.float64) + 0.5).view(1, -1, 1)
    dx, dy = xs - cx64, ys - cy64
    map_x = (c * dx - s * dy + cx64 - 0.5).to(torch.float32)
    map_y = (s * dx + c * dy + cy64 - 0.5).to(torch.float32)
    return map_x, map_y


def _scope_roll_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``scope_roll`` of a batch in one pass (the torch kernel): the tissue behind the aperture
    (batched fills), every sample's turn (per-sample centre and angle) as one batched bicubic
    remap, the change added inside the clear aperture."""
    _b, _c, h, w = x.shape
    field, tissue = _host.view_masks(x, scenes)
    fx, fy, _ = _host.field_geometry_t(field)
    given = optics.scene_flags(x, scenes).view(-1)
    cx = torch.where(given, fx, torch.full_like(fx, w / 2.0))
    cy = torch.where(given, fy, torch.full_like(fy, h / 2.0))
    map_x, map_y = roll_maps(p["degrees"], cx, cy, h, w)
    return optics.warp_tissue_t(x, field, tissue, map_x, map_y).clamp(0.0, 1.0)


@_host.host_op(
    "scope_roll",
    sampler=_roll_sampler,
    dtypes=(np.uint8, np.float32),
    geometry=Geometry(_roll_label_maps, matrix=_roll_forward),
    device=_scope_roll_batch,
)
def scope_roll(img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View) -> np.ndarray:
    """The tissue turned by ``degrees`` (counter-clockwise positive) about the optical centre
    inside the fixed field stop and overlays (section comment above): the CPU path, one sample."""
    _c, h, w = img.shape
    if view.has_scene:
        cx, cy, _ = _host.field_geometry(view.field)
    else:
        cx, cy = w / 2.0, h / 2.0
    t = math.radians(float(p["degrees"]))
    c, s = math.cos(t), math.sin(t)
    dx = np.arange(w, dtype=np.float64)[None, :] + 0.5 - cx
    dy = np.arange(h, dtype=np.float64)[:, None] + 0.5 - cy
    map_x = (c * dx - s * dy + cx - 0.5).astype(np.float32)
    map_y = (s * dx + c * dy + cy - 0.5).astype(np.float32)
    weight = optics.view_aperture(view) * view.tissue  # 0 off the tissue: kept exactly
    radiance = optics.tissue_radiance(
        img, optics.view_aperture(view, "tissue", optics.RADIANCE_REACH, framed=True)
    )
    out = optics.remap_planes(radiance, map_x, map_y, cv2.BORDER_REFLECT_101)
    out -= radiance
    out *= weight[None]
    out += img
    return out
