"""Clean and perturbed radiology predictions pair in ``perturb score`` when made the way a user
makes them: ms-swift rows (``images`` paths, question, response, labels, no study or case id)
for the clean split with the dataset's own image paths, and for the perturbed split from the
generated ``dataset/`` rows (their output image paths, one prompt per question, op, severity).
ReXVQA rows cluster by study, MedThinkVQA rows by case, VinDr-CXR-VQA rows by image id."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest

from perturb.configs.suites import parse_suite
from perturb.score import score_runs
from perturb.score.inputs import read_predictions
from tests.datasets.radiology_fixtures import (
    MED_MODALITIES,
    make_medthinkvqa,
    make_rexvqa,
    make_vindr,
    write_png,
)
from tests.generate.conftest import run


@pytest.fixture(autouse=True)
def _offline_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _swift(images: list[str], question: str, answer: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "<image>" * len(images) + question},
            {"role": "assistant", "content": answer},
        ],
        "images": [{"path": p} for p in images],
        "response": answer,
        "labels": answer,
    }


def _generate(
    adapter: str, source: Path, out: Path, ops: list[str], images: str | None = None, **kw: Any
) -> None:
    suite = parse_suite(
        {
            "suite": f"{adapter}-pairing",
            "seed": 1,
            "input": {"adapter": adapter},
            "jobs": [{"ops": ops, "severities": [2], **kw}],
            "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
        },
        "test",
    )
    summary = run(suite, out, source, images=images)
    assert summary.errors == 0, (out / "errors.jsonl").read_text()


def _perturbed_prompts(out: Path, group: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Generated dataset rows grouped into one prompt per (question, op, severity, variant),
    views in order, image paths under the output folder as the dataset gives them."""
    ds = datasets.load_from_disk(str(out / "dataset"))
    prompts: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in ds:
        prompts[(row[group], row["op"], row["severity"], row["variant"])].append(row)
    return prompts


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _assert_paired(
    clean: Path, pert: Path, out: Path, n_clean: int, n_pert: int, samples: set[str]
) -> None:
    result = score_runs(clean, pert, manifest=out / "manifest.parquet", bootstrap=0)
    (pairing,) = result.scores["pairing"].values()
    assert pairing["clean_rows"] == n_clean and pairing["perturbed_rows"] == n_pert
    assert pairing["pairs"] == n_pert and pairing["clean_rows_without_perturbed_partner"] == 0, (
        pairing
    )
    assert not pairing["dropped"] and result.exit_code == 0, (pairing, result.problems)
    (pairs,) = result.pairs.values()
    assert set(pairs["img_id"]) == samples  # the bootstrap clusters: studies / cases


def test_rexvqa_studies_pair_and_cluster(tmp_path: Path) -> None:
    fx = make_rexvqa(tmp_path)
    out = tmp_path / "gen"
    _generate("rexvqa", fx.json_file, out, ["xray_gamma", "rotation"], str(fx.images))
    gt = json.loads(fx.json_file.read_text())
    clean = [
        _swift(
            [str(fx.images / p.removeprefix("../")) for p in rec["ImagePath"]],
            rec["question"],
            rec["correct_answer"],
        )
        for rec in gt.values()
    ]
    pert = []
    for (qid, *_), rows in _perturbed_prompts(out, "question_id").items():
        rows.sort(key=lambda r: r["view"])
        pert.append(
            _swift(
                [str(out / r["path"]) for r in rows], gt[qid]["question"], gt[qid]["correct_answer"]
            )
        )
    assert len(pert) == 3 * 2
    c, p = _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)
    # one sample per study: both questions on study A (two views, one view) share it
    for path in (c, p):
        df, _ = read_predictions(path)
        by_q = dict(zip(df["qkey"], df["img_id"], strict=True))
        assert by_q["What is the most likely diagnosis?"] == by_q["Is there a pleural effusion?"]
        assert by_q["Is the heart enlarged?"] != by_q["Is there a pleural effusion?"]
        assert df["img_id"].nunique() == 2
    _assert_paired(c, p, out, 3, 6, {"studies/1.2.11", "studies/1.2.22"})


def test_medthinkvqa_cases_pair_and_cluster(tmp_path: Path) -> None:
    folder = make_medthinkvqa(tmp_path)
    out = tmp_path / "gen"
    _generate("medthinkvqa", folder, out, ["gaussian_blur"], modality="any")
    question = "What is the most likely diagnosis?"
    clean = [
        _swift([str(folder / "images" / case / f"{i}.jpg") for i, _, _ in imgs], question, "B")
        for case, imgs in MED_MODALITIES.items()
    ]
    pert = []
    for _, rows in _perturbed_prompts(out, "case_id").items():
        rows.sort(key=lambda r: r["view"])
        pert.append(_swift([str(out / r["path"]) for r in rows], question, "B"))
    assert len(pert) == 2
    c, p = _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)
    for path in (c, p):
        df, _ = read_predictions(path)
        assert sorted(df["img_id"]) == ["case10001", "case10002"]
    _assert_paired(c, p, out, 2, 2, {"case10001", "case10002"})


