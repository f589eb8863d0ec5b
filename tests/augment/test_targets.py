"""Boxes and masks follow geometric ops, against independent computations: a painted box
warped by the real image kernel (its bounding box, its thresholded pixels) and OpenCV's own
nearest-neighbour warps; photometric ops pass targets through untouched."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.augment import Augment, apply_plans, load_policy, plan_batch
from perturb.augment.targets import move_boxes, move_masks
from perturb.catalog.specs import get_spec
from perturb.errors import InputError
from perturb.ops.geometry import crop_box, translation_pixels

H, W = 72, 96
BOXES = [
    (30.0, 20.0, 62.0, 50.0),
    (18.0, 26.0, 47.0, 41.0),
    (40.0, 15.0, 70.0, 55.0),
    (25.0, 30.0, 75.0, 45.0),
]


def _paint(box: tuple[float, float, float, float]) -> torch.Tensor:
    """1 where the pixel centre lies inside the box (H, W float32)."""
    ys = torch.arange(H, dtype=torch.float64) + 0.5
    xs = torch.arange(W, dtype=torch.float64) + 0.5
    m = ((ys >= box[1]) & (ys < box[3]))[:, None] & ((xs >= box[0]) & (xs < box[2]))[None, :]
    return m.to(torch.float32)


def _bbox(mask: np.ndarray) -> tuple[float, float, float, float]:
    rows, cols = np.nonzero(mask)
    return (float(cols.min()), float(rows.min()), float(cols.max() + 1), float(rows.max() + 1))


def _single_op_plans(op: str, severity: int, n: int = 4) -> list:
    policy = load_policy({"ops": [op], "severity": severity})
    return plan_batch(policy, seed=11, epoch=severity, indices=range(n))


@pytest.fixture(scope="module")
def painted() -> torch.Tensor:
    return torch.stack([_paint(b) for b in BOXES]).unsqueeze(1)  # (4, 1, H, W)


@pytest.mark.parametrize("op", ["resized_crop", "rotation", "translation", "lens_distortion"])
@pytest.mark.parametrize("severity", [1, 3, 5])
def test_boxes_match_the_warped_painted_box(op: str, severity: int, painted: torch.Tensor) -> None:
    plans = _single_op_plans(op, severity)
    warped = apply_plans(painted, plans)[:, 0].numpy() > 0.5
    moved = move_boxes([[b] for b in BOXES], plans, (W, H))
    for i in range(len(BOXES)):
        got = moved[i][0].tolist()
        want = _bbox(warped[i])
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1.5, (op, got, want)


# lens_distortion is left out here: a tissue-layer op, it keeps the dark surround of the painted
# frame (the scene's surround) while the mask moves everywhere; its masks are checked against its
# boxes in tests/ops/test_clinical_ops.py
@pytest.mark.parametrize("op", ["resized_crop", "rotation", "translation"])
@pytest.mark.parametrize("severity", [2, 5])
def test_masks_agree_with_the_image_kernel(op: str, severity: int, painted: torch.Tensor) -> None:
    """Nearest sampling at the kernel's source positions: the moved mask equals the bicubic
    warp of the painted mask thresholded at 1/2, except on the edge (exactly for shifts)."""
    plans = _single_op_plans(op, severity)
    masks = painted[:, 0] > 0.5
    moved = move_masks(masks, plans)
    assert moved.dtype == torch.bool and moved.shape == masks.shape
    warped = apply_plans(painted, plans)[:, 0] > 0.5
    differ = (moved != warped).sum(dim=(1, 2))
    if op == "translation":
        assert int(differ.max()) == 0
    else:
        perimeter = torch.tensor([2 * ((b[2] - b[0]) + (b[3] - b[1])) for b in BOXES])
        assert bool((differ <= 0.15 * perimeter).all()), differ


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


def test_rotation_masks_match_opencv_nearest(painted: torch.Tensor) -> None:
    plans = _single_op_plans("rotation", 5)
    labels = (painted[:, 0] > 0.5).to(torch.uint8) * 7  # a label value, not 0/1
    moved = move_masks(labels, plans).numpy()
    for i, plan in enumerate(plans):
        angle = plan[0].params["degrees"]
        m = cv2.getRotationMatrix2D((W / 2 - 0.5, H / 2 - 0.5), angle, 1.0)
        ref = cv2.warpAffine(labels[i].numpy(), m, (W, H), flags=cv2.INTER_NEAREST, borderValue=0)
        assert set(np.unique(moved[i])) <= {0, 7}
        assert _iou(moved[i] == 7, ref == 7) > 0.95


def test_resized_crop_masks_match_opencv_nearest(painted: torch.Tensor) -> None:
    plans = _single_op_plans("resized_crop", 5)
    labels = (painted[:, 0] > 0.5).to(torch.int64)
    moved = move_masks(labels, plans).numpy()
    for i, plan in enumerate(plans):
        p = {k: float(np.float32(v)) for k, v in plan[0].params.items()}
        x0, y0, cw, ch = crop_box(W, H, p["scale"], p["log_ratio"], p["u"], p["v"])
        crop = labels[i].numpy()[y0 : y0 + ch, x0 : x0 + cw].astype(np.uint8)
        ref = cv2.resize(crop, (W, H), interpolation=cv2.INTER_NEAREST_EXACT)
        assert _iou(moved[i] == 1, ref == 1) > 0.95


def test_translation_masks_are_exact_shifts(painted: torch.Tensor) -> None:
    plans = _single_op_plans("translation", 4)
    masks = (painted > 0.5).to(torch.int32)  # (B, 1, H, W)
    moved = move_masks(masks, plans)
    assert moved.shape == masks.shape and moved.dtype == torch.int32
    for i, plan in enumerate(plans):
        p = plan[0].params
        tx, ty = translation_pixels(
            W, H, float(np.float32(p["shift"])), float(np.float32(p["direction"]))
        )
        ref = np.zeros((H, W), dtype=np.int32)
        src = masks[i, 0].numpy()
        ys, xs = np.nonzero(src)
        keep = (ys + ty >= 0) & (ys + ty < H) & (xs + tx >= 0) & (xs + tx < W)
        ref[ys[keep] + ty, xs[keep] + tx] = 1
        assert np.array_equal(moved[i, 0].numpy(), ref)


@pytest.mark.parametrize("op", ["brightness", "gaussian_blur", "specular_glare", "jpeg"])
def test_photometric_ops_pass_targets_through(op: str, painted: torch.Tensor) -> None:
    assert get_spec(op).family != "geometry"
    plans = _single_op_plans(op, 3)
    masks = painted[:, 0] > 0.5
    assert torch.equal(move_masks(masks, plans), masks)
    moved = move_boxes([[b] for b in BOXES], plans, (W, H))
    assert [m[0].tolist() for m in moved] == [list(b) for b in BOXES]


def test_augment_chain_moves_targets_like_pixels() -> None:
    """A 3-op chain (two geometric ops in a random order, one photometric) through the module:
    boxes match the painted boxes warped by the same module call."""
    policy = load_policy(
        {"ops": ["rotation", "translation", "brightness"], "num_ops": 3, "severity": [1, 3]}
    )
    augment = Augment(policy, seed=4, return_records=True)
    images = torch.stack([_paint(b) for b in BOXES]).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()
    masks = torch.stack([_paint(b) for b in BOXES]).to(torch.uint8)
    out = augment(images, [10, 11, 12, 13], boxes=[[b] for b in BOXES], masks=masks)
    assert out.records is not None and all(len(r) == 3 for r in out.records)
    # brightness shifts the painted values: threshold between the two shifted levels
    for i in range(len(BOXES)):
        level = out.images[i, 0]
        warped = (level > (level.max() + level.min()) / 2).numpy()
        got, want = out.boxes[i][0].tolist(), _bbox(warped)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 2.0, (got, want)
        differ = int((out.masks[i].bool().numpy() != warped).sum())
        assert differ <= 0.15 * 2 * ((BOXES[i][2] - BOXES[i][0]) + (BOXES[i][3] - BOXES[i][1]))
    assert out.masks.dtype == torch.uint8 and out.masks.shape == masks.shape


def test_boxes_leaving_the_frame_are_empty_and_many_boxes_per_image() -> None:
    policy = load_policy({"ops": ["translation"], "severity": 5})
    plans = plan_batch(policy, seed=0, epoch=0, indices=[0])
    tx, ty = translation_pixels(
        W,
        H,
        float(np.float32(plans[0][0].params["shift"])),
        float(np.float32(plans[0][0].params["direction"])),
    )
    edge = (0.0, 0.0, 3.0, 3.0) if tx < 0 or ty < 0 else (W - 3.0, H - 3.0, float(W), float(H))
    moved = move_boxes([[edge, BOXES[0], BOXES[1]]], plans, (W, H))[0]
    assert moved.shape == (3, 4)
    x1, y1, x2, y2 = moved[0].tolist()
    assert (x2 - x1) * (y2 - y1) == 0
    assert math.isclose(moved[1, 2] - moved[1, 0], BOXES[0][2] - BOXES[0][0])
    assert move_boxes([[]], plans, (W, H))[0].shape == (0, 4)


def test_boxes_are_clipped_to_the_frame_whether_or_not_ops_were_drawn() -> None:
    """A box reaching out of the frame comes back clipped by a photometric chain, by an empty
    chain (a sample not augmented) and in eval() alike: never one form or the other by chance."""
    box = [[-10.0, -5.0, W + 40.0, 30.0]]
    clipped = torch.tensor([[0.0, 0.0, float(W), 30.0]])
    photometric = plan_batch(load_policy({"ops": ["contrast"], "probability": 1.0}), seed=0, epoch=0, indices=[0])
    assert photometric[0]
    for plans in (photometric, [[]]):
        assert torch.equal(move_boxes([box], plans, (W, H))[0], clipped)
    augment = Augment(load_policy({"ops": ["contrast"], "probability": 0.5}), seed=0).eval()
    result = augment(torch.zeros(1, 3, H, W), [0], boxes=[box])
    assert result.boxes is not None and torch.equal(result.boxes[0], clipped)


def test_target_errors() -> None:
    plans = _single_op_plans("rotation", 2, n=2)
    with pytest.raises(InputError, match="one list per image"):
        move_boxes([[BOXES[0]]], plans, (W, H))
    with pytest.raises(InputError, match=r"shape \(N, 4\)"):
        move_boxes([[(1.0, 2.0, 3.0)], []], plans, (W, H))
    with pytest.raises(InputError, match=r"\(B, H, W\) or \(B, 1, H, W\)"):
        move_masks(torch.zeros(2, 1, 1, H, W), plans)
    augment = Augment(load_policy({"ops": ["rotation"]}))
    with pytest.raises(InputError, match="resize them to the images first"):
        augment(torch.zeros(2, 3, H, W), [0, 1], masks=torch.zeros(2, H + 1, W))


@settings(max_examples=40, deadline=None)
@given(
    x1=st.floats(0, W - 2),
    y1=st.floats(0, H - 2),
    bw=st.floats(1, W),
    bh=st.floats(1, H),
    index=st.integers(0, 10**6),
    severity=st.integers(1, 5),
)
def test_moved_boxes_stay_in_frame_and_shifts_are_exact(
    x1: float, y1: float, bw: float, bh: float, index: int, severity: int
) -> None:
    box = (x1, y1, min(x1 + bw, W), min(y1 + bh, H))
    policy = load_policy(
        {
            "ops": ["rotation", "resized_crop", "translation"],
            "num_ops": [1, 3],
            "severity": severity,
        }
    )
    plans = plan_batch(policy, seed=1, epoch=0, indices=[index])
    moved = move_boxes([[box]], plans, (W, H))[0][0].tolist()
    assert 0 <= moved[0] <= moved[2] <= W and 0 <= moved[1] <= moved[3] <= H
    if [r.op for r in plans[0]] == ["translation"]:
        p = plans[0][0].params
        tx, ty = translation_pixels(
            W, H, float(np.float32(p["shift"])), float(np.float32(p["direction"]))
        )
        want = [
            min(max(v + d, 0.0), lim)
            for v, d, lim in zip(box, (tx, ty, tx, ty), (W, H, W, H), strict=True)
        ]
        assert np.allclose(moved, want, atol=1e-4)
