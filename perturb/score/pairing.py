"""Pair: clean and perturbed predictions of each model (:func:`pair_runs`).

Pairing key: the dataset's own question identity ``qid`` when every row of both sides has one
and it is unique on the clean side (ReXVQA question id, MedThinkVQA case, VinDr-CXR-VQA image
id + item index; the bootstrap
cluster is then the clean row's img_id: study, case, image), else ``(img_id, question)``; plus
``variant`` when the clean side has variants. A multi-image row (a study, a case) matches the
manifest through any of its image paths: a case whose first image the op left alone pairs
through the image it changed.

References: each side keeps its own (``reference`` / ``reference_perturbed``, ``ref_boxes`` /
``ref_boxes_perturbed``). They must agree, except under ops that move the geometry
(``moves_geometry`` / ``flips_laterality`` risk tags), where the perturbed side's moved boxes
and ``<loc>`` tags (written by ``perturb generate``) are its reference; a geometric pair whose
perturbed side has no reference while the clean one has boxes is dropped
(``geometric_without_moved_reference``), never scored against the unmoved boxes. A
perturbed row is identified by ``(img_id, question, perturbation, severity, variant)``; its
perturbation / severity / variant come from the file or from the manifest (matched by image
path). Duplicate keys and references that differ between the two sides are errors; unmatched
rows and missing predictions are dropped and counted with reasons and first examples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perturb.datasets.radiology import sample_of_image_paths
from perturb.errors import InputError
from perturb.score.arrays import map_unique, obj_array, object_frame
from perturb.score.manifest import Manifest, match_rows
from perturb.score.read import ReadReport
from perturb.score.risk import (
    catalog_risk_tags,
    catalog_severity_risk,
    classes_at_risk,
    tags_at_severity,
)

if TYPE_CHECKING:  # pragma: no cover
    from perturb.score.inputs import RunInputs
    from perturb.score.options import ScoreOptions


def examples(items: list[str], limit: int = 3) -> str:
    """Join the first ``limit`` example strings for an error message."""
    shown = "; ".join(items[:limit])
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return shown + more


@dataclass
class PairReport:
    """Counts of one model's pairing: inputs, pairs, drops with reasons and examples."""

    model: str
    clean_rows: int = 0
    perturbed_rows: int = 0
    pairs: int = 0
    clean_unpaired: int = 0
    at_risk_pairs: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    drop_examples: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def drop(self, reason: str, items: Sequence[str], count: int | None = None) -> None:
        """Count ``count`` (default ``len(items)``) drops and keep three examples."""
        k = len(items) if count is None else count
        if k == 0:
            return
        self.dropped[reason] += k
        ex = self.drop_examples.setdefault(reason, [])
        ex.extend(items[: max(0, 3 - len(ex))])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "model": self.model,
            "clean_rows": self.clean_rows,
            "perturbed_rows": self.perturbed_rows,
            "pairs": self.pairs,
            "at_risk_pairs": self.at_risk_pairs,
            "clean_rows_without_perturbed_partner": self.clean_unpaired,
            "dropped": dict(sorted(self.dropped.items())),
            "drop_examples": {k: v for k, v in sorted(self.drop_examples.items())},
            "notes": list(self.notes),
        }


def _where(df: pd.DataFrame, idx: np.ndarray, side: str) -> list[str]:
    out = []
    for i in idx[:3]:
        src = df["_src"].iat[i]
        word = df["_word"].iat[i]
        out.append(
            f"{src} {word} {df['_loc'].iat[i]} ({side}: img_id={df['img_id'].iat[i]!r}, "
            f"question={str(df['question'].iat[i])[:60]!r})"
        )
    return out


def _norm_ref(s: str) -> str:
    return " ".join(s.split())


def _codes(*cols: Sequence[Any]) -> list[np.ndarray]:
    """Factorise aligned columns jointly across sides; returns codes per input column."""
    lens = [len(c) for c in cols]
    joined = np.concatenate([np.asarray(c, dtype=object) for c in cols])
    codes, _ = pd.factorize(pd.Series(joined, dtype=object), use_na_sentinel=False)
    out, start = [], 0
    for n in lens:
        out.append(codes[start : start + n].astype(np.int64))
        start += n
    return out


def _int(a: pd.Series) -> np.ndarray:
    return a.fillna(0).astype(np.int64).to_numpy()


