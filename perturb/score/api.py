"""``score_runs``: read, pair, measure, compare; write scores.json (and the reports through an
injected writer: scoring never imports :mod:`perturb.report`)."""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeAlias

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
from perturb.score.controls import split_controls
from perturb.score.controls import summarise as summarise_controls
from perturb.score.coverage import manifest_coverage
from perturb.score.headline import choose_headline
from perturb.score.manifest import Manifest, discover_manifest, load_manifest
from perturb.score.metrics import (
    FREE_TEXT_METRICS,
    METRICS,
    PRECOMPUTED_METRICS,
    compute_item_metrics,
    corpus_stats,
    judge_class_scores,
    resolve_metrics,
)
from perturb.score.pairing import PairReport, pair_model, resolve_image
from perturb.score.readers import PredictionSource, ReadReport, read_predictions
from perturb.score.risk import TAG_CLASSES

SCHEMA = "perturb.scores/1"
DEFAULT_MODEL = "model"
PerturbedArg: TypeAlias = PredictionSource | Sequence[PredictionSource]


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
        json.dumps(_clean_json(obj), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
        + "\n"
    )


def _clean_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
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


def _label(src: PredictionSource, default: str) -> str:
    return str(src) if isinstance(src, (str, Path)) else default


def _run_name(src: PredictionSource, default: str) -> str:
    if isinstance(src, (str, Path)):
        p = Path(src)
        return p.name if p.is_dir() else p.stem
    return default


