"""Burned-in text over the tissue, measured on the labelled set (``tests/scene/labels.py``):
glyph pixels found and false text cover on the held-back part, highlight-rich frames as
negatives (a highlight kept sharp inside a blurred frame is a seam), the descriptor's ``text``
entry, and glyph survival under every scene-protecting endoscopy op at severity 5."""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.catalog.specs import load_specs
from perturb.datasets.phantoms.endoscopy import fov_mask
from perturb.ops.backend import use_backend
from perturb.scene import masks
from tests.scene.frames import frame
from tests.scene.labels import Labelled, Score, labelled, score

RECALL_TARGET = 0.9  # of the glyph pixels over the tissue
FALSE_AREA_TARGET = 0.003  # text cover away from any glyph, of the tissue
# what the search reaches on the held-back part now (scene version 7: recall 0.952, false area
# 0.019%): a floor above the target that catches a regression before the target fails
RECALL_FLOOR = 0.94
SURVIVAL_LEVELS = 12  # 8-bit levels a glyph pixel may move
SURVIVAL_SHARE = 0.10  # share of glyph pixels that may move more
# real frames without burned-in text over their tissue, rich in specular highlights
NEGATIVES = (
    "polypgen_100H0050.jpg",
    "polypgen_350OLCV1_100H0002.jpg",
    "polypgen_EndoCV2021_C6_0100046.jpg",
    "polypgen_176OLCV1_100H0889.jpg",
    "polypgen_33_endocv2021_positive_958.jpg",
    "polypgen_19_endocv2021_positive_845.jpg",
    "hyperkvasir_seg_cju0qoxqj9q6s0835b43399p4.jpg",
)
PROTECTING = [n for n, s in sorted(load_specs().items()) if s.protects_border and "endoscopy" in s.modalities]


@lru_cache(maxsize=2)
def _part(part: str) -> tuple[Labelled, ...]:
    items = tuple(labelled(part))
    if not items:
        pytest.skip(f"no base frame of the {part} part in the sample set")
    return items


@lru_cache(maxsize=2)
def _total(part: str) -> Score:
    total = Score(0, 0, 0, 0)
    for item in _part(part):
        total = total + score(item)
    return total


def test_held_back_false_text_area_within_target() -> None:
    total = _total("held_back")
    assert total.false_area <= FALSE_AREA_TARGET, f"false text cover {total.false_area:.4%} of the tissue"
    for item in _part("held_back"):
        s = score(item)
        assert s.false_area <= FALSE_AREA_TARGET, f"{item.name}: false text cover {s.false_area:.4%}"


def test_held_back_recall_meets_target() -> None:
    total = _total("held_back")
    assert total.recall >= RECALL_TARGET, f"recall {total.recall:.3f}"


def test_held_back_recall_does_not_regress() -> None:
    total = _total("held_back")
    assert total.glyphs > 10_000
    assert total.recall >= RECALL_FLOOR, f"recall {total.recall:.3f}"


def test_real_date_line_inside_the_field_is_found() -> None:
    """The held-back PolypGen frame whose date line runs inside the field (hand-labelled)."""
    item = next((i for i in _part("held_back") if i.name == "polypgen_EndoCV2021_C6_0100032"), None)
    if item is None:
        pytest.skip("polypgen_EndoCV2021_C6_0100032.jpg is not in the sample set")
    assert score(item).recall >= RECALL_TARGET
    highlight = perturb.scene(item.image).highlight
    assert not (highlight & item.glyphs).any(), "the date's glyphs are not specular highlights"


@pytest.mark.parametrize("name", NEGATIVES)
def test_highlight_rich_frames_have_no_text(name: str) -> None:
    img = frame(name)
    if img is None:
        pytest.skip(f"{name} is not in the sample set")
    desc = perturb.scene(img).descriptor
    assert desc["text"] == "none found", f"{name}: {[o for o in desc['overlays'] if o[4] in ('text', 'text_dark')]}"


