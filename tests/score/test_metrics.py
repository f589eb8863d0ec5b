"""Per-item metrics against their reference libraries or hand-checked examples."""

from __future__ import annotations

import math
import re
import string
from collections import Counter

import numpy as np
import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer

from perturb.score.answers import extract_letter
from perturb.score.bitseq import lcs_dp, overlap_counter, pair_stats
from perturb.score.metrics import (
    compute_item_metrics,
    corpus_score,
    corpus_stats,
    extract_yesno,
    normalize_tolerant,
    parse_boxes,
    union_box_iou,
)
from perturb.score.text import TokenTable, tokenize

WORDS = [
    "polyp",
    "Polyp,",
    "red;",
    "the",
    "A",
    "two",
    "2",
    "café",
    "İ",
    "x-ray",
    "5-10mm",
    "yes.",
    "No",
    "upper-left",
    "ß",
]
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=80).map(" ".join)


def _obj(xs: list[str]) -> np.ndarray:
    a = np.empty(len(xs), dtype=object)
    a[:] = xs
    return a


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(texts, texts), min_size=1, max_size=25))
def test_rouge_equals_rouge_score(pairs: list[tuple[str, str]]) -> None:
    preds = _obj([p for p, _ in pairs])
    refs = _obj([r for _, r in pairs])
    got = compute_item_metrics(preds, refs, ["rouge1", "rouge2", "rougeL"])
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    for i, (p, r) in enumerate(pairs):
        ref = scorer.score(r, p)
        for k in ("rouge1", "rouge2", "rougeL"):
            assert got[k][i] == ref[k].fmeasure  # bit-identical


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 6), max_size=90), st.lists(st.integers(0, 6), max_size=90)
        ),
        min_size=1,
        max_size=20,
    )
)
def test_bit_parallel_lcs_and_overlap_equal_dp(pairs: list[tuple[list[int], list[int]]]) -> None:
    seqs = [s for p in pairs for s in p]
    lens = [len(s) for s in seqs]
    table = TokenTable(
        np.array([t for s in seqs for t in s], dtype=np.int64),
        np.r_[0, np.cumsum(lens)].astype(np.int64),
        [],
    )
    a = np.arange(0, len(seqs), 2)
    b = a + 1
    lcs, ovl = pair_stats(table, a, b)
    for k, (x, y) in enumerate(pairs):
        assert lcs[k] == lcs_dp(x, y)
        assert ovl[k] == overlap_counter(x, y)


def _squad_f1(pred: str, gold: str) -> float:
    """SQuAD v1.1 token F1 with its own normalisation (lower, punctuation, articles, whitespace)."""

    def norm(s: str) -> list[str]:
        s = s.lower()
        s = "".join(ch if ch not in set(string.punctuation) else " " for ch in s)
        s = re.sub(r"\b(a|an|the)\b", " ", s)
        return s.split()

    p, g = norm(pred), norm(gold)
    if not p or not g:
        return float(p == g)
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    pr, rc = same / len(p), same / len(g)
    return 2 * pr * rc / (pr + rc)


@pytest.mark.parametrize(
    ("pred", "ref"),
    [
        ("There is a red polyp.", "red polyp"),
        ("the the polyp polyp", "polyp"),
        ("", ""),
        ("", "no"),
        ("Upper-left, near the center", "upper left"),
        ("no", "yes"),
    ],
)
def test_token_f1_matches_squad_definition(pred: str, ref: str) -> None:
    got = compute_item_metrics(_obj([pred]), _obj([ref]), ["token_f1"])["token_f1"][0]
    assert got == pytest.approx(_squad_f1(pred, ref), abs=1e-12)


def test_exact_match_upstream_and_tolerant() -> None:
    preds = _obj(["  Colonoscopy ", "colonoscopy.", "Two polyps", "the answer", "x"])
    refs = _obj(["colonoscopy", "Colonoscopy", "2 polyps", "answer", None])
    m = compute_item_metrics(preds, refs, ["exact_match", "exact_match_tolerant"])
    assert m["exact_match"][:4].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert m["exact_match_tolerant"][:4].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert math.isnan(m["exact_match"][4]) and math.isnan(m["exact_match_tolerant"][4])
    assert normalize_tolerant("The TWO Polyps!") == "2 polyps"


