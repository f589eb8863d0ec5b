"""Input adapters over HF ``datasets``: built-in, hub id (on local data in the hub's schema),
save_to_disk (Dataset and DatasetDict), parquet, JSONL with image paths, image folders."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import datasets
import numpy as np
import pytest

from perturb.datasets import open_input
from perturb.datasets.phantoms import builtin_dataset
from perturb.datasets.phantoms.endoscopy import render
from perturb.io import datasets as adapters
from perturb.io.datasets import DatasetError, ImageFetchError
from perturb.io.images import decode_image

SIZE = (96, 72)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def kvasir_like() -> datasets.Dataset:
    """4 images x 6 QA rows in the Kvasir-VQA-x1 schema."""
    return builtin_dataset(4, size=SIZE)


def _check(inp: adapters.InputDataset, n_rows: int = 24, n_images: int = 4) -> None:
    groups, empty = inp.groups()
    assert len(inp) == n_rows and len(groups) == n_images and not empty
    assert all(len(g.rows) == n_rows // n_images for g in groups)
    img = decode_image(inp.image_bytes(groups[0].rows[0]))
    assert img.shape == (SIZE[1], SIZE[0], 3)
    table = inp.table_without_image()
    assert table.num_rows == n_rows and inp.image_column not in table.column_names


def test_builtin(kvasir_like: datasets.Dataset) -> None:
    inp = open_input(None, builtin_images=2)
    assert (
        inp.source == "built-in phantoms"
        and inp.fingerprint == "builtin:2"
        and inp.image_column == "image"
    )
    assert len(inp.groups()[0]) == 2


def test_hub_id_goes_through_load_dataset_with_the_test_split(
    tmp_path: Path, kvasir_like: datasets.Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local copy of a hub repo in its layout (data/<split>-*.parquet) is what load_dataset
    reads for SimulaMet/Kvasir-VQA-x1; the hub id branch calls it with split=test."""
    repo = tmp_path / "Kvasir-VQA-x1"
    (repo / "data").mkdir(parents=True)
    kvasir_like.to_parquet(str(repo / "data" / "test-00000-of-00001.parquet"))
    kvasir_like.select(range(6)).to_parquet(str(repo / "data" / "train-00000-of-00001.parquet"))
    real = datasets.load_dataset
    calls = []

    def fake(path: str, *args: object, **kwargs: object) -> object:
        calls.append((path, kwargs))
        return real(str(repo), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(adapters.datasets, "load_dataset", fake)
    inp = open_input("SimulaMet/Kvasir-VQA-x1")
    assert calls == [("SimulaMet/Kvasir-VQA-x1", {"split": "test"})]
    assert inp.fingerprint == "hub:SimulaMet/Kvasir-VQA-x1:test"
    _check(inp)
    assert isinstance(inp.ds.features["image"], datasets.Image) and inp.id_column == "img_id"
    train = open_input("SimulaMet/Kvasir-VQA-x1", split="train")
    assert len(train) == 6
    # the same folder opened as a local path picks the test split by default
    _check(open_input(str(repo)))


def test_hub_failure_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> object:
        raise ConnectionError("Couldn't reach 'owner/name' on the Hub (LocalEntryNotFoundError)")

    import socket

    monkeypatch.setattr(adapters.datasets, "load_dataset", offline)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [])  # the host resolves
    with pytest.raises(DatasetError, match=r"owner/name: cannot load the dataset.*offline\?"):
        open_input("owner/name")
    with pytest.raises(DatasetError, match="no such file or folder"):
        open_input("./missing/folder")


def test_save_to_disk_dataset_and_dataset_dict(
    tmp_path: Path, kvasir_like: datasets.Dataset
) -> None:
    kvasir_like.save_to_disk(str(tmp_path / "ds"))
    _check(open_input(str(tmp_path / "ds")))
    dd = datasets.DatasetDict({"train": kvasir_like.select(range(6)), "validation": kvasir_like})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(
        DatasetError, match=r"several splits \(train, validation\); choose one with --split"
    ):
        open_input(str(tmp_path / "dd"))
    with pytest.raises(DatasetError, match="no split 'test'; available splits: train, validation"):
        open_input(str(tmp_path / "dd"), split="test")
    _check(open_input(str(tmp_path / "dd"), split="validation"))


