"""The canonicaliser: flat rows of any reader become the one canonical prediction table.

Canonical columns: ``img_id``, ``question``, ``qkey`` (whitespace-normalised question used for
pairing, or ``id:<question_id>`` when the rows carry a question id), ``qid`` (the dataset's own
question identity: question id, MedThinkVQA case, VinDr ``image_id#qa_idx``; None without),
``reference``, ``prediction``, ``complexity``, ``question_class`` (tuple of str; radiology rows
without one get the classes of :mod:`perturb.datasets.radiology`), ``options`` (dict letter ->
text or None), ``perturbation``, ``severity``, ``variant``, ``image_path`` (the first image),
``_paths`` (all of the row's image paths), ``judge`` (dict aspect -> 0/1 or None), ``model``,
``ref_boxes`` (reference boxes from ``gt_location`` or None), ``confidence``, ``bleurt``,
``bertscore``, ``_loc`` (1-based line or row number in the source, for messages) and
``_id_from_path`` (img_id derived from the image paths: a sample, not necessarily the
manifest's image). Raw columns are found by their aliases
(:data:`perturb.score.columns.ALIASES`). Without an id column a row with several images is
keyed by the study or case its paths name, else by its images' file stems
(:func:`perturb.score.cells.sample_id_of_paths`): the sample, not an image, is the unit. Rows
that cannot be used are dropped and counted with a reason in the
:class:`~perturb.score.read.ReadReport`; nothing is dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perturb.datasets.questions import question_classes
from perturb.datasets.radiology import QUESTION_CLASSES as RADIOLOGY_CLASSES
from perturb.errors import InputError
from perturb.score.arrays import all_text, map_unique, obj_array, object_frame
from perturb.score.cells import (
    as_text,
    boxes_of,
    class_tuple,
    int_column,
    judge_dict,
    options_dict,
    path_of,
    paths_of,
    question_key,
    sample_id_of_paths,
    variant_of_path,
)
from perturb.score.columns import ALIASES, RADIOLOGY_HINTS, REQUIRED_HELP, pick
from perturb.score.read import RawTable, ReadReport


def text_column(values: np.ndarray, rep: ReadReport, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Coerce a column to str/None; returns (values, invalid-mask).

    Numbers become their decimal text and booleans yes/no (counted in ``rep.coerced``); lists,
    dicts and other objects are invalid.
    """
    arr = np.asarray(values, dtype=object)
    invalid = np.zeros(len(arr), dtype=bool)
    if all_text(arr):
        out = arr.copy()
        out[pd.isna(arr)] = None
        return out, invalid
    out = np.empty(len(arr), dtype=object)
    kinds: Counter[str] = Counter()
    for i, v in enumerate(arr):
        if type(v) is str:
            out[i] = v
            continue
        t, kind = as_text(v)
        out[i] = t
        if kind == "invalid":
            invalid[i] = True
        elif kind:
            kinds[kind] += 1
    for kind, n in kinds.items():
        rep.coerced[f"{name}:{kind}_to_text"] += n
    return out, invalid


def _columns(raw: pd.DataFrame, rep: ReadReport) -> dict[str, str | None]:
    """Canonical name -> the raw column holding it; an InputError naming the fix when a
    required one is missing."""
    cols = {name: pick(raw.columns, name) for name in ALIASES}
    if cols["question"] is None and cols["question_id"] is not None:
        cols["question"] = cols["question_id"]  # an id-keyed MCQ set: the id stands for the text
        rep.notes.append("no question column: the question id stands for the question text")
    missing = [k for k in ("prediction", "question") if cols[k] is None]
    if not any(cols[k] for k in ("img_id", "image_path", "sample", "question_id")):
        missing.append("img_id")
    if missing:
        hints = "; ".join(
            f"{k} ({REQUIRED_HELP[k]}): one of {', '.join(ALIASES[k])}"
            + (" or an image path column" if k == "img_id" else "")
            for k in missing
        )
        raise InputError(
            f"{rep.source}: missing column(s) {', '.join(missing)}. Found columns "
            f"{sorted(str(c) for c in raw.columns if c != '_loc')[:15]}. Add or rename: {hints}."
        )
    if cols["reference"] is None:
        rep.notes.append("no reference-answer column; references must come from the other side")
    return cols


