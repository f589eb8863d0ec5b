"""Contract of every tissue-layer (photometric) endoscopy op on real frames: the dark surround
and the on-screen overlays stay untouched (of a text line over the tissue, its glyph strokes; the
tissue between them takes the op), the whole field is affected, the severities sit in
their declared calibration bands, and a severity means the same after resizing."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.calibrate.metrics import Reference
from perturb.calibrate.run import INVARIANCE_TOLERANCE, calibrated_ops, invariance_gaps, measure
from perturb.catalog.ops import all_ops
from perturb.catalog.specs import load_specs
from tests.scene.frames import downscale, frames_with_overlays, require_frames, small_frame

TISSUE_OPS = sorted(n for n, op in all_ops().items() if "endoscopy" in op.spec.modalities and op.spec.protects_border)
# touch part of the field by design: highlights and hot pixels, and the local occluders (bubbles,
# drops on the lens, a pool of fluid)
SPARSE = {"specular_glare", "impulse_noise", "bubbles", "lens_droplets", "fluid_occlusion"}
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "calibration-endoscopy.json"
BAND_SLACK = 0.03  # a few frames, not the whole sample set: the bands hold within this


def _apply(img: np.ndarray, op: str, severity: int, scene: perturb.scene.Scene) -> np.ndarray:
    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).contiguous()
    out, _ = perturb.apply(x, op, severity, ["contract"], seed=3, scenes=[scene])
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("op", TISSUE_OPS)
def test_frame_and_overlays_untouched_and_field_affected(op: str) -> None:
    names = frames_with_overlays(3)
    if not names:
        pytest.skip("no real frame with a dark surround and on-screen overlays in this sample set")
    for name in names:
        img, s = small_frame(name)
        out = _apply(img, op, 5, s)
        changed = np.abs(out.astype(int) - img.astype(int)).max(axis=2)
        surround = cv2.erode((s.field == 0).astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool) & ~s.overlay
        assert (changed[surround] > 3).mean() <= 0.002, f"{op} on {name}: changed the dark surround"
        # overlays: whole rectangles, except text lines (over the tissue), whose glyph strokes alone
        # are drawn over the processed tissue
        kept = s.overlay_of(img)
        assert (changed[kept] > 3).mean() <= 0.01, f"{op} on {name}: changed the on-screen overlays"
        inner = cv2.erode((s.tissue >= 1).astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
        if op not in SPARSE:
            assert (changed[inner] >= 1).mean() >= 0.5, f"{op} on {name}: most of the field is unaffected"
            # where the op changes the tissue next to a text line, it changes the tissue between its
            # glyphs too (a local op such as a smoke plume may not reach the text at all; a patchy
            # one reaches part of it, so a fifth is asked: whole kept rectangles give none)
            between = (s.tissue_of(img) >= 1) & s.overlay & ~cv2.dilate(kept.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
            near = cv2.dilate(s.overlay.astype(np.uint8), np.ones((31, 31), np.uint8)).astype(bool) & inner
            if between.sum() >= 20 and (changed[near] >= 1).mean() >= 0.5:
                assert (changed[between] >= 1).mean() >= 0.2, f"{op} on {name}: the tissue between text glyphs is unaffected"


def test_haze_lifts_dark_lumen_inside_the_field() -> None:
    for name, _ in require_frames():
        img, s = small_frame(name)
        dark = (img.max(axis=2) < 25) & (s.tissue >= 1)
        if dark.sum() < 50:
            continue
        out = _apply(img, "haze", 3, s)
        lift = out.astype(int)[dark].mean() - img.astype(int)[dark].mean()
        assert lift > 20, f"{name}: haze lifted dark tissue by {lift:.1f} levels only"
        return
    pytest.skip("no frame with dark lumen inside the field in this sample set")


@pytest.mark.slow
def test_calibrated_bands_on_a_few_real_frames() -> None:
    found = require_frames()
    picked = [(n, downscale(img, 448)) for n, img in found[:: max(1, len(found) // 4)][:4]]
    results = measure(picked, calibrated_ops(), keys=1, invariance=False)
    problems = []
    for r in results:
        cal = load_specs()[r.op].calibration
        assert cal is not None
        widened = cal.model_copy(
            update={
                "sev1": None if cal.sev1 is None else (cal.sev1[0] - BAND_SLACK, cal.sev1[1] + BAND_SLACK),
                "sev5": None if cal.sev5 is None else (cal.sev5[0] - BAND_SLACK, cal.sev5[1] + BAND_SLACK),
            }
        )
        problems += [f"{r.op}: {p}" for p in widened.violations(r.means)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_resolution_invariance_on_an_hd_frame() -> None:
    big = [(n, img) for n, img in require_frames() if min(img.shape[:2]) >= 1000 and img.shape[1] >= 1400]
    if not big:
        pytest.skip("no frame of 1440-1920 px in this sample set")
    name, img = big[0]
    s = perturb.scene(img)
    prepared = [(name, img, s, Reference.of(img, s.tissue))]
    bad = []
    for spec in calibrated_ops():
        assert spec.calibration is not None
        if not spec.calibration.resolution_invariant:
            continue
        gap = invariance_gaps(prepared, spec.name)[0]
        if gap > INVARIANCE_TOLERANCE:
            bad.append(f"{spec.name}: {gap:.3f}")
    assert not bad, f"op-then-resize vs resize-then-op field SSIM gap above {INVARIANCE_TOLERANCE}: {bad}"


def test_committed_calibration_covers_the_catalog_and_passes() -> None:
    data = json.loads(RESULTS.read_text())
    measured = {r["op"]: r for r in data["ops"]}
    specs = {s.name: s for s in calibrated_ops()}
    assert set(measured) == set(specs), "re-run `perturb calibrate --out benchmarks/results` after changing the catalog"
    for name, spec in specs.items():
        assert spec.calibration is not None
        r = measured[name]
        assert r["metric"] == spec.calibration.metric
        assert not spec.calibration.violations(r["means"]), f"{name}: committed means outside the catalog's targets"
        assert r["ok"], f"{name}: {r['problems']}"
