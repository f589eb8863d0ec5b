"""Which pairs the headline uses: label-safe pairs when there are enough, else all pairs.

A pair is *at risk* when its question class may change answer under its perturbation (see
:mod:`perturb.score.risk`: location under a crop, colour under a colour shift...). Label-safe
pairs measure the model and nothing else, so they make the headline by default; but on a run
where most questions are at risk (Kvasir-VQA-x1 track 2: location, count, text, box and size
questions under crop/rotate/translate) an empty headline says nothing, so the headline falls
back to all pairs and says so, with how many pairs are at risk and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

# label-safe pairs are "enough" when they are at least this many and this share of all pairs
MIN_SAFE_PAIRS = 30
MIN_SAFE_SHARE = 0.25


def choose_headline(pairs: Iterable[pd.DataFrame], include_at_risk: bool | None) -> dict[str, Any]:
    """The headline decision, its counts and reasons (the ``headline`` section of scores.json).

    ``include_at_risk``: True forces all pairs, False forces label-safe pairs, None decides:
    label-safe when they are at least ``MIN_SAFE_PAIRS`` and ``MIN_SAFE_SHARE`` of all pairs.
    """
    n = at_risk = 0
    by_class: Counter[str] = Counter()
    by_pert: Counter[str] = Counter()
    combos: Counter[tuple[str, str]] = Counter()
    unchecked = 0
    for df in pairs:
        n += len(df)
        risk = df["at_risk"].to_numpy(dtype=bool)
        at_risk += int(risk.sum())
        if "question_class" in df and "risk_tags" in df:  # no class, under an op that may change answers
            unchecked += sum(
                1 for c, t in zip(df["question_class"], df["risk_tags"], strict=True) if not c and t
            )
        sub = df.loc[risk, ["perturbation", "classes_at_risk"]]
        for p, classes in zip(sub["perturbation"], sub["classes_at_risk"], strict=True):
            by_pert[str(p)] += 1
            for c in classes:
                by_class[str(c)] += 1
                combos[(str(c), str(p))] += 1
    safe = n - at_risk
    enough = safe >= MIN_SAFE_PAIRS and safe >= MIN_SAFE_SHARE * n
    if include_at_risk is None:
        use_all = not enough
        how = "auto"
    else:
        use_all = bool(include_at_risk)
        how = "forced (--include-at-risk)" if use_all else "forced (--exclude-at-risk)"
    top = ", ".join(f"{c} under {p} ({k})" for (c, p), k in combos.most_common(4))
    share = at_risk / n if n else 0.0
    warning = None
    if at_risk and use_all:
        why = (
            f"only {safe} label-safe pairs ({safe / n:.0%} of all; a label-safe headline needs "
            f"at least {MIN_SAFE_PAIRS} and {MIN_SAFE_SHARE:.0%})"
            if how == "auto"
            else "--include-at-risk"
        )
        warning = (
            f"Headline uses ALL pairs: {at_risk} of {n} pairs ({share:.0%}) are label-risk "
            f"(the perturbation may change the correct answer: {top}); {why}. Gaps on these "
            "pairs mix model errors with changed labels; see the label-safe row and the label-risk "
            "tables" + ("; --exclude-at-risk forces label-safe pairs." if how == "auto" else ".")
        )
    elif at_risk and not enough:
        warning = (
            f"Headline uses only {safe} label-safe pairs of {n} ({at_risk} label-risk pairs left "
            f"out: {top}): too few for tight intervals; --include-at-risk uses all pairs."
        )
    if unchecked:
        note = (
            f"Label risk not checked for {unchecked} of {n} pairs: they have no question_class, "
            "so a perturbation that may change their correct answer (a device question under "
            "support devices, a side under a flip) goes unnoticed and they count as label-safe; "
            "give the rows a question_class (README: Scoring predictions) or score a dataset "
            "whose format names its question types (--format)"
        )
        warning = f"{warning} {note}" if warning else note
    return {
        "uses": "all_pairs" if use_all else "label_safe",
        "decided": how,
        "pairs": n,
        "at_risk_pairs": at_risk,
        "unchecked_pairs": unchecked,
        "label_safe_pairs": safe,
        "headline_pairs": n if use_all else safe,
        "threshold": {"min_pairs": MIN_SAFE_PAIRS, "min_share": MIN_SAFE_SHARE},
        "at_risk_by_class": dict(by_class.most_common()),
        "at_risk_by_perturbation": dict(by_pert.most_common()),
        "warning": warning,
    }


def headline_label(decision: Mapping[str, Any]) -> str:
    """Short text naming the headline's pairs, for report titles."""
    if decision.get("uses") == "all_pairs":
        return "all pairs (label-risk pairs included)"
    return "label-safe pairs"