@dataclass
class _Rows:
    """A raw frame being canonicalised: its columns by canonical name and the rows dropped."""

    raw: pd.DataFrame
    cols: dict[str, str | None]
    rep: ReadReport
    locs: np.ndarray
    drop: np.ndarray

    @property
    def n(self) -> int:
        return len(self.raw)

    def col(self, name: str) -> np.ndarray:
        c = self.cols[name]
        if c is None:
            return np.full(self.n, None, dtype=object)
        return self.raw[c].to_numpy(dtype=object)

    def text(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return text_column(self.col(name), self.rep, name)

    def drop_rows(self, mask: np.ndarray, reason: str) -> None:
        mask = mask & ~self.drop
        self.rep.drop(reason, self.locs[mask].tolist())
        self.drop[mask] = True

    def parsed(self, name: str, fn: Callable[[Any], Any], empty: Any) -> np.ndarray:
        if not self.cols[name]:
            return obj_array([empty] * self.n)
        values = self.col(name)
        return map_unique(values, fn) if all_text(values) else obj_array([fn(v) for v in values])


def _drop_failed_inference(rows: _Rows, pred: np.ndarray) -> None:
    """Drop rows with an inference error and no answer (a judge's error keeps the row)."""
    if not rows.cols["error"]:
        return
    err = rows.col("error")
    failed = np.fromiter(
        (
            (isinstance(e, str) and bool(e.strip())) or (isinstance(e, dict) and bool(e))
            for e in err
        ),
        dtype=bool,
        count=rows.n,
    ) & pd.isna(pred)
    rep = rows.rep
    for i in np.flatnonzero(failed)[:3]:
        rep.drop_examples.setdefault("inference_error", []).append(
            f"{rep.source} {rep.loc_word} {rows.locs[i]}: {str(err[i])[:80]}"
        )
    failed &= ~rows.drop
    if failed.any():  # a zero count would read as a problem in the report
        rep.dropped["inference_error"] += int(failed.sum())
    rows.drop[failed] = True


def _image_ids(rows: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(img_id, first image path, every image path, img_id-not-given mask); rows without an
    id are dropped. Without an image id the sample is a study field (ReXVQA study_id /
    StudyInstanceUid), else the study or case the image paths name, else the question id
    (``_id_from_path``: this img_id names a sample, not a manifest image)."""
    raw_paths = rows.col("image_path")
    paths = (
        map_unique(raw_paths, path_of)
        if all_text(raw_paths)
        else obj_array([path_of(v) for v in raw_paths])
    )
    img, bad_img = rows.text("img_id")
    img = map_unique(img, lambda i: i.strip() if isinstance(i, str) and i.strip() else None)
    no_id = pd.isna(img)
    if rows.cols["sample"] and no_id.any():
        vals, _ = rows.text("sample")
        img[no_id] = vals[no_id]
    still = pd.isna(img)
    if still.any():
        from_paths = raw_paths[still]
        img[still] = (
            map_unique(from_paths, sample_id_of_paths)
            if all_text(from_paths)
            else obj_array([sample_id_of_paths(v) for v in from_paths])
        )
    still = pd.isna(img)
    if rows.cols["question_id"] and still.any():
        vals, _ = rows.text("question_id")
        img[still] = vals[still]
    rows.drop_rows(bad_img | pd.isna(img), "missing_img_id")
    all_paths = (
        obj_array([tuple(paths_of(v)) for v in raw_paths])
        if rows.cols["image_path"]
        else obj_array([()] * rows.n)
    )
    return img, paths, all_paths, no_id


def _ref_boxes(rows: _Rows) -> np.ndarray:
    """Reference boxes per row (None where a cell holds none or a malformed one, counted)."""
    if not rows.cols["ref_boxes"]:
        return obj_array([None] * rows.n)
    bad_boxes = 0
    rb = []
    for v in rows.col("ref_boxes"):
        try:
            rb.append(boxes_of(v))
        except ValueError:
            rb.append(None)
            bad_boxes += 1
    if bad_boxes:
        rows.rep.coerced["ref_boxes:malformed_ignored"] += bad_boxes
    return obj_array(rb)


def _judge_scores(rows: _Rows) -> np.ndarray:
    """LLM-judge aspect scores per row (None without); an invalid score is an InputError."""
    if not rows.cols["judge"]:
        return obj_array([None] * rows.n)
    jl = []
    for i, v in enumerate(rows.col("judge")):
        d, bad = judge_dict(v)
        if bad:
            raise InputError(
                f"{rows.rep.source}: row {i + 1}: LLM-judge score {', '.join(bad)} in eval_json "
                "is not a number in [0, 1]; fix or drop that row (scores are 0/1, or a fraction)"
            )
        jl.append(d)
    no_judge = int(sum(1 for d in jl if d is None))
    if no_judge:
        rows.rep.notes.append(f"{no_judge} rows without usable eval_json scores (judge metric n/a)")
    return obj_array(jl)


def _precomputed_scores(rows: _Rows) -> dict[str, np.ndarray]:
    """Confidence and precomputed BLEURT / BERTScore columns as floats (NaN where missing)."""
    out = {"confidence": np.full(rows.n, np.nan)}
    if rows.cols["confidence"]:
        from perturb.score.calibration import confidence_column

        out["confidence"] = confidence_column(rows.col("confidence"), rows.rep.source, rows.locs)
    for name in ("bleurt", "bertscore"):
        values = rows.col(name)
        v = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        bad = v.isna().to_numpy() & ~pd.isna(values)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"{rows.rep.source}: row {rows.locs[first]}: {name} value "
                f"{values[first]!r} is not a number"
            )
        out[name] = v.to_numpy(dtype=np.float64, na_value=np.nan)
    return out


def _question_ids(
    rows: _Rows, question: np.ndarray, img: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(pairing key, the dataset's own question identity): question id (ReXVQA key,
    MedThinkVQA case), else image id + item index (VinDr-CXR-VQA)."""
    qk = map_unique(question, lambda q: question_key(q) if q is not None else None)
    qid = np.full(rows.n, None, dtype=object)
    if rows.cols["question_id"]:
        qid, _ = rows.text("question_id")
        has_qid = ~pd.isna(qid)
        qk[has_qid] = obj_array([f"id:{q}" for q in qid[has_qid]])
    elif rows.cols["qa_idx"] and rows.cols["img_id"]:
        idx, bad_idx = int_column(rows.col("qa_idx"))
        ok_idx = ~np.isnan(idx) & ~bad_idx & ~pd.isna(img)
        qid[ok_idx] = obj_array(
            [f"{i}#{int(k)}" for i, k in zip(img[ok_idx], idx[ok_idx], strict=True)]
        )
    return qk, qid


def canonicalize(table: RawTable, model: str | None = None) -> pd.DataFrame:
    """Map a source's raw rows onto the canonical columns, coercing values and dropping
    unusable rows (counted in ``table.report``); ``model`` names the rows' model."""
    raw, rep, dataset = table.rows, table.report, table.dataset
    n = len(raw)
    rep.rows_in = n
    if n == 0:
        raise InputError(f"{rep.source}: no rows. Point to a file that holds predictions.")
    locs = raw["_loc"].to_numpy() if "_loc" in raw.columns else np.arange(1, n + 1)
    rows = _Rows(raw, _columns(raw, rep), rep, locs, np.zeros(n, dtype=bool))

    pred, bad_pred = rows.text("prediction")
    rows.drop_rows(bad_pred, "invalid_prediction_type")
    _drop_failed_inference(rows, pred)
    ref, bad_ref = rows.text("reference")
    rows.drop_rows(bad_ref, "invalid_reference_type")
    question, bad_q = rows.text("question")
    q_missing = map_unique(question, lambda q: q is None or not q.strip()).astype(bool)
    rows.drop_rows(bad_q | q_missing, "missing_question")
    img, paths, all_paths, no_id = _image_ids(rows)

    sev, bad_sev = int_column(rows.col("severity"))
    rows.drop_rows(bad_sev, "invalid_severity")
    var, bad_var = int_column(rows.col("variant"))
    rows.drop_rows(bad_var, "invalid_variant")
    var = _variants_from_paths(var, paths, rep)
    comp, bad_comp = int_column(rows.col("complexity"))
    if bad_comp.any():
        rep.coerced["complexity:invalid_to_missing"] += int(bad_comp.sum())
    pert, bad_pert = rows.text("perturbation")
    rows.drop_rows(bad_pert, "invalid_perturbation")
    mdl, _ = rows.text("model")
    if model is not None:
        mdl = np.full(n, model, dtype=object)

    qclass = rows.parsed("question_class", class_tuple, ())
    options = rows.parsed("options", options_dict, None)
    ref_boxes = _ref_boxes(rows)
    if _is_radiology(rows, dataset, ref):
        qclass = _radiology_classes(qclass, question, options, rows, dataset)
    judge = _judge_scores(rows)
    scores = _precomputed_scores(rows)
    qk, qid = _question_ids(rows, question, img)
    keep = ~rows.drop
    out = object_frame(
        {
            "img_id": img[keep],
            "question": question[keep],
            "qkey": qk[keep],
            "qid": qid[keep],
            "reference": ref[keep],
            "prediction": pred[keep],
            "complexity": pd.array(comp[keep], dtype="Int64") if n else comp,
            "question_class": qclass[keep],
            "options": options[keep],
            "perturbation": pert[keep],
            "severity": pd.array(sev[keep], dtype="Int64"),
            "variant": pd.array(var[keep], dtype="Int64"),
            "image_path": paths[keep],
            "_paths": all_paths[keep],
            "judge": judge[keep],
            "model": mdl[keep],
            "ref_boxes": ref_boxes[keep],
            "confidence": scores["confidence"][keep],
            "bleurt": scores["bleurt"][keep],
            "bertscore": scores["bertscore"][keep],
            "_loc": locs[keep],
            "_id_from_path": no_id[keep],
        }
    )
    rep.rows_kept = len(out)
    return out.reset_index(drop=True)


# the classes an MCQ's option texts may add: places an answer names (sides, regions)
OPTION_PLACE_CLASSES = frozenset({"laterality", "location", "apex", "costophrenic"})


def _variants_from_paths(var: np.ndarray, paths: np.ndarray, rep: ReadReport) -> np.ndarray:
    """Fill missing variants from ``variant_<k>/`` folders of the image paths (counted)."""
    missing = np.isnan(var)
    if not missing.any():
        return var
    found = map_unique(paths[missing], variant_of_path)
    got = ~pd.isna(found)
    if got.any():
        var = var.copy()
        idx = np.flatnonzero(missing)[got]
        var[idx] = found[got].astype(np.float64)
        rep.coerced["variant:from_variant_folder"] += int(got.sum())
    return var


def _is_radiology(rows: _Rows, dataset: str | None, ref: np.ndarray) -> bool:
    """Radiology rows (their question classes come from the radiology rules): a dataset named
    by the format, a radiology hint column, or references with ``<loc_...>`` tags."""
    if dataset is not None or any(rows.cols[h] for h in RADIOLOGY_HINTS):
        return True
    if not rows.cols["reference"]:
        return False
    return bool(map_unique(ref, lambda r: isinstance(r, str) and "<loc_" in r).any())


def _radiology_classes(
    qclass: np.ndarray,
    question: np.ndarray,
    options: np.ndarray,
    rows: _Rows,
    dataset: str | None,
) -> np.ndarray:
    """Rows without question_class get radiology classes (:mod:`perturb.datasets.questions`)
    from the dataset's fields (VinDr ``type``, ReXVQA ``task_name``/``category``) and keyword
    rules on the question. An MCQ's options add only the place classes
    (:data:`OPTION_PLACE_CLASSES`: a flip or crop changes an answer that names a side or
    region); a finding word inside an option ("Nodule") says what the answers are, not what
    the question asks, and puts no pair at risk."""
    need = np.fromiter((not c for c in qclass), dtype=bool, count=len(qclass))
    if not need.any():
        return qclass

    def text(name: str) -> np.ndarray:
        vals = rows.col(name)
        return obj_array([v if isinstance(v, str) else None for v in vals])

    vt, tn, cat = text("vindr_type"), text("task_name"), text("category")
    out = qclass.copy()
    cache: dict[tuple[Any, ...], tuple[str, ...]] = {}
    for i in np.flatnonzero(need):
        opts = options[i]
        key = (question[i], vt[i], tn[i], cat[i], tuple(opts.values()) if opts else None)
        got = cache.get(key)
        if got is None:
            got = question_classes(
                question[i],
                vindr_type=vt[i],
                task_name=tn[i],
                category=cat[i],
                dataset=dataset,
            )
            if opts:  # options add only the places an answer names, never their findings
                placed = set(got) | (set(question_classes(options=opts)) & OPTION_PLACE_CLASSES)
                got = tuple(c for c in RADIOLOGY_CLASSES if c in placed)
            cache[key] = got
        out[i] = got
    cols = rows.cols
    rows.rep.notes.append(
        f"{int(need.sum())} rows without question_class: radiology classes from "
        + ", ".join(
            [f"{cols[h]!r}" for h in ("vindr_type", "task_name", "category") if cols[h]]
            + [
                "keyword rules on the question, and the places named by the options "
                "(perturb.datasets.radiology)"
            ]
        )
    )
    return out
