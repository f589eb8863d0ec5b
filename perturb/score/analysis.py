"""Paired statistics for every clean -> perturbed comparison (DESIGN.md section 8).

For each model the headline pairs (label-preserving ones, unless at-risk pairs are included) are
grouped into cells: all perturbations pooled, per perturbation, per perturbation x severity, per
complexity and per question class (overall and per perturbation), worst-of-k over variants, and
the at-risk pairs per perturbation and per class at risk. Every cell reports, per metric, the
clean and perturbed score and delta = perturbed - clean with percentile CIs from one shared paired
cluster bootstrap over img_id (:mod:`perturb.score.bootstrap`), the relative drop, and for binary
metrics the flip rates and McNemar exact / mid-p tests. Derived from the cells: severity curves
with the area under them, ImageNet-C corruption error (CE) and relative CE against a reference
model, and effective robustness across models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perturb.score.bootstrap import Cell, CellEngine
from perturb.score.metrics import METRICS, answers_differ, corpus_score
from perturb.score.stats import (
    area_under_severity_curve,
    clustered_mcnemar,
    effective_robustness,
    mcnemar,
    percentile_ci,
)

ALL = "(all)"
PRIMARY_ORDER = ("mcq", "yesno", "box_iou", "judge", "rougeL", "token_f1", "exact_match_tolerant")


def six_digits(x: Any) -> float | None:
    """A JSON number with 6 significant digits (None for NaN/inf)."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.6g}")


# ----------------------------------------------------------------------------- value layout


@dataclass
class Layout:
    """Column layout of the per-pair value matrix that cells sum.

    Per item metric: ``m:n`` (1 where defined on both sides), ``m:clean``, ``m:perturbed``
    (the values), and for binary metrics ``m:correct_to_wrong`` / ``m:wrong_to_correct`` (flip
    indicators) and ``m:net_loss`` (their difference, whose cluster totals the clustered
    McNemar test weighs); per corpus metric ``m:n`` and its sufficient statistics ``m:clean`` /
    ``m:perturbed`` (``stats_width`` columns each).
    """

    item: list[str]
    binary: list[str]
    corpus: list[str]
    cols: dict[str, slice] = field(default_factory=dict)
    width: int = 0

    def __post_init__(self) -> None:
        def add(name: str, k: int = 1) -> None:
            self.cols[name] = slice(self.width, self.width + k)
            self.width += k

        add("rows")
        add("changed")
        for m in self.item:
            add(f"{m}:n")
            add(f"{m}:clean")
            add(f"{m}:perturbed")
            if m in self.binary:
                add(f"{m}:correct_to_wrong")
                add(f"{m}:wrong_to_correct")
                add(f"{m}:net_loss")
        for m in self.corpus:
            w = METRICS[m].stats_width
            add(f"{m}:n")
            add(f"{m}:clean", w)
            add(f"{m}:perturbed", w)

    def col(self, name: str) -> int:
        """Index of the one-wide column ``name``."""
        return self.cols[name].start

    def fill(
        self,
        changed: np.ndarray,
        item_clean: Mapping[str, np.ndarray],
        item_perturbed: Mapping[str, np.ndarray],
        corpus_clean: Mapping[str, np.ndarray] | None = None,
        corpus_perturbed: Mapping[str, np.ndarray] | None = None,
        has_ref: np.ndarray | None = None,
    ) -> np.ndarray:
        """Value matrix (rows x width) from per-pair clean/perturbed metric values."""
        n = len(changed)
        values = np.zeros((n, self.width), dtype=np.float64)
        values[:, self.cols["rows"]] = 1.0
        values[:, self.col("changed")] = changed
        for m in self.item:
            c, p = item_clean[m], item_perturbed[m]
            ok = ~np.isnan(c) & ~np.isnan(p)
            values[:, self.col(f"{m}:n")] = ok
            values[:, self.col(f"{m}:clean")] = np.where(ok, c, 0.0)
            values[:, self.col(f"{m}:perturbed")] = np.where(ok, p, 0.0)
            if m in self.binary:
                values[:, self.col(f"{m}:correct_to_wrong")] = ok & (c == 1) & (p == 0)
                values[:, self.col(f"{m}:wrong_to_correct")] = ok & (c == 0) & (p == 1)
                values[:, self.col(f"{m}:net_loss")] = (
                    values[:, self.col(f"{m}:correct_to_wrong")]
                    - values[:, self.col(f"{m}:wrong_to_correct")]
                )
        for m in self.corpus:
            assert corpus_clean is not None and corpus_perturbed is not None and has_ref is not None
            values[:, self.col(f"{m}:n")] = has_ref
            values[:, self.cols[f"{m}:clean"]] = corpus_clean[m]
            values[:, self.cols[f"{m}:perturbed"]] = corpus_perturbed[m]
        return values

    def side(self, cell: Cell, m: str, side: str) -> tuple[float, np.ndarray | None]:
        """Score of metric ``m`` on ``side`` ('clean' or 'perturbed'): point and resamples."""
        point, boot = cell.point, cell.boot
        n_col = self.col(f"{m}:n")
        if m in self.corpus:
            stats = self.cols[f"{m}:{side}"]
            pt = float(corpus_score(m, point[stats])) if point[n_col] > 0 else math.nan
            if boot is None:
                return pt, None
            return pt, np.where(boot[:, n_col] > 0, corpus_score(m, boot[:, stats]), np.nan)
        return _ratio(point, boot, self.col(f"{m}:{side}"), n_col)

    def n(self, cell: Cell, m: str) -> int:
        """Number of pairs on which metric ``m`` is defined in ``cell``."""
        return round(cell.point[self.col(f"{m}:n")])


