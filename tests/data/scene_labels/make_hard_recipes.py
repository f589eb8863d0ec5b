"""Adds the hard synthetic recipes of the tuning part to ``labels.json`` (ids ``<frame>_hard<i>``):
the cases the first search missed, drawn over the tuning frames only (the held-back part keeps
its recipes and is never tuned on). Run once; the stored recipes are the data.

    PERTURB_SAMPLES_DIR=/path/to/samples python tests/data/scene_labels/make_hard_recipes.py

Four kinds, one of each per tuning frame:

- ``bold``: heavy strokes (weight 0.2-0.3 of the cap height) whose characters touch;
- ``bright``: light ink over the brightest tissue of the frame (luma of the tissue under the
  line at least 150 where the frame has such tissue);
- ``short``: one line of three or four characters ("NBI", "x1.5", "Q:N"), alone;
- ``small``: a cap height of 7-10 px at the frame's resolution.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import perturb  # noqa: E402
from tests.scene.frames import frames  # noqa: E402
from tests.scene.labels import FONTS, LABEL_DIR, render  # noqa: E402

TEXTS = [
    "17/02/2014", "14:24:00", "CVP:8", "Q:N", "Eh:A1", "Cm:1", "Ee:A5", "2020.11.15",
    "13:32:30", "<00:05:02>", "ID:004213", "Name:", "Sex:M Age:63", "AGC:N", "IRIS:A",
    "ENH:B8", "00:36:55", "15/03/2012", "(0/1)", "Comment:",
]
SHORT = ["NBI", "x1.5", "Q:N", "AGC", "Cm:1", "A1:5", "WLI", "x2.0", "FRZ", "REC"]
LIGHT = [(250, 250, 250), (235, 235, 235), (220, 220, 225), (245, 235, 90), (120, 240, 120)]
DARK = [(10, 10, 10), (25, 30, 110), (40, 40, 40)]
KINDS = ("bold", "bright", "short", "small")


def _placement_ok(mask: np.ndarray, field: np.ndarray) -> bool:
    return bool(mask.any()) and float((field[mask] >= 0.99).mean()) >= 0.98


def recipe(
    gen: np.random.Generator, name: str, kind: str, idx: int, image: np.ndarray, field: np.ndarray
) -> dict:
    h, w = field.shape
    short = min(h, w)
    luma = cv2.blur(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), (15, 15))
    dark = kind in ("bold", "short", "small") and gen.random() < 0.25
    ink = list(DARK[gen.integers(len(DARK))] if dark else LIGHT[gen.integers(len(LIGHT))])
    outline = bool(kind != "bright" and gen.random() < 0.3)
    cap = float(gen.uniform(0.014, 0.032))
    weight = float(gen.uniform(0.08, 0.16))
    font = str(gen.choice(list(FONTS)))
    lines_n = int(gen.choice([1, 2, 3]))
    if kind == "bold":
        weight, font = float(gen.uniform(0.2, 0.3)), str(gen.choice(["simplex", "duplex"]))
    elif kind == "short":
        lines_n = 1
    elif kind == "small":
        cap = float(gen.uniform(7.0, 10.0)) / short
        weight = float(gen.uniform(0.1, 0.16))
    aa = bool(gen.random() < 0.5)
    best: tuple[float, dict] | None = None
    for _ in range(300):
        x, y = float(gen.uniform(0.05, 0.8)), float(gen.uniform(0.08, 0.9))
        lines = []
        for i in range(lines_n):
            if kind == "short":
                text = str(gen.choice(SHORT))
            else:
                text = " ".join(str(t) for t in gen.choice(TEXTS, size=int(gen.integers(1, 3)), replace=False))
            lines.append({
                "text": text, "x": x, "y": y + i * 1.7 * cap * short / h, "cap": cap,
                "font": font, "weight": weight, "aa": aa, "ink": ink, "outline": outline,
                "outline_ink": [230, 230, 230] if dark else [15, 15, 15],
            })
        r = {"id": f"{Path(name).stem}_hard{idx}", "frame": name, "kind": kind, "lines": lines,
             "jpeg": int(gen.integers(85, 96))}
        _, mask = render(np.zeros((h, w, 3), np.uint8), np.zeros((h, w), bool), r)
        if not _placement_ok(mask, field):
            continue
        if kind != "bright":
            return r
        under = float(np.median(luma[mask]))
        if under >= 150:
            return r
        if best is None or under > best[0]:
            best = (under, r)
    if best is not None:
        return best[1]
    raise RuntimeError(f"no place for text inside the field of {name}")


def main() -> None:
    table = json.loads((LABEL_DIR / "labels.json").read_text())
    gen = np.random.default_rng(2930)
    available = dict(frames())
    kept = [r for r in table["synthetic"] if "_hard" not in r["id"]]
    hard = []
    for name in sorted(table["split"]["tuning"]):
        if name not in available:
            continue
        image = available[name]
        field = perturb.scene(image).field
        for i, kind in enumerate(KINDS):
            hard.append(recipe(gen, name, kind, i, image, field))
    table["synthetic"] = kept + hard
    (LABEL_DIR / "labels.json").write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
