"""Coverage: how many of a manifest's outputs have scored predictions, per op and severity.

A perturbed prediction file may cover only part of a generated split (a run that stopped, a
filtered file). Gaps are never silent: under :data:`MIN_COVERAGE` the run gets a warning in
scores.json and the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perturb.score.manifest import Manifest

MIN_COVERAGE = 0.90


def manifest_coverage(man: Manifest, paired: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """Per model: manifest outputs with / without predictions, overall and per (op, severity).

    An output counts as "with predictions" when at least one of its perturbed rows was scored
    (matched to the output, through any of the row's images, and paired with a clean row).
    """
    table = man.table
    n = len(table)
    ops = table["op"].astype(str).to_numpy()
    sev = table["severity"].to_numpy(np.int64)
    out: dict[str, Any] = {"outputs": n, "models": {}, "warnings": []}
    for model, pairs in paired.items():
        rows = pairs["manifest_row"].to_numpy(np.int64)
        covered = np.zeros(n, dtype=bool)
        covered[rows[rows >= 0]] = True
        if "manifest_rows_other" in pairs.columns:  # a study's other views, matched too
            for views in pairs["manifest_rows_other"].to_numpy(dtype=object):
                if views:
                    covered[list(views)] = True
        df = pd.DataFrame({"op": ops, "severity": sev, "covered": covered})
        g = df.groupby(["op", "severity"], sort=True)["covered"].agg(["sum", "size"])
        by = {
            f"{op}/s{s}": {"with": int(r["sum"]), "without": int(r["size"] - r["sum"])}
            for (op, s), r in g.iterrows()
        }
        k = int(covered.sum())
        share = k / n if n else 1.0
        out["models"][model] = {
            "with_predictions": k,
            "without_predictions": n - k,
            "share": share,
            "by_perturbation_severity": by,
        }
        if share < MIN_COVERAGE:
            missing = [key for key, v in by.items() if v["with"] == 0]
            out["warnings"].append(
                f"model {model!r}: predictions cover {k} of {n} manifest outputs ({share:.0%} < "
                f"{MIN_COVERAGE:.0%})"
                + (f"; none for {', '.join(missing[:6])}" if missing else "")
                + (f" and {len(missing) - 6} more op/severity cells" if len(missing) > 6 else "")
                + ": the scores describe only the covered part; score the missing outputs or "
                "pass the manifest of the subset that was predicted"
            )
    return out
