"""From a generated split to what inference tools read, and back to the scorer.

``perturb generate`` writes the perturbed images, ``manifest.parquet`` and ``dataset/`` (the QA
rows joined with their outputs, no image bytes). Two ways on from there:

* :func:`load_split` opens the split as a ``datasets.Dataset`` in the source's schema
  (Kvasir-VQA-x1: ``image, img_id, complexity, question, answer, original, question_class``)
  plus ``op, severity, variant`` and ``path``; its ``image`` column decodes from the split's
  files, resolved when loaded, so the folder may be moved or copied as a whole.
* :func:`export_split` writes the clean and the perturbed rows for an inference run
  (:data:`FORMATS`): ``ms-swift`` (the messages + images JSONL upstream feeds ``swift infer``),
  ``jsonl`` and ``parquet`` (one row per question: ``img_id, question, answer, image, op,
  severity, variant`` and the source's other columns), ``hf`` (a ``save_to_disk``
  ``DatasetDict`` with ``clean`` and ``perturbed`` splits, images embedded), ``hub`` (the
  perturbed rows as a Hub dataset repository: :mod:`perturb.export.hub`). Every row carries
  the keys the scorer pairs on (``img_id``, the question, ``perturbation``/``op``, ``severity``,
  ``variant``) and an image path inside the split, so ``perturb score`` pairs the predictions
  without ``--manifest`` (:func:`perturb.score.manifest.discover_manifest`).

The clean images are not in the split folder: they come from the source dataset
(``dataset=``, the same argument ``perturb generate`` took; ``builtin_images=`` for the built-in
phantoms) and are written once per image into ``OUT/clean/``. The export folder lies outside
the split folder (``perturb verify`` counts anything else there as an extra).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perturb.contracts.manifest import PERTURBATION_COLUMNS
from perturb.errors import InputError

FORMATS = ("ms-swift", "jsonl", "parquet", "hf", "hub")
# what upstream's Kvasir-VQA-x1 dataset holds, in its order (others follow as the source has them)
UPSTREAM_COLUMNS = (
    "image",
    "img_id",
    "complexity",
    "question",
    "answer",
    "original",
    "question_class",
)
SPLIT_COLUMNS = ("op", "severity", "variant")
# the reference answer: free text (Kvasir, VinDr) or an option letter (ReXVQA, MedThinkVQA)
ANSWER_COLUMNS = ("answer", "correct_answer")
CLEAN_DIR = "clean"
CONTROL_PREFIX = "control_"  # the controls' perturbation names (perturb predict --controls)
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "TIFF": "tif", "BMP": "bmp", "WEBP": "webp"}

__all__ = [
    "FORMATS",
    "ExportResult",
    "SplitRow",
    "export_split",
    "load_split",
    "split_rows",
]


def _dataset_dir(root: Path) -> Path:
    if (root / "dataset" / "state.json").exists():
        return root / "dataset"
    if (root / "state.json").exists() and (root.parent / "manifest.parquet").exists():
        return root
    raise InputError(
        f"{root}: not a `perturb generate` output (no dataset/ folder beside manifest.parquet); "
        "pass the folder given to --out"
    )


def _column_names(columns: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(perturbation field -> its dataset column, the source's own columns in order)."""
    cols = list(columns)
    mine = {n: (f"perturb_{n}" if f"perturb_{n}" in cols else n) for n in PERTURBATION_COLUMNS}
    own = [c for c in cols if c not in set(mine.values())]
    return mine, own


def load_split(path: str | os.PathLike[str]) -> Any:
    """A ``perturb generate`` output as a ``datasets.Dataset``: the source's columns in its
    order (``image`` first), then ``op``, ``severity``, ``variant`` and ``path`` (the output
    relative to the folder). ``image`` decodes to a PIL image from the folder's files (or from
    ``dataset/images`` of an ``--embed-images`` run), wherever the folder now lies.

    >>> ds = perturb.load_split("runs/track2")      # doctest: +SKIP
    >>> ds[0]["image"], ds[0]["variant"]            # doctest: +SKIP
    """
    from perturb.generate.dataset import load_generated

    root = Path(path)
    dataset_dir = _dataset_dir(root)
    ds = load_generated(dataset_dir)
    mine, own = _column_names(c for c in ds.column_names if c != "image")
    keep = ["image", *own, *(mine[n] for n in (*SPLIT_COLUMNS, "path"))]
    rename = {mine[n]: n for n in (*SPLIT_COLUMNS, "path") if mine[n] != n}
    if _has_transform(ds):  # embedded images: the transform reads the columns it was built on
        return ds
    out = ds.select_columns(keep)
    return out.rename_columns(rename) if rename else out


