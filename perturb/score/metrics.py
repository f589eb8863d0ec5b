"""Per-item metrics and corpus-metric sufficient statistics.

Definitions follow the Kvasir-VQA-x1 evaluation (``evaluation/compute_metrics.py`` upstream):

* ``exact_match``: ``p.strip().lower() == r.strip().lower()`` (upstream's definition).
* ``exact_match_tolerant``: equality after :func:`normalize_tolerant` (NFKC, lower case,
  punctuation and articles removed, number words zero..twenty as digits, whitespace collapsed).
* ``token_f1``: SQuAD-style token F1 on the tolerant normalisation.
* ``rouge1`` / ``rouge2`` / ``rougeL``: rouge-score F-measure, no stemming (the defaults of the
  ``evaluate`` wrapper upstream uses); the corpus value is the mean over items. Computed with a
  vectorised exact LCS / n-gram overlap on rouge-score's own tokenizer.
* ``bleu``: sacrebleu corpus BLEU (13a tokenizer, 4-grams, no smoothing: the definition of the
  ``evaluate`` "bleu" metric upstream), reported as a fraction in [0, 1].
* ``chrf`` (char order 6, word order 0, beta 2: upstream's "CHRF++" column is this, the
  ``evaluate`` chrF default) and ``chrf++`` (word order 2), sacrebleu, as fractions (score / 100).
  Corpus metrics are computed from summed per-item sufficient statistics, which is exactly how
  sacrebleu computes a corpus score, so any subset or bootstrap resample is recomputed exactly.
* ``meteor``: nltk's ``single_meteor_score`` (alpha 0.9, beta 3, gamma 0.5) with the WordNet 3.0
  data shipped in the package (offline), mean over items, as upstream (see
  :mod:`perturb.score.meteor` for the one tokenisation difference).
* ``mcq``: letter accuracy; the reference letter is a bare letter answer or the option whose text
  matches the reference; the predicted letter comes from :func:`extract_letter`
  (:mod:`perturb.score.answers`: explicit final answers first, ``<think>`` ignored). An answer with
  no recognisable letter counts as wrong and is counted (``mcq_unparsed`` in scores.json).
* ``answer_f1``: SQuAD-style token F1 (the tolerant normalisation above) between the answer
  texts with their ``<loc_...>`` tags removed, on grounded rows (the reference has loc tags or
  reference boxes, e.g. VinDr-CXR-VQA).
* ``yesno``: accuracy on rows whose reference is yes/no.
* ``box_iou``: IoU between the unions of ``<loc_x1_y1_x2_y2>`` boxes of prediction and reference
  (rows whose reference has boxes; no predicted box gives 0). Reference boxes come from the
  row's ``ref_boxes`` (e.g. VinDr ``gt_location``) when given, else from the reference's tags.
* ``box_miou``: best one-to-one match (Hungarian, maximal summed IoU) between predicted and
  reference boxes, summed IoU / max(#predicted, #reference): missed and extra boxes both count.
* ``box_hit50``: fraction of reference boxes whose matched prediction has IoU >= 0.5.
* ``bleurt`` / ``bertscore``: not computed (they need model weights); per-item values given in
  the prediction files' ``bleurt`` / ``bertscore`` (or ``bertscore_f1``) columns are compared
  like any other item metric.
* ``judge``: LLM-judge aspect scores (``eval_json``); per row the mean over the row's
  question classes that were scored; per class the aspect score itself (upstream's aggregation).

All item metrics are floats in [0, 1], NaN where a metric does not apply to a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from perturb.contracts.boxes import (
    Box,
    hit_rate,
    matched_mean_iou,
    parse_loc_tags,
    sort_corners,
    strip_loc_tags,
)
from perturb.errors import InputError
from perturb.score.answers import extract_letter
from perturb.score.arrays import map_unique, obj_array
from perturb.score.bitseq import pair_stats
from perturb.score.text import TokenTable, rouge_split, sequences_equal, tokenize, tolerant_tokens


@dataclass(frozen=True)
class MetricSpec:
    """One metric: how it aggregates and whether per-item values are 0/1."""

    name: str
    kind: Literal["item", "corpus"]
    binary: bool
    description: str
    stats_width: int = 0


METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in [
        MetricSpec("exact_match", "item", True, "exact match, lower-cased and stripped (upstream)"),
        MetricSpec(
            "exact_match_tolerant", "item", True, "exact match after tolerant normalisation"
        ),
        MetricSpec("token_f1", "item", False, "SQuAD token F1 on tolerant normalisation"),
        MetricSpec(
            "rouge1", "item", False, "ROUGE-1 F (rouge-score, no stemming), mean over items"
        ),
        MetricSpec(
            "rouge2", "item", False, "ROUGE-2 F (rouge-score, no stemming), mean over items"
        ),
        MetricSpec(
            "rougeL", "item", False, "ROUGE-L F (rouge-score, no stemming), mean over items"
        ),
        MetricSpec("meteor", "item", False, "METEOR (nltk, packaged WordNet 3.0), mean over items"),
        MetricSpec("mcq", "item", True, "multiple-choice letter accuracy"),
        MetricSpec("yesno", "item", True, "yes/no accuracy on yes/no references"),
        MetricSpec("box_iou", "item", False, "IoU of <loc_x1_y1_x2_y2> box unions"),
        MetricSpec("box_miou", "item", False, "one-to-one matched box IoU / max(#pred, #ref)"),
        MetricSpec("box_hit50", "item", False, "reference boxes hit at IoU >= 0.5 (fraction)"),
        MetricSpec(
            "answer_f1", "item", False, "token F1 without <loc_...> tags (grounded answers)"
        ),
        MetricSpec("judge", "item", False, "LLM-judge aspect score (eval_json)"),
        MetricSpec("bleurt", "item", False, "BLEURT, precomputed per item (column 'bleurt')"),
        MetricSpec(
            "bertscore", "item", False, "BERTScore F1, precomputed per item (column 'bertscore')"
        ),
        MetricSpec("bleu", "corpus", False, "corpus BLEU (sacrebleu 13a, no smoothing) / 100", 10),
        MetricSpec("chrf", "corpus", False, "corpus chrF (sacrebleu, char 6, word 0) / 100", 18),
        MetricSpec(
            "chrf++", "corpus", False, "corpus chrF++ (sacrebleu, char 6, word 2) / 100", 24
        ),
    ]
}
DEFAULT_METRICS = (
    "exact_match",
    "exact_match_tolerant",
    "token_f1",
    "rouge1",
    "rouge2",
    "rougeL",
    "mcq",
    "yesno",
    "box_iou",
    "box_miou",
    "box_hit50",
    "answer_f1",
    "judge",
)
# model-based metrics perturb does not compute (they need model weights): per-item values read
# from the prediction files' columns of these names, added to the default set when present
PRECOMPUTED_METRICS = ("bleurt", "bertscore")
# corpus and slower text metrics added to the default set when the answers are free text
FREE_TEXT_METRICS = ("meteor", "bleu", "chrf")
PRESETS: dict[str, tuple[str, ...]] = {
    "default": DEFAULT_METRICS,
    "upstream": ("exact_match", "rouge1", "rouge2", "rougeL", "meteor", "bleu", "chrf"),
    "all": tuple(METRICS),
    # VinDr-CXR-VQA (answer text + boxes) and the MCQ sets (ReXVQA, MedThinkVQA)
    "grounded": ("answer_f1", "box_iou", "box_miou", "box_hit50", "yesno"),
    "mcq": ("mcq",),
}


def resolve_metrics(requested: Sequence[str] | None) -> list[str]:
    """Expand presets and comma lists; raise :class:`InputError` on unknown names."""
    if not requested:
        return list(DEFAULT_METRICS)
    out: list[str] = []
    for item in requested:
        for name in (p.strip() for p in str(item).split(",")):
            if not name:
                continue
            names = PRESETS.get(name, (name,))
            for n in names:
                if n not in METRICS:
                    raise InputError(
                        f"unknown metric '{n}'. Choose from {', '.join(METRICS)} or a preset "
                        f"({', '.join(PRESETS)})."
                    )
                if n not in out:
                    out.append(n)
    if not out:
        raise InputError("--metrics is empty; name at least one metric")
    return out


# ----------------------------------------------------------------------------- normalisation


def normalize_em(s: str) -> str:
    """Upstream exact-match normalisation: stripped and lower-cased."""
    return s.strip().lower()


def normalize_tolerant(s: str) -> str:
    """NFKC, lower case, punctuation and articles removed, number words as digits."""
    return " ".join(tolerant_tokens(s))


def rouge_tokens(s: str) -> tuple[str, ...]:
    """rouge-score's default tokenizer without stemming."""
    return tuple(rouge_split(s))


