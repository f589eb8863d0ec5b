"""Reading and pairing keys of radiology prediction files, without generating images: the
outer ReXVQA key is the question, an inner question_id (study + task) never replaces it; study
fields are the cluster, not an image id; a question id repeated across images is a template
and pairs together with the image; VinDr items pair by image id and item index."""

from __future__ import annotations

import json
from pathlib import Path

from perturb.score import score_runs
from perturb.score.inputs import read_predictions

OPTS = ["A. Yes", "B. No"]


def _rex(path: Path, answers: dict[str, str], **extra: object) -> Path:
    rows = {
        key: {
            "question_id": "GRDN1_Presence Assessment",  # the inference code's inner id
            "study_id": "GRDN1",
            "StudyInstanceUid": "1.2.3",
            "question": f"Is there finding {key}?",
            "options": OPTS,
            "correct_answer": "A",
            "task_name": "Presence Assessment",
            "model_response": answer,
            **extra,
        }
        for key, answer in answers.items()
    }
    path.write_text(json.dumps(rows))
    return path


def test_outer_key_is_the_question_and_study_the_cluster(tmp_path: Path) -> None:
    df, rep = read_predictions(_rex(tmp_path / "r.json", {"q1": "A", "q2": "B"}))
    assert df["qid"].tolist() == ["q1", "q2"]  # the shared inner id would collide
    assert set(df["img_id"]) == {"GRDN1"}  # study_id: the cluster
    assert df["_id_from_path"].all()  # a sample, never compared with manifest image ids
    assert rep.format == "json:keyed"


def test_errors_are_counted_and_final_answer_read(tmp_path: Path) -> None:
    rows = {
        "q1": {"question": "Q1?", "options": OPTS, "correct_answer": "A", "final_answer": "A"},
        "q2": {"question": "Q2?", "options": OPTS, "correct_answer": "A", "error": "timeout"},
    }
    (tmp_path / "r.json").write_text(json.dumps(rows))
    df, rep = read_predictions(tmp_path / "r.json")
    assert df["prediction"].tolist() == ["A"]
    assert rep.dropped == {"inference_error": 1}
    assert "timeout" in rep.drop_examples["inference_error"][0]


def test_rexvqa_pairs_by_question_id_and_keeps_the_sign(tmp_path: Path) -> None:
    keys = [f"q{i}" for i in range(10)]
    clean = _rex(tmp_path / "clean.json", dict.fromkeys(keys, "<think>B? no.</think>Answer: A"))
    pert = _rex(
        tmp_path / "gamma.json",
        {k: ("Option A was considered.\nAnswer: B" if i < 4 else "A") for i, k in enumerate(keys)},
        perturbation="xray_gamma",
        severity=3,
    )
    result = score_runs(clean, pert, bootstrap=0)
    (pairs,) = result.pairs.values()
    assert len(pairs) == 10
    assert pairs["mcq_clean"].mean() == 1.0 and pairs["mcq_perturbed"].mean() == 0.6


def test_repeated_question_ids_are_templates(tmp_path: Path) -> None:
    """A qid shared by several images (a question template) pairs with the image id."""
    rows = [
        {
            "img_id": img,
            "qid": "t1",
            "question": "Is there a polyp?",
            "answer": "yes",
            "prediction": p,
        }
        for img, p in (("a", "yes"), ("b", "no"))
    ]
    pert = [{**r, "perturbation": "blur", "severity": 2, "prediction": "yes"} for r in rows]
    result = score_runs(rows, pert, bootstrap=0)
    (pairs,) = result.pairs.values()
    assert sorted(pairs["img_id"]) == ["a", "b"]


def test_vindr_nested_object_reads_one_row_per_item(tmp_path: Path) -> None:
    obj = {
        "image_id": "img1",
        "num_questions": 2,
        "vqa": [
            {
                "question": "Where?",
                "answer": "Here <loc_1_2_30_40>",
                "gt_location": "<loc_1_2_30_40>",
                "type": "Where",
                "prediction": "Here <loc_1_2_30_40>",
            },
            {
                "question": "Where?",
                "answer": "There <loc_5_5_9_9>",
                "gt_location": "<loc_5_5_9_9>",
                "type": "Where",
                "prediction": "none",
            },
        ],
    }
    (tmp_path / "v.json").write_text(json.dumps(obj))
    df, rep = read_predictions(tmp_path / "v.json")
    # the same question text twice on one image: the item index tells them apart
    assert df["qid"].tolist() == ["img1#0", "img1#1"]
    assert df["ref_boxes"].tolist() == [[(1.0, 2.0, 30.0, 40.0)], [(5.0, 5.0, 9.0, 9.0)]]
    assert "vindr-nested" in rep.format


def test_unparsed_answers_are_counted_and_shown() -> None:
    rows = [
        {
            "img_id": "s1",
            "question_id": f"q{i}",
            "question": "Q?",
            "options": ["A. Yes", "B. No"],
            "correct_answer": "A",
            "prediction": "A",
        }
        for i in range(3)
    ]
    pert = [
        {**r, "perturbation": "blur", "severity": 1, "prediction": "I cannot tell."} for r in rows
    ]
    result = score_runs(rows, pert, bootstrap=0)
    unparsed = result.scores["mcq_unparsed"]["model"]
    assert (unparsed["clean"], unparsed["perturbed"]) == (0, 3)
    assert unparsed["examples"][0]["prediction"] == "I cannot tell."
    assert any("'I cannot tell.'" in n for n in result.scores["notes"])  # shown in the report
