"""The example room's own prediction format: JSON lines ``{"qid", "answer"}``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_predictions(path: str | Path) -> list[dict[str, Any]]:
    """One ``{"qid", "answer"}`` row per non-empty line of ``path``."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [
        {"qid": str(rec["qid"]), "answer": str(rec["answer"])}
        for rec in (json.loads(line) for line in lines if line.strip())
    ]