def test_descriptor_and_records_say_what_text_was_found() -> None:
    found = next(i for i in _part("held_back") if i.synthetic and score(i).recall >= RECALL_TARGET)
    negative = next(i for i in _part("held_back") if not i.glyphs.any())
    for item, expect in ((found, "over the field"), (negative, "none found")):
        x = torch.from_numpy(item.image).permute(2, 0, 1).unsqueeze(0).contiguous()
        _, recs = perturb.apply(x, "haze", 3, [item.name])
        text = recs[0].extra["scene"]["text"]
        assert expect in text, f"{item.name}: {text}"
        assert recs[0].to_dict()["extra"]["scene"]["text"] == text  # the manifest row carries it


@lru_cache(maxsize=1)
def _survival_frames() -> tuple[tuple[str, torch.Tensor, np.ndarray], ...]:
    """(name, CHW uint8, glyph mask) of the labelled frames up to 800 px on the shorter side
    whose text the scene finds: the labelled glyph pixels over the tissue inside its text lines."""
    out = []
    for part in ("tuning", "held_back"):
        for item in labelled(part):
            if not item.glyphs.any() or min(item.image.shape[:2]) > 800:
                continue
            s = perturb.scene(item.image)
            inside = np.zeros(item.glyphs.shape, bool)
            for x0, y0, x1, y1 in masks.text_boxes(s.descriptor):
                inside[y0:y1, x0:x1] = True
            glyphs = item.glyphs & inside & (s.field >= 0.99)
            if glyphs.sum() >= 200:
                x = torch.from_numpy(item.image).permute(2, 0, 1).contiguous()
                out.append((item.name, x, glyphs))
    if not out:
        pytest.skip("no labelled frame with text found in the sample set")
    # the first four, plus the frames named below (always checked wherever they are labelled)
    return tuple(out[:4]) + tuple(f for f in out[4:] if f[0] in ALWAYS_CHECKED)


# Always in the survival set, against regressions: the synthetic line over this shipped frame
# was a known gap until scene version 6 (12-18 % of its glyph pixels moved under 16 protecting
# ops at s5); and the dark date with a light 1 px outline over bright tissue, found as the light
# line of its outline, whose dark ink enclosed by that outline kept only 55-80 % cover until
# scene version 7 (10.1-11.4 % moved under 12 ops; ``masks._enclosed_ink``).
ALWAYS_CHECKED = {"polypgen_EndoCV2021_C5_50000138_syn0", "polypgen_EndoCV2021_C6_0100032_syn0"}


def _moved_share(op: str, name: str, x: torch.Tensor, glyphs: np.ndarray) -> float:
    out, _ = perturb.apply(x.unsqueeze(0), op, 5, [name])
    moved = (out[0].to(torch.int16) - x.to(torch.int16)).abs().amax(dim=0).numpy()
    return float((moved[glyphs] > SURVIVAL_LEVELS).mean())


@pytest.mark.parametrize("op", PROTECTING)
def test_found_glyphs_survive_every_protecting_op(op: str) -> None:
    frames = _survival_frames()
    assert {f[0] for f in frames} >= ALWAYS_CHECKED, "the always-checked frames are labelled"
    for name, x, glyphs in frames:
        share = _moved_share(op, name, x, glyphs)
        assert share <= SURVIVAL_SHARE, f"{op} s5 on {name}: {share:.1%} of glyph pixels moved > {SURVIVAL_LEVELS}"


@pytest.mark.slow
@pytest.mark.parametrize("op", PROTECTING)
def test_found_glyphs_survive_every_protecting_op_on_the_torch_path(op: str) -> None:
    """The same on the torch path, forced on the CPU (about 15 times slower there): the
    composite's glyph cover is computed on the host either way, the blend on the device."""
    with use_backend("torch"):
        for name, x, glyphs in _survival_frames():
            share = _moved_share(op, name, x, glyphs)
            assert share <= SURVIVAL_SHARE, f"{op} s5 (torch) on {name}: {share:.1%} moved"


