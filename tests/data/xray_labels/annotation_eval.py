"""Precision and recall of ``perturb.scene.radiograph`` on the labelled set (one split)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from annotation_labels import burned, read_gray  # noqa: E402

RIM = 2  # px: a detected pixel this close to a labelled one is its anti-aliased rim, not false


def evaluate(split: str) -> dict[str, Any]:
    """Per film and pooled: recall of labelled pixels, precision, false area (detected pixels
    farther than ``RIM`` from any label, fraction of the image). Films not found are skipped."""
    from perturb.scene import radiograph

    items = json.loads((HERE / "labels.json").read_text())["items"]
    rows, hit, total, false, area, found = [], 0, 0, 0, 0, 0
    for item in items:
        if item["split"] != split:
            continue
        gray = read_gray(item["film"])
        if gray is None:
            continue
        image, _ = burned(gray, item["synthetic"])
        label = cv2.imread(str(HERE / (Path(item["film"]).stem + ".png")), 0) > 0
        det = radiograph.mask_of(radiograph.analyse(image))
        near = cv2.dilate(label.astype(np.uint8), np.ones((2 * RIM + 1,) * 2, np.uint8)) > 0
        row = {
            "film": item["film"],
            "recall": float((det & label).sum() / max(1, label.sum())),
            "false_area": float((det & ~near).sum() / det.size),
        }
        rows.append(row)
        hit += int((det & label).sum())
        total += int(label.sum())
        false += int((det & ~near).sum())
        found += int(det.sum())
        area += det.size
    return {
        "split": split,
        "films": len(rows),
        "recall": hit / max(1, total),
        "precision": (found - false) / max(1, found),
        "false_area": false / max(1, area),
        "worst_false_area": max((r["false_area"] for r in rows), default=0.0),
        "rows": rows,
    }


if __name__ == "__main__":
    for split in sys.argv[1:] or ["tune"]:
        res = evaluate(split)
        for r in res["rows"]:
            print(f"  {r['film']:28s} recall {r['recall']:.3f} false {100 * r['false_area']:.3f}%")
        print({k: v for k, v in res.items() if k != "rows"})
