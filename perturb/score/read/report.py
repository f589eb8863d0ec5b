"""What reading one prediction source found (:class:`ReadReport`) and what a source may be."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import pandas as pd

PredictionSource: TypeAlias = str | Path | pd.DataFrame | Sequence[Mapping[str, Any]]


@dataclass
class ReadReport:
    """What happened to the rows of one input: counts, drops with reasons, coercions."""

    source: str
    format: str
    rows_in: int = 0
    rows_kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    drop_examples: dict[str, list[str]] = field(default_factory=dict)
    coerced: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    loc_word: str = "row"

    def drop(self, reason: str, locs: Iterable[Any], what: str = "") -> None:
        """Count dropped rows and keep the first few locations as examples."""
        locs = list(locs)
        if not locs:
            return
        self.dropped[reason] += len(locs)
        ex = self.drop_examples.setdefault(reason, [])
        for loc in locs[: max(0, 3 - len(ex))]:
            ex.append(f"{self.source} {self.loc_word} {loc}{(': ' + what) if what else ''}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "source": self.source,
            "format": self.format,
            "rows_in": self.rows_in,
            "rows_kept": self.rows_kept,
            "dropped": dict(sorted(self.dropped.items())),
            "drop_examples": {k: v for k, v in sorted(self.drop_examples.items())},
            "coerced": dict(sorted(self.coerced.items())),
            "notes": list(self.notes),
        }
