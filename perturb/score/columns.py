"""The canonical prediction table's columns and the raw column names each is read from.

Shared by the readers (a dataset's reader asks which columns a table carries) and the
canonicaliser (:mod:`perturb.score.canonical`).
"""

from __future__ import annotations

from collections.abc import Iterable

ALIASES: dict[str, tuple[str, ...]] = {
    # raw answers before extracted ones: the scorer reads the letter itself (score.answers)
    "prediction": (
        "prediction",
        "pred",
        "model_answer",
        "response",
        "model_response",
        "output",
        "predicted_answer",
        "final_answer",
    ),
    "reference": (
        "reference",
        "answer",
        "labels",
        "label",
        "ground_truth",
        "gt_answer",
        "gold",
        "target",
        "correct_answer",
    ),
    "img_id": ("img_id", "image_id", "case_id"),
    # the sample (bootstrap cluster) when no img_id names it: never matched to the manifest
    "sample": ("study_id", "studyinstanceuid", "sample_key"),
    "qa_idx": ("qa_idx", "item_index"),
    "error": ("error",),
    "question": ("question", "query", "prompt"),
    "question_id": ("question_id", "qid"),
    "image_path": (
        "image_path",
        "img_path",
        "image",
        "images",
        "imagepath",
        "image_paths",
        "path",
        "file_name",
    ),
    "ref_boxes": ("gt_location", "gt_locations", "gt_boxes", "ref_boxes", "reference_boxes"),
    "vindr_type": ("type",),
    "task_name": ("task_name",),
    "category": ("category",),
    "perturbation": ("perturbation", "op", "corruption"),
    "severity": ("severity",),
    "variant": ("variant",),
    "complexity": ("complexity",),
    "question_class": ("question_class", "question_classes"),
    "options": ("options", "choices"),
    "judge": ("eval_json",),
    "model": ("model",),
    "confidence": ("confidence", "logprobs"),
    "bleurt": ("bleurt",),
    "bertscore": ("bertscore", "bertscore_f1", "bert_score"),
}


REQUIRED_HELP = {
    "prediction": "the model's answer",
    "question": "the question text",
    "img_id": "the image id (or an image path whose file stem is the id)",
}


# columns that mark a radiology input: rows without question_class get radiology classes
RADIOLOGY_HINTS = ("ref_boxes", "vindr_type", "task_name", "category", "options")


def pick(columns: Iterable[str], name: str) -> str | None:
    cols = {c.lower(): c for c in columns if isinstance(c, str)}
    for alias in ALIASES[name]:
        if alias in cols:
            return cols[alias]
    return None
