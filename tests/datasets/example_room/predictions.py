"""The example room's own prediction format: rows ``{"capsule_id", "qid", "answer"}`` (a
capsule-endoscopy vendor's export), read by the scorer through the registry entry's
``prediction_readers`` like every dataset's own format."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from perturb.datasets._entry import PredictionRows


def read_predictions(
    raw: pd.DataFrame, aliases: Mapping[str, tuple[str, ...]]
) -> PredictionRows | None:
    """Rows carrying ``capsule_id`` as flat scorer rows (``img_id``, ``question_id``,
    ``answer``), else None (the rows are another format's)."""
    if "capsule_id" not in raw.columns:
        return None
    rows = pd.DataFrame(
        {
            "img_id": raw["capsule_id"].astype(str),
            "question_id": raw["qid"].astype(str),
            "answer": raw["answer"].astype(str),
        }
    )
    return PredictionRows(rows=rows, format="example-capsule", dataset="example-capsule")
