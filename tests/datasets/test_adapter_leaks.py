"""No adapter row gives the answer away outside its answer fields: every text column of each
adapter's output (the columns ``perturb generate`` copies into DIR/dataset) is checked against
the row's answer: the correct option's text (ReXVQA, MedThinkVQA: the fixtures' reports,
explanations, captions, diagnosis and ICD fields name it) or the finding and box (VinDr)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from perturb.datasets.medthinkvqa import adapter as medthinkvqa
from perturb.datasets.medthinkvqa.adapter import open_medthinkvqa
from perturb.datasets.rexvqa import adapter as rexvqa
from perturb.datasets.rexvqa.adapter import open_rexvqa
from perturb.datasets.vindr_cxr_vqa import adapter as vindr
from perturb.datasets.vindr_cxr_vqa.adapter import open_vindr
from tests.datasets.radiology_fixtures import make_medthinkvqa, make_rexvqa, make_vindr

CHOICES = "options"  # the choices are the prompt's; they hold the answer among the others


@pytest.fixture(autouse=True)
def _offline_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _options(v: Any) -> dict[str, str]:
    v = json.loads(v) if isinstance(v, str) else v
    if isinstance(v, dict):
        return {k: str(t) for k, t in v.items() if t is not None}
    return {s[0]: s[3:] for s in v}  # ["A. Pneumonia", ...]


def _leaks(rows: list[dict[str, Any]], answers: list[list[str]], exempt: set[str]) -> list[str]:
    found = []
    for row, needles in zip(rows, answers, strict=True):
        for column, value in row.items():
            if column in exempt or not isinstance(value, str):
                continue
            for needle in needles:
                if re.search(rf"(?i)(?<!\w){re.escape(needle)}(?!\w)", value):
                    found.append(f"{column}={value[:60]!r} names {needle!r}")
    return found


def _mcq_answers(rows: list[dict[str, Any]]) -> list[list[str]]:
    # an answer of a few letters (Yes / No) is an ordinary word: not a leak by itself
    texts = [_options(r["options"])[r["correct_answer"]] for r in rows]
    return [[t] if len(t) > 3 else [] for t in texts]


def test_medthinkvqa_rows_hold_no_answer(tmp_path: Path) -> None:
    rows = open_medthinkvqa(make_medthinkvqa(tmp_path)).ds.to_list()
    assert not any("icd" in c.lower() for c in rows[0])
    answers = _mcq_answers(rows)
    assert all(answers)  # the check is live: "Diverticulitis" is in the dropped fields
    assert not _leaks(rows, answers, {CHOICES, *medthinkvqa.ANSWER_FIELDS})
    kept = open_medthinkvqa(make_medthinkvqa(tmp_path / "k"), keep_leaking_fields=True).ds.to_list()
    assert _leaks(kept, _mcq_answers(kept), {CHOICES, *medthinkvqa.ANSWER_FIELDS})


def test_rexvqa_rows_hold_no_answer(tmp_path: Path) -> None:
    fx = make_rexvqa(tmp_path)
    rows = open_rexvqa(fx.json_file, images=fx.images).ds.to_list()
    answers = _mcq_answers(rows)
    assert any(answers)
    assert not _leaks(rows, answers, {CHOICES, *rexvqa.ANSWER_FIELDS})
    kept = open_rexvqa(fx.json_file, images=fx.images, keep_leaking_fields=True).ds.to_list()
    assert _leaks(kept, _mcq_answers(kept), {CHOICES, *rexvqa.ANSWER_FIELDS})


def test_vindr_rows_hold_no_answer(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    rows = open_vindr(fx.data, images=fx.images).ds.to_list()
    # the question names the finding by design ("Where is the nodule?"); the answer is the
    # box and the answer sentence
    answers = []
    for r in rows:
        sentence = re.sub(r"<loc_[\d_.]+>", "", r["answer"]).strip(" .")
        boxes = re.findall(r"<loc_[\d_.]+>", r["gt_location"] + r["answer"])
        answers.append([*boxes, *([sentence] if len(sentence) > 3 else [])])
    assert any(len(a) > 1 for a in answers)
    assert not _leaks(rows, answers, set(vindr.ANSWER_FIELDS))