def prepare_perturbed(
    frames: Sequence[tuple[pd.DataFrame, ReadReport, str]],
    manifest: Manifest | None,
    report: PairReport,
) -> pd.DataFrame:
    """Concatenate a model's perturbed runs and fill perturbation/severity/variant."""
    parts = []
    for df, rep, run in frames:
        d = df.copy()
        d["_run"] = run
        d["_src"] = rep.source
        d["_word"] = rep.loc_word
        parts.append(d)
    pert = pd.concat(parts, ignore_index=True)
    pert["manifest_row"] = -1
    if manifest is not None:
        pert = _fill_from_manifest(pert, manifest, report)
    missing = pert["perturbation"].isna().to_numpy()
    # which rows had no perturbation name or severity of their own: duplicates among them are
    # missing columns, not repeated predictions (``_check_duplicates`` says so)
    pert["_unlabelled"] = missing | pert["severity"].isna().to_numpy()
    if missing.any():
        runs = sorted(set(pert.loc[missing, "_run"]))
        report.notes.append(
            f"{int(missing.sum())} perturbed rows carry no perturbation name (no column, no manifest "
            f"match): named after their file ({', '.join(runs)})"
        )
        pert.loc[missing, "perturbation"] = pert.loc[missing, "_run"]
    pert["severity"] = pert["severity"].fillna(0).astype(np.int64)
    pert["variant"] = pert["variant"].fillna(0).astype(np.int64)
    return pert


def _fill_from_manifest(pert: pd.DataFrame, manifest: Manifest, report: PairReport) -> pd.DataFrame:
    """Match perturbed rows to manifest rows by image path and take their op, severity, variant
    (and the study/case img_id); rows matched neither way are dropped and counted."""
    rows, reason = match_rows(
        manifest,
        pert["image_path"].to_numpy(),
        pert["img_id"].to_numpy(),
        pert["variant"].to_numpy(),
    )
    views = _other_views(manifest, pert)
    _match_other_paths(rows, reason, views)
    pert["_manifest_rows_other"] = views
    table = manifest.table
    hit = rows >= 0
    has_file_pert = pert["perturbation"].notna().to_numpy()
    with_paths = pert["image_path"].notna().to_numpy()
    if manifest.given and with_paths.any() and not hit[with_paths].any() and has_file_pert.any():
        # rows kept by their own op column would be scored under another split's suite
        raise InputError(
            f"none of the perturbed rows' images is an output listed in {manifest.source}: it is "
            "the manifest of another split; pass the manifest of the split these predictions "
            "were made on (or none: it is found beside the images)"
        )
    hit_idx = np.flatnonzero(hit)
    from_manifest = _ManifestFields(
        op=table["op"].to_numpy()[rows[hit_idx]],
        severity=table["severity"].to_numpy()[rows[hit_idx]],
        variant=table["variant"].to_numpy()[rows[hit_idx]],
        img_id=table["img_id"].to_numpy()[rows[hit_idx]],
    )
    id_from_path = (
        pert["_id_from_path"].fillna(False).to_numpy(dtype=bool)
        if "_id_from_path" in pert.columns
        else np.zeros(len(pert), dtype=bool)
    )
    _check_manifest_conflicts(pert, manifest, rows, hit_idx, from_manifest, id_from_path)
    # a generated file name cut to MAX_STEM loses the path a study is read from: the
    # manifest's img_id of the row's (first) image still names it
    derived = id_from_path[hit_idx]
    if derived.any():
        ids = pert["img_id"].to_numpy(dtype=object, copy=True)
        for j in np.flatnonzero(derived):
            ids[hit_idx[j]] = (
                sample_of_image_paths([str(from_manifest.img_id[j])]) or ids[hit_idx[j]]
            )
        pert["img_id"] = ids
    pert.loc[hit, "perturbation"] = from_manifest.op
    pert.loc[hit, "severity"] = from_manifest.severity
    pert.loc[hit, "variant"] = from_manifest.variant
    pert.loc[hit, "manifest_row"] = rows[hit]
    kept_unmatched = ~hit & has_file_pert
    if kept_unmatched.any():
        report.notes.append(
            f"{int(kept_unmatched.sum())} perturbed rows not found in the manifest kept their "
            "own perturbation column"
        )
    for why in ("no_manifest_match", "ambiguous_manifest_match"):
        bad_rows = np.flatnonzero(~hit & ~has_file_pert & (reason == why))
        report.drop(why, _where(pert, bad_rows, "perturbed"), count=len(bad_rows))
    return pert[hit | has_file_pert].reset_index(drop=True)


@dataclass
class _ManifestFields:
    """The manifest's op, severity, variant and img_id of the matched perturbed rows."""

    op: np.ndarray
    severity: np.ndarray
    variant: np.ndarray
    img_id: np.ndarray


