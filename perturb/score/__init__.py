"""Paired clean-vs-perturbed scoring of medical VQA predictions (no torch).

>>> from perturb.report import write_reports
>>> from perturb.score import score_runs
>>> result = score_runs(
...     clean="clean.jsonl", perturbed=["blur.jsonl"], out_dir="out", report_writer=write_reports
... )  # doctest: +SKIP
>>> result.scores["models"]["model"]["overall"]["metrics"]["rougeL"]["delta"]  # doctest: +SKIP

or with the options as one object (what ``perturb score`` builds):

>>> from perturb.score import ScoreOptions, run
>>> result = run(ScoreOptions(clean="clean.jsonl", perturbed=["blur.jsonl"], bootstrap=0))  # doctest: +SKIP

The chain and its modules: :mod:`perturb.score.api`; the CLI is ``perturb score``. Scoring
never imports :mod:`perturb.report` (report depends on score); the reports are written through
``report_writer``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from perturb.errors import InputError
    from perturb.score.api import run, score_runs
    from perturb.score.inputs import read_predictions
    from perturb.score.metrics import DEFAULT_METRICS, METRICS, PRESETS
    from perturb.score.options import ScoreOptions
    from perturb.score.render import write_outputs
    from perturb.score.result import ScoreResult
    from perturb.score.single import evaluate_predictions

# loaded on first use, so ``perturb --help`` (which imports perturb.cli.score) skips pandas
_LAZY = {
    "DEFAULT_METRICS": "perturb.score.metrics",
    "METRICS": "perturb.score.metrics",
    "PRESETS": "perturb.score.metrics",
    "InputError": "perturb.errors",
    "ScoreOptions": "perturb.score.options",
    "ScoreResult": "perturb.score.result",
    "evaluate_predictions": "perturb.score.single",
    "read_predictions": "perturb.score.inputs",
    "run": "perturb.score.api",
    "score_runs": "perturb.score.api",
    "write_outputs": "perturb.score.render",
}

__all__ = [
    "DEFAULT_METRICS",
    "METRICS",
    "PRESETS",
    "InputError",
    "ScoreOptions",
    "ScoreResult",
    "evaluate_predictions",
    "read_predictions",
    "run",
    "score_runs",
    "write_outputs",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'perturb.score' has no attribute {name!r}")
