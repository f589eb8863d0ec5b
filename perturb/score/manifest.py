"""Split-generation manifests: load, and match prediction rows to manifest rows.

A prediction row matches the manifest row whose ``path`` shares the longest path suffix with the
row's image path (absolute or relative; ``\\`` or ``/``), e.g. ``variant_3/abc.jpg`` or
``gaussian_blur/s3/abc.png``. Rows without an image path match on ``(img_id, variant)`` when that
pair is unique in the manifest.

Without ``--manifest``, :func:`discover_manifest` finds it beside the perturbed images when their
paths lead into a ``perturb generate`` folder (what ``perturb export`` and ``perturb predict``
write), so those predictions pair with no manifest flag.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perturb.contracts.manifest import SCORER_COLUMNS
from perturb.errors import InputError

_AMBIGUOUS = -1


@dataclass
class Manifest:
    """A loaded manifest: its rows and the folder its relative paths start from."""

    table: pd.DataFrame
    root: Path | None
    source: str
    _tags: np.ndarray | None = field(default=None, repr=False)
    given: bool = True  # named by the user (--manifest), not found beside the images

    def risk_tags(self, row: int) -> tuple[str, ...] | None:
        """Risk tags of manifest row ``row`` (None when the column is absent or null)."""
        tags: tuple[str, ...] | None = self.all_risk_tags()[row]
        return tags

    def all_risk_tags(self) -> np.ndarray:
        """Risk tags of every row: object array of tuples, None where absent or null."""
        if self._tags is None:
            if "risk_tags" not in self.table.columns:
                self._tags = np.full(len(self.table), None, dtype=object)
            else:
                col = self.table["risk_tags"].to_numpy(dtype=object)
                if pd.api.types.infer_dtype(col, skipna=True) in ("string", "empty"):
                    codes, uniq = pd.factorize(col, use_na_sentinel=True)
                    parsed = [_tags(u) for u in uniq] + [None]
                    mapped = pd.Series(
                        [tuple(t) if t is not None else None for t in parsed], dtype=object
                    ).to_numpy()
                    self._tags = mapped[np.where(codes < 0, len(uniq), codes)]
                else:
                    vals = [_tags(v) for v in col]
                    self._tags = pd.Series(
                        [tuple(t) if t is not None else None for t in vals], dtype=object
                    ).to_numpy()
        return self._tags


def _tags(v: Any) -> list[str] | None:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return [t.strip() for t in v.split(",") if t.strip()]
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [str(t) for t in v]
    return None


def load_manifest(source: str | Path | pd.DataFrame) -> Manifest:
    """Load ``DIR/manifest.parquet`` (or a DataFrame) and check its columns."""
    if isinstance(source, pd.DataFrame):
        table, root, label = source.reset_index(drop=True), None, "manifest"
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "manifest.parquet"
        if not path.exists():
            raise InputError(
                f"{path}: manifest not found. Pass DIR/manifest.parquet written by `perturb generate`."
            )
        try:
            table = pd.read_parquet(path)
        except Exception as exc:
            raise InputError(f"{path}: not a readable parquet manifest ({exc})") from None
        root, label = path.parent, str(path)
    missing = [c for c in SCORER_COLUMNS if c not in table.columns]
    if missing:
        raise InputError(
            f"{label}: manifest lacks column(s) {missing}; found {sorted(map(str, table.columns))}. "
            "Regenerate it with `perturb generate`."
        )
    if len(table) == 0:
        raise InputError(f"{label}: the manifest has no rows")
    table = table.copy()
    table["img_id"] = table["img_id"].astype(str)
    table["op"] = table["op"].astype(str)
    table["path"] = table["path"].astype(str).str.replace("\\", "/", regex=False)
    for c in ("severity", "variant"):
        table[c] = pd.to_numeric(table[c], errors="coerce").fillna(0).astype(np.int64)
    return Manifest(table=table.reset_index(drop=True), root=root, source=label)


def _parts(p: str) -> list[str]:
    return [s for s in p.replace("\\", "/").split("/") if s not in ("", ".")]


class SuffixIndex:
    """Lookup of manifest rows by path suffix (longest unique suffix wins)."""

    def __init__(self, paths: list[str]):
        self.index: dict[str, int] = {}
        self.max_depth = 0
        for i, p in enumerate(paths):
            parts = _parts(p)
            self.max_depth = max(self.max_depth, len(parts))
            for k in range(1, len(parts) + 1):
                key = "/".join(parts[-k:])
                prev = self.index.get(key)
                self.index[key] = i if prev is None else (_AMBIGUOUS if prev != i else i)

    def lookup(self, path: str) -> int | None:
        """Manifest row for ``path``; None if no suffix matches; -1 if ambiguous."""
        parts = _parts(path)
        for k in range(min(len(parts), self.max_depth), 0, -1):
            hit = self.index.get("/".join(parts[-k:]))
            if hit is None:
                continue
            return hit
        return None


def match_rows(
    manifest: Manifest, image_paths: np.ndarray, img_ids: np.ndarray, variants: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Manifest row per prediction row (-1 none) and a reason array for failures.

    Reasons: '' matched, 'no_manifest_match', 'ambiguous_manifest_match'.
    """
    n = len(image_paths)
    rows = np.full(n, -1, dtype=np.int64)
    reason = np.full(n, "", dtype=object)
    has_path = ~pd.isna(np.asarray(image_paths, dtype=object))
    if has_path.any():
        index = SuffixIndex(manifest.table["path"].tolist())
        codes, uniq = pd.factorize(np.asarray(image_paths, dtype=object)[has_path])
        found = np.array([_code(index.lookup(u)) for u in uniq] + [_NONE], dtype=np.int64)
        _fill(rows, reason, np.flatnonzero(has_path), found[np.where(codes < 0, len(uniq), codes)])
    if (~has_path).any():
        by_id: dict[tuple[str, int], int] = {}
        for i, (a, v) in enumerate(
            zip(manifest.table["img_id"], manifest.table["variant"], strict=True)
        ):
            key = (a, int(v))
            by_id[key] = _AMBIGUOUS if key in by_id else i
        idx = np.flatnonzero(~has_path)
        hits = [
            _code(by_id.get((str(img_ids[i]), 0 if pd.isna(variants[i]) else int(variants[i]))))
            for i in idx
        ]
        _fill(rows, reason, idx, np.array(hits, dtype=np.int64))
    return rows, reason


