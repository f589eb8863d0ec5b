"""Read and canonicalise every prediction source of a run (the first stages of the chain):
per model its clean table and its perturbed tables, what reading found, the manifest of the
perturbed split (given, or found beside the perturbed images) and the ``--dataset`` join."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd

from perturb.errors import InputError
from perturb.score.canonical import canonicalize
from perturb.score.manifest import DISCOVERY_SAMPLE, Manifest, discover_manifest, load_manifest
from perturb.score.options import PerturbedArg, ScoreOptions
from perturb.score.read import PredictionSource, ReadReport, read_table

if TYPE_CHECKING:  # pragma: no cover
    from perturb.score.dataset_join import DatasetInfo

DEFAULT_MODEL = "model"


def read_predictions(
    source: PredictionSource, label: str | None = None, model: str | None = None
) -> tuple[pd.DataFrame, ReadReport]:
    """Read predictions from a path, DataFrame or list of dicts into the canonical table."""
    table = read_table(source, label)
    return canonicalize(table, model=model), table.report


class CleanTable(NamedTuple):
    """One model's clean rows (canonical) and how they were read."""

    rows: pd.DataFrame
    report: ReadReport


class PerturbedTable(NamedTuple):
    """One model's rows of one perturbed source (canonical), how they were read, its run name."""

    rows: pd.DataFrame
    report: ReadReport
    run: str


@dataclass
class RunInputs:
    """The prediction files as read, per model, what reading them found, and what else the
    run reads: the manifest of the perturbed split and the evaluated dataset."""

    clean: dict[str, CleanTable] = field(default_factory=dict)
    perturbed: dict[str, list[PerturbedTable]] = field(default_factory=dict)
    read_reports: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # scores.json "inputs"
    bases: list[Path] = field(default_factory=list)  # folders to find images under
    problems: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # every model, sorted
    manifest: Manifest | None = None
    dataset_info: DatasetInfo | None = None  # with --dataset
    dataset_join: dict[str, Any] | None = None  # scores.json "dataset": the join counts
    manifest_warning: str | None = None  # why no manifest was found, when that looks wrong

    def note_read(self, rep: ReadReport, role: str, model: str, src: PredictionSource) -> None:
        """Record one read file: its report, its identity (sha256) and its folder."""
        d = rep.to_dict()
        d.update(role=role, model=model)
        self.read_reports.append(d)
        self.inputs.append(
            {
                "role": role,
                "model": model,
                "source": rep.source,
                "format": rep.format,
                "sha256": _sha256(src),
            }
        )
        if isinstance(src, (str, Path)):
            p = Path(src)
            self.bases.append(p if p.is_dir() else p.parent)
        if rep.dropped:
            self.problems.append(
                f"{rep.source}: {sum(rep.dropped.values())} rows dropped while reading "
                + ", ".join(f"{k}={v}" for k, v in sorted(rep.dropped.items()))
            )

    def model_names(self) -> list[str]:
        """Every model, sorted; InputError when a model has only one side."""
        lonely = sorted(set(self.clean) ^ set(self.perturbed))
        if lonely:
            raise InputError(
                f"model(s) {lonely} (from the files' 'model' column) have only clean or only perturbed rows"
            )
        return sorted(set(self.clean) | set(self.perturbed))


def read_inputs(options: ScoreOptions) -> RunInputs:
    """Every source of the run read and canonicalised, with the manifest and the dataset
    join; InputError for sources that cannot be scored together."""
    clean_by_model, perturbed_by_model = _as_model_map(options.clean, options.perturbed)
    manifest = load_manifest(options.manifest) if options.manifest is not None else None
    inputs = _read_inputs(clean_by_model, perturbed_by_model, named=options.named_models)
    inputs.manifest = _found_manifest(inputs) if manifest is None else manifest
    _join_dataset(inputs, options.dataset, options.dataset_split)
    inputs.models = inputs.model_names()
    if inputs.manifest is not None and inputs.manifest.root is not None:
        inputs.bases.append(inputs.manifest.root)
    inputs.bases.append(Path.cwd())
    return inputs


def _as_model_map(
    clean: PredictionSource | Mapping[str, PredictionSource],
    perturbed: PerturbedArg | Mapping[str, PerturbedArg],
) -> tuple[dict[str, PredictionSource], dict[str, list[PredictionSource]]]:
    if isinstance(clean, Mapping):
        cmap = dict(clean)
        if not isinstance(perturbed, Mapping):
            raise InputError("clean is given per model (a mapping): give perturbed per model too")
        pmap = {k: _as_list(v) for k, v in perturbed.items()}
    else:
        cmap = {DEFAULT_MODEL: clean}
        if isinstance(perturbed, Mapping):
            if len(perturbed) != 1:
                raise InputError(
                    "perturbed is given per model but clean is not: give clean per model too"
                )
            pmap = {DEFAULT_MODEL: _as_list(next(iter(perturbed.values())))}
        else:
            pmap = {DEFAULT_MODEL: _as_list(perturbed)}
    missing = sorted(set(cmap) ^ set(pmap))
    if missing:
        raise InputError(
            f"model(s) {missing} have clean predictions but no perturbed ones or the other way round; "
            "give every model both --clean NAME=P and --perturbed NAME=P"
        )
    for k, v in pmap.items():
        if not v:
            raise InputError(f"model {k!r}: no perturbed predictions given (--perturbed)")
    return cmap, pmap


