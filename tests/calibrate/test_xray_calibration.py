"""``perturb calibrate --modality xray``: gray films, no scene, whole-image SSIM against the X-ray
ops' declared bands (the full run on every sample film: `python -m perturb.cli calibrate
--modality xray`)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from typer.testing import CliRunner

from perturb.calibrate.run import calibrated_ops, default_sample_dir, load_images, measure
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