def _has_transform(ds: Any) -> bool:
    return ds.format.get("format_kwargs", {}).get("transform") is not None


@dataclass(frozen=True)
class SplitRow:
    """One question on one image: the source row's fields, the image file (absolute), and the
    perturbation it shows (``op`` None: the clean image)."""

    img_id: str
    question: str
    answer: Any
    image: Path | None  # None: a question asked with no image (the no-image control)
    op: str | None
    severity: int
    variant: int
    fields: Mapping[str, Any]

    @property
    def role(self) -> str:
        if self.op is None:
            return "clean"
        return "controls" if self.op.startswith(CONTROL_PREFIX) else "perturbed"


def _open_source(
    dataset: str | os.PathLike[str] | None,
    split: str | None,
    builtin_images: int | None,
    builtin_modality: str,
) -> Any:
    from perturb.datasets import open_input

    if dataset is None and builtin_images is None:
        return None
    return open_input(
        None if dataset is None else os.fspath(dataset),
        split,
        builtin_images=builtin_images,
        builtin_modality=builtin_modality,
    )


def _write_clean_images(
    source: Any, wanted: Mapping[str, str], folder: Path
) -> tuple[dict[str, Path], list[str]]:
    """Write each wanted image's bytes (as the source stores them) to ``folder/<stem>.<ext>``;
    (img_id -> file, img_ids the source lacks)."""
    from PIL import Image

    first_row: dict[str, int] = {}
    for i, img_id in enumerate(source.row_ids()):
        if img_id is not None and img_id in wanted and img_id not in first_row:
            first_row[img_id] = i
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for img_id, stem in wanted.items():
        row = first_row.get(img_id)
        if row is None:
            continue
        data = source.image_bytes(row)
        with Image.open(io.BytesIO(data)) as im:
            ext = EXTENSIONS.get(str(im.format), "png")
            if str(im.format) not in EXTENSIONS:  # an unusual container: store it as PNG
                buf = io.BytesIO()
                im.save(buf, format="PNG")
                data = buf.getvalue()
        target = folder / f"{stem}.{ext}"
        if not (target.is_file() and target.read_bytes() == data):
            tmp = target.with_name(f".{target.name}.part")
            tmp.write_bytes(data)
            tmp.replace(target)
        files[img_id] = target.resolve()
    return files, sorted(set(wanted) - set(files))


def split_rows(
    split_dir: str | os.PathLike[str],
    clean_dir: str | os.PathLike[str] | None = None,
    *,
    dataset: str | os.PathLike[str] | None = None,
    dataset_split: str | None = None,
    builtin_images: int | None = None,
    builtin_modality: str = "endoscopy",
) -> tuple[list[SplitRow], list[str]]:
    """Every (image, question) of a generated split: the perturbed rows from its ``dataset/``,
    and, when the source is given (``dataset`` or ``builtin_images``) and ``clean_dir`` names
    where to put the clean images, one clean row per source question of each image. Returns
    the rows (clean first) and notes for the user."""
    import datasets

    root = Path(split_dir).resolve()
    dataset_dir = _dataset_dir(root)
    base = dataset_dir.parent
    qa = datasets.load_from_disk(str(dataset_dir))
    mine, own = _column_names(qa.column_names)
    q_col = "question" if "question" in own else None
    if q_col is None:
        raise InputError(
            f"{dataset_dir}: the split's rows have no 'question' column (it was made from "
            "images without questions, e.g. an image folder); the prompt formats ms-swift, "
            "jsonl, parquet and hf need a question per row. Use --format hub for the images "
            "alone, perturb.load_split(DIR) to read them, or generate from a VQA dataset"
        )
    a_col = next((c for c in ANSWER_COLUMNS if c in own), None)
    id_col = "img_id" if "img_id" in own else None
    perturbed: list[SplitRow] = []
    first_path: dict[str, str] = {}
    clean_fields: list[dict[str, Any]] = []
    for rec in qa.to_list():
        img_id = str(rec[id_col]) if id_col else str(rec[mine["path"]])
        rel = str(rec[mine["path"]])
        own_fields = {c: rec[c] for c in own}
        perturbed.append(
            SplitRow(
                img_id=img_id,
                question=str(rec[q_col]),
                answer=rec[a_col] if a_col else None,
                image=base / rel,
                op=str(rec[mine["op"]]),
                severity=int(rec[mine["severity"]] or 0),
                variant=int(rec[mine["variant"]] or 0),
                fields=own_fields,
            )
        )
        if first_path.setdefault(img_id, rel) == rel:  # the source's rows, once per image
            clean_fields.append(own_fields)
    notes: list[str] = []
    source = _open_source(dataset, dataset_split, builtin_images, builtin_modality)
    if source is None or clean_dir is None:
        notes.append(
            "no clean rows: the clean images come from the source dataset; pass --dataset "
            "(as given to `perturb generate`) or --builtin-images N"
        )
        return perturbed, notes
    manifest = _manifest_stems(root)
    wanted = {i: manifest.get(i) or _stem(i) for i in first_path}
    files, missing = _write_clean_images(source, wanted, Path(clean_dir))
    if missing:
        notes.append(
            f"{len(missing)} image(s) of the split are not in {source.source} (no clean rows): "
            + ", ".join(missing[:5])
        )
    clean = [
        SplitRow(
            img_id=str(f[id_col]) if id_col else "",
            question=str(f[q_col]),
            answer=f[a_col] if a_col else None,
            image=files[str(f[id_col])],
            op=None,
            severity=0,
            variant=0,
            fields=f,
        )
        for f in clean_fields
        if id_col and str(f[id_col]) in files
    ]
    return clean + perturbed, notes


