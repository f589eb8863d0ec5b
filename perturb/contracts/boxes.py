"""Boxes and ``<loc_x1_y1_x2_y2>`` tags: parsing, IoU and matching. Pure Python + NumPy (no
torch), shared by :mod:`perturb.engine.annotations` (boxes through geometry) and the scorer.

Boxes are ``(x1, y1, x2, y2)`` in pixels of the original image.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

Box = tuple[float, float, float, float]

LOC_TAG = re.compile(
    r"<loc_(-?\d+(?:\.\d+)?)_(-?\d+(?:\.\d+)?)_(-?\d+(?:\.\d+)?)_(-?\d+(?:\.\d+)?)>"
)
_LOC_SPACE = re.compile(r"\s*<loc_[^>]*>\s*")


def parse_loc_tags(text: str) -> list[Box]:
    """The boxes of every ``<loc_x1_y1_x2_y2>`` tag in ``text``, in order, as written."""
    return [tuple(float(g) for g in m.groups()) for m in LOC_TAG.finditer(text)]  # type: ignore[misc]


def loc_tag(box: Sequence[float]) -> str:
    """The ``<loc_x1_y1_x2_y2>`` tag of ``box``, rounded to whole pixels."""
    return "<loc_{}_{}_{}_{}>".format(*(round(v) for v in box))


def sort_corners(box: Sequence[float]) -> Box:
    """``box`` with x1 <= x2 and y1 <= y2."""
    x1, y1, x2, y2 = (float(v) for v in box)
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def strip_loc_tags(text: str) -> str:
    """``text`` without its loc tags (and the space around each, collapsed to one)."""
    return _LOC_SPACE.sub(" ", text).strip()


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def iou_matrix(pred: Sequence[Sequence[float]], ref: Sequence[Sequence[float]]) -> np.ndarray:
    """IoU of every predicted box (rows) with every reference box (columns)."""
    p = np.asarray(pred, dtype=np.float64).reshape(-1, 4)
    r = np.asarray(ref, dtype=np.float64).reshape(-1, 4)
    ix = np.clip(
        np.minimum(p[:, None, 2], r[None, :, 2]) - np.maximum(p[:, None, 0], r[None, :, 0]), 0, None
    )
    iy = np.clip(
        np.minimum(p[:, None, 3], r[None, :, 3]) - np.maximum(p[:, None, 1], r[None, :, 1]), 0, None
    )
    inter = ix * iy
    area_p = (p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1])
    area_r = (r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])
    union = area_p[:, None] + area_r[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def match_boxes(
    pred: Sequence[Sequence[float]], ref: Sequence[Sequence[float]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-to-one matching of predicted to reference boxes maximising the summed IoU
    (Hungarian algorithm); returns (pred indices, ref indices, their IoUs)."""
    if len(pred) == 0 or len(ref) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    from scipy.optimize import linear_sum_assignment

    m = iou_matrix(pred, ref)
    rows, cols = linear_sum_assignment(m, maximize=True)
    return rows, cols, m[rows, cols]


def matched_mean_iou(pred: Sequence[Sequence[float]], ref: Sequence[Sequence[float]]) -> float:
    """Summed IoU of the one-to-one best match over ``max(#pred, #ref)``: 1 only when every box
    has an identical partner, lowered by every missed and every extra box (0 with no prediction;
    1 when neither side has a box)."""
    if len(pred) == 0 and len(ref) == 0:
        return 1.0
    _, _, ious = match_boxes(pred, ref)
    return float(ious.sum()) / max(len(pred), len(ref))


def hit_rate(
    pred: Sequence[Sequence[float]], ref: Sequence[Sequence[float]], threshold: float = 0.5
) -> float:
    """Fraction of reference boxes whose one-to-one matched prediction has IoU >= ``threshold``
    (recall at that IoU; NaN without reference boxes)."""
    if len(ref) == 0:
        return float("nan")
    _, _, ious = match_boxes(pred, ref)
    return float((ious >= threshold).sum()) / len(ref)


__all__ = [
    "LOC_TAG",
    "Box",
    "box_iou",
    "hit_rate",
    "iou_matrix",
    "loc_tag",
    "match_boxes",
    "matched_mean_iou",
    "parse_loc_tags",
    "sort_corners",
    "strip_loc_tags",
]
