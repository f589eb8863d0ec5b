"""VinDr-CXR-VQA written back in its own format: ``{op}_s{severity}_v{variant}.json`` =
``[{"image_id", "image_path", "num_questions", "vqa": [items with the moved answer / reason /
gt_location]}]``."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from perturb.datasets._native import generated_rows, own_fields, split_name, write_text


def write_vindr(
    out: Path,
    dest: Path,
    *,
    source: str | os.PathLike[str] | None = None,
    images: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """VinDr-CXR-VQA files (see the module docstring); ``source`` and ``images`` are not
    needed."""
    del source, images
    groups: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in generated_rows(out):
        groups[split_name(row["op"], row["severity"], row["variant"])][row["img_id"]].append(row)
    files = []
    for name, by_image in sorted(groups.items()):
        objects = []
        for image_id, items in by_image.items():
            items.sort(key=lambda r: r["qa_idx"])
            obj: dict[str, Any] = {
                "image_id": image_id,
                "image_path": str((out / items[0]["path"]).resolve()),
                "num_questions": len(items),
                "vqa": [own_fields(r) for r in items],
            }
            if items[0].get("orig_width") and items[0].get("orig_height"):
                obj["width"], obj["height"] = items[0]["orig_width"], items[0]["orig_height"]
            objects.append(obj)
        files.append(write_text(dest / f"{name}.json", json.dumps(objects, indent=1)))
    return files
