"""``perturb calibrate --modality xray``: gray films, no scene, whole-image SSIM against the X-ray
ops' declared bands (the full run on every sample film: `python -m perturb.cli calibrate
--modality xray`)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from perturb.calibrate.metrics import Reference
from perturb.calibrate.run import (
    calibrated_ops,
    default_sample_dir,
    load_images,
    measure,
    phantom_images,
)
from perturb.catalog.specs import Calibration, OpSpec, load_specs
from perturb.cli import app
from tests.helpers import XRAY


def test_every_xray_op_declares_calibration_targets() -> None:
    names = {s.name for s in calibrated_ops("xray")}
    assert len(names) >= 22
    assert default_sample_dir("xray") is not None and default_sample_dir("xray").name == "xray"  # type: ignore[union-attr]


def test_measure_runs_gray_ops_on_films_and_checks_their_bands() -> None:
    """Two films at a 448 px shorter side, one key: the gray-only ops run on one channel, scores
    fall with severity, and a deliberately wrong band is reported."""
    films = [p for p in XRAY if p.stem in ("nih_00022084_000", "nih_00013125_000")]
    if len(films) < 2:  # a sample set without those two films (e.g. tests/data): its first two
        films = XRAY[:2]
    images = load_images(films[0].parent)
    images = [(n, cv2.resize(img, (448, 448), interpolation=cv2.INTER_AREA)) for n, img in images if n in {f.name for f in films}]
    assert len(images) == 2 and images[0][1].shape == (448, 448, 3)
    specs = [s for s in calibrated_ops("xray") if s.name in ("xray_support_devices", "xray_edge_enhancement")]
    results = measure(images, specs, keys=1, invariance=False, modality="xray")
    for r in results:
        assert all(a > b for a, b in zip(r.means, r.means[1:], strict=False)), r
        assert r.ok, r.problems
    wrong = specs[0].model_copy(update={"calibration": specs[0].calibration.model_copy(update={"sev5": (0.0, 0.1)})})  # type: ignore[union-attr]
    assert not measure(images, [wrong], keys=1, invariance=False, modality="xray")[0].ok
    assert np.isfinite(results[0].means).all()


def test_cli_rejects_an_unknown_modality() -> None:
    result = CliRunner().invoke(app, ["calibrate", "--modality", "ct"])
    assert result.exit_code == 2 and "use endoscopy or xray" in result.output


def test_cli_report_is_titled_by_its_modality(tmp_path: Path) -> None:
    """The written table names the modality it calibrated (it used to say endoscopy always)."""
    films = tmp_path / "films"
    films.mkdir()
    src = XRAY[0]
    img = cv2.imread(str(src), cv2.IMREAD_GRAYSCALE)
    cv2.imwrite(str(films / "film.png"), cv2.resize(img, (256, 256), interpolation=cv2.INTER_AREA))
    out = tmp_path / "out"
    args = ["calibrate", "--modality", "xray", "--samples", str(films), "--op", "xray_edge_enhancement"]
    result = CliRunner().invoke(app, [*args, "--keys", "1", "--no-invariance", "--out", str(out)])
    assert result.exit_code in (0, 1), result.output
    md = (out / "calibration-xray.md").read_text()
    assert md.startswith("# Calibration: xray ops")


def test_phantom_fallback_is_xray_films_with_their_own_bands() -> None:
    """Without real films the X-ray ops are calibrated on the chest phantoms (gray, portrait),
    not on endoscopy frames, and each op's ``phantom`` bands replace its real-film ones."""
    films = phantom_images("xray", limit=2)
    assert [n for n, _ in films] == ["xray-phantom-0", "xray-phantom-1"]
    for _, img in films:
        assert img.shape[0] > img.shape[1] and img.shape[2] == 3
        assert np.array_equal(img[..., 0], img[..., 2])  # gray
    declared = [s for s in calibrated_ops("xray") if s.calibration and s.calibration.phantom]
    assert declared, "some X-ray op declares phantom bands"
    for spec in declared:
        cal = spec.calibration
        assert cal is not None and cal.phantom is not None
        merged = cal.on_phantoms()
        assert merged.phantom is None and "phantoms:" in merged.note
        assert merged.metric == cal.metric and merged.monotone == cal.monotone
        for sev in (1, 5):
            if getattr(cal.phantom, f"sev{sev}") is not None:
                assert merged.band(sev) == getattr(cal.phantom, f"sev{sev}")


def test_calibration_declarations_are_validated() -> None:
    base = {"metric": "ssim", "sev1": (0.9, 0.99), "monotone": "decreasing"}
    with pytest.raises(ValueError, match="needs a note"):
        Calibration(**base, resolution_invariant=False)
    with pytest.raises(ValueError, match="need a note"):
        Calibration(**base, phantom={"sev1": (0.5, 0.9), "note": " "})
    cal = Calibration(**base, phantom={"sev5": (0.1, 0.5), "note": "flat phantom"})
    assert cal.on_phantoms().band(5) == (0.1, 0.5) and cal.on_phantoms().band(1) == (0.9, 0.99)
    single = Calibration(metric="ssim", monotone="constant")
    assert single.violations([0.2] * 5) == []
    assert any("single-level" in p for p in single.violations([0.2, 0.2, 0.2, 0.2, 0.19]))
    spec = load_specs()["xray_gamma"]
    with pytest.raises(ValueError, match="single_level"):  # constant targets need a declared single level
        OpSpec(**{**spec.model_dump(exclude={"calibration"}), "calibration": single.model_dump()})
    with pytest.raises(ValueError, match="change with severity"):  # a single level has constant tables
        OpSpec(**{**spec.model_dump(), "single_level": "all or nothing"})


def test_region_and_shift_metrics_grade_a_local_edge_and_a_gradient() -> None:
    """region_ssim grades a small artifact where it is (whole-image SSIM barely moves);
    mean_shift is the mean luma change in gray levels."""
    rng = np.random.default_rng(1)
    clean = np.repeat(rng.integers(60, 200, (448, 448, 1), dtype=np.uint8), 3, axis=2)
    clean = cv2.GaussianBlur(clean, (0, 0), 2.0)
    ref = Reference.of(clean, None)
    outs = []
    for strength in (10, 20, 40):
        o = clean.astype(int)
        o[200:240, 200:240] += strength
        outs.append(np.clip(o, 0, 255).astype(np.uint8))
    region = ref.footprint(outs[-1])
    assert 40 * 40 <= region.sum() <= 60 * 60
    local = [ref.score("region_ssim", o, region) for o in outs]
    whole = [ref.score("ssim", o) for o in outs]
    assert local[0] > local[1] > local[2] and local[2] < 0.9 and min(whole) > 0.98
    with pytest.raises(ValueError, match="footprint"):
        ref.score("region_ssim", outs[0])
    brighter = np.clip(clean.astype(int) + 6, 0, 255).astype(np.uint8)
    assert ref.score("mean_shift", brighter) == pytest.approx(6.0, abs=0.05)
