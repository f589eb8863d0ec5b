"""Report content built from scores.json: sections of text, tables and plot slots.

Markdown and HTML render the same :class:`Section` list, so both reports hold the same numbers.
Scores are shown in percent (x100, one decimal); deltas in percentage points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALL = "(all)"


@dataclass
class Table:
    """A table of plain-text cells (renderers escape them)."""

    header: list[str]
    rows: list[list[str]]
    id: str = ""
    caption: str = ""


@dataclass
class Flip:
    """One correct -> wrong example, with optional image paths for thumbnails."""

    cells: list[str]
    image_clean: str | None
    image_perturbed: str | None


@dataclass
class Section:
    """A titled block: paragraphs, tables, plot ids and flip examples."""

    title: str
    id: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    flips: list[Flip] = field(default_factory=list)
    flip_header: list[str] = field(default_factory=list)
    level: int = 2


def pct(x: Any, signed: bool = False) -> str:
    """Percent with one decimal (``-`` for missing)."""
    if x is None:
        return "-"
    v = 100.0 * float(x)
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def est(d: Mapping[str, Any] | None, signed: bool = False, scale: bool = True) -> str:
    """``estimate [lo, hi]`` of an estimate/CI dict."""
    if not d:
        return "-"
    f = (lambda v: pct(v, signed)) if scale else (lambda v: "-" if v is None else f"{float(v):.3f}")
    s = f(d.get("estimate"))
    ci = d.get("ci")
    if ci and ci[0] is not None and ci[1] is not None:
        s += f" [{f(ci[0])}, {f(ci[1])}]"
    return s


def pval(p: Any) -> str:
    """A p-value in compact form."""
    if p is None:
        return "-"
    p = float(p)
    if p == 0:
        return "0"
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}"


def _sig(d: Mapping[str, Any] | None) -> bool:
    if not d or not d.get("ci") or d["ci"][0] is None:
        return False
    lo, hi = d["ci"]
    return bool(lo > 0 or hi < 0)


def by_gap(cells: Mapping[str, Any] | None, metric: str) -> list[tuple[str, Any]]:
    """``(key, cell)`` items sorted by the delta of ``metric``, most negative first (cells
    without it last, by key)."""

    def key(item: tuple[str, Any]) -> tuple[float, str]:
        m = ((item[1] or {}).get("metrics") or {}).get(metric)
        d = m["delta"]["estimate"] if m else None
        return (d if d is not None else float("inf"), str(item[0]))

    return sorted((cells or {}).items(), key=key)


def pooled_cells(model: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The headline's pooled cell, then both pooled pair sets (all pairs, label-safe)."""
    return [
        (ALL, model.get("overall")),
        ("(all pairs)", model.get("overall_all_pairs")),
        ("(label-safe pairs)", model.get("overall_label_safe")),
    ]


def _ausc_key(curve: Mapping[str, Any], metric: str) -> float:
    d = (curve.get(metric) or {}).get("delta_ausc") or {}
    v = d.get("estimate")
    return float(v) if v is not None else float("inf")


def headline_rows(model: Mapping[str, Any], metric: str, binary: bool) -> list[list[str]]:
    """Headline rows (pooled first, then each perturbation by gap) for ``metric``."""
    rows = []
    cells = [*pooled_cells(model), *by_gap(model.get("by_perturbation"), metric)]
    for name, cell in cells:
        if not cell or metric not in cell["metrics"]:
            continue
        m = cell["metrics"][metric]
        row = [
            str(name),
            str(m["n"]),
            str(cell["n_clusters"]),
            est(m["clean"]),
            est(m["perturbed"]),
            est(m["delta"], signed=True) + (" *" if _sig(m["delta"]) else ""),
            est(m.get("relative_drop")),
        ]
        if binary:
            row += [
                pct(m["flip_correct_to_wrong"]["estimate"]),
                pct(m["flip_wrong_to_correct"]["estimate"]),
                f"{pval(m['mcnemar']['p_exact'])} / {pval(m['mcnemar']['p_mid'])}",
            ]
        row.append(pct(cell["answer_changed_rate"]["estimate"]))
        rows.append(row)
    return rows


