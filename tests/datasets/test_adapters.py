"""Radiology adapters on local fixtures in the upstream schemas: rows, keys, modalities, leaking
fields, the hub branch (on the same local files), and bad inputs with errors naming the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perturb.datasets import _adapter as common
from perturb.datasets import medthinkvqa, open_adapter, rexvqa, vindr_cxr_vqa
from perturb.datasets._adapter import normalize_modality
from perturb.io.datasets import DatasetError, ImageFetchError, InputDataset
from perturb.io.images import decode_image
from tests.datasets.radiology_fixtures import (
    MED_MODALITIES,
    VINDR_SIZE,
    make_medthinkvqa,
    make_rexvqa,
    make_vindr,
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _rows(inp: InputDataset) -> list[dict]:
    return inp.table_without_image().to_pylist()


# ---------------------------------------------------------------------------------------------
# VinDr-CXR-VQA


def test_vindr_rows_keys_and_images(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    inp = open_adapter("vindr-cxr-vqa", fx.data, images=fx.images)
    rows = _rows(inp)
    assert len(rows) == 6  # the test split: two images x three questions
    assert {r["img_id"] for r in rows} == {"a1b2c3d4e5", "f6e5d4c3b2"}
    assert all(
        r["sample_key"] == r["img_id"] and r["view"] == 0 and r["n_views"] == 1 for r in rows
    )
    assert {r["type"] for r in rows} == {"Where", "Is_there", "How_many"}
    half = [r for r in rows if r["img_id"] == "f6e5d4c3b2"]
    assert {(r["orig_width"], r["orig_height"]) for r in half} == {
        (VINDR_SIZE[0] * 2, VINDR_SIZE[1] * 2)
    }
    assert inp.annotations is not None and "answer" in inp.annotations.text_columns
    groups, empty = inp.groups()
    assert len(groups) == 2 and not empty
    img = decode_image(inp.image_bytes(groups[0].rows[0]))
    assert img.dtype.name == "uint16" and img.shape == (VINDR_SIZE[1], VINDR_SIZE[0])
    train = open_adapter("vindr-cxr-vqa", fx.data, images=fx.images, split="train")
    assert {r["img_id"] for r in _rows(train)} == {"0123456789"}


def test_vindr_single_json_list_and_jsonl(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    objs = [json.loads(p.read_text()) for p in sorted((fx.data / "test").glob("*.json"))]
    one = tmp_path / "all.json"
    one.write_text(json.dumps(objs))
    lines = tmp_path / "all.jsonl"
    lines.write_text("\n".join(json.dumps(o) for o in objs))
    for src in (one, lines):
        assert len(open_adapter("vindr-cxr-vqa", src, images=fx.images)) == 6


def test_vindr_bad_inputs_name_the_fix(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    with pytest.raises(DatasetError, match="--images"):
        open_adapter("vindr-cxr-vqa", fx.data)
    with pytest.raises(DatasetError, match=r"does not exist.*--images"):
        open_adapter("vindr-cxr-vqa", fx.data, images=tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="none of the 2 images was found"):
        open_adapter("vindr-cxr-vqa", fx.data, images=empty)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "x", "qa": []}]))
    with pytest.raises(DatasetError, match="not in the VinDr-CXR-VQA schema"):
        open_adapter("vindr-cxr-vqa", bad, images=fx.images)
    with pytest.raises(DatasetError, match=r"split 'valid'.*--split"):
        open_adapter("vindr-cxr-vqa", fx.data, images=fx.images, split="valid")
    with pytest.raises(DatasetError, match="unknown adapter"):
        open_adapter("vindr", fx.data)


def test_hub_branch_reads_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No source: the adapter asks huggingface_hub for a snapshot of the hub repo and reads it
    like a local copy (the download is replaced by the local fixture: the hub is unreachable)."""
    import huggingface_hub

    fx = make_vindr(tmp_path)
    rex = make_rexvqa(tmp_path / "rex")
    asked: list[str] = []

    def snapshot(repo_id: str, repo_type: str, allow_patterns: list[str]) -> str:
        asked.append(repo_id)
        assert repo_type == "dataset"
        return str(
            {vindr_cxr_vqa.HUB_ID: fx.data, rexvqa.HUB_ID: rex.json_file.parent.parent}[
                repo_id
            ]
        )

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert len(open_adapter("vindr-cxr-vqa", images=fx.images)) == 6
    assert len(open_adapter("rexvqa", images=rex.images)) == 4
    assert asked == [vindr_cxr_vqa.HUB_ID, rexvqa.HUB_ID]


def test_hub_offline_error_names_the_fix(tmp_path: Path) -> None:
    # with a network: the hub's own error (gated, offline); without: "unreachable" at once
    with pytest.raises(DatasetError, match=r"(offline or gated|hub is unreachable).*--dataset"):
        open_adapter("rexvqa", "rajpurkarlab/ReXVQA", images=tmp_path)


# ---------------------------------------------------------------------------------------------
# ReXVQA


def test_rexvqa_study_is_one_sample_and_reports_are_left_out(tmp_path: Path) -> None:
    fx = make_rexvqa(tmp_path)
    inp = open_adapter("rexvqa", fx.json_file.parent, images=fx.images)  # folder: test split
    rows = _rows(inp)
    assert len(rows) == 4  # q-a-1 over two views, q-a-2 and q-b-1 over one
    leak = {"Findings", "Impression", "correct_answer_explanation"}
    assert not leak & set(inp.columns)
    a = [r for r in rows if r["question_id"] == "q-a-1"]
    assert [r["view"] for r in a] == [0, 1] and {r["n_views"] for r in a} == {2}
    assert {r["sample_key"] for r in a} == {fx.study_a}
    assert len({r["img_id"] for r in a}) == 2
    groups, _ = inp.groups()
    assert len(groups) == 3  # an image in two questions is one image
    assert sorted(len(g.rows) for g in groups) == [1, 1, 2]  # the lateral view is in two
    a2 = [r for r in rows if r["question_id"] == "q-a-2"]
    assert [r["sample_key"] for r in a2] == [fx.study_a] and a2[0]["img_id"] == a[1]["img_id"]
    assert {inp.sample_key(g) for g in groups} == {fx.study_a, fx.study_a.replace("11", "22")}
    assert {r["correct_answer"] for r in rows} == {"A", "B"}
    kept = open_adapter("rexvqa", fx.json_file, images=fx.images, keep_leaking_fields=True)
    assert leak <= set(kept.columns)


