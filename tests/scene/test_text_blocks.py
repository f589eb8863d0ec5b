"""Solid blocks of a burned-in text line (a progress bar "■■■/■■■ (0/1)", a cursor) are overlay
whole: wider than a glyph stroke, the glyph cover's top-hat misses their inside, so they are
found by the line's ink colour and a block's shape (``perturb.scene.masks.solid_blocks``)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.datasets.phantoms.endoscopy import fov_mask
from perturb.scene import masks
from tests.scene.frames import frame

# The bar of polypgen_EndoCV2021_001161.jpg (1440x1064), measured on the frame at full
# resolution: six white blocks of 17x18 px in rows 340-357 ("■■■/■■■(0/1)"), the last two over
# the tissue (the others lie in the dark surround or in a glyph overlay box).
BAR_FRAME = "polypgen_EndoCV2021_001161.jpg"
BAR_ROWS = (340, 358)
BAR_BLOCK_COLUMNS = (14, 38, 62, 98, 122, 146)
BAR_BLOCK_WIDTH = 17

Box = tuple[int, int, int, int]


def _bar_frame() -> tuple[np.ndarray, list[Box], Box, tuple[int, int]]:
    """A textured octagonal frame (720x960) with three left-aligned text lines over the tissue:
    a date with a soft specular streak and a time, a progress bar (six solid blocks of 15x14 px,
    a slash and a hollow box) and a short label. Returns the image, the blocks, the hollow box
    and the centre (x, y) of the streak."""
    h, w = 720, 960
    rng = np.random.default_rng(7)
    alpha = fov_mask(w, h, "octagon", 0.03)
    tissue = np.array([170, 80, 70], np.float32) + rng.normal(0, 6, (h, w, 1)).astype(np.float32)
    tissue = cv2.GaussianBlur(tissue, (0, 0), 2.0)
    yy, xx = np.mgrid[0:h, 0:w]
    streak = (326, 294)
    tissue += 400 * np.exp(-((xx - streak[0]) ** 2 / (2 * 9.0**2) + (yy - streak[1]) ** 2 / (2 * 4.0**2)))[..., None]
    img = np.clip(tissue * alpha[..., None], 0, 255).astype(np.uint8)
    ink, font = (235, 235, 235), cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(img, "15/03/2012", (200, 300), font, 0.6, ink, 2, cv2.LINE_AA)
    cv2.putText(img, "12:00", (346, 300), font, 0.6, ink, 2, cv2.LINE_AA)
    blocks: list[Box] = []
    x = 200
    for i in range(6):
        if i == 3:
            cv2.putText(img, "/", (x, 330), font, 0.6, ink, 2, cv2.LINE_AA)
            x += 12
        cv2.rectangle(img, (x, 317), (x + 14, 330), ink, -1)
        blocks.append((x, 317, x + 15, 331))
        x += 19
    hollow = (x, 317, x + 15, 331)
    cv2.rectangle(img, (x, 317), (x + 14, 330), ink, 1)
    cv2.putText(img, "CVP:1", (200, 360), font, 0.6, ink, 2, cv2.LINE_AA)
    return img, blocks, hollow, streak


def test_blocks_of_a_text_line_are_covered_whole_and_tissue_around_them_is_not() -> None:
    img, blocks, hollow, (sx, sy) = _bar_frame()
    s = perturb.scene(img)
    lines = [o[:4] for o in s.overlays if o[4] == "text"]
    assert any(y0 <= 317 and y1 >= 331 and x0 <= 200 and x1 >= hollow[2] for x0, y0, x1, y1 in lines), lines
    alpha, kept = s.tissue_of(img), s.overlay_of(img)
    for x0, y0, x1, y1 in blocks:
        assert (alpha[y0:y1, x0:x1] == 0).all() and kept[y0:y1, x0:x1].all(), f"block {(x0, y0, x1, y1)}"
        gap = alpha[y0 + 2 : y1 - 2, x1 + 2]  # the middle of the 4 px of tissue after the block
        assert (gap == 1).all(), "the tissue between blocks takes the op"
    x0, y0, x1, y1 = hollow
    assert (alpha[y0 + 3 : y1 - 3, x0 + 3 : x1 - 3] == 1).all(), "inside an outlined box is tissue"
    assert alpha[sy - 2 : sy + 3, sx - 6 : sx + 7].min() > 0, "a specular streak in a text line is not a block"
    # the block rule alone, on a box of the date-and-time row around the streak (the search may
    # find the date and the time as two lines, the streak between them): nothing at the streak
    box = (197, 284, 398, 304)  # the date line (197..307) and the time (343..398) as one row
    wx0, wy0, wx1, wy1, _ = masks.glyph_window(s.descriptor, box)
    window = np.ascontiguousarray(np.moveaxis(img, -1, 0)[:, wy0:wy1, wx0:wx1])
    luma = masks._box_luma(window)
    found = masks.solid_blocks(window, luma, (box[0] - wx0, box[1] - wy0, box[2] - wx0, box[3] - wy0), 235)
    assert found is None or not found[sy - 8 - wy0 : sy + 9 - wy0, sx - 14 - wx0 : sx + 15 - wx0].any()


def test_block_cover_is_the_same_for_every_dtype() -> None:
    img, blocks, _, _ = _bar_frame()
    s = perturb.scene(img)
    chw = np.ascontiguousarray(np.moveaxis(img, -1, 0))
    ref = masks.composite_alpha(s.descriptor, chw)
    assert (ref[blocks[0][1] : blocks[0][3], blocks[0][0] : blocks[0][2]] == 0).all()
    for other in (chw.astype(np.uint16) * 257, chw.astype(np.float32) / 255, torch.from_numpy(chw)):
        assert np.array_equal(masks.composite_alpha(s.descriptor, other), ref)


@pytest.mark.parametrize("op", ["vignetting", "motion_blur"])
def test_progress_bar_of_a_real_frame_stays_byte_identical(op: str) -> None:
    img = frame(BAR_FRAME)
    if img is None:
        pytest.skip(f"{BAR_FRAME} is not in the sample set (tests/data ships it)")
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()
    out, _ = perturb.apply(x, op, 5, ["bar"], protect_border=True)
    changed = (out[0].to(torch.int16) - x[0].to(torch.int16)).abs().amax(dim=0).numpy()
    y0, y1 = BAR_ROWS
    for c in BAR_BLOCK_COLUMNS:
        block = changed[y0:y1, c : c + BAR_BLOCK_WIDTH]
        assert not block.any(), f"{op}: block at x={c} changed at {int((block > 0).sum())} px (max {int(block.max())})"
    assert (changed[y0:y1, 240:400] > 0).mean() > 0.9, f"{op} acts on the tissue beside the bar"
