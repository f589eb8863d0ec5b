"""Object-array helpers of the scorer's tables: values kept as Python objects, a function
mapped once per distinct value."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd


def obj_array(values: Iterable[Any]) -> np.ndarray:
    """1-D object array holding ``values`` as they are (tuples and lists stay elements)."""
    items = values if isinstance(values, list) else list(values)
    return pd.Series(items, dtype=object).to_numpy() if items else np.empty(0, dtype=object)


def object_frame(columns: Mapping[str, Any]) -> pd.DataFrame:
    """DataFrame whose object-array columns stay Python objects (no string-dtype conversion)."""
    return pd.DataFrame(
        {
            k: pd.Series(v, dtype=object) if isinstance(v, np.ndarray) and v.dtype == object else v
            for k, v in columns.items()
        }
    )


def map_unique(arr: np.ndarray, fn: Callable[[Any], Any]) -> np.ndarray:
    """``fn`` applied once per distinct value of a column of strings/None (NA -> ``fn(None)``)."""
    codes, uniq = pd.factorize(arr, use_na_sentinel=True)
    mapped = obj_array([fn(u) for u in uniq] + [fn(None) if (codes < 0).any() else None])
    return mapped[np.where(codes < 0, len(uniq), codes)]


def all_text(arr: np.ndarray) -> bool:
    return pd.api.types.infer_dtype(arr, skipna=True) in ("string", "empty")
