"""The report's first screen: what was tested, the one-line takeaway, warnings, leaderboard.

Read at a glance: which models, suite, images, pairs and coverage; which pairs and metric the
headline uses and why; the three largest significant gaps; every warning (label risk, coverage,
sample size); and, with several models, a leaderboard ranked by perturbed score.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perturb.report.document import Section, Table, est, excludes_zero, pct

SMALL_SAMPLE_IMAGES = 100
WIDE_CI_PP = 10.0


def gaps(model: Mapping[str, Any], metric: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(perturbation, metric cell) sorted by delta, most negative first."""
    out = []
    for pert, cell in (model.get("by_perturbation") or {}).items():
        scores = (cell or {}).get("metrics", {}).get(metric)
        if scores and scores["delta"]["estimate"] is not None:
            out.append((pert, scores))
    return sorted(out, key=lambda item: (item[1]["delta"]["estimate"], item[0]))


def takeaway(model: Mapping[str, Any], metric: str, k: int = 3) -> str:
    """One line: the ``k`` largest significant drops of ``metric`` (or that there are none)."""
    drops = [
        (pert, scores)
        for pert, scores in gaps(model, metric)
        if excludes_zero(scores["delta"]) and scores["delta"]["estimate"] < 0
    ]
    if not drops:
        all_gaps = gaps(model, metric)
        if not all_gaps:
            return f"No per-perturbation {metric} gaps."
        pert, scores = all_gaps[0]
        largest = f"largest: {pert} {pct(scores['delta']['estimate'], signed=True)} pp."
        overall = ((model.get("overall") or {}).get("metrics") or {}).get(metric)
        if overall and excludes_zero(overall["delta"]) and overall["delta"]["estimate"] < 0:
            return (
                f"Overall drop of {metric} {est(overall['delta'], signed=True)} pp (95% CI), "
                f"though no single perturbation's drop is significant on its own; {largest}"
            )
        return f"No significant drop of {metric} (95% CI); {largest}"
    parts = [
        f"{pert} {pct(scores['delta']['estimate'], signed=True)} pp" for pert, scores in drops[:k]
    ]
    more = f" ({len(drops) - k} more significant)" if len(drops) > k else ""
    return f"Worst ({metric}): " + ", ".join(parts) + more + "."


