"""What a scoring run produced (:class:`ScoreResult`) and its deterministic JSON text."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class ScoreResult:
    """Everything ``score_runs`` produced.

    ``scores`` is the content of scores.json; ``pairs`` the paired table of each model with
    per-pair metric columns (``<metric>_clean`` / ``<metric>_perturbed``); ``exit_code`` is 0 when
    every input row was scored and 1 when rows were dropped (counted in ``problems``).
    """

    scores: dict[str, Any]
    pairs: dict[str, pd.DataFrame]
    problems: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 ok, 1 problems found (rows dropped)."""
        return 1 if self.problems else 0

    def to_json(self) -> str:
        """scores.json text (sorted keys, 2-space indent)."""
        return dumps(self.scores)


def dumps(obj: Any) -> str:
    """Deterministic JSON text (NaN -> null)."""
    return (
        json.dumps(clean_json(obj), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
        + "\n"
    )


def clean_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, Path):
        return obj.as_posix()
    return obj
