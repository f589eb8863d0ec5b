"""Reading and scoring the radiology prediction formats: ReXVQA (question-id-keyed JSON, several
images per study), MedThinkVQA (image slots, one case = one sample), VinDr-CXR-VQA (answers
with loc tags, gt_location boxes), through ``score_runs`` and ``perturb score``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from perturb.cli import app
from perturb.score import score_runs
from perturb.score.cells import boxes_of, sample_id_of_paths
from perturb.score.inputs import read_predictions

LETTERS = "ABCD"


def rexvqa(n_studies: int = 6, per_study: int = 2) -> dict[str, dict[str, Any]]:
    """Ground truth in ReXVQA's schema: {question_id: {...}}, two views per study."""
    out = {}
    for s in range(n_studies):
        for q in range(per_study):
            qid = f"{s:03d}{q}a7"
            out[qid] = {
                "study_id": f"study{s}",
                "PatientID": f"p{s}",
                "question": "Where is the pleural effusion?"
                if q == 0
                else "Is there a pneumothorax?",
                "options": ["A. Left", "B. Right", "C. Bilateral", "D. None"]
                if q == 0
                else ["A. Yes", "B. No", "C. Cannot tell", "D. Both"],
                "correct_answer": LETTERS[(s + q) % 4],
                "task_name": "Location Assessment" if q == 0 else "Presence Assessment",
                "category": "Pleura",
                "ImagePath": [f"../deid_png/p{s}/st{s}/pa.png", f"../deid_png/p{s}/st{s}/lat.png"],
                "ImageViewPosition": ["PA", "LATERAL"],
            }
    return out


def test_rexvqa_keyed_json(tmp_path: Path) -> None:
    gt = rexvqa()
    (tmp_path / "clean.json").write_text(
        json.dumps(
            {k: {**v, "model_answer": f"Answer: {v['correct_answer']}"} for k, v in gt.items()}
        )
    )
    df, rep = read_predictions(tmp_path / "clean.json")
    assert rep.format == "json:keyed" and len(df) == len(gt)
    first = df.iloc[0]
    assert first["img_id"] == "study0"  # the study, not an image, is the sample
    assert first["qkey"] == "id:0000a7"
    assert first["options"] == {"A": "Left", "B": "Right", "C": "Bilateral", "D": "None"}
    # task_name "Location Assessment" + "where" -> location; options Left/Right -> laterality
    assert first["question_class"] == ("laterality", "location")
    assert df.iloc[1]["question_class"] == ("small_finding", "presence")  # pneumothorax
    assert first["image_path"] == "../deid_png/p0/st0/pa.png"


def test_rexvqa_scoring_counts_unparseable_answers(tmp_path: Path) -> None:
    gt = rexvqa()
    keys = sorted(gt)
    clean = {k: {**gt[k], "model_answer": gt[k]["correct_answer"]} for k in keys}
    bad = set(keys[:3])
    pert = {
        k: {
            **gt[k],
            "model_answer": "I am not sure" if k in bad else f"({gt[k]['correct_answer']})",
            "perturbation": "xray_jpeg",
            "severity": 2,
        }
        for k in keys
    }
    (tmp_path / "c.json").write_text(json.dumps(clean))
    (tmp_path / "p.json").write_text(json.dumps(pert))
    res = score_runs(tmp_path / "c.json", tmp_path / "p.json", bootstrap=100)
    s = res.scores
    assert s["config"]["primary"] == "mcq"
    overall = s["models"]["model"]["overall"]["metrics"]["mcq"]
    assert overall["clean"]["estimate"] == 1.0
    assert overall["perturbed"]["estimate"] == pytest.approx(1 - len(bad) / len(keys))
    u = s["mcq_unparsed"]["model"]
    assert (u["clean"], u["perturbed"], u["perturbed_by_perturbation"]) == (0, 3, {"xray_jpeg": 3})
    assert any("no recognisable option letter" in n for n in s["notes"])
    # the bootstrap clusters are studies: 6 of them
    assert res.pairs["model"]["img_id"].nunique() == 6