def test_tokenize_non_ascii_matches_python_definitions() -> None:
    rouge, tol = tokenize(_obj(["Café İstanbul x-ray", "naïve ß", "plain ascii, text"]))
    assert [rouge.vocab[i] for i in rouge.tokens(0)] == ["caf", "i", "stanbul", "x", "ray"]
    assert [tol.vocab[i] for i in tol.tokens(0)] == ["café", "i", "stanbul", "x", "ray"]
    assert [tol.vocab[i] for i in tol.tokens(1)] == ["naïve", "ß"]
    assert [tol.vocab[i] for i in tol.tokens(2)] == ["plain", "ascii", "text"]


def _nmt_bleu(refs: list[str], hyps: list[str]) -> float:
    """The BLEU of the ``evaluate`` "bleu" metric (tensorflow/nmt compute_bleu, 13a tokens,
    no smoothing), which the Kvasir-VQA-x1 evaluation uses."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok = Tokenizer13a()
    matches, possible = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for r, h in zip(refs, hyps, strict=True):
        rt, ht = tok(r).split(), tok(h).split()
        ref_len += len(rt)
        hyp_len += len(ht)
        rc = Counter(tuple(rt[i : i + n]) for n in range(1, 5) for i in range(len(rt) - n + 1))
        hc = Counter(tuple(ht[i : i + n]) for n in range(1, 5) for i in range(len(ht) - n + 1))
        for ng, c in (hc & rc).items():
            matches[len(ng) - 1] += c
        for n in range(1, 5):
            possible[n - 1] += max(len(ht) - n + 1, 0)
    prec = [matches[i] / possible[i] if possible[i] else 0.0 for i in range(4)]
    if min(prec) <= 0:
        return 0.0
    geo = math.exp(sum(math.log(p) for p in prec) / 4)
    ratio = hyp_len / ref_len
    bp = 1.0 if ratio > 1.0 else math.exp(1 - 1.0 / ratio)
    return geo * bp


CORPUS_HYPS = [
    "a red polyp is visible in the upper left region of the image",
    "the procedure is a colonoscopy with one instrument visible",
    "no text is present, and no box artefact is seen",
    "two polyps , both pink , in the center",
]
CORPUS_REFS = [
    "a red polyp is seen in the upper-left region",
    "this is a colonoscopy and one instrument is visible",
    "no text is present and there is no green or black box artefact",
    "two pink polyps in the central region",
]


def test_corpus_bleu_and_chrf_against_sacrebleu_and_upstream_definition() -> None:
    h, r = _obj(CORPUS_HYPS), _obj(CORPUS_REFS)
    bleu = float(corpus_score("bleu", corpus_stats(h, r, "bleu").sum(axis=0)))
    assert bleu == pytest.approx(
        sacrebleu.corpus_bleu(CORPUS_HYPS, [CORPUS_REFS], smooth_method="none").score / 100,
        rel=1e-12,
    )
    assert bleu == pytest.approx(_nmt_bleu(CORPUS_REFS, CORPUS_HYPS), rel=1e-12)
    assert bleu > 0.1
    chrf = float(corpus_score("chrf", corpus_stats(h, r, "chrf").sum(axis=0)))
    assert chrf == pytest.approx(
        sacrebleu.corpus_chrf(CORPUS_HYPS, [CORPUS_REFS]).score / 100, rel=1e-12
    )
    chrfpp = float(corpus_score("chrf++", corpus_stats(h, r, "chrf++").sum(axis=0)))
    assert chrfpp == pytest.approx(
        sacrebleu.corpus_chrf(CORPUS_HYPS, [CORPUS_REFS], word_order=2).score / 100, rel=1e-12
    )
    assert chrfpp != pytest.approx(chrf)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(CORPUS_HYPS) - 1), min_size=1, max_size=12))
def test_corpus_metrics_recomputed_on_a_resample(idx: list[int]) -> None:
    """Summing per-row statistics over a resample (with repeats) = scoring the resampled corpus."""
    h, r = _obj(CORPUS_HYPS), _obj(CORPUS_REFS)
    hs = [CORPUS_HYPS[i] for i in idx]
    rs = [CORPUS_REFS[i] for i in idx]
    for name, ref in (
        ("bleu", sacrebleu.corpus_bleu(hs, [rs], smooth_method="none").score),
        ("chrf", sacrebleu.corpus_chrf(hs, [rs]).score),
    ):
        stats = corpus_stats(h, r, name)[idx].sum(axis=0)
        assert float(corpus_score(name, stats)) == pytest.approx(ref / 100, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B", "B"),
        ("(b)", "B"),
        ("b.", "B"),
        ("Answer: B. Pneumonia", "B"),
        ("The answer is (c)", "C"),
        ("The correct option is D because", "D"),
        ("C) pleural effusion", "C"),
        ("[A]", "A"),
        ("A polyp is visible", None),
        ("I think so", None),
        ("pneumonia", None),
    ],
)
def test_letter_extraction(text: str, letter: str | None) -> None:
    assert extract_letter(text) == letter


def test_mcq_accuracy_with_options_and_letter_refs() -> None:
    opts = {"A": "Pneumonia", "B": "Pleural effusion", "C": "Normal"}
    preds = _obj(["Answer: B. Pleural effusion", "pleural effusion", "(a)", "A polyp", "C"])
    refs = _obj(["B", "Pleural effusion", "B", "A", "yes"])
    options = np.empty(5, dtype=object)
    options[:] = [opts, opts, None, None, None]
    v = compute_item_metrics(preds, refs, ["mcq"], options=options)["mcq"]
    assert v[:4].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert math.isnan(v[4])  # "yes" is not an MCQ reference
    w = compute_item_metrics(_obj(["a", "A"]), _obj(["a", "A"]), ["mcq"])["mcq"]
    assert math.isnan(w[0]) and w[1] == 1.0  # without options only an upper-case letter is MCQ


@pytest.mark.parametrize(
    ("text", "yn"),
    [
        ("Yes, there is a polyp.", "yes"),
        ("No.", "no"),
        ("There is no polyp", "no"),
        ("maybe yes, maybe no", None),
        ("yes and no", "yes"),
        ("A polyp", None),
        ("NO, none", "no"),
    ],
)
def test_yes_no_extraction(text: str, yn: str | None) -> None:
    assert extract_yesno(text) == yn
    v = compute_item_metrics(_obj([text]), _obj(["No"]), ["yesno"])["yesno"][0]
    assert v == float(yn == "no")  # the vectorised path agrees with extract_yesno


def test_yesno_applies_only_to_yes_no_references() -> None:
    v = compute_item_metrics(_obj(["yes", "yes"]), _obj(["Yes.", "yes it is"]), ["yesno"])["yesno"]
    assert v[0] == 1.0 and math.isnan(v[1])


def test_box_iou_hand_checked() -> None:
    assert parse_boxes("at <loc_10_20_30_40> and <loc_5_5_1_1>") == [(10, 20, 30, 40), (1, 1, 5, 5)]
    assert union_box_iou([(0, 0, 10, 10)], [(0, 0, 10, 10)]) == 1.0
    assert union_box_iou([(0, 0, 10, 10)], [(20, 20, 30, 30)]) == 0.0
    assert union_box_iou([(0, 0, 10, 10)], [(5, 0, 15, 10)]) == pytest.approx(50 / 150)
    # union of two predicted boxes covering the reference exactly
    assert union_box_iou([(0, 0, 5, 10), (5, 0, 10, 10)], [(0, 0, 10, 10)]) == pytest.approx(1.0)
    # overlapping predicted boxes are not double counted: union 150, intersection with ref 100
    assert union_box_iou([(0, 0, 10, 10), (5, 0, 15, 10)], [(0, 0, 10, 10)]) == pytest.approx(100 / 150)
    v = compute_item_metrics(
        _obj(["<loc_0_0_10_10>", "nothing", "x"]),
        _obj(["<loc_5_0_15_10>", "<loc_0_0_1_1>", "no box"]),
        ["box_iou"],
    )["box_iou"]
    assert v[0] == pytest.approx(1 / 3) and v[1] == 0.0 and math.isnan(v[2])


def test_judge_scores_per_row() -> None:
    judge = np.empty(3, dtype=object)
    judge[:] = [{"a": 1.0, "b": 0.0}, {"a": 1.0}, None]
    qc = np.empty(3, dtype=object)
    qc[:] = [("a", "b"), ("a", "c"), ("a",)]
    v = compute_item_metrics(
        _obj(["x", "y", "z"]), _obj(["x", "y", "z"]), ["judge"], judge=judge, question_class=qc
    )["judge"]
    assert v[0] == 0.5 and v[1] == 1.0 and math.isnan(v[2])
