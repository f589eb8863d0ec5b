"""The scene model (perturb.scene): field of view, overlays, highlights, replay."""

from __future__ import annotations

import dataclasses

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.datasets.phantoms.endoscopy import fov_mask, render
from perturb.scene import SCENE_VERSION, Scene
from tests.scene.frames import downscale, frame, require_frames, small_frame


def test_field_matches_a_known_aperture_and_lumen_stays_tissue() -> None:
    for shape in ("octagon", "circle"):
        alpha = fov_mask(640, 480, shape, 0.03)
        img = np.zeros((480, 640, 3), np.uint8)
        img[...] = (np.array([200, 110, 100]) * alpha[..., None]).astype(np.uint8)
        cv2.circle(img, (320, 240), 60, (4, 3, 3), -1)  # a black lumen in the middle
        cv2.circle(img, (320, 40), 50, (6, 4, 4), -1)  # a dark lumen reaching the top edge
        s = perturb.scene(img)
        truth = alpha > 0.5
        got = s.field > 0.5
        iou = (truth & got).sum() / (truth | got).sum()
        assert iou > 0.98, f"{shape}: IoU {iou:.3f} with the drawn aperture"
        assert (s.field[200:280, 280:360] == 1).all(), "the dark lumen inside the field is tissue"
        assert (s.field[20:60, 300:340] == 1).all(), "a dark lumen touching the edge is tissue (convex aperture)"
        edge = (s.field > 0) & (s.field < 1)
        contours, _ = cv2.findContours(got.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        perimeter = sum(cv2.arcLength(c, True) for c in contours)
        assert 0 < edge.sum() < 5 * perimeter, "a thin anti-aliased edge (under 5 px), no ragged fringe"
        assert not s.overlays, f"{shape}: no overlay on a clean frame, got {s.overlays}"
        n, _ = cv2.connectedComponents((s.field > 0.5).astype(np.uint8))
        assert n == 2, "one connected field"


def test_phantom_box_and_text_are_overlays() -> None:
    found_box = found_text = False
    for key in range(12):
        ph = render(key, (480, 384))
        s = perturb.scene(ph.image)
        kinds = {k for *_, k in s.overlays}
        found_box |= ph.truth.box and "scope_box" in kinds
        found_text |= ph.truth.text is not None and "glyph" in kinds
        if ph.truth.box:
            assert "scope_box" in kinds, f"phantom {key}: green position box not found"
    assert found_box and found_text


def test_scene_is_deterministic_and_rebuilt_from_its_descriptor() -> None:
    img = render(3, (400, 320)).image
    a, b = perturb.scene(img), perturb.scene(img.copy())
    assert a.descriptor == b.descriptor
    again = Scene.from_descriptor(a.descriptor)
    assert np.array_equal(again.field, a.field) and np.array_equal(again.overlay, a.overlay)
    t = torch.from_numpy(img).permute(2, 0, 1)
    assert perturb.scene(t).descriptor == a.descriptor, "tensor and array inputs agree"
    assert perturb.scene(t.float() / 255).descriptor == a.descriptor
    with pytest.raises(ValueError, match="scene version"):
        Scene.from_descriptor({**a.descriptor, "version": 99})


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("polypgen_19_endocv2021_positive_845.jpg", "scope_box"),
        ("polypgen_EndoCV2021_C5_50000198.jpg", "inset"),
        ("polypgen_EndoCV2021_C6_0100032.jpg", "black_box"),
        ("polypgen_C3_EndoCV2021_00327.jpg", "glyph"),
        ("hyperkvasir_seg_cju0qkwl35piu0993l0dewei2.jpg", "text"),  # burned-in text over the tissue
    ],
)
def test_known_overlays_on_real_frames(name: str, kind: str) -> None:
    img = frame(name)
    if img is None:
        pytest.skip(f"{name} is not in this sample set")
    _small, s = small_frame(name, 360)
    assert kind in {k for *_, k in s.overlays}, f"{name}: no {kind} among {s.overlays}"
    # overlays sit on top: the field's tissue is not swallowed by an overlay
    assert (s.tissue >= 1).sum() > 0.8 * (s.field >= 1).sum()


def test_no_text_found_in_highlight_rich_frames() -> None:
    """Specular streaks are not taken for burned-in text (frames with many highlights and no text)."""
    for name in ("polypgen_176OLCV1_100H0889.jpg", "polypgen_33_endocv2021_positive_958.jpg"):
        if frame(name) is None:
            continue
        _small, s = small_frame(name, 360)
        text = [o for o in s.overlays if o[4] == "text" and s.field[o[1] : o[3], o[0] : o[2]].mean() > 0.5]
        assert not text, f"{name}: specular streaks taken for text: {text}"


