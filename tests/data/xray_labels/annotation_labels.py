"""The labelled radiograph annotation set: real boxes marked by eye, synthetic burned-in text
and markers with exact masks. Used by ``build_labels.py`` and ``tests/scene/test_annotation_layer.py``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parent / "xray"

# film -> (split, real annotation boxes [x0, y0, x1, y1] marked by eye on the 8-bit film:
# lead markers with their initials, burned-in "AP"/"PORTABLE"/"SUPINE", an arrow, a circled
# "R" with its caption). Held-back: the five films shipped in tests/data/xray.
REAL_BOXES: dict[str, tuple[str, list[list[int]]]] = {
    "mhh_covid_48c4542c.png": ("tune", [[486, 46, 495, 60]]),
    "mhh_covid_4c0fcf57.png": ("tune", [[36, 2, 150, 50]]),
    "mhh_covid_9f3f2d91.png": ("tune", [[600, 0, 640, 40]]),
    "mhh_covid_f6d980a0.png": ("tune", [[490, 35, 500, 49]]),
    "nih_00000284_000.png": ("tune", [[918, 95, 940, 115]]),
    "nih_00000493_000.png": ("tune", [[887, 102, 917, 154]]),
    "nih_00001369_000.png": ("tune", [[973, 171, 1004, 208]]),
    "nih_00001933_000.png": ("tune", [[954, 130, 987, 176]]),
    "nih_00002578_000.png": ("tune", [[961, 112, 994, 171]]),
    "nih_00013911_000.png": ("tune", [[890, 67, 923, 89]]),
    "nih_00015649_000.png": ("tune", [[901, 70, 933, 127]]),
    "nih_00022084_000.png": ("tune", [[949, 53, 973, 83]]),
    "nih_00022178_000.png": ("tune", [[873, 101, 902, 124]]),
    "nih_00004296_000.png": ("held", [[830, 64, 858, 136]]),
    "nih_00008386_000.png": ("held", [[917, 28, 948, 67]]),
    "nih_00009745_000.png": ("held", [[875, 97, 902, 130]]),
    "nih_00013125_000.png": (
        "held",
        [[945, 406, 974, 454], [619, 944, 645, 963], [687, 944, 787, 965]],
    ),
    "nih_00026911_000.png": (
        "held",
        [[894, 56, 917, 98], [766, 126, 800, 146], [837, 218, 919, 238], [863, 315, 982, 336]],
    ),
}

FONTS = {
    "tune": (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX),
    "held": (cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_PLAIN),
}
WORDS = ("PORTABLE", "AP SUPINE", "PA ERECT", "12/03/2019", "SITTING", "14:22", "ICU 4", "INSP")


def film_path(name: str) -> Path | None:
    """The film's file: tests/data/xray, else $PERTURB_SAMPLES_DIR/xray; None where absent."""
    for folder in (SHIPPED, Path(os.environ.get("PERTURB_SAMPLES_DIR", "/nonexistent")) / "xray"):
        if (folder / name).exists():
            return folder / name
    return None


def read_gray(name: str) -> np.ndarray | None:
    path = film_path(name)
    if path is None:
        return None
    film = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    return film if film.ndim == 2 else cv2.cvtColor(film, cv2.COLOR_BGRA2GRAY)


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(
        int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    )


def synthetic_specs(name: str, gray: np.ndarray, split: str) -> list[dict[str, Any]]:
    """Two text lines and one marker letter, at places where the film is at least 70 levels
    below the ink (annotations are put where they can be read) and away from the real boxes;
    every fourth film is inverted (dark ink)."""
    g = _rng(name)
    h, w = gray.shape
    side = min(h, w)
    inverted = int(g.integers(4)) == 0
    taken = [list(b) for b in REAL_BOXES[name][1]]
    specs: list[dict[str, Any]] = []
    for kind in ("text", "text", "marker"):
        font = int(FONTS[split][int(g.integers(len(FONTS[split])))])
        text = (
            str(WORDS[int(g.integers(len(WORDS)))]) if kind == "text" else "LR"[int(g.integers(2))]
        )
        height = float(g.uniform(0.015, 0.03) if kind == "text" else g.uniform(0.025, 0.04)) * side
        scale = height / 22.0 if font != cv2.FONT_HERSHEY_PLAIN else height / 12.0
        thick = max(1, round(height / (8.0 if kind == "text" else 5.0)))
        (tw, th), _ = cv2.getTextSize(text, font, scale, thick)
        ink = 255 if not inverted else 0
        for _ in range(200):
            x0, y0 = (
                int(g.integers(5, max(6, w - tw - 5))),
                int(g.integers(th + 5, max(th + 6, h - 5))),
            )
            box = [x0 - 4, y0 - th - 4, x0 + tw + 4, y0 + 6]
            region = gray[max(0, box[1]) : box[3], max(0, box[0]) : box[2]]
            level = (
                float(np.percentile(region, 95))
                if not inverted
                else 255.0 - float(np.percentile(region, 5))
            )
            if level > 255 - 70 or any(_overlap(box, t) for t in taken):
                continue
            taken.append(box)
            specs.append(
                {
                    "kind": kind,
                    "text": text,
                    "font": font,
                    "scale": scale,
                    "thick": thick,
                    "origin": [x0, y0],
                    "ink": ink,
                    "inverted": inverted,
                }
            )
            break
    return specs


def _overlap(a: list[int], b: list[int], margin: int = 12) -> bool:
    return not (
        a[2] + margin <= b[0]
        or b[2] + margin <= a[0]
        or a[3] + margin <= b[1]
        or b[3] + margin <= a[1]
    )


def burned(gray: np.ndarray, specs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(film with the synthetic annotations burned in, bool mask of their ink: the rendered
    coverage at least one half)."""
    inverted = bool(specs and specs[0]["inverted"])
    image = (255 - gray) if inverted else gray.copy()
    cover = np.zeros(gray.shape, np.uint8)
    for s in specs:
        cv2.putText(
            cover,
            s["text"],
            tuple(s["origin"]),
            s["font"],
            s["scale"],
            255,
            s["thick"],
            cv2.LINE_AA,
        )
    a = cover.astype(np.float32) / 255.0
    ink = 0.0 if inverted else 255.0
    image = np.clip(np.rint(image * (1 - a) + ink * a), 0, 255).astype(np.uint8)
    return image, cover >= 128


INK_SPREAD = 50  # levels below its brightest pixels an annotation's ink reaches


def real_label(
    image: np.ndarray, boxes: list[list[int]], specs: list[dict[str, Any]]
) -> np.ndarray:
    """bool mask of the real annotations: inside each box, the pixels brighter (darker on an
    inverted film) than the midpoint between the box's ink (98th percentile) and the film around
    the box, and within ``INK_SPREAD`` of the ink."""
    inverted = bool(specs and specs[0]["inverted"])
    plane = (255 - image) if inverted else image
    out = np.zeros(image.shape, bool)
    for x0, y0, x1, y1 in boxes:
        sub = plane[y0:y1, x0:x1].astype(np.float32)
        around = plane[max(0, y0 - 4) : y1 + 4, max(0, x0 - 4) : x1 + 4].astype(np.float32)
        border = np.concatenate([around[0], around[-1], around[:, 0], around[:, -1]])
        ink = float(np.percentile(sub, 98))
        t = max(0.5 * (ink + float(np.median(border))), ink - INK_SPREAD)
        out[y0:y1, x0:x1] = sub > t
    return out
