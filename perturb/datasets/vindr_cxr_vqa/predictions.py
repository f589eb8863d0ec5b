"""VinDr-CXR-VQA prediction files of image objects (``{"image_id", "vqa": [items]}``): one row
per question item. Torch-free (the scorer's reader calls it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

ITEM_KEYS = ("vqa", "items", "qa_pairs", "questions")


def nested_item_column(raw: pd.DataFrame) -> str | None:
    """The column of per-image question lists, or None (flat rows)."""
    cols = {c.lower(): c for c in raw.columns if isinstance(c, str)}
    if "image_id" not in cols:
        return None
    for key in ITEM_KEYS:
        c = cols.get(key)
        if c is None:
            continue
        first = next((v for v in raw[c] if isinstance(v, (list, np.ndarray)) and len(v)), None)
        if first is not None and isinstance(first[0], Mapping):
            return c
    return None


def explode_items(raw: pd.DataFrame, column: str) -> tuple[pd.DataFrame, str]:
    """One row per question item, with its image's fields and ``qa_idx`` (the item's index in
    the image's list: the dataset's own question identity), and a note for the read report."""
    rows: list[dict[str, Any]] = []
    for rec in raw.to_dict("records"):
        items = rec.pop(column)
        rec.pop("num_questions", None)
        loc = rec.pop("_loc", None)
        if isinstance(items, np.ndarray):
            items = items.tolist()
        for idx, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, Mapping):
                rows.append({**rec, **item, "qa_idx": idx, "_loc": f"{loc}.{idx + 1}"})
    note = (
        f"VinDr-CXR-VQA image objects: {len(raw)} images, {len(rows)} question items "
        "(paired by image_id and item index)"
    )
    return pd.DataFrame(rows), note
