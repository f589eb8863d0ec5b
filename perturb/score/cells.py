"""One cell of a prediction table read as a value: text, integers, question classes, options,
judge scores, image paths, sample ids, reference boxes, question keys, variants.

Pure functions of a cell (no table, no report); :mod:`perturb.score.canonical` applies them to
columns and counts what they could not read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import pandas as pd

from perturb.contracts.boxes import parse_loc_tags, sort_corners
from perturb.datasets.radiology import image_path_parts, sample_of_image_paths

_IMAGE_TAG = re.compile(r"<image>", re.IGNORECASE)


_WS = re.compile(r"\s+")


def is_missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return v is pd.NA or v is pd.NaT


def as_text(v: Any) -> tuple[str | None, str | None]:
    """Text value of a cell: (text, coercion-kind) or (None, None/'invalid')."""
    if isinstance(v, str):
        return v, None
    if is_missing(v):
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


def int_column(values: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        if is_missing(v):
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


def parse_jsonish(v: Any) -> Any:
    if isinstance(v, str):
        s = v.strip()
        if s[:1] in "[{":
            try:
                return json.loads(s)
            except json.JSONDecodeError:
                return v
    return v


def class_tuple(v: Any) -> tuple[str, ...]:
    v = parse_jsonish(v)
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, str):
        parts = [p.strip() for p in re.split(r"[;,|]", v)]
        return tuple(p for p in parts if p)
    if isinstance(v, (list, tuple)):
        return tuple(str(x).strip() for x in v if isinstance(x, str) and x.strip())
    return ()


_LETTERS = "ABCDEFGHIJ"


def options_dict(v: Any) -> dict[str, str] | None:
    v = parse_jsonish(v)
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, Mapping):
        out = {}
        for k, t in v.items():
            if isinstance(k, str) and k.strip().upper()[:1] in _LETTERS and not is_missing(t):
                out[k.strip().upper()[:1]] = str(t)
        return out or None
    if isinstance(v, (list, tuple)):
        out = {}
        for i, t in enumerate(v[: len(_LETTERS)]):
            if is_missing(t):
                continue
            s = str(t)
            m = re.match(r"^\s*\(?([A-Ja-j])[\).:]\s*(.*)$", s)
            if m:
                out[m.group(1).upper()] = m.group(2)
            else:
                out[_LETTERS[i]] = s
        return out or None
    return None


def judge_dict(v: Any) -> tuple[dict[str, float] | None, list[str]]:
    """Aspect scores from an ``eval_json`` cell: (scores or None, the invalid aspect scores).

    A score is a number in [0, 1] (``"1"`` and ``true`` count as 1); a null score means "not
    scored"; anything else (5, -1, "yes") is invalid and named in the second value.
    """
    v = parse_jsonish(v)
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


def path_of(v: Any) -> str | None:
    """Image path from a cell: str, {"path": ...}, or a list of those (first one)."""
    v = parse_jsonish(v) if isinstance(v, str) and v.strip()[:1] == "[" else v
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        v = v[0] if len(v) else None
    if isinstance(v, Mapping):
        v = v.get("path")
    return v if isinstance(v, str) and v.strip() else None


def paths_of(v: Any) -> list[str]:
    """Every image path of a cell: str, {"path": ...}, or a list of those."""
    v = parse_jsonish(v) if isinstance(v, str) and v.strip()[:1] == "[" else v
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
    generate`` wrote from them (any output folder and layout): a radiology study or case
    (:func:`perturb.datasets.radiology.sample_of_image_paths`: ``studies/<uid>``, ``caseN``); else
    each image's file stem (an encoded generated name decoded), several joined sorted with
    ``|``. Not their common folder: the outputs of one sample sit in the layout's folders
    (``{op}/s{severity}/``), not the dataset's, so a folder would never pair clean and perturbed
    rows. ``perturb generate`` refuses stems that name two files, so within a split the stems
    name the sample; rows of two samples with the same stems and question are reported as
    duplicates by the pairing, never merged silently."""
    paths = paths_of(v)
    if not paths:
        return None
    sample = sample_of_image_paths(paths)
    if sample is not None:
        return sample
    stems = sorted({image_stem(names[-1]) for p in paths if (names := image_path_parts(p))})
    return "|".join(stems) if stems else None


def _num(v: Any) -> float | None:
    if isinstance(v, (bool, np.bool_)) or is_missing(v):
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
        v = parse_jsonish(v)
        if isinstance(v, str):
            if v.strip():
                raise ValueError(f"not a box: {v[:40]!r}")
            return None
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple, Mapping)) and is_missing(v):
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