def _check_manifest_conflicts(
    pert: pd.DataFrame,
    manifest: Manifest,
    rows: np.ndarray,
    hit_idx: np.ndarray,
    from_manifest: _ManifestFields,
    id_from_path: np.ndarray,
) -> None:
    """InputError when a matched row's own columns disagree with its manifest row."""
    file_op = pert["perturbation"].to_numpy()[hit_idx]
    file_sev = pert["severity"].to_numpy(dtype=float, na_value=np.nan)[hit_idx]
    file_var = pert["variant"].to_numpy(dtype=float, na_value=np.nan)[hit_idx]
    file_img = pert["img_id"].to_numpy()[hit_idx]
    bad = (
        (pd.notna(file_op) & (file_op != from_manifest.op))
        | (~np.isnan(file_sev) & (file_sev != from_manifest.severity))
        | (~np.isnan(file_var) & (file_var != from_manifest.variant))
        # an img_id derived from several images' paths names their study or case
        | ((file_img != from_manifest.img_id) & ~id_from_path[hit_idx])
    )
    if not bad.any():
        return
    conflicts: list[str] = []
    for j in np.flatnonzero(bad)[:3]:
        i = hit_idx[j]
        conflicts.append(
            f"{pert['_src'].iat[i]} {pert['_word'].iat[i]} {pert['_loc'].iat[i]}: file says "
            f"(img_id={file_img[j]!r}, perturbation={file_op[j]!r}, severity={file_sev[j]}, "
            f"variant={file_var[j]}), manifest row {rows[i]} says ({from_manifest.img_id[j]!r}, "
            f"{from_manifest.op[j]!r}, {from_manifest.severity[j]}, {from_manifest.variant[j]})"
        )
    raise InputError(
        f"{int(bad.sum())} perturbed rows disagree with the manifest {manifest.source}: "
        f"{examples(conflicts)}. Use the manifest of the split these predictions were made "
        "on, or drop the conflicting columns from the predictions."
    )


def _match_other_paths(rows: np.ndarray, reason: np.ndarray, views: np.ndarray) -> None:
    """Rows of several images whose first image is not in the manifest: matched through their
    other images (``views``, in place). A MedThinkVQA case under an op of one modality keeps its
    other images clean."""
    for i in np.flatnonzero(rows < 0):
        if views[i]:
            rows[i] = views[i][0]
            reason[i] = ""


def _other_views(manifest: Manifest, pert: pd.DataFrame) -> np.ndarray:
    """Per perturbed row, the manifest rows of its images after the first (a study's other
    views; empty for one image): outputs a prediction covers besides its ``manifest_row``."""
    out = np.empty(len(pert), dtype=object)
    out[:] = [()] * len(pert)
    if "_paths" not in pert.columns:
        return out
    owner, paths = [], []
    for i, row_paths in enumerate(pert["_paths"].to_numpy(dtype=object)):
        if isinstance(row_paths, tuple) and len(row_paths) > 1:
            owner += [i] * (len(row_paths) - 1)
            paths += list(row_paths[1:])
    if not paths:
        return out
    found, _ = match_rows(
        manifest,
        obj_array(paths),
        np.full(len(paths), None, dtype=object),
        np.full(len(paths), np.nan),
    )
    views: dict[int, list[int]] = {}
    for i, hit in zip(owner, found, strict=True):
        if hit >= 0:
            views.setdefault(i, []).append(int(hit))
    for i, hits in views.items():
        out[i] = tuple(hits)
    return out


