"""Real-format radiology predictions score end to end with the manifest: the datasets' own rows
plus a prediction, and the files public inference code writes, for ReXVQA, MedThinkVQA and
VinDr-CXR-VQA. Every row pairs and the gap has its true size and sign: the fixtures' answers
are written so the true accuracy (or box IoU) of each side is known."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import pytest

from perturb.configs.suites import parse_suite
from perturb.datasets.native import write_native
from perturb.errors import InputError
from perturb.score import score_runs
from tests.datasets.radiology_fixtures import make_medthinkvqa, make_rexvqa, make_vindr
from tests.generate.conftest import run


@pytest.fixture(autouse=True)
def _offline_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _generate(adapter: str, source: Path, out: Path, ops: list[str], **kw: Any) -> None:
    images = kw.pop("images", None)
    suite = parse_suite(
        {
            "suite": f"{adapter}-formats",
            "seed": 3,
            "input": {"adapter": adapter},
            "jobs": [{"ops": ops, "severities": [3], **kw}],
            "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
        },
        "test",
    )
    summary = run(suite, out, source, images=images)
    assert summary.errors == 0, (out / "errors.jsonl").read_text()


def _delta(result: Any, metric: str, op: str) -> tuple[float, float, float]:
    """(clean, perturbed, perturbed - clean) mean of ``metric`` over the pairs of ``op``."""
    (pairs,) = result.pairs.values()
    of_op = pairs[pairs["perturbation"] == op]
    assert len(of_op), sorted(set(pairs["perturbation"]))
    c = float(np.nanmean(of_op[f"{metric}_clean"].to_numpy(dtype=float)))
    p = float(np.nanmean(of_op[f"{metric}_perturbed"].to_numpy(dtype=float)))
    return c, p, p - c


def _all_paired(result: Any, n_pert: int) -> None:
    (pairing,) = result.scores["pairing"].values()
    assert pairing["perturbed_rows"] == n_pert and pairing["pairs"] == n_pert, pairing
    assert not pairing["dropped"], pairing
    assert pairing["clean_rows_without_perturbed_partner"] == 0, pairing


# ----------------------------------------------------------------------------- ReXVQA

REX_OPTIONS = ["A. Pneumonia", "B. Pleural effusion", "C. Pneumothorax", "D. No acute findings"]


def _rex_clean_answer(letter: str) -> str:
    others = [x for x in "ABCD" if x != letter]
    return (
        f"<think>Option {others[0]} would need consolidation; option {others[1]} a pleural line. "
        f"The answer is not {others[2]}.</think>\nThe answer is {letter}."
    )


def _rex_wrong_answer(letter: str) -> str:
    wrong = "A" if letter != "A" else "C"
    return f"Considering option {letter} first, it does not fit.\nFinal answer: ({wrong})"


@pytest.fixture(scope="module")
def rex(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """10 questions on the fixture's two studies (two on one task of one study: the inner
    question_id of inference results collides), generated under xray_gamma and rotation."""
    root = tmp_path_factory.mktemp("rex")
    fx = make_rexvqa(root)
    base = json.loads(fx.json_file.read_text())
    views = {"A": base["q-a-1"]["ImagePath"], "B": base["q-b-1"]["ImagePath"]}
    gt: dict[str, dict[str, Any]] = {}
    for k in range(10):
        study = "AB"[k % 2]
        gt[f"rex-{k:02d}"] = {
            "study_id": f"GRDN{study}-study",
            "StudyInstanceUid": f"1.2.{11 if study == 'A' else 22}",
            "task_name": "Presence Assessment" if k < 4 else "Differential Diagnosis",
            "category": "Lung",
            "question": f"Question {k} about the chest?",
            "options": REX_OPTIONS,
            "correct_answer": "ABCD"[k % 4],
            "ImagePath": views[study],
            "Findings": "leaks",
            "Impression": "leaks",
        }
    data = root / "ReXVQA" / "metadata" / "test_vqa_data.json"
    data.write_text(json.dumps(gt))
    out = root / "gen"
    _generate("rexvqa", data, out, ["xray_gamma", "rotation"], images=str(fx.images))
    return {"root": root, "gt": gt, "out": out}


def _rex_perturbed_files(rex: dict[str, Any], fmt: str) -> list[Path]:
    """The generated split in ReXVQA's own format (one JSON per op and severity, written by
    write_native) with the model's answers added as inference code adds them; under
    xray_gamma questions 0-3 are answered wrong."""
    files = []
    for native in write_native(rex["out"], "rexvqa", rex["root"] / f"native_{fmt}"):
        op = native.stem.split("_s")[0]
        data = json.loads(native.read_text())
        assert set(data) == set(rex["gt"]) and all("Findings" not in r for r in data.values())
        for qid, row in data.items():
            wrong = op == "xray_gamma" and int(qid[-2:]) < 4
            answer = (_rex_wrong_answer if wrong else _rex_clean_answer)(row["correct_answer"])
            if fmt == "dataset":
                row["prediction"] = answer
            else:  # public inference results: inner question_id = study + task
                data[qid] = {
                    "question_id": f"{row['study_id']}_{row['task_name']}",
                    **row,
                    "model_response": answer,
                }
        p = rex["root"] / f"pert_{fmt}_{native.stem}.json"
        p.write_text(json.dumps(data))
        files.append(p)
    return files


def test_rexvqa_dataset_rows_plus_prediction(rex: dict[str, Any], tmp_path: Path) -> None:
    clean = {
        qid: {**rec, "prediction": _rex_clean_answer(rec["correct_answer"])}
        for qid, rec in rex["gt"].items()
    }
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    pert = _rex_perturbed_files(rex, "dataset")
    result = score_runs(tmp_path / "clean.json", pert, manifest=rex["out"], bootstrap=200)
    _all_paired(result, 20)
    assert _delta(result, "mcq", "xray_gamma") == pytest.approx((1.0, 0.6, -0.4))
    assert _delta(result, "mcq", "rotation") == pytest.approx((1.0, 1.0, 0.0))
    (pairs,) = result.pairs.values()
    assert set(pairs["img_id"]) == {"GRDNA-study", "GRDNB-study"}  # study = bootstrap cluster
    assert result.scores["mcq_unparsed"][next(iter(result.pairs))]["perturbed"] == 0
    # study A's second view is an output of its own: covered through the row's other image
    (covered,) = result.scores["coverage"]["models"].values()
    assert covered["without_predictions"] == 0 and covered["share"] == 1.0, covered
    assert not any("manifest outputs" in w for w in result.scores["warnings"])
    # without --manifest the question ids still pair every row (cut file names do not
    # matter), and the split's manifest is found beside the perturbed images: its op names
    bare = score_runs(tmp_path / "clean.json", pert, bootstrap=0)
    _all_paired(bare, 20)
    assert _delta(bare, "mcq", "xray_gamma") == pytest.approx((1.0, 0.6, -0.4))
    assert any(i["role"] == "manifest" for i in bare.scores["inputs"])


def test_native_files_go_beside_the_split_not_into_it(rex: dict[str, Any]) -> None:
    """write_native's default folder is DIR-native: inside DIR, ``perturb verify`` counted its
    files as extra and failed the split; a folder inside DIR is refused, naming the fix."""
    from perturb.generate.verify import verify
    from perturb.io.datasets import DatasetError

    files = write_native(rex["out"], "rexvqa")
    assert files and all(f.parent == rex["out"].with_name("gen-native") for f in files)
    assert verify(rex["out"]).ok
    with pytest.raises(DatasetError, match="inside the split folder"):
        write_native(rex["out"], "rexvqa", rex["out"] / "native")
    assert not (rex["out"] / "native").exists()


@pytest.mark.slow
def test_rexvqa_inference_results_with_errors_via_cli(rex: dict[str, Any], tmp_path: Path) -> None:
    """Public inference code's results: outer key = question id, inner question_id = study +
    task (shared by rex-04/06/08 ...), answers in model_response, a failed row with error."""
    clean = {
        qid: {
            "question_id": f"{rec['study_id']}_{rec['task_name']}",
            **{k: v for k, v in rec.items() if k != "ImagePath"},
            "model_response": _rex_clean_answer(rec["correct_answer"]),
        }
        for qid, rec in rex["gt"].items()
    }
    clean["rex-99"] = {**clean["rex-00"], "model_response": None, "error": "CUDA out of memory"}
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    pert = _rex_perturbed_files(rex, "results")
    out = tmp_path / "scores"
    cmd = [sys.executable, "-m", "perturb.cli", "score", "--clean", str(tmp_path / "clean.json")]
    for p in pert:
        cmd += ["--perturbed", str(p)]
    cmd += [
        "--manifest",
        str(rex["out"] / "manifest.parquet"),
        "--out",
        str(out),
        "--bootstrap",
        "200",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    scores = json.loads((out / "scores.json").read_text())
    clean_read = next(r for r in scores["reading"] if r["role"] == "clean")
    assert clean_read["dropped"] == {"inference_error": 1}  # counted, with an example
    assert "CUDA out of memory" in clean_read["drop_examples"]["inference_error"][0]
    assert proc.returncode == 1  # a dropped row is a problem to report, not a crash
    (pairing,) = scores["pairing"].values()
    assert pairing["pairs"] == 20 and not pairing["dropped"], pairing
    (model,) = scores["models"].values()
    mcq = model["by_perturbation"]["xray_gamma"]["metrics"]["mcq"]
    assert mcq["clean"]["estimate"] == pytest.approx(1.0)
    assert mcq["perturbed"]["estimate"] == pytest.approx(0.6)
    assert mcq["delta"]["estimate"] == pytest.approx(-0.4)  # the true gap, with its sign


# ----------------------------------------------------------------------------- MedThinkVQA


@pytest.fixture(scope="module")
def med(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fixture's two cases (case10001: CT, X-ray, endoscopy; case10002: MRI, nuclear
    medicine) with each image's own ops: xray_gamma touches only case10001's SECOND image,
    gaussian_blur every non-X-ray image."""
    root = tmp_path_factory.mktemp("med")
    folder = make_medthinkvqa(root)
    out = root / "gen"
    _generate("medthinkvqa", folder, out, ["xray_gamma", "gaussian_blur"], modality="from_image")
    cases = pd.read_parquet(folder / "test.parquet").to_dict("records")
    return {"root": root, "folder": folder, "out": out, "cases": cases}