def _manifest_stems(root: Path) -> dict[str, str]:
    """img_id -> the file stem ``perturb generate`` gave its outputs (``file_id``)."""
    import pyarrow.parquet as pq

    table = pq.read_table(root / "manifest.parquet")
    if "file_id" not in table.column_names:
        return {}
    return dict(
        zip(
            table.column("img_id").to_pylist(),
            table.column("file_id").to_pylist(),
            strict=True,
        )
    )


def _stem(img_id: str) -> str:
    from perturb.generate.naming import safe_stem

    return safe_stem(img_id)


def prompt_of(row: SplitRow) -> str:
    """The question as sent to a model: with its options, one per line, for an MCQ."""
    options = row.fields.get("options")
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError:
            options = None
    if isinstance(options, Mapping) and options:
        lines = "\n".join(f"{k}. {v}" for k, v in options.items() if v is not None)
        return f"{row.question}\n{lines}"
    return row.question


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def key_fields(row: SplitRow) -> dict[str, Any]:
    """The fields the scorer pairs and groups on (``perturbation`` absent on clean rows)."""
    keys: dict[str, Any] = {"img_id": row.img_id}
    if row.op is not None:
        keys.update(perturbation=row.op, severity=row.severity, variant=row.variant)
    for name in ("complexity", "question_class", "options", "question_id", "task_name"):
        if row.fields.get(name) is not None:
            keys[name] = _jsonable(row.fields[name])
    return keys


def table_row(row: SplitRow, image: str) -> dict[str, Any]:
    """A plain-table row: img_id, question, answer, image, op, severity, variant (null on clean
    rows), then the source's other columns."""
    out: dict[str, Any] = {
        "img_id": row.img_id,
        "question": row.question,
        "answer": _jsonable(row.answer),
        "image": image,
        # null on clean rows: a clean variant 0 would ask the scorer to pair by variant
        "op": row.op,
        "severity": None if row.op is None else row.severity,
        "variant": None if row.op is None else row.variant,
    }
    for k, v in row.fields.items():
        if k not in out and k != "image":
            out[k] = _jsonable(v)
    return out


def swift_row(row: SplitRow, image: str) -> dict[str, Any]:
    """An ms-swift row as upstream's ``swift infer`` reads it (messages + images), with the
    scorer's keys beside."""
    answer = "" if row.answer is None else str(row.answer)
    return {
        "messages": [
            {"role": "user", "content": f"<image>{prompt_of(row)}"},
            {"role": "assistant", "content": answer},
        ],
        "images": [image],
        **key_fields(row),
    }


@dataclass
class ExportResult:
    """What :func:`export_split` wrote."""

    out: Path
    format: str
    files: dict[str, Path] = field(default_factory=dict)  # role -> file or folder
    rows: dict[str, int] = field(default_factory=dict)  # role -> rows
    clean_images: int = 0
    notes: list[str] = field(default_factory=list)


def default_out(split_dir: Path, fmt: str) -> Path:
    """``<DIR>-<format>`` beside the split folder."""
    return split_dir.parent / f"{split_dir.name}-{fmt}"


