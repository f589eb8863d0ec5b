"""``perturb export`` and ``perturb.load_split`` on a generated Kvasir-VQA-x1 track-2 split of
the built-in phantoms: every format holds the clean and perturbed rows with the scorer's keys,
predictions in each format pair in ``perturb score`` without --manifest, and the split opens
as a dataset whose images decode after the folder moved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

import perturb
from perturb.cli import app
from perturb.export import export_split

REPO = Path(__file__).resolve().parents[2]
IMAGES, VARIANTS, QUESTIONS = 3, 10, 6


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "track2"
    r = CliRunner().invoke(
        app,
        [
            "generate",
            str(REPO / "perturb/configs/kvasir-vqa-x1-transformed.yaml"),
            "--out",
            str(out),
            "--builtin-images",
            str(IMAGES),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    return out


def _score(tmp: Path, clean: Path, pert: Path) -> dict:
    out = tmp / "scores"
    r = CliRunner().invoke(
        app,
        [
            "score",
            "--clean",
            str(clean),
            "--perturbed",
            str(pert),
            "--out",
            str(out),
            "--bootstrap",
            "20",
        ],
    )
    assert r.exit_code in (0, 1), r.output
    return json.loads((out / "scores.json").read_text())


def test_load_split_is_upstream_schema_and_survives_a_move(split: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(split, copy)
    moved = tmp_path / "elsewhere" / "track2"
    moved.parent.mkdir()
    copy.rename(moved)
    ds = perturb.load_split(moved)
    assert isinstance(ds, datasets.Dataset)
    assert ds.column_names == [
        "image",
        "img_id",
        "complexity",
        "question",
        "answer",
        "original",
        "question_class",
        "op",
        "severity",
        "variant",
        "path",
    ]
    assert len(ds) == IMAGES * VARIANTS * QUESTIONS
    row = ds[0]
    assert isinstance(row["image"], Image.Image) and row["image"].size[0] > 0
    assert row["path"] == f"variant_{row['variant']}/{row['img_id']}.jpg"
    assert sorted(set(ds["variant"])) == list(range(1, VARIANTS + 1))
    # the moved folder decodes from its own files, not the original's
    shutil.rmtree(moved / "variant_1")
    with pytest.raises(FileNotFoundError):
        perturb.load_split(moved)


def test_ms_swift_export_pairs_without_a_manifest(split: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app,
        [
            "export",
            str(split),
            "--format",
            "ms-swift",
            "--builtin-images",
            str(IMAGES),
            "--out",
            str(tmp_path / "swift"),
        ],
    )
    assert r.exit_code == 0, r.output
    clean = [json.loads(x) for x in (tmp_path / "swift/clean.jsonl").read_text().splitlines()]
    pert = [json.loads(x) for x in (tmp_path / "swift/perturbed.jsonl").read_text().splitlines()]
    assert len(clean) == IMAGES * QUESTIONS and len(pert) == IMAGES * VARIANTS * QUESTIONS
    assert clean[0]["messages"][0]["content"].startswith("<image>")
    assert Path(clean[0]["images"][0]).is_file() and Path(pert[0]["images"][0]).is_absolute()
    assert {p["perturbation"] for p in pert} == {"kvasir_transformed"}
    # what `swift infer` writes back: the messages, images and a response, nothing else
    for name, rows in (("clean", clean), ("pert", pert)):
        answered = [
            {"messages": x["messages"], "images": x["images"], "response": "none"} for x in rows
        ]
        (tmp_path / f"{name}_out.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answered))
    s = _score(tmp_path, tmp_path / "clean_out.jsonl", tmp_path / "pert_out.jsonl")
    assert s["headline"]["pairs"] == len(pert)
    found = [i for i in s["inputs"] if i["role"] == "manifest"]
    assert found and found[0]["source"].endswith("manifest.parquet")
    assert s["coverage"]["models"]["model"]["share"] == 1.0


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_table_exports_pair_with_their_own_keys(split: Path, tmp_path: Path, fmt: str) -> None:
    res = export_split(split, fmt, tmp_path / fmt, builtin_images=IMAGES)
    assert res.rows == {"clean": IMAGES * QUESTIONS, "perturbed": IMAGES * VARIANTS * QUESTIONS}
    read = pd.read_json if fmt == "jsonl" else pd.read_parquet
    kw = {"lines": True} if fmt == "jsonl" else {}
    frames = {role: read(res.files[role], **kw) for role in ("clean", "perturbed")}
    pert = frames["perturbed"]
    assert list(pert.columns[:7]) == [
        "img_id",
        "question",
        "answer",
        "image",
        "op",
        "severity",
        "variant",
    ]
    # relative to the export folder: both resolve
    for df in frames.values():
        assert all((res.out / p).is_file() for p in df["image"].unique())
    for role, df in frames.items():
        df = df.assign(prediction=df["answer"])
        # the split folder is found even with no manifest beside the export
        df.to_json(tmp_path / f"{role}_pred.jsonl", orient="records", lines=True)
    s = _score(tmp_path, tmp_path / "clean_pred.jsonl", tmp_path / "perturbed_pred.jsonl")
    assert s["headline"]["pairs"] == len(pert)


def test_hf_export_embeds_images(split: Path, tmp_path: Path) -> None:
    res = export_split(split, "hf", tmp_path / "hf", builtin_images=IMAGES)
    dd = datasets.load_from_disk(str(res.files["hf"]))
    assert set(dd) == {"clean", "perturbed"}
    shutil.rmtree(tmp_path / "hf" / "clean")  # the clean image files: the dataset needs none
    assert isinstance(dd["clean"][0]["image"], Image.Image)
    assert dd["perturbed"].num_rows == IMAGES * VARIANTS * QUESTIONS


def test_export_refuses_the_split_folder_and_says_when_clean_rows_are_missing(
    split: Path, tmp_path: Path
) -> None:
    r = CliRunner().invoke(app, ["export", str(split), "--out", str(split / "inside")])
    assert r.exit_code == 2 and "perturb verify" in r.output
    res = export_split(split, "jsonl", tmp_path / "noclean")
    assert res.rows["clean"] == 0 and "--dataset" in res.notes[0]
    r = CliRunner().invoke(app, ["export", str(split), "--format", "csv"])
    assert r.exit_code == 2


def test_a_failed_export_leaves_no_folder_and_an_image_only_split_says_what_works(
    tmp_path: Path,
) -> None:
    """A folder of images (no questions) generates a split whose dataset/ names each image;
    the prompt formats refuse it naming --format hub, and neither that nor a folder that is
    not a split, nor a hub export without a licence, leaves an output folder behind."""
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (64, 48), (180, 90, 80)).save(images / "frame1.png")
    split = tmp_path / "split"
    r = CliRunner().invoke(
        app, ["generate", "endoscopy-artifacts", "--dataset", str(images), "--out", str(split), "--quiet"]
    )
    assert r.exit_code == 0, r.output
    assert set(perturb.load_split(split)["img_id"]) == {"frame1"}
    failures = [
        (["export", str(split), "--format", "jsonl"], "--format hub"),
        (["export", str(images), "--format", "jsonl"], "not a `perturb generate` output"),
        (["export", str(split), "--format", "hub"], "--license"),
    ]
    for args, says in failures:
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and says in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "split"]


def test_predictions_away_from_the_export_say_why_no_manifest_was_found(split: Path, tmp_path: Path) -> None:
    """A jsonl export's image paths start at the export folder: predictions written in another
    folder lose them, so no manifest is found; a warning says so and names --manifest (with the
    predictions inside the export folder the manifest is found, no warning)."""
    res = export_split(split, "jsonl", tmp_path / "exp", builtin_images=IMAGES)
    elsewhere = tmp_path / "preds" / "run-1"  # a level deeper than the export folder
    elsewhere.mkdir(parents=True)
    for folder in (elsewhere, res.out):
        for role in ("clean", "perturbed"):
            df = pd.read_json(res.files[role], lines=True).assign(prediction=lambda d: d["answer"])
            df.to_json(folder / f"{role}_pred.jsonl", orient="records", lines=True)
    lost = _score(elsewhere, elsewhere / "clean_pred.jsonl", elsewhere / "perturbed_pred.jsonl")
    assert lost["coverage"] is None
    (warning,) = [w for w in lost["warnings"] if w.startswith("no manifest")]
    assert "--manifest" in warning and "../" in warning
    found = _score(res.out, res.out / "clean_pred.jsonl", res.out / "perturbed_pred.jsonl")
    assert found["coverage"] is not None and not any(w.startswith("no manifest") for w in found["warnings"])