# ----------------------------------------------------------------------------- letters, yes/no, boxes

_LETTER_ONLY = re.compile(r"^\s*[\(\[]?\s*([A-Ja-j])\s*[\)\]]?\s*[.:)]?\s*$")


def reference_letter(ref: str, options: Mapping[str, str] | None) -> str | None:
    """Correct letter of an MCQ row: a bare-letter reference (upper case unless the row has
    options) or the option whose text matches the reference."""
    m = _LETTER_ONLY.match(ref)
    # without options only an upper-case letter counts (a lower-case "a" is an ordinary word)
    if m and (m.group(1).upper() in options if options else m.group(1).isupper()):
        return m.group(1).upper()
    if options:
        r = normalize_tolerant(ref)
        hits = [k for k, v in options.items() if normalize_tolerant(v) == r and r]
        if len(hits) == 1:
            return hits[0]
    return None


def extract_yesno(pred: str) -> str | None:
    """``yes``/``no`` from a free-text answer: the first word, else the only one present."""
    toks = tolerant_tokens(pred)
    if not toks:
        return None
    if toks[0] in ("yes", "no"):
        return toks[0]
    present = {t for t in toks if t in ("yes", "no")}
    return present.pop() if len(present) == 1 else None


def parse_boxes(text: str) -> list[Box]:
    """Boxes ``(x1, y1, x2, y2)`` from ``<loc_x1_y1_x2_y2>`` tags (corners sorted)."""
    return [sort_corners(b) for b in parse_loc_tags(text)]


