"""DIR/dataset: paths to DIR's files by default (relative, so DIR can move), the image bytes
only with --embed-images and then once per output however many QA rows share it; shards merge
either way; ``load_generated`` gives PIL images in both modes."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import datasets
import pytest
from PIL import Image

from perturb.configs.suites import parse_suite
from perturb.generate import load_generated
from perturb.generate.merge import merge_parts
from tests.generate.conftest import manifest_rows, run

SUITE: dict[str, Any] = {
    "suite": "paths",
    "seed": 3,
    "jobs": [{"ops": ["gaussian_noise", "gaussian_blur"], "severities": [2, 4]}],
    "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
}
QA_PER_IMAGE = 6  # the small input: 6 phantoms x 6 QA rows


def _size(folder: Path) -> int:
    return sum((Path(d) / f).stat().st_size for d, _, files in os.walk(folder) for f in files)


def _image_features(ds: Any) -> list[str]:
    return [k for k, v in ds.features.items() if isinstance(v, datasets.Image)]


@pytest.fixture(scope="module")
def paths_run(tmp_path_factory: pytest.TempPathFactory, small_input: Path) -> Path:
    out = tmp_path_factory.mktemp("paths") / "out"
    run(parse_suite(SUITE, "paths"), out, small_input, limit=3)
    return out


def test_default_stores_relative_paths_not_bytes(paths_run: Path, tmp_path: Path) -> None:
    ds = datasets.load_from_disk(str(paths_run / "dataset"))
    rows = manifest_rows(paths_run)
    assert len(ds) == len(rows) * QA_PER_IMAGE == 3 * 4 * QA_PER_IMAGE
    assert _image_features(ds) == [] and "image" not in ds.column_names
    assert not (paths_run / "dataset" / "images").exists()
    assert set(ds["path"]) == {r["path"] for r in rows}
    assert all(not Path(p).is_absolute() for p in ds["path"])
    images = sum(r["size_bytes"] for r in rows)
    assert _size(paths_run / "dataset") < images  # would exceed QA_PER_IMAGE x with copies
    # the folder moves as a whole; the paths still resolve, to the very files
    moved = tmp_path / "moved"
    shutil.copytree(paths_run, moved)
    loaded = load_generated(moved)
    assert _image_features(loaded) == ["image"]
    for i in (0, len(loaded) - 1):
        row = loaded[i]
        assert isinstance(row["image"], Image.Image)
        with Image.open(moved / row["path"]) as im:
            assert row["image"].tobytes() == im.tobytes()
    # also from DIR/dataset
    assert len(load_generated(moved / "dataset")) == len(ds)


def test_missing_files_without_embedded_images_name_the_fix(
    paths_run: Path, tmp_path: Path
) -> None:
    shutil.copytree(paths_run / "dataset", tmp_path / "alone")
    with pytest.raises(FileNotFoundError, match="--embed-images"):
        load_generated(tmp_path / "alone")


def test_embed_images_stores_each_output_once(tmp_path: Path, small_input: Path) -> None:
    out = tmp_path / "embed"
    run(parse_suite(SUITE, "paths"), out, small_input, limit=3, embed_images=True)
    rows = manifest_rows(out)
    qa = datasets.load_from_disk(str(out / "dataset"))
    assert _image_features(qa) == [] and len(qa) == len(rows) * QA_PER_IMAGE
    images = datasets.load_from_disk(str(out / "dataset" / "images"))
    assert len(images) == len(rows)  # once per output, not once per QA row
    cells = images.cast_column("image", datasets.Image(decode=False))
    digest = {c["path"]: hashlib.sha256(c["image"]["bytes"]).hexdigest() for c in cells}
    assert digest == {r["path"]: r["sha256"] for r in rows}
    # dataset/ alone is self-contained
    shutil.move(out / "dataset", tmp_path / "alone")
    loaded = load_generated(tmp_path / "alone")
    row = loaded[len(loaded) - 1]
    assert isinstance(row["image"], Image.Image) and row["image"].size == (128, 96)
    assert row["path"] == qa[len(qa) - 1]["path"] and row["question"] == qa[len(qa) - 1]["question"]


@pytest.mark.parametrize("embed", [False, True])
def test_shards_merge_in_both_modes(tmp_path: Path, small_input: Path, embed: bool) -> None:
    suite = parse_suite(SUITE, "paths")
    whole = tmp_path / "whole"
    run(suite, whole, small_input, embed_images=embed)
    parts = [tmp_path / f"p{i}" for i in range(2)]
    for i, part in enumerate(parts):
        run(suite, part, small_input, embed_images=embed, shard=f"{i}/2")
    merge_parts(list(parts), tmp_path / "merged")
    a = datasets.load_from_disk(str(tmp_path / "merged" / "dataset"))
    b = datasets.load_from_disk(str(whole / "dataset"))
    assert a.to_list() == b.to_list()
    if embed:
        ia = datasets.load_from_disk(str(tmp_path / "merged" / "dataset" / "images"))
        ib = datasets.load_from_disk(str(whole / "dataset" / "images"))
        assert ia["path"] == ib["path"]
        assert load_generated(tmp_path / "merged")[3]["image"].size == (128, 96)
    else:
        assert not (tmp_path / "merged" / "dataset" / "images").exists()


@pytest.mark.parametrize("embed", [False, True])
def test_an_empty_shard_loads_and_merges_in_both_modes(
    tmp_path: Path, small_input: Path, embed: bool
) -> None:
    """A shard of 1 image over 2 shards: one part has 0 outputs; its dataset/ (and with
    --embed-images its dataset/images) loads, also through load_generated, and merges."""
    suite = parse_suite(SUITE, "paths")
    parts = [tmp_path / f"p{i}" for i in range(2)]
    summaries = [
        run(suite, part, small_input, embed_images=embed, shard=f"{i}/2", limit=1)
        for i, part in enumerate(parts)
    ]
    empty = next(p for p, s in zip(parts, summaries, strict=True) if s.manifest_rows == 0)
    loaded = load_generated(empty)
    assert len(loaded) == 0 and _image_features(loaded) == ["image"]
    assert (empty / "dataset" / "images").exists() == embed
    merge_parts(list(parts), tmp_path / "merged")
    merged = load_generated(tmp_path / "merged")
    assert len(merged) == 4 * QA_PER_IMAGE
    assert merged[0]["image"].size == (128, 96)
