"""Identity: no two images ever share an img_id silently, and no stale output survives an input
change, a smaller --limit or an --out inside the input folder."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
from PIL import Image

from tests.hostile.conftest import (
    errors,
    generate,
    image,
    manifest_rows,
    png,
    usage_error,
)


def _class_folder(root: Path) -> Path:
    """normal/001.jpg, polyp/001.jpg, polyp/001.png: three images, one stem."""
    for rel, seed in (("normal/001.jpg", 1), ("polyp/001.jpg", 2), ("polyp/001.png", 3)):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image(seed)).save(path)
    return root


def test_class_subfolders_sharing_a_stem_are_refused_with_the_list(
    tmp_path: Path, suite_file: Path
) -> None:
    folder = _class_folder(tmp_path / "images")
    code, out = generate(suite_file, folder, tmp_path / "out")
    usage_error(code, out, "normal/001.jpg", "polyp/001.jpg", "polyp/001.png", "--id-from path")
    assert not (tmp_path / "out" / "manifest.parquet").exists()


def test_id_from_path_keeps_three_images_apart(tmp_path: Path, suite_file: Path) -> None:
    folder = _class_folder(tmp_path / "images")
    out = tmp_path / "out"
    code, text = generate(suite_file, folder, out, "--id-from", "path")
    assert code == 0, text
    rows = manifest_rows(out)
    assert sorted(r["img_id"] for r in rows) == ["normal/001.jpg", "polyp/001.jpg", "polyp/001.png"]
    assert len({r["sha256"] for r in rows}) == 3 and len({r["input_sha256"] for r in rows}) == 3
    # each output is the perturbation of its own input (the clean picture is recognisable)
    for r in rows:
        got = np.asarray(Image.open(out / r["path"]), dtype=np.float64)
        clean = np.asarray(Image.open(folder / r["img_id"]).convert("RGB"), dtype=np.float64)
        others = [
            np.asarray(Image.open(folder / o["img_id"]).convert("RGB"), dtype=np.float64)
            for o in rows
            if o is not r
        ]
        assert all(np.abs(got - clean).mean() < np.abs(got - other).mean() for other in others)


def test_parquet_paths_sharing_a_stem_are_refused(tmp_path: Path, suite_file: Path) -> None:
    for rel, seed in (("x/one.jpg", 1), ("y/one.jpg", 2)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image(seed)).save(tmp_path / rel)
    table = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict(
        {"image_path": ["x/one.jpg", "y/one.jpg", "x/one.jpg"], "question": ["a", "b", "c"]}
    ).to_parquet(str(table))
    code, out = generate(suite_file, table, tmp_path / "out")
    usage_error(code, out, "x/one.jpg", "y/one.jpg", "--id-from path")
    # the same file named by several QA rows is one image, not a collision
    code, out = generate(suite_file, table, tmp_path / "out2", "--id-from", "path")
    assert code == 0, out
    assert sorted(r["img_id"] for r in manifest_rows(tmp_path / "out2")) == ["x/one.jpg", "y/one.jpg"]


def test_rows_sharing_an_img_id_with_different_images_are_an_error(
    tmp_path: Path, suite_file: Path
) -> None:
    table = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict(
        {
            "img_id": ["a", "a", "b", "b"],
            "image": [png(image(1)), png(image(2)), png(image(3)), png(image(3))],
            "question": ["q1", "q2", "q3", "q4"],
        }
    ).to_parquet(str(table))
    out = tmp_path / "out"
    code, text = generate(suite_file, table, out)
    assert code == 1 and "--allow-errors" in text, text  # the run goes on, then exits 1
    assert [r["img_id"] for r in manifest_rows(out)] == ["b"]  # identical bytes: fine
    (err,) = [e for e in errors(out) if e["img_id"] == "a"]
    assert "rows 0 and 1" in err["reason"] and "different images" in err["reason"]
    code, text = generate(suite_file, table, tmp_path / "strict", "--strict")
    assert code == 1


def test_an_input_changed_in_place_is_perturbed_again(tmp_path: Path, suite_file: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(image(1)).save(folder / "a.png")
    Image.fromarray(image(2)).save(folder / "b.png")
    out = tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    before = {r["img_id"]: r for r in manifest_rows(out)}
    Image.fromarray(image(9)).save(folder / "a.png")  # same size, other pixels
    code, text = generate(suite_file, folder, out)
    assert code == 0 and "written 1" in text, text
    after = {r["img_id"]: r for r in manifest_rows(out)}
    assert after["a"]["input_sha256"] != before["a"]["input_sha256"]
    assert after["a"]["sha256"] != before["a"]["sha256"]
    assert after["b"] == before["b"]
    assert generate(suite_file, folder, out)[1].count("written 0") == 1


def test_out_inside_the_input_folder_is_refused(tmp_path: Path, suite_file: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(image(1)).save(folder / "a.png")
    code, out = generate(suite_file, folder, folder / "perturbed")
    usage_error(code, out, "inside the input folder", "outside")
    assert not (folder / "perturbed").exists()


def test_a_smaller_limit_is_refused_and_a_larger_one_extends(
    tmp_path: Path, suite_file: Path
) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(image(i)).save(folder / f"i{i}.png")
    out = tmp_path / "out"
    assert generate(suite_file, folder, out, "--limit", "2")[0] == 0
    usage_error(*generate(suite_file, folder, out, "--limit", "1"), "--limit 2 or more")
    assert len(manifest_rows(out)) == 2
    assert generate(suite_file, folder, out, "--limit", "3")[0] == 0
    assert len(manifest_rows(out)) == 3
    usage_error(*generate(suite_file, folder, out, "--limit", "2"), "--limit 3 or more")


def test_shards_made_with_different_limits_do_not_merge(tmp_path: Path, suite_file: Path) -> None:
    from tests.hostile.conftest import cli

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(image(i)).save(folder / f"i{i}.png")
    a, b = tmp_path / "a", tmp_path / "b"
    assert generate(suite_file, folder, a, "--shard", "0/2", "--limit", "4")[0] == 0
    assert generate(suite_file, folder, b, "--shard", "1/2", "--limit", "2")[0] == 0
    usage_error(*cli("merge-manifests", str(a), str(b), "--out", str(tmp_path / "m")), "limit")
