"""The MCQ answer extractor on a hand-checked corpus of model outputs as models write them
(tests/score/data/mcq_answers.jsonl: plain, bold, bracketed letters, cue phrases, answer tags,
\\boxed, JSON, <think> blocks, reasoning that weighs and rejects options, other languages,
unparseable answers), and its use by the mcq metric."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.score.answers import extract_choice, strip_reasoning
from perturb.score.metrics import compute_item_metrics
from perturb.score.readers import obj_array

CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "mcq_answers.jsonl")
    .read_text("utf-8")
    .splitlines()
    if line.strip()
]


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 50
    texts = " ".join(c["text"] for c in CORPUS)
    for form in ("<think>", "<answer>", "\\boxed", '"answer"', "**", "答案", "Ответ"):
        assert form in texts
    assert sum(c["expected"] is None for c in CORPUS) >= 5


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: f"{c['id']}-{c['form'][:30]}")
def test_corpus(case: dict) -> None:
    got = extract_choice(case["text"], case["options"])
    assert got.letter == case["expected"], (case["text"], got)
    assert (got.how == "unparsed") == (got.letter is None)


def test_last_explicit_answer_wins_and_think_is_ignored() -> None:
    opts = {"A": "Pneumonia", "B": "Pleural effusion", "C": "Pneumothorax"}
    text = "<think>the answer is C</think>Option A is unlikely. Answer: B. Earlier I said A."
    assert extract_choice(text, opts).letter == "B"
    assert strip_reasoning("<think>x</think>y").strip() == "y"
    # reordering the rejected options in the reasoning never changes the answer
    for rejected in ("A", "C"):
        t = f"Option {rejected} is unlikely. Option {rejected} was considered.\nFinal answer: B"
        assert extract_choice(t, opts).letter == "B"


def test_mcq_metric_uses_the_extractor_and_counts_unparsed() -> None:
    # rows whose letter is one of their options (a letter outside them is no reference)
    preds = [c for c in CORPUS if c["expected"] is None or c["expected"] in c["options"]]
    pred = obj_array([c["text"] for c in preds])
    ref = obj_array([c["expected"] or "A" for c in preds])
    out = compute_item_metrics(pred, ref, ["mcq"], options=obj_array([c["options"] for c in preds]))
    expected_none = np.array([c["expected"] is None for c in preds])
    assert out["_mcq_unparsed"].tolist() == expected_none.tolist()
    # every parsed answer is right against its own expected letter
    assert np.all(out["mcq"][~expected_none] == 1.0)


def test_rejected_options_do_not_invert_the_gap() -> None:
    """The issue's case: clean answers reason through the wrong options before answering,
    perturbed answers state a wrong letter; a first-mention reader inverts the gap."""
    opts = {"A": "Pneumonia", "B": "Pleural effusion", "C": "Pneumothorax", "D": "Normal"}
    clean = [
        "<think>Option A? No consolidation. Option C? No pleural line.</think>\nThe answer is B."
    ] * 5
    pert = ["<answer>B</answer>"] * 3 + ["Considering B, it is not effusion.\nAnswer: (A)"] * 2
    pred = obj_array(clean + pert)
    ref = obj_array(["B"] * 10)
    v = compute_item_metrics(pred, ref, ["mcq"], options=obj_array([opts] * 10))["mcq"]
    assert v[:5].mean() == 1.0 and v[5:].mean() == 0.6


PARSED = [c for c in CORPUS if c["expected"] is not None and "</think>" not in c["text"]]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(PARSED),
    st.sampled_from("ABCDE"),
    st.sampled_from(
        [
            "<think>The answer is {X}. Option {X} fits.</think>\n",
            "<think>\nLet me weigh option ({X}) first... Final answer: {X}?\n</think>",
            "<reasoning>{X}</reasoning>",
        ]
    ),
)
def test_reasoning_before_the_answer_never_changes_it(case: dict, other: str, block: str) -> None:
    """Any letter said inside a reasoning block ahead of the answer is ignored."""
    text = block.format(X=other) + case["text"]
    assert extract_choice(text, case["options"]).letter == case["expected"]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from("ABCD"),
    st.sampled_from("ABCD"),
    st.sampled_from(
        [
            "Answer: {L}",
            "The answer is ({L}).",
            "<answer>{L}</answer>",
            "\\boxed{{{L}}}",
            '{{"answer": "{L}"}}',
        ]
    ),
)
def test_a_later_explicit_answer_wins(first: str, last: str, form: str) -> None:
    opts = {"A": "Pneumonia", "B": "Pleural effusion", "C": "Pneumothorax", "D": "Normal"}
    text = f"The answer is {first}.\nOn second look, option {first} is wrong.\n" + form.format(
        L=last
    )
    assert extract_choice(text, opts).letter == last
