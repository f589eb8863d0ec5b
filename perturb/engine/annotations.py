"""Boxes and ``<loc_x1_y1_x2_y2>`` answer tags carried through the ops applied to an image.

Geometric ops move annotations exactly as they move the pixels; every other op (photometric:
noise, blur, X-ray artifacts, ...) passes them through untouched.

Coordinates are continuous pixel coordinates (pixel ``(i, j)`` covers ``[i, i+1) x [j, j+1)``,
the convention of ``perturb.ops.geometry``) in the ORIGINAL image's pixels: a box given for an
``original_size`` image (e.g. the DICOM) whose pixels were resized to ``image_size`` before the
op ran is scaled to the working image, moved with the op, and scaled back. A box becomes the
axis-aligned bounding box of its four moved corners (a rotated box's enclosing box), clipped to
the frame. Each result carries flags:

* ``outside``: nothing of the box is left inside the frame (its clipped box is empty);
* ``cut``: the part inside the frame is below ``min_visible`` of the moved box's area.

Each geometric op says how it moves coordinates through the ``Geometry`` registered with its
kernel (``perturb.catalog.ops.geometry_of``): a projective op (affine or a homography, e.g.
``rotation``, ``xray_patient_rotation``) gives its forward matrix and a box's corners are mapped
through the chain's composed matrix; an op that is not projective (``lens_distortion``) moves
points, and a box becomes the bounding box of its moved outline, sampled at
``OUTLINE_POINTS`` points per side. Flips named by other tools' records (``hflip``,
``vertical_flip``, ...) register a geometry too (a flip swaps left and right: questions about
laterality follow the image).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perturb.catalog.ops import UnknownOpError, geometry_of
from perturb.contracts.boxes import LOC_TAG, loc_tag, parse_loc_tags
from perturb.contracts.record import Record
from perturb.errors import InputError
from perturb.ops.kernels import Geometry

DEFAULT_MIN_VISIBLE = 0.5
OUTLINE_POINTS = 64


class AnnotationError(InputError):
    """An op whose effect on annotations is unknown, or a malformed box."""


@dataclass(frozen=True)
class BoxResult:
    """A moved box (x1, y1, x2, y2) in original-pixel coordinates, clipped to the frame."""

    box: tuple[float, float, float, float]
    visible: float  # clipped area / moved area (1.0 when wholly inside)
    flags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def outside(self) -> bool:
        return "outside" in self.flags


def _op_name(record: Record | Mapping[str, Any]) -> str:
    return record.op if isinstance(record, Record) else str(record["op"])


def _params(record: Record | Mapping[str, Any]) -> dict[str, Any]:
    """The record's parameters; a border-protecting record's scene descriptor rides along as
    ``scene`` (an op that turns the tissue about its optical centre, ``scope_roll``, reads it)."""
    params = dict(record.params if isinstance(record, Record) else record["params"])
    protect = record.protect_border if isinstance(record, Record) else record.get("protect_border")
    extra = record.extra if isinstance(record, Record) else record.get("extra") or {}
    if protect and "scene" in extra and "scene" not in params:
        params["scene"] = extra["scene"]
    return params


def op_geometry(op: str) -> Geometry | None:
    """How records of ``op`` move coordinates (None: they leave them in place)."""
    try:
        return geometry_of(op)
    except UnknownOpError:
        raise AnnotationError(f"unknown op {op!r}: cannot tell how it moves annotations") from None


def is_geometric(op: str) -> bool:
    return op_geometry(op) is not None


def forward_matrix(record: Record | Mapping[str, Any], width: int, height: int) -> np.ndarray:
    """3x3 map from input to output continuous coordinates of one op on a ``width`` x
    ``height`` image (the identity for photometric ops)."""
    op = _op_name(record)
    geometry = op_geometry(op)
    if geometry is None:
        return np.eye(3)
    if geometry.matrix is None:
        raise AnnotationError(f"geometric op {op!r} is not projective: it has no matrix; move points with forward_points")
    return geometry.matrix(_params(record), width, height)


def forward_points(
    record: Record | Mapping[str, Any], points: np.ndarray, width: int, height: int
) -> np.ndarray:
    """Move (N, 2) continuous points through one op on a ``width`` x ``height`` image."""
    geometry = op_geometry(_op_name(record))
    if geometry is None:
        return np.asarray(points, dtype=np.float64)
    return geometry.forward_points(_params(record), points, width, height)


def _outline(x1: float, y1: float, x2: float, y2: float) -> np.ndarray:
    t = np.linspace(0.0, 1.0, OUTLINE_POINTS)
    xs, ys = x1 + (x2 - x1) * t, y1 + (y2 - y1) * t
    return np.concatenate(
        [
            np.stack([xs, np.full_like(t, y1)], 1),
            np.stack([xs, np.full_like(t, y2)], 1),
            np.stack([np.full_like(t, x1), ys], 1),
            np.stack([np.full_like(t, x2), ys], 1),
        ]
    )


def chain_matrix(records: Iterable[Record | Mapping[str, Any]], width: int, height: int) -> np.ndarray:
    """Input -> output map of records applied in order (all on ``width`` x ``height`` images)."""
    total = np.eye(3)
    for record in records:
        total = forward_matrix(record, width, height) @ total
    return total


def transform_boxes(
    boxes: Sequence[Sequence[float]] | np.ndarray,
    records: Record | Mapping[str, Any] | Sequence[Record | Mapping[str, Any]],
    image_size: tuple[int, int],
    original_size: tuple[float, float] | None = None,
    *,
    min_visible: float = DEFAULT_MIN_VISIBLE,
) -> list[BoxResult]:
    """Move boxes (x1, y1, x2, y2), in pixels of an ``original_size`` = (W0, H0) image (default:
    ``image_size``), through ``records`` applied in order to an ``image_size`` = (W, H) image."""
    recs = [records] if isinstance(records, Record | Mapping) else list(records)
    width, height = image_size
    w0, h0 = original_size if original_size is not None else (float(width), float(height))
    scale = np.diag([width / w0, height / h0, 1.0])
    geometries = [op_geometry(_op_name(r)) for r in recs]
    affine = all(g is None or g.projective for g in geometries)
    total = np.linalg.inv(scale) @ chain_matrix(recs, width, height) @ scale if affine else np.eye(3)
    out = []
    for box in np.asarray(boxes, dtype=np.float64).reshape(-1, 4):
        x1, y1, x2, y2 = (float(v) for v in box)
        if not (x2 >= x1 and y2 >= y1):
            raise AnnotationError(f"box {box.tolist()} needs x1 <= x2 and y1 <= y2")
        if affine:
            corners = np.array([[x1, x2, x2, x1], [y1, y1, y2, y2], [1.0, 1.0, 1.0, 1.0]])
            moved = total @ corners
            moved = moved[:2] / moved[2]  # projective ops (patient rotation) divide; affine: / 1
        else:  # through each op in the working image's pixels, then back to original pixels
            pts = _outline(x1, y1, x2, y2) * [width / w0, height / h0]
            for record in recs:
                pts = forward_points(record, pts, width, height)
            moved = (pts / [width / w0, height / h0]).T
        mx1, mx2 = float(moved[0].min()), float(moved[0].max())
        my1, my2 = float(moved[1].min()), float(moved[1].max())
        cx1, cx2 = min(max(mx1, 0.0), w0), min(max(mx2, 0.0), w0)
        cy1, cy2 = min(max(my1, 0.0), h0), min(max(my2, 0.0), h0)
        area = (mx2 - mx1) * (my2 - my1)
        clipped = (cx2 - cx1) * (cy2 - cy1)
        outside = mx2 <= 0.0 or my2 <= 0.0 or mx1 >= w0 or my1 >= h0
        visible = 0.0 if outside else (clipped / area if area > 0 else 1.0)
        flags: list[str] = []
        if outside:
            flags.append("outside")
        elif visible < min_visible:
            flags.append("cut")
        out.append(BoxResult((cx1, cy1, cx2, cy2), visible, tuple(flags)))
    return out


def transform_loc_text(
    text: str,
    records: Record | Mapping[str, Any] | Sequence[Record | Mapping[str, Any]],
    image_size: tuple[int, int],
    original_size: tuple[float, float] | None = None,
    *,
    min_visible: float = DEFAULT_MIN_VISIBLE,
) -> tuple[str, list[BoxResult]]:
    """Rewrite every loc tag of ``text`` with its moved, clipped box (rounded to whole original
    pixels); returns the new text and one ``BoxResult`` per tag (flags included). Tags of boxes
    that left the frame are kept, clipped to an empty box on the frame edge, and flagged."""
    boxes = parse_loc_tags(text)
    if not boxes:
        return text, []
    results = transform_boxes(boxes, records, image_size, original_size, min_visible=min_visible)
    it = iter(results)

    def replace(_: re.Match[str]) -> str:
        r = next(it)
        return loc_tag(r.box)

    return LOC_TAG.sub(replace, text), results


__all__ = [
    "AnnotationError",
    "BoxResult",
    "chain_matrix",
    "forward_matrix",
    "forward_points",
    "is_geometric",
    "op_geometry",
    "transform_boxes",
    "transform_loc_text",
]