def _union_area_grid(
    xs: np.ndarray, ys: np.ndarray, boxes: Sequence[tuple[float, float, float, float]]
) -> np.ndarray:
    cover = np.zeros((len(ys) - 1, len(xs) - 1), dtype=bool)
    for x1, y1, x2, y2 in boxes:
        i0, i1 = np.searchsorted(xs, [x1, x2])
        j0, j1 = np.searchsorted(ys, [y1, y2])
        cover[j0:j1, i0:i1] = True
    return cover


def union_box_iou(
    pred_boxes: Sequence[tuple[float, ...]], ref_boxes: Sequence[tuple[float, ...]]
) -> float:
    """IoU of the union of predicted boxes and the union of reference boxes (exact areas)."""
    if not ref_boxes and not pred_boxes:
        return 1.0
    if not ref_boxes or not pred_boxes:
        return 0.0
    allb = list(pred_boxes) + list(ref_boxes)
    xs = np.unique([b[0] for b in allb] + [b[2] for b in allb])
    ys = np.unique([b[1] for b in allb] + [b[3] for b in allb])
    if len(xs) < 2 or len(ys) < 2:
        return 0.0
    cell = np.outer(np.diff(ys), np.diff(xs))
    a = _union_area_grid(xs, ys, pred_boxes)  # type: ignore[arg-type]
    b = _union_area_grid(xs, ys, ref_boxes)  # type: ignore[arg-type]
    union = float(cell[a | b].sum())
    return float(cell[a & b].sum()) / union if union > 0 else 0.0


# ----------------------------------------------------------------------------- vectorised item metrics