def _breakdown_section(
    cells: Mapping[str, Any],
    metric: str,
    label: str,
    title: str,
    anchor: str,
    table_id: str,
    caption: str = "",
) -> Section:
    """One breakdown table (rows: clean, perturbed, delta of ``metric`` per key)."""
    section = Section(title, anchor, level=3)
    rows = []
    for key, cell in by_gap(cells, metric):
        m = cell["metrics"].get(metric)
        if m:
            rows.append(
                [
                    key,
                    str(m["n"]),
                    est(m["clean"]),
                    est(m["perturbed"]),
                    est(m["delta"], signed=True),
                ]
            )
    section.tables.append(
        Table([label, "n", "clean", "perturbed", "delta (pp)"], rows, id=table_id, caption=caption)
    )
    return section


def _calibration_section(cal: Mapping[str, Any], mname: str, mi: int) -> Section:
    """ECE and overconfidence, clean vs perturbed, per perturbation and severity."""
    sec = Section(f"Calibration under perturbation: {mname}", f"calibration-{mi}", level=3)
    sec.paragraphs.append(
        f"Confidence vs correctness ({cal['metric']}) on the headline pairs: ECE with "
        f"{cal['bins']} equal-width bins and overconfidence (mean confidence - accuracy), in "
        "percent; shifts are perturbed - clean with paired cluster-bootstrap CIs. A positive "
        "shift: the model stays confident while it gets worse."
    )
    ops = sorted(
        (cal.get("by_perturbation") or {}).items(),
        key=lambda kv: (-kv[1]["delta_ece"]["estimate"], kv[0]),
    )
    items = [(ALL, cal["overall"]), *ops]
    rows = [
        [
            str(k),
            str(c["n_pairs"]),
            pct(c["clean"]["ece"]),
            pct(c["perturbed"]["ece"]),
            est(c["delta_ece"], signed=True),
            pct(c["clean"]["overconfidence"], signed=True),
            pct(c["perturbed"]["overconfidence"], signed=True),
            est(c["delta_overconfidence"], signed=True),
        ]
        for k, c in items
    ]
    sec.tables.append(
        Table(
            [
                "perturbation",
                "n",
                "ECE clean",
                "ECE perturbed",
                "ECE shift (pp)",
                "overconf. clean",
                "overconf. perturbed",
                "overconf. shift (pp)",
            ],
            rows,
            id=f"calibration-table-{mi}",
        )
    )
    bps = cal.get("by_perturbation_severity") or {}
    sevs = sorted({int(x) for d in bps.values() for x in d})
    if sevs:
        sec.tables.append(
            Table(
                ["perturbation"] + [f"s{x}" for x in sevs],
                [
                    [p] + [est(d.get(str(x), {}).get("delta_ece"), signed=True) for x in sevs]
                    for p, d in ((k, bps[k]) for k, _ in items[1:] if k in bps)
                ],
                id=f"calibration-severity-{mi}",
                caption="ECE shift (pp) by severity",
            )
        )
    return sec


