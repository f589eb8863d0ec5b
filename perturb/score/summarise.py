"""Summarise: from the measured pairs to the content of scores.json: the headline pairs and
metrics chosen, paired gaps with bootstrap intervals (:mod:`perturb.score.analysis`),
calibration, controls, and what was read, paired, dropped and tested."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perturb.errors import InputError
from perturb.score.analysis import (
    PRIMARY_ORDER,
    ModelData,
    ReferenceScores,
    analyze,
    load_reference_scores,
)
from perturb.score.controls import summarise as summarise_controls
from perturb.score.coverage import manifest_coverage
from perturb.score.headline import choose_headline
from perturb.score.inputs import RunInputs
from perturb.score.manifest import Manifest
from perturb.score.measure import Measured
from perturb.score.metrics import METRICS
from perturb.score.options import ScoreOptions
from perturb.score.pairing import Paired, PairReport
from perturb.score.result import ScoreResult, clean_json
from perturb.score.risk import TAG_CLASSES

SCHEMA = "perturb.scores/1"


def summarise(
    inputs: RunInputs, paired: Paired, measured: Measured, options: ScoreOptions
) -> ScoreResult:
    """scores.json's content (JSON-ready), the measured pairs and the problems found."""
    pairs = measured.pairs
    choice = _choose_scoring(measured, options, inputs.models)
    sections = analyze(
        measured.models,
        choice.used_item,
        choice.used_corpus,
        choice.primary,
        include_at_risk=choice.include_at_risk,
        n_boot=options.bootstrap,
        seed=options.seed,
        level=options.level,
        reference=choice.reference,
        max_flips=options.max_flips,
        extra_binary=choice.extra_binary,
    )
    _add_calibration(sections, measured.models, choice, options)
    for mname, control_data in measured.controls.items():
        sections["models"][mname]["controls"] = summarise_controls(
            control_data, choice.primary, choice.used_item
        )
    if options.rouge_upstream:
        from perturb.score.upstream_rouge import upstream_rouge

        sections["rouge_upstream"] = upstream_rouge(measured.models, choice.used_item, options.seed)
    problems = inputs.problems + paired.problems()
    man = inputs.manifest
    coverage = manifest_coverage(man, pairs) if man is not None else None
    scores: dict[str, Any] = {
        "schema": SCHEMA,
        "timestamp": options.timestamp
        or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "versions": _versions(),
        "config": _config(choice, measured.requested, options),
        "metric_definitions": _metric_definitions(choice),
        "inputs": inputs.inputs,
        "reading": inputs.read_reports,
        "pairing": {m: p.to_dict() for m, p in paired.reports.items()},
        "counts": _counts(inputs.read_reports, paired.reports, pairs, choice.headline),
        "tested": _tested(pairs, man, coverage),
        "headline": choice.headline,
        "coverage": coverage,
        "dataset": inputs.dataset_join,
        "warnings": _warnings(choice.headline, coverage, inputs.dataset_join)
        + ([inputs.manifest_warning] if inputs.manifest_warning else []),
        "mcq_unparsed": measured.unparsed,
        "problems": problems,
        "notes": _notes(measured.unparsed, options.bootstrap),
        **sections,
    }
    return ScoreResult(scores=clean_json(scores), pairs=pairs, problems=problems)


