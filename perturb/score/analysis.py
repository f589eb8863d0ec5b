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
    effective_robustness,
    mcnemar,
    percentile_ci,
)

ALL = "(all)"
PRIMARY_ORDER = ("mcq", "yesno", "box_iou", "judge", "rougeL", "token_f1", "exact_match_tolerant")


def r6(x: Any) -> float | None:
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
    indicators); per corpus metric ``m:n`` and its sufficient statistics ``m:clean`` /
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


class _CI:
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
                tgt[key] = {"estimate": r6(pt), "ci": [r6(a), r6(b)]}
        for tgt, key, pt, bt in self.items:
            if bt is None:
                tgt[key] = {"estimate": r6(pt), "ci": None}
        self.items = []


def summarize(cell: Cell, layout: Layout, acc: _CI) -> dict[str, Any]:
    """Per-metric clean / perturbed / delta / relative drop / flips / McNemar of one cell."""
    out: dict[str, Any] = {"n_pairs": cell.n_rows, "n_clusters": cell.n_clusters, "metrics": {}}
    point, boot = cell.point, cell.boot
    rows = point[layout.col("rows")]
    changed = point[layout.col("changed")]
    changed_boot = None
    if boot is not None:
        _, changed_boot = _ratio(point, boot, layout.col("changed"), layout.col("rows"))
    acc.add(out, "answer_changed_rate", changed / rows if rows else math.nan, changed_boot)
    for m in layout.item + layout.corpus:
        n = layout.n(cell, m)
        if n == 0:
            continue
        d: dict[str, Any] = {"n": n}
        c, cb = layout.side(cell, m, "clean")
        p, pb = layout.side(cell, m, "perturbed")
        acc.add(d, "clean", c, cb)
        acc.add(d, "perturbed", p, pb)
        acc.add(d, "delta", p - c, None if cb is None or pb is None else pb - cb)
        with np.errstate(invalid="ignore", divide="ignore"):
            rd = (c - p) / c if c else math.nan
            rdb = (
                None
                if cb is None or pb is None
                else np.where(cb != 0, (cb - pb) / np.where(cb != 0, cb, 1), np.nan)
            )
        acc.add(d, "relative_drop", rd, rdb)
        if m in layout.binary:
            n_col = layout.col(f"{m}:n")
            lost_col = layout.col(f"{m}:correct_to_wrong")
            gained_col = layout.col(f"{m}:wrong_to_correct")
            lost, gained = point[lost_col], point[gained_col]
            lost_boot = gained_boot = None
            if boot is not None:
                _, lost_boot = _ratio(point, boot, lost_col, n_col)
                _, gained_boot = _ratio(point, boot, gained_col, n_col)
            acc.add(d, "flip_correct_to_wrong", lost / n, lost_boot)
            acc.add(d, "flip_wrong_to_correct", gained / n, gained_boot)
            d["mcnemar"] = {
                k: (r6(v) if isinstance(v, float) else v)
                for k, v in mcnemar(round(lost), round(gained)).items()
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
    acc = _CI(level)
    out: dict[str, Any] = {}
    for md in models:
        out[md.name] = _model_section(
            md, meta[md.name], layout, cons_layout, engine, acc, primary, max_flips
        )
    ce_ref = reference
    if ce_ref is not None:
        for md in models:
            out[md.name]["corruption_error"] = _corruption_error(
                md.name, meta, engine, layout, primary, ce_ref, acc
            )
    er = _effective_robustness([md.name for md in models], meta, engine, layout, primary, acc)
    acc.flush()
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
    acc: _CI,
    primary: str,
    max_flips: int,
) -> dict[str, Any]:
    name = md.name
    sec: dict[str, Any] = {}
    overall = _cells(engine, name, "overall")
    sec["overall"] = summarize(overall[(ALL,)], layout, acc) if overall else None
    for part in ("overall_all_pairs", "overall_label_safe"):
        cells = _cells(engine, name, part)
        sec[part] = summarize(cells[(ALL,)], layout, acc) if cells else None
    sec["by_perturbation"] = {
        k[0]: summarize(c, layout, acc) for k, c in _cells(engine, name, "perturbation").items()
    }
    nested: dict[str, dict[str, Any]] = {}
    for (p, s), c in _cells(engine, name, "perturbation_severity").items():
        nested.setdefault(p, {})[str(s)] = summarize(c, layout, acc)
    sec["by_perturbation_severity"] = nested
    for part, key in (("complexity", "by_complexity"), ("question_class", "by_question_class")):
        d: dict[str, dict[str, Any]] = {}
        for (p, v), c in _cells(engine, name, part).items():
            d.setdefault(p, {})[str(v)] = summarize(c, layout, acc)
        for (p, v), c in _cells(engine, name, f"perturbation_{part}").items():
            d.setdefault(p, {})[str(v)] = summarize(c, layout, acc)
        sec[key] = d
    cons: dict[str, Any] = {"k": info["k"], "by_perturbation": {}, "by_perturbation_severity": {}}
    for (p,), c in _cells(engine, name, "worst_of_k_perturbation").items():
        cons["by_perturbation"][p] = summarize(c, cons_layout, acc)
    for (p, s), c in _cells(engine, name, "worst_of_k_perturbation_severity").items():
        cons["by_perturbation_severity"].setdefault(p, {})[str(s)] = summarize(c, cons_layout, acc)
    sec["worst_of_k"] = cons
    risk: dict[str, Any] = {"by_perturbation": {}, "by_question_class": {}}
    for (p,), c in _cells(engine, name, "at_risk_perturbation").items():
        risk["by_perturbation"][p] = summarize(c, layout, acc)
    for (p, q), c in _cells(engine, name, "at_risk_question_class").items():
        risk["by_question_class"].setdefault(p, {})[q] = summarize(c, layout, acc)
    sec["at_risk"] = risk
    sec["severity_curves"] = _severity_curves(name, engine, layout, acc)
    sec["flips"] = _flips(md, primary, max_flips, info["include_at_risk"])
    return sec