def pair_model(
    model: str,
    clean: pd.DataFrame,
    clean_report: ReadReport,
    perturbed: Sequence[tuple[pd.DataFrame, ReadReport, str]],
    manifest: Manifest | None = None,
    risk_tags: Mapping[str, Sequence[str]] | None = None,
    risk_map: Mapping[str, Sequence[str]] | None = None,
) -> tuple[pd.DataFrame, PairReport]:
    """Pair one model's clean rows with its perturbed rows; see the module docstring."""
    report = PairReport(model=model, clean_rows=len(clean))
    clean = clean.copy()
    clean["_src"] = clean_report.source
    clean["_word"] = clean_report.loc_word
    pert = prepare_perturbed(perturbed, manifest, report)
    report.perturbed_rows = sum(len(f) for f, _, _ in perturbed)
    keys = _pairing_keys(clean, pert, report)
    _check_duplicates(clean, pert, keys, clean_report.source, manifest)
    clean_row = pd.Index(keys.clean).get_indexer(keys.perturbed)
    unmatched = np.flatnonzero(clean_row < 0)
    if len(clean) == 0 or len(pert) == 0:
        side, reads = (
            ("clean", [clean_report])
            if len(clean) == 0
            else ("perturbed", [r for _, r, _ in perturbed])
        )
        why: dict[str, int] = {}
        for r in reads:
            for reason, n in r.dropped.items():
                why[reason] = why.get(reason, 0) + n
        if side == "perturbed":  # and those the manifest did not know
            for reason, n in report.dropped.items():
                why[reason] = why.get(reason, 0) + n
        dropped = ", ".join(f"{k}={v}" for k, v in sorted(why.items())) or "none"
        hint = (
            "; inference_error: the model gave no answer (re-run `perturb predict` to retry)"
            if "inference_error" in why
            else ""
        )
        if manifest is not None and why.get("no_manifest_match", 0) + why.get(
            "ambiguous_manifest_match", 0
        ) >= report.perturbed_rows > 0:
            hint += (
                f"; none of the perturbed rows' images is an output listed in {manifest.source}: "
                "pass the manifest of the split these predictions were made on (or none: it is "
                "found beside the images)"
            )
        raise InputError(
            f"model {model!r}: no {side} rows left after reading (dropped: {dropped}){hint}"
        )
    if len(unmatched) == len(pert):
        raise InputError(
            f"model {model!r}: no perturbed row matches a clean row on {keys.name}. First perturbed: "
            f"{examples(_where(pert, np.arange(len(pert)), 'perturbed'), 2)}; first clean: "
            f"{examples(_where(clean, np.arange(len(clean)), 'clean'), 2)}. Check that both files "
            "come from the same questions and that img_id is the image file stem."
        )
    report.drop("no_clean_match", _where(pert, unmatched, "perturbed"), count=len(unmatched))
    keep = clean_row >= 0
    pert = pert[keep].reset_index(drop=True)
    clean_row = clean_row[keep]
    report.clean_unpaired = int(len(clean) - len(np.unique(clean_row)))
    ok = _with_predictions(clean, pert, clean_row, report)
    refs = _references(model, clean, pert, clean_row, ok, keys.name, manifest, risk_tags, report)
    pert = pert[refs.ok].reset_index(drop=True)
    clean_row = clean_row[refs.ok]
    pairs = _pairs_frame(model, clean, pert, clean_row, refs)
    _add_risk(pairs, manifest, risk_tags, risk_map, report)
    report.pairs = len(pairs)
    report.at_risk_pairs = int(pairs["at_risk"].sum())
    return pairs, report


@dataclass
class Paired:
    """Every model's pairs (one row per perturbed row with its clean row) and pairing report."""

    pairs: dict[str, pd.DataFrame]
    reports: dict[str, PairReport]

    def problems(self) -> list[str]:
        """One problem line per model that lost rows while pairing."""
        return [
            f"model {name!r}: {sum(report.dropped.values())} rows dropped while pairing "
            + ", ".join(f"{k}={v}" for k, v in sorted(report.dropped.items()))
            for name, report in self.reports.items()
            if report.dropped
        ]


def pair_runs(inputs: RunInputs, options: ScoreOptions) -> Paired:
    """Pair each model's clean and perturbed rows; InputError for a model left with no pair."""
    paired = Paired(pairs={}, reports={})
    for name in inputs.models:
        clean = inputs.clean[name]
        pairs, report = pair_model(
            name,
            clean.rows,
            clean.report,
            inputs.perturbed[name],
            inputs.manifest,
            options.risk_tags,
            options.risk_map,
        )
        if len(pairs) == 0:
            raise InputError(
                f"model {name!r}: no usable pairs after dropping rows ({dict(report.dropped)}); "
                f"examples: {report.drop_examples}"
            )
        paired.pairs[name] = pairs
        paired.reports[name] = report
    return paired


@dataclass
class _PairingKeys:
    """One integer key per clean row and per perturbed row; equal keys pair."""

    clean: np.ndarray
    perturbed: np.ndarray
    name: str  # the key's fields, for messages: "(img_id, question, variant)"


