"""ReXVQA (HF ``rajpurkarlab/ReXVQA``): chest X-ray MCQ over studies of several views.

Upstream schema: a JSON file per split, ``{question_id: {"question", "options" (list of
"A. ..." strings), "correct_answer" (a letter), "task_name", "category", "ImagePath" (list of
PNG paths, one per view, relative to the ReXGradient-160K image release), "Findings",
"Impression", ...}}``. The source may be that file, a folder holding it (a split is picked by
its file name, e.g. ``test_vqa_data.json``), or the hub id (downloaded with huggingface_hub).

One study is one sample. Rows are image-level: one per (question, view), with ``img_id`` the
view's image path (without suffix; the same image in several questions is perturbed once and
joined to each), ``sample_key`` the study (the ``study_id`` / ``StudyInstanceUid`` field when
present, else the ``.../studies/<uid>`` folder of the images, else the folder they share, else
the question id: the same for every question on the study, whichever views it uses), ``view`` and
``n_views``. The generator draws an op's scalar parameters from the sample key, so every view
of a study gets the same dose, window, rotation, ...; per-pixel fields (noise, grid phase) come
from each view's own img_id, so views never share a noise realisation (two exposures). A
question's outputs are its rows with the same (op, severity, variant): group them by
``question_id``.

``Findings`` and ``Impression`` (the report) and the answer explanation give the answer away:
they are left out unless ``keep_leaking_fields`` is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from perturb.datasets._adapter import (
    IMAGE_PATH,
    MODALITY,
    build_input,
    check_found,
    find_image,
    image_root,
    kept_fields,
    locate,
    pick_files,
    relative_image_path,
    sample_columns,
)
from perturb.datasets.radiology import study_folder
from perturb.datasets.rexvqa import HUB_ID
from perturb.io.datasets import DatasetError, InputDataset

LEAKING = (r"finding", r"impression", r"explanation", r"report")
STUDY_FIELDS = ("study_id", "StudyInstanceUid", "StudyInstanceUID", "study")
REQUIRED = ("question", "options", "correct_answer", "ImagePath")
# the fields that hold the answer: the scorer's reference, never part of a prompt (every other
# text field of the adapter's rows is free of the answer: tests/io/test_adapter_leaks.py)
ANSWER_FIELDS = ("correct_answer",)


def _records(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable JSON file: {exc}") from None
    if isinstance(data, list):  # a list of records with their id inside
        data = {str(r.get("question_id", i)): r for i, r in enumerate(data) if isinstance(r, dict)}
    if not isinstance(data, dict) or not data:
        raise DatasetError(f"{path}: not in the ReXVQA schema: expected {{question_id: {{...}}}}")
    for qid, rec in data.items():
        missing = [f for f in REQUIRED if not isinstance(rec, dict) or f not in rec]
        if missing:
            raise DatasetError(
                f"{path}: question {qid!r} lacks {', '.join(missing)}: not in the ReXVQA schema "
                f"({', '.join(REQUIRED)} per question)"
            )
    return data


def study_key(qid: str, rec: dict[str, Any]) -> str:
    """The study a question is about (see the module docstring): a study field, else the
    ``.../studies/<uid>`` folder of its images (DICOM-style layout), else the folder its images
    share, else the question id."""
    for name in STUDY_FIELDS:
        if rec.get(name):
            return str(rec[name])
    folders = set()
    for path in _paths(rec):
        parts = relative_image_path(path).split("/")
        i = study_folder(parts)  # the rule the scorer keys predictions by
        folders.add("/".join(parts[: i + 2] if i is not None else parts[:-1]))
    if len(folders) > 1:
        common = os.path.commonpath(sorted(folders))
        return common if common not in ("", ".") else qid
    folder = next(iter(folders), "")
    return folder or qid


def _paths(rec: dict[str, Any]) -> list[str]:
    value = rec.get("ImagePath")
    return [value] if isinstance(value, str) else [str(v) for v in (value or [])]


def open_rexvqa(
    source: str | os.PathLike[str] | None = None,
    *,
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    keep_leaking_fields: bool = False,
    min_visible: float = 0.5,
) -> InputDataset:
    """Open ReXVQA (``source``: hub id, folder or JSON file; ``images``: the folder the
    ImagePath entries start from, default the JSON file's folder)."""
    del min_visible  # no boxes in ReXVQA
    located = locate(source, HUB_ID, ["*.json", "**/*.json"])
    label = str(source or HUB_ID)
    files = pick_files(located, (".json",), split, label)
    root = image_root(images, files[0].parent, label)
    rows: list[dict[str, Any]] = []
    wanted: dict[str, Path] = {}
    for path in files:
        for qid, rec in _records(path).items():
            paths = _paths(rec)
            if not paths:
                raise DatasetError(f"{path}: question {qid!r} has an empty ImagePath list")
            kept = kept_fields(
                rec,
                leaking=LEAKING,
                keep_leaking=keep_leaking_fields,
                skip=lambda name: name == "ImagePath",
                as_json=(dict,),  # options stay a list of strings
            )
            key = study_key(qid, rec)
            for view, image in enumerate(paths):
                target = find_image(root, image)
                img_id = str(Path(relative_image_path(image)).with_suffix(""))
                wanted[img_id] = target
                rows.append(
                    {
                        "question_id": str(qid),
                        **kept,
                        **sample_columns(img_id, key, view, len(paths)),
                        MODALITY: "xray",
                        "image_relpath": image,
                        IMAGE_PATH: str(target),
                    }
                )
    check_found(wanted.values(), root, label)
    return build_input(
        rows,
        label=label,
        fingerprint=f"rexvqa:{Path(located).resolve()}:{split}:{root.resolve()}:{keep_leaking_fields}",
        base_dir=root,
    )