def test_rexvqa_missing_images_and_schema(tmp_path: Path) -> None:
    fx = make_rexvqa(tmp_path)
    missing = next(fx.images.rglob("5.2.png"))
    missing.unlink()
    inp = open_adapter("rexvqa", fx.json_file, images=fx.images)  # some missing: per-image errors
    groups, _ = inp.groups()
    lost = [g for g in groups if g.img_id.endswith("5.2")]
    with pytest.raises(ImageFetchError, match=r"5\.2\.png"):
        inp.image_bytes(lost[0].rows[0])
    with pytest.raises(DatasetError, match=r"none of the 3 images was found.*--images"):
        open_adapter("rexvqa", fx.json_file, images=tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"q1": {"question": "x", "ImagePath": ["a.png"]}}))
    with pytest.raises(DatasetError, match=r"lacks options, correct_answer.*ReXVQA schema"):
        open_adapter("rexvqa", bad, images=fx.images)


# ---------------------------------------------------------------------------------------------
# MedThinkVQA


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_medthinkvqa_rows_modalities_and_leaks(tmp_path: Path, fmt: str) -> None:
    folder = make_medthinkvqa(tmp_path, fmt)
    inp = open_adapter("medthinkvqa", folder)  # images start at the dataset folder
    rows = _rows(inp)
    assert len(rows) == 5 and inp.modality_column == "modality"
    by_id = {r["img_id"]: r for r in rows}
    assert by_id["case10001_ct01"]["modality"] == "ct"
    assert by_id["case10001_xr01"]["modality"] == "xray"
    assert by_id["case10001_en01"]["modality"] == "endoscopy"
    assert by_id["case10002_mr01"]["modality"] == "mri"
    assert by_id["case10002_nm01"]["modality"] == "any"  # unknown label: generic ops only
    assert {r["sample_key"] for r in rows} == set(MED_MODALITIES)
    assert [r["view"] for r in rows if r["case_id"] == "case10001"] == [0, 1, 2]
    cols = set(inp.columns)
    assert not any("caption" in c for c in cols)
    assert not {"DIAGNOSIS", "DISCUSSION"} & cols
    assert {"options", "correct_answer", "CLINICAL_HISTORY", "title"} <= cols
    assert by_id["case10001_ct01"]["options"]["B"] == "Diverticulitis"
    kept = open_adapter("medthinkvqa", folder, keep_leaking_fields=True)
    assert {"DIAGNOSIS", "image_caption"} <= set(kept.columns)


def test_medthinkvqa_bad_inputs(tmp_path: Path) -> None:
    folder = make_medthinkvqa(tmp_path)
    with pytest.raises(DatasetError, match=r"none of the 5 images.*--images"):
        open_adapter("medthinkvqa", folder, images=tmp_path / "MedThinkVQA" / "images")
    import datasets

    other = tmp_path / "other"
    other.mkdir()
    datasets.Dataset.from_list([{"question": "q", "answer": "a"}]).to_parquet(
        str(other / "test.parquet")
    )
    with pytest.raises(DatasetError, match="not in the MedThinkVQA schema"):
        open_adapter("medthinkvqa", other)


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("CT", "ct"),
        ("CTA", "ct"),
        ("Computed Tomography", "ct"),
        ("MRI", "mri"),
        ("MR angiography", "mri"),
        ("X-ray", "xray"),
        ("Plain radiograph", "xray"),
        ("Mammography", "xray"),
        ("US", "ultrasound"),
        ("Ultrasound", "ultrasound"),
        ("Pathology", "pathology"),
        ("Histology", "pathology"),
        ("Photo", "photo"),
        ("Clinical photograph", "photo"),
        ("Endoscopy", "endoscopy"),
        ("Nuclear medicine", "any"),
        ("", "any"),
        (None, "any"),
    ],
)
def test_normalize_modality(label: str | None, expected: str) -> None:
    assert normalize_modality(label) == expected


def test_relative_image_path() -> None:
    assert common.relative_image_path("../../a/./b/c.png") == "a/b/c.png"
    assert common.relative_image_path("a\\b.png") == "a/b.png"


def test_vindr_dicom_folder_asks_for_png(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    dicoms = tmp_path / "dicom"
    dicoms.mkdir()
    (dicoms / "a1b2c3d4e5.dicom").write_bytes(b"DICM")
    with pytest.raises(DatasetError, match=r"DICOM files but no PNGs: convert"):
        open_adapter("vindr-cxr-vqa", fx.data, images=dicoms)


def test_medthinkvqa_hub_branch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub id goes through huggingface_hub (a parquet snapshot) and datasets' parquet
    loader; the download is replaced by the local copy in the hub's layout."""
    import huggingface_hub

    folder = make_medthinkvqa(tmp_path)
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, repo_type, allow_patterns: (
            str(folder) if repo_id == medthinkvqa.HUB_ID else ""
        ),
    )
    inp = open_adapter("medthinkvqa", split="test")
    assert len(inp) == 5 and inp.fingerprint.startswith("medthinkvqa:")