def export_split(
    split_dir: str | os.PathLike[str],
    fmt: str,
    out: str | os.PathLike[str] | None = None,
    *,
    dataset: str | os.PathLike[str] | None = None,
    dataset_split: str | None = None,
    builtin_images: int | None = None,
    builtin_modality: str = "endoscopy",
    absolute_paths: bool | None = None,
    license_id: str | None = None,
    attribution: str | None = None,
) -> ExportResult:
    """Write a generated split for an inference run (see the module docstring): ``clean`` and
    ``perturbed`` files (or ``hf/`` with both splits) and the clean images under ``OUT``.
    Image paths are absolute for ``ms-swift`` (``swift infer`` opens them from its working
    folder) and relative to ``OUT`` otherwise, unless ``absolute_paths`` says."""
    if fmt not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = Path(split_dir).resolve()
    target = (Path(out) if out is not None else default_out(root, fmt)).resolve()
    if target == root or root in target.parents:
        raise InputError(
            f"{target}: inside the split folder {root}; `perturb verify` would count the export "
            "as extra files. Choose a folder outside it (default: <DIR>-<format>)."
        )
    from perturb.io.datasets import scratch_cache
    from perturb.io.images import undone_on_failure

    with undone_on_failure(target), scratch_cache():
        return _export_into(
            root, target, fmt, dataset, dataset_split, builtin_images, builtin_modality,
            absolute_paths, license_id, attribution,
        )  # fmt: skip


def _export_into(
    root: Path,
    target: Path,
    fmt: str,
    dataset: str | os.PathLike[str] | None,
    dataset_split: str | None,
    builtin_images: int | None,
    builtin_modality: str,
    absolute_paths: bool | None,
    license_id: str | None,
    attribution: str | None,
) -> ExportResult:
    """:func:`export_split` once the folders are checked: write into ``target``."""
    if fmt == "hub":  # the perturbed outputs as the Hub reads a dataset repository
        from perturb.datasets import BUILTIN_SOURCE
        from perturb.export.hub import export_hub

        source = BUILTIN_SOURCE if builtin_images is not None else (
            None if dataset is None else os.fspath(dataset)
        )  # fmt: skip
        written, n_rows = export_hub(
            root,
            target,
            load_split(root),
            source=source,
            license_id=license_id,
            attribution=attribution,
        )
        hub = ExportResult(out=target, format=fmt, files=dict(written))
        hub.rows["perturbed"] = n_rows
        return hub
    rows, notes = split_rows(
        root,
        target / CLEAN_DIR,
        dataset=dataset,
        dataset_split=dataset_split,
        builtin_images=builtin_images,
        builtin_modality=builtin_modality,
    )
    absolute = fmt == "ms-swift" if absolute_paths is None else absolute_paths

    def where(p: Path | None) -> str:
        if p is None:
            return ""
        return str(p) if absolute else os.path.relpath(p, target).replace(os.sep, "/")

    result = ExportResult(out=target, format=fmt, notes=notes)
    by_role: dict[str, list[SplitRow]] = {"clean": [], "perturbed": []}
    for r in rows:
        by_role[r.role].append(r)
    result.clean_images = len({r.img_id for r in by_role["clean"]})
    if fmt == "hf":
        result.files["hf"] = _write_hf(by_role, target / "hf")
    for role, items in by_role.items():
        result.rows[role] = len(items)
        if fmt == "hf" or not items:
            continue
        if fmt == "ms-swift":
            path = target / f"{role}.jsonl"
            _write_jsonl(path, (swift_row(r, where(r.image)) for r in items))
        elif fmt == "jsonl":
            path = target / f"{role}.jsonl"
            _write_jsonl(path, (table_row(r, where(r.image)) for r in items))
        else:
            path = target / f"{role}.parquet"
            _write_parquet(path, [table_row(r, where(r.image)) for r in items])
        result.files[role] = path
    return result


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.part")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _json_cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nested cells (options dicts) as JSON strings: parquet columns need one type."""
    return [{k: json.dumps(v) if isinstance(v, Mapping) else v for k, v in r.items()} for r in rows]


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.part")
    pq.write_table(pa.Table.from_pylist(_json_cells(rows)), tmp)
    tmp.replace(path)


def _write_hf(by_role: Mapping[str, list[SplitRow]], folder: Path) -> Path:
    """A ``DatasetDict`` (clean, perturbed) with the images embedded (``save_to_disk``)."""
    import datasets

    splits = {}
    for role, items in by_role.items():
        if not items:
            continue
        table = _json_cells([table_row(r, str(r.image)) for r in items])
        ds = datasets.Dataset.from_list(table).cast_column("image", datasets.Image())
        splits[role] = ds
    dd = datasets.DatasetDict(splits)
    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        dd.save_to_disk(str(folder))
    finally:
        if was_enabled:
            datasets.utils.logging.enable_progress_bar()
    return folder
