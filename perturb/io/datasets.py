"""Input tables through Hugging Face ``datasets``, whatever the dataset (the datasets' own
knowledge, and the built-in phantoms, live in ``perturb.datasets``).

``open_input(source, split)`` accepts

* a hub id such as ``SimulaMet/Kvasir-VQA-x1`` (``datasets.load_dataset``);
* a ``save_to_disk`` folder (a Dataset or a DatasetDict);
* a parquet / JSON Lines / CSV file, with an image column (HF Image struct or raw bytes) or a
  column of image paths (relative to the file's folder);
* a folder: parquet/JSONL files (e.g. a local copy of a hub repo) or images (``imagefolder``).

Images are never decoded here: the image column is read as encoded bytes (``Image(decode=
False)``) and decoded later by ``perturb.io.images.decode_image``, with its checks (pixel limit,
8/16-bit, alpha, CMYK). QA rows are many per image: ``InputDataset.images()`` groups rows by
img_id, keeping the first row's image.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from perturb.errors import InputError

ID_COLUMN = "img_id"
PATH_COLUMNS = ("image_path", "path", "file_name", "filename", "file", "image_file")
TABLE_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
DEFAULT_SPLIT = "test"
ID_SOURCES = ("stem", "path")
DEFAULT_MAX_FILE_BYTES = 512 * 1024 * 1024


class DatasetError(InputError):
    """An input that cannot be opened; the message says why and what to pass instead."""


class ImageFetchError(InputError):
    """One row's image cannot be read (missing file, empty cell)."""


@dataclass(frozen=True)
class Annotations:
    """Columns whose ``<loc_x1_y1_x2_y2>`` tags follow the image through geometric ops, and the
    optional columns giving the original size the boxes are in (default: the image's size)."""

    text_columns: tuple[str, ...]
    width_column: str | None = None
    height_column: str | None = None
    min_visible: float = 0.5


@dataclass
class ImageGroup:
    """One unique image: its id, the input rows that share it, and where its bytes are."""

    img_id: str
    rows: list[int]


