"""A flat folder of images opens without ``load_dataset``'s builder (start-up of a generation
run), as the same rows, order and features the builder gives; any other folder still goes to
``load_dataset``."""

from __future__ import annotations

import shutil
from pathlib import Path

import datasets
import pytest

from perturb.io import datasets as io_datasets
from perturb.io.datasets import flat_image_files, open_input

FRAME = Path(__file__).resolve().parents[1] / "data" / "endoscopy" / "polypgen_100H0050.jpg"
# names whose order depends on case, digits, separators and spaces
NAMES = ("B.jpg", "a.JPG", "10.png", "9.jpeg", "z z.jpg", "Ab.png", "a-1.jpg", "a_1.jpg", "aB.jpg")


def _folder(tmp_path: Path, names: tuple[str, ...] = NAMES) -> Path:
    folder = tmp_path / "frames"
    folder.mkdir()
    for name in names:
        shutil.copy(FRAME, folder / name)
    return folder


def _paths(ds: datasets.Dataset) -> list[str]:
    return [cell["path"] for cell in ds.cast_column("image", datasets.Image(decode=False))["image"]]


@pytest.mark.parametrize("linked", [False, True])
def test_flat_folder_rows_match_load_dataset(tmp_path: Path, linked: bool) -> None:
    folder = _folder(tmp_path)
    if linked:  # a link to the folder, and a linked file whose target has another name
        (folder / "c.jpg").symlink_to(FRAME)
        link = tmp_path / "link"
        link.symlink_to(folder)
        folder = link
    with io_datasets._quiet():
        reference = datasets.load_dataset(str(folder), cache_dir=str(tmp_path / "cache"))
    assert list(reference) == ["train"]
    files = flat_image_files(folder)
    assert files is not None
    fast = io_datasets._image_folder_dataset(files)
    assert fast.features == reference["train"].features
    assert fast.column_names == reference["train"].column_names
    assert _paths(fast) == _paths(reference["train"])


def test_open_input_skips_the_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_dataset called for a flat image folder")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    inp = open_input(folder)
    assert len(inp) == len(NAMES)
    assert inp.fingerprint == f"local:{folder.resolve()}:train"
    assert sorted(inp.row_ids()) == sorted(Path(n).stem for n in NAMES)
    assert inp.image_bytes(0) == FRAME.read_bytes()


@pytest.mark.parametrize(
    "extra",
    ["metadata.csv", "sub/", ".hidden.jpg", "_x.jpg", "test_1.jpg", "a.val.jpg", "notes.txt"],
)
def test_other_folders_go_to_load_dataset(tmp_path: Path, extra: str) -> None:
    folder = _folder(tmp_path, ("a.jpg", "b.png"))
    if extra.endswith("/"):
        (folder / extra).mkdir()
        shutil.copy(FRAME, folder / extra / "c.jpg")
    else:
        (folder / extra).write_bytes(FRAME.read_bytes())
    assert flat_image_files(folder) is None


def test_split_other_than_train_goes_to_load_dataset(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ("a.jpg",))
    with pytest.raises(io_datasets.DatasetError, match="no split 'test'"):
        open_input(folder, split="test", cache_dir=tmp_path / "cache")
