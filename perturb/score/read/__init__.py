"""Read: a prediction source becomes flat raw rows (:class:`RawTable`), one per question.

Formats, each read by its own module, applied in this order:

* files and in-memory tables (:mod:`.files`): JSON lines, JSON (a list of rows, ``{"rows":
  [...]}``, one image object, or ReXVQA-style rows keyed by question id), CSV/TSV, parquet,
  a Hugging Face ``save_to_disk`` folder, a DataFrame, a list of dicts;
* tools' formats: ms-swift inference records (:mod:`.swift`); Kvasir-VQA-x1 LLM-judge
  ``*_eval.json`` rows (``eval_json`` {aspect: {score, reason}}, read as plain rows, tagged);
* datasets' own formats, found through the dataset registry: every entry's
  ``prediction_readers`` in registry order (VinDr-CXR-VQA image objects, MedThinkVQA
  ``image_NN_path`` slots; each lives in its dataset's room).

What the rows mean is the canonicaliser's job (:mod:`perturb.score.canonical`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from perturb.datasets import DATASETS
from perturb.datasets._entry import PredictionReader
from perturb.errors import InputError
from perturb.score.columns import ALIASES
from perturb.score.read.files import load_raw
from perturb.score.read.report import PredictionSource, ReadReport
from perturb.score.read.swift import swift_columns

__all__ = ["PredictionSource", "RawTable", "ReadReport", "read_table"]


@dataclass
class RawTable:
    """One source's rows as its readers left them, before canonicalisation."""

    rows: pd.DataFrame
    report: ReadReport  # filled on: format, notes, then counts by the canonicaliser
    dataset: str | None = None  # the dataset a format named (its question rules apply)


def read_table(source: PredictionSource, label: str | None = None) -> RawTable:
    """Load ``source`` and unwrap tool and dataset formats into flat rows."""
    raw, fmt, label = load_raw(source, label)
    report = ReadReport(source=label, format=fmt, loc_word="line" if fmt == "jsonl" else "row")
    if len(raw) == 0:
        raise InputError(f"{label}: no rows. Point to a file that holds predictions.")
    table = RawTable(_tool_rows(raw, report), report)
    for reader in dataset_readers():
        got = reader(table.rows, ALIASES)
        if got is None:
            continue
        table.rows = got.rows
        report.format = f"{report.format}:{got.format}"
        report.notes.extend(got.notes)
        if got.loc_word is not None:
            report.loc_word = got.loc_word
        if got.dataset is not None:
            table.dataset = got.dataset
    return table


def _tool_rows(raw: pd.DataFrame, report: ReadReport) -> pd.DataFrame:
    """ms-swift records as flat rows; LLM-judge rows tagged (they are flat already)."""
    if "messages" in raw.columns:
        report.format = f"{report.format}:ms-swift"
        return swift_columns(raw, report)
    if "eval_json" in raw.columns:
        report.format = f"{report.format}:llm-judge"
    return raw


def dataset_readers() -> tuple[PredictionReader, ...]:
    """Every dataset's prediction readers, in registry order (asked on each read: the
    registry is the only place a dataset's format is named)."""
    return tuple(reader for _, entry in DATASETS.items() for reader in entry.readers())
