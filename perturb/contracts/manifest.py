"""The manifest's columns: one row per output file (``manifest.parquet`` of a run).

Names and Arrow types as data, so the writer (``perturb.generate``) and the readers
(``perturb.score``, the tests) share one definition without importing pyarrow here;
:func:`arrow_schema` builds the ``pyarrow`` schema for whoever writes or checks the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

ColumnType = Literal["string", "int64"]

# The scorer relies on these names and types (perturb/score/manifest.py).
CORE_FIELDS: tuple[tuple[str, ColumnType], ...] = (
    ("img_id", "string"),
    ("suite", "string"),
    ("op", "string"),
    ("severity", "int64"),
    ("variant", "int64"),
    ("seed", "int64"),
    ("key", "string"),
    ("params", "string"),
    ("risk_tags", "string"),
    ("path", "string"),
    ("sha256", "string"),
    ("width", "int64"),
    ("height", "int64"),
    ("perturb_version", "string"),
)
# what else a run records of each output
EXTRA_FIELDS: tuple[tuple[str, ColumnType], ...] = (
    ("file_id", "string"),
    ("op_version", "int64"),
    ("channels", "int64"),
    ("bit_depth", "int64"),
    ("format", "string"),
    ("encoding", "string"),
    ("size_bytes", "int64"),
    ("device", "string"),
    ("record", "string"),
    ("input_sha256", "string"),  # sha256 of the input image file the output was made from
    ("orientation", "int64"),  # EXIF orientation applied when decoding it (1: none)
    ("row_digest", "string"),  # sha256 of the row's other columns (``row_digest``)
)
MANIFEST_FIELDS: tuple[tuple[str, ColumnType], ...] = CORE_FIELDS + EXTRA_FIELDS
MANIFEST_COLUMNS: tuple[str, ...] = tuple(name for name, _ in MANIFEST_FIELDS)
# the perturbation's columns that a generated dataset row adds to its QA row, in manifest order:
# the core ones but ``img_id`` (the QA row has it already)
PERTURBATION_COLUMNS: tuple[str, ...] = tuple(name for name, _ in CORE_FIELDS if name != "img_id")
INT_COLUMNS: frozenset[str] = frozenset(name for name, kind in MANIFEST_FIELDS if kind == "int64")
# the columns the scorer needs to pair predictions with outputs
SCORER_COLUMNS: tuple[str, ...] = ("img_id", "op", "severity", "variant", "path")


ROW_DIGEST = "row_digest"
# what ``row_digest`` covers: every other column, the output's sha256 among them
IDENTITY_COLUMNS: tuple[str, ...] = tuple(c for c in MANIFEST_COLUMNS if c != ROW_DIGEST)


def row_digest(row: Mapping[str, Any]) -> str:
    """sha256 (hex) of a manifest row's identity: its other columns (absent ones as null) with
    the output file's sha256, so an edited img_id, op, severity, path, ... no longer matches the
    digest ``perturb verify`` checks."""
    canonical = json.dumps(
        [[name, row.get(name)] for name in IDENTITY_COLUMNS],
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def arrow_schema() -> pa.Schema:
    """The manifest's ``pyarrow`` schema (column order as written)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in MANIFEST_FIELDS])
