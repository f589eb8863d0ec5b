"""Readers: every input format becomes the same canonical table; bad input gives clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perturb.errors import InputError
from perturb.score.inputs import read_predictions

ROWS = [
    {
        "img_id": "a1",
        "question": "How many polyps are in the image?",
        "answer": "2",
        "prediction": "two",
        "complexity": 1,
        "question_class": ["polyp_count"],
    },
    {
        "img_id": "a1",
        "question": "What color is the abnormality?",
        "answer": "pink; red",
        "prediction": "red",
        "complexity": 2,
        "question_class": ["abnormality_color"],
    },
    {
        "img_id": "b2",
        "question": "Is there text?",
        "answer": "None",
        "prediction": "NA",
        "complexity": 1,
        "question_class": ["text_presence"],
    },
]


def _write(fmt: str, tmp_path: Path) -> Path | pd.DataFrame | list[dict]:
    df = pd.DataFrame(ROWS)
    if fmt == "jsonl":
        p = tmp_path / "p.jsonl"
        p.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
        return p
    if fmt == "json":
        p = tmp_path / "p.json"
        p.write_text(json.dumps(ROWS))
        return p
    if fmt == "csv":
        p = tmp_path / "p.csv"
        d = df.copy()
        d["question_class"] = d["question_class"].map(json.dumps)
        d.to_csv(p, index=False)
        return p
    if fmt == "parquet":
        p = tmp_path / "p.parquet"
        df.to_parquet(p)
        return p
    if fmt == "hf":
        import datasets

        p = tmp_path / "ds"
        datasets.Dataset.from_pandas(df).save_to_disk(str(p))
        return p
    if fmt == "records":
        return [dict(r) for r in ROWS]
    return df


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "hf", "records", "dataframe"])
def test_plain_formats_give_the_same_table(fmt: str, tmp_path: Path) -> None:
    df, rep = read_predictions(_write(fmt, tmp_path))
    assert rep.rows_in == 3 and rep.rows_kept == 3 and not rep.dropped
    assert df["img_id"].tolist() == ["a1", "a1", "b2"]
    assert df["reference"].tolist() == ["2", "pink; red", "None"]  # "None" stays text in CSV too
    assert df["prediction"].tolist() == ["two", "red", "NA"]
    assert df["question_class"].tolist() == [
        ("polyp_count",),
        ("abnormality_color",),
        ("text_presence",),
    ]
    assert df["complexity"].tolist() == [1, 2, 1]
    assert df["severity"].isna().all() and df["perturbation"].isna().all()


def test_ms_swift_inference_jsonl(tmp_path: Path) -> None:
    rows = [
        {  # ms-swift infer output: response + labels, messages with the answer appended
            "response": "There are two polyps.",
            "labels": "2 polyps",
            "messages": [
                {"role": "system", "content": "You are a doctor."},
                {"role": "user", "content": "<image>How many polyps are in the image?"},
                {"role": "assistant", "content": "There are two polyps."},
            ],
            "images": [{"path": "/data/variant_3/cl8k2u1q41ehr0832aze8a3c5.jpg"}],
        },
        {  # images as plain strings, no response field: prediction = last assistant turn
            "labels": "no",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image"}, {"type": "text", "text": "Is there text?"}],
                },
                {"role": "assistant", "content": "No."},
            ],
            "images": ["imgs/clb0kvxvx91c4074y2e107c5l.png"],
        },
    ]
    p = tmp_path / "pred.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    df, rep = read_predictions(p)
    assert rep.format == "jsonl:ms-swift"
    assert df["img_id"].tolist() == ["cl8k2u1q41ehr0832aze8a3c5", "clb0kvxvx91c4074y2e107c5l"]
    assert df["qkey"].tolist() == ["How many polyps are in the image?", "Is there text?"]
    assert df["prediction"].tolist() == ["There are two polyps.", "No."]
    assert df["reference"].tolist() == ["2 polyps", "no"]
    assert df["image_path"].tolist() == [
        "/data/variant_3/cl8k2u1q41ehr0832aze8a3c5.jpg",
        "imgs/clb0kvxvx91c4074y2e107c5l.png",
    ]
    assert df["_loc"].tolist() == [1, 2]


def test_llm_judge_eval_json(tmp_path: Path) -> None:
    rows = [
        {
            "response": "a large polyp",
            "img_id": "x1",
            "question": "What type of polyp is observed?",
            "complexity": 1,
            "answer": "no polypoid lesions",
            "original": "[]",
            "question_class": ["polyp_type"],
            "eval_json": {"polyp_type": {"score": 0, "reason": "wrong"}},
        },
        {
            "response": "no polyps remain",
            "img_id": "x1",
            "question": "Have all polyps been removed?",
            "complexity": 2,
            "answer": "none remain",
            "original": "[]",
            "question_class": ["polyp_removal_status", "abnormality_color"],
            "eval_json": {
                "polyp_removal_status": {"score": 1, "reason": "ok"},
                "abnormality_color": {"score": "0", "reason": "missing"},
            },
        },
        {
            "response": "x",
            "img_id": "x2",
            "question": "q?",
            "complexity": 1,
            "answer": "y",
            "original": "[]",
            "question_class": ["text_presence"],
            "error": "judge failed",
        },
    ]
    p = tmp_path / "2_transform_pred_model_eval.json"
    p.write_text(json.dumps(rows))
    df, rep = read_predictions(p)
    assert rep.format == "json:llm-judge"
    assert df["prediction"].tolist() == ["a large polyp", "no polyps remain", "x"]
    assert df["reference"].tolist() == ["no polypoid lesions", "none remain", "y"]
    assert df["judge"].iloc[0] == {"polyp_type": 0.0}
    assert df["judge"].iloc[1] == {"polyp_removal_status": 1.0, "abnormality_color": 0.0}
    assert df["judge"].iloc[2] is None
    assert any("without usable eval_json" in n for n in rep.notes)


def test_mixed_types_are_coerced_or_dropped_with_reasons(tmp_path: Path) -> None:
    rows = [
        {"img_id": 17, "question": "How many?", "answer": 2, "prediction": 2.0},
        {"img_id": "b", "question": "Is there text?", "answer": "yes", "prediction": True},
        {"img_id": "c", "question": "q", "answer": "a", "prediction": {"text": "a"}},
        {"img_id": "d", "question": "q", "answer": "a", "prediction": None},
        {"img_id": "e", "question": "  ", "answer": "a", "prediction": "a"},
        {"img_id": "f", "question": "q", "answer": "a", "prediction": "a", "severity": "high"},
    ]
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    df, rep = read_predictions(p)
    assert df["img_id"].tolist() == ["17", "b", "d"]
    assert df["prediction"].tolist() == ["2", "yes", None]  # None is kept: pairing counts it
    assert df["reference"].tolist() == ["2", "yes", "a"]
    assert rep.dropped == {
        "invalid_prediction_type": 1,
        "missing_question": 1,
        "invalid_severity": 1,
    }
    assert rep.drop_examples["invalid_prediction_type"] == [f"{p} line 3"]
    assert (
        rep.coerced["prediction:number_to_text"] == 1
        and rep.coerced["prediction:bool_to_text"] == 1
    )
    assert rep.rows_in == 6 and rep.rows_kept == 3


def test_malformed_json_line_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(
        '{"img_id": "a", "question": "q", "answer": "x", "prediction": "x"}\n\n{"img_id": "b", "question": \n'
    )
    with pytest.raises(InputError, match=r"bad\.jsonl: line 3: malformed JSON"):
        read_predictions(p)
    q = tmp_path / "notobj.jsonl"
    q.write_text('{"img_id": "a"}\n[1, 2]\n')
    with pytest.raises(InputError, match=r"line 2: expected a JSON object"):
        read_predictions(q)
    r = tmp_path / "bad.json"
    r.write_text('[{"img_id": "a",\n "question": }]')
    with pytest.raises(InputError, match=r"bad\.json: line 2: malformed JSON"):
        read_predictions(r)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "the file is empty"),
        ("blank.jsonl", "\n\n", "no rows"),
        ("header.csv", "img_id,question,answer,prediction\n", "no rows"),
        ("empty.csv", "", "the file is empty"),
        ("x.txt", "hello", "unknown file type"),
    ],
)
def test_empty_and_unknown_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(InputError, match=message):
        read_predictions(p)


def test_missing_columns_are_named_with_the_fix(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"img": "a", "q": "x", "answer": "y"}) + "\n")
    with pytest.raises(InputError) as exc:
        read_predictions(p)
    msg = str(exc.value)
    assert "missing column(s) prediction, question, img_id" in msg
    assert "prediction, pred, model_answer, response, model_response" in msg and "image path" in msg


def test_missing_path_and_plain_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_predictions(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="not a Hugging Face dataset"):
        read_predictions(tmp_path)


def test_img_id_from_image_path_and_windows_paths() -> None:
    df, _ = read_predictions(
        [
            {
                "image": "C:\\data\\variant_1\\abc.jpg",
                "question": "q",
                "answer": "a",
                "prediction": "a",
            },
            {"image": "rel/s3/def.png", "question": "q", "answer": "a", "prediction": "a"},
        ]
    )
    assert df["img_id"].tolist() == ["abc", "def"]
    df, rep = read_predictions(
        [{"image": None, "question": "q", "answer": "a", "prediction": "a"}] * 2
    )
    assert len(df) == 0 and rep.dropped == {"missing_img_id": 2}


def test_options_and_question_class_parsing() -> None:
    df, _ = read_predictions(
        [
            {
                "img_id": "a",
                "question": "q",
                "correct_answer": "B",
                "prediction": "(b)",
                "options": {"A": "pneumonia", "B": "effusion"},
                "question_class": "polyp_count; text_presence",
            },
            {
                "img_id": "b",
                "question": "q",
                "correct_answer": "A",
                "prediction": "A",
                "options": json.dumps(["A. one", "B. two"]),
            },
            {
                "img_id": "c",
                "question": "q",
                "correct_answer": "A",
                "prediction": "A",
                "options": np.nan,
            },
        ]
    )
    assert df["options"].iloc[0] == {"A": "pneumonia", "B": "effusion"}
    assert df["options"].iloc[1] == {"A": "one", "B": "two"}
    assert df["options"].iloc[2] is None
    assert df["question_class"].iloc[0] == ("polyp_count", "text_presence")
    assert df["reference"].tolist() == ["B", "A", "A"]
