"""Boxes and masks through a batch's augmentation plans.

Geometric ops move them exactly as the pixels move; photometric ops pass them through.

* Boxes: ``perturb.annotations.transform_boxes`` (the enclosing box of the corners moved by
  the chain's composed map, clipped to the frame once at the end: a part pushed out of the
  frame by one op and brought back by a later one counts as visible, though its pixels are
  black fill) per sample.
* Masks: each geometric op's registered label-map warp (``Geometry.label_maps``: the same
  warps as its image kernel), sampled at the nearest pixel so labels stay labels, 0 where the
  image is black fill.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from perturb import engine
from perturb.annotations import op_geometry, transform_boxes
from perturb.augment.plan import put_rows, take_rows
from perturb.contracts.record import Record
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
        raise InputError(f"boxes has {len(boxes)} entries for a batch of {len(plans)}: pass one list per image")
    out = []
    for i, (sample_boxes, plan) in enumerate(zip(boxes, plans, strict=True)):
        arr = _as_boxes(sample_boxes, i)
        if len(arr) and plan:
            moved = transform_boxes(arr, list(plan), image_size)
            arr = np.array([r.box for r in moved], dtype=np.float64)
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
