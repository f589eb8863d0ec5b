"""Paired clean-vs-perturbed scoring of medical VQA predictions (no torch).

>>> from perturb.score import score_runs
>>> result = score_runs(clean="clean.jsonl", perturbed=["blur.jsonl"], out_dir="out")  # doctest: +SKIP
>>> result.scores["models"]["model"]["overall"]["metrics"]["rougeL"]["delta"]  # doctest: +SKIP

See :func:`perturb.score.api.score_runs`; the CLI is ``perturb score``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from perturb.score.api import ScoreResult, score_runs, write_outputs
    from perturb.score.errors import InputError
    from perturb.score.metrics import DEFAULT_METRICS, METRICS, PRESETS
    from perturb.score.readers import read_predictions
    from perturb.score.single import evaluate_predictions

# imported on first use: `perturb generate` (whose CLI module registers `score` too) then does
# not pay for scipy and pandas at start-up
_LAZY = {
    "ScoreResult": "api",
    "score_runs": "api",
    "write_outputs": "api",
    "InputError": "errors",
    "DEFAULT_METRICS": "metrics",
    "METRICS": "metrics",
    "PRESETS": "metrics",
    "read_predictions": "readers",
    "evaluate_predictions": "single",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perturb.score' has no attribute {name!r}")
    return getattr(importlib.import_module(f"perturb.score.{module}"), name)

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