def _submission(case: dict[str, Any], letter: str) -> dict[str, Any]:
    """The official submission row: every original field plus prediction,
    prediction_rationale and prediction_twi."""
    return {
        **case,
        "prediction": letter,
        "prediction_rationale": "Appendicitis (A) and colitis (C) were considered and rejected.",
        "prediction_twi": f"<think>A? C?</think><answer>{letter}</answer>",
    }


MED_CLEAN = {"case10001": "B", "case10002": "D"}  # case10002 is wrong on the clean images
MED_PERT = {  # (op, case) -> answer
    ("xray_gamma", "case10001"): "B",
    ("gaussian_blur", "case10001"): "A",
    ("gaussian_blur", "case10002"): "D",
}


def test_medthinkvqa_official_submission(med: dict[str, Any], tmp_path: Path) -> None:
    def case_of(c: dict[str, Any]) -> str:
        return "case" + c["title"].split()[-1]

    clean = [_submission(c, MED_CLEAN[case_of(c)]) for c in med["cases"]]
    # perturbed submissions: the case's rows with the generated images in their slots (the
    # images an op did not touch keep their clean path)
    made = defaultdict(dict)
    for row in datasets.load_from_disk(str(med["out"] / "dataset")):
        made[(row["op"], row["case_id"])][row["image_id"]] = str(med["out"] / row["path"])
    pert = []
    for c in med["cases"]:
        for op in ("xray_gamma", "gaussian_blur"):
            outputs = made.get((op, case_of(c)))
            if not outputs:
                continue  # the op touched none of the case's images
            row = dict(c)
            for n in range(1, 50):
                image_id = row.get(f"image_{n:02d}_id")
                if image_id in outputs:
                    row[f"image_{n:02d}_path"] = outputs[image_id]
            pert.append(_submission(row, MED_PERT[(op, case_of(c))]))
    assert len(pert) == 3
    first_untouched = [p for p in pert if not str(p["image_01_path"]).startswith(str(med["out"]))]
    assert len(first_untouched) == 1  # xray_gamma on case10001: only its 2nd image changed
    c_path, p_path = tmp_path / "clean.jsonl", tmp_path / "pert.jsonl"
    pd.DataFrame(clean).to_json(c_path, orient="records", lines=True)
    pd.DataFrame(pert).to_json(p_path, orient="records", lines=True)
    result = score_runs(c_path, p_path, manifest=med["out"], bootstrap=200)
    _all_paired(result, 3)
    assert _delta(result, "mcq", "xray_gamma") == pytest.approx((1.0, 1.0, 0.0))
    assert _delta(result, "mcq", "gaussian_blur") == pytest.approx((0.5, 0.0, -0.5))
    (pairs,) = result.pairs.values()
    assert set(pairs["img_id"]) == {"case10001", "case10002"}  # one case = one cluster


