"""The report's first screen: what was tested, the one-line takeaway, warnings, leaderboard.

Read at a glance: which models, suite, images, pairs and coverage; which pairs and metric the
headline uses and why; the three largest significant gaps; every warning (label risk, coverage,
sample size); and, with several models, a leaderboard ranked by perturbed score.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perturb.report.content import Section, Table, est, pct

SMALL_SAMPLE_IMAGES = 100
WIDE_CI_PP = 10.0


def _sig(d: Mapping[str, Any] | None) -> bool:
    if not d or not d.get("ci") or d["ci"][0] is None or d["ci"][1] is None:
        return False
    lo, hi = d["ci"]
    return bool(lo > 0 or hi < 0)


def gaps(model: Mapping[str, Any], metric: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(perturbation, metric cell) sorted by delta, most negative first."""
    out = []
    for p, cell in (model.get("by_perturbation") or {}).items():
        m = (cell or {}).get("metrics", {}).get(metric)
        if m and m["delta"]["estimate"] is not None:
            out.append((p, m))
    return sorted(out, key=lambda t: (t[1]["delta"]["estimate"], t[0]))


def takeaway(model: Mapping[str, Any], metric: str, k: int = 3) -> str:
    """One line: the ``k`` largest significant drops of ``metric`` (or that there are none)."""
    sig = [
        (p, m) for p, m in gaps(model, metric) if _sig(m["delta"]) and m["delta"]["estimate"] < 0
    ]
    if not sig:
        g = gaps(model, metric)
        if not g:
            return f"No per-perturbation {metric} gaps."
        p, m = g[0]
        return (
            f"No significant drop of {metric} (95% CI); largest: {p} "
            f"{pct(m['delta']['estimate'], signed=True)} pp."
        )
    parts = [f"{p} {pct(m['delta']['estimate'], signed=True)} pp" for p, m in sig[:k]]
    more = f" ({len(sig) - k} more significant)" if len(sig) > k else ""
    return f"Worst ({metric}): " + ", ".join(parts) + more + "."


def sample_warning(scores: Mapping[str, Any]) -> str | None:
    """A warning when the sample is small (< 100 images) or the per-op CIs are wide."""
    prim = scores["config"]["primary"]
    n_img = scores.get("tested", {}).get("images")
    widths = []
    for model in scores["models"].values():
        for _, m in gaps(model, prim):
            ci = m["delta"].get("ci")
            if ci and ci[0] is not None and ci[1] is not None:
                widths.append(100 * (ci[1] - ci[0]))
    widths.sort()
    med = widths[len(widths) // 2] if widths else None
    parts = []
    if n_img is not None and n_img < SMALL_SAMPLE_IMAGES:
        parts.append(f"only {n_img} images (< {SMALL_SAMPLE_IMAGES})")
    if med is not None and med > WIDE_CI_PP:
        parts.append(f"median 95% CI width of the per-perturbation gaps {med:.1f} pp")
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
        m = ((model.get("overall") or {}).get("metrics") or {}).get(prim)
        if not m:
            continue
        g = gaps(model, prim)
        worst = f"{g[0][0]} {est(g[0][1]['delta'], signed=True)}" if g else "-"
        row = [
            name,
            est(m["clean"]),
            est(m["perturbed"]),
            est(m["delta"], signed=True) + (" *" if _sig(m["delta"]) else ""),
            est(m.get("relative_drop")),
            worst,
        ]
        if er_all:
            row.append(est(er_all.get(name), signed=True))
        rows.append((m["perturbed"]["estimate"] or 0.0, name, row))
    rows.sort(key=lambda t: (-t[0], t[1]))
    hdr = [
        "rank",
        "model",
        "clean",
        "perturbed",
        "gap (pp)",
        "relative drop %",
        "worst perturbation",
    ]
    if er_all:
        hdr.append("effective robustness (pp)")
    return Table(
        hdr,
        [[str(i + 1), *r] for i, (_, _, r) in enumerate(rows)],
        id="leaderboard",
        caption=f"{prim}, headline pairs, ranked by perturbed score; * 95% CI excludes 0",
    )


def glance_section(scores: Mapping[str, Any]) -> Section:
    """The first screen of the report."""
    cfg = scores["config"]
    prim = cfg["primary"]
    t = scores.get("tested", {})
    head = scores.get("headline") or {}
    s = Section("At a glance", "glance")
    cov = t.get("coverage")
    cov_txt = f"; coverage {cov:.0%} of manifest outputs" if cov is not None else ""
    s.paragraphs.append(
        f"Tested: {', '.join(t.get('models', []))}; suite {', '.join(t.get('suites') or ['-'])}; "
        f"{t.get('images', '-')} images, {scores['counts']['pairs']} pairs over "
        f"{t.get('perturbations', '-')} perturbation(s){cov_txt}."
    )
    uses = "all pairs" if head.get("uses") == "all_pairs" else "label-safe pairs"
    s.paragraphs.append(
        f"Headline: {prim} on {uses} ({head.get('headline_pairs', '-')} pairs; "
        f"{head.get('at_risk_pairs', 0)} label-risk). Metric: {cfg.get('primary_reason', '')}."
    )
    for name, model in sorted(scores["models"].items()):
        lead = f"{name}: " if len(scores["models"]) > 1 else ""
        line = takeaway(model, prim)
        safe = ((model.get("overall_label_safe") or {}).get("metrics") or {}).get(prim)
        if head.get("uses") == "all_pairs" and safe:
            line += f" Label-safe pairs only: {est(safe['delta'], signed=True)} pp overall."
        s.paragraphs.append("Takeaway: " + lead + line)
    for name, model in sorted(scores["models"].items()):
        cal = (model.get("calibration") or {}).get("overall")
        if cal:
            lead = f"{name}: " if len(scores["models"]) > 1 else ""
            s.paragraphs.append(
                f"Calibration: {lead}ECE {pct(cal['clean']['ece'])} clean -> "
                f"{pct(cal['perturbed']['ece'])} perturbed (shift "
                f"{est(cal['delta_ece'], signed=True)} pp); overconfidence shift "
                f"{est(cal['delta_overconfidence'], signed=True)} pp."
            )
    for w in scores.get("warnings", []):
        s.paragraphs.append(f"Warning: {w}")
    sw = sample_warning(scores)
    if sw:
        s.paragraphs.append(f"Warning: {sw}")
    s.tables.append(leaderboard(scores))
    first = sorted(scores["models"])[0] if scores["models"] else None
    if first is not None:
        s.plots.append(f"delta_bars:{first}")
    return s
