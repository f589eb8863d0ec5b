"""``--dataset``: join predictions to the dataset's complexity and question classes.

Upstream's own prediction files (ms-swift JSONL, ``*_eval.json``) may lack ``complexity`` and
``question_class``; upstream merges them with the dataset. This does the same with the readers
``perturb generate`` uses (:func:`perturb.io.datasets.open_input`: hub id, ``save_to_disk``
folder, parquet/JSONL), matching rows on (img_id, question) with the question compared in its
pairing form (``<image>`` tags removed, whitespace collapsed). Values already in a prediction
file are kept. The dataset's images also give the clean thumbnails of the flip gallery.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perturb.errors import InputError
from perturb.score.arrays import obj_array
from perturb.score.cells import question_key


@dataclass
class DatasetInfo:
    """(img_id, question key) -> complexity and question classes; img_id -> image row."""

    source: str
    table: pd.DataFrame  # index (img_id, qkey); columns complexity, question_class
    image_rows: dict[str, int]
    _input: Any

    def image_bytes(self, img_id: str) -> tuple[bytes, str] | None:
        """Encoded bytes of the dataset image of ``img_id`` and a file suffix, or None."""
        row = self.image_rows.get(str(img_id))
        if row is None or not self._input.image_column:
            return None
        cell = self._input._cell(row)
        data: bytes | None = None
        suffix = ".jpg"
        if isinstance(cell, dict):
            data = cell.get("bytes")
            path = cell.get("path")
            if path:
                suffix = Path(str(path)).suffix or suffix
                if data is None:
                    base = self._input.base_dir
                    p = Path(str(path)) if base is None else Path(base) / str(path)
                    data = p.read_bytes() if p.is_file() else None
        elif isinstance(cell, (bytes, bytearray)):
            data = bytes(cell)
        elif isinstance(cell, str):
            base = self._input.base_dir
            p = Path(cell) if base is None else Path(base) / cell
            suffix = p.suffix or suffix
            data = p.read_bytes() if p.is_file() else None
        return (data, suffix) if data else None


def load_dataset_info(source: str, split: str | None = None) -> DatasetInfo:
    """Open ``source`` and index its (img_id, question) rows."""
    from perturb.io.datasets import DatasetError, open_input

    try:
        inp = open_input(source, split)
    except DatasetError as exc:
        if "no image column" not in str(exc):
            raise InputError(f"--dataset {exc}") from None
        inp = _without_images(source, split)  # the join needs no images; thumbnails then none
    cols = inp.columns
    if "question" not in cols:
        raise InputError(
            f"--dataset {source}: no 'question' column (columns: {', '.join(cols)}); the join "
            "needs img_id and question"
        )
    ids = inp.row_ids() if inp.image_column else _ids(inp)
    ds = inp.ds
    questions = list(ds["question"])
    comp = list(ds["complexity"]) if "complexity" in cols else [None] * len(ids)
    qc = list(ds["question_class"]) if "question_class" in cols else [None] * len(ids)
    df = pd.DataFrame(
        {
            "img_id": [str(i) if i is not None else None for i in ids],
            "qkey": [question_key(q) if isinstance(q, str) else None for q in questions],
            "complexity": pd.array(
                [int(c) if c is not None and str(c).strip() != "" else None for c in comp],
                dtype="Int64",
            ),
            "question_class": obj_array([_classes(v) for v in qc]),
        }
    )
    image_rows: dict[str, int] = {}
    for i, iid in enumerate(df["img_id"]):
        if iid is not None and iid not in image_rows:
            image_rows[iid] = i
    df = df.dropna(subset=["img_id", "qkey"]).drop_duplicates(["img_id", "qkey"], keep="first")
    return DatasetInfo(inp.source, df.set_index(["img_id", "qkey"]), image_rows, inp)


def _without_images(source: str, split: str | None) -> Any:
    """An ``InputDataset`` over a dataset without an image column (the join needs none)."""
    from perturb.io.datasets import DatasetError, InputDataset, _quiet, load_table

    try:
        with _quiet():
            ds, label, fingerprint, base_dir = load_table(source, split)
    except DatasetError as exc:
        raise InputError(f"--dataset {exc}") from None
    ids = "img_id" if "img_id" in ds.column_names else None
    return InputDataset(ds, "", ids, label, fingerprint, base_dir)


def _ids(inp: Any) -> list[str | None]:
    if inp.id_column is None:
        raise InputError(f"--dataset {inp.source}: no img_id column and no images to derive it")
    return [None if v is None or str(v) == "" else str(v) for v in inp.ds[inp.id_column]]


def _classes(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        import json

        s = v.strip()
        if s.startswith("["):
            try:
                return tuple(str(x) for x in json.loads(s))
            except json.JSONDecodeError:
                pass
        return tuple(x.strip() for x in s.split(",") if x.strip())
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(str(x) for x in v)
    return (str(v),)


def join_dataset(df: pd.DataFrame, info: DatasetInfo) -> tuple[pd.DataFrame, dict[str, int]]:
    """Fill missing ``complexity`` / empty ``question_class`` of prediction rows from the dataset.

    Returns the filled table and counts: rows matched, unmatched, values filled.
    """
    keys = pd.MultiIndex.from_arrays(
        [df["img_id"].astype(object).to_numpy(), df["qkey"].astype(object).to_numpy()]
    )
    pos = info.table.index.get_indexer(keys)
    hit = pos >= 0
    out = df.copy()
    comp_missing = out["complexity"].isna().to_numpy()
    fill_c = hit & comp_missing
    comp = out["complexity"].astype("Int64").to_numpy(dtype=object, na_value=None)
    dcomp = info.table["complexity"].to_numpy(dtype=object, na_value=None)
    comp[fill_c] = dcomp[pos[fill_c]]
    out["complexity"] = pd.array(comp, dtype="Int64")
    qcls = out["question_class"].to_numpy(dtype=object).copy()
    empty = np.fromiter((not q for q in qcls), dtype=bool, count=len(qcls))
    dq = info.table["question_class"].to_numpy(dtype=object)
    fill_q = hit & empty
    for i in np.flatnonzero(fill_q):
        qcls[i] = dq[pos[i]]
    out["question_class"] = qcls
    stats = {
        "rows": len(df),
        "matched": int(hit.sum()),
        "unmatched": int((~hit).sum()),
        "complexity_filled": int(sum(1 for i in np.flatnonzero(fill_c) if comp[i] is not None)),
        "question_class_filled": int(sum(1 for i in np.flatnonzero(fill_q) if qcls[i])),
    }
    return out, stats