_NONE = -2


def _code(hit: int | None) -> int:
    return _NONE if hit is None else hit


def _fill(rows: np.ndarray, reason: np.ndarray, idx: np.ndarray, hit: np.ndarray) -> None:
    rows[idx] = np.where(hit >= 0, hit, -1)
    reason[idx] = np.where(
        hit == _NONE,
        "no_manifest_match",
        np.where(hit == _AMBIGUOUS, "ambiguous_manifest_match", ""),
    )


MAX_DISCOVERY_DEPTH = 8  # folders climbed from an image path looking for the split's manifest
DISCOVERY_SAMPLE = 64  # image paths tried


def discover_manifest(image_paths: Iterable[Any], bases: Sequence[Path]) -> Path | None:
    """The ``manifest.parquet`` of the ``perturb generate`` folder the perturbed images lie in,
    found by climbing from each of the first image paths (absolute, or relative to one of
    ``bases``: the prediction files' folders, the working folder); None when no image path
    leads to one. A folder is a generated split when it holds ``manifest.parquet`` and
    ``.perturb/``, so a stray manifest elsewhere is never taken."""
    tried = 0
    for raw in image_paths:
        if not isinstance(raw, str) or not raw.strip():
            continue
        tried += 1
        if tried > DISCOVERY_SAMPLE:
            break
        path = Path(raw.replace("\\", "/"))
        starts = [path] if path.is_absolute() else [b / path for b in bases]
        for start in starts:
            folder = start.parent
            for _ in range(MAX_DISCOVERY_DEPTH):
                if (folder / "manifest.parquet").is_file() and (folder / ".perturb").is_dir():
                    return folder / "manifest.parquet"
                if folder.parent == folder:
                    break
                folder = folder.parent
    return None