def _pairing_keys(clean: pd.DataFrame, pert: pd.DataFrame, report: PairReport) -> _PairingKeys:
    """Keys on the dataset's question id when both sides have a unique one, else on
    (img_id, question); with the variant when the clean side has variants."""
    use_variant = bool(clean["variant"].notna().any())
    clean_var = _int(clean["variant"]) if use_variant else np.zeros(len(clean), np.int64)
    pert_var = pert["variant"].to_numpy(np.int64) if use_variant else np.zeros(len(pert), np.int64)
    use_qid = (
        "qid" in clean.columns
        and "qid" in pert.columns
        and len(pert) > 0
        and bool(clean["qid"].notna().all() and pert["qid"].notna().all())
        # an id that repeats on the clean side names a question template, not a question:
        # pair on (img_id, question id) as before
        and not pd.DataFrame({"q": clean["qid"].to_numpy(), "v": clean_var}).duplicated().any()
    )
    if use_qid:  # the dataset's own question identity
        clean_img, pert_img = np.zeros(len(clean), np.int64), np.zeros(len(pert), np.int64)
        clean_q, pert_q = _codes(clean["qid"], pert["qid"])
        report.notes.append("paired by the dataset's question id (qid); cluster = clean img_id")
    else:
        clean_img, pert_img = _codes(clean["img_id"], pert["img_id"])
        clean_q, pert_q = _codes(clean["qkey"], pert["qkey"])
    n_questions = int(max(clean_q.max(initial=0), pert_q.max(initial=0))) + 1
    n_variants = int(max(clean_var.max(initial=0), pert_var.max(initial=0))) + 1
    return _PairingKeys(
        clean=(clean_img * n_questions + clean_q) * n_variants + clean_var,
        perturbed=(pert_img * n_questions + pert_q) * n_variants + pert_var,
        name=("(question id" if use_qid else "(img_id, question")
        + (", variant)" if use_variant else ")"),
    )


def _check_duplicates(
    clean: pd.DataFrame,
    pert: pd.DataFrame,
    keys: _PairingKeys,
    clean_source: str,
    manifest: Manifest | None,
) -> None:
    """InputError for clean rows sharing a key, or perturbed rows sharing a key, perturbation,
    severity and variant."""
    uniq, counts = np.unique(keys.clean, return_counts=True)
    if (counts > 1).any():
        dup_keys = uniq[counts > 1]
        rows = np.flatnonzero(np.isin(keys.clean, dup_keys[:3]))
        derived = "_id_from_path" in clean.columns and bool(
            clean["_id_from_path"].fillna(False).to_numpy(dtype=bool)[rows].any()
        )
        raise InputError(
            f"{clean_source}: {int((counts - 1)[counts > 1].sum())} duplicate clean rows with "
            f"the same {keys.name}: {examples(_where(clean, rows, 'clean'), 6)}. "
            + (
                "Their img_id comes from the image file names (the rows carry no img_id or study "
                "column), which several samples share here: add an 'img_id' column naming each "
                "sample to both prediction files."
                if derived
                else "Keep one row per key (or add a 'variant' column if the rows are different "
                "image variants)."
            )
        )
    full = pd.DataFrame(
        {
            "key": keys.perturbed,
            "op": _codes(pert["perturbation"])[0],
            "severity": pert["severity"].to_numpy(np.int64),
            "variant": pert["variant"].to_numpy(np.int64),
        }
    )
    dup = full.duplicated(keep=False).to_numpy()
    if dup.any():
        rows = np.flatnonzero(dup)
        unlabelled = pert["_unlabelled"].to_numpy(dtype=bool) if "_unlabelled" in pert else None
        if unlabelled is not None and unlabelled[rows].all():
            raise InputError(
                f"{int(full.duplicated().sum())} perturbed rows share a {keys.name[:-1]}) because "
                "they carry no perturbation and/or severity: add 'perturbation' and 'severity' "
                "columns (and 'variant' for repeated draws) to the predictions, or pass --manifest "
                f"DIR/manifest.parquet so rows are matched by image path: "
                f"{examples(_where(pert, rows, 'perturbed'), 4)}"
            )
        raise InputError(
            f"{int(full.duplicated().sum())} duplicate perturbed rows with the same {keys.name[:-1]}, "
            f"perturbation, severity, variant): {examples(_where(pert, rows, 'perturbed'), 6)}. Each "
            "perturbed image/question must appear once per model; split repeated runs into separate models."
            + _manifest_hint(manifest, pert)
        )


def _with_predictions(
    clean: pd.DataFrame, pert: pd.DataFrame, clean_row: np.ndarray, report: PairReport
) -> np.ndarray:
    """Pairs with a prediction on both sides (the others dropped and counted)."""
    missing_clean = pd.isna(clean["prediction"].to_numpy(dtype=object)[clean_row])
    missing_pert = pd.isna(pert["prediction"].to_numpy(dtype=object)) & ~missing_clean
    report.drop(
        "missing_prediction_clean",
        _where(clean, clean_row[missing_clean], "clean"),
        count=int(missing_clean.sum()),
    )
    report.drop(
        "missing_prediction_perturbed",
        _where(pert, np.flatnonzero(missing_pert), "perturbed"),
        count=int(missing_pert.sum()),
    )
    return ~missing_clean & ~missing_pert