def _as_list(v: PerturbedArg) -> list[PredictionSource]:
    if isinstance(v, (str, Path, pd.DataFrame)):
        return [v]
    if isinstance(v, Sequence) and v and all(isinstance(x, Mapping) for x in v):
        return [v]  # one list of records
    return list(v)


def _split_by_model(df: pd.DataFrame, model: str, named: bool) -> dict[str, pd.DataFrame]:
    """Rows of a file that carries a 'model' column, per model (unless the model was named)."""
    if named or df["model"].isna().all():
        return {model: df}
    vals = df["model"].fillna(model)
    return {str(k): g.reset_index(drop=True) for k, g in df.groupby(vals, sort=True)}


def _label(src: PredictionSource, default: str) -> str:
    return str(src) if isinstance(src, (str, Path)) else default


def _run_name(src: PredictionSource, default: str) -> str:
    if isinstance(src, (str, Path)):
        p = Path(src)
        return p.name if p.is_dir() else p.stem
    return default


def _sha256(src: PredictionSource) -> str | None:
    if not isinstance(src, (str, Path)):
        return None
    p = Path(src)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with p.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _unresolved_paths_warning(inputs: RunInputs, bases: list[Path]) -> str | None:
    """A warning when the perturbed rows name images by relative paths that exist under none
    of ``bases`` (an export's paths start at the export folder; predictions written elsewhere
    lose them): no manifest then, so coverage and the suite go unchecked."""
    sample = [
        p
        for tables in inputs.perturbed.values()
        for table in tables
        for p in table.rows["image_path"].tolist()[:DISCOVERY_SAMPLE]
        if isinstance(p, str) and p.strip()
    ]
    climbing = [p.replace("\\", "/") for p in sample if p.replace("\\", "/").startswith("../")]
    lost = [p for p in climbing if not any(os.path.exists(b / p) for b in bases)]
    if not lost:  # upstream's own relative layouts and URLs never climb out: no manifest to find
        return None
    where = ", ".join(str(b) for b in dict.fromkeys(bases))
    return (
        f"no manifest: the perturbed rows' relative image paths (e.g. {lost[0]}) exist under "
        f"none of {where}, so no generated split was found and coverage and the suite are not "
        "checked; pass --manifest DIR/manifest.parquet, or keep the predictions in the export "
        "folder (its paths start there)"
    )


def _found_manifest(inputs: RunInputs) -> Manifest | None:
    """The manifest of the generated split the perturbed images lie in (no --manifest given),
    recorded in scores.json "inputs"; None when their paths lead to none."""
    paths = (
        p
        for tables in inputs.perturbed.values()
        for table in tables
        for p in table.rows["image_path"].tolist()
    )
    bases = [*inputs.bases, Path.cwd()]
    found = discover_manifest(paths, bases)
    if found is None:
        inputs.manifest_warning = _unresolved_paths_warning(inputs, bases)
        return None
    inputs.inputs.append(
        {
            "role": "manifest",
            "model": None,
            "source": str(found),
            "format": "parquet (found beside the perturbed images)",
            "sha256": _sha256(found),
        }
    )
    manifest = load_manifest(found)
    manifest.given = False
    return manifest


def _read_inputs(
    clean_by_model: Mapping[str, PredictionSource],
    perturbed_by_model: Mapping[str, list[PredictionSource]],
    named: bool,
) -> RunInputs:
    """Read every prediction file, split by the 'model' column unless the model was named."""
    inputs = RunInputs()
    for model, src in clean_by_model.items():
        df, rep = read_predictions(src, label=_label(src, f"clean[{model}]"))
        parts = _split_by_model(df, model, named)
        # the models as the report names them (a file's 'model' column over the default name)
        inputs.note_read(rep, "clean", ", ".join(parts) or model, src)
        for mname, part in parts.items():
            if mname in inputs.clean:
                raise InputError(f"model {mname!r} has clean predictions in two inputs")
            inputs.clean[mname] = CleanTable(part, rep)
    for model, srcs in perturbed_by_model.items():
        for j, src in enumerate(srcs):
            label = _label(src, f"perturbed[{model}][{j}]")
            df, rep = read_predictions(src, label=label)
            parts = _split_by_model(df, model, named)
            inputs.note_read(rep, "perturbed", ", ".join(parts) or model, src)
            run = _run_name(src, f"perturbed{j + 1}" if len(srcs) > 1 else "perturbed")
            for mname, part in parts.items():
                inputs.perturbed.setdefault(mname, []).append(PerturbedTable(part, rep, run))
    return inputs


def _join_dataset(inputs: RunInputs, dataset: str | Path | None, dataset_split: str | None) -> None:
    """With ``--dataset``: fill the tables' missing fields from it (in place); note its info
    and the join counts for scores.json."""
    if dataset is None:
        return
    from perturb.score.dataset_join import join_dataset, load_dataset_info

    info = load_dataset_info(str(dataset), dataset_split)
    totals: Counter[str] = Counter()
    for mname, clean in list(inputs.clean.items()):
        clean_rows, joined = join_dataset(clean.rows, info)
        inputs.clean[mname] = clean._replace(rows=clean_rows)
        totals.update(joined)
    for mname, tables in inputs.perturbed.items():
        new = []
        for table in tables:
            pert_rows, joined = join_dataset(table.rows, info)
            new.append(table._replace(rows=pert_rows))
            totals.update(joined)
        inputs.perturbed[mname] = new
    inputs.dataset_info = info
    inputs.dataset_join = {"source": info.source, "split": dataset_split, **dict(totals)}
