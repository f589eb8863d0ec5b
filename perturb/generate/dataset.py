"""DIR/dataset: the perturbed QA rows as a Hugging Face dataset (``datasets.load_from_disk``).

One row per (QA row of the input, output of its image), with the input's columns and the
perturbation's (op, severity, variant, key, params, path, sha256, ...). The images are not
copied into the rows: an image with 30 questions is still stored once.

* default: ``path`` (``perturb_path`` when the input has a column of that name) is the output's
  file relative to DIR, so DIR can move or be copied as a whole;
* ``--embed-images``: also ``dataset/images/``, a second ``save_to_disk`` dataset with one row
  per output (``path``, ``image`` as an HF Image with the encoded bytes), so ``dataset/`` alone
  is self-contained.

``load_generated(DIR)`` gives the QA rows with an ``image`` column that decodes to PIL images
(from DIR's files, else from ``dataset/images/``)::

    from perturb.generate import load_generated
    ds = load_generated("runs/track2")         # or "runs/track2/dataset"
    ds[0]["image"]                             # PIL.Image.Image

Without perturb: ``ds = datasets.load_from_disk("runs/track2/dataset")``, then
``PIL.Image.open("runs/track2/" + ds[0]["path"])``.

No column of the saved QA table is an ``Image`` feature: ``Dataset.save_to_disk`` (datasets 3+)
copies the bytes of every Image path into the table, once per row.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from perturb.contracts.manifest import PERTURBATION_COLUMNS

STATE_DIR = ".perturb"
IMAGES = "images"  # dataset/images: the embedded outputs, one row each


def perturbation_columns(input_columns: list[str]) -> dict[str, str]:
    """Manifest column -> dataset column (prefixed ``perturb_`` where the input has the name)."""
    return {
        n: (f"perturb_{n}" if n in input_columns or n == "image" else n)
        for n in PERTURBATION_COLUMNS
    }


def path_column(column_names: list[str]) -> str:
    """The dataset column holding each output's path relative to DIR."""
    return "perturb_path" if "perturb_path" in column_names else "path"


def qa_dataset(inp: Any, manifest: pa.Table) -> Any:
    """The QA rows joined with the outputs of their image (no image bytes)."""
    import datasets

    table = inp.table_without_image()
    rows_of: dict[str, list[int]] = {}
    for i, img_id in enumerate(inp.row_ids()):
        if img_id is not None:
            rows_of.setdefault(img_id, []).append(i)
    take: list[int] = []
    out_idx: list[int] = []
    for m, img_id in enumerate(manifest.column("img_id").to_pylist()):
        for r in rows_of.get(img_id, []):
            take.append(r)
            out_idx.append(m)
    joined = table.take(pa.array(take, type=pa.int64()))
    names = perturbation_columns(list(table.column_names))
    picked = manifest.take(pa.array(out_idx, type=pa.int64()))
    features = dict(inp.features_without_image())
    if getattr(inp, "annotations", None) is not None:
        from perturb.generate.annotate import move_annotations

        joined, added = move_annotations(joined, picked, inp.annotations)
        features.update(added)
    arrays = list(joined.columns)
    fields = list(joined.column_names)
    if "img_id" not in fields:  # ids derived from the image paths (a folder): say which image
        arrays.insert(0, picked.column("img_id"))
        fields.insert(0, "img_id")
        features = {"img_id": datasets.Value("string"), **features}
    for src, dst in names.items():
        col = picked.column(src)
        arrays.append(col)
        fields.append(dst)
        features[dst] = (
            datasets.Value("int64") if pa.types.is_integer(col.type) else datasets.Value("string")
        )
    feats = datasets.Features(features)
    result = pa.Table.from_arrays(arrays, names=fields).cast(feats.arrow_schema)
    return datasets.Dataset(
        datasets.table.InMemoryTable(result), info=datasets.DatasetInfo(features=feats)
    )


