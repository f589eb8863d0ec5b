"""Radiology metrics: box IoU / matching, answer F1 without loc tags, MCQ letters.

References are independent: IoU by rasterising integer boxes on a pixel grid, matching by
brute force over every assignment, F1 by the SQuAD definition written out here.
"""

from __future__ import annotations

import itertools
import re
import string
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb.contracts.boxes import (
    box_iou,
    hit_rate,
    iou_matrix,
    match_boxes,
    matched_mean_iou,
    parse_loc_tags,
    strip_loc_tags,
)
from perturb.score.answers import extract_letter
from perturb.score.arrays import obj_array
from perturb.score.metrics import compute_item_metrics, reference_letter

# ----------------------------------------------------------------------------- references


def raster_iou(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """IoU by counting covered pixels of integer boxes on a 40x40 grid."""
    grid_a = np.zeros((40, 40), bool)
    grid_b = np.zeros((40, 40), bool)
    grid_a[a[1] : a[3], a[0] : a[2]] = True
    grid_b[b[1] : b[3], b[0] : b[2]] = True
    union = (grid_a | grid_b).sum()
    return float((grid_a & grid_b).sum() / union) if union else 0.0


def brute_matched_sum(pred: list[tuple[int, ...]], ref: list[tuple[int, ...]]) -> float:
    """Best summed IoU over every one-to-one assignment (small sets only)."""
    if not pred or not ref:
        return 0.0
    small, large, flip = (pred, ref, False) if len(pred) <= len(ref) else (ref, pred, True)
    best = 0.0
    for perm in itertools.permutations(range(len(large)), len(small)):
        total = sum(
            raster_iou(large[j], s) if flip else raster_iou(s, large[j])
            for s, j in zip(small, perm, strict=True)
        )
        best = max(best, total)
    return best


def squad_f1(pred: str, ref: str) -> float:
    """SQuAD v1.1 token F1 (lower case, punctuation and articles removed)."""

    def norm(s: str) -> list[str]:
        s = s.lower()
        s = "".join(ch for ch in s if ch not in set(string.punctuation))
        s = re.sub(r"\b(a|an|the)\b", " ", s)
        return s.split()

    p, r = norm(pred), norm(ref)
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(r)
    return 2 * prec * rec / (prec + rec)


coord = st.integers(0, 39)


@st.composite
def int_box(draw: st.DrawFn) -> tuple[int, int, int, int]:
    x1, x2 = sorted((draw(coord), draw(coord)))
    y1, y2 = sorted((draw(coord), draw(coord)))
    return (x1, y1, x2 + 1, y2 + 1)


# ----------------------------------------------------------------------------- boxes


@settings(max_examples=150, deadline=None)
@given(int_box(), int_box())
def test_box_iou_matches_rasterised_iou_and_is_symmetric(a: tuple, b: tuple) -> None:
    v = box_iou(a, b)
    assert 0.0 <= v <= 1.0
    assert v == pytest.approx(box_iou(b, a))
    assert v == pytest.approx(raster_iou(a, b))
    assert box_iou(a, a) == 1.0
    assert iou_matrix([a], [b])[0, 0] == pytest.approx(v)


@settings(max_examples=60, deadline=None)
@given(st.lists(int_box(), max_size=4), st.lists(int_box(), min_size=1, max_size=4))
def test_matching_is_the_best_assignment(pred: list, ref: list) -> None:
    rows, cols, ious = match_boxes(pred, ref)
    assert len(set(rows.tolist())) == len(rows) and len(set(cols.tolist())) == len(cols)
    assert float(ious.sum()) == pytest.approx(brute_matched_sum(pred, ref), abs=1e-9)
    m = matched_mean_iou(pred, ref)
    assert 0.0 <= m <= 1.0
    assert m == pytest.approx(matched_mean_iou(ref, pred))
    assert matched_mean_iou(ref, ref) == pytest.approx(1.0)
    # extra boxes can only lower the score; a hit rate is a fraction of reference boxes
    assert matched_mean_iou([*ref, (0, 0, 1, 1)], ref) <= 1.0
    h = hit_rate(pred, ref)
    assert 0.0 <= h <= 1.0 and h * len(ref) == pytest.approx(round(h * len(ref)))


def test_box_metrics_hand_checked() -> None:
    ref = [(0, 0, 10, 10), (20, 20, 30, 30)]
    # one exact box, one half-overlapping (IoU 50/150), one extra far away
    pred = [(20, 20, 30, 30), (5, 0, 15, 10), (35, 35, 39, 39)]
    assert matched_mean_iou(pred, ref) == pytest.approx((1 + 1 / 3) / 3)
    assert hit_rate(pred, ref) == 0.5
    assert hit_rate(pred, ref, threshold=0.3) == 1.0
    assert matched_mean_iou([], ref) == 0.0 and hit_rate([], ref) == 0.0
    assert matched_mean_iou([], []) == 1.0 and np.isnan(hit_rate(pred, []))


def test_loc_tags_parse_and_strip() -> None:
    text = "Nodule in the right upper lobe <loc_10_20_30.5_40> and  <loc_5_5_1_1>."
    assert parse_loc_tags(text) == [(10, 20, 30.5, 40), (5, 5, 1, 1)]
    assert strip_loc_tags(text) == "Nodule in the right upper lobe and ."
    assert strip_loc_tags("no tags") == "no tags"


def test_box_helpers_have_one_definition() -> None:
    """The torch-free box and <loc> helpers live in perturb.contracts.boxes only: no other module of the
    package defines its own copy (the scorer's union IoU has its own name, union_box_iou)."""
    import ast

    import perturb
    import perturb.contracts.boxes as bx

    helpers = {"LOC_TAG", "box_iou", "loc_tag", "parse_loc_tags", "strip_loc_tags"}
    root = Path(perturb.__file__).parent
    copies = []
    for path in root.rglob("*.py"):
        if path == Path(bx.__file__):
            continue
        for node in ast.parse(path.read_text()).body:
            names = [node.name] if isinstance(node, ast.FunctionDef) else []
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            copies += [f"{path.relative_to(root)}:{name}" for name in names if name in helpers]
    assert copies == []


# ----------------------------------------------------------------------------- item metrics

ANSWERS = [
    (
        "Yes, there is a nodule in the right upper lung <loc_1_2_3_4>.",
        "A nodule, right upper lung.",
    ),
    ("Cardiomegaly <loc_10_10_50_50>", "There is cardiomegaly <loc_12_10_50_52> and effusion"),
    ("The effusion is on the left <loc_1_1_9_9>", "no finding"),
    ("<loc_1_1_2_2>", "Pleural effusion <loc_1_1_2_2>"),
]


@pytest.mark.parametrize(("ref", "pred"), ANSWERS)
def test_answer_f1_is_squad_f1_without_loc_tags(ref: str, pred: str) -> None:
    out = compute_item_metrics(obj_array([pred]), obj_array([ref]), ["answer_f1"])
    expected = squad_f1(re.sub(r"<loc_[^>]*>", " ", pred), re.sub(r"<loc_[^>]*>", " ", ref))
    assert out["answer_f1"][0] == pytest.approx(expected)


def test_answer_f1_applies_to_grounded_rows_only() -> None:
    pred = obj_array(["a nodule", "yes", "yes"])
    ref = obj_array(["a nodule <loc_1_1_5_5>", "yes", "yes"])
    boxes = obj_array([None, None, [(0, 0, 4, 4)]])
    out = compute_item_metrics(pred, ref, ["answer_f1", "box_miou"], ref_boxes=boxes)
    assert out["answer_f1"][0] == 1.0 and np.isnan(out["answer_f1"][1])
    assert out["answer_f1"][2] == 1.0  # gt_location boxes make a row grounded
    assert out["box_miou"][0] == 0.0 and np.isnan(out["box_miou"][1])


def test_reference_boxes_replace_the_tags() -> None:
    pred = obj_array(["here <loc_0_0_10_10>", "here <loc_0_0_10_10>"])
    ref = obj_array(["there <loc_100_100_110_110>", "there <loc_100_100_110_110>"])
    boxes = obj_array([[(0, 0, 10, 10)], None])
    out = compute_item_metrics(pred, ref, ["box_iou", "box_miou", "box_hit50"], ref_boxes=boxes)
    assert out["box_iou"].tolist() == [1.0, 0.0]
    assert out["box_miou"].tolist() == [1.0, 0.0]
    assert out["box_hit50"].tolist() == [1.0, 0.0]


# ----------------------------------------------------------------------------- MCQ letters

OPTIONS = {"A": "Pneumonia", "B": "Pleural effusion", "C": "Effusion", "D": "Normal study"}
LETTER_CASES = [
    ("B", "B"),
    ("(b)", "B"),
    ("[C]", "C"),
    ("d.", "D"),
    ("**B**", "B"),
    ("Answer: B", "B"),
    ("The answer is (c)", "C"),
    ("The correct option is D because the lungs are clear", "D"),
    ("answer: c.", "C"),
    ("B. Pleural effusion", "B"),
    ("C) Effusion", "C"),
    ("pleural effusion", "B"),  # option text
    ("I think this is a pleural effusion.", "B"),  # contains B's text (which contains C's)
    ("Findings suggest pneumonia", "A"),
    ("The answer is a pleural effusion", "B"),  # 'a' here is an article, the text decides
    ("A pleural effusion is present", "B"),
    ("I cannot tell", None),
    ("pneumonia or effusion", None),  # two unrelated options: ambiguous
    ("", None),
]


@pytest.mark.parametrize(("text", "letter"), LETTER_CASES)
def test_extract_letter(text: str, letter: str | None) -> None:
    assert extract_letter(text, OPTIONS) == letter


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from("ABCDE"),
    st.sampled_from(["{L}", "({L})", "Answer: {L}", "{L}. {T}", "The answer is {L}.", "{T}"]),
)
def test_letter_round_trip(letter: str, template: str) -> None:
    options = {
        "A": "Atelectasis",
        "B": "Pleural effusion",
        "C": "Pneumothorax",
        "D": "Cardiomegaly",
        "E": "No acute finding",
    }
    text = template.format(L=letter, T=options[letter])
    assert extract_letter(text, options) == letter
    assert reference_letter(letter, options) == letter


