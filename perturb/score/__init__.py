"""Paired clean-vs-perturbed scoring of medical VQA predictions (no torch).

>>> from perturb.report import write_reports
>>> from perturb.score import score_runs
>>> result = score_runs(
...     clean="clean.jsonl", perturbed=["blur.jsonl"], out_dir="out", report_writer=write_reports
... )  # doctest: +SKIP
>>> result.scores["models"]["model"]["overall"]["metrics"]["rougeL"]["delta"]  # doctest: +SKIP

See :func:`perturb.score.api.score_runs`; the CLI is ``perturb score``. Scoring never imports
:mod:`perturb.report` (report depends on score); the reports are written through ``report_writer``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from perturb.errors import InputError
    from perturb.score.api import ScoreResult, score_runs, write_outputs
    from perturb.score.metrics import DEFAULT_METRICS, METRICS, PRESETS
    from perturb.score.readers import read_predictions
    from perturb.score.single import evaluate_predictions

# loaded on first use, so ``perturb --help`` (which imports perturb.cli.score) skips pandas
_LAZY = {
    "DEFAULT_METRICS": "perturb.score.metrics",
    "METRICS": "perturb.score.metrics",
    "PRESETS": "perturb.score.metrics",
    "InputError": "perturb.errors",
    "ScoreResult": "perturb.score.api",
    "evaluate_predictions": "perturb.score.single",
    "read_predictions": "perturb.score.readers",
    "score_runs": "perturb.score.api",
    "write_outputs": "perturb.score.api",
}

__all__ = [
    "DEFAULT_METRICS",
    "METRICS",
    "PRESETS",
    "InputError",
    "ScoreResult",
    "evaluate_predictions",
    "read_predictions",
    "score_runs",
    "write_outputs",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'perturb.score' has no attribute {name!r}")
