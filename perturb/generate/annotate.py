"""Loc tags of the output dataset's QA rows moved with their image (``perturb.engine.annotations``).

For each output row whose op moved the geometry, every ``<loc_x1_y1_x2_y2>`` tag in the input's
annotation columns (VinDr-CXR-VQA: ``answer``, ``reason``, ``gt_location``) is rewritten with
the moved box in original-pixel coordinates, clipped to the frame. Photometric ops leave the
text as it is. Two columns are added:

* ``loc_flags``: JSON list of the flags of the row's tags (``outside``: the box left the frame;
  ``cut``: less than ``min_visible`` of it is left; ``untracked``: a composite output whose
  geometry is not tracked); ``[]`` when every box survived;
* ``loc_detail``: JSON list, one entry per tag, of ``{"column", "index", "box", "visible",
  "flags"}``.
"""

from __future__ import annotations

import json
from typing import Any

import datasets
import pyarrow as pa

from perturb.contracts.boxes import parse_loc_tags
from perturb.engine.annotations import is_geometric, transform_loc_text
from perturb.io.datasets import Annotations


def _size(row: dict[str, Any], ann: Annotations) -> tuple[float, float] | None:
    if ann.width_column is None or ann.height_column is None:
        return None
    w, h = row.get(ann.width_column), row.get(ann.height_column)
    return (float(w), float(h)) if w and h else None


def move_row(
    row: dict[str, Any], record: dict[str, Any], op: str, size: tuple[int, int], ann: Annotations
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The moved text of ``row``'s annotation columns and one detail entry per tag."""
    texts: dict[str, str] = {}
    detail: list[dict[str, Any]] = []
    composite = "composite" in record
    geometric = not composite and is_geometric(op)
    for column in ann.text_columns:
        text = row.get(column)
        if not isinstance(text, str) or not text:
            continue
        if geometric:
            moved, results = transform_loc_text(
                text, record, size, _size(row, ann), min_visible=ann.min_visible
            )
            texts[column] = moved
            detail += [
                {
                    "column": column,
                    "index": i,
                    "box": [round(v, 2) for v in r.box],
                    "visible": round(r.visible, 4),
                    "flags": list(r.flags),
                }
                for i, r in enumerate(results)
            ]
        else:
            flags = ["untracked"] if composite else []
            detail += [
                {"column": column, "index": i, "box": list(b), "visible": 1.0, "flags": flags}
                for i, b in enumerate(parse_loc_tags(text))
            ]
    return texts, detail


def move_annotations(
    joined: pa.Table, picked: pa.Table, ann: Annotations
) -> tuple[pa.Table, dict[str, datasets.Value]]:
    """``joined`` (input QA rows, one per output row of ``picked``, the manifest rows) with its
    annotation columns moved, plus ``loc_flags`` and ``loc_detail``; and the added features."""
    columns = [c for c in ann.text_columns if c in joined.column_names]
    extra = [c for c in (ann.width_column, ann.height_column) if c and c in joined.column_names]
    rows = joined.select(columns + extra).to_pylist()
    ops = picked.column("op").to_pylist()
    records = picked.column("record").to_pylist()
    widths = picked.column("width").to_pylist()
    heights = picked.column("height").to_pylist()
    new_text: dict[str, list[Any]] = {c: [r.get(c) for r in rows] for c in columns}
    flags_col, detail_col = [], []
    last: tuple[str | None, dict[str, Any]] = (None, {})
    for i, row in enumerate(rows):
        if records[i] != last[0]:  # an output's QA rows are consecutive: parse its record once
            last = (records[i], json.loads(records[i]))
        texts, detail = move_row(row, last[1], ops[i], (int(widths[i]), int(heights[i])), ann)
        for column, text in texts.items():
            new_text[column][i] = text
        flags = sorted({f for d in detail for f in d["flags"]})
        flags_col.append(json.dumps(flags))
        detail_col.append(json.dumps(detail))
    out = joined
    for column in columns:
        idx = out.column_names.index(column)
        out = out.set_column(idx, column, pa.array(new_text[column], type=pa.string()))
    out = out.append_column("loc_flags", pa.array(flags_col, type=pa.string()))
    out = out.append_column("loc_detail", pa.array(detail_col, type=pa.string()))
    features = {"loc_flags": datasets.Value("string"), "loc_detail": datasets.Value("string")}
    return out, features