@dataclass
class _References:
    """Each pair's references, clean and perturbed side, and which pairs are kept."""

    clean: np.ndarray
    perturbed: np.ndarray
    boxes_clean: np.ndarray
    boxes_perturbed: np.ndarray
    ok: np.ndarray


def _references(
    model: str,
    clean: pd.DataFrame,
    pert: pd.DataFrame,
    clean_row: np.ndarray,
    ok: np.ndarray,
    key_name: str,
    manifest: Manifest | None,
    risk_tags: Mapping[str, Sequence[str]] | None,
    report: PairReport,
) -> _References:
    """References equal (up to whitespace) where both sides have one, except under geometric
    ops (the perturbed side's moved boxes are its reference); else taken from either side.
    Pairs without a usable reference are dropped and counted."""
    ref_clean = clean["reference"].to_numpy(dtype=object)[clean_row]
    ref_pert = pert["reference"].to_numpy(dtype=object)
    norm_clean = map_unique(ref_clean, lambda r: _norm_ref(r) if isinstance(r, str) else None)
    norm_pert = map_unique(ref_pert, lambda r: _norm_ref(r) if isinstance(r, str) else None)
    geometric = _geometric(pert, manifest, risk_tags)
    differ = ~pd.isna(ref_clean) & ~pd.isna(ref_pert) & (norm_clean != norm_pert) & ~geometric
    none = np.full(len(pert), None, dtype=object)
    box_clean = (
        clean["ref_boxes"].to_numpy(dtype=object)[clean_row]
        if "ref_boxes" in clean.columns
        else none
    )
    box_pert = pert["ref_boxes"].to_numpy(dtype=object) if "ref_boxes" in pert.columns else none
    clean_has_boxes = ~pd.isna(box_clean) | map_unique(
        ref_clean, lambda r: isinstance(r, str) and "<loc_" in r
    ).astype(bool)
    unmoved = geometric & clean_has_boxes & pd.isna(ref_pert) & pd.isna(box_pert) & ok
    report.drop(
        "geometric_without_moved_reference",
        [
            s + " (give the perturbed rows the moved answer / gt_location of perturb generate's "
            "DIR/dataset rows)"
            for s in _where(pert, np.flatnonzero(unmoved), "perturbed")
        ],
        count=int(unmoved.sum()),
    )
    ok = ok & ~unmoved
    if differ.any():
        ex = [
            f"{pert['_src'].iat[i]} {pert['_word'].iat[i]} {pert['_loc'].iat[i]}: clean reference "
            f"{str(ref_clean[i])[:50]!r} vs perturbed {str(ref_pert[i])[:50]!r}"
            for i in np.flatnonzero(differ)[:3]
        ]
        raise InputError(
            f"model {model!r}: {int(differ.sum())} pairs have different reference answers on the two "
            f"sides: {examples(ex)}. Both files must hold the same questions and answers; check that "
            f"they come from the same split and that the pairing key {key_name} is right. Under an "
            "op that moves the image (rotation, crop, flip) the perturbed side's moved boxes are "
            "its reference: pass --manifest (or a perturbation column naming the op) so the "
            "scorer knows the op moves geometry."
        )
    ref = np.where(pd.isna(ref_clean), ref_pert, ref_clean)
    judge_clean = clean["judge"].to_numpy(dtype=object)[clean_row]
    judge_pert = pert["judge"].to_numpy(dtype=object)
    bad_ref = pd.isna(ref) & (pd.isna(judge_clean) | pd.isna(judge_pert)) & ok
    report.drop(
        "missing_reference",
        _where(pert, np.flatnonzero(bad_ref), "perturbed"),
        count=int(bad_ref.sum()),
    )
    ok &= ~bad_ref
    return _References(
        clean=ref[ok],
        perturbed=np.where(pd.isna(ref_pert), ref_clean, ref_pert)[ok],
        boxes_clean=np.where(pd.isna(box_clean), box_pert, box_clean)[ok],
        boxes_perturbed=np.where(pd.isna(box_pert) & ~geometric, box_clean, box_pert)[ok],
        ok=ok,
    )