def _ratio(
    point: np.ndarray, boot: np.ndarray | None, num: int, den: int
) -> tuple[float, np.ndarray | None]:
    """Column ``num`` over column ``den`` of a cell's sums: point and resamples (NaN where the
    denominator is 0)."""
    n = point[den]
    pt = point[num] / n if n > 0 else math.nan
    if boot is None:
        return pt, None
    nb = boot[:, den]
    with np.errstate(invalid="ignore", divide="ignore"):
        return pt, np.where(nb > 0, boot[:, num] / np.where(nb > 0, nb, 1), np.nan)


class _IntervalBatch:
    """Collects (target, key, point, resamples) and fills estimate + CI in batches."""

    def __init__(self, level: float):
        self.level = level
        self.items: list[tuple[dict[str, Any], str, float, np.ndarray | None]] = []

    def add(self, target: dict[str, Any], key: str, point: float, boot: np.ndarray | None) -> None:
        self.items.append((target, key, point, boot))
        if len(self.items) >= 2048:
            self.flush()

    def flush(self) -> None:
        with_boot = [it for it in self.items if it[3] is not None]
        if with_boot:
            S = np.stack([it[3] for it in with_boot], axis=1)  # type: ignore[misc]
            lo, hi = percentile_ci(S, self.level)
            for (tgt, key, pt, _), a, b in zip(with_boot, lo, hi, strict=True):
                tgt[key] = {"estimate": six_digits(pt), "ci": [six_digits(a), six_digits(b)]}
        for tgt, key, pt, bt in self.items:
            if bt is None:
                tgt[key] = {"estimate": six_digits(pt), "ci": None}
        self.items = []


def summarize(cell: Cell, layout: Layout, intervals: _IntervalBatch) -> dict[str, Any]:
    """Per-metric clean / perturbed / delta / relative drop / flips / McNemar of one cell."""
    out: dict[str, Any] = {"n_pairs": cell.n_rows, "n_clusters": cell.n_clusters, "metrics": {}}
    point, boot = cell.point, cell.boot
    rows = point[layout.col("rows")]
    changed = point[layout.col("changed")]
    changed_boot = None
    if boot is not None:
        _, changed_boot = _ratio(point, boot, layout.col("changed"), layout.col("rows"))
    intervals.add(out, "answer_changed_rate", changed / rows if rows else math.nan, changed_boot)
    for m in layout.item + layout.corpus:
        n = layout.n(cell, m)
        if n == 0:
            continue
        d: dict[str, Any] = {"n": n}
        c, cb = layout.side(cell, m, "clean")
        p, pb = layout.side(cell, m, "perturbed")
        intervals.add(d, "clean", c, cb)
        intervals.add(d, "perturbed", p, pb)
        intervals.add(d, "delta", p - c, None if cb is None or pb is None else pb - cb)
        with np.errstate(invalid="ignore", divide="ignore"):
            rd = (c - p) / c if c else math.nan
            rdb = (
                None
                if cb is None or pb is None
                else np.where(cb != 0, (cb - pb) / np.where(cb != 0, cb, 1), np.nan)
            )
        intervals.add(d, "relative_drop", rd, rdb)
        if m in layout.binary:
            n_col = layout.col(f"{m}:n")
            lost_col = layout.col(f"{m}:correct_to_wrong")
            gained_col = layout.col(f"{m}:wrong_to_correct")
            lost, gained = point[lost_col], point[gained_col]
            lost_boot = gained_boot = None
            if boot is not None:
                _, lost_boot = _ratio(point, boot, lost_col, n_col)
                _, gained_boot = _ratio(point, boot, gained_col, n_col)
            intervals.add(d, "flip_correct_to_wrong", lost / n, lost_boot)
            intervals.add(d, "flip_wrong_to_correct", gained / n, gained_boot)
            net_col = layout.col(f"{m}:net_loss")
            test: dict[str, float | int | None] = {**mcnemar(round(lost), round(gained))}
            one_image = cell.n_clusters < 2 or cell.cluster_sq is None  # no spread to weigh
            test["p_clustered"] = clustered_mcnemar(
                point[net_col], None if one_image else cell.cluster_sq[net_col]  # type: ignore[index]
            )
            d["mcnemar"] = {
                k: (six_digits(v) if isinstance(v, float) else v) for k, v in test.items()
            }
        out["metrics"][m] = d
    return out


# ----------------------------------------------------------------------------- grouping helpers


