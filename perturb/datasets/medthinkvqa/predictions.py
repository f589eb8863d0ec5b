"""MedThinkVQA prediction rows and official submissions: ``image_NN_path`` slots, an options
dict and ``correct_answer``; the case is the sample and the question. Torch-free (the scorer's
reader calls it)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import pandas as pd

from perturb.datasets.radiology import sample_of_image_paths

SLOT = re.compile(r"^image_(\d{2})_path$", re.IGNORECASE)
QUESTION = "What is the most likely diagnosis?"
_PATH_COLUMNS = {"image_path", "images", "imagepath", "image_paths"}


def slot_columns(columns: Any) -> list[str]:
    """The ``image_NN_path`` columns of a table, sorted (none: not MedThinkVQA rows)."""
    return sorted(c for c in columns if isinstance(c, str) and SLOT.match(c))


def medthink_columns(
    df: pd.DataFrame,
    slots: list[str],
    *,
    has_id: bool,
    has_question_id: bool,
    has_question: bool,
) -> tuple[pd.DataFrame, list[str]]:
    """MedThinkVQA rows (``image_NN_path`` slots) in the reader's terms, and notes.

    image_path = the list of the row's image paths; img_id and question_id = the case folder
    (``images/caseXXXXX/<id>.jpg`` -> ``caseXXXXX``) unless the row names them (``has_id``:
    an image id or sample column, ``has_question_id``); question = the set's task
    (:data:`QUESTION`) unless a question column exists (``has_question``).
    """
    out = df.copy()
    notes: list[str] = []
    paths = [
        [p for p in row if isinstance(p, str) and p.strip()]
        for row in df[slots].to_numpy(dtype=object)
    ]
    cols = {c.lower() for c in df.columns if isinstance(c, str)}
    if not cols & _PATH_COLUMNS:
        out["image_paths"] = pd.Series(paths, dtype=object, index=df.index)
    title_col = next((c for c in df.columns if isinstance(c, str) and c.lower() == "title"), None)
    titles = df[title_col].tolist() if title_col is not None else [None] * len(df)
    case = [case_of(p, t) for p, t in zip(paths, titles, strict=True)]
    if not has_id:
        out["sample_key"] = case  # a sample, not a manifest image (whose id is caseN_<image>)
    if not has_question_id:
        out["question_id"] = case
    if not has_question:
        out["question"] = QUESTION
        notes.append(f"MedThinkVQA rows: question = {QUESTION!r}, paired by case")
    return out.drop(columns=slots), notes


def case_of(paths: list[str], title: Any) -> str | None:
    """A MedThinkVQA case id: the case every image path names (``images/caseN/<id>.jpg``, or a
    generated ``caseN_<id>`` file: any of the case's images may be the perturbed one), else
    the title ("Case number N"), else the first image's folder."""
    sample = sample_of_image_paths(paths) if paths else None
    if sample is not None:
        return sample
    digits = re.findall(r"\d+", title) if isinstance(title, str) else []
    if digits:
        return f"case{digits[0]}"
    return PurePosixPath(paths[0].replace("\\", "/")).parent.name if paths else None
