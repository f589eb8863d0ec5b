"""MedThinkVQA (HF ``bio-nlp-umass/MedThinkVQA``): multi-image, multi-modality diagnosis MCQ.

Upstream schema: parquet (``train.parquet``, ``test.parquet``) or JSON Lines, one row per case
with ``title`` ("Case number N"), ``CLINICAL_HISTORY``, ``image_count``, ``options`` (dict
A-E), ``correct_answer`` (a letter) and per image ``image_NN_{id,path,caption,modality,
sub_modality}`` for NN = 01..49, paths like ``images/caseN/<id>.jpg``; modalities CT, MRI,
X-ray, US, pathology, photo, endoscopy, ...

One case is one sample. Rows are image-level: one per (case, image), with ``img_id`` =
``<case>_<image id>``, ``sample_key`` = the case (``caseN``), ``view`` / ``n_views``,
``image_modality`` / ``image_sub_modality`` as given and ``modality`` normalised to the
catalog's names (unknown labels become ``any``: generic ops only), so a suite with
``modality: from_image`` gives each image ops of its own modality. Scalar parameters are drawn
per case, pixel fields per image (as for ReXVQA studies).

Fields that give the answer away are left out unless ``keep_leaking_fields`` is set: the image
captions and every case field about findings, summaries, diagnoses, discussion or reasoning.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import datasets

from perturb.datasets._adapter import (
    IMAGE_PATH,
    MODALITY,
    build_input,
    check_found,
    find_image,
    image_root,
    kept_fields,
    locate,
    normalize_modality,
    pick_files,
    sample_columns,
)
from perturb.datasets.medthinkvqa import HUB_ID
from perturb.io.datasets import DEFAULT_SPLIT, DatasetError, InputDataset, _local_cache_kw, _quiet

MAX_IMAGES = 49
IMAGE_FIELD = re.compile(r"^image_(\d{2})_(.+)$")
LEAKING = (
    r"caption",
    r"finding",
    r"summary",
    r"diagnos",
    r"discussion",
    r"ddx",
    r"rationale",
    r"reason",
    r"explanation",
    r"impression",
    r"twi",
    r"icd",  # ICD Category / ICD Block name the diagnosis
    r"answer_text|answer_idx|label",
)
REQUIRED = ("options", "correct_answer")
# the fields that hold the answer: the scorer's reference, never part of a prompt (every other
# text field of the adapter's rows is free of the answer: tests/io/test_adapter_leaks.py)
ANSWER_FIELDS = ("correct_answer",)


def _load_cases(
    source: str | os.PathLike[str] | None, split: str | None
) -> tuple[datasets.Dataset, Path | None, str, str]:
    """The case table, the folder image paths start from (None for the hub), a fingerprint
    part and the file(s) read: the hub's folder holds each split as both parquet and JSON
    Lines, and the parquet file is read (the other named as skipped)."""
    label = str(source or HUB_ID)
    local = locate(source, HUB_ID, ["*.parquet", "*.jsonl"])  # the path, or a hub snapshot
    try:
        with _quiet():
            files = pick_files(local, (".parquet", ".jsonl"), split, label)
            parquet = [f for f in files if f.suffix.lower() == ".parquet"]
            skipped = [f for f in files if f.suffix.lower() != ".parquet"] if parquet else []
            files = parquet or files
            builder = "parquet" if files[0].suffix.lower() == ".parquet" else "json"
            ds = datasets.load_dataset(
                builder, data_files=[str(f) for f in files], split="train", **_local_cache_kw(None, builder)
            )
    except DatasetError:
        raise
    except Exception as exc:  # datasets raises many types
        raise DatasetError(f"{label}: cannot load: {type(exc).__name__}: {exc}") from None
    base = local if local.is_dir() else local.parent
    read = ", ".join(f.name for f in files)
    if skipped:
        read += f"; {', '.join(f.name for f in skipped)} not read: the same split"
    return ds, base, f"{local.resolve()}:{split or DEFAULT_SPLIT}", read


def case_id(case: dict[str, Any], index: int) -> str:
    """``caseN`` from the image paths' folder, else from an id field or the title."""
    for n in range(1, MAX_IMAGES + 1):
        path = case.get(f"image_{n:02d}_path")
        if path:
            parent = Path(str(path)).parent.name
            if parent and parent != "images":
                return parent
            break
    for name in ("case_id", "id"):
        if case.get(name) not in (None, ""):
            return str(case[name])
    digits = re.findall(r"\d+", str(case.get("title") or ""))
    return f"case{digits[0]}" if digits else f"row{index}"


def open_medthinkvqa(
    source: str | os.PathLike[str] | None = None,
    *,
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    keep_leaking_fields: bool = False,
    min_visible: float = 0.5,
) -> InputDataset:
    """Open MedThinkVQA (``source``: hub id, folder or parquet/JSONL file; ``images``: the
    folder the ``image_NN_path`` entries start from, default the dataset's folder)."""
    del min_visible  # no boxes in MedThinkVQA
    ds, base, where, read = _load_cases(source, split)
    label = f"{source or HUB_ID} ({read})"
    missing = [f for f in REQUIRED if f not in ds.column_names]
    if missing or not any(IMAGE_FIELD.match(c) for c in ds.column_names):
        raise DatasetError(
            f"{label}: not in the MedThinkVQA schema: lacks {', '.join(missing) or 'image_NN_* fields'} "
            f"(columns: {', '.join(ds.column_names[:12])})"
        )
    root = image_root(images, base, label)
    rows: list[dict[str, Any]] = []
    wanted: dict[str, Path] = {}
    for index, case in enumerate(ds):
        key = case_id(case, index)
        kept = kept_fields(
            case,
            leaking=LEAKING,
            keep_leaking=keep_leaking_fields,
            skip=lambda name: IMAGE_FIELD.match(name) is not None,
            as_json=(list,),  # options stay a dict A-E
        )
        views = [
            n for n in range(1, MAX_IMAGES + 1) if case.get(f"image_{n:02d}_path") not in (None, "")
        ]
        for view, n in enumerate(views):
            field = {
                m.group(2): v
                for k, v in case.items()
                if (m := IMAGE_FIELD.match(k)) and int(m.group(1)) == n
            }
            target = find_image(root, str(field["path"]))
            image_id = str(field.get("id") or Path(str(field["path"])).stem)
            img_id = f"{key}_{image_id}"
            wanted[img_id] = target
            row = {
                "case_id": key,
                **kept,
                **sample_columns(img_id, key, view, len(views)),
                "image_id": image_id,
                "image_modality": field.get("modality"),
                "image_sub_modality": field.get("sub_modality"),
                MODALITY: normalize_modality(field.get("modality")),
                IMAGE_PATH: str(target),
            }
            if keep_leaking_fields:
                row["image_caption"] = field.get("caption")
            rows.append(row)
    check_found(wanted.values(), root, label)
    return build_input(
        rows,
        label=label,
        fingerprint=f"medthinkvqa:{where}:{root.resolve()}:{keep_leaking_fields}",
        base_dir=root,
        modality=True,
    )
