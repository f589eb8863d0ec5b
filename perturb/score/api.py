"""``score_runs``: read, pair, measure, compare; write scores.json and the reports."""

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
from perturb.score.coverage import manifest_coverage
from perturb.score.headline import choose_headline
from perturb.score.manifest import Manifest, load_manifest
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
    write_report: bool = True,
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
        out_dir: where to write scores.json, report.md and report.html (None: write nothing).
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
        write_report: also write report.md / report.html when ``out_dir`` is set.
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
    cmap, pmap = _as_model_map(clean, perturbed)
    named = isinstance(clean, Mapping)
    man: Manifest | None = load_manifest(manifest) if manifest is not None else None
    read_reports: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    bases: list[Path] = []
    clean_tabs: dict[str, tuple[pd.DataFrame, ReadReport]] = {}
    pert_tabs: dict[str, list[tuple[pd.DataFrame, ReadReport, str]]] = {}
    read_problems: list[str] = []

    def note_read(rep: ReadReport, role: str, model: str, src: PredictionSource) -> None:
        d = rep.to_dict()
        d.update(role=role, model=model)
        read_reports.append(d)
        inputs.append(
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
            bases.append(p if p.is_dir() else p.parent)
        if rep.dropped:
            read_problems.append(
                f"{rep.source}: {sum(rep.dropped.values())} rows dropped while reading "
                + ", ".join(f"{k}={v}" for k, v in sorted(rep.dropped.items()))
            )

    for model, src in cmap.items():
        df, rep = read_predictions(src, label=_label(src, f"clean[{model}]"))
        note_read(rep, "clean", model, src)
        for mname, part in _split_by_model(df, model, named).items():
            if mname in clean_tabs:
                raise InputError(f"model {mname!r} has clean predictions in two inputs")
            clean_tabs[mname] = (part, rep)
    for model, srcs in pmap.items():
        for j, src in enumerate(srcs):
            label = _label(src, f"perturbed[{model}][{j}]")
            df, rep = read_predictions(src, label=label)
            note_read(rep, "perturbed", model, src)
            run = _run_name(src, f"perturbed{j + 1}" if len(srcs) > 1 else "perturbed")
            for mname, part in _split_by_model(df, model, named).items():
                pert_tabs.setdefault(mname, []).append((part, rep, run))
    ds_info = None
    ds_join: dict[str, Any] | None = None
    if dataset is not None:
        from perturb.score.dataset_join import join_dataset, load_dataset_info

        ds_info = load_dataset_info(str(dataset), dataset_split)
        totals: Counter[str] = Counter()
        for mname, (cdf, crep) in list(clean_tabs.items()):
            cdf, jst = join_dataset(cdf, ds_info)
            clean_tabs[mname] = (cdf, crep)
            totals.update(jst)
        for mname, lst in pert_tabs.items():
            new = []
            for pdf, prep_, run in lst:
                pdf, jst = join_dataset(pdf, ds_info)
                new.append((pdf, prep_, run))
                totals.update(jst)
            pert_tabs[mname] = new
        ds_join = {"source": ds_info.source, "split": dataset_split, **dict(totals)}
    models = sorted(set(clean_tabs) | set(pert_tabs))
    lonely = sorted(set(clean_tabs) ^ set(pert_tabs))
    if lonely:
        raise InputError(
            f"model(s) {lonely} (from the files' 'model' column) have only clean or only perturbed rows"
        )
    if man is not None and man.root is not None:
        bases.append(man.root)
    bases.append(Path.cwd())

    # pair every model
    paired: dict[str, pd.DataFrame] = {}
    pair_reports: dict[str, PairReport] = {}
    for mname in models:
        cdf, crep = clean_tabs[mname]
        pairs, prep = pair_model(mname, cdf, crep, pert_tabs[mname], man, risk_tags, risk_map)
        if len(pairs) == 0:
            raise InputError(
                f"model {mname!r}: no usable pairs after dropping rows ({dict(prep.dropped)}); "
                f"examples: {prep.drop_examples}"
            )
        paired[mname] = pairs
        pair_reports[mname] = prep

    default_set = metrics is None  # the explicit preset "default" leaves the extras out
    if default_set and all(_free_text(p) for p in paired.values()):
        # as upstream: BLEU, chrF and METEOR with ROUGE on free-text answers
        requested += [m for m in FREE_TEXT_METRICS if m not in requested]
    if default_set:
        requested += [
            m
            for m in PRECOMPUTED_METRICS
            if m not in requested
            and any(
                np.isfinite(p[f"{m}_given_clean"].to_numpy(np.float64)).any()
                for p in paired.values()
            )
        ]
    # per-pair metrics
    item_req = [m for m in requested if METRICS[m].kind == "item"]
    corpus_req = [m for m in requested if METRICS[m].kind == "corpus"]
    mdata: list[ModelData] = []
    applicable: Counter[str] = Counter()
    unparsed: dict[str, dict[str, Any]] = {}
    for mname in models:
        pairs = paired[mname]
        n = len(pairs)
        crow = pairs["clean_row"].to_numpy()
        uc, inv = np.unique(crow, return_inverse=True)
        first = np.zeros(len(uc), dtype=np.int64)
        first[inv[::-1]] = np.arange(n)[::-1]
        ref = pairs["reference"].to_numpy(dtype=object)
        # each side against its own reference: geometric ops move the perturbed side's boxes
        ref_p = pairs["reference_perturbed"].to_numpy(dtype=object)
        opts = pairs["options"].to_numpy(dtype=object)
        rbox = pairs["ref_boxes"].to_numpy(dtype=object)
        rbox_p = pairs["ref_boxes_perturbed"].to_numpy(dtype=object)
        qcls = pairs["question_class"].to_numpy(dtype=object)
        cpred = pairs["pred_clean"].to_numpy(dtype=object)
        ppred = pairs["pred_pert"].to_numpy(dtype=object)
        jc = pairs["judge_clean"].to_numpy(dtype=object)
        jp = pairs["judge_pert"].to_numpy(dtype=object)
        # clean side once per clean row, perturbed side per pair
        both_pred = np.concatenate([cpred[first], ppred])
        both_ref = np.concatenate([ref[first], ref_p])
        vals = compute_item_metrics(
            both_pred,
            both_ref,
            item_req,
            options=np.concatenate([opts[first], opts]),
            judge=np.concatenate([jc[first], jp]),
            question_class=np.concatenate([qcls[first], qcls]),
            compare=(inv, len(first) + np.arange(n)),
            ref_boxes=np.concatenate([rbox[first], rbox_p]),
        )
        changed = vals.pop("_answer_changed")
        k = len(first)
        if "_mcq_unparsed" in vals:
            unparsed[mname] = _unparsed_summary(pairs, vals.pop("_mcq_unparsed"), first, k)
        mc = {m: v[:k][inv] for m, v in vals.items()}
        mp = {m: v[k:] for m, v in vals.items()}
        for m in PRECOMPUTED_METRICS:
            if m in item_req:  # given per item in the files, not computed
                mc[m] = pairs[f"{m}_given_clean"].to_numpy(np.float64)
                mp[m] = pairs[f"{m}_given_pert"].to_numpy(np.float64)
        sc: dict[str, np.ndarray] = {}
        sp: dict[str, np.ndarray] = {}
        for m in corpus_req:
            st = corpus_stats(both_pred, both_ref, m)
            sc[m] = st[:k][inv]
            sp[m] = st[k:]
        for m in item_req:
            applicable[m] += int((~np.isnan(mc[m]) & ~np.isnan(mp[m])).sum())
        has_ref = int((~pd.isna(ref)).sum())
        for m in corpus_req:
            applicable[m] += has_ref
        for m in item_req:
            pairs[f"{m}_clean"] = mc[m]
            pairs[f"{m}_perturbed"] = mp[m]
        resolver = _image_resolver(
            pairs, man, bases, ds_info, Path(out_dir) if out_dir is not None else None
        )
        mdata.append(
            ModelData(
                name=mname,
                pairs=pairs,
                mc=mc,
                mp=mp,
                sc=sc,
                sp=sp,
                judge_cls_c=judge_class_scores(jc, qcls),
                judge_cls_p=judge_class_scores(jp, qcls),
                images=resolver,
                changed=changed.astype(np.float64),
            )
        )
    n_pairs = sum(len(p) for p in paired.values())
    decision = choose_headline(paired.values(), include_at_risk)
    if decision["headline_pairs"] == 0:
        raise InputError(
            f"--exclude-at-risk leaves no pairs: all {n_pairs} pairs are label-risk "
            f"({', '.join(list(decision['at_risk_by_class'])[:4])}); drop --exclude-at-risk"
        )
    include = decision["uses"] == "all_pairs"
    used_item = [m for m in item_req if applicable[m] > 0]
    used_corpus = [m for m in corpus_req if applicable[m] > 0]
    not_applicable = {m: "applies to no pair" for m in requested if applicable[m] == 0}
    prim, prim_reason = _choose_primary(
        primary, {m: applicable[m] for m in requested}, n_pairs, requested
    )

    ref_scores = _resolve_reference(reference, models, prim)
    # a metric whose every value is 0 or 1 here (an LLM judge scoring 0/1) is binary
    extra_binary = [
        m
        for m in used_item
        if not METRICS[m].binary
        and all(_all_binary(md.mc[m]) and _all_binary(md.mp[m]) for md in mdata)
        and m == "judge"
    ]

    sections = analyze(
        mdata,
        used_item,
        used_corpus,
        prim,
        include_at_risk=include,
        n_boot=bootstrap,
        seed=seed,
        level=level,
        reference=ref_scores,
        max_flips=max_flips,
        extra_binary=extra_binary,
    )
    _add_calibration(sections, mdata, prim, extra_binary, include, bootstrap, seed, level)
    if rouge_upstream:
        from perturb.score.upstream_rouge import upstream_rouge

        sections["rouge_upstream"] = upstream_rouge(mdata, used_item, seed)
    problems = list(read_problems)
    for mname, prep in pair_reports.items():
        if prep.dropped:
            problems.append(
                f"model {mname!r}: {sum(prep.dropped.values())} rows dropped while pairing "
                + ", ".join(f"{k}={v}" for k, v in sorted(prep.dropped.items()))
            )
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
    counts = {
        "input_rows": sum(r["rows_in"] for r in read_reports),
        "clean_rows": sum(r["rows_in"] for r in read_reports if r["role"] == "clean"),
        "perturbed_rows": sum(r["rows_in"] for r in read_reports if r["role"] == "perturbed"),
        "dropped_while_reading": sum(sum(r["dropped"].values()) for r in read_reports),
        "dropped_while_pairing": sum(sum(p.dropped.values()) for p in pair_reports.values()),
        "pairs": n_pairs,
        "at_risk_pairs": sum(p.at_risk_pairs for p in pair_reports.values()),
        "headline_pairs": decision["headline_pairs"],
    }
    warnings = [decision["warning"]] if decision["warning"] else []
    coverage = manifest_coverage(man, paired) if man is not None else None
    if coverage is not None:
        warnings += coverage.pop("warnings")
    if ds_join is not None and ds_join["rows"] and ds_join["matched"] < 0.9 * ds_join["rows"]:
        warnings.append(
            f"--dataset {ds_join['source']}: only {ds_join['matched']} of {ds_join['rows']} "
            "prediction rows match a dataset row on (img_id, question); complexity and class "
            "breakdowns cover the matched rows only (check the split with --dataset-split)"
        )
    scores: dict[str, Any] = {
        "schema": SCHEMA,
        "timestamp": timestamp or datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "versions": _versions(),
        "config": {
            "metrics": used_item + used_corpus,
            "metrics_requested": requested,
            "metrics_not_applicable": not_applicable,
            "primary": prim,
            "primary_reason": prim_reason,
            "bootstrap": {
                "resamples": bootstrap,
                "seed": seed,
                "cluster": "img_id",
                "level": level,
                "method": "paired cluster bootstrap, percentile interval",
            },
            "include_at_risk": include,
            "include_at_risk_requested": include_at_risk,
            "reference": ref_scores.name if ref_scores else None,
            "risk_map": {k: list(v) for k, v in (risk_map or TAG_CLASSES).items()},
            "delta": "perturbed - clean (negative = worse under perturbation)",
            "relative_drop": "(clean - perturbed) / clean",
        },
        "metric_definitions": {
            m: {
                "kind": METRICS[m].kind,
                "binary": METRICS[m].binary or m in extra_binary,
                "description": METRICS[m].description,
            }
            for m in used_item + used_corpus
        },
        "inputs": inputs,
        "reading": read_reports,
        "pairing": {m: p.to_dict() for m, p in pair_reports.items()},
        "counts": counts,
        "tested": _tested(paired, man, coverage),
        "headline": decision,
        "coverage": coverage,
        "dataset": ds_join,
        "warnings": warnings,
        "mcq_unparsed": unparsed,
        "problems": problems,
        "notes": notes,
        **sections,
    }
    result = ScoreResult(scores=_clean_json(scores), pairs=paired, problems=problems)
    if out_dir is not None:
        write_outputs(result, Path(out_dir), write_report=write_report)
    return result


_SHORT_ANSWER = re.compile(r"^\s*(?:[(\[]?[A-Ja-j][)\].:]?|yes|no)\W*$", re.IGNORECASE)


def _add_calibration(
    sections: dict[str, Any],
    mdata: Sequence[ModelData],
    prim: str,
    extra_binary: Sequence[str],
    include: bool,
    bootstrap: int,
    seed: int,
    level: float,
) -> None:
    """Each model's ``calibration`` section when its predictions carry confidences.

    Correctness is the primary metric when it is 0/1, else the first 0/1 metric scored
    (tolerant exact match, exact match, yes/no, MCQ)."""
    from perturb.score.calibration import calibration_cells

    for md in mdata:
        pairs = md.pairs
        if not (
            np.isfinite(pairs["conf_clean"].to_numpy(dtype=np.float64)).any()
            and np.isfinite(pairs["conf_pert"].to_numpy(dtype=np.float64)).any()
        ):
            continue
        choices = [prim] if (METRICS[prim].binary or prim in extra_binary) else []
        choices += ["exact_match_tolerant", "exact_match", "yesno", "mcq"]
        metric = next((m for m in choices if m in md.mc), None)
        if metric is None:
            continue
        head = np.ones(len(pairs), dtype=bool) if include else ~pairs["at_risk"].to_numpy(bool)
        cal = calibration_cells(
            pairs, md.mc[metric], md.mp[metric], head, metric, bootstrap, seed, level
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
    uc, up = unparsed[:k], unparsed[k:]
    pert = pairs["perturbation"].to_numpy(dtype=object)
    by_pert = Counter(str(p) for p in pert[up])
    examples = [
        {
            "side": "clean",
            "img_id": pairs["img_id"].iat[int(i)],
            "prediction": pairs["pred_clean"].iat[int(i)],
        }
        for i in first[uc][:3]
    ] + [
        {
            "side": "perturbed",
            "perturbation": pert[int(i)],
            "img_id": pairs["img_id"].iat[int(i)],
            "prediction": pairs["pred_pert"].iat[int(i)],
        }
        for i in np.flatnonzero(up)[:3]
    ]
    return {
        "clean": int(uc.sum()),
        "clean_rows": int(k),
        "perturbed": int(up.sum()),
        "perturbed_rows": len(up),
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
        c = resolve_image(raw, bases)
        if c is None and isinstance(raw, str) and raw:
            c = resolve_image(Path(raw.replace("\\", "/")).name, bases)
        if c is None and ds_info is not None and out_dir is not None:
            img_id = str(pairs["img_id"].iat[i])
            got = ds_info.image_bytes(img_id)
            if got is not None:
                data, suffix = got
                safe = re.sub(r"[^A-Za-z0-9_.-]", "_", img_id)[:120]
                dest = out_dir / "flip_images" / f"clean_{safe}{suffix}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not dest.is_file():
                    dest.write_bytes(data)
                c = dest
        return c

    def resolve(i: int) -> tuple[str | None, str | None]:
        c = clean_image(i)
        p: Path | None = None
        mrow = int(pairs["manifest_row"].iat[i])
        if man is not None and mrow >= 0 and man.root is not None:
            cand = man.root / str(man.table["path"].iat[mrow])
            p = cand if cand.is_file() else None
        if p is None:
            p = resolve_image(pairs["image_pert"].iat[i], bases)
        return (str(c) if c else None), (str(p) if p else None)

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


def write_outputs(result: ScoreResult, out_dir: Path, write_report: bool = True) -> None:
    """Write scores.json (and report.md / report.html) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "scores.json"
    path.write_text(result.to_json(), encoding="utf-8")
    result.out_dir = out_dir
    result.files["scores"] = path
    if write_report:
        from perturb.report import write_reports

        result.files.update(write_reports(result.scores, out_dir))
