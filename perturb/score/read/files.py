"""Prediction files as they are: JSON lines, JSON, CSV/TSV, parquet, a Hugging Face dataset
folder, a DataFrame or a list of dicts, loaded into one raw frame without interpretation.

Each raw row carries ``_loc``: its line (JSON lines, CSV) or row number, for messages. Big
inputs are bounded (a JSON-lines row at most :data:`MAX_LINE_BYTES`, a JSON file read whole at
most :data:`MAX_WHOLE_FILE_BYTES`); undecodable text is an InputError naming the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perturb.errors import InputError
from perturb.score.read.report import PredictionSource

_BOMS = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


MAX_LINE_BYTES = 64 << 20  # a JSON-lines row longer than this is an error naming its line


MAX_WHOLE_FILE_BYTES = 256 << 20  # a JSON (not JSON-lines) file is parsed whole: at most this


def _too_big(path: Path) -> None:
    """A file read whole (JSON, UTF-16/32 text) must be small enough to parse within memory."""
    size = path.stat().st_size
    if size > MAX_WHOLE_FILE_BYTES:
        raise InputError(
            f"{path}: {size} bytes is above the {MAX_WHOLE_FILE_BYTES >> 20} MB that a JSON file "
            "(or UTF-16/32 text) is read in whole; write the predictions as UTF-8 JSON lines "
            "(one object a line, .jsonl), which are read a line at a time"
        )


def read_text(path: Path) -> str:
    """A prediction file's text: UTF-8, or UTF-16/32 and UTF-8 with a byte-order mark;
    anything else (latin-1, cp1252) is an InputError naming the fix."""
    _too_big(path)
    data = path.read_bytes()
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not {encoding.upper()} text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}); re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)"
        ) from None


def _loads(text: str, where: str) -> Any:
    """json.loads with a clear error for nesting deeper than Python's recursion limit."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(
            f"{where}: JSON nested too deeply to read; rows must be flat objects (a nested "
            "value a few levels deep at most)"
        ) from None


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a JSON-lines file, read a line at a time (``\\r\\n`` and ``\\r``
    end lines too, as text-mode reading has them); a line longer than ``MAX_LINE_BYTES`` is an
    InputError naming it. UTF-16/32 files (a byte-order mark) are read whole."""
    with open(path, "rb") as fh:
        head = fh.read(4)
        if any(head.startswith(bom) for bom, enc in _BOMS if enc != "utf-8-sig"):
            text = read_text(path).replace("\r\n", "\n").replace("\r", "\n")
            yield from enumerate(text.split("\n"), start=1)
            return
        fh.seek(3 if head.startswith(b"\xef\xbb\xbf") else 0)
        lineno, offset = 0, fh.tell()
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(
                    f"{path}: line {lineno + 1} is longer than {MAX_LINE_BYTES >> 20} MB; a JSON-lines "
                    "file holds one row object a line: split it into one object per line"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                    f"{offset + exc.start}); re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)"
                ) from None
            offset += len(raw)
            text = text.removesuffix("\n")
            if raw.endswith(b"\n"):
                text = text.removesuffix("\r")
            for piece in text.split("\r"):
                lineno += 1
                yield lineno, piece


def _check_line_lengths(path: Path) -> None:
    """A CSV/TSV file read a line at a time first: a line longer than ``MAX_LINE_BYTES`` is an
    InputError naming it (the CSV parser would hold the whole line several times over)."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(
                    f"{path}: line {lineno} is longer than {MAX_LINE_BYTES >> 20} MB; a CSV file "
                    "holds one row a line: check that it is a prediction table (or write the "
                    "predictions as JSON lines)"
                )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for lineno, line in _jsonl_lines(path):
        if not line.strip():
            continue
        try:
            obj = _loads(line, f"{path}: line {lineno}")
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{path}: line {lineno}: malformed JSON ({exc.msg} at column {exc.colno}). "
                "Fix or remove that line; every non-blank line must be one JSON object."
            ) from None
        if not isinstance(obj, dict):
            raise InputError(
                f"{path}: line {lineno}: expected a JSON object per line, got "
                f"{type(obj).__name__}. Write one {{...}} record per line."
            )
        obj["_loc"] = lineno
        rows.append(obj)
    return rows