def _severity_curves(name: str, engine: CellEngine, layout: Layout, acc: _CI) -> dict[str, Any]:
    per_p = _cells(engine, name, "perturbation")
    ps = _cells(engine, name, "perturbation_severity")
    out: dict[str, Any] = {}
    for (p,), pc in per_p.items():
        sevs = sorted(s for (q, s) in ps if q == p and s >= 1)
        if not sevs:
            continue
        curves: dict[str, Any] = {}
        for m in layout.item + layout.corpus:
            if layout.n(pc, m) == 0:
                continue
            cells = [ps[(p, s)] for s in sevs]
            if any(layout.n(c, m) == 0 for c in cells):
                continue
            c_pt, c_bt = layout.side(pc, m, "clean")
            pts = [layout.side(c, m, "perturbed") for c in cells]
            y_pt = np.array([v for v, _ in pts])
            y_bt = (
                np.stack([b for _, b in pts if b is not None], axis=1)
                if c_bt is not None and all(b is not None for _, b in pts)
                else None
            )
            cur: dict[str, Any] = {"severities": sevs, "perturbed": [], "delta": []}
            acc.add(cur, "clean", c_pt, c_bt)
            for j in range(len(sevs)):
                slot: dict[str, Any] = {}
                acc.add(slot, "v", float(y_pt[j]), None if y_bt is None else y_bt[:, j])
                cur["perturbed"].append(slot)
                dslot: dict[str, Any] = {}
                acc.add(
                    dslot, "v", float(y_pt[j] - c_pt), None if y_bt is None else y_bt[:, j] - c_bt
                )
                cur["delta"].append(dslot)
            sev_arr = np.array(sevs, dtype=np.float64)
            a_pt = float(area_under_severity_curve(np.array(c_pt), y_pt, sev_arr))
            a_bt = (
                area_under_severity_curve(c_bt, y_bt, sev_arr)
                if (y_bt is not None and c_bt is not None)
                else None
            )
            acc.add(cur, "ausc", a_pt, a_bt)
            acc.add(cur, "delta_ausc", a_pt - c_pt, None if a_bt is None else a_bt - c_bt)
            curves[m] = cur
        out[p] = curves
    return out


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
    c = md.item_clean[primary]
    p = md.item_perturbed[primary]
    head = np.ones(len(pairs), dtype=bool)
    if not include_at_risk:
        head = ~pairs["at_risk"].to_numpy(dtype=bool)
    drop = c - p
    cand = np.flatnonzero(head & np.isfinite(drop) & (drop > 0))
    if cand.size == 0:
        return []
    second = None
    for m in ("token_f1", "rougeL", "exact_match_tolerant"):
        if m != primary and m in md.item_clean:
            second = md.item_clean[m] - md.item_perturbed[m]
            break
    pert = pairs["perturbation"].to_numpy(dtype=object)
    ok = head & np.isfinite(drop)
    op_gap = pd.Series(-drop[ok]).groupby(pert[ok]).mean()
    df = pd.DataFrame(
        {
            "i": cand,
            "d": -drop[cand],
            "d2": -(np.nan_to_num(second[cand]) if second is not None else np.zeros(cand.size)),
            "p": pert[cand],
            "s": -pairs["severity"].to_numpy(np.int64)[cand],
            "v": pairs["variant"].to_numpy(np.int64)[cand],
            "img": pairs["img_id"].to_numpy(dtype=object)[cand],
            "q": pairs["question"].to_numpy(dtype=object)[cand],
        }
    ).sort_values(["d", "d2", "s", "p", "img", "q", "v"], kind="stable")
    # one image per op (the same image under one op would repeat), then ops take turns, each
    # preferring an image not shown yet
    df = df.drop_duplicates(["p", "img"], keep="first")
    queues = {op: list(g["i"]) for op, g in df.groupby("p", sort=False)}
    img_of = dict(zip(df["i"], df["img"], strict=True))
    order = sorted(queues, key=lambda op: (float(op_gap.get(op, 0.0)), str(op)))
    chosen: list[int] = []
    shown: set[Any] = set()
    while len(chosen) < max_flips and any(queues.values()):
        for op in order:
            q = queues[op]
            if not q or len(chosen) >= max_flips:
                continue
            k = next((j for j, i in enumerate(q) if img_of[i] not in shown), 0)
            i = q.pop(k)
            chosen.append(i)
            shown.add(img_of[i])
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
                "clean": r6(c[i]),
                "perturbed": r6(p[i]),
                "image_clean": img_c,
                "image_perturbed": img_p,
            }
        )
    return out


