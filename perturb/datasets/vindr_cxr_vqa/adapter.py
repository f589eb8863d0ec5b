"""VinDr-CXR-VQA (HF ``Dangindev/VinDR-CXR-VQA``): JSON per image, images supplied separately.

Upstream schema: one object per image, ``{"image_id", "num_questions", <list of items>}``, each
item ``{"question", "answer", "reason", "type", "difficulty", "gt_finding", "gt_location"}``
with ``type`` one of Where/What/Is_there/How_many/Which/Yes_No; answers (and reasons) hold
``<loc_x1_y1_x2_y2>`` tags and ``gt_location`` is such a tag (or empty), in the original VinDr-CXR
DICOM pixels. The source may be a folder of per-image ``.json`` files, one JSON file holding a
list of the objects, a JSON Lines file, or the hub id (downloaded with ``huggingface_hub``).

Images come from VinDr-CXR (PhysioNet) and are converted from DICOM by the user: ``images`` is a
folder searched recursively for ``<image_id>.png`` (or .jpg/.tif). Boxes are in original pixels:
keep the images at their DICOM size, or give the original size per image as ``width`` /
``height`` in the JSON objects (then the images may be resized copies).

Box coordinate space: the image object's ``width`` / ``height`` when given (the original
DICOM size), else the supplied image's own size (read from its header). A box that reaches
outside that frame is an error naming the fix (give ``width`` / ``height``), never clamped.

One row per question: ``img_id`` = ``sample_key`` = image_id, ``view`` 0, ``n_views`` 1,
``modality`` xray, the item's fields, ``orig_width`` / ``orig_height`` and ``image_path``.
Geometric ops rewrite the loc tags of ``answer``, ``reason`` and ``gt_location`` in the output
dataset (see ``perturb.generate.annotate``); photometric ops leave them as they are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from perturb.contracts.boxes import parse_loc_tags
from perturb.datasets._adapter import (
    IMAGE_PATH,
    IMAGE_SUFFIXES,
    MODALITY,
    build_input,
    check_found,
    image_root,
    kept_fields,
    locate,
    pick_files,
    sample_columns,
)
from perturb.datasets.vindr_cxr_vqa import HUB_ID
from perturb.io.datasets import Annotations, DatasetError, InputDataset

LOC_COLUMNS = ("answer", "reason", "gt_location")
ITEM_KEYS = ("items", "vqa", "qa_pairs", "questions")
# the fields that hold the answer: the scorer's reference, never part of a prompt (every other
# text field of the adapter's rows is free of the answer: tests/io/test_adapter_leaks.py)
ANSWER_FIELDS = ("answer", "reason", "gt_finding", "gt_location")


def _objects(path: Path) -> list[dict[str, Any]]:
    """The per-image objects of one .json / .jsonl file."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() == ".jsonl":
            data: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable JSON file: {exc}") from None
    if isinstance(data, dict) and "image_id" not in data:
        nested = [v for v in data.values() if isinstance(v, list)]
        data = nested[0] if len(nested) == 1 else data
    objects = data if isinstance(data, list) else [data]
    for obj in objects:
        if not isinstance(obj, dict) or "image_id" not in obj:
            raise DatasetError(
                f"{path}: not in the VinDr-CXR-VQA schema: expected objects with 'image_id' and a "
                f"list of question items (got {type(obj).__name__} with keys "
                f"{sorted(obj)[:8] if isinstance(obj, dict) else '-'})"
            )
    return objects


