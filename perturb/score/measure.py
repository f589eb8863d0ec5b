"""Measure: every requested metric on every model's pairs, the clean side once per clean row
and the perturbed side per pair, each against its own reference (geometric ops move the
perturbed side's boxes); control pairs (``control_*``) set apart."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perturb.errors import InputError
from perturb.score.analysis import ModelData
from perturb.score.controls import split_controls
from perturb.score.inputs import RunInputs
from perturb.score.manifest import Manifest
from perturb.score.metrics import (
    FREE_TEXT_METRICS,
    METRICS,
    PRECOMPUTED_METRICS,
    compute_item_metrics,
    corpus_stats,
    judge_class_scores,
)
from perturb.score.options import ScoreOptions
from perturb.score.pairing import Paired, resolve_image


@dataclass
class Measured:
    """Per-pair metric values of every model, what they apply to, and the control pairs."""

    models: list[ModelData]
    requested: list[str]  # the metrics asked for, with the default set's extras
    item_metrics: list[str]
    corpus_metrics: list[str]
    applicable: Counter[str]  # metric -> pairs it applies to, over all models
    unparsed: dict[str, dict[str, Any]]  # model -> MCQ answers without an option letter
    controls: dict[str, ModelData] = field(default_factory=dict)  # model -> its control pairs

    @property
    def pairs(self) -> dict[str, pd.DataFrame]:
        """Each model's measured pairs (controls set apart)."""
        return {md.name: md.pairs for md in self.models}


def measure(
    inputs: RunInputs, paired: Paired, requested: Sequence[str], options: ScoreOptions
) -> Measured:
    """Every model's metric values (adds ``<metric>_clean`` / ``<metric>_perturbed`` columns
    to the pairs), with the control pairs set apart. Without ``options.metrics`` the default
    set adds what the data calls for (:func:`_default_extras`)."""
    requested = list(requested)
    if options.metrics is None:  # the explicit preset "default" leaves the extras out
        requested += _default_extras(requested, paired.pairs)
    measured = Measured(
        models=[],
        requested=requested,
        item_metrics=[m for m in requested if METRICS[m].kind == "item"],
        corpus_metrics=[m for m in requested if METRICS[m].kind == "corpus"],
        applicable=Counter(),
        unparsed={},
    )
    for mname, pairs in paired.pairs.items():
        measured.models.append(_measure_model(mname, pairs, measured, inputs, options.out_dir))
    _split_controls(measured, inputs, options.out_dir)
    return measured


def _default_extras(requested: Sequence[str], paired: Mapping[str, pd.DataFrame]) -> list[str]:
    """Metrics the default set adds: as upstream, BLEU, chrF and METEOR with ROUGE on free-text
    answers; precomputed per-item scores that the files carry."""
    extras: list[str] = []
    if all(_free_text(p) for p in paired.values()):
        extras += [m for m in FREE_TEXT_METRICS if m not in requested]
    extras += [
        m
        for m in PRECOMPUTED_METRICS
        if m not in requested
        and any(
            np.isfinite(p[f"{m}_given_clean"].to_numpy(np.float64)).any() for p in paired.values()
        )
    ]
    return extras


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


_SHORT_ANSWER = re.compile(r"^\s*(?:[(\[]?[A-Ja-j][)\].:]?|yes|no)\W*$", re.IGNORECASE)


def _split_controls(measured: Measured, inputs: RunInputs, out_dir: Path | None) -> None:
    """Take the control pairs (``control_*``, :mod:`perturb.score.controls`) out of every
    model's measured pairs into ``measured.controls``."""

    def resolver(pairs: pd.DataFrame) -> Callable[[int], tuple[str | None, str | None]]:
        return _image_resolver(pairs, inputs.manifest, inputs.bases, inputs.dataset_info, out_dir)

    kept: list[ModelData] = []
    for md in measured.models:
        rest, ctrl = split_controls(md, resolver)
        if ctrl is not None:
            if len(rest.pairs) == 0:
                raise InputError(
                    f"model {md.name!r}: only control pairs (control_*); pass the perturbed "
                    "predictions too (--perturbed perturbed.jsonl --perturbed controls.jsonl)"
                )
            measured.controls[md.name] = ctrl
        kept.append(rest)
    measured.models[:] = kept


