"""Prediction readers: every supported format becomes one canonical table.

Supported inputs (a path, a ``pandas.DataFrame`` or a list of dicts):

* plain JSONL / CSV / TSV / parquet / JSON-array with ``img_id``, ``question``, a reference answer
  (``answer``/``reference``/``labels``/...) and a ``prediction`` (or ``response``), plus optional
  ``complexity``, ``question_class``, ``options``, ``perturbation``, ``severity``, ``variant``,
  ``image``/``image_path`` and ``model``;
* ms-swift inference JSONL (``messages`` [user, assistant], ``images`` [{"path"}] or [str],
  ``response``, ``labels``): prediction = ``response`` (else the last assistant turn), question =
  the last user turn without ``<image>`` tags, reference = ``labels``, img_id = image file stem;
* Kvasir-VQA-x1 LLM-judge ``*_eval.json`` (list of rows with ``response``, ``answer``,
  ``question_class`` and ``eval_json`` {aspect: {score, reason}});
* a Hugging Face dataset folder (``datasets.save_to_disk``);
* radiology sets, the datasets' own rows with a prediction (``prediction``, ``model_answer``,
  ``response``, ``model_response``, ``final_answer``, ...; rows with an ``error`` and no
  answer are dropped as ``inference_error``): ReXVQA's JSON keyed by question id (``{key:
  {question, options ["A. ..."], correct_answer, task_name, category, study_id, ImagePath
  [...]}}``; the outer key is the question id, an inner ``question_id`` is kept as
  ``inner_question_id``; the study fields are the sample, never an image id); MedThinkVQA rows
  and official submissions (``image_NN_path`` slots, options dict, correct_answer: the case is
  sample and question, see :func:`perturb.datasets.medthinkvqa.predictions.medthink_columns`); VinDr-CXR-VQA image objects
  (``{"image_id", "vqa": [items]}``, one row per item with ``qa_idx``) and flat rows
  (``image_id``, ``qa_idx``, ``question``, ``answer`` with ``<loc_...>`` tags, ``type``,
  ``gt_location``). Without an id column a row with several images is keyed by their common
  folder (:func:`sample_id_of_paths`): the study or case, not an image, is the sample.

Canonical columns: ``img_id``, ``question``, ``qkey`` (whitespace-normalised question used for
pairing, or ``id:<question_id>`` when the rows carry a question id), ``qid`` (the dataset's own
question identity: question id, MedThinkVQA case, VinDr ``image_id#qa_idx``; None without),
``reference``,
``prediction``, ``complexity``, ``question_class`` (tuple of str; radiology rows without one get
the classes of :mod:`perturb.datasets.radiology`), ``options`` (dict letter -> text or None),
``perturbation``, ``severity``, ``variant``, ``image_path`` (the first image), ``_paths`` (all
of the row's image paths), ``judge`` (dict
aspect -> 0/1 or None), ``model``, ``ref_boxes`` (reference boxes from ``gt_location`` or None)
``_loc`` (1-based line or row number in the source, for messages) and ``_id_from_path``
(img_id derived from the image paths: a sample, not necessarily the manifest's image). Rows that cannot be used are dropped and counted with
a reason in :class:`ReadReport`; nothing is dropped silently.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from perturb.boxes import parse_loc_tags, sort_corners
from perturb.datasets import medthinkvqa
from perturb.datasets.medthinkvqa import predictions as medthink_predictions
from perturb.datasets.questions import question_classes
from perturb.datasets.radiology import QUESTION_CLASSES as RADIOLOGY_CLASSES
from perturb.datasets.radiology import image_path_parts, sample_of_image_paths
from perturb.datasets.vindr_cxr_vqa import predictions as vindr_predictions
from perturb.errors import InputError

PredictionSource: TypeAlias = str | Path | pd.DataFrame | Sequence[Mapping[str, Any]]

ALIASES: dict[str, tuple[str, ...]] = {
    # raw answers before extracted ones: the scorer reads the letter itself (score.answers)
    "prediction": (
        "prediction",
        "pred",
        "model_answer",
        "response",
        "model_response",
        "output",
        "predicted_answer",
        "final_answer",
    ),
    "reference": (
        "reference",
        "answer",
        "labels",
        "label",
        "ground_truth",
        "gt_answer",
        "gold",
        "target",
        "correct_answer",
    ),
    "img_id": ("img_id", "image_id", "case_id"),
    # the sample (bootstrap cluster) when no img_id names it: never matched to the manifest
    "sample": ("study_id", "studyinstanceuid", "sample_key"),
    "qa_idx": ("qa_idx", "item_index"),
    "error": ("error",),
    "question": ("question", "query", "prompt"),
    "question_id": ("question_id", "qid"),
    "image_path": (
        "image_path",
        "img_path",
        "image",
        "images",
        "imagepath",
        "image_paths",
        "path",
        "file_name",
    ),
    "ref_boxes": ("gt_location", "gt_locations", "gt_boxes", "ref_boxes", "reference_boxes"),
    "vindr_type": ("type",),
    "task_name": ("task_name",),
    "category": ("category",),
    "perturbation": ("perturbation", "op", "corruption"),
    "severity": ("severity",),
    "variant": ("variant",),
    "complexity": ("complexity",),
    "question_class": ("question_class", "question_classes"),
    "options": ("options", "choices"),
    "judge": ("eval_json",),
    "model": ("model",),
    "confidence": ("confidence", "logprobs"),
    "bleurt": ("bleurt",),
    "bertscore": ("bertscore", "bertscore_f1", "bert_score"),
}
REQUIRED_HELP = {
    "prediction": "the model's answer",
    "question": "the question text",
    "img_id": "the image id (or an image path whose file stem is the id)",
}
# columns that mark a radiology input: rows without question_class get radiology classes
RADIOLOGY_HINTS = ("ref_boxes", "vindr_type", "task_name", "category", "options")
CANONICAL = [
    "img_id",
    "question",
    "qkey",
    "qid",
    "reference",
    "prediction",
    "complexity",
    "question_class",
    "options",
    "perturbation",
    "severity",
    "variant",
    "image_path",
    "_paths",
    "judge",
    "model",
    "ref_boxes",
    "confidence",
    "bleurt",
    "bertscore",
    "_loc",
    "_id_from_path",
]
_IMAGE_TAG = re.compile(r"<image>", re.IGNORECASE)
_WS = re.compile(r"\s+")


@dataclass
class ReadReport:
    """What happened to the rows of one input: counts, drops with reasons, coercions."""

    source: str
    format: str
    rows_in: int = 0
    rows_kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    drop_examples: dict[str, list[str]] = field(default_factory=dict)
    coerced: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    loc_word: str = "row"

    def drop(self, reason: str, locs: Iterable[Any], what: str = "") -> None:
        """Count dropped rows and keep the first few locations as examples."""
        locs = list(locs)
        if not locs:
            return
        self.dropped[reason] += len(locs)
        ex = self.drop_examples.setdefault(reason, [])
        for loc in locs[: max(0, 3 - len(ex))]:
            ex.append(f"{self.source} {self.loc_word} {loc}{(': ' + what) if what else ''}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "source": self.source,
            "format": self.format,
            "rows_in": self.rows_in,
            "rows_kept": self.rows_kept,
            "dropped": dict(sorted(self.dropped.items())),
            "drop_examples": {k: v for k, v in sorted(self.drop_examples.items())},
            "coerced": dict(sorted(self.coerced.items())),
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------- raw loading


_BOMS = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


def read_text(path: Path) -> str:
    """A prediction file's text: UTF-8, or UTF-16/32 and UTF-8 with a byte-order mark;
    anything else (latin-1, cp1252) is an InputError naming the fix."""
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


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    text = read_text(path).replace("\r\n", "\n").replace("\r", "\n")  # as text-mode reading
    for lineno, line in enumerate(text.split("\n"), start=1):
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


# ----------------------------------------------------------------------------- value coercion


def obj_array(values: Iterable[Any]) -> np.ndarray:
    """1-D object array holding ``values`` as they are (tuples and lists stay elements)."""
    items = values if isinstance(values, list) else list(values)
    return pd.Series(items, dtype=object).to_numpy() if items else np.empty(0, dtype=object)


def object_frame(columns: Mapping[str, Any]) -> pd.DataFrame:
    """DataFrame whose object-array columns stay Python objects (no string-dtype conversion)."""
    return pd.DataFrame(
        {
            k: pd.Series(v, dtype=object) if isinstance(v, np.ndarray) and v.dtype == object else v
            for k, v in columns.items()
        }
    )


def map_unique(arr: np.ndarray, fn: Callable[[Any], Any]) -> np.ndarray:
    """``fn`` applied once per distinct value of a column of strings/None (NA -> ``fn(None)``)."""
    codes, uniq = pd.factorize(arr, use_na_sentinel=True)
    mapped = obj_array([fn(u) for u in uniq] + [fn(None) if (codes < 0).any() else None])
    return mapped[np.where(codes < 0, len(uniq), codes)]


def _all_text(arr: np.ndarray) -> bool:
    return pd.api.types.infer_dtype(arr, skipna=True) in ("string", "empty")


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return v is pd.NA or v is pd.NaT


def _as_text(v: Any) -> tuple[str | None, str | None]:
    """Text value of a cell: (text, coercion-kind) or (None, None/'invalid')."""
    if isinstance(v, str):
        return v, None
    if _is_missing(v):
        return None, None
    if isinstance(v, (bool, np.bool_)):
        return ("yes" if v else "no"), "bool"
    if isinstance(v, (int, np.integer)):
        return str(int(v)), "number"
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isinf(f):
            return None, "invalid"
        return (str(int(f)) if f.is_integer() else repr(f)), "number"
    return None, "invalid"


def _text_column(values: np.ndarray, rep: ReadReport, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Coerce a column to str/None; returns (values, invalid-mask).

    Numbers become their decimal text and booleans yes/no (counted in ``rep.coerced``); lists,
    dicts and other objects are invalid.
    """
    arr = np.asarray(values, dtype=object)
    invalid = np.zeros(len(arr), dtype=bool)
    if _all_text(arr):
        out = arr.copy()
        out[pd.isna(arr)] = None
        return out, invalid
    out = np.empty(len(arr), dtype=object)
    kinds: Counter[str] = Counter()
    for i, v in enumerate(arr):
        if type(v) is str:
            out[i] = v
            continue
        t, kind = _as_text(v)
        out[i] = t
        if kind == "invalid":
            invalid[i] = True
        elif kind:
            kinds[kind] += 1
    for kind, n in kinds.items():
        rep.coerced[f"{name}:{kind}_to_text"] += n
    return out, invalid


