"""Phantoms: deterministic from the key, their content is what their truth says, and their QA
rows follow the Kvasir-VQA-x1 schema with answers taken from the truth."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from perturb.datasets.kvasir_vqa_x1 import QUESTION_CLASSES
from perturb.datasets.phantoms import builtin_dataset, phantom_id, phantom_image
from perturb.datasets.phantoms.endoscopy import (
    POLYP_COLORS,
    cell_of,
    fov_mask,
    qa_rows,
    render,
)

KEYS = [phantom_id(i) for i in range(24)]


def test_deterministic_and_keyed() -> None:
    a, b = render("k1"), render("k1")
    assert np.array_equal(a.image, b.image) and a.truth == b.truth
    assert not np.array_equal(a.image, render("k2").image)
    assert render("k1", (200, 160)).image.shape == (160, 200, 3)
    with pytest.raises(ValueError, match="64x64"):
        render("k", (32, 32))


def test_every_feature_occurs_over_a_few_keys() -> None:
    truths = [render(k).truth for k in KEYS]
    assert {t.polyp_count for t in truths} == {0, 1, 2, 3}
    assert {t.fov for t in truths} == {"octagon", "circle"}
    assert {t.box for t in truths} == {True, False} and {t.text is None for t in truths} == {
        True,
        False,
    }
    assert {t.polyp_color for t in truths if t.polyp_count} == set(POLYP_COLORS)


@pytest.mark.parametrize("key", KEYS[:12])
def test_content_matches_truth(key: str) -> None:
    p = render(key)
    img, t = p.image.astype(float) / 255, p.truth
    h, w = img.shape[:2]
    # dark field-of-view border: the top-right corner is outside any FOV and has no overlay
    assert img[: h // 20, -w // 20 :].max() < 0.07
    assert img[h // 2, w // 2].max() > 0.05 or t.polyp_count  # tissue (or a polyp) in the middle
    # polyps: inside their grid cell and the FOV, coloured as stated
    fov = fov_mask(w, h, t.fov, t.fov_margin)
    for polyp in t.polyps:
        assert cell_of(polyp.cx, polyp.cy, w, h) == polyp.cell
        assert fov[int(polyp.cy), int(polyp.cx)] > 0.99
        centre = img[
            int(polyp.cy) - 1 : int(polyp.cy) + 2, int(polyp.cx) - 1 : int(polyp.cx) + 2
        ].mean(axis=(0, 1))
        expected = np.array(POLYP_COLORS[str(t.polyp_color)])
        assert np.abs(centre / centre.max() - expected / expected.max()).max() < 0.2, (
            centre,
            t.polyp_color,
        )
    assert len({p.cell for p in t.polyps}) == t.polyp_count  # one polyp per cell: countable
    # overlays
    corner = img[int(0.8 * h) :, : int(0.2 * w)]
    green = (corner[..., 1] > corner[..., 0] + 0.15) & (corner[..., 1] > corner[..., 2] + 0.1)
    assert bool(green.mean() > 0.3) == t.box
    top = img[: int(0.06 * h), : int(0.3 * w)]
    assert bool((top.min(axis=2) > 0.6).sum() > 10) == (t.text is not None)


def test_qa_rows_follow_the_schema_and_the_truth() -> None:
    for key in KEYS[:10]:
        truth = render(key).truth
        rows = qa_rows(key, truth)
        assert [r["complexity"] for r in rows] == [1, 1, 1, 2, 2, 3]
        for r in rows:
            original = json.loads(r["original"])
            assert len(original) == r["complexity"] == len(r["question_class"])
            assert all(set(o) == {"q", "a"} for o in original)
            assert set(r["question_class"]) <= set(QUESTION_CLASSES)
            for o, cls in zip(original, r["question_class"], strict=True):
                if cls == "polyp_count":
                    assert o["a"] == str(truth.polyp_count)
                elif cls == "abnormality_location":
                    assert o["a"] == ", ".join(truth.locations)
                elif cls == "box_artifact_presence":
                    assert o["a"] == ("yes" if truth.box else "no")
                elif cls == "text_presence":
                    assert o["a"] == ("yes" if truth.text else "no")
                elif cls == "abnormality_color":
                    assert o["a"] == truth.polyp_color
                assert o["a"] in r["answer"]
    assert len(QUESTION_CLASSES) == 18


def test_builtin_dataset_and_preview_image() -> None:
    ds = builtin_dataset(3, size=(96, 80))
    assert ds.column_names == [
        "image",
        "img_id",
        "complexity",
        "question",
        "answer",
        "original",
        "question_class",
    ]
    assert len(ds) == 18 and ds.unique("img_id") == [phantom_id(i) for i in range(3)]
    assert ds[0]["image"].size == (96, 80)
    assert ds.to_dict() == builtin_dataset(3, size=(96, 80)).to_dict()
    x = phantom_image("preview")
    assert (
        x.dtype == torch.float32
        and x.shape == (3, 320, 400)
        and float(x.min()) >= 0
        and float(x.max()) <= 1
    )
