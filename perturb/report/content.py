"""Report content built from scores.json: sections of text, tables and plot slots.

Markdown and HTML render the same :class:`Section` list, so both reports hold the same numbers.
Scores are shown in percent (x100, one decimal); deltas in percentage points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perturb.report.document import (
    ALL,
    Flip,
    Section,
    Table,
    by_gap,
    est,
    excludes_zero,
    pct,
    pooled_cells,
    pval,
)


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
        cell_scores = cell["metrics"][metric]
        row = [
            str(name),
            str(cell_scores["n"]),
            str(cell["n_clusters"]),
            est(cell_scores["clean"]),
            est(cell_scores["perturbed"]),
            est(cell_scores["delta"], signed=True)
            + (" *" if excludes_zero(cell_scores["delta"]) else ""),
            est(cell_scores.get("relative_drop")),
        ]
        if binary:
            row += [
                pct(cell_scores["flip_correct_to_wrong"]["estimate"]),
                pct(cell_scores["flip_wrong_to_correct"]["estimate"]),
                f"{pval(cell_scores['mcnemar']['p_exact'])} / {pval(cell_scores['mcnemar']['p_mid'])}"
                f" / {pval(cell_scores['mcnemar'].get('p_clustered'))}",
            ]
        row.append(pct(cell["answer_changed_rate"]["estimate"]))
        rows.append(row)
    return rows


def _delta_cells(metric_scores: Mapping[str, Any]) -> list[str]:
    """One metric's n, clean, perturbed and delta (pp) cells."""
    return [
        str(metric_scores["n"]),
        est(metric_scores["clean"]),
        est(metric_scores["perturbed"]),
        est(metric_scores["delta"], signed=True),
    ]


def _delta_rows(cells: Mapping[str, Any], metric: str) -> list[list[str]]:
    """Per key with ``metric`` (largest drop first): the key and its :func:`_delta_cells`."""
    return [
        [key, *_delta_cells(cell["metrics"][metric])]
        for key, cell in by_gap(cells, metric)
        if cell["metrics"].get(metric)
    ]


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
    header = [label, "n", "clean", "perturbed", "delta (pp)"]
    section.tables.append(Table(header, _delta_rows(cells, metric), id=table_id, caption=caption))
    return section


def _calibration_section(cal: Mapping[str, Any], mname: str, index: int) -> Section:
    """ECE and overconfidence, clean vs perturbed, per perturbation and severity."""
    section = Section(f"Calibration under perturbation: {mname}", f"calibration-{index}", level=3)
    section.paragraphs.append(
        f"Confidence vs correctness ({cal['metric']}) on the headline pairs: ECE with "
        f"{cal['bins']} equal-width bins and overconfidence (mean confidence - accuracy), in "
        "percent; shifts are perturbed - clean with paired cluster-bootstrap CIs. A positive "
        "shift: the model stays confident while it gets worse."
    )
    by_op = sorted(
        (cal.get("by_perturbation") or {}).items(),
        key=lambda kv: (-kv[1]["delta_ece"]["estimate"], kv[0]),
    )
    items = [(ALL, cal["overall"]), *by_op]
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
    section.tables.append(
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
            id=f"calibration-table-{index}",
        )
    )
    by_severity = cal.get("by_perturbation_severity") or {}
    sevs = sorted({int(x) for d in by_severity.values() for x in d})
    if sevs:
        section.tables.append(
            Table(
                ["perturbation"] + [f"s{x}" for x in sevs],
                [
                    [p] + [est(d.get(str(x), {}).get("delta_ece"), signed=True) for x in sevs]
                    for p, d in ((k, by_severity[k]) for k, _ in items[1:] if k in by_severity)
                ],
                id=f"calibration-severity-{index}",
                caption="ECE shift (pp) by severity",
            )
        )
    return section


def build_sections(scores: Mapping[str, Any]) -> list[Section]:
    """All report sections for a scores.json dict."""
    from perturb.report.glance import glance_section

    out: list[Section] = [glance_section(scores), _summary_section(scores)]
    for index, (mname, model) in enumerate(sorted(scores["models"].items())):
        out += _model_sections(scores, mname, model, index)
    out.append(_effective_robustness_section(scores.get("effective_robustness") or {}))
    coverage = scores.get("coverage")
    if coverage:
        out.append(_coverage_section(coverage))
    out.append(_pairing_section(scores))
    return out


