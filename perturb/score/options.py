"""``ScoreOptions``: everything one scoring run is told, built once (by ``perturb score`` or
by :func:`perturb.score.score_runs` from its keyword arguments) and read by every stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, SkipValidation

from perturb.errors import InputError
from perturb.score.read import PredictionSource

PerturbedArg: TypeAlias = PredictionSource | Sequence[PredictionSource]
ReferenceArg: TypeAlias = str | Mapping[str, str | Path | Mapping[str, Any] | None]


class ScoreOptions(BaseModel):
    """What to score and how. Prediction sources stay as given (paths, DataFrames, lists of
    dicts: never copied or coerced); the reader checks them."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    clean: SkipValidation[PredictionSource | Mapping[str, PredictionSource]] = Field(
        description="clean-split predictions (path, DataFrame or list of dicts), or {model: source}"
    )
    perturbed: SkipValidation[PerturbedArg | Mapping[str, PerturbedArg]] = Field(
        description="perturbed predictions (one or several sources), or {model: sources}"
    )
    manifest: SkipValidation[str | Path | pd.DataFrame | None] = Field(
        default=None,
        description="DIR/manifest.parquet of the perturbed split (or a DataFrame): fills "
        "perturbation / severity / variant / risk tags by image path, and thumbnails",
    )
    out_dir: Path | None = Field(
        default=None, description="where to write scores.json and the reports (None: write nothing)"
    )
    metrics: Sequence[str] | None = Field(
        default=None, description="metric names or presets (default, upstream, all)"
    )
    primary: str | None = Field(
        default=None,
        description="the metric of the headline, heatmap, curves, CE, ER and flips (default: "
        "chosen from the data: mcq, yes/no, box IoU, judge, then ROUGE-L)",
    )
    reference: ReferenceArg | None = Field(
        default=None,
        description="CE reference: the name of a model scored in this run, or "
        "{name: path/to/scores.json} (a previous run; {name: None} = this run's model)",
    )
    include_at_risk: bool | None = Field(
        default=None,
        description="True: the headline uses all pairs; False: only label-safe pairs; None: "
        "label-safe pairs when there are enough of them (perturb.score.headline), else all "
        "pairs with a warning. Both pooled results are always reported",
    )
    bootstrap: int = Field(
        default=1000, description="resamples B of the paired cluster bootstrap (0: no CIs)"
    )
    seed: int = Field(default=0, description="bootstrap seed (recorded)")
    level: float = Field(default=0.95, description="confidence level of the intervals")
    risk_tags: Mapping[str, Sequence[str]] | None = Field(
        default=None,
        description="op -> risk tags, for ops the manifest does not describe (overrides the "
        "catalog, its severity-dependent tags included)",
    )
    risk_map: Mapping[str, Sequence[str]] | None = Field(
        default=None,
        description="risk tag -> question-class patterns (default perturb.score.risk.TAG_CLASSES)",
    )
    max_flips: int = Field(
        default=20, description="largest correct -> wrong flips listed per model"
    )
    timestamp: str | None = Field(
        default=None,
        description="ISO timestamp to record (default: now, UTC); the only field that differs "
        "between reruns on the same inputs",
    )
    dataset: str | Path | None = Field(
        default=None,
        description="the evaluated dataset (hub id, save_to_disk folder, parquet/JSONL): fills "
        "missing complexity / question_class by (img_id, question) and gives the clean images "
        "of the flip gallery (perturb.score.dataset_join)",
    )
    dataset_split: str | None = Field(
        default=None, description="split of dataset (default: as perturb generate)"
    )
    rouge_upstream: bool = Field(
        default=False,
        description="also report ROUGE as upstream does (median of 1000 bootstrap means, "
        "perturb.score.upstream_rouge) next to the exact means",
    )

    @property
    def named_models(self) -> bool:
        """Whether the predictions are given per model (``{model: source}``)."""
        return isinstance(self.clean, Mapping)

    def check(self) -> None:
        """InputError for values no run can use."""
        if self.bootstrap < 0:
            raise InputError("--bootstrap must be >= 0")
        if not 0.5 <= self.level < 1:
            raise InputError("confidence level must be in [0.5, 1)")