def _items(obj: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    for key in ITEM_KEYS:
        if isinstance(obj.get(key), list):
            return list(obj[key])
    lists = [v for v in obj.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
    if len(lists) == 1 and "question" in lists[0][0]:
        return list(lists[0])
    raise DatasetError(
        f"{path}: image {obj['image_id']!r} has no list of question items "
        f"(expected one of {', '.join(ITEM_KEYS)} with question/answer objects)"
    )


def _index_images(root: Path) -> dict[str, Path]:
    """Image files under ``root`` by stem (the first in sorted order wins)."""
    index: dict[str, Path] = {}
    for p in sorted(root.rglob("*")):
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file():
            index.setdefault(p.stem, p.resolve())
    return index


BOX_TOLERANCE = 1.0  # pixels a box may reach past the frame (rounding in the source)


def image_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of an image file from its header, None when unreadable."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return int(im.size[0]), int(im.size[1])
    except (OSError, ValueError):
        return None


def check_box_space(obj: dict[str, Any], image: Path | None, path: Path) -> None:
    """Refuse boxes outside their declared frame (see the module docstring)."""
    declared = obj.get("width"), obj.get("height")
    if declared[0] and declared[1]:
        size, space = (float(declared[0]), float(declared[1])), "the declared width x height"
    else:
        got = image_size(image) if image is not None else None
        if image is None or got is None:
            return
        size, space = (float(got[0]), float(got[1])), f"the image {image.name}'s own size"
    for item in _items(obj, path):
        if not isinstance(item, dict):
            continue
        for column in LOC_COLUMNS:
            text = item.get(column)
            for box in parse_loc_tags(text) if isinstance(text, str) else []:
                x1, y1, x2, y2 = box
                if max(x1, x2) > size[0] + BOX_TOLERANCE or max(y1, y2) > size[1] + BOX_TOLERANCE:
                    raise DatasetError(
                        f"{path}: image {obj['image_id']!r}: box <loc_{x1:g}_{y1:g}_{x2:g}_{y2:g}> in "
                        f"{column!r} lies outside {space} ({size[0]:g} x {size[1]:g}): the boxes "
                        "are in the original DICOM pixels. Set the original size per image "
                        "('width' and 'height' in its JSON object; the PNG may then be a resized "
                        "copy) or supply the PNGs at the DICOM size."
                    )


def open_vindr(
    source: str | os.PathLike[str] | None = None,
    *,
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    min_visible: float = 0.5,
    keep_leaking_fields: bool = False,
) -> InputDataset:
    """Open VinDr-CXR-VQA (``source``: hub id, folder or file; ``images``: the PNG folder).
    ``keep_leaking_fields`` is accepted for a uniform API: no field here gives answers away
    beyond the QA pair itself."""
    del keep_leaking_fields
    located = locate(source, HUB_ID, ["*.json", "*.jsonl", "**/*.json", "**/*.jsonl"])
    label = str(source or HUB_ID)
    files = pick_files(located, (".json", ".jsonl"), split, label)
    root = image_root(images, None, label)
    index = _index_images(root)
    rows: list[dict[str, Any]] = []
    wanted: list[Path] = []
    for path in files:
        for obj in _objects(path):
            image_id = str(obj["image_id"])
            image = index.get(image_id)
            target = image if image is not None else (root / f"{image_id}.png")
            wanted.append(target)
            check_box_space(obj, image, path)
            for qa_idx, item in enumerate(_items(obj, path)):
                if not isinstance(item, dict) or "question" not in item:
                    raise DatasetError(
                        f"{path}: image {image_id!r} item {qa_idx} is not a question object"
                    )
                row = kept_fields(item)
                row.update(
                    {
                        **sample_columns(image_id, image_id, 0, 1),
                        MODALITY: "xray",
                        "qa_idx": qa_idx,
                        "orig_width": obj.get("width"),
                        "orig_height": obj.get("height"),
                        IMAGE_PATH: str(target),
                    }
                )
                for column in LOC_COLUMNS:
                    row.setdefault(column, "")
                rows.append(row)
    if not any(p.is_file() for p in wanted) and any(
        p.suffix.lower() in (".dcm", ".dicom") for p in root.rglob("*")
    ):
        raise DatasetError(
            f"{label}: {root} holds DICOM files but no PNGs: convert them to 16-bit PNG named "
            "<image_id>.png (keeping the DICOM size, so boxes stay in place) and pass that folder"
        )
    check_found(wanted, root, label)
    return build_input(
        rows,
        label=label,
        fingerprint=f"vindr-cxr-vqa:{Path(located).resolve()}:{split}:{root.resolve()}",
        base_dir=root,
        annotations=Annotations(LOC_COLUMNS, "orig_width", "orig_height", min_visible),
    )