def build_sections(scores: Mapping[str, Any]) -> list[Section]:
    """All report sections for a scores.json dict."""
    cfg = scores["config"]
    prim = cfg["primary"]
    defs = scores.get("metric_definitions", {})
    binary = bool(defs.get(prim, {}).get("binary"))
    from perturb.report.glance import glance_section

    out: list[Section] = [glance_section(scores)]
    s = Section("Summary", "summary")
    c = scores["counts"]
    s.paragraphs.append(
        f"Primary metric: {prim} ({defs.get(prim, {}).get('description', '')}). "
        f"Delta = perturbed - clean in percentage points; * marks a 95% CI that excludes 0. "
        f"CIs: paired cluster bootstrap over img_id, B = {cfg['bootstrap']['resamples']}, "
        f"seed {cfg['bootstrap']['seed']}, level {cfg['bootstrap']['level']}."
    )
    s.paragraphs.append(
        f"Input rows {c['input_rows']} (clean {c['clean_rows']}, perturbed {c['perturbed_rows']}); "
        f"pairs {c['pairs']}; dropped while reading {c['dropped_while_reading']}, while pairing "
        f"{c['dropped_while_pairing']}; label-risk pairs {c['at_risk_pairs']} "
        + (
            "(included in the headline; the label-safe pooled row shows them left out)."
            if cfg["include_at_risk"]
            else "(reported separately, left out of the headline; the all-pairs pooled row "
            "shows them included)."
        )
    )
    if cfg.get("primary_reason"):
        s.paragraphs.append(f"Why {prim}: {cfg['primary_reason']}.")
    if scores.get("rouge_upstream"):
        from perturb.score.upstream_rouge import describe

        s.paragraphs.append(describe(scores["rouge_upstream"]))
    for p in scores.get("problems", []):
        s.paragraphs.append(f"Problem: {p}")
    for p in scores.get("notes", []):
        s.paragraphs.append(f"Note: {p}")
    s.tables.append(
        Table(
            ["role", "model", "source", "format", "rows", "kept", "dropped"],
            [
                [
                    r["role"],
                    r["model"],
                    r["source"],
                    r["format"],
                    str(r["rows_in"]),
                    str(r["rows_kept"]),
                    ", ".join(f"{k}={v}" for k, v in r["dropped"].items()) or "0",
                ]
                for r in scores.get("reading", [])
            ],
            id="inputs",
            caption="Inputs",
        )
    )
    out.append(s)
    hdr = ["perturbation", "n", "images", "clean", "perturbed", "delta (pp)", "relative drop %"]
    if binary:
        hdr += ["correct->wrong %", "wrong->correct %", "McNemar p exact / mid"]
    hdr.append("answer changed %")
    for mi, (mname, model) in enumerate(sorted(scores["models"].items())):
        sec = Section(f"Headline: {mname}", f"headline-{mi}")
        sec.tables.append(
            Table(
                hdr,
                headline_rows(model, prim, binary),
                id=f"headline-table-{mi}",
                caption=f"{prim} by perturbation (pooled over severities)",
            )
        )
        metrics = cfg["metrics"]
        rows = []
        for name, cell in [
            *pooled_cells(model),
            *by_gap(model.get("by_perturbation"), prim),
        ]:
            if cell:
                rows.append(
                    [str(name)]
                    + [est(cell["metrics"].get(m, {}).get("delta"), signed=True) for m in metrics]
                )
        sec.tables.append(
            Table(
                ["perturbation"] + [f"{m} delta" for m in metrics],
                rows,
                id=f"all-metrics-{mi}",
                caption="Delta of every metric (pp)",
            )
        )
        if mi > 0:  # the first model's bars are on the first screen
            sec.plots.append(f"delta_bars:{mname}")
        out.append(sec)

        sev = Section(f"Perturbation x severity: {mname}", f"severity-{mi}", level=3)
        bps = model.get("by_perturbation_severity") or {}
        all_sev = sorted({int(k) for d in bps.values() for k in d}, key=int)
        rows = []
        order = [p for p, _ in by_gap(model.get("by_perturbation"), prim)]
        order += [p for p in sorted(bps) if p not in order]
        for p in order:
            if p not in bps:
                continue
            d = bps[p]
            rows.append(
                [p]
                + [
                    est(
                        d.get(str(k), {}).get("metrics", {}).get(prim, {}).get("delta"), signed=True
                    )
                    for k in all_sev
                ]
            )
        sev.tables.append(
            Table(
                ["perturbation"] + [f"s{k}" for k in all_sev],
                rows,
                id=f"severity-table-{mi}",
                caption=f"{prim} delta (pp) by severity",
            )
        )
        curves = model.get("severity_curves") or {}
        crow = []
        for p, cm in sorted(curves.items(), key=lambda kv: (_ausc_key(kv[1], prim), kv[0])):
            cc = cm.get(prim)
            if cc:
                crow.append(
                    [
                        p,
                        ", ".join(map(str, cc["severities"])),
                        est(cc["clean"]),
                        est(cc["ausc"]),
                        est(cc["delta_ausc"], signed=True),
                    ]
                )
        if crow:
            sev.tables.append(
                Table(
                    [
                        "perturbation",
                        "severities",
                        "clean",
                        "area under severity curve",
                        "area minus clean (pp)",
                    ],
                    crow,
                    id=f"ausc-{mi}",
                    caption="Area under the severity curve (mean level from severity 0 to max)",
                )
            )
        if bps:
            sev.plots += [f"heatmap:{mname}", f"curves:{mname}"]
        out.append(sev)

        wk = model.get("worst_of_k") or {}
        if wk.get("by_perturbation"):
            w = Section(f"Worst of k variants: {mname}", f"worstk-{mi}", level=3)
            w.paragraphs.append(
                f"Each (image, question, perturbation, severity) counts once with its worst variant "
                f"(k = {wk['k']['min']}..{wk['k']['max']}); for binary metrics this is consensus: all k correct."
            )
            rows = []
            for p, cell in by_gap(wk["by_perturbation"], prim):
                m = cell["metrics"].get(prim)
                if m:
                    rows.append(
                        [
                            p,
                            str(m["n"]),
                            est(m["clean"]),
                            est(m["perturbed"]),
                            est(m["delta"], signed=True),
                        ]
                    )
            w.tables.append(
                Table(
                    ["perturbation", "units", "clean", "worst of k", "delta (pp)"],
                    rows,
                    id=f"worstk-table-{mi}",
                )
            )
            out.append(w)

        qc = model.get("by_question_class") or {}
        if qc.get(ALL):
            q = _breakdown_section(
                qc[ALL],
                prim,
                "question class",
                f"By question class: {mname}",
                f"class-{mi}",
                f"class-table-{mi}",
                caption="All perturbations pooled",
            )
            q.plots.append(f"class_bars:{mname}")
            out.append(q)
        cx = model.get("by_complexity") or {}
        if cx.get(ALL):
            out.append(
                _breakdown_section(
                    cx[ALL],
                    prim,
                    "complexity",
                    f"By complexity: {mname}",
                    f"complexity-{mi}",
                    f"complexity-table-{mi}",
                )
            )
        risk = model.get("at_risk") or {}
        rq = risk.get("by_question_class") or {}
        if rq:
            r = Section(f"Label-risk pairs: {mname}", f"risk-{mi}", level=3)
            r.paragraphs.append(
                "These pairs ask about something the perturbation may change in the image itself "
                "(e.g. colour under a colour shift, location under a shift or crop), so the reference "
                "answer may no longer hold. They are "
                + ("included in" if cfg["include_at_risk"] else "left out of")
                + " the headline."
            )
            rows = []
            for p, d in sorted(rq.items()):
                for k, cell in sorted(d.items()):
                    m = cell["metrics"].get(prim)
                    if m:
                        rows.append(
                            [
                                p,
                                k,
                                str(m["n"]),
                                est(m["clean"]),
                                est(m["perturbed"]),
                                est(m["delta"], signed=True),
                            ]
                        )
            r.tables.append(
                Table(
                    ["perturbation", "class at risk", "n", "clean", "perturbed", "delta (pp)"],
                    rows,
                    id=f"risk-table-{mi}",
                )
            )
            out.append(r)
        ce = model.get("corruption_error")
        if ce and ce.get("by_perturbation"):
            e = Section(f"Corruption error vs {ce['reference']}: {mname}", f"ce-{mi}", level=3)
            e.paragraphs.append(
                "CE = sum over severities of E / sum of the reference's E (E = 1 - score); relative CE "
                "subtracts each model's clean error first. Below 1: more robust than the reference."
            )
            rows = [
                [
                    p,
                    ", ".join(map(str, d["severities"])),
                    est(d["ce"], scale=False),
                    est(d["relative_ce"], scale=False),
                ]
                for p, d in sorted(ce["by_perturbation"].items())
            ]
            rows.append(
                [
                    "mean (mCE)",
                    "",
                    est(ce.get("mce"), scale=False),
                    est(ce.get("relative_mce"), scale=False),
                ]
            )
            e.tables.append(
                Table(
                    ["perturbation", "severities", "CE", "relative CE"], rows, id=f"ce-table-{mi}"
                )
            )
            out.append(e)
        cal = model.get("calibration")
        if cal:
            out.append(_calibration_section(cal, mname, mi))
        flips = model.get("flips") or []
        f = Section(f"Largest correct -> wrong flips: {mname}", f"flips-{mi}", level=3)
        f.paragraphs.append(
            "Chosen across perturbations: each perturbation in turn (largest mean drop first) "
            "gives its largest remaining drop, on an image not shown yet where it has one."
        )
        f.flip_header = [
            "perturbation",
            "severity",
            "variant",
            "img_id",
            "question",
            "reference",
            "clean answer",
            "perturbed answer",
            f"{prim} clean -> perturbed",
        ]
        for fl in flips:
            f.flips.append(
                Flip(
                    [
                        str(fl["perturbation"]),
                        str(fl["severity"]),
                        str(fl["variant"]),
                        str(fl["img_id"]),
                        str(fl["question"]),
                        str(fl["reference"]),
                        str(fl["prediction_clean"]),
                        str(fl["prediction_perturbed"]),
                        f"{pct(fl['clean'])} -> {pct(fl['perturbed'])}",
                    ],
                    fl.get("image_clean"),
                    fl.get("image_perturbed"),
                )
            )
        if not flips:
            f.paragraphs.append("No correct -> wrong flips among the headline pairs.")
        out.append(f)
    er = scores.get("effective_robustness") or {}
    e = Section("Effective robustness", "effective-robustness")
    if er.get("computed"):
        e.paragraphs.append(
            f"Perturbed {er['metric']} minus the value predicted from clean {er['metric']} by a "
            "logit-linear fit across the scored models (Taori et al. 2020); positive = more robust than the trend."
        )
        names = er["models"]
        rows = [
            [p] + [est(d.get(n), signed=True) for n in names]
            for p, d in er["by_perturbation"].items()
        ]
        e.tables.append(Table(["perturbation", *list(names)], rows, id="er-table"))
    else:
        e.paragraphs.append(f"Not computed: {er.get('reason', 'n/a')}.")
    out.append(e)
    cov = scores.get("coverage")
    if cov:
        cs = Section("Coverage of the manifest", "coverage")
        cs.paragraphs.append(
            f"Manifest outputs with / without scored predictions ({cov['outputs']} outputs); "
            "a share under 90% is a warning at the top."
        )
        for mname, cm in sorted(cov["models"].items()):
            rows = [
                [
                    k,
                    str(v["with"]),
                    str(v["without"]),
                    pct(v["with"] / max(v["with"] + v["without"], 1)),
                ]
                for k, v in cm["by_perturbation_severity"].items()
            ]
            rows.insert(
                0,
                [
                    "(all)",
                    str(cm["with_predictions"]),
                    str(cm["without_predictions"]),
                    pct(cm["share"]),
                ],
            )
            cs.tables.append(
                Table(
                    ["perturbation/severity", "with predictions", "without", "covered %"],
                    rows,
                    id=f"coverage-{mname}",
                    caption=f"Coverage: {mname}",
                )
            )
        out.append(cs)
    d = Section("Pairing details", "pairing")
    rows = []
    for mname, p in sorted(scores.get("pairing", {}).items()):
        for reason, n in p["dropped"].items():
            rows.append([mname, reason, str(n), "; ".join(p["drop_examples"].get(reason, []))])
        for note in p.get("notes", []):
            d.paragraphs.append(f"{mname}: {note}")
    for r in scores.get("reading", []):
        for reason, n in r["dropped"].items():
            rows.append(
                [r["source"], reason, str(n), "; ".join(r["drop_examples"].get(reason, []))]
            )
    d.tables.append(
        Table(
            ["model / source", "reason", "rows", "first examples"],
            rows,
            id="drops",
            caption="Dropped rows",
        )
    )
    out.append(d)
    return out


def plot_ids(sections: Sequence[Section]) -> list[str]:
    """Every plot slot named by the sections."""
    return [p for s in sections for p in s.plots]
