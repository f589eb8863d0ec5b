"""Synthetic chest X-ray phantoms: deterministic, 16-bit gray, anatomy where a PA film has it,
a nodule whose known box is where the pixels are, and QA rows whose answers follow."""

from __future__ import annotations

import numpy as np
import pytest

from perturb.contracts.boxes import parse_loc_tags
from perturb.datasets.phantoms.xray import XRAY_SIZE, builtin_xray_input, render
from perturb.io.images import decode_image

KEYS = [f"cxr_phantom_{i:04d}" for i in range(12)]


def test_deterministic_16_bit_gray() -> None:
    a, b = render(KEYS[0]), render(KEYS[0])
    assert np.array_equal(a.image, b.image) and a.truth == b.truth
    assert a.image.dtype == np.uint16 and a.image.shape == (XRAY_SIZE[1], XRAY_SIZE[0])
    assert len(np.unique(a.image)) > 1000  # uses the 16-bit depth, not 256 levels
    eight = render(KEYS[0], bit_depth=8).image
    assert eight.dtype == np.uint8
    assert not np.array_equal(render(KEYS[1]).image, a.image)


@pytest.mark.parametrize("key", KEYS[:6])
def test_anatomy_is_where_a_pa_film_has_it(key: str) -> None:
    img = render(key).image.astype(np.float64) / 65535.0
    h, w = img.shape
    lungs = (img[int(0.35 * h), int(0.28 * w)], img[int(0.35 * h), int(0.72 * w)])
    spine = img[int(0.35 * h), w // 2]
    abdomen = img[int(0.85 * h), int(0.3 * w)]
    outside = img[h // 2, 1]
    assert max(lungs) < spine and max(lungs) < abdomen  # air is dark, dense is bright
    assert outside < min(lungs)  # nothing attenuates outside the body
    # ribs: a vertical profile through a lung alternates (several local maxima)
    profile = img[int(0.15 * h) : int(0.6 * h), int(0.3 * w)]
    peaks = np.sum((profile[1:-1] > profile[:-2]) & (profile[1:-1] > profile[2:]))
    assert peaks >= 4


def test_nodule_box_and_marker_are_where_the_pixels_are() -> None:
    with_nodule = 0
    for key in KEYS:
        ph = render(key)
        img = ph.image.astype(np.float64) / 65535.0
        t = ph.truth
        if t.nodule_box is not None:
            with_nodule += 1
            # the nodule is what differs from the same film without it, inside its box
            plain = render(key, nodule=False)
            assert plain.truth.nodule_box is None and plain.truth.marker == t.marker
            diff = img - plain.image.astype(np.float64) / 65535.0
            ys, xs = np.nonzero(diff > 0.01)
            x1, y1, x2, y2 = t.nodule_box
            assert x1 <= xs.min() and xs.max() < x2 and y1 <= ys.min() and ys.max() < y2
            assert (xs.max() - xs.min() + 1) >= 0.6 * (x2 - x1)
            cx = (x1 + x2) / 2
            assert (t.nodule_side == "right") == (cx < t.width / 2)  # PA: patient right on the left
        mx1, my1, mx2, my2 = t.marker_box
        assert img[my1:my2, mx1:mx2].max() > 0.95
        assert (t.marker == "R") == (mx2 < t.width / 2)
    assert 0 < with_nodule < len(KEYS)


def test_builtin_input_rows_answer_from_the_truth() -> None:
    inp = builtin_xray_input(4)
    assert inp.annotations is not None and inp.fingerprint == "builtin-xray:4"
    groups, empty = inp.groups()
    assert len(groups) == 4 and not empty
    rows = inp.table_without_image().to_pylist()
    for g in groups:
        truth = render(g.img_id).truth
        mine = [rows[i] for i in g.rows]
        types = {r["type"]: r for r in mine}
        assert types["Which"]["answer"] == truth.marker
        assert types["How_many"]["answer"] == ("1" if truth.nodule_box else "0")
        if truth.nodule_box:
            assert parse_loc_tags(types["Where"]["answer"]) == [
                tuple(float(v) for v in truth.nodule_box)
            ]
        else:
            assert "Where" not in types and all(r["gt_location"] == "" for r in mine)
        img = decode_image(inp.image_bytes(g.rows[0]))
        assert img.dtype == np.uint16 and img.ndim == 2