def test_vindr_images_pair(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    out = tmp_path / "gen"
    _generate("vindr-cxr-vqa", fx.data, out, ["xray_gamma"], str(fx.images))
    ds = datasets.load_from_disk(str(out / "dataset"))
    clean = [
        _swift([str(fx.images / f"{r['img_id']}.png")], r["question"], r["answer"]) for r in ds
    ]
    pert = [_swift([str(out / r["path"])], r["question"], r["answer"]) for r in ds]
    c, p = _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)
    _assert_paired(c, p, out, 6, 6, {"a1b2c3d4e5", "f6e5d4c3b2"})


def test_rexvqa_long_uids_pair_through_the_manifest(tmp_path: Path) -> None:
    """Real study / series / instance uids make img_ids longer than a file name may be: the
    generated name is cut and hashed, and the study comes from the manifest's img_id."""
    uid = "1.2.826.0.1.3680043.8.498." + "1" * 38
    rels = [
        f"../deid_png/GRDN0123abcd/GRDN0123abcd_0001/studies/{uid}/series/{uid}9/instances/{uid}{n}.png"
        for n in (1, 2)
    ]
    images = tmp_path / "png"
    for n, rel in enumerate(rels):
        write_png(images / rel.removeprefix("../"), np.full((40, 48), 90 + 60 * n, np.uint8))
    gt = {
        "q1": {
            "question": "Is there an effusion?",
            "options": ["A. Yes", "B. No"],
            "correct_answer": "B",
            "ImagePath": rels,
        },
        "q2": {
            "question": "Is the heart enlarged?",
            "options": ["A. Yes", "B. No"],
            "correct_answer": "A",
            "ImagePath": rels[1:],
        },
    }
    (tmp_path / "test_vqa_data.json").write_text(json.dumps(gt))
    out = tmp_path / "gen"
    _generate("rexvqa", tmp_path / "test_vqa_data.json", out, ["xray_gamma"], str(images))
    clean = [
        _swift(
            [str(images / p.removeprefix("../")) for p in rec["ImagePath"]], rec["question"], "A"
        )
        for rec in gt.values()
    ]
    pert = []
    for (qid, *_), rows in _perturbed_prompts(out, "question_id").items():
        rows.sort(key=lambda r: r["view"])
        assert all("~" in r["path"] for r in rows)  # cut names: the path alone loses the study
        pert.append(_swift([str(out / r["path"]) for r in rows], gt[qid]["question"], "A"))
    c, p = _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)
    _assert_paired(c, p, out, 2, 2, {f"studies/{uid}"})
    # the manifest keeps the full ids the cut file names lost: image (record.sample_key) and
    # study (record.extra.param_key)
    records = [json.loads(r) for r in pq.read_table(out / "manifest.parquet")["record"].to_pylist()]
    assert {r["sample_key"] for r in records} == {
        str(Path(rel.removeprefix("../")).with_suffix("")) for rel in rels
    }
    assert {r["extra"]["param_key"] for r in records} == {
        f"deid_png/GRDN0123abcd/GRDN0123abcd_0001/studies/{uid}"
    }


def test_own_multi_image_samples_pair_by_their_file_stems(tmp_path: Path) -> None:
    """A user's own multi-view dataset (a folder per patient, no adapter, no id column): the
    clean prompts name the dataset's paths, the perturbed ones the outputs in the layout's
    folders; both key each sample by its views' file stems, so every prompt pairs."""
    data = tmp_path / "data"
    rng = np.random.default_rng(3)
    views = {"p1": ["p1_frontal", "p1_lateral"], "p2": ["p2_frontal"]}
    for patient, names in views.items():
        for name in names:
            write_png(data / patient / f"{name}.png", (rng.random((64, 48)) * 60000).astype(np.uint16))
    out = tmp_path / "gen"
    suite = parse_suite(
        {
            "suite": "own-views",
            "seed": 1,
            "jobs": [{"ops": ["xray_gamma"], "severities": [2]}],
            "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
        },
        "test",
    )
    summary = run(suite, out, data)
    assert summary.errors == 0, (out / "errors.jsonl").read_text()
    made = {r["img_id"]: r["path"] for r in pq.read_table(out / "manifest.parquet").to_pylist()}
    question = "Is there a pleural effusion?"
    clean = [_swift([str(data / p / f"{n}.png") for n in names], question, "no") for p, names in views.items()]
    pert = [_swift([str(out / made[n]) for n in names], question, "no") for names in views.values()]
    c, p = _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)
    _assert_paired(c, p, out, 2, 2, {"p1_frontal|p1_lateral", "p2_frontal"})


def test_samples_sharing_file_stems_ask_for_an_id_column(tmp_path: Path) -> None:
    """Two patients whose views share file names give one derived id: the scorer stops and
    says to add an img_id column instead of merging their rows."""
    rows = [
        _swift([f"/d/{p}/frontal.png", f"/d/{p}/lateral.png"], "Is there a pleural effusion?", "no")
        for p in ("p1", "p2")
    ]
    c = _write(tmp_path / "clean.jsonl", rows)
    with pytest.raises(Exception, match="add an 'img_id' column"):
        score_runs(c, c, bootstrap=0)