def group_codes(
    cols: Sequence[np.ndarray], mask: np.ndarray
) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """Codes of the sorted distinct label tuples of the masked rows (-1 elsewhere or on NA)."""
    n = len(mask)
    codes = np.full(n, -1, dtype=np.int64)
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return codes, []
    combo = np.zeros(idx.size, dtype=np.int64)
    uniqs = []
    valid = np.ones(idx.size, dtype=bool)
    for c in cols:
        col = np.asarray(c, dtype=object)[idx]
        cc, u = pd.factorize(col, sort=True, use_na_sentinel=True)
        valid &= cc >= 0
        combo = combo * (len(u) + 1) + cc
        uniqs.append(list(u))
    uc, inv = np.unique(combo[valid], return_inverse=True)
    labels = []
    for k in uc:
        parts = []
        for u in reversed(uniqs):
            k, r = divmod(int(k), len(u) + 1)
            parts.append(_plain(u[r]))
        labels.append(tuple(reversed(parts)))
    sub = np.full(idx.size, -1, dtype=np.int64)
    sub[valid] = inv.reshape(-1)
    codes[idx] = sub
    return codes, labels


def _plain(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return int(x) if float(x).is_integer() else float(x)
    return x


@dataclass
class ModelData:
    """One model's pairs with per-pair metric values."""

    name: str
    pairs: pd.DataFrame
    item_clean: dict[str, np.ndarray]  # per-item metric -> clean value of each pair
    item_perturbed: dict[str, np.ndarray]  # per-item metric -> perturbed value of each pair
    corpus_stats_clean: dict[str, np.ndarray]  # corpus metric -> clean sufficient statistics
    corpus_stats_perturbed: dict[str, np.ndarray]  # corpus metric -> perturbed statistics
    judge_by_class_clean: list[dict[str, float]]  # per pair: question class -> judge score
    judge_by_class_perturbed: list[dict[str, float]]
    images: Callable[[int], tuple[str | None, str | None]] | None = None
    answer_changed: np.ndarray | None = None  # 1.0 where the perturbed answer differs


@dataclass
class ReferenceScores:
    """A reference model's errors for CE: from this run (name) or from a scores.json."""

    name: str
    model: str | None = None  # in-run model name
    values: dict[str, dict[str, Any]] | None = None  # perturbation -> {"clean": x, "sev": {s: x}}


def analyze(
    models: Sequence[ModelData],
    item_metrics: Sequence[str],
    corpus_metrics: Sequence[str],
    primary: str,
    *,
    include_at_risk: bool,
    n_boot: int,
    seed: int,
    level: float = 0.95,
    reference: ReferenceScores | None = None,
    max_flips: int = 20,
    extra_binary: Sequence[str] = (),
) -> dict[str, Any]:
    """Run every paired comparison; returns the ``models`` / ``effective_robustness`` sections.

    ``extra_binary``: metrics whose values are all 0/1 in this run (e.g. an LLM judge scoring
    0/1), which then get flip rates and McNemar tests like the always-binary metrics.
    """
    binary = [m for m in item_metrics if METRICS[m].binary or m in extra_binary]
    layout = Layout(list(item_metrics), binary, list(corpus_metrics))
    cons_layout = Layout(list(item_metrics), binary, [])
    # global cluster universe: img_id across models
    all_ids = np.concatenate([md.pairs["img_id"].to_numpy(dtype=object) for md in models])
    _, uniq_ids = pd.factorize(pd.Series(all_ids, dtype=object), sort=True)
    id_index = pd.Index(uniq_ids)
    engine = CellEngine(n_clusters=len(uniq_ids), n_boot=n_boot, seed=seed)
    meta: dict[str, Any] = {}
    for md in models:
        meta[md.name] = _add_model_cells(md, layout, cons_layout, engine, id_index, include_at_risk)
    engine.run()
    intervals = _IntervalBatch(level)
    out: dict[str, Any] = {}
    for md in models:
        out[md.name] = _model_section(
            md, meta[md.name], layout, cons_layout, engine, intervals, primary, max_flips
        )
    ce_ref = reference
    if ce_ref is not None:
        for md in models:
            out[md.name]["corruption_error"] = _corruption_error(
                md.name, meta, engine, layout, primary, ce_ref, intervals
            )
    er = _effective_robustness([md.name for md in models], meta, engine, layout, primary, intervals)
    intervals.flush()
    return unwrap_slots({"models": out, "effective_robustness": er})


def _changed(md: ModelData) -> np.ndarray:
    return answers_differ(
        md.pairs["pred_clean"].to_numpy(dtype=object), md.pairs["pred_pert"].to_numpy(dtype=object)
    ).astype(np.float64)


def _add_model_cells(
    md: ModelData,
    layout: Layout,
    cons_layout: Layout,
    engine: CellEngine,
    id_index: pd.Index,
    include_at_risk: bool,
) -> dict[str, Any]:
    """Register every cell of one model with the engine; returns what the sections need
    (perturbations, perturbation x severity labels, worst-of-k's k)."""
    pairs = md.pairs
    n = len(pairs)
    changed = md.answer_changed if md.answer_changed is not None else _changed(md)
    has_ref = (~pd.isna(pairs["reference"].to_numpy(dtype=object))).astype(np.float64)
    values = layout.fill(
        changed,
        md.item_clean,
        md.item_perturbed,
        md.corpus_stats_clean,
        md.corpus_stats_perturbed,
        has_ref,
    )
    cells = _ModelCells(
        md.name, engine, values, id_index.get_indexer(pairs["img_id"].to_numpy(dtype=object))
    )
    at_risk = pairs["at_risk"].to_numpy(dtype=bool)
    head = np.ones(n, dtype=bool) if include_at_risk else ~at_risk
    pert = pairs["perturbation"].to_numpy(dtype=object)
    sev = pairs["severity"].to_numpy(np.int64)
    complexity = pairs["complexity"].to_numpy(dtype=object, na_value=None)
    everything = np.full(n, ALL, dtype=object)
    info: dict[str, Any] = {}
    cells.add("overall", [everything], head)
    # both pair sets, whatever the headline uses
    cells.add("overall_all_pairs", [everything], np.ones(n, dtype=bool))
    cells.add("overall_label_safe", [everything], ~at_risk)
    info["perturbations"] = [lab[0] for lab in cells.add("perturbation", [pert], head)]
    info["pert_sev"] = cells.add("perturbation_severity", [pert, sev], head)
    with_complexity = head & np.array([c is not None for c in complexity])
    cells.add("complexity", [everything, complexity], with_complexity)
    cells.add("perturbation_complexity", [pert, complexity], with_complexity)
    _add_question_class_cells(md, layout, cells, head)
    # at-risk pairs, reported separately: per perturbation, and per class at risk
    cells.add("at_risk_perturbation", [pert], at_risk)
    pair_of, risk_class = _explode(pairs["classes_at_risk"].to_numpy(dtype=object))
    if pair_of.size:
        cells.add(
            "at_risk_question_class",
            [pert[pair_of], risk_class],
            np.ones(pair_of.size, dtype=bool),
            values[pair_of],
            cells.cluster[pair_of],
        )
    info["include_at_risk"] = include_at_risk
    # worst-of-k over variants (consensus for binary metrics)
    info["k"] = _add_consensus(md, cons_layout, engine, cells.cluster, changed, head)
    return info


@dataclass
class _ModelCells:
    """Adds one model's cells to the engine: rows grouped by label columns."""

    model: str
    engine: CellEngine
    values: np.ndarray  # per-pair value matrix (Layout.fill)
    cluster: np.ndarray  # per pair: index of its img_id among all models' img_ids

    def add(
        self,
        part: str,
        cols: Sequence[np.ndarray],
        mask: np.ndarray,
        values: np.ndarray | None = None,
        cluster: np.ndarray | None = None,
    ) -> list[tuple[Any, ...]]:
        """Cells ``(model, part, *labels)`` of the masked rows, one per distinct label tuple
        of ``cols``; returns the labels. ``values`` / ``cluster`` replace the pairs' own for
        exploded rows."""
        codes, labels = group_codes(cols, mask)
        self.engine.add(
            [(self.model, part, *lab) for lab in labels],
            codes,
            self.cluster if cluster is None else cluster,
            self.values if values is None else values,
        )
        return labels


def _explode(per_pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per (pair, item) of per-pair tuples: the pair index of each row and the item."""
    lengths = np.fromiter((len(q) for q in per_pair), dtype=np.int64, count=len(per_pair))
    pair_of = np.repeat(np.arange(len(per_pair)), lengths)
    return pair_of, np.array([c for q in per_pair for c in q], dtype=object)


def _add_question_class_cells(
    md: ModelData, layout: Layout, cells: _ModelCells, head: np.ndarray
) -> None:
    """Cells per question class (pooled and per perturbation): one exploded row per
    (pair, class); the judge metric uses the class's own score."""
    pair_of, classes = _explode(md.pairs["question_class"].to_numpy(dtype=object))
    if not pair_of.size:
        return
    values = cells.values[pair_of]
    if "judge" in layout.item:
        judge_clean = np.array(
            [
                md.judge_by_class_clean[i].get(c, np.nan)
                for i, c in zip(pair_of, classes, strict=True)
            ]
        )
        judge_pert = np.array(
            [
                md.judge_by_class_perturbed[i].get(c, np.nan)
                for i, c in zip(pair_of, classes, strict=True)
            ]
        )
        ok = ~np.isnan(judge_clean) & ~np.isnan(judge_pert)
        values[:, layout.col("judge:n")] = ok
        values[:, layout.col("judge:clean")] = np.where(ok, judge_clean, 0)
        values[:, layout.col("judge:perturbed")] = np.where(ok, judge_pert, 0)
    in_head = head[pair_of]
    cluster = cells.cluster[pair_of]
    pert = md.pairs["perturbation"].to_numpy(dtype=object)
    everything = np.full(pair_of.size, ALL, dtype=object)
    cells.add("question_class", [everything, classes], in_head, values, cluster)
    cells.add("perturbation_question_class", [pert[pair_of], classes], in_head, values, cluster)


def _add_consensus(
    md: ModelData,
    layout: Layout,
    engine: CellEngine,
    cluster: np.ndarray,
    changed: np.ndarray,
    head: np.ndarray,
) -> dict[str, int]:
    """Worst-of-k cells: each (perturbation, severity, image, question) unit counts once with
    its worst variant (its clean side is the same for every variant). Returns k's range."""
    pairs = md.pairs
    idx = np.flatnonzero(head)
    if idx.size == 0:
        return {"min": 0, "max": 0}
    df = pd.DataFrame(
        {
            "perturbation": pairs["perturbation"].to_numpy(dtype=object)[idx],
            "severity": pairs["severity"].to_numpy(np.int64)[idx],
            "img_id": pairs["img_id"].to_numpy(dtype=object)[idx],
            "question": pairs["question"].to_numpy(dtype=object)[idx],
        }
    )
    unit = df.groupby(list(df.columns), sort=True).ngroup().to_numpy()
    order = np.argsort(unit, kind="stable")
    sorted_units = unit[order]
    starts = np.flatnonzero(np.r_[True, sorted_units[1:] != sorted_units[:-1]])
    k = np.diff(np.r_[starts, len(sorted_units)])
    if k.max(initial=0) <= 1:
        return {"min": int(k.min(initial=0)), "max": int(k.max(initial=0))}
    rows = idx[order]
    first = rows[starts]
    unit_clean: dict[str, np.ndarray] = {}
    unit_worst: dict[str, np.ndarray] = {}
    for m in layout.item:
        clean = md.item_clean[m][rows]
        pert = md.item_perturbed[m][rows]
        clean_ok = np.minimum.reduceat(~np.isnan(clean), starts)
        pert_ok = np.minimum.reduceat(~np.isnan(pert), starts)
        worst = np.minimum.reduceat(np.where(np.isnan(pert), np.inf, pert), starts)
        valid = clean_ok & pert_ok
        unit_clean[m] = np.where(valid, md.item_clean[m][first], np.nan)
        unit_worst[m] = np.where(valid, worst, np.nan)
    any_changed = np.maximum.reduceat(changed[rows], starts)
    values = layout.fill(any_changed, unit_clean, unit_worst)
    unit_pert = pairs["perturbation"].to_numpy(dtype=object)[first]
    unit_sev = pairs["severity"].to_numpy(np.int64)[first]
    ones = np.ones(len(first), dtype=bool)
    for part, cols in (
        ("worst_of_k_perturbation", [unit_pert]),
        ("worst_of_k_perturbation_severity", [unit_pert, unit_sev]),
    ):
        codes, labels = group_codes(cols, ones)
        engine.add([(md.name, part, *lab) for lab in labels], codes, cluster[first], values)
    return {"min": int(k.min()), "max": int(k.max())}


def _cells(engine: CellEngine, name: str, part: str) -> dict[tuple[Any, ...], Cell]:
    return {key[2:]: c for key, c in engine.cells.items() if key[0] == name and key[1] == part}


def _model_section(
    md: ModelData,
    info: dict[str, Any],
    layout: Layout,
    cons_layout: Layout,
    engine: CellEngine,
    intervals: _IntervalBatch,
    primary: str,
    max_flips: int,
) -> dict[str, Any]:
    name = md.name

    def summary(cell: Cell, cell_layout: Layout = layout) -> dict[str, Any]:
        return summarize(cell, cell_layout, intervals)

    section: dict[str, Any] = {}
    overall = _cells(engine, name, "overall")
    section["overall"] = summary(overall[(ALL,)]) if overall else None
    for part in ("overall_all_pairs", "overall_label_safe"):
        cells = _cells(engine, name, part)
        section[part] = summary(cells[(ALL,)]) if cells else None
    section["by_perturbation"] = {
        key[0]: summary(cell) for key, cell in _cells(engine, name, "perturbation").items()
    }
    nested: dict[str, dict[str, Any]] = {}
    for (pert, sev), cell in _cells(engine, name, "perturbation_severity").items():
        nested.setdefault(pert, {})[str(sev)] = summary(cell)
    section["by_perturbation_severity"] = nested
    for part, key in (("complexity", "by_complexity"), ("question_class", "by_question_class")):
        by_group: dict[str, dict[str, Any]] = {}
        for (group, value), cell in _cells(engine, name, part).items():
            by_group.setdefault(group, {})[str(value)] = summary(cell)
        for (group, value), cell in _cells(engine, name, f"perturbation_{part}").items():
            by_group.setdefault(group, {})[str(value)] = summary(cell)
        section[key] = by_group
    worst_of_k: dict[str, Any] = {
        "k": info["k"],
        "by_perturbation": {},
        "by_perturbation_severity": {},
    }
    for (pert,), cell in _cells(engine, name, "worst_of_k_perturbation").items():
        worst_of_k["by_perturbation"][pert] = summary(cell, cons_layout)
    for (pert, sev), cell in _cells(engine, name, "worst_of_k_perturbation_severity").items():
        worst_of_k["by_perturbation_severity"].setdefault(pert, {})[str(sev)] = summary(
            cell, cons_layout
        )
    section["worst_of_k"] = worst_of_k
    risk: dict[str, Any] = {"by_perturbation": {}, "by_question_class": {}}
    for (pert,), cell in _cells(engine, name, "at_risk_perturbation").items():
        risk["by_perturbation"][pert] = summary(cell)
    for (pert, question_class), cell in _cells(engine, name, "at_risk_question_class").items():
        risk["by_question_class"].setdefault(pert, {})[question_class] = summary(cell)
    section["at_risk"] = risk
    section["severity_curves"] = _severity_curves(name, engine, layout, intervals)
    section["flips"] = _flips(md, primary, max_flips, info["include_at_risk"])
    return section


def _severity_curves(
    name: str, engine: CellEngine, layout: Layout, intervals: _IntervalBatch
) -> dict[str, Any]:
    """Per perturbation and metric: the perturbed score and delta at each severity, and the
    area under the severity curve."""
    per_pert = _cells(engine, name, "perturbation")
    per_pert_sev = _cells(engine, name, "perturbation_severity")
    out: dict[str, Any] = {}
    for (pert,), pooled in per_pert.items():
        sevs = sorted(s for (q, s) in per_pert_sev if q == pert and s >= 1)
        if not sevs:
            continue
        curves: dict[str, Any] = {}
        for m in layout.item + layout.corpus:
            if layout.n(pooled, m) == 0:
                continue
            cells = [per_pert_sev[(pert, s)] for s in sevs]
            if any(layout.n(c, m) == 0 for c in cells):
                continue
            curves[m] = _severity_curve(layout, pooled, cells, m, sevs, intervals)
        out[pert] = curves
    return out


def _severity_curve(
    layout: Layout,
    pooled: Cell,
    cells: Sequence[Cell],
    m: str,
    sevs: list[int],
    intervals: _IntervalBatch,
) -> dict[str, Any]:
    """One metric's curve over the severity cells ``cells`` (clean level from ``pooled``)."""
    clean_pt, clean_boot = layout.side(pooled, m, "clean")
    per_sev = [layout.side(c, m, "perturbed") for c in cells]
    y_pt = np.array([v for v, _ in per_sev])
    y_boot = (
        np.stack([b for _, b in per_sev if b is not None], axis=1)
        if clean_boot is not None and all(b is not None for _, b in per_sev)
        else None
    )
    curve: dict[str, Any] = {"severities": sevs, "perturbed": [], "delta": []}
    intervals.add(curve, "clean", clean_pt, clean_boot)
    for j in range(len(sevs)):
        slot: dict[str, Any] = {}
        intervals.add(slot, "v", float(y_pt[j]), None if y_boot is None else y_boot[:, j])
        curve["perturbed"].append(slot)
        delta_slot: dict[str, Any] = {}
        intervals.add(
            delta_slot,
            "v",
            float(y_pt[j] - clean_pt),
            None if y_boot is None else y_boot[:, j] - clean_boot,
        )
        curve["delta"].append(delta_slot)
    sev_arr = np.array(sevs, dtype=np.float64)
    area = float(area_under_severity_curve(np.array(clean_pt), y_pt, sev_arr))
    area_boot = (
        area_under_severity_curve(clean_boot, y_boot, sev_arr)
        if (y_boot is not None and clean_boot is not None)
        else None
    )
    intervals.add(curve, "ausc", area, area_boot)
    intervals.add(
        curve, "delta_ausc", area - clean_pt, None if area_boot is None else area_boot - clean_boot
    )
    return curve


def unwrap_slots(obj: Any) -> Any:
    """Replace the ``{"v": x}`` slots used while filling CIs by their content."""
    if isinstance(obj, dict):
        if set(obj) == {"v"}:
            return unwrap_slots(obj["v"])
        return {k: unwrap_slots(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unwrap_slots(v) for v in obj]
    return obj


def _flips(
    md: ModelData, primary: str, max_flips: int, include_at_risk: bool = False
) -> list[dict[str, Any]]:
    """The largest drops of ``primary`` among the headline pairs, chosen across perturbations.

    Perturbations take turns (the one with the most negative mean delta first), each giving its
    largest remaining drop on an image not shown yet where it has one, so a run where every flip
    is 100 -> 0 still shows every op's worst case on varied images rather than the first ops in
    alphabetical order.
    """
    pairs = md.pairs
    clean = md.item_clean[primary]
    pert_vals = md.item_perturbed[primary]
    head = np.ones(len(pairs), dtype=bool)
    if not include_at_risk:
        head = ~pairs["at_risk"].to_numpy(dtype=bool)
    drop = clean - pert_vals
    chosen = _choose_flips(md, primary, max_flips, head, drop)
    out = []
    for i in chosen:
        row = pairs.iloc[int(i)]
        img_c, img_p = md.images(int(i)) if md.images is not None else (None, None)
        out.append(
            {
                "perturbation": row["perturbation"],
                "severity": int(row["severity"]),
                "variant": int(row["variant"]),
                "img_id": row["img_id"],
                "question": row["question"],
                "reference": row["reference"],
                "prediction_clean": row["pred_clean"],
                "prediction_perturbed": row["pred_pert"],
                "metric": primary,
                "clean": six_digits(clean[i]),
                "perturbed": six_digits(pert_vals[i]),
                "image_clean": img_c,
                "image_perturbed": img_p,
            }
        )
    return out


def _choose_flips(
    md: ModelData, primary: str, max_flips: int, head: np.ndarray, drop: np.ndarray
) -> list[int]:
    """Pair indices of the flips to show, in order (see :func:`_flips`)."""
    pairs = md.pairs
    candidates = np.flatnonzero(head & np.isfinite(drop) & (drop > 0))
    if candidates.size == 0:
        return []
    second = None  # tie-break: the drop of a graded text metric
    for m in ("token_f1", "rougeL", "exact_match_tolerant"):
        if m != primary and m in md.item_clean:
            second = md.item_clean[m] - md.item_perturbed[m]
            break
    pert = pairs["perturbation"].to_numpy(dtype=object)
    ok = head & np.isfinite(drop)
    op_gap = pd.Series(-drop[ok]).groupby(pert[ok]).mean()
    df = pd.DataFrame(
        {
            "pair": candidates,
            "gain": -drop[candidates],
            "second_gain": -(
                np.nan_to_num(second[candidates])
                if second is not None
                else np.zeros(candidates.size)
            ),
            "op": pert[candidates],
            "minus_severity": -pairs["severity"].to_numpy(np.int64)[candidates],
            "variant": pairs["variant"].to_numpy(np.int64)[candidates],
            "img": pairs["img_id"].to_numpy(dtype=object)[candidates],
            "question": pairs["question"].to_numpy(dtype=object)[candidates],
        }
    ).sort_values(
        ["gain", "second_gain", "minus_severity", "op", "img", "question", "variant"],
        kind="stable",
    )
    # one image per op (the same image under one op would repeat), then ops take turns, each
    # preferring an image not shown yet
    df = df.drop_duplicates(["op", "img"], keep="first")
    queues = {op: list(g["pair"]) for op, g in df.groupby("op", sort=False)}
    img_of = dict(zip(df["pair"], df["img"], strict=True))
    order = sorted(queues, key=lambda op: (float(op_gap.get(op, 0.0)), str(op)))
    chosen: list[int] = []
    shown: set[Any] = set()
    while len(chosen) < max_flips and any(queues.values()):
        for op in order:
            queue = queues[op]
            if not queue or len(chosen) >= max_flips:
                continue
            k = next((j for j, i in enumerate(queue) if img_of[i] not in shown), 0)
            i = queue.pop(k)
            chosen.append(i)
            shown.add(img_of[i])
    return chosen


# ----------------------------------------------------------------------------- CE and ER


def _series(
    engine: CellEngine, layout: Layout, name: str, pert: str, m: str
) -> dict[str, Any] | None:
    """Clean and per-severity perturbed scores (point, resamples) of one model/perturbation."""
    pooled = engine.cells.get((name, "perturbation", pert))
    if pooled is None or layout.n(pooled, m) == 0:
        return None
    sev = {}
    for key, cell in engine.cells.items():
        s = key[3] if len(key) > 3 else None
        if (
            key[:3] == (name, "perturbation_severity", pert)
            and isinstance(s, int)
            and s >= 1
            and layout.n(cell, m)
        ):
            sev[s] = layout.side(cell, m, "perturbed")
    return {"clean": layout.side(pooled, m, "clean"), "sev": sev}


def _reference_series(
    engine: CellEngine, layout: Layout, ref: ReferenceScores, pert: str, m: str
) -> dict[str, Any] | None:
    """The reference's series of one perturbation: from this run, or from its scores.json
    (points only)."""
    if ref.model is not None:
        return _series(engine, layout, ref.model, pert, m)
    vals = (ref.values or {}).get(pert)
    if vals is None:
        return None
    return {
        "clean": (vals["clean"], None),
        "sev": {int(s): (v, None) for s, v in vals["sev"].items()},
    }


def _errors(
    series: dict[str, Any], sevs: list[int]
) -> tuple[np.ndarray, np.ndarray | None, float, np.ndarray | None]:
    """Errors E = 1 - score at ``sevs`` and clean: (points, resamples, clean point, clean
    resamples)."""
    pts = np.array([1 - series["sev"][s][0] for s in sevs])
    boots = [series["sev"][s][1] for s in sevs]
    boot = None if any(b is None for b in boots) else 1 - np.stack(boots, axis=1)
    clean_pt, clean_boot = series["clean"]
    return pts, boot, 1 - clean_pt, (None if clean_boot is None else 1 - clean_boot)


def _corruption_error(
    name: str,
    meta: dict[str, Any],
    engine: CellEngine,
    layout: Layout,
    m: str,
    ref: ReferenceScores,
    intervals: _IntervalBatch,
) -> dict[str, Any]:
    """ImageNet-C CE = sum_s E_s / sum_s E_s(ref); relative CE subtracts clean errors.

    E = 1 - score of metric ``m``. Per perturbation over the severities both models have;
    mCE / relative mCE average the perturbations.
    """
    out: dict[str, Any] = {"reference": ref.name, "metric": m, "by_perturbation": {}}
    ce_pts, ce_boots, rce_pts, rce_boots = [], [], [], []
    for pert in meta[name]["perturbations"]:
        mine = _series(engine, layout, name, pert, m)
        if mine is None:
            continue
        theirs = _reference_series(engine, layout, ref, pert, m)
        if theirs is None:
            continue
        sevs = sorted(set(mine["sev"]) & set(theirs["sev"]))
        if not sevs:
            continue
        ce, ce_boot, rce, rce_boot = _ce_of(_errors(mine, sevs), _errors(theirs, sevs))
        d: dict[str, Any] = {"severities": sevs}
        intervals.add(d, "ce", ce, ce_boot)
        intervals.add(d, "relative_ce", rce, rce_boot)
        out["by_perturbation"][pert] = d
        ce_pts.append(ce)
        rce_pts.append(rce)
        ce_boots.append(ce_boot)
        rce_boots.append(rce_boot)
    if ce_pts:
        intervals.add(out, "mce", float(np.mean(ce_pts)), _mean_cols(ce_boots))
        intervals.add(out, "relative_mce", float(np.mean(rce_pts)), _mean_cols(rce_boots))
    return out


_Errors = tuple[np.ndarray, np.ndarray | None, float, np.ndarray | None]


def _ce_of(
    mine: _Errors, theirs: _Errors
) -> tuple[float, np.ndarray | None, float, np.ndarray | None]:
    """CE and relative CE of one perturbation (points and resamples) from both models' errors."""
    err, err_boot, clean_err, clean_err_boot = mine
    ref_err, ref_boot, ref_clean, ref_clean_boot = theirs
    with np.errstate(invalid="ignore", divide="ignore"):
        ce = err.sum() / ref_err.sum() if ref_err.sum() > 0 else math.nan
        rel_den = (ref_err - ref_clean).sum()
        rce = (err - clean_err).sum() / rel_den if rel_den > 0 else math.nan
        ce_boot = rce_boot = None
        if err_boot is not None:
            ref_sum = (
                ref_boot.sum(axis=1)
                if ref_boot is not None
                else np.full(err_boot.shape[0], ref_err.sum())
            )
            ce_boot = np.where(
                ref_sum > 0, err_boot.sum(axis=1) / np.where(ref_sum > 0, ref_sum, 1), np.nan
            )
            if clean_err_boot is not None:
                rel_den_boot = (
                    (ref_boot - ref_clean_boot[:, None]).sum(axis=1)
                    if (ref_boot is not None and ref_clean_boot is not None)
                    else np.full(err_boot.shape[0], rel_den)
                )
                rce_boot = np.where(
                    rel_den_boot > 0,
                    (err_boot - clean_err_boot[:, None]).sum(axis=1)
                    / np.where(rel_den_boot > 0, rel_den_boot, 1),
                    np.nan,
                )
    return ce, ce_boot, rce, rce_boot


def _mean_cols(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    """Row-wise mean of resample vectors (None if any is missing)."""
    if not arrays or any(a is None for a in arrays):
        return None
    return np.mean(np.stack([a for a in arrays if a is not None], axis=1), axis=1)


def _effective_robustness(
    names: list[str],
    meta: dict[str, Any],
    engine: CellEngine,
    layout: Layout,
    m: str,
    intervals: _IntervalBatch,
) -> dict[str, Any]:
    """Effective robustness of each model, pooled and per perturbation all models share."""
    if len(names) < 3:
        return {"computed": False, "reason": f"needs scores of at least 3 models, got {len(names)}"}
    if m not in layout.item + layout.corpus:
        return {"computed": False, "reason": f"metric {m} not available"}
    out: dict[str, Any] = {"computed": True, "metric": m, "models": names, "by_perturbation": {}}
    common = set(meta[names[0]]["perturbations"])
    for other in names[1:]:
        common &= set(meta[other]["perturbations"])
    groups = [(ALL, "overall", (ALL,))] + [(p, "perturbation", (p,)) for p in sorted(common)]
    for label, part, key in groups:
        cells = [engine.cells.get((model, part, *key)) for model in names]
        if any(c is None or layout.n(c, m) == 0 for c in cells):
            continue
        clean = [layout.side(c, m, "clean") for c in cells]  # type: ignore[arg-type]
        pert = [layout.side(c, m, "perturbed") for c in cells]  # type: ignore[arg-type]
        er_pt = effective_robustness(
            np.array([v for v, _ in clean]), np.array([v for v, _ in pert])
        )
        have_boot = all(b is not None for _, b in clean + pert)
        clean_boot = [b for _, b in clean if b is not None]
        pert_boot = [b for _, b in pert if b is not None]
        er_boot = (
            effective_robustness(np.stack(clean_boot, axis=1), np.stack(pert_boot, axis=1))
            if have_boot
            else None
        )
        d: dict[str, Any] = {}
        for j, model in enumerate(names):
            intervals.add(d, model, float(er_pt[j]), None if er_boot is None else er_boot[:, j])
        out["by_perturbation"][label] = d
    return out


def load_reference_scores(
    scores: Mapping[str, Any], name: str, model: str | None, metric: str, source: str
) -> ReferenceScores:
    """Reference errors for CE from a previous run's scores.json content."""
    from perturb.errors import InputError

    models = scores.get("models")
    if not isinstance(models, Mapping) or not models:
        raise InputError(f"{source}: not a perturb scores.json (no 'models' section)")
    key = model if model in models else (next(iter(models)) if len(models) == 1 else None)
    if key is None:
        raise InputError(
            f"{source}: holds models {sorted(models)}; name the one to use: --reference {sorted(models)[0]}={source}"
        )
    model_scores = models[key]
    values: dict[str, dict[str, Any]] = {}
    for pert, by_sev in (model_scores.get("by_perturbation_severity") or {}).items():
        pooled = (
            (model_scores.get("by_perturbation") or {}).get(pert, {}).get("metrics", {}).get(metric)
        )
        if not pooled:
            continue
        sev = {}
        for s, cell in by_sev.items():
            at_sev = cell.get("metrics", {}).get(metric)
            if at_sev and int(s) >= 1 and at_sev["perturbed"]["estimate"] is not None:
                sev[int(s)] = float(at_sev["perturbed"]["estimate"])
        if sev and pooled["clean"]["estimate"] is not None:
            values[pert] = {"clean": float(pooled["clean"]["estimate"]), "sev": sev}
    if not values:
        raise InputError(
            f"{source}: no per-severity '{metric}' scores for model {key!r}; score the reference with "
            f"the same primary metric (--primary {metric})."
        )
    return ReferenceScores(name=name, values=values)