# ----------------------------------------------------------------------------- CE and ER


def _series(engine: CellEngine, layout: Layout, name: str, p: str, m: str) -> dict[str, Any] | None:
    """Clean and per-severity perturbed scores (point, resamples) of one model/perturbation."""
    pc = engine.cells.get((name, "perturbation", p))
    if pc is None or layout.n(pc, m) == 0:
        return None
    sev = {}
    for key, c in engine.cells.items():
        s = key[3] if len(key) > 3 else None
        if (
            key[:3] == (name, "perturbation_severity", p)
            and isinstance(s, int)
            and s >= 1
            and layout.n(c, m)
        ):
            sev[s] = layout.side(c, m, "perturbed")
    return {"clean": layout.side(pc, m, "clean"), "sev": sev}


def _corruption_error(
    name: str,
    meta: dict[str, Any],
    engine: CellEngine,
    layout: Layout,
    m: str,
    ref: ReferenceScores,
    acc: _CI,
) -> dict[str, Any]:
    """ImageNet-C CE = sum_s E_s / sum_s E_s(ref); relative CE subtracts clean errors.

    E = 1 - score of metric ``m``. Per perturbation over the severities both models have;
    mCE / relative mCE average the perturbations.
    """
    out: dict[str, Any] = {"reference": ref.name, "metric": m, "by_perturbation": {}}
    ce_pts, ce_bts, rce_pts, rce_bts = [], [], [], []
    for p in meta[name]["perturbations"]:
        mine = _series(engine, layout, name, p, m)
        if mine is None:
            continue
        if ref.model is not None:
            theirs = _series(engine, layout, ref.model, p, m)
        else:
            vals = (ref.values or {}).get(p)
            theirs = (
                None
                if vals is None
                else {
                    "clean": (vals["clean"], None),
                    "sev": {int(s): (v, None) for s, v in vals["sev"].items()},
                }
            )
        if theirs is None:
            continue
        sevs = sorted(set(mine["sev"]) & set(theirs["sev"]))
        if not sevs:
            continue

        def errs(
            series: dict[str, Any], sevs: list[int] = sevs
        ) -> tuple[np.ndarray, np.ndarray | None, float, np.ndarray | None]:
            pts = np.array([1 - series["sev"][s][0] for s in sevs])
            bts = [series["sev"][s][1] for s in sevs]
            bt = None if any(b is None for b in bts) else 1 - np.stack(bts, axis=1)
            cpt, cbt = series["clean"]
            return pts, bt, 1 - cpt, (None if cbt is None else 1 - cbt)

        e, eb, e0, e0b = errs(mine)
        r, rb, r0, r0b = errs(theirs)
        with np.errstate(invalid="ignore", divide="ignore"):
            ce = e.sum() / r.sum() if r.sum() > 0 else math.nan
            rden = (r - r0).sum()
            rce = (e - e0).sum() / rden if rden > 0 else math.nan
            ce_b = rce_b = None
            if eb is not None:
                rs = rb.sum(axis=1) if rb is not None else np.full(eb.shape[0], r.sum())
                ce_b = np.where(rs > 0, eb.sum(axis=1) / np.where(rs > 0, rs, 1), np.nan)
                if e0b is not None:
                    rdb = (
                        (rb - r0b[:, None]).sum(axis=1)
                        if (rb is not None and r0b is not None)
                        else np.full(eb.shape[0], rden)
                    )
                    rce_b = np.where(
                        rdb > 0, (eb - e0b[:, None]).sum(axis=1) / np.where(rdb > 0, rdb, 1), np.nan
                    )
        d: dict[str, Any] = {"severities": sevs}
        acc.add(d, "ce", ce, ce_b)
        acc.add(d, "relative_ce", rce, rce_b)
        out["by_perturbation"][p] = d
        ce_pts.append(ce)
        rce_pts.append(rce)
        ce_bts.append(ce_b)
        rce_bts.append(rce_b)
    if ce_pts:
        mb = _mean_cols(ce_bts)
        rmb = _mean_cols(rce_bts)
        acc.add(out, "mce", float(np.mean(ce_pts)), mb)
        acc.add(out, "relative_mce", float(np.mean(rce_pts)), rmb)
    return out


