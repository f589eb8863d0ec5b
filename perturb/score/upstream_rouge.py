"""ROUGE as upstream reports it: the median of 1000 bootstrap means (rouge-score's aggregator).

Kvasir-VQA-x1's evaluation calls the ``evaluate`` "rouge" metric with its default aggregator,
rouge-score's ``BootstrapAggregator`` (1000 resamples of the items), and reports the ``mid``
value: the median of the resampled means. It varies from run to run (unseeded) and differs from
the exact mean by a few hundredths of a point. perturb's ROUGE columns are the exact mean; this
adds the upstream-style figure on request (``--rouge-upstream``), computed with rouge-score's own
aggregator under a fixed NumPy seed so reruns agree.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

ROUGE = ("rouge1", "rouge2", "rougeL")
_F = namedtuple("_F", ["fmeasure"])


def bootstrap_mid(values: np.ndarray, seed: int, n_samples: int = 1000) -> float:
    """rouge-score ``BootstrapAggregator(n_samples).aggregate()[...].mid.fmeasure`` of
    per-item F values, with NumPy's global generator seeded (and restored afterwards)."""
    from rouge_score.scoring import BootstrapAggregator

    agg = BootstrapAggregator(n_samples=n_samples)
    for v in values:
        agg.add_scores({"r": _F(float(v))})
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        out = agg.aggregate()["r"].mid.fmeasure
    finally:
        np.random.set_state(state)
    return float(out)


def upstream_rouge(
    models: Sequence[Any], metrics: Sequence[str], seed: int
) -> dict[str, dict[str, Any]]:
    """Per model and ROUGE metric: the upstream-style figure on the clean rows and on all
    perturbed rows (as upstream scores a whole predictions file), next to the exact means."""
    out: dict[str, dict[str, Any]] = {}
    for md in models:
        pairs = md.pairs
        _, first = np.unique(pairs["clean_row"].to_numpy(), return_index=True)
        res: dict[str, Any] = {}
        for m in metrics:
            if m not in ROUGE or m not in md.item_clean:
                continue
            c = md.item_clean[m][first]
            p = md.item_perturbed[m]
            c, p = c[~np.isnan(c)], p[~np.isnan(p)]
            if not c.size or not p.size:
                continue
            res[m] = {
                "clean": {"upstream_mid": bootstrap_mid(c, seed), "mean": float(c.mean())},
                "perturbed": {"upstream_mid": bootstrap_mid(p, seed), "mean": float(p.mean())},
                "rows": {"clean": int(c.size), "perturbed": int(p.size)},
            }
        if res:
            out[md.name] = res
    return out


def describe(section: Mapping[str, Any]) -> str:
    """One sentence for the report."""
    return (
        "Upstream-style ROUGE (median of 1000 bootstrap means, rouge-score's aggregator; "
        "clean rows and all perturbed rows): "
        + "; ".join(
            f"{model} {m} clean {100 * v['clean']['upstream_mid']:.2f} (mean "
            f"{100 * v['clean']['mean']:.2f}), perturbed {100 * v['perturbed']['upstream_mid']:.2f} "
            f"(mean {100 * v['perturbed']['mean']:.2f})"
            for model, d in sorted(section.items())
            for m, v in d.items()
        )
        + "."
    )
