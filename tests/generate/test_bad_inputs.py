"""Bad input rows: truncated and zero-byte images, RGBA, grayscale, 16-bit PNG, CMYK JPEG,
decompression bombs, unsafe img_ids, empty ids. Nothing is written outside DIR, unsafe ids are
encoded and recorded, undecodable rows go to errors.jsonl and the run goes on (exit 1 only with
--strict), and the summary accounts for every row."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import cv2
import datasets
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from perturb.cli import app
from perturb.datasets.phantoms.endoscopy import render
from perturb.generate.naming import safe_stem
from tests.generate.conftest import manifest_rows

runner = CliRunner()
SIZE = (96, 72)


def _png(img: np.ndarray) -> bytes:
    arr = img
    if img.ndim == 3:
        arr = cv2.cvtColor(img, cv2.COLOR_RGBA2BGRA if img.shape[2] == 4 else cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".png", arr)
    assert ok
    return buf.tobytes()


def _bomb_png() -> bytes:
    """A PNG whose header claims 60000 x 60000 pixels."""
    data = bytearray(_png(render("bomb", SIZE).image))
    data[16:20] = (60000).to_bytes(4, "big")
    data[20:24] = (60000).to_bytes(4, "big")
    return bytes(data)


def _cmyk_jpeg(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


LONG_ID = "very-long-" + "x" * 400


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rgb = render("good", SIZE).image
    rows = [
        ("good", _png(rgb)),
        ("truncated", _png(render("t", SIZE).image)[:200]),
        ("zero-bytes", b""),
        ("rgba", _png(np.dstack([rgb, np.full(rgb.shape[:2], 128, np.uint8)]))),
        ("gray", _png(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))),
        ("sixteen-bit", _png(rgb.astype(np.uint16) * 257 + 3)),
        ("cmyk", _cmyk_jpeg(rgb)),
        ("bomb", _bomb_png()),
        ("../escape", _png(rgb)),
        ("a/b", _png(rgb)),
        ("nul\x00id", _png(rgb)),
        (LONG_ID, _png(rgb)),
        ("/abs/olute", _png(rgb)),
        ("..", _png(rgb)),
        ("", _png(rgb)),
    ]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "img_id": datasets.Value("string"),
            "question": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": data, "path": None} for _, data in rows],
            "img_id": [img_id for img_id, _ in rows],
            "question": [f"q{i}" for i in range(len(rows))],
        },
        features=features,
    )
    box = tmp_path_factory.mktemp("box")
    path = box / "input" / "bad.parquet"
    path.parent.mkdir()
    ds.to_parquet(str(path))
    return path


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "bad.yaml"
    path.write_text(
        "suite: bad-inputs\njobs:\n  - composite: kvasir_transformed\n    variants: 1\n"
        "  - ops: [gaussian_noise, color_cast]\n    severities: [3]\n"
        "output:\n  layout: '{op}/v{variant}/s{severity}/{img_id}.{ext}'\n  format: png\n"
    )
    return path


def _all_files(root: Path) -> set[str]:
    return {str(Path(d, f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs}


def test_bad_inputs_are_reported_encoded_and_contained(bad_input: Path, suite_file: Path) -> None:
    box = bad_input.parent.parent
    out = box / "run" / "out"
    before = _all_files(box)
    result = runner.invoke(
        app,
        [
            "generate",
            str(suite_file),
            "--dataset",
            str(bad_input),
            "--out",
            str(out),
            "--quiet",
            "--json",
            "--allow-errors",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    # nothing outside DIR
    after = _all_files(box)
    assert {f for f in after - before if not f.startswith("run/out/")} == set()
    assert not (box / "run" / "escape.png").exists() and not list(box.rglob("escape*"))
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    reasons = {e["img_id"]: e for e in errors}
    assert (
        reasons["truncated"]["stage"] == "decode" and "truncated" in reasons["truncated"]["reason"]
    )
    assert "0 bytes" in reasons["zero-bytes"]["reason"]
    assert "pixel" in reasons["bomb"]["reason"] and "limit" in reasons["bomb"]["reason"]
    assert any(e["stage"] == "id" and e["img_id"] is None for e in errors)
    assert all(e["qa_rows"] >= 1 for e in errors)
    rows = manifest_rows(out)
    produced = {r["img_id"] for r in rows}
    ok_ids = {
        "good",
        "rgba",
        "gray",
        "sixteen-bit",
        "cmyk",
        "../escape",
        "a/b",
        "nul\x00id",
        LONG_ID,
        "/abs/olute",
        "..",
    }
    assert produced == ok_ids
    for r in rows:
        assert (
            r["file_id"] == safe_stem(r["img_id"])
            and "/" not in r["file_id"]
            and "\x00" not in r["file_id"]
        )
        assert (
            r["path"].split("/")[-1].startswith(r["file_id"])
            and len(r["path"].split("/")[-1]) < 200
        )
        assert (out / r["path"]).resolve().is_relative_to(out.resolve())
    by = {(r["img_id"], r["op"]): r for r in rows}
    assert by[("rgba", "gaussian_noise")]["channels"] == 3
    assert (
        by[("gray", "gaussian_noise")]["channels"] == 1
        and by[("gray", "color_cast")]["channels"] == 3
    )
    sixteen = cv2.imread(
        str(out / by[("sixteen-bit", "gaussian_noise")]["path"]), cv2.IMREAD_UNCHANGED
    )
    assert sixteen.dtype == np.uint16 and bool((sixteen % 257 != 0).any())
    assert by[("sixteen-bit", "gaussian_noise")]["bit_depth"] == 16
    # every row accounted for: 15 rows = 11 images with outputs + 3 undecodable + 1 without id
    assert (
        summary["input_rows"] == 15 and summary["rows_without_id"] == 1 and summary["images"] == 14
    )
    assert summary["images_ok"] == 11 and summary["images_failed"] == 3
    assert summary["outputs_written"] == 11 * 3 and summary["errors"] == len(errors) == 4
    assert summary["unsafe_ids"] == 6
    ds = datasets.load_from_disk(str(out / "dataset"))
    assert sorted(set(ds["img_id"])) == sorted(ok_ids)
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    strict = runner.invoke(
        app,
        [
            "generate",
            str(suite_file),
            "--dataset",
            str(bad_input),
            "--out",
            str(out),
            "--quiet",
            "--strict",
        ],
    )
    assert strict.exit_code == 1


def test_pixel_limit_is_configurable(bad_input: Path, suite_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "small-limit"
    result = runner.invoke(
        app,
        [
            "generate",
            str(suite_file),
            "--dataset",
            str(bad_input),
            "--out",
            str(out),
            "--quiet",
            "--max-pixels",
            "1000",
            "--limit",
            "1",
        ],
    )
    assert result.exit_code == 1 and "--allow-errors" in result.output  # a run with errors
    (error,) = [
        json.loads(line)
        for line in (out / "errors.jsonl").read_text().splitlines()
        if "good" in line
    ]
    assert "1000" in error["reason"] and not manifest_rows(out)
