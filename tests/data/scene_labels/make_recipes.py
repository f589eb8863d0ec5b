"""Writes the synthetic part of ``labels.json``: recipes of burned-in text drawn over real frames
(run once; the stored recipes are the data, this script only documents how they were drawn).

    PERTURB_SAMPLES_DIR=/path/to/samples python tests/data/scene_labels/make_recipes.py

Text as an endoscopy video processor burns it in: timestamps, patient data, scope settings and
progress bars, light or dark flat ink, 1-3.5% of the shorter side tall, anywhere inside the field,
single lines or left-aligned blocks, some with a 1 px outline, JPEG-stored afterwards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import perturb  # noqa: E402
from tests.scene.frames import frames  # noqa: E402
from tests.scene.labels import FONTS, LABEL_DIR, render  # noqa: E402

TEXTS = [
    "17/02/2014", "14:24:00", "CVP:8", "Q:N", "Eh:A1", "Cm:1", "Ee:A5", "2020.11.15",
    "13:32:30", "<00:05:02>", "ID:004213", "Name:", "Sex:M Age:63", "D.O.B.:04/07/1951",
    "Comment:", "x1.5", "AGC:N", "IRIS:A", "ENH:B8", "00:36:55", "15/03/2012", "(0/1)", "NBI",
]
LIGHT = [(250, 250, 250), (235, 235, 235), (210, 210, 215), (245, 235, 90), (120, 240, 120), (120, 225, 245)]
DARK = [(10, 10, 10), (25, 30, 110), (40, 40, 40)]
PER_FRAME = {"held_back": 4, "tuning": 2}


def recipe(gen: np.random.Generator, name: str, idx: int, field: np.ndarray) -> dict:
    h, w = field.shape
    short = min(h, w)
    dark = gen.random() < 0.3
    ink = list(DARK[gen.integers(len(DARK))] if dark else LIGHT[gen.integers(len(LIGHT))])
    outline = bool(gen.random() < 0.4)
    cap = float(max(gen.uniform(0.013, 0.035), 10.5 / short))
    lines_n = int(gen.choice([1, 1, 2, 3, 4]))
    font = str(gen.choice(list(FONTS)))
    weight, aa = float(gen.uniform(0.08, 0.16)), bool(gen.random() < 0.5)
    for _ in range(200):
        x, y = float(gen.uniform(0.05, 0.8)), float(gen.uniform(0.08, 0.9))
        lines = []
        for i in range(lines_n):
            text = " ".join(str(t) for t in gen.choice(TEXTS, size=int(gen.integers(1, 3)), replace=False))
            line = {
                "text": text, "x": x, "y": y + i * 1.7 * cap * short / h, "cap": cap,
                "font": font, "weight": weight, "aa": aa, "ink": ink, "outline": outline,
                "outline_ink": [230, 230, 230] if dark else [15, 15, 15],
            }
            if gen.random() < 0.15:
                line["cells"] = int(gen.integers(3, 7))
            lines.append(line)
        r = {"id": f"{Path(name).stem}_syn{idx}", "frame": name, "lines": lines,
             "jpeg": int(gen.integers(85, 96))}
        _, mask = render(np.zeros((h, w, 3), np.uint8), np.zeros((h, w), bool), r)
        if mask.any() and (field[mask] >= 0.99).mean() >= 0.98:
            return r
    raise RuntimeError(f"no place for text inside the field of {name}")


def main() -> None:
    table = json.loads((LABEL_DIR / "labels.json").read_text())
    gen = np.random.default_rng(2929)
    available = dict(frames())
    synthetic = []
    for part in ("tuning", "held_back"):
        for name in sorted(table["split"][part]):
            if name not in available or name in table.get("no_synthetic", []):
                continue
            field = perturb.scene(available[name]).field
            for i in range(PER_FRAME[part]):
                synthetic.append(recipe(gen, name, i, field))
    # the hard recipes of the tuning part (make_hard_recipes.py) stay as they are
    table["synthetic"] = synthetic + [r for r in table["synthetic"] if "_hard" in r["id"]]
    (LABEL_DIR / "labels.json").write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