def _mean_cols(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    """Row-wise mean of resample vectors (None if any is missing)."""
    if not arrays or any(a is None for a in arrays):
        return None
    return np.mean(np.stack([a for a in arrays if a is not None], axis=1), axis=1)


def _effective_robustness(
    names: list[str], meta: dict[str, Any], engine: CellEngine, layout: Layout, m: str, acc: _CI
) -> dict[str, Any]:
    if len(names) < 3:
        return {"computed": False, "reason": f"needs scores of at least 3 models, got {len(names)}"}
    if m not in layout.item + layout.corpus:
        return {"computed": False, "reason": f"metric {m} not available"}
    out: dict[str, Any] = {"computed": True, "metric": m, "models": names, "by_perturbation": {}}
    common = set(meta[names[0]]["perturbations"])
    for nm in names[1:]:
        common &= set(meta[nm]["perturbations"])
    groups = [(ALL, "overall", (ALL,))] + [(p, "perturbation", (p,)) for p in sorted(common)]
    for label, part, key in groups:
        cells = [engine.cells.get((nm, part, *key)) for nm in names]
        if any(c is None or layout.n(c, m) == 0 for c in cells):
            continue
        cs = [layout.side(c, m, "clean") for c in cells]  # type: ignore[arg-type]
        ps = [layout.side(c, m, "perturbed") for c in cells]  # type: ignore[arg-type]
        cpt = np.array([v for v, _ in cs])
        ppt = np.array([v for v, _ in ps])
        er_pt = effective_robustness(cpt, ppt)
        have_b = all(b is not None for _, b in cs + ps)
        cb = [b for _, b in cs if b is not None]
        pb = [b for _, b in ps if b is not None]
        er_bt = effective_robustness(np.stack(cb, axis=1), np.stack(pb, axis=1)) if have_b else None
        d: dict[str, Any] = {}
        for j, nm in enumerate(names):
            acc.add(d, nm, float(er_pt[j]), None if er_bt is None else er_bt[:, j])
        out["by_perturbation"][label] = d
    return out


def load_reference_scores(
    scores: Mapping[str, Any], name: str, model: str | None, metric: str, source: str
) -> ReferenceScores:
    """Reference errors for CE from a previous run's scores.json content."""
    from perturb.score.errors import InputError

    models = scores.get("models")
    if not isinstance(models, Mapping) or not models:
        raise InputError(f"{source}: not a perturb scores.json (no 'models' section)")
    key = model if model in models else (next(iter(models)) if len(models) == 1 else None)
    if key is None:
        raise InputError(
            f"{source}: holds models {sorted(models)}; name the one to use: --reference {sorted(models)[0]}={source}"
        )
    sec = models[key]
    values: dict[str, dict[str, Any]] = {}
    for p, by_sev in (sec.get("by_perturbation_severity") or {}).items():
        pc = (sec.get("by_perturbation") or {}).get(p, {}).get("metrics", {}).get(metric)
        if not pc:
            continue
        sev = {}
        for s, cell in by_sev.items():
            mm = cell.get("metrics", {}).get(metric)
            if mm and int(s) >= 1 and mm["perturbed"]["estimate"] is not None:
                sev[int(s)] = float(mm["perturbed"]["estimate"])
        if sev and pc["clean"]["estimate"] is not None:
            values[p] = {"clean": float(pc["clean"]["estimate"]), "sev": sev}
    if not values:
        raise InputError(
            f"{source}: no per-severity '{metric}' scores for model {key!r}; score the reference with "
            f"the same primary metric (--primary {metric})."
        )
    return ReferenceScores(name=name, values=values)