def test_single_dark_line_anywhere_over_the_tissue_is_found_and_kept() -> None:
    """One line of dark ink low in the field (no block, not at the left): kind ``text_dark``;
    its glyphs keep their pixels under haze while the tissue beside them takes it."""
    rng = np.random.default_rng(3)
    h, w = 480, 640
    alpha = fov_mask(w, h, "octagon", 0.03)
    tissue = np.array([200, 110, 95], np.float32) + rng.normal(0, 5, (h, w, 1)).astype(np.float32)
    img = np.clip(tissue * alpha[..., None], 0, 255).astype(np.uint8)
    layer = np.zeros((h, w), np.uint8)
    cv2.putText(layer, "13:32:30 CVP:8", (330, 400), cv2.FONT_HERSHEY_SIMPLEX, 0.6, 255, 2, cv2.LINE_AA)
    ink = layer.astype(np.float32)[..., None] / 255.0
    img = np.clip(np.rint(img * (1 - ink) + 20.0 * ink), 0, 255).astype(np.uint8)
    glyphs = layer >= 128
    s = perturb.scene(img)
    assert [k for *_, k in s.overlays if k in ("text", "text_dark")] == ["text_dark"], s.overlays
    assert s.descriptor["text"] == "1 line over the field"
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()
    out, _ = perturb.apply(x, "haze", 5, ["dark"])
    moved = (out[0].to(torch.int16) - x[0].to(torch.int16)).abs().amax(dim=0).numpy()
    assert (moved[glyphs] > SURVIVAL_LEVELS).mean() <= SURVIVAL_SHARE
    x0, y0, x1, y1 = masks.text_boxes(s.descriptor)[0]
    beside = np.zeros(glyphs.shape, bool)
    beside[y0:y1, x0:x1] = True
    beside &= ~cv2.dilate(layer, np.ones((7, 7), np.uint8)).astype(bool)
    assert (moved[beside] > SURVIVAL_LEVELS).mean() > 0.9


def test_dark_ink_inside_a_light_outline_keeps_its_pixels() -> None:
    """Dark ink with a light 1 px outline over bright tissue, drawn without anti-aliasing, where
    the search finds the line only as the light line of its outline (as on a held-back frame):
    the ink stands less than ``masks.GLYPH_HIGH`` below the tissue, yet enclosed by the outline
    it is wholly glyph (``masks._enclosed_ink``), so under haze at s5 at most
    ``SURVIVAL_SHARE`` of the drawn pixels move."""
    rng = np.random.default_rng(11)
    h, w = 576, 768
    alpha = fov_mask(w, h, "octagon", 0.03)
    tissue = np.array([125, 85, 65], np.float32) + rng.normal(0, 4, (h, w, 1)).astype(np.float32)
    img = tissue * alpha[..., None]
    ink_layer = np.zeros((h, w), np.uint8)
    scale = cv2.getFontScaleFromHeight(cv2.FONT_HERSHEY_SIMPLEX, 15, 2)
    cv2.putText(ink_layer, "15/03/2012", (420, 260), cv2.FONT_HERSHEY_SIMPLEX, scale, 255, 2, cv2.LINE_8)
    ink = ink_layer > 0
    rim = cv2.dilate(ink_layer, np.ones((3, 3), np.uint8)).astype(bool) & ~ink
    img[rim] = 230.0
    img[ink] = 40.0
    bgr = np.clip(np.rint(img), 0, 255).astype(np.uint8)[..., ::-1]
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 89])  # as a recorder stores it
    assert ok
    image = np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1])
    desc = perturb.scene(image).descriptor
    light = [o for o in desc["overlays"] if o[4] == "text"]
    assert len(light) == 1, desc["overlays"]
    x0, y0, x1, y1 = light[0][:4]
    assert ink[y0:y1, x0:x1].sum() == ink.sum()
    only_light = {**desc, "overlays": light, "text": "1 line over the field"}
    x = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0).contiguous()
    out, _ = perturb.apply(x, "haze", 5, ["outlined"], scenes=[only_light])
    moved = (out[0].to(torch.int16) - x[0].to(torch.int16)).abs().amax(dim=0).numpy()
    assert (moved[ink] > SURVIVAL_LEVELS).mean() <= SURVIVAL_SHARE
    assert (moved[ink | rim] > SURVIVAL_LEVELS).mean() <= SURVIVAL_SHARE