def _int_column(values: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coerce to nullable ints: (values as float with NaN for missing, invalid-mask)."""
    arr = np.asarray(values, dtype=object)
    out = np.full(len(arr), np.nan)
    invalid = np.zeros(len(arr), dtype=bool)
    kind = pd.api.types.infer_dtype(arr, skipna=True)
    if kind == "empty":
        return out, invalid
    if kind in ("integer", "floating", "mixed-integer-float"):
        f = pd.to_numeric(pd.Series(arr), errors="coerce").to_numpy(dtype=np.float64)
        # beyond 2**53 a float is no exact integer (and 1e300 fits no int64)
        bad = np.isfinite(f) & ((f != np.round(f)) | (np.abs(f) > 2**53)) | np.isinf(f)
        return np.where(bad, np.nan, f), bad
    for i, v in enumerate(arr):
        if _is_missing(v):
            continue
        if isinstance(v, (bool, np.bool_)):
            invalid[i] = True
            continue
        try:
            f = float(v.strip()) if isinstance(v, str) else float(v)
        except (TypeError, ValueError):
            if isinstance(v, str) and re.fullmatch(r"\s*[sS](\d+)\s*", v):
                out[i] = float(re.fullmatch(r"\s*[sS](\d+)\s*", v).group(1))  # type: ignore[union-attr]
                continue
            if isinstance(v, str) and not v.strip():
                continue
            invalid[i] = True
            continue
        if math.isnan(f):
            continue
        if not f.is_integer() or abs(f) > 2**53:
            invalid[i] = True
            continue
        out[i] = f
    return out, invalid


def _parse_jsonish(v: Any) -> Any:
    if isinstance(v, str):
        s = v.strip()
        if s[:1] in "[{":
            try:
                return json.loads(s)
            except json.JSONDecodeError:
                return v
    return v


def _class_tuple(v: Any) -> tuple[str, ...]:
    v = _parse_jsonish(v)
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, str):
        parts = [p.strip() for p in re.split(r"[;,|]", v)]
        return tuple(p for p in parts if p)
    if isinstance(v, (list, tuple)):
        return tuple(str(x).strip() for x in v if isinstance(x, str) and x.strip())
    return ()


_LETTERS = "ABCDEFGHIJ"


def _options_dict(v: Any) -> dict[str, str] | None:
    v = _parse_jsonish(v)
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, Mapping):
        out = {}
        for k, t in v.items():
            if isinstance(k, str) and k.strip().upper()[:1] in _LETTERS and not _is_missing(t):
                out[k.strip().upper()[:1]] = str(t)
        return out or None
    if isinstance(v, (list, tuple)):
        out = {}
        for i, t in enumerate(v[: len(_LETTERS)]):
            if _is_missing(t):
                continue
            s = str(t)
            m = re.match(r"^\s*\(?([A-Ja-j])[\).:]\s*(.*)$", s)
            if m:
                out[m.group(1).upper()] = m.group(2)
            else:
                out[_LETTERS[i]] = s
        return out or None
    return None


def _judge_dict(v: Any) -> tuple[dict[str, float] | None, list[str]]:
    """Aspect scores from an ``eval_json`` cell: (scores or None, the invalid aspect scores).

    A score is a number in [0, 1] (``"1"`` and ``true`` count as 1); a null score means "not
    scored"; anything else (5, -1, "yes") is invalid and named in the second value.
    """
    v = _parse_jsonish(v)
    if not isinstance(v, Mapping):
        return None, []
    out: dict[str, float] = {}
    bad: list[str] = []
    for aspect, item in v.items():
        score = item.get("score") if isinstance(item, Mapping) else item
        if score is None:
            continue
        if isinstance(score, (bool, np.bool_)):
            score = int(score)
        x: float | None = None
        if isinstance(score, str):
            try:
                x = float(score.strip())
            except ValueError:
                x = None
        elif isinstance(score, (int, float, np.integer, np.floating)):
            x = float(score)
        if x is not None and 0.0 <= x <= 1.0:
            out[str(aspect)] = x
        else:
            bad.append(f"{aspect}={score!r}")
    return (out or None), bad


def _path_of(v: Any) -> str | None:
    """Image path from a cell: str, {"path": ...}, or a list of those (first one)."""
    v = _parse_jsonish(v) if isinstance(v, str) and v.strip()[:1] == "[" else v
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        v = v[0] if len(v) else None
    if isinstance(v, Mapping):
        v = v.get("path")
    return v if isinstance(v, str) and v.strip() else None


def _paths_of(v: Any) -> list[str]:
    """Every image path of a cell: str, {"path": ...}, or a list of those."""
    v = _parse_jsonish(v) if isinstance(v, str) and v.strip()[:1] == "[" else v
    if isinstance(v, np.ndarray):
        v = v.tolist()
    items = v if isinstance(v, (list, tuple)) else [v]
    out = []
    for item in items:
        p = item.get("path") if isinstance(item, Mapping) else item
        if isinstance(p, str) and p.strip():
            out.append(p)
    return out


def _posix(path: str) -> PurePosixPath:
    return PurePosixPath(path.replace("\\", "/"))


def sample_id_of_paths(v: Any) -> str | None:
    """Sample id from image path(s), the same for clean images and the outputs ``perturb
    generate`` wrote from them: a radiology study or case
    (:func:`perturb.datasets.radiology.sample_of_image_paths`: ``studies/<uid>``, ``caseN``); else one
    image -> its file stem (an encoded generated name decoded); several -> their deepest common
    folder (as written), so the study, not an image, is the sample."""
    paths = _paths_of(v)
    if not paths:
        return None
    sample = sample_of_image_paths(paths)
    if sample is not None:
        return sample
    if len(set(paths)) == 1:
        names = image_path_parts(paths[0])
        return image_stem(names[-1]) if names else None
    parents = [_posix(p).parent.parts for p in paths]
    common: list[str] = []
    for parts in zip(*parents, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return str(PurePosixPath(*common)) if common else "|".join(sorted(image_stem(p) for p in paths))


def _num(v: Any) -> float | None:
    if isinstance(v, (bool, np.bool_)) or _is_missing(v):
        return None
    if isinstance(v, (int, float, np.integer, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


_BOX_KEYS = (
    ("x_min", "y_min", "x_max", "y_max"),
    ("x1", "y1", "x2", "y2"),
    ("xmin", "ymin", "xmax", "ymax"),
)


def boxes_of(v: Any) -> list[tuple[float, float, float, float]] | None:
    """Reference boxes from a cell: ``[x1, y1, x2, y2]``, a list of those, ``{x_min, y_min,
    x_max, y_max}`` (or x1..y2 / xmin..ymax) dicts, their JSON text, or loc-tag text. None when
    the cell holds no box; raises ValueError on a malformed one."""
    if isinstance(v, str):
        if "<loc_" in v:
            return [sort_corners(b) for b in parse_loc_tags(v)] or None
        v = _parse_jsonish(v)
        if isinstance(v, str):
            if v.strip():
                raise ValueError(f"not a box: {v[:40]!r}")
            return None
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple, Mapping)) and _is_missing(v):
        return None
    if isinstance(v, Mapping):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"not a box: {v!r:.40}")
    if not v:
        return None
    if all(_num(x) is not None for x in v):
        v = [v]
    out = []
    for b in v:
        if isinstance(b, np.ndarray):
            b = b.tolist()
        if isinstance(b, Mapping):
            keys = next((ks for ks in _BOX_KEYS if all(k in b for k in ks)), None)
            if keys is None:
                raise ValueError(f"box dict needs keys {_BOX_KEYS[0]}: {sorted(b)}")
            b = [b[k] for k in keys]
        nums = [_num(x) for x in b] if isinstance(b, (list, tuple)) else []
        if len(nums) != 4 or any(x is None for x in nums):
            raise ValueError(f"a box needs 4 numbers x1, y1, x2, y2: {b!r:.60}")
        out.append(sort_corners(nums))  # type: ignore[arg-type]
    return out or None


def image_stem(path: str) -> str:
    """File stem of a posix or Windows path (``a/b/abc.jpg`` -> ``abc``)."""
    name = PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name
    return name.rsplit(".", 1)[0] if "." in name else name


def question_key(q: str) -> str:
    """Pairing form of a question: ``<image>`` tags removed, whitespace collapsed."""
    return _WS.sub(" ", _IMAGE_TAG.sub(" ", q)).strip()


# ----------------------------------------------------------------------------- ms-swift


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple, np.ndarray)):
        parts = [
            p.get("text", "")
            for p in content
            if isinstance(p, Mapping)
            and p.get("type", "text") == "text"
            and isinstance(p.get("text"), str)
        ]
        return "".join(parts) if parts else None
    return None


def _swift_columns(df: pd.DataFrame, rep: ReadReport) -> pd.DataFrame:
    """Derive question / prediction / reference / image path from ms-swift records."""
    questions: list[str | None] = []
    preds: list[Any] = []
    last_assistant: list[str | None] = []
    for msgs in df["messages"].tolist():
        msgs = _parse_jsonish(msgs)
        if isinstance(msgs, np.ndarray):
            msgs = msgs.tolist()
        q = a = None
        if isinstance(msgs, list):
            for m in msgs:
                if not isinstance(m, Mapping):
                    continue
                if m.get("role") == "user":
                    q = _content_text(m.get("content"))
                elif m.get("role") == "assistant":
                    a = _content_text(m.get("content"))
        questions.append(q)
        last_assistant.append(a)
    out = df.copy()
    out["question"] = questions
    has_response = "response" in df.columns
    if has_response:
        resp = df["response"].tolist()
        preds = [r if not _is_missing(r) else a for r, a in zip(resp, last_assistant, strict=True)]
    else:
        preds = last_assistant
        rep.notes.append("ms-swift rows without 'response': prediction = last assistant turn")
    out["prediction"] = preds
    if "response" in out.columns:
        out = out.drop(columns=["response"])
    if "labels" in df.columns and "answer" not in df.columns:
        out = out.rename(columns={"labels": "reference"})
    elif has_response and not ({"answer", "reference"} & set(df.columns)):
        # the dataset row's assistant turn is the reference the model answered against
        out["reference"] = last_assistant
    if "images" in df.columns and "image_path" not in df.columns:
        out = out.rename(columns={"images": "image_path"})
    return out.drop(columns=["messages"])


# ----------------------------------------------------------------------------- canonical table


def _pick(columns: Iterable[str], name: str) -> str | None:
    cols = {c.lower(): c for c in columns if isinstance(c, str)}
    for alias in ALIASES[name]:
        if alias in cols:
            return cols[alias]
    return None


def _unwrap_formats(raw: pd.DataFrame, rep: ReadReport) -> tuple[pd.DataFrame, str | None]:
    """Tool and dataset formats (ms-swift, LLM judge, VinDr image objects, MedThinkVQA slots)
    turned into flat rows; returns them and the dataset name when the rows name it."""
    if "messages" in raw.columns:
        rep.format = f"{rep.format}:ms-swift"
        raw = _swift_columns(raw, rep)
    elif "eval_json" in raw.columns:
        rep.format = f"{rep.format}:llm-judge"
    nested = vindr_predictions.nested_item_column(raw)
    if nested is not None:
        raw, note = vindr_predictions.explode_items(raw, nested)
        rep.format = f"{rep.format}:vindr-nested"
        rep.notes.append(note)
        rep.loc_word = "image.item"
    slots = medthink_predictions.slot_columns(raw.columns)
    if not slots:
        return raw, None
    rep.format = f"{rep.format}:medthinkvqa"
    names = {c.lower() for c in raw.columns if isinstance(c, str)}
    raw, notes = medthink_predictions.medthink_columns(
        raw,
        slots,
        has_id=bool(names & (set(ALIASES["img_id"]) | set(ALIASES["sample"]))),
        has_question_id=bool(names & set(ALIASES["question_id"])),
        has_question=bool(names & set(ALIASES["question"])),
    )
    rep.notes.extend(notes)
    return raw, medthinkvqa.DATASET.name


def _columns(raw: pd.DataFrame, rep: ReadReport) -> dict[str, str | None]:
    """Canonical name -> the raw column holding it; an InputError naming the fix when a
    required one is missing."""
    cols = {name: _pick(raw.columns, name) for name in ALIASES}
    if cols["question"] is None and cols["question_id"] is not None:
        cols["question"] = cols["question_id"]  # an id-keyed MCQ set: the id stands for the text
        rep.notes.append("no question column: the question id stands for the question text")
    missing = [k for k in ("prediction", "question") if cols[k] is None]
    if not any(cols[k] for k in ("img_id", "image_path", "sample", "question_id")):
        missing.append("img_id")
    if missing:
        hints = "; ".join(
            f"{k} ({REQUIRED_HELP[k]}): one of {', '.join(ALIASES[k])}"
            + (" or an image path column" if k == "img_id" else "")
            for k in missing
        )
        raise InputError(
            f"{rep.source}: missing column(s) {', '.join(missing)}. Found columns "
            f"{sorted(str(c) for c in raw.columns if c != '_loc')[:15]}. Add or rename: {hints}."
        )
    if cols["reference"] is None:
        rep.notes.append("no reference-answer column; references must come from the other side")
    return cols


@dataclass
class _Rows:
    """A raw frame being canonicalised: its columns by canonical name and the rows dropped."""

    raw: pd.DataFrame
    cols: dict[str, str | None]
    rep: ReadReport
    locs: np.ndarray
    drop: np.ndarray

    @property
    def n(self) -> int:
        return len(self.raw)

    def col(self, name: str) -> np.ndarray:
        c = self.cols[name]
        if c is None:
            return np.full(self.n, None, dtype=object)
        return self.raw[c].to_numpy(dtype=object)

    def text(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return _text_column(self.col(name), self.rep, name)

    def drop_rows(self, mask: np.ndarray, reason: str) -> None:
        mask = mask & ~self.drop
        self.rep.drop(reason, self.locs[mask].tolist())
        self.drop[mask] = True

    def parsed(self, name: str, fn: Callable[[Any], Any], empty: Any) -> np.ndarray:
        if not self.cols[name]:
            return obj_array([empty] * self.n)
        values = self.col(name)
        return map_unique(values, fn) if _all_text(values) else obj_array([fn(v) for v in values])


def _drop_failed_inference(rows: _Rows, pred: np.ndarray) -> None:
    """Drop rows with an inference error and no answer (a judge's error keeps the row)."""
    if not rows.cols["error"]:
        return
    err = rows.col("error")
    failed = np.fromiter(
        (
            (isinstance(e, str) and bool(e.strip())) or (isinstance(e, dict) and bool(e))
            for e in err
        ),
        dtype=bool,
        count=rows.n,
    ) & pd.isna(pred)
    rep = rows.rep
    for i in np.flatnonzero(failed)[:3]:
        rep.drop_examples.setdefault("inference_error", []).append(
            f"{rep.source} {rep.loc_word} {rows.locs[i]}: {str(err[i])[:80]}"
        )
    failed &= ~rows.drop
    if failed.any():  # a zero count would read as a problem in the report
        rep.dropped["inference_error"] += int(failed.sum())
    rows.drop[failed] = True


def _image_ids(rows: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(img_id, first image path, every image path, img_id-not-given mask); rows without an
    id are dropped. Without an image id the sample is a study field (ReXVQA study_id /
    StudyInstanceUid), else the study or case the image paths name, else the question id
    (``_id_from_path``: this img_id names a sample, not a manifest image)."""
    raw_paths = rows.col("image_path")
    paths = (
        map_unique(raw_paths, _path_of)
        if _all_text(raw_paths)
        else obj_array([_path_of(v) for v in raw_paths])
    )
    img, bad_img = rows.text("img_id")
    img = map_unique(img, lambda i: i.strip() if isinstance(i, str) and i.strip() else None)
    no_id = pd.isna(img)
    if rows.cols["sample"] and no_id.any():
        vals, _ = rows.text("sample")
        img[no_id] = vals[no_id]
    still = pd.isna(img)
    if still.any():
        from_paths = raw_paths[still]
        img[still] = (
            map_unique(from_paths, sample_id_of_paths)
            if _all_text(from_paths)
            else obj_array([sample_id_of_paths(v) for v in from_paths])
        )
    still = pd.isna(img)
    if rows.cols["question_id"] and still.any():
        vals, _ = rows.text("question_id")
        img[still] = vals[still]
    rows.drop_rows(bad_img | pd.isna(img), "missing_img_id")
    all_paths = (
        obj_array([tuple(_paths_of(v)) for v in raw_paths])
        if rows.cols["image_path"]
        else obj_array([()] * rows.n)
    )
    return img, paths, all_paths, no_id


def _ref_boxes(rows: _Rows) -> np.ndarray:
    """Reference boxes per row (None where a cell holds none or a malformed one, counted)."""
    if not rows.cols["ref_boxes"]:
        return obj_array([None] * rows.n)
    bad_boxes = 0
    rb = []
    for v in rows.col("ref_boxes"):
        try:
            rb.append(boxes_of(v))
        except ValueError:
            rb.append(None)
            bad_boxes += 1
    if bad_boxes:
        rows.rep.coerced["ref_boxes:malformed_ignored"] += bad_boxes
    return obj_array(rb)


def _judge_scores(rows: _Rows) -> np.ndarray:
    """LLM-judge aspect scores per row (None without); an invalid score is an InputError."""
    if not rows.cols["judge"]:
        return obj_array([None] * rows.n)
    jl = []
    for i, v in enumerate(rows.col("judge")):
        d, bad = _judge_dict(v)
        if bad:
            raise InputError(
                f"{rows.rep.source}: row {i + 1}: LLM-judge score {', '.join(bad)} in eval_json "
                "is not a number in [0, 1]; fix or drop that row (scores are 0/1, or a fraction)"
            )
        jl.append(d)
    no_judge = int(sum(1 for d in jl if d is None))
    if no_judge:
        rows.rep.notes.append(f"{no_judge} rows without usable eval_json scores (judge metric n/a)")
    return obj_array(jl)


def _precomputed_scores(rows: _Rows) -> dict[str, np.ndarray]:
    """Confidence and precomputed BLEURT / BERTScore columns as floats (NaN where missing)."""
    out = {"confidence": np.full(rows.n, np.nan)}
    if rows.cols["confidence"]:
        from perturb.score.calibration import confidence_column

        out["confidence"] = confidence_column(rows.col("confidence"), rows.rep.source, rows.locs)
    for name in ("bleurt", "bertscore"):
        values = rows.col(name)
        v = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        bad = v.isna().to_numpy() & ~pd.isna(values)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"{rows.rep.source}: row {rows.locs[first]}: {name} value "
                f"{values[first]!r} is not a number"
            )
        out[name] = v.to_numpy(dtype=np.float64, na_value=np.nan)
    return out


def _question_ids(
    rows: _Rows, question: np.ndarray, img: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(pairing key, the dataset's own question identity): question id (ReXVQA key,
    MedThinkVQA case), else image id + item index (VinDr-CXR-VQA)."""
    qk = map_unique(question, lambda q: question_key(q) if q is not None else None)
    qid = np.full(rows.n, None, dtype=object)
    if rows.cols["question_id"]:
        qid, _ = rows.text("question_id")
        has_qid = ~pd.isna(qid)
        qk[has_qid] = obj_array([f"id:{q}" for q in qid[has_qid]])
    elif rows.cols["qa_idx"] and rows.cols["img_id"]:
        idx, bad_idx = _int_column(rows.col("qa_idx"))
        ok_idx = ~np.isnan(idx) & ~bad_idx & ~pd.isna(img)
        qid[ok_idx] = obj_array(
            [f"{i}#{int(k)}" for i, k in zip(img[ok_idx], idx[ok_idx], strict=True)]
        )
    return qk, qid


def canonicalize(raw: pd.DataFrame, rep: ReadReport, model: str | None = None) -> pd.DataFrame:
    """Map a raw frame onto the canonical columns, coercing values and dropping unusable rows."""
    raw, dataset = _unwrap_formats(raw, rep)
    n = len(raw)
    rep.rows_in = n
    if n == 0:
        raise InputError(f"{rep.source}: no rows. Point to a file that holds predictions.")
    locs = raw["_loc"].to_numpy() if "_loc" in raw.columns else np.arange(1, n + 1)
    rows = _Rows(raw, _columns(raw, rep), rep, locs, np.zeros(n, dtype=bool))

    pred, bad_pred = rows.text("prediction")
    rows.drop_rows(bad_pred, "invalid_prediction_type")
    _drop_failed_inference(rows, pred)
    ref, bad_ref = rows.text("reference")
    rows.drop_rows(bad_ref, "invalid_reference_type")
    question, bad_q = rows.text("question")
    q_missing = map_unique(question, lambda q: q is None or not q.strip()).astype(bool)
    rows.drop_rows(bad_q | q_missing, "missing_question")
    img, paths, all_paths, no_id = _image_ids(rows)

    sev, bad_sev = _int_column(rows.col("severity"))
    rows.drop_rows(bad_sev, "invalid_severity")
    var, bad_var = _int_column(rows.col("variant"))
    rows.drop_rows(bad_var, "invalid_variant")
    var = _variants_from_paths(var, paths, rep)
    comp, bad_comp = _int_column(rows.col("complexity"))
    if bad_comp.any():
        rep.coerced["complexity:invalid_to_missing"] += int(bad_comp.sum())
    pert, bad_pert = rows.text("perturbation")
    rows.drop_rows(bad_pert, "invalid_perturbation")
    mdl, _ = rows.text("model")
    if model is not None:
        mdl = np.full(n, model, dtype=object)

    qclass = rows.parsed("question_class", _class_tuple, ())
    options = rows.parsed("options", _options_dict, None)
    ref_boxes = _ref_boxes(rows)
    if _is_radiology(rows, dataset, ref):
        qclass = _radiology_classes(qclass, question, options, rows, dataset)
    judge = _judge_scores(rows)
    scores = _precomputed_scores(rows)
    qk, qid = _question_ids(rows, question, img)
    keep = ~rows.drop
    out = object_frame(
        {
            "img_id": img[keep],
            "question": question[keep],
            "qkey": qk[keep],
            "qid": qid[keep],
            "reference": ref[keep],
            "prediction": pred[keep],
            "complexity": pd.array(comp[keep], dtype="Int64") if n else comp,
            "question_class": qclass[keep],
            "options": options[keep],
            "perturbation": pert[keep],
            "severity": pd.array(sev[keep], dtype="Int64"),
            "variant": pd.array(var[keep], dtype="Int64"),
            "image_path": paths[keep],
            "_paths": all_paths[keep],
            "judge": judge[keep],
            "model": mdl[keep],
            "ref_boxes": ref_boxes[keep],
            "confidence": scores["confidence"][keep],
            "bleurt": scores["bleurt"][keep],
            "bertscore": scores["bertscore"][keep],
            "_loc": locs[keep],
            "_id_from_path": no_id[keep],
        }
    )
    rep.rows_kept = len(out)
    return out.reset_index(drop=True)


# the classes an MCQ's option texts may add: places an answer names (sides, regions)
OPTION_PLACE_CLASSES = frozenset({"laterality", "location", "apex", "costophrenic"})

# upstream's track-2 layout (and perturb's): ``.../variant_<k>/<img_id>.jpg``
_VARIANT_DIR = re.compile(r"^variant[_-]?(\d+)$", re.IGNORECASE)


def variant_of_path(path: Any) -> int | None:
    """The variant a ``variant_<k>/`` folder in an image path names (the last such folder),
    else None."""
    if not isinstance(path, str) or not path:
        return None
    for part in reversed(_posix(path).parts[:-1]):
        m = _VARIANT_DIR.match(part)
        if m:
            return int(m.group(1))
    return None


def _variants_from_paths(var: np.ndarray, paths: np.ndarray, rep: ReadReport) -> np.ndarray:
    """Fill missing variants from ``variant_<k>/`` folders of the image paths (counted)."""
    missing = np.isnan(var)
    if not missing.any():
        return var
    found = map_unique(paths[missing], variant_of_path)
    got = ~pd.isna(found)
    if got.any():
        var = var.copy()
        idx = np.flatnonzero(missing)[got]
        var[idx] = found[got].astype(np.float64)
        rep.coerced["variant:from_variant_folder"] += int(got.sum())
    return var


def _is_radiology(rows: _Rows, dataset: str | None, ref: np.ndarray) -> bool:
    """Radiology rows (their question classes come from the radiology rules): a dataset named
    by the format, a radiology hint column, or references with ``<loc_...>`` tags."""
    if dataset is not None or any(rows.cols[h] for h in RADIOLOGY_HINTS):
        return True
    if not rows.cols["reference"]:
        return False
    return bool(map_unique(ref, lambda r: isinstance(r, str) and "<loc_" in r).any())


def _radiology_classes(
    qclass: np.ndarray,
    question: np.ndarray,
    options: np.ndarray,
    rows: _Rows,
    dataset: str | None,
) -> np.ndarray:
    """Rows without question_class get radiology classes (:mod:`perturb.datasets.questions`)
    from the dataset's fields (VinDr ``type``, ReXVQA ``task_name``/``category``) and keyword
    rules on the question. An MCQ's options add only the place classes
    (:data:`OPTION_PLACE_CLASSES`: a flip or crop changes an answer that names a side or
    region); a finding word inside an option ("Nodule") says what the answers are, not what
    the question asks, and puts no pair at risk."""
    need = np.fromiter((not c for c in qclass), dtype=bool, count=len(qclass))
    if not need.any():
        return qclass

    def text(name: str) -> np.ndarray:
        vals = rows.col(name)
        return obj_array([v if isinstance(v, str) else None for v in vals])

    vt, tn, cat = text("vindr_type"), text("task_name"), text("category")
    out = qclass.copy()
    cache: dict[tuple[Any, ...], tuple[str, ...]] = {}
    for i in np.flatnonzero(need):
        opts = options[i]
        key = (question[i], vt[i], tn[i], cat[i], tuple(opts.values()) if opts else None)
        got = cache.get(key)
        if got is None:
            got = question_classes(
                question[i],
                vindr_type=vt[i],
                task_name=tn[i],
                category=cat[i],
                dataset=dataset,
            )
            if opts:  # options add only the places an answer names, never their findings
                placed = set(got) | (set(question_classes(options=opts)) & OPTION_PLACE_CLASSES)
                got = tuple(c for c in RADIOLOGY_CLASSES if c in placed)
            cache[key] = got
        out[i] = got
    cols = rows.cols
    rows.rep.notes.append(
        f"{int(need.sum())} rows without question_class: radiology classes from "
        + ", ".join(
            [f"{cols[h]!r}" for h in ("vindr_type", "task_name", "category") if cols[h]]
            + [
                "keyword rules on the question, and the places named by the options "
                "(perturb.datasets.radiology)"
            ]
        )
    )
    return out


def read_predictions(
    source: PredictionSource, label: str | None = None, model: str | None = None
) -> tuple[pd.DataFrame, ReadReport]:
    """Read predictions from a path, DataFrame or list of dicts into the canonical table."""
    raw, fmt, label = load_raw(source, label)
    rep = ReadReport(source=label, format=fmt, loc_word="line" if fmt == "jsonl" else "row")
    if len(raw) == 0:
        raise InputError(f"{label}: no rows. Point to a file that holds predictions.")
    return canonicalize(raw, rep, model=model), rep