def test_medthinkvqa_native_export(med: dict[str, Any], tmp_path: Path) -> None:
    """write_native gives the cases in MedThinkVQA's own rows (generated images in the slots
    the op changed, no leaking fields); with predictions added they score like the
    hand-made submission."""
    clean = [_submission(c, MED_CLEAN["case" + c["title"].split()[-1]]) for c in med["cases"]]
    c_path = tmp_path / "clean.jsonl"
    pd.DataFrame(clean).to_json(c_path, orient="records", lines=True)
    pert = []
    for native in write_native(
        med["out"], "medthinkvqa", tmp_path / "native", source=med["folder"]
    ):
        op = native.stem.split("_s")[0]
        rows = [json.loads(line) for line in native.read_text().splitlines()]
        assert all(not any("icd" in k.lower() or "caption" in k for k in r) for r in rows)
        with native.open("w") as fh:
            for r in rows:
                case = "case" + r["title"].split()[-1]
                fh.write(json.dumps(_submission(r, MED_PERT[(op, case)])) + "\n")
        pert.append(native)
    result = score_runs(c_path, pert, manifest=med["out"], bootstrap=0)
    _all_paired(result, 3)
    assert _delta(result, "mcq", "gaussian_blur") == pytest.approx((0.5, 0.0, -0.5))
    assert _delta(result, "mcq", "xray_gamma") == pytest.approx((1.0, 1.0, 0.0))