def _pairs_frame(
    model: str, clean: pd.DataFrame, pert: pd.DataFrame, clean_row: np.ndarray, refs: _References
) -> pd.DataFrame:
    """The paired table: one row per kept pair, clean columns taken at ``clean_row``."""

    def clean_col(col: str) -> np.ndarray:
        return clean[col].to_numpy(dtype=object)[clean_row]

    def pert_col(col: str) -> np.ndarray:
        return pert[col].to_numpy(dtype=object)

    def pick(col: str, empty: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The clean side's value, the perturbed side's where the clean one is empty."""
        out = clean_col(col).copy()
        e = empty(out)
        out[e] = pert_col(col)[e]
        return out

    no_class = lambda a: np.fromiter((not x for x in a), dtype=bool, count=len(a))  # noqa: E731
    complexity = pd.array(
        np.where(
            clean["complexity"].isna().to_numpy()[clean_row],
            pert["complexity"].to_numpy(dtype=float, na_value=np.nan),
            clean["complexity"].to_numpy(dtype=float, na_value=np.nan)[clean_row],
        ),
        dtype="Float64",
    ).astype("Int64")
    return object_frame(
        {
            "model": np.full(len(pert), model, dtype=object),
            "run": pert_col("_run"),
            "perturbation": pert_col("perturbation"),
            "severity": pert["severity"].to_numpy(np.int64),
            "variant": pert["variant"].to_numpy(np.int64),
            # the clean row's sample (equal to the perturbed one's unless paired by qid)
            "img_id": clean_col("img_id"),
            "question": clean_col("question"),
            "reference": refs.clean,
            "reference_perturbed": refs.perturbed,
            "complexity": complexity,
            "question_class": pick("question_class", no_class),
            "options": pick("options", pd.isna),
            "ref_boxes": refs.boxes_clean,
            "ref_boxes_perturbed": refs.boxes_perturbed,
            "pred_clean": clean_col("prediction"),
            "pred_pert": pert_col("prediction"),
            "judge_clean": clean_col("judge"),
            "judge_pert": pert_col("judge"),
            "image_clean": clean_col("image_path"),
            "image_pert": pert_col("image_path"),
            "manifest_row": pert["manifest_row"].to_numpy(np.int64),
            "manifest_rows_other": (
                pert["_manifest_rows_other"].to_numpy(dtype=object)
                if "_manifest_rows_other" in pert.columns
                else no_views(len(pert))
            ),
            "clean_row": clean_row,
            "conf_clean": _floats(clean, "confidence")[clean_row],
            "conf_pert": _floats(pert, "confidence"),
            "bleurt_given_clean": _floats(clean, "bleurt")[clean_row],
            "bleurt_given_pert": _floats(pert, "bleurt"),
            "bertscore_given_clean": _floats(clean, "bertscore")[clean_row],
            "bertscore_given_pert": _floats(pert, "bertscore"),
        }
    )


def no_views(n: int) -> np.ndarray:
    """``n`` empty tuples (rows with no other view in the manifest)."""
    out = np.empty(n, dtype=object)
    out[:] = [()] * n
    return out


GEOMETRIC_TAGS = ("moves_geometry", "flips_laterality")


def _geometric(
    pert: pd.DataFrame, manifest: Manifest | None, risk_tags: Mapping[str, Sequence[str]] | None
) -> np.ndarray:
    """Whether each perturbed row's op moves the geometry (its manifest row's risk tags, else
    ``risk_tags`` for the op, else the catalog's)."""
    n = len(pert)
    out = np.zeros(n, dtype=bool)
    manifest_row = pert["manifest_row"].to_numpy(np.int64, copy=True)
    if manifest is not None and (manifest_row >= 0).any():
        all_tags = manifest.all_risk_tags()
        for i in np.flatnonzero(manifest_row >= 0):
            row_tags = all_tags[manifest_row[i]]
            if row_tags is not None:
                out[i] = any(g in row_tags for g in GEOMETRIC_TAGS)
                manifest_row[i] = -2  # decided
    rest = np.flatnonzero(manifest_row != -2)
    if rest.size:
        catalog = catalog_risk_tags()

        def op_geometric(op: Any) -> bool:
            tags = (risk_tags or {}).get(op)
            if tags is None:
                tags = catalog.get(op) or ()
            return any(g in tags for g in GEOMETRIC_TAGS)

        out[rest] = map_unique(
            pert["perturbation"].to_numpy(dtype=object)[rest], op_geometric
        ).astype(bool)
    return out


def _tags_at(
    tags: Sequence[str] | None, table: Mapping[str, int], severity: int
) -> tuple[str, ...]:
    return tags_at_severity(tuple(tags or ()), table, severity)


def _add_risk(
    pairs: pd.DataFrame,
    manifest: Manifest | None,
    risk_tags: Mapping[str, Sequence[str]] | None,
    risk_map: Mapping[str, Sequence[str]] | None,
    report: PairReport,
) -> None:
    """Columns ``risk_tags`` (tuple), ``classes_at_risk`` (tuple) and ``at_risk`` (bool).

    Tags come from the pair's manifest row when it has them, else from ``risk_tags`` for the op,
    else from the catalog; ops with no known tags count as label-preserving (noted). The
    catalog's severity-dependent tags (``risk_from_severity``) are added at the pair's severity.
    """
    n = len(pairs)
    tags = np.full(n, None, dtype=object)
    manifest_row = pairs["manifest_row"].to_numpy(np.int64)
    if manifest is not None and (manifest_row >= 0).any():
        hit = np.flatnonzero(manifest_row >= 0)
        tags[hit] = manifest.all_risk_tags()[manifest_row[hit]]
    need = pd.isna(tags)
    unknown_ops: set[str] = set()
    if need.any():
        catalog: dict[str, list[str]] | None = None

        def op_tags(op: Any) -> tuple[str, ...] | None:
            nonlocal catalog
            if risk_tags is not None and op in risk_tags:
                return tuple(risk_tags[op])
            if catalog is None:
                catalog = catalog_risk_tags()
            known = catalog.get(op)
            if known is None:
                unknown_ops.add(str(op))
            return tuple(known) if known is not None else ()

        tags[need] = map_unique(pairs["perturbation"].to_numpy(dtype=object)[need], op_tags)
    _add_severity_tags(pairs, tags, risk_tags)
    classes = pairs["question_class"].to_numpy(dtype=object)
    pairs["risk_tags"] = tags
    pairs["classes_at_risk"], pairs["at_risk"] = _classes_at_risk(tags, classes, risk_map)
    if unknown_ops:
        report.notes.append(
            "no risk tags known for perturbation(s) "
            + ", ".join(sorted(unknown_ops))
            + " (not in the manifest, the catalog or risk_tags): treated as label-preserving"
        )
    no_class = int(np.fromiter((not c for c in classes), dtype=bool, count=n).sum())
    if no_class:
        report.notes.append(
            f"{no_class} pairs have no question_class: label risk cannot be checked"
        )


def _add_severity_tags(
    pairs: pd.DataFrame, tags: np.ndarray, risk_tags: Mapping[str, Sequence[str]] | None
) -> None:
    """Add the severity-dependent tags of catalog ops to ``tags`` in place (unless
    ``risk_tags`` overrides the op)."""
    ops = pairs["perturbation"].to_numpy(dtype=object)
    sevs = pairs["severity"].to_numpy(np.int64)
    for op, table in catalog_severity_risk().items():
        if risk_tags is not None and op in risk_tags:
            continue
        of_op = ops == op
        for sev in range(min(table.values()), 6):
            rows = np.flatnonzero(of_op & (sevs == sev))
            if rows.size:  # once per distinct tag tuple, not per row
                tags[rows] = map_unique(tags[rows], partial(_tags_at, table=table, severity=sev))


def _classes_at_risk(
    tags: np.ndarray, classes: np.ndarray, risk_map: Mapping[str, Sequence[str]] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair: the question classes its tags put at risk (tuple), and whether any is;
    decided once per distinct (tags, classes) combination."""
    tag_code, tag_uniq = pd.factorize(tags)
    class_code, class_uniq = pd.factorize(classes)
    n_classes = max(len(class_uniq), 1)
    combo = tag_code.astype(np.int64) * n_classes + class_code
    combos, inv = np.unique(combo, return_inverse=True)
    at_risk_of_combo = obj_array(
        [
            tuple(classes_at_risk(tag_uniq[k // n_classes], class_uniq[k % n_classes], risk_map))
            for k in combos
        ]
    )
    flag_of_combo = np.fromiter(
        (bool(r) for r in at_risk_of_combo), dtype=bool, count=len(at_risk_of_combo)
    )
    return at_risk_of_combo[inv.reshape(-1)], flag_of_combo[inv.reshape(-1)]


def _floats(df: pd.DataFrame, col: str) -> np.ndarray:
    """Float column ``col`` of ``df`` (NaN when the column is absent)."""
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _manifest_hint(manifest: Manifest | None, pert: pd.DataFrame) -> str:
    """Why perturbed rows may look duplicated: no manifest to tell their perturbation apart."""
    if manifest is not None:
        return ""
    ops = pert["perturbation"].nunique(dropna=True)
    return (
        f" No --manifest was given, so the rows' perturbation/severity come only from the files "
        f"({ops} distinct perturbation value(s)); pass --manifest DIR/manifest.parquet (written by "
        "`perturb generate`) so each row is matched to the output it was predicted on."
    )


def resolve_image(path: str | None, bases: Sequence[Path]) -> Path | None:
    """An existing file for ``path``: as given, or under one of ``bases``."""
    if not isinstance(path, str) or not path:
        return None
    p = Path(path)
    if p.is_absolute():
        return p if p.is_file() else None
    for base in bases:
        q = base / p
        if q.is_file():
            return q
    return p if p.is_file() else None
