"""Helpers of the dataset rooms' native writers (``<room>/native.py``): the generated rows,
their own fields and the file names (see :mod:`perturb.datasets.native`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perturb.contracts.manifest import PERTURBATION_COLUMNS
from perturb.datasets._adapter import IMAGE_PATH, MODALITY, N_VIEWS, SAMPLE_KEY, VIEW
from perturb.io.datasets import DatasetError

# columns generate and the adapters add to a QA row: not part of the dataset's own records
_ADDED = {
    "img_id",
    SAMPLE_KEY,
    VIEW,
    N_VIEWS,
    MODALITY,
    IMAGE_PATH,
    "image_relpath",
    "image",
    *PERTURBATION_COLUMNS,
    "loc_flags",
    "loc_detail",
    "qa_idx",
    "orig_width",
    "orig_height",
    "case_id",
    "image_id",
    "image_modality",
    "image_sub_modality",
}


def generated_rows(out: Path) -> list[dict[str, Any]]:
    import datasets

    folder = out / "dataset"
    if not folder.is_dir():
        raise DatasetError(
            f"{out}: no dataset/ folder (run `perturb generate` with a dataset adapter)"
        )
    ds = datasets.load_from_disk(str(folder))
    if "image" in ds.column_names:
        ds = ds.remove_columns("image")
    return list(ds)


def split_name(op: str, severity: int, variant: int) -> str:
    return f"{op}_s{severity}_v{variant}"


def own_fields(row: dict[str, Any]) -> dict[str, Any]:
    own = {k: v for k, v in row.items() if k not in _ADDED}
    if isinstance(own.get("options"), str) and own["options"][:1] in "[{":
        own["options"] = json.loads(own["options"])  # the adapter stored dicts as JSON text
    return own


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
