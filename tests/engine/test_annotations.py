"""Boxes and loc tags through geometry (perturb.engine.annotations) against an independent computation:
each box of the samples' xray/boxes.csv (tests.helpers.SAMPLES) is painted as a mask, the mask is warped by the
real op (same key, so the same parameters as the image), and the moved box must match the
bounding box of the warped mask."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

import perturb
from perturb.contracts.boxes import box_iou, parse_loc_tags
from perturb.engine.annotations import AnnotationError, transform_boxes, transform_loc_text
from tests.helpers import SAMPLES, sample_tensor

BOXES_CSV = SAMPLES / "xray" / "boxes.csv"
GEOMETRIC = ["resized_crop", "rotation", "translation"]


def _rows() -> list[dict[str, str]]:
    with BOXES_CSV.open() as f:
        return list(csv.DictReader(f))


def _box(row: dict[str, str]) -> tuple[float, float, float, float]:
    return (float(row["x_min"]), float(row["y_min"]), float(row["x_max"]), float(row["y_max"]))


def _paint(h: int, w: int, box: tuple[float, float, float, float]) -> torch.Tensor:
    """1 where the pixel centre lies in the box."""
    ys = torch.arange(h, dtype=torch.float64) + 0.5
    xs = torch.arange(w, dtype=torch.float64) + 0.5
    inside_y = (ys >= box[1]) & (ys < box[3])
    inside_x = (xs >= box[0]) & (xs < box[2])
    return (inside_y[:, None] & inside_x[None, :]).to(torch.float32).view(1, 1, h, w)


def _mask_box(mask: np.ndarray) -> tuple[float, float, float, float] | None:
    rows, cols = np.nonzero(mask > 0.5)
    if rows.size == 0:
        return None
    return (float(cols.min()), float(rows.min()), float(cols.max() + 1), float(rows.max() + 1))


def test_boxes_csv_is_there() -> None:
    assert BOXES_CSV.exists() and len(_rows()) >= 5


@pytest.mark.parametrize("op", GEOMETRIC)
@pytest.mark.parametrize("severity", [2, 5])
def test_boxes_move_with_the_image(op: str, severity: int) -> None:
    for row in _rows():
        path = Path(BOXES_CSV.parent / row["file"])
        h, w = sample_tensor(path).shape[-2:]
        box = _box(row)
        mask = _paint(h, w, box)
        moved_mask, records = perturb.apply(mask, op, severity, [row["file"]], seed=3)
        expected = _mask_box(moved_mask[0, 0].numpy())
        (result,) = transform_boxes([box], records, (w, h))
        if expected is None:
            assert result.outside
            continue
        # the mask quantises each edge to whole pixels (up to the zoom factor of the crop)
        assert max(abs(a - b) for a, b in zip(result.box, expected, strict=True)) < 2.5, (row["file"], result, expected)
        assert box_iou(result.box, expected) > 0.95
        painted = float(moved_mask.sum())
        assert not result.outside and painted > 0


def test_loc_tags_in_original_pixels_follow_a_chain_of_ops() -> None:
    """VinDr-style: tags in original (DICOM) pixels, the image resized before perturbing; a
    photometric op in the chain changes nothing."""
    row = _rows()[2]
    path = BOXES_CSV.parent / row["file"]
    h, w = sample_tensor(path).shape[-2:]
    scale = 2.5  # the original was 2.5 times larger
    box = _box(row)
    original = tuple(round(v * scale) for v in box)
    text = "Nodule in the right upper zone <loc_{}_{}_{}_{}>; no other finding.".format(*original)
    image = sample_tensor(path).unsqueeze(0)
    out1, rec1 = perturb.apply(image, "xray_gamma", 3, [row["file"]])
    _, rec2 = perturb.apply(out1, "rotation", 4, [row["file"]])
    _, rec3 = perturb.apply(out1, "translation", 2, [row["file"]])
    chain = [rec1[0], rec2[0], rec3[0]]
    new_text, _ = transform_loc_text(text, chain, (w, h), (w * scale, h * scale))
    assert new_text.startswith("Nodule in the right upper zone <loc_") and new_text.endswith("; no other finding.")
    (tag,) = parse_loc_tags(new_text)
    # independent: warp the mask of the box (in working pixels) through the same geometric ops
    mask = _paint(h, w, tuple(v / scale for v in original))  # type: ignore[arg-type]
    moved = perturb.replay([rec2[0], rec3[0]], mask[0])
    expected = _mask_box(moved[0].numpy())
    assert expected is not None
    assert max(abs(a / scale - b) for a, b in zip(tag, expected, strict=True)) < 2.5
    # photometric records alone leave the text untouched
    same, res = transform_loc_text(text, rec1, (w, h), (w * scale, h * scale))
    assert same == text and res[0].flags == ()


def test_flags_for_boxes_that_leave_or_are_cut_by_the_frame() -> None:
    w = h = 100
    shift = {"op": "translation", "params": {"shift": 0.3, "direction": 0.0}}  # 30 px right
    inside, cut, gone = transform_boxes([[10, 10, 30, 30], [60, 40, 90, 60], [75, 5, 95, 15]], shift, (w, h))
    assert inside.box == (40, 10, 60, 30) and inside.flags == () and inside.visible == 1.0
    assert cut.box == (90, 40, 100, 60) and cut.flags == ("cut",) and cut.visible == pytest.approx(1 / 3)
    assert gone.flags == ("outside",) and gone.visible == 0.0
    # a set fraction: 1/3 visible is fine at min_visible 0.3
    (ok,) = transform_boxes([[60, 40, 90, 60]], shift, (w, h), min_visible=0.3)
    assert ok.flags == ()


def test_flips_mirror_boxes_like_the_pixels() -> None:
    h, w = 60, 80
    box = (10.0, 5.0, 30.0, 25.0)
    mask = _paint(h, w, box)[0, 0].numpy()
    (hf,) = transform_boxes([box], {"op": "hflip", "params": {}}, (w, h))
    assert hf.box == _mask_box(mask[:, ::-1])
    (vf,) = transform_boxes([box], {"op": "vertical_flip", "params": {}}, (w, h))
    assert vf.box == _mask_box(mask[::-1, :])


def test_unknown_ops_are_refused() -> None:
    with pytest.raises(AnnotationError, match="unknown op"):
        transform_boxes([[0, 0, 1, 1]], {"op": "warp_drive", "params": {}}, (10, 10))
    with pytest.raises(AnnotationError, match="x1 <= x2"):
        transform_boxes([[5, 0, 1, 1]], {"op": "xray_gamma", "params": {}}, (10, 10))