def test_real_fields_are_smooth_connected_and_keep_dark_tissue() -> None:
    for name, _img in require_frames():
        small, s = small_frame(name, 288)
        field = s.field >= 0.5
        n, _ = cv2.connectedComponents(field.astype(np.uint8))
        assert n == 2, f"{name}: field of view not one connected region"
        inner = cv2.erode(field.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
        dark = small.max(axis=2) < 18
        assert (s.field[inner & dark] == 1).all(), f"{name}: dark tissue inside the field left out"
        assert ((s.field > 0) & (s.field < 1)).mean() < 0.05, f"{name}: edge band too wide"


def test_records_carry_the_scene_and_replay_bit_for_bit() -> None:
    name = require_frames()[0][0]
    small, s = small_frame(name)
    x = torch.from_numpy(small).permute(2, 0, 1).unsqueeze(0).contiguous()
    out, recs = perturb.apply(x, "haze", 4, ["k"])
    assert recs[0].extra["scene"] == s.descriptor
    assert torch.equal(perturb.replay(recs, x), out)
    # a chain replays each record with the scene of the clean input, not of the hazy one
    out2, recs2 = perturb.apply(out, "contrast", 3, ["k"], scenes=[s])
    assert torch.equal(perturb.replay([recs[0], recs2[0]], x[0]), out2[0])


def test_downscaled_frame_keeps_its_scene() -> None:
    _name, img = require_frames()[-1]
    a = perturb.scene(downscale(img, 360)).field
    b = cv2.resize(perturb.scene(img).field, (a.shape[1], a.shape[0]), interpolation=cv2.INTER_AREA)
    assert np.abs(a - b).mean() < 0.02


def _text_over_tissue() -> tuple[np.ndarray, np.ndarray]:
    """A textured octagonal frame (480x640) with three left-aligned white text lines drawn over
    the tissue, and the bool mask of the drawn glyph cores (every channel at 250 or more)."""
    rng = np.random.default_rng(7)
    alpha = fov_mask(640, 480, "octagon", 0.03)
    tissue = np.array([170, 80, 70], np.float32) + rng.normal(0, 6, (480, 640, 1)).astype(np.float32)
    tissue = cv2.GaussianBlur(tissue, (0, 0), 2.0)
    img = np.clip(tissue * alpha[..., None], 0, 255).astype(np.uint8)
    for row, line in enumerate(("15/03/2012", "<00:05:02>", "CVP:1")):
        cv2.putText(img, line, (150, 200 + 30 * row), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (255, 255, 255), 2, cv2.LINE_AA)
    return img, img.min(axis=2) >= 250


def test_text_over_tissue_keeps_only_its_glyph_strokes() -> None:
    img, glyphs = _text_over_tissue()
    s = perturb.scene(img)
    boxes = [o for o in s.overlays if o[4] == "text"]
    assert len(boxes) >= 2, f"text lines over the tissue not found: {s.overlays}"
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()
    out, recs = perturb.apply(x, "haze", 5, ["t"])
    got = out[0].permute(1, 2, 0).numpy()
    changed = np.abs(got.astype(int) - img.astype(int)).max(axis=2)
    assert (changed[glyphs] == 0).all(), "the glyph strokes are drawn over the processed tissue, unchanged"
    in_boxes = np.zeros(glyphs.shape, bool)
    for x0, y0, x1, y1, _ in boxes:
        in_boxes[y0:y1, x0:x1] = True
    # the glyph cover reaches 1 px past the anti-aliased edge (the rim): 3 px from the ink
    near_glyph = cv2.dilate(((img.max(axis=2) > 200) | glyphs).astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
    between = in_boxes & ~near_glyph & (s.field >= 1)
    assert between.sum() > 500
    assert (changed[between] > 10).mean() > 0.95, "the tissue between and around the glyphs takes the op"
    # the masks the scene exposes agree with the composite
    assert (s.overlay_of(img)[glyphs]).all() and not s.overlay_of(img)[between].any()
    assert np.array_equal(s.tissue_of(img), perturb.scene.masks.composite_alpha(s.descriptor, x[0]))
    assert (s.tissue[between] == 0).all() and (s.tissue_of(img)[between] == 1).all()
    assert torch.equal(perturb.replay(recs, x), out)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.float32])
def test_text_composite_is_the_same_on_the_cpu_and_torch_paths(dtype: torch.dtype) -> None:
    from perturb.engine.run import compose_tissue
    from perturb.ops.composite import compose_frame as compose_numpy

    img, _ = _text_over_tissue()
    s = perturb.scene(img)
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()
    gen = torch.Generator().manual_seed(1)
    if dtype == torch.float32:
        x = x.to(torch.float32) / 255.0
        out = torch.rand(x.shape, generator=gen)
    else:
        top = 255 if dtype == torch.uint8 else 65535
        x = (x.to(torch.int32) * (top // 255)).to(dtype)
        out = (torch.rand(x.shape, generator=gen) * top).round().to(torch.int32).to(dtype)
    dst = out[0].numpy().copy()
    compose_numpy(x[0].numpy(), dst, s.descriptor)
    assert torch.equal(compose_tissue(x, out, [s])[0], torch.from_numpy(dst))


def test_records_of_the_old_scene_version_are_refused() -> None:
    img, _ = _text_over_tissue()
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()
    _, recs = perturb.apply(x, "haze", 3, ["t"])
    old = dataclasses.replace(recs[0], extra={**recs[0].extra, "scene": {**recs[0].extra["scene"], "version": SCENE_VERSION - 1}})
    with pytest.raises(ValueError, match="scene version"):
        perturb.replay([old], x)