@dataclass
class InputDataset:
    """An opened input: rows, the image column, ids, and where relative image paths start."""

    ds: datasets.Dataset
    image_column: str
    id_column: str | None
    source: str
    fingerprint: str
    base_dir: Path | None = None
    sample_key_column: str | None = None  # rows of one sample (study, case) share parameters
    modality_column: str | None = None  # per-image modality (``modality: from_image`` suites)
    annotations: Annotations | None = None  # loc-tag columns moved with geometric ops
    id_from: str = "stem"  # without an img_id column: the image path's stem, or its whole path
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    _ids: list[str | None] | None = field(default=None, repr=False)
    _images: datasets.Dataset | None = field(default=None, repr=False)
    _columns: dict[str, list[Any]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ds)

    @property
    def columns(self) -> list[str]:
        return list(self.ds.column_names)

    def row_ids(self) -> list[str | None]:
        """img_id of every row (None where the id cell is empty)."""
        if self._ids is None:
            if self.id_column is not None:
                self._ids = [
                    None if v is None or str(v) == "" else str(v) for v in self.ds[self.id_column]
                ]
            else:
                self._ids = self._derived_ids()
        return self._ids

    def _cell_path(self, row: int) -> str | None:
        value = self._cell(row)
        path = (
            value.get("path")
            if isinstance(value, dict)
            else value
            if isinstance(value, str)
            else None
        )
        return str(path) if path else None

    def _relative(self, path: str) -> str:
        """``path`` relative to the dataset's folder (posix, normalised), else as given."""
        p = Path(os.path.normpath(path))
        if self.base_dir is not None and p.is_absolute():
            with contextlib.suppress(ValueError):
                return p.relative_to(Path(os.path.normpath(self.base_dir.resolve()))).as_posix()
            with contextlib.suppress(ValueError):
                return p.relative_to(Path(os.path.normpath(self.base_dir.absolute()))).as_posix()
        return p.as_posix()

    def _derived_ids(self) -> list[str | None]:
        """img_ids from the image paths (no img_id column): the file stem, or with ``id_from
        == "path"`` the path relative to the dataset folder. Distinct files that would share an
        id are refused (DatasetError listing them): never merged into one image."""
        ids: list[str | None] = []
        files_of: dict[str, set[str]] = {}
        for row in range(len(self.ds)):
            path = self._cell_path(row)
            if path is None:
                ids.append(f"row-{row}")
                continue
            rel = self._relative(path)
            img_id = rel if self.id_from == "path" else Path(rel).stem
            files_of.setdefault(img_id, set()).add(rel)
            ids.append(img_id)
        clashes = {k: sorted(v) for k, v in files_of.items() if len(v) > 1}
        if clashes:
            shown = "; ".join(
                f"{k!r}: {', '.join(v[:4])}{' ...' if len(v) > 4 else ''}"
                for k, v in list(clashes.items())[:10]
            )
            more = f" (and {len(clashes) - 10} more)" if len(clashes) > 10 else ""
            hint = (
                "pass --id-from path (img_id = the path relative to the dataset folder)"
                if self.id_from != "path"
                else "give the rows an img_id column"
            )
            raise DatasetError(
                f"{self.source}: {len(clashes)} img_id(s) would name several different image files "
                f"(img_id from the file {'path' if self.id_from == 'path' else 'stem'}): "
                f"{shown}{more}; {hint}"
            )
        return ids

    def _cell(self, row: int) -> Any:
        if self._images is None:
            self._images = self.ds.select_columns([self.image_column])
        return self._images[row][self.image_column]

    def _first(self, column: str | None, group: ImageGroup) -> str | None:
        if column is None:
            return None
        if column not in self._columns:
            self._columns[column] = list(self.ds.select_columns([column])[column])
        value = self._columns[column][group.rows[0]]
        return None if value is None or str(value) == "" else str(value)

    def sample_key(self, group: ImageGroup) -> str:
        """The key of the sample an image belongs to (its study or case; else its img_id)."""
        return self._first(self.sample_key_column, group) or group.img_id

    def modality(self, group: ImageGroup) -> str | None:
        """The image's modality (None when the input has no modality column)."""
        return self._first(self.modality_column, group)

    def groups(self) -> tuple[list[ImageGroup], list[int]]:
        """Unique images in order of first appearance, and rows whose img_id is empty."""
        order: dict[str, ImageGroup] = {}
        empty: list[int] = []
        for i, img_id in enumerate(self.row_ids()):
            if img_id is None:
                empty.append(i)
                continue
            group = order.get(img_id)
            if group is None:
                order[img_id] = ImageGroup(img_id, [i])
            else:
                group.rows.append(i)
        return list(order.values()), empty

    def image_bytes(self, row: int) -> bytes:
        """Encoded bytes of ``row``'s image (not decoded)."""
        value = self._cell(row)
        if isinstance(value, dict):
            data, path = value.get("bytes"), value.get("path")
            if data:
                return bytes(data)
            if data is not None and not path:
                return b""  # an empty image cell: the decoder reports it
            if path:
                return self._read_path(str(path))
            raise ImageFetchError(f"row {row}: the image cell holds neither bytes nor a path")
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str) and value:
            return self._read_path(value)
        raise ImageFetchError(
            f"row {row}: no image in column {self.image_column!r} (got {type(value).__name__})"
        )

    def group_bytes(self, group: ImageGroup) -> bytes:
        """The image of ``group``: its first row's bytes, after checking that every other row
        of the group carries the same image (same file path, or equal bytes). Rows that share
        an img_id but carry different images raise ImageFetchError naming both rows."""
        first = group.rows[0]
        data = self.image_bytes(first)
        if len(group.rows) == 1:
            return data
        first_path = self._cell_path(first) if self._plain_path(first) else None
        for row in group.rows[1:]:
            if (
                first_path is not None
                and self._plain_path(row)
                and self._cell_path(row) == first_path
            ):
                continue  # the same file named again
            if self.image_bytes(row) != data:
                raise ImageFetchError(
                    f"img_id {group.img_id!r}: input rows {first} and {row} carry different images; "
                    "give each image its own img_id (or fix the rows), so no QA row is paired with "
                    "another image's perturbation"
                )
        return data

    def _plain_path(self, row: int) -> bool:
        """The row's image is a file path (no embedded bytes)."""
        value = self._cell(row)
        return isinstance(value, str) or (isinstance(value, dict) and not value.get("bytes"))

    def _read_path(self, path: str) -> bytes:
        from perturb.io.images import ImageDecodeError, read_file_bytes

        p = Path(path)
        if not p.is_absolute() and self.base_dir is not None:
            p = self.base_dir / p
        try:
            return read_file_bytes(p, max_bytes=self.max_file_bytes)
        except ImageDecodeError as exc:
            raise ImageFetchError(f"image file {exc}") from None

    def table_without_image(self) -> pa.Table:
        """The rows' other columns as an Arrow table (row order kept)."""
        rest = self.ds.remove_columns([self.image_column])
        table = rest.with_format("arrow")[:]
        assert isinstance(table, pa.Table)
        return table

    def features_without_image(self) -> datasets.Features:
        return datasets.Features(
            {k: v for k, v in self.ds.features.items() if k != self.image_column}
        )

    def images(self) -> Iterator[tuple[ImageGroup, bytes | Exception]]:
        """Each unique image with its bytes, or the error that kept them from being read."""
        groups, _ = self.groups()
        for group in groups:
            try:
                yield group, self.group_bytes(group)
            except ImageFetchError as exc:
                yield group, exc