def medthink_row(case: int, n_images: int, answer: str, pred: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "title": f"Case number {case}",
        "CLINICAL_HISTORY": "A 39-year-old presented with ...",
        "options": {
            "A": "Sarcoidosis",
            "B": "Anti-synthetase syndrome",
            "C": "Lymphoma",
            "D": "TB",
            "E": "Silicosis",
        },
        "correct_answer": answer,
        "image_count": n_images,
        "prediction": pred,
    }
    for i in range(1, 50):
        slot = f"image_{i:02d}"
        has = i <= n_images
        row[f"{slot}_id"] = f"im{case}x{i}" if has else None
        row[f"{slot}_path"] = f"images/case{case}/im{case}x{i}.jpg" if has else None
        row[f"{slot}_modality"] = ["CT", "X-ray", "MRI"][i % 3] if has else None
    return row


def test_medthinkvqa_case_is_the_sample(tmp_path: Path) -> None:
    rows = [medthink_row(19254, 4, "B", "The most likely diagnosis is anti-synthetase syndrome.")]
    rows.append(medthink_row(20001, 1, "C", "E"))
    path = tmp_path / "mt.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df, rep = read_predictions(path)
    assert rep.format == "jsonl:medthinkvqa"
    assert df["img_id"].tolist() == ["case19254", "case20001"]
    assert df["qkey"].tolist() == ["id:case19254", "id:case20001"]
    assert df["question_class"].tolist() == [("diagnosis",), ("diagnosis",)]
    assert df["image_path"].iloc[0] == "images/case19254/im19254x1.jpg"
    res = score_runs(path, path, bootstrap=0)  # same file: no change
    pairs = res.pairs["model"]
    assert pairs["mcq_clean"].tolist() == [1.0, 0.0]


