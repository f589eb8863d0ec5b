"""Build the labelled radiograph annotation set (run from the repository root):

    PERTURB_SAMPLES_DIR=/work/shared/samples python tests/data/xray_labels/build_labels.py

Per film: the real annotations a person marked (``REAL_BOXES``: boxes checked by eye on the
films; the label inside a box is its bright ink, the pixels above the box's Otsu threshold),
plus synthetic annotations burned in with OpenCV fonts (exact masks: ``burn``). The tuning
split uses the HERSHEY SIMPLEX/DUPLEX fonts, the held-back split other fonts (TRIPLEX, COMPLEX,
PLAIN) on the five films shipped in tests/data/xray, never looked at while tuning the constants
of ``perturb.scene.radiograph`` on their burned versions. Writes ``labels.json`` and one
``<film>.png`` label mask (0/255) per film.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from annotation_labels import REAL_BOXES, burned, film_path, real_label, synthetic_specs  # noqa: E402


def main() -> None:
    items = []
    for name, split in [(n, s) for n, (s, _) in REAL_BOXES.items()]:
        path = film_path(name)
        if path is None:
            print(f"skip {name}: film not found")
            continue
        film = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        gray = film if film.ndim == 2 else cv2.cvtColor(film, cv2.COLOR_BGRA2GRAY)
        specs = synthetic_specs(name, gray, split)
        image, synth = burned(gray, specs)
        label = real_label(image, REAL_BOXES[name][1], specs) | synth
        cv2.imwrite(str(HERE / f"{Path(name).stem}.png"), label.astype(np.uint8) * 255)
        items.append({"film": name, "split": split, "synthetic": specs})
        print(name, split, int(label.sum()), len(specs))
    (HERE / "labels.json").write_text(json.dumps({"items": items}, indent=1) + "\n")


if __name__ == "__main__":
    main()