# ---------------------------------------------------------------------------------------------
# Opening


def _pick_split(
    dd: datasets.DatasetDict, split: str | None, source: str
) -> tuple[datasets.Dataset, str]:
    names = list(dd.keys())
    if split is not None:
        if split not in dd:
            raise DatasetError(
                f"{source}: no split {split!r}; available splits: {', '.join(names)}"
            )
        return dd[split], split
    if DEFAULT_SPLIT in dd:
        return dd[DEFAULT_SPLIT], DEFAULT_SPLIT
    if len(names) == 1:
        return dd[names[0]], names[0]
    raise DatasetError(f"{source}: several splits ({', '.join(names)}); choose one with --split")


def _as_dataset(obj: Any, split: str | None, source: str) -> tuple[datasets.Dataset, str | None]:
    if isinstance(obj, datasets.DatasetDict):
        return _pick_split(obj, split, source)
    if isinstance(obj, datasets.Dataset):
        return obj, split
    raise DatasetError(f"{source}: not a map-style dataset (got {type(obj).__name__})")


def _find_image_column(ds: datasets.Dataset, image_column: str | None, source: str) -> str:
    cols = list(ds.column_names)
    if image_column is not None:
        if image_column not in cols:
            raise DatasetError(f"{source}: no column {image_column!r}; columns: {', '.join(cols)}")
        return image_column
    if "image" in cols:
        return "image"
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image):
            return name
    for name in PATH_COLUMNS:
        if name in cols:
            return name
    raise DatasetError(
        f"{source}: no image column; expected 'image' (HF Image or bytes) or one of "
        f"{', '.join(PATH_COLUMNS)} (file paths); columns: {', '.join(cols)}. Name it with --image-column"
    )


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not text.startswith((".", "~"))
        and not any(text.endswith(s) for s in TABLE_SUFFIXES)
    )


_CACHE_DIR: contextvars.ContextVar[str | None] = contextvars.ContextVar("cache_dir", default=None)
_SCRATCH_DIR: contextvars.ContextVar[str | None] = contextvars.ContextVar("scratch_dir", default=None)


def _cache_kw(cache_dir: str | None = None) -> dict[str, str]:
    """``cache_dir=`` for ``datasets.load_dataset``: the one given, else the one set around an
    adapter's load by ``using_cache``, else nothing (the ``datasets`` default)."""
    folder = cache_dir if cache_dir is not None else _CACHE_DIR.get()
    return {} if folder is None else {"cache_dir": folder}


# builders whose Arrow copy is small and quick to redo (text tables): a parquet file may hold
# gigabytes of images, whose copy stays in the cache (made once, not per run, not in $TMPDIR)
SCRATCH_BUILDERS = frozenset({"json", "csv"})


def _local_cache_kw(cache_dir: str | None = None, builder: str | None = None) -> dict[str, str]:
    """``_cache_kw`` for a load of local files by ``builder``: where no cache folder is set,
    a text table's copy goes to the scratch folder of an enclosing ``scratch_cache`` block
    (else the ``datasets`` default)."""
    kw = _cache_kw(cache_dir)
    scratch = _SCRATCH_DIR.get()
    if kw or scratch is None or builder not in SCRATCH_BUILDERS:
        return kw
    return {"cache_dir": scratch}


