"""Boxes and masks through a batch's augmentation plans.

Geometric ops move them exactly as the pixels move; photometric ops pass them through.

* Boxes: ``perturb.engine.annotations.transform_boxes`` (the enclosing box of the corners moved by
  the chain's composed map, clipped to the frame once at the end: a part pushed out of the
  frame by one op and brought back by a later one counts as visible, though its pixels are
  black fill) per sample.
* Masks: each geometric op's registered label-map warp (``Geometry.label_maps``: the same
  warps as its image kernel), sampled at the nearest pixel so labels stay labels, 0 where the
  image is black fill.
* Scenes: ``move_scene`` moves an endoscopy scene descriptor (``perturb.scene``: field-of-view
  polygon on the analysis grid, overlay rectangles, field bbox) with a geometric op, so the
  scene of a source image is analysed once and carried through the crops and warps of a chain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch

from perturb.augment.plan import put_rows, take_rows
from perturb.contracts.record import Record
from perturb.engine import run as engine
from perturb.engine.annotations import op_geometry, transform_boxes
from perturb.errors import InputError

BoxesIn = Sequence[Sequence[Sequence[float]] | np.ndarray | torch.Tensor]


def _as_boxes(boxes: object, i: int) -> np.ndarray:
    if isinstance(boxes, torch.Tensor):
        boxes = boxes.detach().cpu().numpy()
    try:
        arr = np.asarray(boxes, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.zeros((0, 3))
    if arr.size == 0:
        return arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4 or not np.isfinite(arr).all():
        raise InputError(
            f"boxes[{i}] must be a list of [x1, y1, x2, y2] in pixels (shape (N, 4)), "
            f"got shape {arr.shape}"
        )
    return arr


def move_boxes(
    boxes: BoxesIn, plans: Sequence[Sequence[Record]], image_size: tuple[int, int]
) -> list[torch.Tensor]:
    """Each sample's boxes (N_i x [x1, y1, x2, y2], pixels of the ``image_size`` = (W, H)
    batch) moved through its plan and clipped to the frame: float32 (N_i, 4) tensors. A box that
    left the frame comes back empty (zero width or height) on the frame edge."""
    if len(boxes) != len(plans):
        raise InputError(
            f"boxes has {len(boxes)} entries for a batch of {len(plans)}: pass one list per image"
        )
    out = []
    for i, (sample_boxes, plan) in enumerate(zip(boxes, plans, strict=True)):
        arr = _as_boxes(sample_boxes, i)
        if len(arr) and plan:
            moved = transform_boxes(arr, list(plan), image_size)
            arr = np.array([r.box for r in moved], dtype=np.float64)
        elif len(arr):  # clipped as a moved box is: the same box whether or not ops were drawn
            width, height = image_size
            arr = np.clip(arr, 0.0, [width, height, width, height])
        out.append(torch.from_numpy(arr.astype(np.float32)))
    return out


def move_masks(masks: torch.Tensor, plans: Sequence[Sequence[Record]]) -> torch.Tensor:
    """Masks (B x H x W or B x C x H x W, any dtype) through the geometric ops of each plan,
    same shape and dtype out; the input tensor is not modified."""
    if not isinstance(masks, torch.Tensor) or masks.ndim not in (3, 4):
        shape = tuple(masks.shape) if isinstance(masks, torch.Tensor) else type(masks).__name__
        raise InputError(f"masks must be a tensor of shape (B, H, W) or (B, 1, H, W), got {shape}")
    if masks.shape[0] != len(plans):
        raise InputError(f"masks has {masks.shape[0]} entries for a batch of {len(plans)}")
    m = masks.unsqueeze(1) if masks.ndim == 3 else masks
    out = m
    depth = max((len(p) for p in plans), default=0)
    for position in range(depth):
        groups: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            if position < len(plan) and op_geometry(plan[position].op) is not None:
                groups.setdefault(plan[position].op, []).append(i)
        for op, idx in groups.items():
            geometry = op_geometry(op)
            assert geometry is not None
            params = engine.collate([plans[i][position].params for i in idx], m.device)
            if out is m:
                out = m.clone()
            put_rows(out, idx, geometry.label_maps(take_rows(out, idx), params))
    return out[:, 0] if masks.ndim == 3 else out


# Largest step between consecutive points of the field polygon moved by an op that is not
# projective (lens distortion bends straight edges), in analysis-grid pixels.
_CURVED_STEP = 4.0


def _densified(poly: np.ndarray, step: float) -> np.ndarray:
    """The closed polygon ``poly`` (N, 2) with points added along each edge, ``step`` apart."""
    out = []
    for a, b in zip(poly, np.roll(poly, -1, axis=0), strict=True):
        n = max(1, math.ceil(float(np.hypot(*(b - a))) / step))
        out.append(a + (b - a) * (np.arange(n)[:, None] / n))
    return np.concatenate(out)


def move_scene(
    descriptor: dict[str, Any], record: Record, width: int, height: int
) -> dict[str, Any]:
    """The scene descriptor of a ``width`` x ``height`` image after ``record``'s geometric op
    moved every pixel (a new dict; ``descriptor`` is not modified; a photometric record, or one
    that keeps the frame in place because it protects the border, returns an equal copy).

    The field polygon's vertices (grid pixel centres) move with the op and are rounded back to
    the grid; the field of a frame without a surround (``full``) stays the whole frame where
    the moved frame still covers it, else it becomes the moved rectangle (black fill is
    surround). Overlay rectangles become the pixel bounding boxes of their moved outlines,
    clipped to the frame (dropped when nothing is left); ``bbox`` is recomputed as the analysis
    computes it. Ops that are not projective move edge points 4 grid pixels apart."""
    geometry = op_geometry(record.op)
    out = {**descriptor, "overlays": [list(o) for o in descriptor["overlays"]]}
    out["field"] = [list(p) for p in descriptor["field"]]
    if geometry is None or record.protect_border:
        return out
    h, w = (int(v) for v in descriptor["size"])
    if (h, w) != (height, width):
        raise InputError(
            f"scene of a {h}x{w} image cannot move with an op on a {height}x{width} image"
        )
    gh, gw = (int(v) for v in descriptor["grid"])
    sx, sy = w / gw, h / gh
    scale = np.array([sx, sy])

    def moved(points: np.ndarray) -> np.ndarray:
        if not geometry.projective:
            points = _densified(points, _CURVED_STEP * min(sx, sy))
        return np.asarray(geometry.forward_points(record.params, points, w, h), dtype=np.float64)

    field = np.asarray(descriptor["field"], dtype=np.float64)
    grid = moved((field + 0.5) * scale) / scale - 0.5
    poly = cv2.convexHull(np.rint(grid).astype(np.int32))
    poly = cv2.approxPolyDP(poly, 0.5, True).reshape(-1, 2)
    corners = [(0.0, 0.0), (gw - 1.0, 0.0), (gw - 1.0, gh - 1.0), (0.0, gh - 1.0)]
    covers = all(cv2.pointPolygonTest(poly.reshape(-1, 1, 2), c, False) >= 0 for c in corners)
    if not (descriptor.get("full") and covers):  # a whole frame still covered keeps its field
        out.pop("full", None)
        out["field"] = [[int(x), int(y)] for x, y in poly]
    overlays = []
    for x0, y0, x1, y1, kind in descriptor["overlays"]:
        box = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)
        pts = moved(box)
        bx0, by0 = (max(0, math.floor(v)) for v in pts.min(axis=0))
        bx1, by1 = math.ceil(min(w, pts[:, 0].max())), math.ceil(min(h, pts[:, 1].max()))
        if bx1 > bx0 and by1 > by0:
            overlays.append([int(bx0), int(by0), int(bx1), int(by1), kind])
    out["overlays"] = overlays
    if out.get("full"):
        out["bbox"] = [0, 0, w, h]
    else:
        fx, fy, fw, fh = cv2.boundingRect(poly.astype(np.int32))
        out["bbox"] = [
            max(0, math.floor((fx - 2) * sx)),
            max(0, math.floor((fy - 2) * sy)),
            min(w, math.ceil((fx + fw + 2) * sx)),
            min(h, math.ceil((fy + fh + 2) * sy)),
        ]
    return out
