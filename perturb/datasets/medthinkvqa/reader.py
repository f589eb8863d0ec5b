"""The scorer's reader of MedThinkVQA prediction rows and official submissions
(``image_NN_path`` slots, an options dict, ``correct_answer``): the case is sample and question
(a :data:`PredictionReader` of the registry entry's ``prediction_readers``). Torch-free."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from perturb.datasets._entry import PredictionRows
from perturb.datasets.medthinkvqa.predictions import medthink_columns, slot_columns


def read_slot_rows(
    raw: pd.DataFrame, aliases: Mapping[str, tuple[str, ...]]
) -> PredictionRows | None:
    """Rows with ``image_NN_path`` slots in the scorer's terms (see
    :func:`~perturb.datasets.medthinkvqa.predictions.medthink_columns`), else None."""
    from perturb.datasets import medthinkvqa

    slots = slot_columns(raw.columns)
    if not slots:
        return None
    names = {c.lower() for c in raw.columns if isinstance(c, str)}
    rows, notes = medthink_columns(
        raw,
        slots,
        has_id=bool(names & (set(aliases["img_id"]) | set(aliases["sample"]))),
        has_question_id=bool(names & set(aliases["question_id"])),
        has_question=bool(names & set(aliases["question"])),
    )
    return PredictionRows(
        rows=rows, format="medthinkvqa", notes=tuple(notes), dataset=medthinkvqa.DATASET.name
    )
