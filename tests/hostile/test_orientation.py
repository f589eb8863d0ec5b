"""EXIF orientation: every image is decoded as ``datasets`` decodes the clean split (PIL's
``ImageOps.exif_transpose``), for all 8 orientations, and the manifest records it."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from perturb.io.images import decode_image_info
from tests.hostile.conftest import generate, image, manifest_rows


def _with_orientation(arr: np.ndarray, orientation: int, fmt: str) -> bytes:
    im = Image.fromarray(arr)
    exif = im.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    extra = {"quality": 100} if fmt == "JPEG" else {"lossless": True} if fmt == "WEBP" else {}
    im.save(buf, format=fmt, exif=exif.tobytes(), **extra)
    return buf.getvalue()


def _as_datasets_decodes(data: bytes) -> np.ndarray:
    """The clean split's pixels: ``datasets.Image`` decoding, as Kvasir-VQA-x1 users see them."""
    pil = datasets.Image().decode_example({"bytes": data, "path": None})
    return np.asarray(pil.convert("RGB"))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_decode_matches_datasets_for_every_orientation(fmt: str, orientation: int) -> None:
    arr = image(orientation, size=(7, 5))  # not square: a transposition shows in the shape
    data = _with_orientation(arr, orientation, fmt)
    got, applied = decode_image_info(data)
    want = _as_datasets_decodes(data)
    assert applied == orientation
    assert got.shape == want.shape
    assert np.array_equal(got, want)


def test_outputs_line_up_with_the_clean_split(tmp_path: Path, suite_file: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    arr = image(5, size=(40, 24))
    (folder / "turned.jpg").write_bytes(_with_orientation(arr, 6, "JPEG"))
    (folder / "plain.jpg").write_bytes(_with_orientation(arr, 1, "JPEG"))
    out = tmp_path / "out"
    code, text = generate(suite_file, folder, out)
    assert code == 0, text
    rows = {r["img_id"]: r for r in manifest_rows(out)}
    assert rows["turned"]["orientation"] == 6 and rows["plain"]["orientation"] == 1
    clean = _as_datasets_decodes((folder / "turned.jpg").read_bytes())
    perturbed = np.asarray(Image.open(out / rows["turned"]["path"]).convert("RGB"))
    assert perturbed.shape == clean.shape == (40, 24, 3)  # turned 90 degrees, as datasets shows it
    assert (rows["turned"]["width"], rows["turned"]["height"]) == (24, 40)
    # noise at severity 3 leaves the picture recognisable: close to the clean, far from a flip
    err = np.abs(perturbed.astype(float) - clean).mean()
    assert err < np.abs(perturbed.astype(float) - clean[::-1, ::-1]).mean() / 2