def test_unparseable_answers_are_wrong_and_flagged() -> None:
    pred = obj_array(["B", "no idea", "The answer is C", "E"])
    ref = obj_array(["B", "B", "B", "B"])
    opts = obj_array([OPTIONS] * 4)
    out = compute_item_metrics(pred, ref, ["mcq"], options=opts)
    assert out["mcq"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert out["_mcq_unparsed"].tolist() == [False, True, False, False]


WORDS = ["nodule", "right", "upper", "lobe", "effusion", "left", "base", "no", "the", "a", "mass"]
tag = st.builds(
    lambda a, b: f"<loc_{a}_{b}_{a + 5}_{b + 5}>", st.integers(0, 99), st.integers(0, 99)
)
answer = st.lists(st.one_of(st.sampled_from(WORDS), tag), min_size=1, max_size=8).map(" ".join)


@settings(max_examples=80, deadline=None)
@given(answer, answer)
def test_answer_f1_properties(pred: str, ref: str) -> None:
    grounded_ref = ref + " <loc_1_1_2_2>"  # a grounded row either way
    both = compute_item_metrics(
        obj_array([pred, grounded_ref]),
        obj_array([grounded_ref, pred + " <loc_3_3_4_4>"]),
        ["answer_f1"],
    )["answer_f1"]
    assert 0.0 <= both[0] <= 1.0
    assert both[0] == pytest.approx(both[1])  # symmetric in prediction and reference
    assert both[0] == pytest.approx(squad_f1(strip_loc_tags(pred), strip_loc_tags(ref)))
    same = compute_item_metrics(
        obj_array([strip_loc_tags(grounded_ref)]), obj_array([grounded_ref]), ["answer_f1"]
    )["answer_f1"]
    assert same[0] == 1.0  # loc tags never count
