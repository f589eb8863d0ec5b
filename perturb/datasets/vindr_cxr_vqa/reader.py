"""The scorer's reader of VinDr-CXR-VQA prediction files of image objects (``{"image_id",
"vqa": [items]}``): one row per question item (a :data:`PredictionReader` of the registry
entry's ``prediction_readers``). Torch-free."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from perturb.datasets._entry import PredictionRows
from perturb.datasets.vindr_cxr_vqa.predictions import explode_items, nested_item_column


def read_image_objects(
    raw: pd.DataFrame, aliases: Mapping[str, tuple[str, ...]]
) -> PredictionRows | None:
    """Image objects exploded into their question items (``qa_idx``: the item's index, the
    dataset's own question identity); None when the rows are flat. The item rows still name
    no dataset: their ``type`` and ``gt_location`` columns mark them radiology rows."""
    del aliases  # the nested item list alone marks the format
    column = nested_item_column(raw)
    if column is None:
        return None
    rows, note = explode_items(raw, column)
    return PredictionRows(rows=rows, format="vindr-nested", notes=(note,), loc_word="image.item")
