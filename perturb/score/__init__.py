"""Paired clean-vs-perturbed scoring of medical VQA predictions (no torch).

>>> from perturb.score import score_runs
>>> result = score_runs(clean="clean.jsonl", perturbed=["blur.jsonl"], out_dir="out")  # doctest: +SKIP
>>> result.scores["models"]["model"]["overall"]["metrics"]["rougeL"]["delta"]  # doctest: +SKIP

See :func:`perturb.score.api.score_runs`; the CLI is ``perturb score``.
"""

from __future__ import annotations

from perturb.score.api import ScoreResult, score_runs, write_outputs
from perturb.score.errors import InputError
from perturb.score.metrics import DEFAULT_METRICS, METRICS, PRESETS
from perturb.score.readers import read_predictions
from perturb.score.single import evaluate_predictions

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