def _versions() -> dict[str, str]:
    from importlib import metadata

    from perturb._version import __version__

    out = {"perturb": __version__, "python": platform.python_version()}
    for dist in ("numpy", "pandas", "scipy", "pyarrow", "sacrebleu", "rouge-score", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # pragma: no cover
            out[dist] = "missing"
    return out


@dataclass
class ScoringChoice:
    """What the analysis uses: metrics that apply, the primary metric, headline pairs, CE
    reference."""

    used_item: list[str]
    used_corpus: list[str]
    not_applicable: dict[str, str]
    primary: str
    primary_reason: str
    headline: dict[str, Any]  # choose_headline's decision
    include_at_risk: bool
    reference: ReferenceScores | None
    extra_binary: list[str]  # metrics binary in this run though not by definition


def _choose_scoring(measured: Measured, options: ScoreOptions, models: list[str]) -> ScoringChoice:
    """Headline pairs, applicable metrics, the primary metric and the CE reference."""
    applicable = measured.applicable
    requested = measured.requested
    paired = measured.pairs
    n_pairs = sum(len(p) for p in paired.values())
    decision = choose_headline(paired.values(), options.include_at_risk)
    if decision["headline_pairs"] == 0:
        raise InputError(
            f"--exclude-at-risk leaves no pairs: all {n_pairs} pairs are label-risk "
            f"({', '.join(list(decision['at_risk_by_class'])[:4])}); drop --exclude-at-risk"
        )
    used_item = [m for m in measured.item_metrics if applicable[m] > 0]
    prim, prim_reason = _choose_primary(
        options.primary, {m: applicable[m] for m in requested}, n_pairs, list(requested)
    )
    ref_scores = _resolve_reference(options.reference, models, prim)
    # a metric whose every value is 0 or 1 here (an LLM judge scoring 0/1) is binary
    extra_binary = [
        m
        for m in used_item
        if not METRICS[m].binary
        and all(
            _all_binary(md.item_clean[m]) and _all_binary(md.item_perturbed[m])
            for md in measured.models
        )
        and m == "judge"
    ]
    return ScoringChoice(
        used_item=used_item,
        used_corpus=[m for m in measured.corpus_metrics if applicable[m] > 0],
        not_applicable={m: "applies to no pair" for m in requested if applicable[m] == 0},
        primary=prim,
        primary_reason=prim_reason,
        headline=decision,
        include_at_risk=decision["uses"] == "all_pairs",
        reference=ref_scores,
        extra_binary=extra_binary,
    )


def _choose_primary(
    primary: str | None, applicable: dict[str, int], n_pairs: int, requested: list[str]
) -> tuple[str, str]:
    """The headline metric and why it was chosen."""
    if primary is not None:
        if primary not in METRICS:
            raise InputError(
                f"unknown primary metric '{primary}'. Choose from {', '.join(METRICS)}."
            )
        if applicable.get(primary, 0) == 0:
            raise InputError(
                f"primary metric '{primary}' applies to no pair (or is not in --metrics); applicable: "
                f"{', '.join(m for m, n in applicable.items() if n) or 'none'}"
            )
        return primary, "chosen with --primary"
    order = ", ".join(PRIMARY_ORDER)
    for m in PRIMARY_ORDER:
        if m in requested and applicable.get(m, 0) >= max(1, n_pairs // 2):
            return m, (
                f"first of ({order}) that applies to at least half of the pairs "
                f"({applicable[m]} of {n_pairs}); --primary fixes it across runs"
            )
    for m in requested:
        if applicable.get(m, 0):
            return m, (
                f"no metric of ({order}) applies to half of the pairs; first applicable metric "
                f"({applicable[m]} of {n_pairs} pairs); --primary fixes it across runs"
            )
    raise InputError("no metric applies to any pair: check that the files hold reference answers")


def _resolve_reference(
    reference: str | Mapping[str, str | Path | Mapping[str, Any] | None] | None,
    models: list[str],
    primary: str,
) -> ReferenceScores | None:
    if reference is None:
        return None
    items = {reference: None} if isinstance(reference, str) else dict(reference)
    if len(items) != 1:
        raise InputError("give exactly one --reference")
    name, src = next(iter(items.items()))
    if src is None:
        if name not in models:
            raise InputError(
                f"--reference {name}: no model of that name in this run (models: {models}); "
                "use --reference NAME=path/to/scores.json for a previous run"
            )
        return ReferenceScores(name=name, model=name)
    if isinstance(src, Mapping):
        return load_reference_scores(src, name, name, primary, "reference")
    path = Path(src)
    if path.is_dir():
        path = path / "scores.json"
    if not path.is_file():
        raise InputError(
            f"--reference {name}={src}: no scores.json there; run `perturb score` for the reference first"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno}: malformed JSON ({exc.msg})") from None
    return load_reference_scores(data, name, name, primary, str(path))


def _all_binary(v: np.ndarray) -> bool:
    """Whether every defined value is 0 or 1 (and at least one is defined)."""
    x = v[~np.isnan(v)]
    return bool(x.size) and bool(np.isin(x, (0.0, 1.0)).all())


def _config(
    choice: ScoringChoice, requested: Sequence[str], options: ScoreOptions
) -> dict[str, Any]:
    """scores.json "config": how this run scored."""
    return {
        "metrics": choice.used_item + choice.used_corpus,
        "metrics_requested": list(requested),
        "metrics_not_applicable": choice.not_applicable,
        "primary": choice.primary,
        "primary_reason": choice.primary_reason,
        "bootstrap": {
            "resamples": options.bootstrap,
            "seed": options.seed,
            "cluster": "img_id",
            "level": options.level,
            "method": "paired cluster bootstrap, percentile interval",
        },
        "include_at_risk": choice.include_at_risk,
        "include_at_risk_requested": options.include_at_risk,
        "reference": choice.reference.name if choice.reference else None,
        "risk_map": {k: list(v) for k, v in (options.risk_map or TAG_CLASSES).items()},
        "delta": "perturbed - clean (negative = worse under perturbation)",
        "relative_drop": "(clean - perturbed) / clean",
    }


def _metric_definitions(choice: ScoringChoice) -> dict[str, dict[str, Any]]:
    """scores.json "metric_definitions" of the metrics used."""
    return {
        m: {
            "kind": METRICS[m].kind,
            "binary": METRICS[m].binary or m in choice.extra_binary,
            "description": METRICS[m].description,
        }
        for m in choice.used_item + choice.used_corpus
    }


def _notes(unparsed: Mapping[str, dict[str, Any]], bootstrap: int) -> list[str]:
    """scores.json "notes": unparsed MCQ answers and rough intervals."""
    notes = []
    for mname, u in unparsed.items():
        if u["clean"] or u["perturbed"]:
            notes.append(
                f"model {mname!r}: {u['clean']} clean and {u['perturbed']} perturbed MCQ answers "
                "had no recognisable option letter and count as wrong (mcq_unparsed in scores.json)"
                + "; e.g. "
                + "; ".join(f"{e['side']}: {e['prediction'][:80]!r}" for e in u["examples"][:2])
            )
    if 0 < bootstrap < 1000:
        notes.append(f"bootstrap B={bootstrap} < 1000: intervals are rough")
    return notes


def _counts(
    read_reports: Sequence[Mapping[str, Any]],
    pair_reports: Mapping[str, PairReport],
    paired: Mapping[str, pd.DataFrame],
    decision: Mapping[str, Any],
) -> dict[str, int]:
    """scores.json "counts": rows in, rows dropped, pairs."""
    return {
        "input_rows": sum(r["rows_in"] for r in read_reports),
        "clean_rows": sum(r["rows_in"] for r in read_reports if r["role"] == "clean"),
        "perturbed_rows": sum(r["rows_in"] for r in read_reports if r["role"] == "perturbed"),
        "dropped_while_reading": sum(sum(r["dropped"].values()) for r in read_reports),
        "dropped_while_pairing": sum(sum(p.dropped.values()) for p in pair_reports.values()),
        "pairs": sum(len(p) for p in paired.values()),
        "at_risk_pairs": sum(p.at_risk_pairs for p in pair_reports.values()),
        "headline_pairs": decision["headline_pairs"],
    }


def _warnings(
    decision: Mapping[str, Any],
    coverage: dict[str, Any] | None,
    dataset_join: Mapping[str, Any] | None,
) -> list[str]:
    """scores.json "warnings": the headline's, the manifest coverage's (popped from it) and a
    poor ``--dataset`` match."""
    warnings = [decision["warning"]] if decision["warning"] else []
    if coverage is not None:
        warnings += coverage.pop("warnings")
    if (
        dataset_join is not None
        and dataset_join["rows"]
        and dataset_join["matched"] < 0.9 * dataset_join["rows"]
    ):
        warnings.append(
            f"--dataset {dataset_join['source']}: only {dataset_join['matched']} of "
            f"{dataset_join['rows']} prediction rows match a dataset row on (img_id, question); "
            "complexity and class breakdowns cover the matched rows only (check the split with "
            "--dataset-split)"
        )
    return warnings


def _add_calibration(
    sections: dict[str, Any],
    models: Sequence[ModelData],
    choice: ScoringChoice,
    options: ScoreOptions,
) -> None:
    """Each model's ``calibration`` section when its predictions carry confidences.

    Correctness is the primary metric when it is 0/1, else the first 0/1 metric scored
    (tolerant exact match, exact match, yes/no, MCQ)."""
    from perturb.score.calibration import calibration_cells

    prim = choice.primary
    for md in models:
        pairs = md.pairs
        if not (
            np.isfinite(pairs["conf_clean"].to_numpy(dtype=np.float64)).any()
            and np.isfinite(pairs["conf_pert"].to_numpy(dtype=np.float64)).any()
        ):
            continue
        choices = [prim] if (METRICS[prim].binary or prim in choice.extra_binary) else []
        choices += ["exact_match_tolerant", "exact_match", "yesno", "mcq"]
        metric = next((m for m in choices if m in md.item_clean), None)
        if metric is None:
            continue
        head = (
            np.ones(len(pairs), dtype=bool)
            if choice.include_at_risk
            else ~pairs["at_risk"].to_numpy(bool)
        )
        cal = calibration_cells(
            pairs,
            md.item_clean[metric],
            md.item_perturbed[metric],
            head,
            metric,
            options.bootstrap,
            options.seed,
            options.level,
        )
        if cal is not None:
            sections["models"][md.name]["calibration"] = cal


def _tested(
    paired: Mapping[str, pd.DataFrame], man: Manifest | None, coverage: dict[str, Any] | None
) -> dict[str, Any]:
    """What was tested, for the report's first screen."""
    ids: set[Any] = set()
    perts: set[Any] = set()
    for p in paired.values():
        ids.update(p["img_id"].tolist())
        perts.update(p["perturbation"].tolist())
    suites: list[str] = []
    if man is not None and "suite" in man.table.columns:
        suites = sorted({str(s) for s in man.table["suite"].dropna().unique()})
    share = None
    if coverage is not None and coverage["models"]:
        share = min(m["share"] for m in coverage["models"].values())
    return {
        "models": sorted(paired),
        "suites": suites,
        "images": len(ids),
        "perturbations": len(perts),
        "coverage": share,
    }
