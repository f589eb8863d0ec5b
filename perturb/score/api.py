"""Scoring as one chain: read -> canonicalise -> pair -> measure -> summarise -> render.

=============  ====================================  =========================================
stage          module                                hands on
=============  ====================================  =========================================
read           :mod:`perturb.score.read`             :class:`~perturb.score.read.RawTable`
canonicalise   :mod:`perturb.score.canonical`        the canonical table per source, gathered
                                                     per model in
                                                     :class:`~perturb.score.inputs.RunInputs`
pair           :mod:`perturb.score.pairing`          :class:`~perturb.score.pairing.Paired`
measure        :mod:`perturb.score.measure`          :class:`~perturb.score.measure.Measured`
summarise      :mod:`perturb.score.summarise`        :class:`~perturb.score.result.ScoreResult`
render         :mod:`perturb.score.render`           scores.json and the reports
=============  ====================================  =========================================

Every stage reads the one :class:`~perturb.score.options.ScoreOptions` of the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from perturb.score.inputs import read_inputs
from perturb.score.measure import measure
from perturb.score.metrics import resolve_metrics
from perturb.score.options import PerturbedArg, ScoreOptions
from perturb.score.pairing import pair_runs
from perturb.score.read import PredictionSource
from perturb.score.render import ReportWriter, write_outputs
from perturb.score.result import ScoreResult
from perturb.score.summarise import summarise

__all__ = ["ScoreOptions", "ScoreResult", "run", "score_runs", "write_outputs"]


def run(options: ScoreOptions, report_writer: ReportWriter | None = None) -> ScoreResult:
    """Score clean vs perturbed predictions as ``options`` say.

    ``report_writer`` writes report.md / report.html next to scores.json when
    ``options.out_dir`` is set (pass ``perturb.report.write_reports``; None: scores.json only).
    ``ScoreResult.exit_code`` is 0 when every input row was scored, 1 when rows were dropped.
    """
    options.check()
    requested = resolve_metrics(options.metrics)
    with _scratch_cache(options):  # the report's thumbnails read the dataset too
        inputs = read_inputs(options)
        paired = pair_runs(inputs, options)
        measured = measure(inputs, paired, requested, options)
        result = summarise(inputs, paired, measured, options)
        if options.out_dir is not None:
            write_outputs(result, options.out_dir, report_writer=report_writer)
    return result


def _scratch_cache(options: ScoreOptions) -> contextlib.AbstractContextManager[None]:
    """Around reading ``--dataset``: ``datasets``' Arrow copy of a local file in a temporary
    folder, not the home folder's cache (``perturb.io.datasets.scratch_cache``)."""
    if options.dataset is None:
        return contextlib.nullcontext()
    from perturb.io.datasets import scratch_cache

    return scratch_cache()


def score_runs(
    clean: PredictionSource | Mapping[str, PredictionSource],
    perturbed: PerturbedArg | Mapping[str, PerturbedArg],
    manifest: str | Path | pd.DataFrame | None = None,
    out_dir: str | Path | None = None,
    *,
    report_writer: ReportWriter | None = None,
    **options: Any,
) -> ScoreResult:
    """:func:`run` with the options as keyword arguments (the fields of
    :class:`~perturb.score.options.ScoreOptions`: ``metrics``, ``primary``, ``reference``,
    ``include_at_risk``, ``bootstrap``, ``seed``, ``level``, ``risk_tags``, ``risk_map``,
    ``max_flips``, ``timestamp``, ``dataset``, ``dataset_split``, ``rouge_upstream``)."""
    return run(
        ScoreOptions(
            clean=clean,
            perturbed=perturbed,
            manifest=manifest,
            out_dir=Path(out_dir) if out_dir is not None else None,
            **options,
        ),
        report_writer=report_writer,
    )