def test_medthinkvqa_hub_folder_with_both_files(med: dict[str, Any], tmp_path: Path) -> None:
    """The hub's folder holds test.parquet and test.jsonl: one is read, the label says which."""
    from perturb.datasets.medthinkvqa.adapter import open_medthinkvqa

    folder = med["folder"]
    pd.read_parquet(folder / "test.parquet").to_json(
        folder / "test.jsonl", orient="records", lines=True
    )
    try:
        inp = open_medthinkvqa(folder)
        assert len(inp) == 5  # each image once, not twice
        assert "test.parquet" in inp.source and "test.jsonl not read" in inp.source
    finally:
        (folder / "test.jsonl").unlink()


# ----------------------------------------------------------------------------- VinDr-CXR-VQA


@pytest.fixture(scope="module")
def vindr(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fixture's two test images (one a half-size PNG with its DICOM size in the JSON),
    generated under rotation (moves the boxes) and xray_gamma (leaves them)."""
    root = tmp_path_factory.mktemp("vindr")
    fx = make_vindr(root)
    out = root / "gen"
    _generate(
        "vindr-cxr-vqa", fx.data / "test", out, ["rotation", "xray_gamma"], images=str(fx.images)
    )
    objects = [json.loads(p.read_text()) for p in sorted((fx.data / "test").glob("*.json"))]
    return {"root": root, "fx": fx, "out": out, "objects": objects}


def _shifted(answer: str) -> str:
    """The answer with its box moved right by half its width (IoU 1/3 with the original)."""
    from perturb.contracts.boxes import parse_loc_tags

    (x1, y1, x2, y2), *_ = parse_loc_tags(answer)
    w = (x2 - x1) / 2
    return f"Right mid lung <loc_{x1 + w:g}_{y1:g}_{x2 + w:g}_{y2:g}>."


def _vindr_prediction(item: dict[str, Any], op: str | None, image_id: str) -> str:
    if op == "xray_gamma" and image_id == "a1b2c3d4e5" and item["type"] == "Where":
        return _shifted(item["answer"])
    # the (moved, for rotation) reference itself, with its box where the text has none
    return (
        item["answer"] if "<loc_" in item["answer"] else f"{item['answer']} {item['gt_location']}"
    )


def test_vindr_nested_files_and_moved_boxes(vindr: dict[str, Any], tmp_path: Path) -> None:
    clean = [
        {
            **{k: v for k, v in obj.items() if k != "items"},
            "vqa": [
                {**it, "prediction": _vindr_prediction(it, None, obj["image_id"])}
                for it in obj["items"]
            ],
        }
        for obj in vindr["objects"]
    ]
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    # perturbed: the split in VinDr's own format (write_native: one file per op, an image
    # object per output with its path, items as generate wrote them: rotation moved the
    # answer's and gt_location's boxes) with a prediction per item
    pert = []
    for native in write_native(vindr["out"], "vindr-cxr-vqa", tmp_path / "native"):
        op = native.stem.split("_s")[0]
        objects = json.loads(native.read_text())
        for obj in objects:
            for item in obj["vqa"]:
                item["prediction"] = _vindr_prediction(item, op, obj["image_id"])
            moved = next(o for o in vindr["objects"] if o["image_id"] == obj["image_id"])
            if op == "rotation":
                assert obj["vqa"][0]["gt_location"] != moved["items"][0]["gt_location"]
        native.write_text(json.dumps(objects))
        pert.append(native)
    result = score_runs(tmp_path / "clean.json", pert, manifest=vindr["out"], bootstrap=200)
    _all_paired(result, 12)  # 2 images x 3 items x 2 ops
    # a model that answers the moved boxes exactly loses nothing under rotation
    assert _delta(result, "box_iou", "rotation") == pytest.approx((1.0, 1.0, 0.0))
    # one of the six items (a1b2c3d4e5's "where") answered with IoU 1/3
    assert _delta(result, "box_iou", "xray_gamma") == pytest.approx((1.0, 8 / 9, -1 / 9))
    (pairs,) = result.pairs.values()
    assert set(pairs["img_id"]) == {"a1b2c3d4e5", "f6e5d4c3b2"}


def test_vindr_generated_rows_and_unmoved_reference(vindr: dict[str, Any], tmp_path: Path) -> None:
    """Generate's own flat rows (DIR/dataset + prediction) pair by image id and item index; a
    perturbed file without the moved reference is never scored against the unmoved boxes."""
    clean = [
        {
            **it,
            "image_id": obj["image_id"],
            "qa_idx": i,
            "prediction": _vindr_prediction(it, None, ""),
        }
        for obj in vindr["objects"]
        for i, it in enumerate(obj["items"])
    ]
    ds = datasets.load_from_disk(str(vindr["out"] / "dataset"))  # QA rows with paths, no images
    flat = [{**r, "prediction": _vindr_prediction(r, None, "")} for r in ds]
    c, p = tmp_path / "clean.jsonl", tmp_path / "pert.jsonl"
    pd.DataFrame(clean).to_json(c, orient="records", lines=True)
    pd.DataFrame(flat).to_json(p, orient="records", lines=True)
    result = score_runs(c, p, manifest=vindr["out"], bootstrap=0)
    _all_paired(result, 12)
    assert _delta(result, "box_iou", "rotation") == pytest.approx((1.0, 1.0, 0.0))
    # without the manifest the rows' own op column says which op moved the boxes ...
    bare_result = score_runs(c, p, bootstrap=0)
    _all_paired(bare_result, 12)
    assert _delta(bare_result, "box_iou", "rotation") == pytest.approx((1.0, 1.0, 0.0))
    # ... and with no op known the differing (moved) references are an error naming the fix
    rot = [
        {k: v for k, v in r.items() if k not in ("op", "severity", "path")}
        for r in flat
        if r["op"] == "rotation"
    ]
    pd.DataFrame(rot).to_json(p, orient="records", lines=True)
    with pytest.raises(InputError, match="--manifest"):
        score_runs(c, p, bootstrap=0)
    # predictions only (no answer / gt_location): rotation's grounded items are dropped, named
    bare = [{k: r[k] for k in ("img_id", "qa_idx", "question", "path", "prediction")} for r in flat]
    pd.DataFrame(bare).to_json(p, orient="records", lines=True)
    result = score_runs(c, p, manifest=vindr["out"], bootstrap=0)
    (pairing,) = result.scores["pairing"].values()
    assert pairing["dropped"] == {"geometric_without_moved_reference": 6}, pairing
    assert pairing["pairs"] == 6  # xray_gamma's items keep the clean (unmoved) reference
    assert _delta(result, "box_iou", "xray_gamma") == pytest.approx((1.0, 1.0, 0.0))


def test_vindr_boxes_outside_the_image_name_the_fix(tmp_path: Path) -> None:
    """Boxes in DICOM pixels on a resized PNG without the original size: an error, not a clamp."""
    from perturb.datasets.vindr_cxr_vqa.adapter import open_vindr
    from perturb.io.datasets import DatasetError

    fx = make_vindr(tmp_path)
    path = fx.data / "test" / "f6e5d4c3b2.json"
    obj = json.loads(path.read_text())
    del obj["width"], obj["height"]
    path.write_text(json.dumps(obj))
    with pytest.raises(DatasetError, match="'width' and 'height'"):
        open_vindr(fx.data / "test", images=fx.images)