@contextlib.contextmanager
def scratch_cache() -> Iterator[None]:
    """Within the block, ``datasets``' Arrow copies of local text tables (a JSONL or CSV given
    to ``score --dataset`` or ``export --dataset``) go to a temporary folder removed after it,
    not to the cache in the home folder. Parquet files and hub loads keep the user's cache
    (a large parquet is copied once there, not again each run; hub files may be there offline)."""
    with tempfile.TemporaryDirectory(prefix="perturb-datasets-") as tmp:
        token = _SCRATCH_DIR.set(tmp)
        try:
            yield
        finally:
            _SCRATCH_DIR.reset(token)


@contextlib.contextmanager
def using_cache(cache_dir: str | os.PathLike[str] | None) -> Iterator[None]:
    """Within the block, adapters' ``load_dataset`` calls cache under ``cache_dir``."""
    token = _CACHE_DIR.set(None if cache_dir is None else os.fspath(cache_dir))
    try:
        yield
    finally:
        _CACHE_DIR.reset(token)


# a flat folder of these (and nothing else) is read without ``load_dataset``'s builder
FLAT_IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
# names that ``load_dataset`` may read as split names (its SPLIT_KEYWORDS): left to it
_SPLIT_WORDS = ("train", "valid", "dev", "val", "test", "eval")


def flat_image_files(folder: Path) -> list[Path] | None:
    """The image files of ``folder`` in ``load_dataset("imagefolder")``'s row order, when the
    folder holds only image files (no subfolder, metadata, hidden file or name that could
    mean a split) and so loads as one "train" split of one ``image`` column; else None."""
    files: list[Path] = []
    real = folder.resolve()  # the folder's links resolved, a linked file's name kept
    with os.scandir(real) as entries:
        for entry in entries:
            name = entry.name
            lower = name.lower()
            if (
                name.startswith((".", "_"))
                or not entry.is_file()
                or os.path.splitext(lower)[1] not in FLAT_IMAGE_SUFFIXES
                or lower.count(".") != 1
                or any(word in lower for word in _SPLIT_WORDS)
            ):
                return None
            files.append(real / name)
    return sorted(files, key=str) or None


def _image_folder_dataset(files: list[Path]) -> datasets.Dataset:
    """What ``load_dataset`` makes of a flat image folder (one ``image`` column of absolute
    paths, sorted), without its builder: no module inference, streaming patches or cache."""
    features = datasets.Features({"image": datasets.Image()})
    table = pa.table(
        {"image": [{"bytes": None, "path": str(f)} for f in files]},
        schema=features.arrow_schema,
    )
    return datasets.Dataset(
        datasets.table.InMemoryTable(table), info=datasets.DatasetInfo(features=features)
    )


def _load_local(
    path: Path, split: str | None, cache_dir: str | None = None
) -> tuple[datasets.Dataset, str | None, Path | None]:
    source = str(path)
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            ds, used = _as_dataset(datasets.load_from_disk(str(path)), split, source)
            return ds, used, path
        if split in (None, "train") and (files := flat_image_files(path)) is not None:
            return _image_folder_dataset(files), "train", path
        obj = datasets.load_dataset(str(path), **_cache_kw(cache_dir))
        ds, used = _as_dataset(obj, split, source)
        return ds, used, path
    builder = TABLE_SUFFIXES.get(path.suffix.lower())
    if path.suffix.lower() == ".arrow":
        return datasets.Dataset.from_file(str(path)), split, path.parent
    if builder is None:
        raise DatasetError(
            f"{source}: unsupported file type {path.suffix!r}; pass a parquet, .jsonl, .json or .csv "
            "file, a save_to_disk folder, an image folder or a hub id"
        )
    ds = datasets.load_dataset(
        builder, data_files=str(path), split="train", **_local_cache_kw(cache_dir, builder)
    )
    return ds, split, path.parent


def hub_host() -> str:
    """The host the Hugging Face hub is reached at (``HF_ENDPOINT``'s, else huggingface.co)."""
    from urllib.parse import urlparse

    return urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or ""


