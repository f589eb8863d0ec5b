"""``perturb calibrate`` and ``perturb preview --scene`` through the real CLI; the metrics
against independent references (skimage)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage.color import deltaE_cie76, rgb2lab
from skimage.metrics import structural_similarity
from typer.testing import CliRunner

from perturb.calibrate.metrics import Reference, luma, ssim_map
from perturb.catalog.specs import Calibration
from perturb.cli import app
from perturb.datasets.phantoms.endoscopy import render

runner = CliRunner()


def _frames(folder: Path, n: int = 2) -> Path:
    folder.mkdir()
    for i in range(n):
        cv2.imwrite(str(folder / f"f{i}.png"), cv2.cvtColor(render(i, (320, 256)).image, cv2.COLOR_RGB2BGR))
    return folder


def test_calibrate_writes_the_table_and_fails_outside_bands(tmp_path: Path) -> None:
    frames = _frames(tmp_path / "frames")
    out = tmp_path / "out"
    args = ["calibrate", "--samples", str(frames), "--op", "haze", "--op", "hue_shift", "--keys", "1"]
    result = runner.invoke(app, [*args, "--no-invariance", "--out", str(out)])
    assert result.exit_code in (0, 1), result.output
    data = json.loads((out / "calibration-endoscopy.json").read_text())
    assert [r["op"] for r in data["ops"]] == ["haze", "hue_shift"]
    assert (result.exit_code == 1) == (not all(r["ok"] for r in data["ops"]))
    assert "| haze | field_ssim |" in (out / "calibration-endoscopy.md").read_text()


def test_calibrate_bad_input_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["calibrate", "--samples", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not a folder" in " ".join(result.output.split())
    result = runner.invoke(app, ["calibrate", "--op", "no_such_op"])
    assert result.exit_code == 2 and "calibrated ops" in " ".join(result.output.split())


def test_violations_name_the_band_and_monotonicity() -> None:
    cal = Calibration(metric="field_ssim", sev1=(0.85, 0.99), sev5=(0.0, 0.8), monotone="decreasing")
    assert cal.violations([0.95, 0.9, 0.85, 0.8, 0.7]) == []
    problems = cal.violations([0.995, 0.9, 0.92, 0.85, 0.82])
    assert any("severity 1" in p for p in problems) and any("severity 5" in p for p in problems)
    assert any("not strictly decreasing" in p for p in problems)
    with pytest.raises(ValueError, match="unknown calibration metric"):
        Calibration(metric="psnr", monotone="increasing")


def test_metrics_match_skimage() -> None:
    clean = render(5, (448, 448)).image
    rng = np.random.default_rng(0)
    noisy = np.clip(clean + rng.normal(0, 12, clean.shape), 0, 255).astype(np.uint8)
    ref = Reference.of(clean, None)
    expected = structural_similarity(
        luma(clean).astype(np.float64), luma(noisy).astype(np.float64),
        gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1.0,
    )
    # the same SSIM map; skimage averages it without a 5 px border, ours over the measured pixels
    ours = ssim_map(luma(clean), luma(noisy))[5:-5, 5:-5].mean()
    assert ours == pytest.approx(expected, abs=1e-9)
    assert ref.score("ssim", noisy) == pytest.approx(expected, abs=0.02)
    shifted = np.clip(clean.astype(int) + np.array([12, -6, 4]), 0, 255).astype(np.uint8)
    de = deltaE_cie76(rgb2lab(clean), rgb2lab(shifted)).mean()
    assert ref.score("delta_e_whole", shifted) == pytest.approx(de, rel=0.02)


def test_preview_scene_writes_a_panel(tmp_path: Path) -> None:
    out = tmp_path / "scene.png"
    result = runner.invoke(app, ["preview", "--scene", "--out", str(out)])
    assert result.exit_code == 0, result.output
    img = cv2.imread(str(out))
    assert img is not None and img.shape[1] == 1280
