"""``perturb catalog`` and ``perturb preview`` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from typer.testing import CliRunner

from perturb.cli import app
from tests.helpers import ENDOSCOPY, XRAY, require_samples

runner = CliRunner()


def test_catalog_json_lists_the_endoscopy_ops() -> None:
    result = runner.invoke(app, ["catalog", "--modality", "endoscopy", "--json"])
    assert result.exit_code == 0, result.output
    ops = json.loads(result.output)
    assert len(ops) >= 14
    entry = next(o for o in ops if o["name"] == "specular_glare")
    assert entry["family"] == "glare" and len(entry["params"]["wetness"]["levels"]) == 5
    assert "occludes" in entry["risk_tags"] and entry["protects_border"] is True


def test_catalog_lists_retired_ops_only_when_asked() -> None:
    from perturb.catalog.specs import load_specs, op_names

    retired = sorted(n for n, s in load_specs().items() if s.retired and "endoscopy" in s.modalities)
    assert retired  # impulse_noise, speckle_noise: kept to replay older records
    shown = json.loads(runner.invoke(app, ["catalog", "--modality", "endoscopy", "--json"]).output)
    assert sorted(o["name"] for o in shown) == sorted(op_names("endoscopy"))
    every = json.loads(runner.invoke(app, ["catalog", "--modality", "endoscopy", "--json", "--retired"]).output)
    assert {o["name"] for o in every} - {o["name"] for o in shown} == set(retired)
    table = runner.invoke(app, ["catalog", "--retired"], terminal_width=200)
    assert f"{retired[0]} (retired)" in table.output


def test_catalog_table_and_bad_modality() -> None:
    result = runner.invoke(app, ["catalog"])
    assert result.exit_code == 0 and "gaussian_blur" in result.output
    bad = runner.invoke(app, ["catalog", "--modality", "mri-ish"])
    assert bad.exit_code == 2 and "choose one of" in bad.output


def test_preview_of_a_real_frame_writes_a_labelled_grid(tmp_path: Path) -> None:
    require_samples()
    out = tmp_path / "grid.png"
    result = runner.invoke(app, ["preview", str(ENDOSCOPY[4]), "--op", "motion_blur", "--out", str(out)])
    assert result.exit_code == 0, result.output
    grid = cv2.imread(str(out))
    assert grid is not None and grid.shape[1] == 150 + 6 * 224  # label column + clean + 5 severities


def _grid_rows(path: Path, source: Path, size: int = 224) -> int:
    """Op rows of a --no-crop grid written from ``source`` at thumbnail width ``size``."""
    from perturb.cli.preview_grid import LABEL_HEIGHT
    from perturb.io.images import read_image

    src = read_image(source)
    thumb = round(src.shape[0] * size / src.shape[1])
    height = cv2.imread(str(path), cv2.IMREAD_UNCHANGED).shape[0]
    rows, rest = divmod(height - LABEL_HEIGHT, thumb + LABEL_HEIGHT)
    assert rest == 0, (height, thumb)
    return rows


def test_preview_of_a_16_bit_gray_image_shows_the_xray_ops(tmp_path: Path) -> None:
    """A gray image is previewed as a radiograph: its rows are the X-ray ops, no endoscopy op
    (specular glare on a chest film) and no colour op; --modality names another set, whose
    colour ops are then named as skipped."""
    from perturb.catalog.specs import get_spec, op_names

    require_samples()
    gray8 = cv2.imread(str(XRAY[0]), cv2.IMREAD_GRAYSCALE)
    gray16 = (gray8.astype(np.uint16) * 257)[:128, :96]
    src = tmp_path / "gray16.png"
    cv2.imwrite(str(src), gray16)
    out = tmp_path / "grid.png"
    result = runner.invoke(app, ["preview", str(src), "--no-crop", "--size", "32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "showing the xray ops" in result.output and "skipped" not in result.output
    assert _grid_rows(out, src, 32) == len(op_names("xray"))
    endo = runner.invoke(app, ["preview", str(src), "--no-crop", "--size", "32", "--modality", "endoscopy", "--out", str(out)])
    assert endo.exit_code == 0, endo.output
    assert "hue_shift" in endo.output  # named among the skipped colour ops
    one_channel = [n for n in op_names("endoscopy") if 1 in get_spec(n).channels]
    assert "hue_shift" not in one_channel and _grid_rows(out, src, 32) == len(one_channel)


def test_preview_of_a_colour_frame_leaves_out_xray_and_retired_ops(tmp_path: Path) -> None:
    """A colour frame shows the active endoscopy ops in catalog order: no retired op (kept only
    to replay records) and no X-ray op; asking for X-ray ops on it exits 2 naming the fix; a
    named op made for another modality is previewed with a note."""
    from perturb.catalog.specs import load_specs, op_names

    src = tmp_path / "frame.png"
    rng = np.random.default_rng(0)
    cv2.imwrite(str(src), rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    out = tmp_path / "grid.png"
    result = runner.invoke(app, ["preview", str(src), "--no-crop", "--size", "32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "showing the endoscopy ops" in result.output
    assert _grid_rows(out, src, 32) == len(op_names("endoscopy"))
    assert any(s.retired and "endoscopy" in s.modalities for s in load_specs().values())
    xray = runner.invoke(app, ["preview", str(src), "--modality", "xray", "--out", str(tmp_path / "x.png")])
    assert xray.exit_code == 2 and "no xray op takes a 3-channel image" in xray.output and "--modality" in xray.output
    assert not (tmp_path / "x.png").exists()
    chest = runner.invoke(app, ["preview", "--modality", "xray", "--no-crop", "--size", "32", "--out", str(out)])
    assert chest.exit_code == 0, chest.output  # no image: the chest phantom, not the endoscopy one
    bogus = runner.invoke(app, ["preview", str(src), "--modality", "mri-ish", "--out", str(tmp_path / "y.png")])
    assert bogus.exit_code == 2 and "use auto, all or one of" in bogus.output
    gray = tmp_path / "gray.png"
    cv2.imwrite(str(gray), rng.integers(0, 256, (40, 48), dtype=np.uint8))
    named = runner.invoke(app, ["preview", str(gray), "--op", "specular_glare", "--no-crop", "--out", str(out)])
    assert named.exit_code == 0, named.output
    assert "note: specular_glare is for endoscopy images" in named.output


def test_preview_errors_name_the_fix(tmp_path: Path) -> None:
    require_samples()
    unknown = runner.invoke(app, ["preview", str(ENDOSCOPY[0]), "--op", "blurr", "--out", str(tmp_path / "a.png")])
    assert unknown.exit_code == 2 and "valid: " in unknown.output
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    result = runner.invoke(app, ["preview", str(empty), "--out", str(tmp_path / "b.png")])
    assert result.exit_code == 2 and "empty file" in result.output
    wrong = runner.invoke(app, ["preview", str(ENDOSCOPY[0]), "--out", str(tmp_path / "c.jpg")])
    assert wrong.exit_code == 2 and ".png" in wrong.output
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "b.png").exists()


def test_preview_without_an_image_uses_a_phantom(tmp_path: Path) -> None:
    out = tmp_path / "phantom.png"
    result = runner.invoke(app, ["preview", "--op", "specular_glare", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert cv2.imread(str(out)) is not None


def test_preview_of_an_xray_op_without_an_image_uses_a_chest_phantom(tmp_path: Path) -> None:
    from perturb.cli.preview_grid import LABEL_HEIGHT
    from perturb.datasets.phantoms.xray import XRAY_SIZE

    out = tmp_path / "chest.png"
    result = runner.invoke(app, ["preview", "--op", "xray_grid_lines", "--no-crop", "--out", str(out)])
    assert result.exit_code == 0, result.output
    grid = cv2.imread(str(out), cv2.IMREAD_UNCHANGED)
    thumb = grid.shape[0] - 2 * LABEL_HEIGHT  # one row of 224-px-wide portrait tiles (no crop row)
    assert thumb == round(224 * XRAY_SIZE[1] / XRAY_SIZE[0])


def test_preview_size_and_full_resolution_crop_panel(tmp_path: Path) -> None:
    """``--size`` sets the thumbnail width; the crop row holds the image's own pixels (1:1)."""
    from perturb.cli.preview_grid import LABEL_HEIGHT, ROW_LABEL_WIDTH
    from perturb.io.images import read_image

    require_samples()
    out = tmp_path / "grid.png"
    args = ["preview", str(ENDOSCOPY[4]), "--op", "gaussian_noise", "--size", "160", "--crop-at", "0.5,0.5"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    grid = cv2.imread(str(out))[..., ::-1]
    assert grid.shape[1] == ROW_LABEL_WIDTH + 6 * 160
    src = read_image(ENDOSCOPY[4])
    th = round(src.shape[0] * 160 / src.shape[1])
    assert grid.shape[0] == LABEL_HEIGHT + 2 * (th + LABEL_HEIGHT)
    crop = grid[LABEL_HEIGHT + th + LABEL_HEIGHT : LABEL_HEIGHT + 2 * th + LABEL_HEIGHT, ROW_LABEL_WIDTH : ROW_LABEL_WIDTH + 160]
    y0 = round(0.5 * src.shape[0] - th / 2)
    x0 = round(0.5 * src.shape[1] - 80)
    assert np.array_equal(crop, src[y0 : y0 + th, x0 : x0 + 160]), "the crop is the clean image at full resolution"
    bad = runner.invoke(app, [*args[:-2], "--crop-at", "2,0", "--out", str(tmp_path / "bad.png")])
    assert bad.exit_code == 2 and "fractions" in bad.output


def test_auto_crop_finds_where_the_op_acts() -> None:
    """The default 1:1 crop sits on the window that changed most (a highlight in a corner),
    not the middle; an unchanged image keeps the middle."""
    import torch

    from perturb.cli.preview_grid import most_changed

    clean = torch.full((3, 300, 400), 0.4)
    changed = clean.clone()
    changed[:, 240:260, 20:50] = 1.0  # a small highlight near the bottom-left corner
    cx, cy = most_changed(clean, changed, 100, 80)
    assert 20 <= cx * 400 <= 90 and 210 <= cy * 300 <= 290, (cx * 400, cy * 300)
    assert most_changed(clean, clean, 100, 80) == (0.5, 0.5)