@contextlib.contextmanager
def offline_if_unreachable() -> Iterator[bool]:
    """Hub calls in offline mode (the local cache, or a quick error) when the hub's host does
    not resolve: without it ``datasets`` retries the network for about half a minute and
    prints every retry before the same failure. Yields whether it switched to offline."""
    import socket

    import huggingface_hub.constants as hub_constants

    host = hub_host()
    if hub_constants.HF_HUB_OFFLINE or not host:
        yield False
        return
    try:
        socket.getaddrinfo(host, 443)
    except OSError:  # no DNS: no network
        saved = hub_constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
        hub_constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
        try:
            yield True
        finally:
            hub_constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved
        return
    yield False


def unreachable_error(text: str) -> DatasetError:
    """The error for a hub id that is neither reachable nor in the local cache."""
    return DatasetError(
        f"{text}: the Hugging Face hub is unreachable ({hub_host()} does not resolve: no "
        "network?) and no copy is in the local cache; download it once where there is a "
        "network and pass the local folder with --dataset"
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars from ``datasets`` while loading (the run has its own)."""
    enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            datasets.utils.logging.enable_progress_bar()


def open_input(
    source: str | os.PathLike[str],
    split: str | None = None,
    *,
    image_column: str | None = None,
    id_column: str = ID_COLUMN,
    id_from: str = "stem",
    cache_dir: str | os.PathLike[str] | None = None,
) -> InputDataset:
    """Open an input dataset (see the module docstring for what ``source`` may be).
    Without an img_id column, ``id_from`` derives ids from the image file's stem (``stem``) or
    its path relative to the dataset folder (``path``). ``cache_dir``: where ``datasets`` keeps
    its Arrow copy of a file or hub input (default: its own cache in the home folder). The
    built-in data (no source) is a dataset of its own: ``perturb.datasets.open_input``."""
    check_id_from(id_from)
    with _quiet():
        cache = None if cache_dir is None else os.fspath(cache_dir)
        ds, label, fingerprint, base_dir = load_table(source, split, cache)
    return input_from_dataset(
        ds,
        label,
        fingerprint,
        base_dir,
        image_column=image_column,
        id_column=id_column,
        id_from=id_from,
    )


def check_id_from(id_from: str) -> None:
    if id_from not in ID_SOURCES:
        raise DatasetError(f"--id-from must be one of {', '.join(ID_SOURCES)}, got {id_from!r}")


def input_from_dataset(
    ds: datasets.Dataset,
    label: str,
    fingerprint: str,
    base_dir: Path | None,
    *,
    image_column: str | None = None,
    id_column: str = ID_COLUMN,
    id_from: str = "stem",
) -> InputDataset:
    """An ``InputDataset`` over a loaded table: its image column found (or ``image_column``)
    and read as encoded bytes."""
    with _quiet():
        column = _find_image_column(ds, image_column, label)
        feature = ds.features.get(column)
        if isinstance(feature, datasets.Image) and feature.decode:
            ds = ds.cast_column(column, datasets.Image(decode=False))
    ids = id_column if id_column in ds.column_names else None
    return InputDataset(ds, column, ids, label, fingerprint, base_dir, id_from=id_from)


def load_table(
    source: str | os.PathLike[str],
    split: str | None,
    cache_dir: str | None = None,
) -> tuple[datasets.Dataset, str, str, Path | None]:
    """(dataset, label, fingerprint, folder that relative image paths start from)."""
    text = os.fspath(source)
    path = Path(text).expanduser()
    try:
        if path.exists():
            ds, used, base_dir = _load_local(path, split, cache_dir)
            return ds, str(path), f"local:{path.resolve()}:{used}", base_dir
        if _looks_like_hub_id(text):
            with offline_if_unreachable() as offline:
                try:
                    obj = datasets.load_dataset(
                        text, split=split or DEFAULT_SPLIT, **_cache_kw(cache_dir)
                    )
                except ConnectionError:
                    if offline:
                        raise unreachable_error(text) from None
                    raise
            ds, used = _as_dataset(obj, split, text)
            return ds, text, f"hub:{text}:{used or split or DEFAULT_SPLIT}", None
    except DatasetError:
        raise
    except Exception as exc:  # datasets raises many types (network, format, schema)
        hint = (
            ""
            if path.exists()
            else " (offline? pass a local path, or omit --dataset for the built-in sample)"
        )
        raise DatasetError(
            f"{text}: cannot load the dataset: {type(exc).__name__}: {exc}{hint}"
        ) from None
    raise DatasetError(f"{text}: no such file or folder (and not a hub id of the form owner/name)")