def sample_warning(scores: Mapping[str, Any]) -> str | None:
    """A warning when the sample is small (< 100 images) or the per-op CIs are wide."""
    prim = scores["config"]["primary"]
    n_img = scores.get("tested", {}).get("images")
    widths = []
    for model in scores["models"].values():
        for _, scores_of_op in gaps(model, prim):
            ci = scores_of_op["delta"].get("ci")
            if ci and ci[0] is not None and ci[1] is not None:
                widths.append(100 * (ci[1] - ci[0]))
    widths.sort()
    median = widths[len(widths) // 2] if widths else None
    parts = []
    if n_img is not None and n_img < SMALL_SAMPLE_IMAGES:
        parts.append(f"only {n_img} images (< {SMALL_SAMPLE_IMAGES})")
    if median is not None and median > WIDE_CI_PP:
        parts.append(f"median 95% CI width of the per-perturbation gaps {median:.1f} pp")
    if not parts:
        return None
    return (
        "Small sample: "
        + "; ".join(parts)
        + ". Gaps smaller than the intervals cannot be told apart from noise; score more images."
    )


def leaderboard(scores: Mapping[str, Any]) -> Table:
    """Per model: clean, perturbed, gap (CI), relative drop, worst perturbation; ranked by
    perturbed score; effective robustness when computed (>= 3 models)."""
    prim = scores["config"]["primary"]
    er = scores.get("effective_robustness") or {}
    er_all = (er.get("by_perturbation") or {}).get("(all)", {}) if er.get("computed") else {}
    rows = []
    for name, model in scores["models"].items():
        overall = ((model.get("overall") or {}).get("metrics") or {}).get(prim)
        if not overall:
            continue
        model_gaps = gaps(model, prim)
        worst = (
            f"{model_gaps[0][0]} {est(model_gaps[0][1]['delta'], signed=True)}"
            if model_gaps
            else "-"
        )
        row = [
            name,
            est(overall["clean"]),
            est(overall["perturbed"]),
            est(overall["delta"], signed=True) + (" *" if excludes_zero(overall["delta"]) else ""),
            est(overall.get("relative_drop")),
            worst,
        ]
        if er_all:
            row.append(est(er_all.get(name), signed=True))
        rows.append((overall["perturbed"]["estimate"] or 0.0, name, row))
    rows.sort(key=lambda item: (-item[0], item[1]))
    header = [
        "rank",
        "model",
        "clean",
        "perturbed",
        "gap (pp)",
        "relative drop %",
        "worst perturbation",
    ]
    if er_all:
        header.append("effective robustness (pp)")
    return Table(
        header,
        [[str(i + 1), *r] for i, (_, _, r) in enumerate(rows)],
        id="leaderboard",
        caption=f"{prim}, headline pairs, ranked by perturbed score; * 95% CI excludes 0",
    )


CONTROL_LABELS = {
    "control_no_image": "no image",
    "control_blank": "a blank grey image",
    "control_other_image": "another sample's image",
}
BLIND_SHARE = 0.8  # as perturb.score.controls.BLIND_SHARE (the report does not import score)


def _retained(model: Mapping[str, Any]) -> dict[str, float]:
    by_control = (model.get("controls") or {}).get("by_control") or {}
    return {
        name: float(cells["(all)"]["retained"])
        for name, cells in by_control.items()
        if cells.get("(all)", {}).get("retained") is not None
    }


def _blind(model: Mapping[str, Any]) -> bool:
    return any(v >= BLIND_SHARE for v in _retained(model).values())


def controls_line(model: Mapping[str, Any]) -> str | None:
    """How much of the clean score each control keeps (None without controls)."""
    kept = _retained(model)
    if not kept:
        return None
    metric = (model.get("controls") or {}).get("metric", "")
    parts = [
        f"with {CONTROL_LABELS.get(name, name)} it keeps {share:.0%} of its clean {metric}"
        for name, share in sorted(kept.items(), key=lambda kv: -kv[1])
    ]
    line = "; ".join(parts) + "."
    if _blind(model):
        line += (
            " It answers much of the test without looking at the image, so the perturbation "
            "gaps test it less than they seem."
        )
    return line


def glance_section(scores: Mapping[str, Any]) -> Section:
    """The first screen of the report."""
    cfg = scores["config"]
    prim = cfg["primary"]
    tested = scores.get("tested", {})
    head = scores.get("headline") or {}
    section = Section("At a glance", "glance")
    coverage = tested.get("coverage")
    coverage_text = f"; coverage {coverage:.0%} of manifest outputs" if coverage is not None else ""
    section.paragraphs.append(
        f"Tested: {', '.join(tested.get('models', []))}; "
        f"suite {', '.join(tested.get('suites') or ['-'])}; "
        f"{tested.get('images', '-')} images, {scores['counts']['pairs']} pairs over "
        f"{tested.get('perturbations', '-')} perturbation(s){coverage_text}."
    )
    uses = "all pairs" if head.get("uses") == "all_pairs" else "label-safe pairs"
    unchecked = head.get("unchecked_pairs") or 0
    if unchecked and head.get("uses") != "all_pairs":
        uses = "pairs not flagged label-risk"
    checked = f"; {unchecked} not checked (no question_class)" if unchecked else ""
    section.paragraphs.append(
        f"Headline: {prim} on {uses} ({head.get('headline_pairs', '-')} pairs; "
        f"{head.get('at_risk_pairs', 0)} label-risk{checked}). "
        f"Metric: {cfg.get('primary_reason', '')}."
    )
    for name, model in sorted(scores["models"].items()):
        lead = f"{name}: " if len(scores["models"]) > 1 else ""
        line = takeaway(model, prim)
        safe = ((model.get("overall_label_safe") or {}).get("metrics") or {}).get(prim)
        if head.get("uses") == "all_pairs" and safe:
            line += f" Label-safe pairs only: {est(safe['delta'], signed=True)} pp overall."
        section.paragraphs.append("Takeaway: " + lead + line)
    for name, model in sorted(scores["models"].items()):
        cal = (model.get("calibration") or {}).get("overall")
        if cal:
            lead = f"{name}: " if len(scores["models"]) > 1 else ""
            section.paragraphs.append(
                f"Calibration: {lead}ECE {pct(cal['clean']['ece'])} clean -> "
                f"{pct(cal['perturbed']['ece'])} perturbed (shift "
                f"{est(cal['delta_ece'], signed=True)} pp); overconfidence shift "
                f"{est(cal['delta_overconfidence'], signed=True)} pp."
            )
    for name, model in sorted(scores["models"].items()):
        controls = controls_line(model)
        if controls:
            lead = f"{name}: " if len(scores["models"]) > 1 else ""
            blind = "Warning: " if _blind(model) else ""
            section.paragraphs.append(f"{blind}Controls: {lead}{controls}")
    for warning in scores.get("warnings", []):
        section.paragraphs.append(f"Warning: {warning}")
    small_sample = sample_warning(scores)
    if small_sample:
        section.paragraphs.append(f"Warning: {small_sample}")
    section.tables.append(leaderboard(scores))
    first = sorted(scores["models"])[0] if scores["models"] else None
    if first is not None:
        section.plots.append(f"delta_bars:{first}")
    return section
