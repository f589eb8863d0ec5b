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
from perturb.score.arrays import obj_array
from perturb.score.metrics import compute_item_metrics

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


FAMILIES = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "mcq_families.jsonl")
    .read_text("utf-8")
    .splitlines()
    if line.strip()
]


def test_hand_checked_corpus_accuracy_over_model_families() -> None:
    """Both corpora together: >= 300 hand-checked outputs in the styles of >= 8 model families;
    the extractor reads every one as checked by hand (accuracy printed with -s)."""
    everything = CORPUS + FAMILIES
    assert len(everything) >= 300
    assert len({c["family"] for c in FAMILIES}) >= 8
    right = [extract_choice(c["text"], c["options"]).letter == c["expected"] for c in everything]
    accuracy = sum(right) / len(right)
    print(f"MCQ extractor accuracy on {len(everything)} hand-checked outputs: {accuracy:.4f}")
    wrong = [c["text"][:80] for c, ok in zip(everything, right, strict=True) if not ok]
    assert accuracy == 1.0, wrong


def test_option_letter_balance() -> None:
    """Every wording in the families corpus is written once per option letter: no letter may be
    missed more often than another (the issue: "The correct option is A because" lost A only)."""
    by_form: dict[str, dict[str, int]] = {}
    for c in FAMILIES:
        if c["expected"] is None:
            continue
        got = extract_choice(c["text"], c["options"]).letter
        by_form.setdefault(c["form"], {}).setdefault(c["expected"], 0)
        by_form[c["form"]][c["expected"]] += int(got != c["expected"])
    letters_per_form = [len(v) for v in by_form.values() if len(v) > 1]
    assert len(letters_per_form) >= 40 and min(letters_per_form) >= 4
    for form, misses in by_form.items():
        assert len(set(misses.values())) == 1, (form, misses)


@pytest.mark.parametrize("letter", list("ABCDE"))
@pytest.mark.parametrize(
    "wording",
    [
        "The correct option is {L} because the image shows it.",
        "The answer is {L} since the lesion is visible.",
        "{L} because of the consolidation.",
        "{L} as the opacity is lobar.",
        "{L}\nThe image shows the typical features.",
        "I think {L}, not {O}.",
        "Probably {L}.",
        "It's most likely {L}.",
        "I would say {L}, although {O} is possible.",
        "Answer: {O}. Wait, on second look the answer is {L}.",
    ],
)
def test_issue_wordings_read_every_letter(wording: str, letter: str) -> None:
    opts = {"A": "Pneumonia", "B": "Effusion", "C": "Pneumothorax", "D": "Normal", "E": "Mass"}
    other = "B" if letter != "B" else "C"
    text = wording.format(L=letter, O=other)
    assert extract_choice(text, opts).letter == letter, text


def test_hedges_never_override_an_explicit_answer_or_read_a_rejection() -> None:
    opts = {"A": "Pneumonia", "B": "Effusion", "C": "Pneumothorax"}
    assert extract_choice("Answer: B. I think C is less likely.", opts).letter == "B"
    assert extract_choice("I think C is unlikely.", opts).letter is None
    assert extract_choice("It is a subtle finding.", opts).letter is None