def _sha256(src: PredictionSource) -> str | None:
    if not isinstance(src, (str, Path)):
        return None
    p = Path(src)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with p.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions() -> dict[str, str]:
    from importlib import metadata

    import perturb

    out = {"perturb": perturb.__version__, "python": platform.python_version()}
    for dist in ("numpy", "pandas", "scipy", "pyarrow", "sacrebleu", "rouge-score", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # pragma: no cover
            out[dist] = "missing"
    return out


def _as_model_map(
    clean: PredictionSource | Mapping[str, PredictionSource],
    perturbed: PerturbedArg | Mapping[str, PerturbedArg],
) -> tuple[dict[str, PredictionSource], dict[str, list[PredictionSource]]]:
    if isinstance(clean, Mapping):
        cmap = dict(clean)
        if not isinstance(perturbed, Mapping):
            raise InputError("clean is given per model (a mapping): give perturbed per model too")
        pmap = {k: _as_list(v) for k, v in perturbed.items()}
    else:
        cmap = {DEFAULT_MODEL: clean}
        if isinstance(perturbed, Mapping):
            if len(perturbed) != 1:
                raise InputError(
                    "perturbed is given per model but clean is not: give clean per model too"
                )
            pmap = {DEFAULT_MODEL: _as_list(next(iter(perturbed.values())))}
        else:
            pmap = {DEFAULT_MODEL: _as_list(perturbed)}
    missing = sorted(set(cmap) ^ set(pmap))
    if missing:
        raise InputError(
            f"model(s) {missing} have clean predictions but no perturbed ones or the other way round; "
            "give every model both --clean NAME=P and --perturbed NAME=P"
        )
    for k, v in pmap.items():
        if not v:
            raise InputError(f"model {k!r}: no perturbed predictions given (--perturbed)")
    return cmap, pmap


def _as_list(v: PerturbedArg) -> list[PredictionSource]:
    if isinstance(v, (str, Path, pd.DataFrame)):
        return [v]
    if isinstance(v, Sequence) and v and all(isinstance(x, Mapping) for x in v):
        return [v]  # one list of records
    return list(v)


def _split_by_model(df: pd.DataFrame, model: str, named: bool) -> dict[str, pd.DataFrame]:
    """Rows of a file that carries a 'model' column, per model (unless the model was named)."""
    if named or df["model"].isna().all():
        return {model: df}
    vals = df["model"].fillna(model)
    return {str(k): g.reset_index(drop=True) for k, g in df.groupby(vals, sort=True)}


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


ReportWriter: TypeAlias = Callable[[Mapping[str, Any], Path], Mapping[str, Path]]
"""Writes the human-readable reports of a scores dict into a folder; returns the files by kind
(``perturb.report.write_reports``: the CLI and the demo pass it, so scoring never imports report)."""


def score_runs(
    clean: PredictionSource | Mapping[str, PredictionSource],
    perturbed: PerturbedArg | Mapping[str, PerturbedArg],
    manifest: str | Path | pd.DataFrame | None = None,
    out_dir: str | Path | None = None,
    *,
    metrics: Sequence[str] | None = None,
    primary: str | None = None,
    reference: str | Mapping[str, str | Path | Mapping[str, Any] | None] | None = None,
    include_at_risk: bool | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    risk_tags: Mapping[str, Sequence[str]] | None = None,
    risk_map: Mapping[str, Sequence[str]] | None = None,
    max_flips: int = 20,
    report_writer: ReportWriter | None = None,
    timestamp: str | None = None,
    dataset: str | Path | None = None,
    dataset_split: str | None = None,
    rouge_upstream: bool = False,
) -> ScoreResult:
    """Score clean vs perturbed predictions of one or more models.

    Args:
        clean: clean-split predictions (path, DataFrame or list of dicts), or ``{model: source}``.
        perturbed: perturbed predictions (one or several sources), or ``{model: sources}``.
        manifest: ``DIR/manifest.parquet`` of the perturbed split (or a DataFrame): fills
            perturbation / severity / variant / risk tags by image path, and thumbnails.
        out_dir: where to write scores.json (and the reports, see ``report_writer``; None: write
            nothing).
        metrics: metric names or presets (``default``, ``upstream``, ``all``).
        primary: the metric of the headline, heatmap, curves, CE, ER and flips (default: chosen
            from the data: mcq, yes/no, box IoU, judge, then ROUGE-L).
        reference: CE reference: the name of a model scored in this call, or
            ``{name: path/to/scores.json}`` (a previous run; ``{name: None}`` = this run's model).
        include_at_risk: True: the headline uses all pairs; False: only label-safe pairs (whose
            question class is not at risk under their perturbation); None (default): label-safe
            pairs when there are enough of them (:mod:`perturb.score.headline`), else all pairs
            with a warning. Both pooled results are always reported, and at-risk pairs separately.
        bootstrap: resamples B of the paired cluster bootstrap (0 disables CIs).
        seed: bootstrap seed (recorded).
        level: confidence level of the intervals.
        risk_tags: op -> risk tags, for ops the manifest does not describe (overrides the catalog,
            its severity-dependent tags included).
        risk_map: risk tag -> question-class patterns (default :data:`perturb.score.risk.TAG_CLASSES`).
        max_flips: number of largest correct -> wrong flips listed per model.
        report_writer: writes report.md / report.html next to scores.json when ``out_dir`` is
            set (pass ``perturb.report.write_reports``; None: scores.json only).
        timestamp: ISO timestamp to record (default: now, UTC); the only field that differs
            between reruns on the same inputs.
        dataset: the evaluated dataset (hub id, ``save_to_disk`` folder, parquet/JSONL): fills
            missing ``complexity`` / ``question_class`` by (img_id, question) and gives the clean
            images of the flip gallery (:mod:`perturb.score.dataset_join`).
        dataset_split: split of ``dataset`` (default: as ``perturb generate``).
        rouge_upstream: also report ROUGE as upstream does (median of 1000 bootstrap means,
            :mod:`perturb.score.upstream_rouge`) next to the exact means.
    """
    if bootstrap < 0:
        raise InputError("--bootstrap must be >= 0")
    if not 0.5 <= level < 1:
        raise InputError("confidence level must be in [0.5, 1)")
    requested = resolve_metrics(metrics)
    clean_by_model, perturbed_by_model = _as_model_map(clean, perturbed)
    man: Manifest | None = load_manifest(manifest) if manifest is not None else None
    inputs = _read_inputs(clean_by_model, perturbed_by_model, named=isinstance(clean, Mapping))
    if man is None:
        man = _found_manifest(inputs)
    dataset_info, dataset_join = _join_dataset(inputs, dataset, dataset_split)
    models = inputs.model_names()
    if man is not None and man.root is not None:
        inputs.bases.append(man.root)
    inputs.bases.append(Path.cwd())
    paired, pair_reports = _pair_models(inputs, models, man, risk_tags, risk_map)
    if metrics is None:  # the explicit preset "default" leaves the extras out
        requested += _default_extras(requested, paired)
    measured = _measure_models(
        paired,
        requested,
        _ImageSources(
            man, inputs.bases, dataset_info, Path(out_dir) if out_dir is not None else None
        ),
    )
    paired, controls = _split_controls(measured, man, inputs.bases, dataset_info, out_dir)
    choice = _choose_scoring(
        measured, paired, requested, primary, include_at_risk, reference, models
    )
    sections = analyze(
        measured.models,
        choice.used_item,
        choice.used_corpus,
        choice.primary,
        include_at_risk=choice.include_at_risk,
        n_boot=bootstrap,
        seed=seed,
        level=level,
        reference=choice.reference,
        max_flips=max_flips,
        extra_binary=choice.extra_binary,
    )
    _add_calibration(sections, measured.models, choice, bootstrap, seed, level)
    for mname, control_data in controls.items():
        sections["models"][mname]["controls"] = summarise_controls(
            control_data, choice.primary, choice.used_item
        )
    if rouge_upstream:
        from perturb.score.upstream_rouge import upstream_rouge

        sections["rouge_upstream"] = upstream_rouge(measured.models, choice.used_item, seed)
    problems = inputs.problems + _pairing_problems(pair_reports)
    coverage = manifest_coverage(man, paired) if man is not None else None
    scores: dict[str, Any] = {
        "schema": SCHEMA,
        "timestamp": timestamp or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "versions": _versions(),
        "config": _config(choice, requested, include_at_risk, bootstrap, seed, level, risk_map),
        "metric_definitions": _metric_definitions(choice),
        "inputs": inputs.inputs,
        "reading": inputs.read_reports,
        "pairing": {m: p.to_dict() for m, p in pair_reports.items()},
        "counts": _counts(inputs.read_reports, pair_reports, paired, choice.headline),
        "tested": _tested(paired, man, coverage),
        "headline": choice.headline,
        "coverage": coverage,
        "dataset": dataset_join,
        "warnings": _warnings(choice.headline, coverage, dataset_join),
        "mcq_unparsed": measured.unparsed,
        "problems": problems,
        "notes": _notes(measured.unparsed, bootstrap),
        **sections,
    }
    result = ScoreResult(scores=_clean_json(scores), pairs=paired, problems=problems)
    if out_dir is not None:
        write_outputs(result, Path(out_dir), report_writer=report_writer)
    return result


CleanTable: TypeAlias = tuple[pd.DataFrame, ReadReport]
PerturbedTable: TypeAlias = tuple[pd.DataFrame, ReadReport, str]  # (rows, how read, run name)


@dataclass
class _Inputs:
    """The prediction files as read, per model, and what reading them found."""

    clean: dict[str, CleanTable] = field(default_factory=dict)
    perturbed: dict[str, list[PerturbedTable]] = field(default_factory=dict)
    read_reports: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # scores.json "inputs"
    bases: list[Path] = field(default_factory=list)  # folders to find images under
    problems: list[str] = field(default_factory=list)

    def note_read(self, rep: ReadReport, role: str, model: str, src: PredictionSource) -> None:
        """Record one read file: its report, its identity (sha256) and its folder."""
        d = rep.to_dict()
        d.update(role=role, model=model)
        self.read_reports.append(d)
        self.inputs.append(
            {
                "role": role,
                "model": model,
                "source": rep.source,
                "format": rep.format,
                "sha256": _sha256(src),
            }
        )
        if isinstance(src, (str, Path)):
            p = Path(src)
            self.bases.append(p if p.is_dir() else p.parent)
        if rep.dropped:
            self.problems.append(
                f"{rep.source}: {sum(rep.dropped.values())} rows dropped while reading "
                + ", ".join(f"{k}={v}" for k, v in sorted(rep.dropped.items()))
            )

    def model_names(self) -> list[str]:
        """Every model, sorted; InputError when a model has only one side."""
        lonely = sorted(set(self.clean) ^ set(self.perturbed))
        if lonely:
            raise InputError(
                f"model(s) {lonely} (from the files' 'model' column) have only clean or only perturbed rows"
            )
        return sorted(set(self.clean) | set(self.perturbed))


def _found_manifest(inputs: _Inputs) -> Manifest | None:
    """The manifest of the generated split the perturbed images lie in (no --manifest given),
    recorded in scores.json "inputs"; None when their paths lead to none."""
    paths = (
        p
        for tables in inputs.perturbed.values()
        for table, _rep, _run in tables
        for p in table["image_path"].tolist()
    )
    found = discover_manifest(paths, [*inputs.bases, Path.cwd()])
    if found is None:
        return None
    inputs.inputs.append(
        {
            "role": "manifest",
            "model": None,
            "source": str(found),
            "format": "parquet (found beside the perturbed images)",
            "sha256": _sha256(found),
        }
    )
    return load_manifest(found)


def _read_inputs(
    clean_by_model: Mapping[str, PredictionSource],
    perturbed_by_model: Mapping[str, list[PredictionSource]],
    named: bool,
) -> _Inputs:
    """Read every prediction file, split by the 'model' column unless the model was named."""
    inputs = _Inputs()
    for model, src in clean_by_model.items():
        df, rep = read_predictions(src, label=_label(src, f"clean[{model}]"))
        parts = _split_by_model(df, model, named)
        # the models as the report names them (a file's 'model' column over the default name)
        inputs.note_read(rep, "clean", ", ".join(parts) or model, src)
        for mname, part in parts.items():
            if mname in inputs.clean:
                raise InputError(f"model {mname!r} has clean predictions in two inputs")
            inputs.clean[mname] = (part, rep)
    for model, srcs in perturbed_by_model.items():
        for j, src in enumerate(srcs):
            label = _label(src, f"perturbed[{model}][{j}]")
            df, rep = read_predictions(src, label=label)
            parts = _split_by_model(df, model, named)
            inputs.note_read(rep, "perturbed", ", ".join(parts) or model, src)
            run = _run_name(src, f"perturbed{j + 1}" if len(srcs) > 1 else "perturbed")
            for mname, part in parts.items():
                inputs.perturbed.setdefault(mname, []).append((part, rep, run))
    return inputs


def _join_dataset(
    inputs: _Inputs, dataset: str | Path | None, dataset_split: str | None
) -> tuple[Any, dict[str, Any] | None]:
    """With ``--dataset``: fill the tables' missing fields from it (in place); its info and
    the join counts for scores.json."""
    if dataset is None:
        return None, None
    from perturb.score.dataset_join import join_dataset, load_dataset_info

    info = load_dataset_info(str(dataset), dataset_split)
    totals: Counter[str] = Counter()
    for mname, (clean_rows, clean_read) in list(inputs.clean.items()):
        clean_rows, joined = join_dataset(clean_rows, info)
        inputs.clean[mname] = (clean_rows, clean_read)
        totals.update(joined)
    for mname, tables in inputs.perturbed.items():
        new = []
        for pert_rows, pert_read, run in tables:
            pert_rows, joined = join_dataset(pert_rows, info)
            new.append((pert_rows, pert_read, run))
            totals.update(joined)
        inputs.perturbed[mname] = new
    return info, {"source": info.source, "split": dataset_split, **dict(totals)}


def _pair_models(
    inputs: _Inputs,
    models: Sequence[str],
    man: Manifest | None,
    risk_tags: Mapping[str, Sequence[str]] | None,
    risk_map: Mapping[str, Sequence[str]] | None,
) -> tuple[dict[str, pd.DataFrame], dict[str, PairReport]]:
    """Each model's pairs and pairing report; InputError for a model left with no pair."""
    paired: dict[str, pd.DataFrame] = {}
    pair_reports: dict[str, PairReport] = {}
    for mname in models:
        clean_rows, clean_read = inputs.clean[mname]
        pairs, report = pair_model(
            mname, clean_rows, clean_read, inputs.perturbed[mname], man, risk_tags, risk_map
        )
        if len(pairs) == 0:
            raise InputError(
                f"model {mname!r}: no usable pairs after dropping rows ({dict(report.dropped)}); "
                f"examples: {report.drop_examples}"
            )
        paired[mname] = pairs
        pair_reports[mname] = report
    return paired, pair_reports


def _default_extras(requested: Sequence[str], paired: Mapping[str, pd.DataFrame]) -> list[str]:
    """Metrics the default set adds: as upstream, BLEU, chrF and METEOR with ROUGE on free-text
    answers; precomputed per-item scores that the files carry."""
    extras: list[str] = []
    if all(_free_text(p) for p in paired.values()):
        extras += [m for m in FREE_TEXT_METRICS if m not in requested]
    extras += [
        m
        for m in PRECOMPUTED_METRICS
        if m not in requested
        and any(
            np.isfinite(p[f"{m}_given_clean"].to_numpy(np.float64)).any() for p in paired.values()
        )
    ]
    return extras


@dataclass
class _ImageSources:
    """Where thumbnails' image files are looked for (see :func:`_image_resolver`)."""

    manifest: Manifest | None
    bases: list[Path]
    dataset_info: Any
    out_dir: Path | None


@dataclass
class _Measured:
    """Per-pair metric values of every model and what they apply to."""

    models: list[ModelData]
    item_metrics: list[str]
    corpus_metrics: list[str]
    applicable: Counter[str]  # metric -> pairs it applies to, over all models
    unparsed: dict[str, dict[str, Any]]  # model -> MCQ answers without an option letter


def _measure_models(
    paired: Mapping[str, pd.DataFrame], requested: Sequence[str], images: _ImageSources
) -> _Measured:
    """Compute every requested metric on every model's pairs (adds ``<metric>_clean`` /
    ``<metric>_perturbed`` columns to the pairs)."""
    measured = _Measured(
        models=[],
        item_metrics=[m for m in requested if METRICS[m].kind == "item"],
        corpus_metrics=[m for m in requested if METRICS[m].kind == "corpus"],
        applicable=Counter(),
        unparsed={},
    )
    for mname, pairs in paired.items():
        measured.models.append(_measure_model(mname, pairs, measured, images))
    return measured


def _split_controls(
    measured: _Measured,
    man: Manifest | None,
    bases: list[Path],
    dataset_info: Any,
    out_dir: str | Path | None,
) -> tuple[dict[str, pd.DataFrame], dict[str, ModelData]]:
    """Take the control pairs (``control_*``, :mod:`perturb.score.controls`) out of every
    model's measured pairs; (the remaining pairs per model, the control data per model)."""
    out = Path(out_dir) if out_dir is not None else None

    def resolver(pairs: pd.DataFrame) -> Callable[[int], tuple[str | None, str | None]]:
        return _image_resolver(pairs, man, bases, dataset_info, out)

    controls: dict[str, ModelData] = {}
    kept: list[ModelData] = []
    for md in measured.models:
        rest, ctrl = split_controls(md, resolver)
        if ctrl is not None:
            if len(rest.pairs) == 0:
                raise InputError(
                    f"model {md.name!r}: only control pairs (control_*); pass the perturbed "
                    "predictions too (--perturbed perturbed.jsonl --perturbed controls.jsonl)"
                )
            controls[md.name] = ctrl
        kept.append(rest)
    measured.models[:] = kept
    return {md.name: md.pairs for md in kept}, controls


def _measure_model(
    mname: str, pairs: pd.DataFrame, measured: _Measured, images: _ImageSources
) -> ModelData:
    """One model's metric values: the clean side once per clean row, the perturbed side per
    pair, each against its own reference (geometric ops move the perturbed side's boxes)."""
    n = len(pairs)
    clean_row = pairs["clean_row"].to_numpy()
    unique_clean, pair_to_clean = np.unique(clean_row, return_inverse=True)
    first = np.zeros(len(unique_clean), dtype=np.int64)  # first pair of each clean row
    first[pair_to_clean[::-1]] = np.arange(n)[::-1]
    k = len(first)

    def both(clean_col: str, pert_col: str) -> np.ndarray:
        """Clean values (once per clean row) followed by perturbed values (per pair)."""
        clean_vals = pairs[clean_col].to_numpy(dtype=object)[first]
        return np.concatenate([clean_vals, pairs[pert_col].to_numpy(dtype=object)])

    preds = both("pred_clean", "pred_pert")
    refs = both("reference", "reference_perturbed")
    question_class = pairs["question_class"].to_numpy(dtype=object)
    judge_clean = pairs["judge_clean"].to_numpy(dtype=object)
    judge_pert = pairs["judge_pert"].to_numpy(dtype=object)
    item_metrics = measured.item_metrics
    vals = compute_item_metrics(
        preds,
        refs,
        item_metrics,
        options=both("options", "options"),
        judge=np.concatenate([judge_clean[first], judge_pert]),
        question_class=np.concatenate([question_class[first], question_class]),
        compare=(pair_to_clean, k + np.arange(n)),
        ref_boxes=both("ref_boxes", "ref_boxes_perturbed"),
    )
    changed = vals.pop("_answer_changed")
    if "_mcq_unparsed" in vals:
        measured.unparsed[mname] = _unparsed_summary(pairs, vals.pop("_mcq_unparsed"), first, k)
    item_clean = {m: v[:k][pair_to_clean] for m, v in vals.items()}
    item_pert = {m: v[k:] for m, v in vals.items()}
    for m in PRECOMPUTED_METRICS:
        if m in item_metrics:  # given per item in the files, not computed
            item_clean[m] = pairs[f"{m}_given_clean"].to_numpy(np.float64)
            item_pert[m] = pairs[f"{m}_given_pert"].to_numpy(np.float64)
    corpus_clean: dict[str, np.ndarray] = {}
    corpus_pert: dict[str, np.ndarray] = {}
    for m in measured.corpus_metrics:
        stats = corpus_stats(preds, refs, m)
        corpus_clean[m] = stats[:k][pair_to_clean]
        corpus_pert[m] = stats[k:]
    for m in item_metrics:
        measured.applicable[m] += int((~np.isnan(item_clean[m]) & ~np.isnan(item_pert[m])).sum())
    has_ref = int((~pd.isna(pairs["reference"].to_numpy(dtype=object))).sum())
    for m in measured.corpus_metrics:
        measured.applicable[m] += has_ref
    for m in item_metrics:
        pairs[f"{m}_clean"] = item_clean[m]
        pairs[f"{m}_perturbed"] = item_pert[m]
    return ModelData(
        name=mname,
        pairs=pairs,
        item_clean=item_clean,
        item_perturbed=item_pert,
        corpus_stats_clean=corpus_clean,
        corpus_stats_perturbed=corpus_pert,
        judge_by_class_clean=judge_class_scores(judge_clean, question_class),
        judge_by_class_perturbed=judge_class_scores(judge_pert, question_class),
        images=_image_resolver(
            pairs, images.manifest, images.bases, images.dataset_info, images.out_dir
        ),
        answer_changed=changed.astype(np.float64),
    )


@dataclass
class _ScoringChoice:
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


def _choose_scoring(
    measured: _Measured,
    paired: Mapping[str, pd.DataFrame],
    requested: Sequence[str],
    primary: str | None,
    include_at_risk: bool | None,
    reference: str | Mapping[str, str | Path | Mapping[str, Any] | None] | None,
    models: list[str],
) -> _ScoringChoice:
    """Headline pairs, applicable metrics, the primary metric and the CE reference."""
    applicable = measured.applicable
    n_pairs = sum(len(p) for p in paired.values())
    decision = choose_headline(paired.values(), include_at_risk)
    if decision["headline_pairs"] == 0:
        raise InputError(
            f"--exclude-at-risk leaves no pairs: all {n_pairs} pairs are label-risk "
            f"({', '.join(list(decision['at_risk_by_class'])[:4])}); drop --exclude-at-risk"
        )
    used_item = [m for m in measured.item_metrics if applicable[m] > 0]
    prim, prim_reason = _choose_primary(
        primary, {m: applicable[m] for m in requested}, n_pairs, list(requested)
    )
    ref_scores = _resolve_reference(reference, models, prim)
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
    return _ScoringChoice(
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


def _config(
    choice: _ScoringChoice,
    requested: Sequence[str],
    include_at_risk: bool | None,
    bootstrap: int,
    seed: int,
    level: float,
    risk_map: Mapping[str, Sequence[str]] | None,
) -> dict[str, Any]:
    """scores.json "config": how this run scored."""
    return {
        "metrics": choice.used_item + choice.used_corpus,
        "metrics_requested": list(requested),
        "metrics_not_applicable": choice.not_applicable,
        "primary": choice.primary,
        "primary_reason": choice.primary_reason,
        "bootstrap": {
            "resamples": bootstrap,
            "seed": seed,
            "cluster": "img_id",
            "level": level,
            "method": "paired cluster bootstrap, percentile interval",
        },
        "include_at_risk": choice.include_at_risk,
        "include_at_risk_requested": include_at_risk,
        "reference": choice.reference.name if choice.reference else None,
        "risk_map": {k: list(v) for k, v in (risk_map or TAG_CLASSES).items()},
        "delta": "perturbed - clean (negative = worse under perturbation)",
        "relative_drop": "(clean - perturbed) / clean",
    }


def _metric_definitions(choice: _ScoringChoice) -> dict[str, dict[str, Any]]:
    """scores.json "metric_definitions" of the metrics used."""
    return {
        m: {
            "kind": METRICS[m].kind,
            "binary": METRICS[m].binary or m in choice.extra_binary,
            "description": METRICS[m].description,
        }
        for m in choice.used_item + choice.used_corpus
    }


def _pairing_problems(pair_reports: Mapping[str, PairReport]) -> list[str]:
    """One problem line per model that lost rows while pairing."""
    problems = []
    for mname, report in pair_reports.items():
        if report.dropped:
            problems.append(
                f"model {mname!r}: {sum(report.dropped.values())} rows dropped while pairing "
                + ", ".join(f"{k}={v}" for k, v in sorted(report.dropped.items()))
            )
    return problems


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


_SHORT_ANSWER = re.compile(r"^\s*(?:[(\[]?[A-Ja-j][)\].:]?|yes|no)\W*$", re.IGNORECASE)


def _add_calibration(
    sections: dict[str, Any],
    models: Sequence[ModelData],
    choice: _ScoringChoice,
    bootstrap: int,
    seed: int,
    level: float,
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
            bootstrap,
            seed,
            level,
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


def _all_binary(v: np.ndarray) -> bool:
    """Whether every defined value is 0 or 1 (and at least one is defined)."""
    x = v[~np.isnan(v)]
    return bool(x.size) and bool(np.isin(x, (0.0, 1.0)).all())


def _free_text(pairs: pd.DataFrame) -> bool:
    """Whether at least half of the pairs with a reference have a free-text one: no options
    (MCQ), not a bare letter or yes/no, no ``<loc_...>`` boxes."""
    ref = pairs["reference"].to_numpy(dtype=object)
    has = ~pd.isna(ref)
    if not has.any():
        return False
    codes, uniq = pd.factorize(pd.Series(ref[has], dtype=object))
    free_u = np.fromiter(
        (not _SHORT_ANSWER.match(r) and "<loc_" not in r for r in uniq), dtype=bool, count=len(uniq)
    )
    no_opts = pd.isna(pairs["options"].to_numpy(dtype=object))[has]
    return int((free_u[codes] & no_opts).sum()) * 2 >= int(has.sum())


def _unparsed_summary(
    pairs: pd.DataFrame, unparsed: np.ndarray, first: np.ndarray, k: int
) -> dict[str, Any]:
    """MCQ answers without a recognisable letter: counts (clean rows once, perturbed per pair),
    per perturbation, and a few examples."""
    clean_unparsed, pert_unparsed = unparsed[:k], unparsed[k:]
    pert = pairs["perturbation"].to_numpy(dtype=object)
    by_pert = Counter(str(p) for p in pert[pert_unparsed])
    examples = [
        {
            "side": "clean",
            "img_id": pairs["img_id"].iat[int(i)],
            "prediction": pairs["pred_clean"].iat[int(i)],
        }
        for i in first[clean_unparsed][:3]
    ] + [
        {
            "side": "perturbed",
            "perturbation": pert[int(i)],
            "img_id": pairs["img_id"].iat[int(i)],
            "prediction": pairs["pred_pert"].iat[int(i)],
        }
        for i in np.flatnonzero(pert_unparsed)[:3]
    ]
    return {
        "clean": int(clean_unparsed.sum()),
        "clean_rows": int(k),
        "perturbed": int(pert_unparsed.sum()),
        "perturbed_rows": len(pert_unparsed),
        "perturbed_by_perturbation": dict(sorted(by_pert.items())),
        "examples": [{**e, "prediction": str(e["prediction"])[:200]} for e in examples],
    }


def _image_resolver(
    pairs: pd.DataFrame,
    man: Manifest | None,
    bases: list[Path],
    ds_info: Any = None,
    out_dir: Path | None = None,
) -> Callable[[int], tuple[str | None, str | None]]:
    """Finds the clean and perturbed image files of pair ``i`` (for thumbnails).

    The clean image: its path as given or under the input folders, else by file name under
    them, else (with ``--dataset``) the dataset's image of the img_id, copied to
    ``out_dir/flip_images/``.
    """

    def clean_image(i: int) -> Path | None:
        raw = pairs["image_clean"].iat[i]
        clean = resolve_image(raw, bases)
        if clean is None and isinstance(raw, str) and raw:
            clean = resolve_image(Path(raw.replace("\\", "/")).name, bases)
        if clean is None and ds_info is not None and out_dir is not None:
            img_id = str(pairs["img_id"].iat[i])
            got = ds_info.image_bytes(img_id)
            if got is not None:
                data, suffix = got
                safe = re.sub(r"[^A-Za-z0-9_.-]", "_", img_id)[:120]
                dest = out_dir / "flip_images" / f"clean_{safe}{suffix}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not dest.is_file():
                    dest.write_bytes(data)
                clean = dest
        return clean

    def resolve(i: int) -> tuple[str | None, str | None]:
        clean = clean_image(i)
        pert: Path | None = None
        manifest_row = int(pairs["manifest_row"].iat[i])
        if man is not None and manifest_row >= 0 and man.root is not None:
            candidate = man.root / str(man.table["path"].iat[manifest_row])
            pert = candidate if candidate.is_file() else None
        if pert is None:
            pert = resolve_image(pairs["image_pert"].iat[i], bases)
        return (str(clean) if clean else None), (str(pert) if pert else None)

    return resolve


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


def write_outputs(
    result: ScoreResult, out_dir: Path, report_writer: ReportWriter | None = None
) -> None:
    """Write scores.json (and, through ``report_writer``, the reports) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "scores.json"
    path.write_text(result.to_json(), encoding="utf-8")
    result.out_dir = out_dir
    result.files["scores"] = path
    if report_writer is not None:
        result.files.update(report_writer(result.scores, out_dir))
