"""The example room's input adapter: ``questions.json`` beside the frames -> image-level rows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from perturb.datasets._adapter import IMAGE_PATH, build_input, image_root, sample_columns
from perturb.io.datasets import DatasetError, InputDataset

REQUIRED = ("qid", "image", "question", "answer", "question_class")
ANSWER_FIELDS = ("answer",)  # the reference: left out of the rows (it would leak)


def open_example(
    source: str | os.PathLike[str] | None = None,
    *,
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    keep_leaking_fields: bool = False,
    min_visible: float = 0.5,
) -> InputDataset:
    """Rows of ``source``/questions.json, one per question, keyed by the frame's stem."""
    if source is None:
        raise DatasetError("example-capsule: pass the folder holding questions.json (--dataset)")
    folder = Path(source)
    path = folder / "questions.json"
    try:
        records: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not a readable questions file: {exc}") from None
    root = image_root(images, folder, "example-capsule")
    rows = []
    for rec in records:
        missing = [f for f in REQUIRED if f not in rec]
        if missing:
            raise DatasetError(f"{path}: question {rec.get('qid')!r} lacks {', '.join(missing)}")
        img_id = Path(rec["image"]).stem
        row = {**sample_columns(img_id, img_id, 0, 1), IMAGE_PATH: str(root / rec["image"])}
        row |= {"qid": rec["qid"], "question": rec["question"]}
        row["question_class"] = list(rec["question_class"])
        if keep_leaking_fields:
            row |= {f: rec[f] for f in ANSWER_FIELDS}
        rows.append(row)
    return build_input(
        rows, label=f"example-capsule {path}", fingerprint=f"example-capsule:{path}", base_dir=root
    )