def _fmeasure(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    """rouge-score's ``fmeasure``: 2pr / (p + r), 0 when p + r = 0 (same float operations)."""
    s = p + r
    with np.errstate(invalid="ignore", divide="ignore"):
        f = 2 * p * r / s
    return np.where(s > 0, f, 0.0)


def _text_scores(
    strings: np.ndarray, pred_rows: np.ndarray, ref_rows: np.ndarray, which: set[str]
) -> tuple[dict[str, np.ndarray], TokenTable]:
    """Text metrics of prediction rows ``pred_rows`` vs reference rows ``ref_rows`` of the
    unique ``strings``, and the tolerant token table of ``strings``."""
    out: dict[str, np.ndarray] = {}
    if "exact_match" in which:
        codes, _ = pd.factorize(obj_array([normalize_em(x) for x in strings]))
        out["exact_match"] = (codes[pred_rows] == codes[ref_rows]).astype(np.float64)
    rouge_tokens, tolerant = tokenize(strings)
    if len(pred_rows) == 0:
        return {m: np.zeros(0) for m in which}, tolerant
    if "exact_match_tolerant" in which:
        out["exact_match_tolerant"] = sequences_equal(tolerant, pred_rows, ref_rows).astype(
            np.float64
        )
    if "token_f1" in which:
        _, same = pair_stats(tolerant, pred_rows, ref_rows, want_lcs=False)
        pred_len = tolerant.lengths[pred_rows].astype(np.float64)
        ref_len = tolerant.lengths[ref_rows].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = same / pred_len
            recall = same / ref_len
            f1 = 2 * precision * recall / (precision + recall)
        f1 = np.where(same > 0, f1, 0.0)
        empty = (pred_len == 0) | (ref_len == 0)
        out["token_f1"] = np.where(empty, ((pred_len == 0) & (ref_len == 0)).astype(np.float64), f1)
    pred_len = rouge_tokens.lengths[pred_rows].astype(np.float64)
    ref_len = rouge_tokens.lengths[ref_rows].astype(np.float64)
    if "rougeL" in which or "rouge1" in which:
        lcs, overlap = pair_stats(rouge_tokens, pred_rows, ref_rows, want_lcs="rougeL" in which)
        if "rougeL" in which:
            with np.errstate(invalid="ignore", divide="ignore"):
                f = _fmeasure(lcs / np.maximum(pred_len, 1), lcs / np.maximum(ref_len, 1))
            out["rougeL"] = np.where((pred_len > 0) & (ref_len > 0), f, 0.0)
        if "rouge1" in which:
            out["rouge1"] = _fmeasure(
                overlap / np.maximum(pred_len, 1), overlap / np.maximum(ref_len, 1)
            )
    if "rouge2" in which:
        _, bigram_overlap = pair_stats(rouge_tokens.bigrams(), pred_rows, ref_rows, want_lcs=False)
        pred_bigrams = np.maximum(pred_len - 1, 0)
        ref_bigrams = np.maximum(ref_len - 1, 0)
        out["rouge2"] = _fmeasure(
            bigram_overlap / np.maximum(pred_bigrams, 1),
            bigram_overlap / np.maximum(ref_bigrams, 1),
        )
    if "yesno" in which:
        out["yesno"] = _yesno_scores(tolerant, pred_rows, ref_rows)
    return out, tolerant


def _yesno_scores(tol: TokenTable, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Yes/no accuracy where reference row ``b`` is exactly yes or no (NaN elsewhere).

    The predicted answer is the first tolerant token if it is yes/no, else the only one of
    yes/no that occurs (see :func:`extract_yesno`).
    """
    index = {t: i for i, t in enumerate(tol.vocab)}
    yes, no = index.get("yes", -10), index.get("no", -10)
    lens = tol.lengths
    first = np.full(len(lens), -1, dtype=np.int64)
    nz = lens > 0
    first[nz] = tol.ids[tol.offsets[:-1][nz]]
    row = np.repeat(np.arange(len(lens)), lens)
    n_yes = np.bincount(row[tol.ids == yes], minlength=len(lens))
    n_no = np.bincount(row[tol.ids == no], minlength=len(lens))
    said = np.where(
        (first == yes) | (first == no),
        first,
        np.where((n_yes > 0) & (n_no == 0), yes, np.where((n_no > 0) & (n_yes == 0), no, -1)),
    )
    ref_tok = np.where(lens == 1, first, -1)
    is_yn = (ref_tok[b] == yes) | (ref_tok[b] == no)
    return np.where(is_yn, (said[a] == ref_tok[b]).astype(np.float64), np.nan)


def answers_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether answers ``a[i]`` and ``b[i]`` differ after tolerant normalisation."""
    strings, codes = _factorize_strings(np.concatenate([a, b]))
    _, tol = tokenize(strings)
    n = len(a)
    return ~sequences_equal(tol, codes[:n], codes[n:])


def _unique_pairs(pred: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (pred, ref) pairs: (their preds, their refs, inverse index of each row)."""
    pred_codes, pred_uniq = pd.factorize(pd.Series(pred, dtype=object))
    ref_codes, ref_uniq = pd.factorize(pd.Series(ref, dtype=object))
    n_refs = max(len(ref_uniq), 1)
    pair_keys, inv = np.unique(
        pred_codes.astype(np.int64) * n_refs + ref_codes, return_inverse=True
    )
    return (
        np.asarray(pred_uniq, dtype=object)[pair_keys // n_refs],
        np.asarray(ref_uniq, dtype=object)[pair_keys % n_refs],
        inv.reshape(-1),
    )


def _factorize_strings(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes, uniq = pd.factorize(pd.Series(values, dtype=object))
    return np.asarray(uniq, dtype=object), codes.astype(np.int64)


TEXT_METRICS = (
    "exact_match",
    "exact_match_tolerant",
    "token_f1",
    "rouge1",
    "rouge2",
    "rougeL",
    "yesno",
)


def compute_item_metrics(
    pred: np.ndarray,
    ref: np.ndarray,
    metrics: Sequence[str],
    options: np.ndarray | None = None,
    judge: np.ndarray | None = None,
    question_class: np.ndarray | None = None,
    compare: tuple[np.ndarray, np.ndarray] | None = None,
    ref_boxes: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-row values of the requested item metrics (NaN where not applicable).

    ``pred``/``ref`` are object arrays of str (``ref`` may hold None: text metrics are NaN
    there). Text metrics are computed once per distinct (prediction, reference) pair, from one
    batch tokenisation. With ``compare=(i, j)`` the result also holds ``"_answer_changed"``:
    whether predictions ``pred[i[k]]`` and ``pred[j[k]]`` differ after tolerant normalisation.
    ``ref_boxes`` (per row a tuple of (x1, y1, x2, y2) or None) gives reference boxes that
    replace the reference's loc tags. With ``mcq`` the result holds ``"_mcq_unparsed"``: rows
    where mcq applies and the prediction has no recognisable letter.
    """
    n = len(pred)
    wanted = [m for m in metrics if METRICS[m].kind == "item"]
    out = _text_metric_values(pred, ref, [m for m in wanted if m in TEXT_METRICS], compare)
    if "meteor" in wanted:
        from perturb.score.meteor import meteor_scores

        out["meteor"] = meteor_scores(pred, ref)
    if "mcq" in wanted:
        out["mcq"], out["_mcq_unparsed"] = _mcq_values(pred, ref, options)
    box_metrics = [m for m in ("box_iou", "box_miou", "box_hit50") if m in wanted]
    boxes = _reference_boxes(ref, ref_boxes) if box_metrics or "answer_f1" in wanted else None
    if box_metrics and boxes is not None:
        out.update(_box_values(pred, boxes, box_metrics))
    if "answer_f1" in wanted and boxes is not None:
        out["answer_f1"] = _answer_f1(pred, ref, ~pd.isna(boxes) & ~pd.isna(ref))
    if "judge" in wanted:
        out["judge"] = _judge_values(n, judge, question_class)
    return out


def _text_metric_values(
    pred: np.ndarray,
    ref: np.ndarray,
    text_metrics: Sequence[str],
    compare: tuple[np.ndarray, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """The text metrics (and ``_answer_changed`` with ``compare``), each distinct
    (prediction, reference) pair scored once."""
    n = len(pred)
    out: dict[str, np.ndarray] = {}
    rows = np.flatnonzero(~pd.isna(ref))
    strings, codes = _factorize_strings(np.concatenate([pred, ref[rows]]))
    n_strings = max(len(strings), 1)
    pairs_u, inv = np.unique(codes[rows] * n_strings + codes[n:], return_inverse=True)
    vals, tol = _text_scores(strings, pairs_u // n_strings, pairs_u % n_strings, set(text_metrics))
    for m in text_metrics:
        full = np.full(n, np.nan)
        if rows.size:
            full[rows] = vals[m][inv.reshape(-1)]
        out[m] = full
    if compare is not None:
        out["_answer_changed"] = ~sequences_equal(tol, codes[compare[0]], codes[compare[1]])
    return out


def _mcq_values(
    pred: np.ndarray, ref: np.ndarray, options: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """MCQ correctness per row (NaN where the reference names no option) and whether the
    prediction had no recognisable letter."""
    n = len(pred)
    v = np.full(n, np.nan)
    opts = options if options is not None else np.full(n, None, dtype=object)
    no_opts = pd.isna(opts)
    # rows without options: the reference must be a bare letter (decided once per reference)
    ref_letter = map_unique(
        ref, lambda r: reference_letter(r, None) if isinstance(r, str) else None
    )
    rows = np.flatnonzero(no_opts & ~pd.isna(ref_letter))
    unparsed = np.zeros(n, dtype=bool)
    if rows.size:
        got = map_unique(
            pred[rows], lambda p: extract_letter(p, None) if isinstance(p, str) else None
        )
        v[rows] = (got == ref_letter[rows]).astype(np.float64)
        unparsed[rows] = pd.isna(got)
    for i in np.flatnonzero(~no_opts & ~pd.isna(ref)):
        letter = reference_letter(ref[i], opts[i])
        if letter is not None:
            said = extract_letter(pred[i], opts[i])
            v[i] = float(said == letter)
            unparsed[i] = said is None
    return v, unparsed


_BOX_METRICS: dict[str, Callable[[Any, Any], float]] = {
    "box_iou": union_box_iou,
    "box_miou": matched_mean_iou,
    "box_hit50": hit_rate,
}


def _box_values(
    pred: np.ndarray, ref_boxes: np.ndarray, box_metrics: Sequence[str]
) -> dict[str, np.ndarray]:
    """Box metrics of the boxes parsed from each prediction against the reference boxes."""
    vals = {m: np.full(len(pred), np.nan) for m in box_metrics}
    pred_boxes = map_unique(pred, lambda p: parse_boxes(p) if isinstance(p, str) else [])
    for i in np.flatnonzero(~pd.isna(ref_boxes)):
        for m in box_metrics:
            vals[m][i] = _BOX_METRICS[m](pred_boxes[i], ref_boxes[i])
    return vals


def _judge_values(
    n: int, judge: np.ndarray | None, question_class: np.ndarray | None
) -> np.ndarray:
    """Judge score per row: the mean over the row's question classes the judge scored (all
    its scores when the row has no class)."""
    v = np.full(n, np.nan)
    if judge is None:
        return v
    for i in np.flatnonzero(~pd.isna(judge)):
        by_class = judge[i]
        if not by_class:
            continue
        classes = question_class[i] if question_class is not None else ()
        scores = (
            [by_class[c] for c in classes if c in by_class] if classes else list(by_class.values())
        )
        if scores:
            v[i] = float(np.mean(scores))
    return v


def _reference_boxes(ref: np.ndarray, ref_boxes: np.ndarray | None) -> np.ndarray:
    """Per row its reference boxes (a non-empty list) or None: ``ref_boxes`` where given, else
    the loc tags of the reference text."""
    from_text = map_unique(
        ref, lambda r: (parse_boxes(r) or None) if isinstance(r, str) and "<loc_" in r else None
    )
    if ref_boxes is None:
        return from_text
    given = np.fromiter((bool(b) for b in ref_boxes), dtype=bool, count=len(ref_boxes))
    out = from_text.copy()
    out[given] = obj_array([[sort_corners(b) for b in ref_boxes[i]] for i in np.flatnonzero(given)])
    return out


def _answer_f1(pred: np.ndarray, ref: np.ndarray, rows_mask: np.ndarray) -> np.ndarray:
    """Token F1 of ``pred`` vs ``ref`` with loc tags removed, on ``rows_mask`` (NaN elsewhere)."""
    v = np.full(len(pred), np.nan)
    rows = np.flatnonzero(rows_mask)
    if not rows.size:
        return v
    strings, codes = _factorize_strings(np.concatenate([pred[rows], ref[rows]]))
    stripped = obj_array([strip_loc_tags(x) if isinstance(x, str) else "" for x in strings])
    k, ns = rows.size, max(len(strings), 1)
    pairs_u, inv = np.unique(codes[:k] * ns + codes[k:], return_inverse=True)
    vals, _ = _text_scores(stripped, pairs_u // ns, pairs_u % ns, {"token_f1"})
    v[rows] = vals["token_f1"][inv.reshape(-1)]
    return v


def judge_class_scores(judge: np.ndarray, question_class: np.ndarray) -> list[dict[str, float]]:
    """Per row, the judge score of each of its question classes that was scored."""
    out: list[dict[str, float]] = []
    if pd.isna(judge).all():
        return [{} for _ in range(len(judge))]
    for d, classes in zip(judge, question_class, strict=True):
        if not d:
            out.append({})
            continue
        out.append({c: d[c] for c in classes if c in d} if classes else dict(d))
    return out


# ----------------------------------------------------------------------------- corpus metrics


def _sacre(name: str) -> Any:
    from sacrebleu.metrics import BLEU, CHRF

    if name == "bleu":
        return BLEU(tokenize="13a", smooth_method="none", force=True)
    if name == "chrf":
        return CHRF(char_order=6, word_order=0, beta=2)
    if name == "chrf++":
        return CHRF(char_order=6, word_order=2, beta=2)
    raise KeyError(name)


def corpus_stats(pred: np.ndarray, ref: np.ndarray, name: str) -> np.ndarray:
    """Per-row sacrebleu sufficient statistics of corpus metric ``name`` (int64, n x width).

    Rows without a reference get zeros (they add nothing to any corpus). Statistics are computed
    once per unique (prediction, reference) pair and reference n-grams once per unique reference,
    with sacrebleu's own segment-statistics code.
    """
    spec = METRICS[name]
    n = len(pred)
    out = np.zeros((n, spec.stats_width), dtype=np.int64)
    rows = np.flatnonzero(~pd.isna(ref))
    if rows.size == 0:
        return out
    metric = _sacre(name)
    up, ur, inv = _unique_pairs(pred[rows], ref[rows])
    ref_info: dict[str, Any] = {}
    stats = np.zeros((len(up), spec.stats_width), dtype=np.int64)
    for k, (p, r) in enumerate(zip(up, ur, strict=True)):
        info = ref_info.get(r)
        if info is None:
            info = metric._extract_reference_info([metric._preprocess_segment(r)])
            ref_info[r] = info
        stats[k] = metric._compute_segment_statistics(metric._preprocess_segment(p), info)
    out[rows] = stats[inv]
    return out


def corpus_score(name: str, stats: np.ndarray) -> np.ndarray:
    """Corpus score(s) in [0, 1] from summed statistics of shape (..., width); vectorised.

    Matches sacrebleu's ``_compute_score_from_stats`` (/100) for BLEU without smoothing and chrF.
    """
    s = np.asarray(stats, dtype=np.float64)
    if name == "bleu":
        sys_len, ref_len = s[..., 0], s[..., 1]
        correct, total = s[..., 2:6], s[..., 6:10]
        with np.errstate(divide="ignore", invalid="ignore"):
            bp = np.where(sys_len < ref_len, np.exp(1 - ref_len / sys_len), 1.0)
            bp = np.where((sys_len < ref_len) & (sys_len <= 0), 0.0, bp)
            prec = 100.0 * correct / total
            logs = np.log(np.where(correct > 0, prec, 1.0))
        ok = np.all(correct > 0, axis=-1)
        score = bp * np.exp(logs.sum(axis=-1) / 4)
        return np.where(ok, score, 0.0) / 100.0
    if name in ("chrf", "chrf++"):
        order = 6 + (2 if name == "chrf++" else 0)
        factor = 4.0  # beta = 2
        eps = 1e-16
        trip = s.reshape(*s.shape[:-1], order, 3)
        n_hyp, n_ref, n_match = trip[..., 0], trip[..., 1], trip[..., 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            prec = np.where(n_hyp > 0, n_match / n_hyp, eps)
            rec = np.where(n_ref > 0, n_match / n_ref, eps)
        eff = (n_hyp > 0) & (n_ref > 0)
        k = eff.sum(axis=-1)
        avg_p = np.where(eff, prec, 0.0).sum(axis=-1)
        avg_r = np.where(eff, rec, 0.0).sum(axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            avg_p = np.where(k > 0, avg_p / k, 0.0)
            avg_r = np.where(k > 0, avg_r / k, 0.0)
            f = (1 + factor) * avg_p * avg_r / (factor * avg_p + avg_r)
        return np.where(avg_p + avg_r > 0, 100 * f, 0.0) / 100.0
    raise KeyError(name)