def _read_json(path: Path) -> tuple[list[dict[str, Any]], str]:
    text = read_text(path)
    if not text.strip():
        return [], "json"
    try:
        data = _loads(text, str(path))
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # several JSON values: treat as JSON lines
            return _read_jsonl(path), "jsonl"
        raise InputError(
            f"{path}: line {exc.lineno}: malformed JSON ({exc.msg} at column {exc.colno}). "
            "Fix the file; it must hold a JSON list of row objects (or use JSON lines)."
        ) from None
    if isinstance(data, dict) and "image_id" in data:  # one VinDr-CXR-VQA image object
        data = [data]
    if isinstance(data, dict):
        for key in ("rows", "data", "predictions", "records"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            if data and all(isinstance(v, dict) for v in data.values()):
                # ReXVQA style: {question_id: {question, options, correct_answer, ...}}
                # the outer key is the question's id; an inner ``question_id`` (ReXVQA
                # inference results: study + task, shared by questions of one task on one
                # study) is kept as ``inner_question_id``
                keyed = [
                    {
                        **{
                            ("inner_question_id" if f == "question_id" else f): x
                            for f, x in v.items()
                        },
                        "question_id": str(k),
                        "_loc": i,
                    }
                    for i, (k, v) in enumerate(data.items(), start=1)
                ]
                return keyed, "json:keyed"
            raise InputError(
                f"{path}: expected a JSON list of row objects, an object with a 'rows' list or "
                f"an object of row objects keyed by question id, got an object with keys "
                f"{sorted(data)[:8]}."
            )
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of row objects, got {type(data).__name__}.")
    rows: list[dict[str, Any]] = []
    for i, obj in enumerate(data, start=1):
        if not isinstance(obj, dict):
            raise InputError(f"{path}: row {i}: expected a JSON object, got {type(obj).__name__}.")
        rows.append({**obj, "_loc": i})
    return rows, "json"


def _read_hf(path: Path) -> pd.DataFrame:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise InputError(f"{path}: reading a dataset folder needs the 'datasets' package") from exc
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise InputError(f"{path}: not a readable Hugging Face dataset folder ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise InputError(
                f"{path}: dataset folder holds splits {sorted(ds)}; pass the folder of one split "
                f"(e.g. {path}/{sorted(ds)[0]})."
            )
        ds = next(iter(ds.values()))
    for name, feat in ds.features.items():
        if isinstance(feat, datasets.Image):
            ds = ds.cast_column(name, datasets.Image(decode=False))
    df = ds.to_pandas()
    assert isinstance(df, pd.DataFrame)
    return df


def load_raw(source: PredictionSource, label: str | None = None) -> tuple[pd.DataFrame, str, str]:
    """Load ``source`` without interpretation; returns (frame, format, label)."""
    if isinstance(source, pd.DataFrame):
        df = source.copy()
        df["_loc"] = np.arange(1, len(df) + 1)
        return df, "dataframe", label or "dataframe"
    if isinstance(source, (list, tuple)):
        rows: list[dict[str, Any]] = []
        for i, r in enumerate(source, start=1):
            if not isinstance(r, Mapping):
                raise InputError(f"{label or 'records'}: item {i} is not a dict")
            rows.append({**r, "_loc": i})
        return pd.DataFrame(rows), "records", label or "records"
    if not isinstance(source, (str, Path)):
        raise InputError(f"unsupported prediction source of type {type(source).__name__}")
    path = Path(source)
    label = label or str(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder. Check the path.")
    if path.is_dir():
        if any(
            (path / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json")
        ):
            return _read_hf(path), "hf_dataset", label
        raise InputError(
            f"{path}: a folder but not a Hugging Face dataset (no dataset_info.json/state.json). "
            "Pass a JSONL/CSV/parquet/JSON file or a datasets.save_to_disk folder."
        )
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty. Point to the predictions file.")
    suffix = "".join(path.suffixes[-1:]).lower()
    if suffix in (".jsonl", ".ndjson"):
        return pd.DataFrame(_read_jsonl(path)), "jsonl", label
    if suffix == ".json":
        rows, fmt = _read_json(path)
        return pd.DataFrame(rows), fmt, label
    if suffix in (".csv", ".tsv"):
        _check_line_lengths(path)
        try:
            df = pd.read_csv(
                path,
                sep="\t" if suffix == ".tsv" else ",",
                dtype=object,
                keep_default_na=False,
                na_values=[""],
            )
        except pd.errors.EmptyDataError:
            raise InputError(
                f"{path}: the file is empty (no header). Point to the predictions file."
            ) from None
        except pd.errors.ParserError as exc:
            raise InputError(
                f"{path}: malformed CSV ({exc}). Fix the quoting on that line."
            ) from None
        df["_loc"] = np.arange(2, len(df) + 2)  # file line number, header is line 1
        return df, "csv", label
    if suffix in (".parquet", ".pq"):
        try:
            df = pd.read_parquet(path)
        except Exception as exc:
            raise InputError(f"{path}: not a readable parquet file ({exc})") from None
        df["_loc"] = np.arange(1, len(df) + 1)
        return df, "parquet", label
    raise InputError(
        f"{path}: unknown file type '{suffix}'. Use .jsonl, .json, .csv, .tsv, .parquet or a "
        "Hugging Face dataset folder."
    )