def _measure_model(
    mname: str, pairs: pd.DataFrame, measured: Measured, inputs: RunInputs, out_dir: Path | None
) -> ModelData:
    """One model's metric values: the clean side once per clean row, the perturbed side per
    pair, each against its own reference (geometric ops move the perturbed side's boxes)."""
    n = len(pairs)
    clean_row = pairs["clean_row"].to_numpy()
    unique_clean, pair_to_clean = np.unique(clean_row, return_inverse=True)
    first = np.zeros(len(unique_clean), dtype=np.int64)  # first pair of each clean row
    first[pair_to_clean[::-1]] = np.arange(n)[::-1]
    k = len(first)

    def both(clean_col: str, pert_col: str) -> np.ndarray:
        """Clean values (once per clean row) followed by perturbed values (per pair)."""
        clean_vals = pairs[clean_col].to_numpy(dtype=object)[first]
        return np.concatenate([clean_vals, pairs[pert_col].to_numpy(dtype=object)])

    preds = both("pred_clean", "pred_pert")
    refs = both("reference", "reference_perturbed")
    question_class = pairs["question_class"].to_numpy(dtype=object)
    judge_clean = pairs["judge_clean"].to_numpy(dtype=object)
    judge_pert = pairs["judge_pert"].to_numpy(dtype=object)
    item_metrics = measured.item_metrics
    vals = compute_item_metrics(
        preds,
        refs,
        item_metrics,
        options=both("options", "options"),
        judge=np.concatenate([judge_clean[first], judge_pert]),
        question_class=np.concatenate([question_class[first], question_class]),
        compare=(pair_to_clean, k + np.arange(n)),
        ref_boxes=both("ref_boxes", "ref_boxes_perturbed"),
    )
    changed = vals.pop("_answer_changed")
    if "_mcq_unparsed" in vals:
        measured.unparsed[mname] = _unparsed_summary(pairs, vals.pop("_mcq_unparsed"), first, k)
    item_clean = {m: v[:k][pair_to_clean] for m, v in vals.items()}
    item_pert = {m: v[k:] for m, v in vals.items()}
    for m in PRECOMPUTED_METRICS:
        if m in item_metrics:  # given per item in the files, not computed
            item_clean[m] = pairs[f"{m}_given_clean"].to_numpy(np.float64)
            item_pert[m] = pairs[f"{m}_given_pert"].to_numpy(np.float64)
    corpus_clean: dict[str, np.ndarray] = {}
    corpus_pert: dict[str, np.ndarray] = {}
    for m in measured.corpus_metrics:
        stats = corpus_stats(preds, refs, m)
        corpus_clean[m] = stats[:k][pair_to_clean]
        corpus_pert[m] = stats[k:]
    for m in item_metrics:
        measured.applicable[m] += int((~np.isnan(item_clean[m]) & ~np.isnan(item_pert[m])).sum())
    has_ref = int((~pd.isna(pairs["reference"].to_numpy(dtype=object))).sum())
    for m in measured.corpus_metrics:
        measured.applicable[m] += has_ref
    for m in item_metrics:
        pairs[f"{m}_clean"] = item_clean[m]
        pairs[f"{m}_perturbed"] = item_pert[m]
    return ModelData(
        name=mname,
        pairs=pairs,
        item_clean=item_clean,
        item_perturbed=item_pert,
        corpus_stats_clean=corpus_clean,
        corpus_stats_perturbed=corpus_pert,
        judge_by_class_clean=judge_class_scores(judge_clean, question_class),
        judge_by_class_perturbed=judge_class_scores(judge_pert, question_class),
        images=_image_resolver(pairs, inputs.manifest, inputs.bases, inputs.dataset_info, out_dir),
        answer_changed=changed.astype(np.float64),
    )


def _unparsed_summary(
    pairs: pd.DataFrame, unparsed: np.ndarray, first: np.ndarray, k: int
) -> dict[str, Any]:
    """MCQ answers without a recognisable letter: counts (clean rows once, perturbed per pair),
    per perturbation, and a few examples."""
    clean_unparsed, pert_unparsed = unparsed[:k], unparsed[k:]
    pert = pairs["perturbation"].to_numpy(dtype=object)
    by_pert = Counter(str(p) for p in pert[pert_unparsed])
    examples = [
        {
            "side": "clean",
            "img_id": pairs["img_id"].iat[int(i)],
            "prediction": pairs["pred_clean"].iat[int(i)],
        }
        for i in first[clean_unparsed][:3]
    ] + [
        {
            "side": "perturbed",
            "perturbation": pert[int(i)],
            "img_id": pairs["img_id"].iat[int(i)],
            "prediction": pairs["pred_pert"].iat[int(i)],
        }
        for i in np.flatnonzero(pert_unparsed)[:3]
    ]
    return {
        "clean": int(clean_unparsed.sum()),
        "clean_rows": int(k),
        "perturbed": int(pert_unparsed.sum()),
        "perturbed_rows": len(pert_unparsed),
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
        clean = resolve_image(raw, bases)
        if clean is None and isinstance(raw, str) and raw:
            clean = resolve_image(Path(raw.replace("\\", "/")).name, bases)
        if clean is None and ds_info is not None and out_dir is not None:
            img_id = str(pairs["img_id"].iat[i])
            got = ds_info.image_bytes(img_id)
            if got is not None:
                data, suffix = got
                safe = re.sub(r"[^A-Za-z0-9_.-]", "_", img_id)[:120]
                dest = out_dir / "flip_images" / f"clean_{safe}{suffix}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not dest.is_file():
                    dest.write_bytes(data)
                clean = dest
        return clean

    def resolve(i: int) -> tuple[str | None, str | None]:
        clean = clean_image(i)
        pert: Path | None = None
        manifest_row = int(pairs["manifest_row"].iat[i])
        if man is not None and manifest_row >= 0 and man.root is not None:
            candidate = man.root / str(man.table["path"].iat[manifest_row])
            pert = candidate if candidate.is_file() else None
        if pert is None:
            pert = resolve_image(pairs["image_pert"].iat[i], bases)
        return (str(clean) if clean else None), (str(pert) if pert else None)

    return resolve