def _primary(scores: Mapping[str, Any]) -> tuple[str, bool]:
    """The primary metric and whether it is binary (0/1) in this run."""
    prim = scores["config"]["primary"]
    defs = scores.get("metric_definitions", {})
    return prim, bool(defs.get(prim, {}).get("binary"))


def _summary_section(scores: Mapping[str, Any]) -> Section:
    """How the run scored, the row counts, problems and notes, and the inputs table."""
    cfg = scores["config"]
    prim = cfg["primary"]
    defs = scores.get("metric_definitions", {})
    section = Section("Summary", "summary")
    counts = scores["counts"]
    section.paragraphs.append(
        f"Primary metric: {prim} ({defs.get(prim, {}).get('description', '')}). "
        f"Delta = perturbed - clean in percentage points; * marks a 95% CI that excludes 0. "
        f"CIs: paired cluster bootstrap over img_id, B = {cfg['bootstrap']['resamples']}, "
        f"seed {cfg['bootstrap']['seed']}, level {cfg['bootstrap']['level']}; a row of "
        "one image has no CI (resampling one image gives it back every time). McNemar p: exact "
        "and mid-p treat every pair as independent, which overstates the evidence when pairs "
        "share an image (several questions, variants or views); clustered is Durkalski et "
        "al.'s (2003) test on each image's net flips, the one to read then."
    )
    section.paragraphs.append(
        f"Input rows {counts['input_rows']} (clean {counts['clean_rows']}, perturbed "
        f"{counts['perturbed_rows']}); pairs {counts['pairs']}; dropped while reading "
        f"{counts['dropped_while_reading']}, while pairing {counts['dropped_while_pairing']}; "
        f"label-risk pairs {counts['at_risk_pairs']} "
        + (
            "(included in the headline; the label-safe pooled row shows them left out)."
            if cfg["include_at_risk"]
            else "(reported separately, left out of the headline; the all-pairs pooled row "
            "shows them included)."
        )
    )
    if cfg.get("primary_reason"):
        section.paragraphs.append(f"Why {prim}: {cfg['primary_reason']}.")
    if scores.get("rouge_upstream"):
        from perturb.score.upstream_rouge import describe

        section.paragraphs.append(describe(scores["rouge_upstream"]))
    for problem in scores.get("problems", []):
        section.paragraphs.append(f"Problem: {problem}")
    for note in scores.get("notes", []):
        section.paragraphs.append(f"Note: {note}")
    section.tables.append(
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
    return section


def _model_sections(
    scores: Mapping[str, Any], mname: str, model: Mapping[str, Any], index: int
) -> list[Section]:
    """One model's sections: headline, severity, worst of k, breakdowns, label risk, CE,
    calibration and flips (those without data left out)."""
    prim, _ = _primary(scores)
    out = [
        _headline_section(scores, mname, model, index),
        _severity_section(prim, mname, model, index),
    ]
    if (model.get("controls") or {}).get("by_control"):
        out.append(_controls_section(model["controls"], mname, index))
    worst_of_k = model.get("worst_of_k") or {}
    if worst_of_k.get("by_perturbation"):
        out.append(_worst_of_k_section(worst_of_k, prim, mname, index))
    by_class = model.get("by_question_class") or {}
    if by_class.get(ALL):
        section = _breakdown_section(
            by_class[ALL],
            prim,
            "question class",
            f"By question class: {mname}",
            f"class-{index}",
            f"class-table-{index}",
            caption="All perturbations pooled",
        )
        section.plots.append(f"class_bars:{mname}")
        out.append(section)
    by_complexity = model.get("by_complexity") or {}
    if by_complexity.get(ALL):
        out.append(
            _breakdown_section(
                by_complexity[ALL],
                prim,
                "complexity",
                f"By complexity: {mname}",
                f"complexity-{index}",
                f"complexity-table-{index}",
            )
        )
    risk_by_class = (model.get("at_risk") or {}).get("by_question_class") or {}
    if risk_by_class:
        include = bool(scores["config"]["include_at_risk"])
        out.append(_label_risk_section(risk_by_class, prim, include, mname, index))
    corruption_error = model.get("corruption_error")
    if corruption_error and corruption_error.get("by_perturbation"):
        out.append(_corruption_error_section(corruption_error, mname, index))
    calibration = model.get("calibration")
    if calibration:
        out.append(_calibration_section(calibration, mname, index))
    out.append(_flips_section(model.get("flips") or [], prim, mname, index))
    return out


def _headline_section(
    scores: Mapping[str, Any], mname: str, model: Mapping[str, Any], index: int
) -> Section:
    """The primary metric per perturbation, and the delta of every metric."""
    prim, binary = _primary(scores)
    header = ["perturbation", "n", "images", "clean", "perturbed", "delta (pp)", "relative drop %"]
    if binary:
        header += ["correct->wrong %", "wrong->correct %", "McNemar p exact / mid / clustered"]
    header.append("answer changed %")
    section = Section(f"Headline: {mname}", f"headline-{index}")
    section.tables.append(
        Table(
            header,
            headline_rows(model, prim, binary),
            id=f"headline-table-{index}",
            caption=f"{prim} by perturbation (pooled over severities)",
        )
    )
    metrics = scores["config"]["metrics"]
    rows = []
    for name, cell in [*pooled_cells(model), *by_gap(model.get("by_perturbation"), prim)]:
        if cell:
            rows.append(
                [str(name)]
                + [est(cell["metrics"].get(m, {}).get("delta"), signed=True) for m in metrics]
            )
    section.tables.append(
        Table(
            ["perturbation"] + [f"{m} delta" for m in metrics],
            rows,
            id=f"all-metrics-{index}",
            caption="Delta of every metric (pp)",
        )
    )
    if index > 0:  # the first model's bars are on the first screen
        section.plots.append(f"delta_bars:{mname}")
    return section


def _controls_section(controls: Mapping[str, Any], mname: str, index: int) -> Section:
    """Per question class, the share of the clean score each control keeps."""
    section = Section(f"Controls: {mname}", f"controls-{index}", level=3)
    metric = controls.get("metric", "")
    by_control = controls["by_control"]
    names = sorted(by_control)
    section.paragraphs.append(
        f"Each clean question asked again with a blank grey image, another sample's image, or "
        f"no image (control pairs are not in the gaps above). Retained = control {metric} / "
        "clean; a class whose score survives without the image is not tested by perturbations."
    )
    classes = sorted(
        {qc for cells in by_control.values() for qc in cells}, key=lambda c: (c != ALL, c)
    )
    rows = []
    for qc in classes:
        first: Mapping[str, Any] = next(
            (by_control[n][qc] for n in names if qc in by_control[n]), {}
        )
        row = [qc, str(first.get("n", "-")), pct(first.get("clean"))]
        for n in names:
            cell = by_control[n].get(qc) or {}
            row.append(pct(cell.get("retained")))
        rows.append(row)
    section.tables.append(
        Table(
            ["question class", "n", f"clean {metric} (%)"] + [f"retained %: {n}" for n in names],
            rows,
            id=f"controls-table-{index}",
            caption=f"Share of the clean {metric} kept by each control",
        )
    )
    return section


def _severity_section(prim: str, mname: str, model: Mapping[str, Any], index: int) -> Section:
    """The primary metric's delta per perturbation x severity, and the severity curves' areas."""
    section = Section(f"Perturbation x severity: {mname}", f"severity-{index}", level=3)
    by_severity = model.get("by_perturbation_severity") or {}
    severities = sorted({int(k) for d in by_severity.values() for k in d}, key=int)
    if severities == [0]:  # a track of variants (Kvasir-VQA-x1 track 2): no severity axis
        section.title = f"Variants: {mname}"
        section.paragraphs.append(
            "The perturbations of this split have variants, not severity levels, so there is "
            "no severity table or curve; the gaps per perturbation are above and the "
            "worst-of-k results below."
        )
        return section
    order = [p for p, _ in by_gap(model.get("by_perturbation"), prim)]
    order += [p for p in sorted(by_severity) if p not in order]
    rows = []
    for pert in order:
        if pert not in by_severity:
            continue
        cells = by_severity[pert]
        rows.append(
            [pert]
            + [
                est(
                    cells.get(str(k), {}).get("metrics", {}).get(prim, {}).get("delta"), signed=True
                )
                for k in severities
            ]
        )
    section.tables.append(
        Table(
            ["perturbation"] + [f"s{k}" for k in severities],
            rows,
            id=f"severity-table-{index}",
            caption=f"{prim} delta (pp) by severity",
        )
    )
    curves = model.get("severity_curves") or {}
    curve_rows = []
    for pert, by_metric in sorted(curves.items(), key=lambda kv: (_ausc_key(kv[1], prim), kv[0])):
        curve = by_metric.get(prim)
        if curve:
            curve_rows.append(
                [
                    pert,
                    ", ".join(map(str, curve["severities"])),
                    est(curve["clean"]),
                    est(curve["ausc"]),
                    est(curve["delta_ausc"], signed=True),
                ]
            )
    if curve_rows:
        section.tables.append(
            Table(
                [
                    "perturbation",
                    "severities",
                    "clean",
                    "area under severity curve",
                    "area minus clean (pp)",
                ],
                curve_rows,
                id=f"ausc-{index}",
                caption="Area under the severity curve (mean level from severity 0 to max)",
            )
        )
    if by_severity and severities != [0]:
        section.plots += [f"heatmap:{mname}", f"curves:{mname}"]
    return section


def _worst_of_k_section(
    worst_of_k: Mapping[str, Any], prim: str, mname: str, index: int
) -> Section:
    """Each unit scored by its worst variant."""
    section = Section(f"Worst of k variants: {mname}", f"worstk-{index}", level=3)
    section.paragraphs.append(
        f"Each (image, question, perturbation, severity) counts once with its worst variant "
        f"(k = {worst_of_k['k']['min']}..{worst_of_k['k']['max']}); for binary metrics this is "
        "consensus: all k correct."
    )
    section.tables.append(
        Table(
            ["perturbation", "units", "clean", "worst of k", "delta (pp)"],
            _delta_rows(worst_of_k["by_perturbation"], prim),
            id=f"worstk-table-{index}",
        )
    )
    return section


def _label_risk_section(
    risk_by_class: Mapping[str, Any], prim: str, include_at_risk: bool, mname: str, index: int
) -> Section:
    """Pairs whose reference answer the perturbation may change, per perturbation and class."""
    section = Section(f"Label-risk pairs: {mname}", f"risk-{index}", level=3)
    section.paragraphs.append(
        "These pairs ask about something the perturbation may change in the image itself "
        "(e.g. colour under a colour shift, location under a shift or crop), so the reference "
        "answer may no longer hold. They are "
        + ("included in" if include_at_risk else "left out of")
        + " the headline."
    )
    rows = [
        [pert, question_class, *_delta_cells(cell["metrics"][prim])]
        for pert, by_class in sorted(risk_by_class.items())
        for question_class, cell in sorted(by_class.items())
        if cell["metrics"].get(prim)
    ]
    section.tables.append(
        Table(
            ["perturbation", "class at risk", "n", "clean", "perturbed", "delta (pp)"],
            rows,
            id=f"risk-table-{index}",
        )
    )
    return section


def _corruption_error_section(
    corruption_error: Mapping[str, Any], mname: str, index: int
) -> Section:
    """CE and relative CE per perturbation, and their means, against the reference model."""
    ce = corruption_error
    section = Section(f"Corruption error vs {ce['reference']}: {mname}", f"ce-{index}", level=3)
    section.paragraphs.append(
        "CE = sum over severities of E / sum of the reference's E (E = 1 - score); relative CE "
        "subtracts each model's clean error first. Below 1: more robust than the reference."
    )
    rows = [
        [
            pert,
            ", ".join(map(str, d["severities"])),
            est(d["ce"], scale=False),
            est(d["relative_ce"], scale=False),
        ]
        for pert, d in sorted(ce["by_perturbation"].items())
    ]
    rows.append(
        [
            "mean (mCE)",
            "",
            est(ce.get("mce"), scale=False),
            est(ce.get("relative_mce"), scale=False),
        ]
    )
    section.tables.append(
        Table(["perturbation", "severities", "CE", "relative CE"], rows, id=f"ce-table-{index}")
    )
    return section


def _flips_section(
    flips: Sequence[Mapping[str, Any]], prim: str, mname: str, index: int
) -> Section:
    """The largest correct -> wrong flips, with their images."""
    section = Section(f"Largest correct -> wrong flips: {mname}", f"flips-{index}", level=3)
    section.paragraphs.append(
        "Chosen across perturbations: each perturbation in turn (largest mean drop first) "
        "gives its largest remaining drop, on an image not shown yet where it has one."
    )
    section.flip_header = [
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
    for flip in flips:
        section.flips.append(
            Flip(
                [
                    str(flip["perturbation"]),
                    str(flip["severity"]),
                    str(flip["variant"]),
                    str(flip["img_id"]),
                    str(flip["question"]),
                    str(flip["reference"]),
                    str(flip["prediction_clean"]),
                    str(flip["prediction_perturbed"]),
                    f"{pct(flip['clean'])} -> {pct(flip['perturbed'])}",
                ],
                flip.get("image_clean"),
                flip.get("image_perturbed"),
            )
        )
    if not flips:
        section.paragraphs.append("No correct -> wrong flips among the headline pairs.")
    return section


def _effective_robustness_section(er: Mapping[str, Any]) -> Section:
    """Perturbed score above or below the clean-to-perturbed trend across models."""
    section = Section("Effective robustness", "effective-robustness")
    if er.get("computed"):
        section.paragraphs.append(
            f"Perturbed {er['metric']} minus the value predicted from clean {er['metric']} by a "
            "logit-linear fit across the scored models (Taori et al. 2020); positive = more robust than the trend."
        )
        names = er["models"]
        rows = [
            [pert] + [est(d.get(n), signed=True) for n in names]
            for pert, d in er["by_perturbation"].items()
        ]
        section.tables.append(Table(["perturbation", *list(names)], rows, id="er-table"))
    else:
        section.paragraphs.append(f"Not computed: {er.get('reason', 'n/a')}.")
    return section


def _coverage_section(coverage: Mapping[str, Any]) -> Section:
    """Manifest outputs with and without scored predictions, per model."""
    section = Section("Coverage of the manifest", "coverage")
    section.paragraphs.append(
        f"Manifest outputs with / without scored predictions ({coverage['outputs']} outputs); "
        "a share under 90% is a warning at the top."
    )
    for mname, cm in sorted(coverage["models"].items()):
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
        section.tables.append(
            Table(
                ["perturbation/severity", "with predictions", "without", "covered %"],
                rows,
                id=f"coverage-{mname}",
                caption=f"Coverage: {mname}",
            )
        )
    return section


def _pairing_section(scores: Mapping[str, Any]) -> Section:
    """Rows dropped while reading and pairing, with examples; pairing notes."""
    section = Section("Pairing details", "pairing")
    rows = []
    for mname, pairing in sorted(scores.get("pairing", {}).items()):
        for reason, n in pairing["dropped"].items():
            rows.append(
                [mname, reason, str(n), "; ".join(pairing["drop_examples"].get(reason, []))]
            )
        for note in pairing.get("notes", []):
            section.paragraphs.append(f"{mname}: {note}")
    for r in scores.get("reading", []):
        for reason, n in r["dropped"].items():
            rows.append(
                [r["source"], reason, str(n), "; ".join(r["drop_examples"].get(reason, []))]
            )
    section.tables.append(
        Table(
            ["model / source", "reason", "rows", "first examples"],
            rows,
            id="drops",
            caption="Dropped rows",
        )
    )
    return section


def plot_ids(sections: Sequence[Section]) -> list[str]:
    """Every plot slot named by the sections."""
    return [p for s in sections for p in s.plots]
