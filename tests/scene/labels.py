"""The labelled set of burned-in text over the tissue (``tests/data/scene_labels``): real frames
with hand-labelled glyph masks, real frames without text over the tissue (highlight-rich
negatives), and real frames with synthetic burned-in text drawn as a video processor draws it
(flat ink, sharp, optionally a 1 px outline), from recipes stored as data, so the per-pixel glyph
masks are exact. Split by base frame into a tuning part and a held-back part (``labels.json``,
fixed by name): the held-back frames' labels and recipes were never used to tune the search.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from tests.scene.frames import downscale, frames

LABEL_DIR = Path(__file__).resolve().parents[1] / "data" / "scene_labels"
FONTS = {
    "simplex": cv2.FONT_HERSHEY_SIMPLEX,
    "plain": cv2.FONT_HERSHEY_PLAIN,
    "duplex": cv2.FONT_HERSHEY_DUPLEX,
}


@dataclass(frozen=True)
class Labelled:
    """One labelled frame: ``image`` (HWC uint8 RGB) and ``glyphs`` (bool (H, W): every pixel of
    burned-in text drawn over it, ink and outline, that the search should find)."""

    name: str
    part: str
    image: np.ndarray
    glyphs: np.ndarray
    synthetic: bool


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return dict(json.loads((LABEL_DIR / "labels.json").read_text()))


def _base(name: str) -> np.ndarray | None:
    for n, img in frames():
        if n == name:
            return img
    return None


def _real_mask(name: str, shape: tuple[int, int]) -> np.ndarray:
    """The hand-labelled glyph mask of a real frame (absent: no text over its tissue)."""
    path = LABEL_DIR / "real" / (Path(name).stem + ".png")
    if not path.exists():
        return np.zeros(shape, bool)
    mask = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    assert mask is not None and mask.shape == shape, f"{path}: mask does not fit {name}"
    return mask > 127


def render(base: np.ndarray, base_glyphs: np.ndarray, recipe: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``base`` with the burned-in text of ``recipe`` drawn on it, JPEG-encoded as a recorder
    stores the frame, and the glyph mask (``base_glyphs`` plus every drawn pixel of at least half
    ink or outline). Sizes and positions in the recipe are fractions of the frame, so a recipe
    draws the same layout on a downscaled frame."""
    img = base.astype(np.float32)
    h, w = base.shape[:2]
    short = min(h, w)
    mask = base_glyphs.copy()
    for line in recipe["lines"]:
        ink_layer = np.zeros((h, w), np.uint8)
        font = FONTS[line["font"]]
        cap = max(6, round(line["cap"] * short))
        thick = max(1, round(line["weight"] * cap))
        scale = cv2.getFontScaleFromHeight(font, cap, thick)
        kind = cv2.LINE_AA if line["aa"] else cv2.LINE_8
        x, y = round(line["x"] * w), round(line["y"] * h)
        cells = int(line.get("cells", 0))
        for i in range(cells):  # a progress bar: filled cells of one cap height
            cx = x + i * round(1.3 * cap)
            cv2.rectangle(ink_layer, (cx, y - cap + 1), (cx + cap - 1, y), 255, -1)
        tx = x + cells * round(1.3 * cap) + (round(0.5 * cap) if cells else 0)
        cv2.putText(ink_layer, line["text"], (tx, y), font, scale, 255, thick, kind)
        ink = ink_layer.astype(np.float32) / 255.0
        if line["outline"]:
            grown = cv2.dilate(ink_layer, np.ones((3, 3), np.uint8)).astype(np.float32) / 255.0
            rim = np.clip(grown - ink, 0.0, 1.0)
            img = img * (1.0 - rim[..., None]) + np.float32(line["outline_ink"]) * rim[..., None]
            mask |= rim >= 0.5
        img = img * (1.0 - ink[..., None]) + np.asarray(line["ink"], np.float32) * ink[..., None]
        mask |= ink >= 0.5
    out = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(out, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(recipe["jpeg"])])
    assert ok
    decoded = cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return decoded, mask


def labelled(part: str, short: int | None = None) -> list[Labelled]:
    """The labelled frames of ``part`` ("tuning" or "held_back") whose base frame is in the
    sample set; ``short``: downscale the base frames to this shorter side first (the recipes
    scale with them; hand-labelled masks are resized nearest)."""
    t = table()
    names = set(t["split"][part])
    out = []
    for name in sorted(names):
        base = _base(name)
        if base is None:
            continue
        glyphs = _real_mask(name, base.shape[:2])
        if short is not None and min(base.shape[:2]) > short:
            base = downscale(base, short)
            glyphs = cv2.resize(glyphs.view(np.uint8), (base.shape[1], base.shape[0]), interpolation=cv2.INTER_NEAREST).view(bool)
        out.append(Labelled(Path(name).stem, part, base, glyphs, False))
        for recipe in t["synthetic"]:
            if recipe["frame"] == name:
                img, mask = render(base, glyphs, recipe)
                out.append(Labelled(recipe["id"], part, img, mask, True))
    return out


@dataclass(frozen=True)
class Score:
    """Glyph pixels over the tissue found (``found`` of ``glyphs``) and text cover where no glyph
    is (``false`` pixels, beyond 2 px of a labelled glyph), over ``tissue`` pixels."""

    glyphs: int
    found: int
    false: int
    tissue: int

    @property
    def recall(self) -> float:
        return self.found / self.glyphs if self.glyphs else 1.0

    @property
    def false_area(self) -> float:
        return self.false / self.tissue if self.tissue else 0.0

    def __add__(self, other: Score) -> Score:
        return Score(self.glyphs + other.glyphs, self.found + other.found, self.false + other.false, self.tissue + other.tissue)


def text_cover(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cover, field) of ``image``'s scene: how much of each pixel the composite keeps as a
    burned-in text glyph (the text lines' cut of the tissue alpha), and the field alpha."""
    import perturb
    from perturb.scene import masks

    s = perturb.scene(image)
    chw = np.ascontiguousarray(np.moveaxis(image, -1, 0))
    cover = masks._alpha_without_text(s.descriptor) - masks.composite_alpha(s.descriptor, chw)
    return cover, s.field


def score(item: Labelled) -> Score:
    """``item``'s glyph pixels over the tissue (field alpha 1) that the scene keeps as text
    (cover at least 0.5), and its text cover elsewhere over the tissue."""
    cover, field = text_cover(item.image)
    tissue = field >= 0.99
    kept = (cover >= 0.5) & tissue
    truth = item.glyphs & tissue
    near = cv2.dilate(item.glyphs.view(np.uint8), np.ones((5, 5), np.uint8)).view(bool)
    return Score(int(truth.sum()), int((kept & truth).sum()), int((kept & ~near).sum()), int(tissue.sum()))