def test_parquet_and_jsonl_with_image_paths(tmp_path: Path, kvasir_like: datasets.Dataset) -> None:
    kvasir_like.to_parquet(str(tmp_path / "rows.parquet"))
    _check(open_input(str(tmp_path / "rows.parquet")))
    images = tmp_path / "imgs"
    images.mkdir()
    rows = []
    for i in range(3):
        cv2.imwrite(str(images / f"f{i}.png"), render(f"p{i}", SIZE).image[..., ::-1])
        rows += [
            {"image_path": f"imgs/f{i}.png", "img_id": f"f{i}", "question": f"q{j}", "answer": "a"}
            for j in range(2)
        ]
    rows.append(
        {"image_path": "imgs/missing.png", "img_id": "gone", "question": "q", "answer": "a"}
    )
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    inp = open_input(str(tmp_path / "rows.jsonl"))
    assert inp.image_column == "image_path"
    groups, _ = inp.groups()
    assert [g.img_id for g in groups] == ["f0", "f1", "f2", "gone"]
    assert np.array_equal(
        decode_image(inp.image_bytes(groups[1].rows[0])), render("p1", SIZE).image
    )
    fetched = dict((g.img_id, data) for g, data in inp.images())
    assert isinstance(fetched["gone"], ImageFetchError) and "missing.png" in str(fetched["gone"])
    with pytest.raises(DatasetError, match="no column 'pixels'"):
        open_input(str(tmp_path / "rows.jsonl"), image_column="pixels")
    (tmp_path / "noimg.jsonl").write_text(json.dumps({"img_id": "a", "question": "q"}) + "\n")
    with pytest.raises(DatasetError, match="no image column"):
        open_input(str(tmp_path / "noimg.jsonl"))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(DatasetError, match="unsupported file type"):
        open_input(str(tmp_path / "x.txt"))


def test_image_folder_ids_from_file_names(tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for name in ("b", "a", "c"):
        cv2.imwrite(str(folder / f"{name}.jpg"), render(name, SIZE).image[..., ::-1])
    inp = open_input(str(folder))
    groups, _ = inp.groups()
    assert sorted(g.img_id for g in groups) == ["a", "b", "c"] and inp.id_column is None
    for g in groups:
        assert decode_image(inp.image_bytes(g.rows[0])).shape == (SIZE[1], SIZE[0], 3)


def test_empty_ids_and_duplicate_rows(tmp_path: Path) -> None:
    png = cv2.imencode(".png", render("x", SIZE).image)[1].tobytes()
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": png, "path": None}] * 4,
            "img_id": ["a", None, "a", ""],
            "q": ["1", "2", "3", "4"],
        },
        features=datasets.Features(
            {
                "image": datasets.Image(),
                "img_id": datasets.Value("string"),
                "q": datasets.Value("string"),
            }
        ),
    )
    ds.save_to_disk(str(tmp_path / "d"))
    groups, empty = open_input(str(tmp_path / "d")).groups()
    assert [(g.img_id, g.rows) for g in groups] == [("a", [0, 2])] and empty == [1, 3]


def test_an_unreachable_hub_fails_at_once_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No DNS for the hub: the hub calls run offline (the local cache, here empty) instead of
    retrying the network for half a minute, and the error says what to do; the hub's offline
    switch is restored afterwards."""
    import socket

    import huggingface_hub.constants as hub_constants

    from perturb.datasets._adapter import locate
    from perturb.io.datasets import DatasetError, load_table

    def no_dns(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    for call in (
        lambda: load_table("someone/no-such-set", "test", cache_dir=str(tmp_path / "cache")),
        lambda: locate(None, "someone/no-such-set", ["*.json"]),
    ):
        with pytest.raises(DatasetError, match=r"hub is unreachable .* --dataset"):
            call()
    assert hub_constants.HF_HUB_OFFLINE is False