def test_vindr_boxes_and_grounding(tmp_path: Path) -> None:
    clean, pert = [], []
    for i in range(8):
        ans = f"Yes, a nodule in the right upper lung <loc_{100 + i}_200_300_400>."
        base = {
            "image_id": f"vindr{i}",
            "question": "Where is the nodule?",
            "answer": ans,
            "type": "Where",
            "gt_location": {"x_min": 100 + i, "y_min": 200, "x_max": 300, "y_max": 400},
        }
        clean.append({**base, "prediction": ans})
        # perturbed: half the box width, text unchanged apart from the tag
        pert.append(
            {
                **base,
                "prediction": f"Yes, a nodule in the right upper lung <loc_{100 + i}_200_{200 + i // 2}_400>.",
                "perturbation": "xray_quantum_noise",
                "severity": 3 if i < 4 else 5,
            }
        )
    res = score_runs(clean, pert, bootstrap=100)
    pairs = res.pairs["model"]
    assert pairs["answer_f1_clean"].tolist() == [1.0] * 8
    assert pairs["answer_f1_perturbed"].tolist() == [1.0] * 8  # loc tags do not count as words
    assert pairs["box_hit50_clean"].tolist() == [1.0] * 8
    i = np.arange(8)
    # predicted x range [100 + i, 200 + i // 2] inside the reference [100 + i, 300], same height
    expected = (100 + i // 2 - i) / (200 - i)
    np.testing.assert_allclose(pairs["box_miou_perturbed"].to_numpy(float), expected)
    np.testing.assert_allclose(pairs["box_iou_perturbed"].to_numpy(float), expected)
    assert pairs["box_hit50_perturbed"].tolist() == [1.0 if e >= 0.5 else 0.0 for e in expected]
    assert set(pairs["question_class"]) == {("location", "small_finding")}
    # dose reduction puts small findings at risk only at severities 4-5
    assert pairs["at_risk"].tolist() == [False] * 4 + [True] * 4
    assert res.scores["counts"]["at_risk_pairs"] == 4


def test_boxes_of_formats() -> None:
    assert boxes_of([1, 2, 3, 4]) == [(1, 2, 3, 4)]
    assert boxes_of("[[3, 4, 1, 2], [0, 0, 1, 1]]") == [(1, 2, 3, 4), (0, 0, 1, 1)]
    assert boxes_of({"x1": 1, "y1": 2, "x2": 3, "y2": 4}) == [(1, 2, 3, 4)]
    assert boxes_of("<loc_1_2_3_4>") == [(1, 2, 3, 4)]
    assert boxes_of(None) is None and boxes_of([]) is None and boxes_of("") is None
    with pytest.raises(ValueError, match="4 numbers"):
        boxes_of([1, 2, 3])
    with pytest.raises(ValueError, match="keys"):
        boxes_of({"left": 1})


def test_sample_id_of_paths() -> None:
    assert sample_id_of_paths("a/b/img7.png") == "img7"
    assert sample_id_of_paths(["s/1/y.png", "s/1/x.png"]) == "x|y"
    assert sample_id_of_paths(["x.png", "y.png"]) == "x|y"
    assert sample_id_of_paths([]) is None
    # a generated output names the clean image's sample: decoded file name, study, case
    assert sample_id_of_paths("out/jpeg/s2/a%2Fb%2Fimg7.png") == "img7"
    study = "../png/P1/studies/1.2.3/series/4/instances/5.6.png"
    made = "/o/rotation/s1/png%2FP1%2Fstudies%2F1.2.3%2Fseries%2F4%2Finstances%2F5.6.png"
    assert sample_id_of_paths(study) == sample_id_of_paths([made]) == "studies/1.2.3"
    assert sample_id_of_paths(["i/case7/a.jpg", "i/case7/b.jpg"]) == "case7"
    assert sample_id_of_paths(["o/blur/s3/case7_a.png", "o/blur/s3/case7_b.png"]) == "case7"
    assert sample_id_of_paths(["o/case7_a.png", "o/case8_b.png"]) == "case7_a|case8_b"
    # any other multi-image sample: the same id from the dataset's folders and from the outputs
    # in the layout's folders, named by stem or (--id-from path) by their encoded path
    clean = ["data/p1/p1_frontal.png", "data/p1/p1_lateral.png"]
    made = ["gen/xray_gamma/s2/p1_lateral.png", "gen/xray_gamma/s2/p1_frontal.png"]
    by_path = ["gen/xray_gamma/s2/p1%2Fp1_frontal.png", "gen/xray_gamma/s2/p1%2Fp1_lateral.png"]
    ids = {sample_id_of_paths(clean), sample_id_of_paths(made), sample_id_of_paths(by_path)}
    assert ids == {"p1_frontal|p1_lateral"}


def test_cli_scores_rexvqa_files(tmp_path: Path) -> None:
    gt = rexvqa(4, 2)
    clean = {k: {**v, "model_answer": v["correct_answer"]} for k, v in gt.items()}
    pert = {
        k: {
            **v,
            "model_answer": f"{v['correct_answer']}. text",
            "perturbation": "xray_gamma",
            "severity": 3,
        }
        for k, v in gt.items()
    }
    (tmp_path / "c.json").write_text(json.dumps(clean))
    (tmp_path / "p.json").write_text(json.dumps(pert))
    r = CliRunner().invoke(
        app,
        [
            "score",
            "--clean",
            str(tmp_path / "c.json"),
            "--perturbed",
            str(tmp_path / "p.json"),
            "--out",
            str(tmp_path / "out"),
            "--bootstrap",
            "50",
        ],
    )
    assert r.exit_code == 0, r.output
    scores = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert scores["config"]["primary"] == "mcq"
    assert scores["models"]["model"]["overall"]["metrics"]["mcq"]["perturbed"]["estimate"] == 1.0
    assert (tmp_path / "out" / "report.md").is_file()