def images_dataset(paths: list[str], read: Any) -> Any:
    """One row per output: ``path`` (relative to DIR) and ``image`` (HF Image, the bytes)."""
    import datasets

    feats = datasets.Features({"path": datasets.Value("string"), "image": datasets.Image()})
    image = pa.StructArray.from_arrays(
        [
            pa.array([read(p) for p in paths], type=pa.binary()),
            pa.array(paths, type=pa.string()),
        ],
        names=["bytes", "path"],
    )
    table = pa.Table.from_arrays(
        [pa.array(paths, type=pa.string()), image], names=["path", "image"]
    )
    return datasets.Dataset(
        datasets.table.InMemoryTable(table.cast(feats.arrow_schema)),
        info=datasets.DatasetInfo(features=feats),
    )


def build_dataset(
    out: Path,
    inp: Any,
    manifest: pa.Table,
    embed: bool,
    read: Any = None,
    fault: Callable[[str, int | str], None] | None = None,
) -> int:
    """Write DIR/dataset (and dataset/images with ``embed``); ``read(rel) -> bytes`` reads an
    output (default: DIR's file). Returns the number of QA rows."""
    images = None
    if embed:
        reader = read or (lambda rel: (out / rel).read_bytes())
        images = images_dataset(manifest.column("path").to_pylist(), reader)
    return save_dataset(out, qa_dataset(inp, manifest), images, fault)


def _save(ds: Any, folder: Path) -> None:
    import datasets

    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        # one shard even when empty: a 0-row dataset saved with no data file cannot be loaded
        ds.save_to_disk(str(folder), num_shards=1 if len(ds) == 0 else None)
    finally:
        if was_enabled:
            datasets.utils.logging.enable_progress_bar()


def save_dataset(
    out: Path, ds: Any, images: Any = None, fault: Callable[[str, int | str], None] | None = None
) -> int:
    """Write ``ds`` (and ``images`` into its ``images/``) as DIR/dataset, replacing the old one
    only once the new one is complete (``fault("dataset", 0)``, a test hook, runs just before
    the swap)."""
    state = out / STATE_DIR
    tmp, old, final = state / "dataset.tmp", state / "dataset.old", out / "dataset"
    shutil.rmtree(tmp, ignore_errors=True)
    _save(ds, tmp)
    if images is not None:
        _save(images, tmp / IMAGES)
    if fault is not None:
        fault("dataset", 0)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return len(ds)


def load_images(dataset_dir: Path) -> Any:
    """dataset/images of an ``--embed-images`` run, or None."""
    import datasets

    folder = dataset_dir / IMAGES
    return datasets.load_from_disk(str(folder)) if (folder / "state.json").exists() else None


def load_generated(path: str | os.PathLike[str]) -> Any:
    """The QA rows of a ``perturb generate`` output with an ``image`` column of PIL images.

    ``path`` is DIR or DIR/dataset. Images come from DIR's files when they are all there (an
    HF ``Image`` column of their paths, decoded on access), else from ``dataset/images``
    (``--embed-images``; attached on access with ``with_transform``)."""
    import datasets

    root = Path(path)
    dataset_dir = root / "dataset" if (root / "dataset" / "state.json").exists() else root
    base = dataset_dir.parent
    ds = datasets.load_from_disk(str(dataset_dir))
    col = path_column(list(ds.column_names))
    rels = ds[col]
    if not rels:  # a run with no outputs: an empty image column (add_column cannot type it)
        features = datasets.Features({**ds.features, "image": datasets.Image()})
        return datasets.Dataset.from_dict({name: [] for name in features}, features=features)
    if all((base / r).is_file() for r in set(rels)):
        files = [str(base / r) for r in rels]
        return ds.add_column("image", files).cast_column("image", datasets.Image())
    images = load_images(dataset_dir)
    if images is None:
        missing = next(r for r in rels if not (base / r).is_file())
        raise FileNotFoundError(
            f"{base / missing}: image file not found and {dataset_dir} has no embedded images; "
            "pass the output folder itself (with its image files), or re-run with --embed-images"
        )
    cells = images.cast_column("image", datasets.Image(decode=False))["image"]
    blobs = {p: cell["bytes"] for p, cell in zip(images["path"], cells, strict=True)}

    def attach(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        from PIL import Image

        batch["image"] = [Image.open(io.BytesIO(blobs[p])) for p in batch[col]]
        return batch

    return ds.with_transform(attach)
