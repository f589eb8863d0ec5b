"""Annotation layer of a radiograph: burned-in text, laterality markers and their holders.

A projection radiograph is two layers, as in its imaging chain: the film the exposure made (the
body seen through the beam, the detector and its processing) and the annotations added on top of
it (burned-in text such as "PORTABLE" or "AP SUPINE", the "L"/"R" marker and its holder, arrows).
Annotations are flat, sharp-edged strokes near the film's white (or black on an inverted film),
with no anatomy texture inside; bone, devices and wires are textured or have soft edges.

``analyse(gray)`` finds them once per image on the full-resolution 8-bit film:

1. candidates: pixels well above their surroundings (white top-hat with a disc of ``TOPHAT_SIDE``
   of the shorter side at least ``MIN_CONTRAST`` levels) and near the film's top levels; the
   same on the inverted film for dark strokes;
2. strokes: connected candidates whose core (within ``CORE_SPREAD`` levels of their own top) is
   flat (spread at most ``MAX_CORE_STD``), drops by ``MIN_EDGE_DROP`` levels within ``EDGE_RING``
   pixels around it (a sharp, digitally drawn edge), and is small (``MAX_GLYPH_SIDE`` of the
   shorter side);
3. annotations: strokes grouped by proximity (``GROUP_GAP`` of the shorter side); a group of one
   glyph whose shape matches a rendered "L" or "R" (mirrored too: a lead marker seen from behind)
   is a ``marker`` with that ``side``, otherwise ``text``.

The result is a compact JSON descriptor: ``{"kind": "radiograph", "version", "size",
"annotations"}``, where ``annotations`` is a list of ``{"box", "type", "side", "glyphs",
"polarity", "mask"}`` (``mask``: the stroke pixels of the box, packed bits, zlib, base64) or the string
``"none found"``. ``mask_of(descriptor)`` rebuilds the per-pixel layer exactly, so replay does not
analyse the (perturbed) input again. The engine composites the layer back after the ops whose
registry entry says they act before the annotation is burned in (``protects_border``).
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

from perturb.scene.analysis import described

KIND = "radiograph"
RADIOGRAPH_VERSION = 1
NONE_FOUND = "none found"

TOPHAT_SIDE = 0.03  # structuring disc, fraction of the shorter side (wider than any stroke)
MIN_CONTRAST = 45  # top-hat (8-bit levels) a stroke stands above its surroundings
MIN_LEVEL_QUANTILE = 0.80  # a stroke's top is brighter than this quantile of the film ...
LONE_CONTRAST = 120  # ... or stands this many levels above the film around it (a marker on air)
SPLIT_QUANTILE = 0.995  # a part split from a larger candidate reaches this quantile of the film
CORE_SPREAD = 18  # levels below a component's top that still count as its flat core
MAX_CORE_STD = 9.0  # flat: spread of the core levels
MIN_CORE_FRACTION = 0.2  # of a candidate's pixels in its core (thin anti-aliased strokes: few)
EDGE_RING = 2  # pixels: a drawn edge falls off within this ring
MIN_EDGE_DROP = 45  # levels between the core and the ring around it
MIN_AREA_FRACTION = 6e-6  # smallest stroke, fraction of the image area (6 px at 1024^2)
MAX_GLYPH_SIDE = 0.09  # longest side of one stroke component, fraction of the shorter side
MIN_FILL = 0.08  # area / bbox area: a one-pixel diagonal wire segment is not a glyph
MAX_ELONGATION = 22.0  # stroke length / stroke width: longer thin strokes are wires and tubes
MAX_LONE_ASPECT = 3.5  # a lone stroke (no glyph beside it, not a marker letter) this long for
#   its width (minimum-area rectangle) is a wire segment
GROUP_GAP = 0.02  # strokes closer than this (fraction of the shorter side) form one annotation
OUTLINE_FAR = 5  # px: the film beside an outlined stroke is read this far out from its ink
RIM_LEVELS = 20  # the anti-aliased rim kept with a stroke: within 1 px, this far above its ring


def _odd(n: float) -> int:
    k = max(3, round(n))
    return k if k % 2 else k + 1


def gray_u8(image: np.ndarray) -> np.ndarray:
    """(H, W) uint8 of a gray film: HW/HW1 NumPy (uint8, uint16, float in [0, 1]) or (1, H, W)."""
    arr = np.asarray(image)
    if arr.ndim == 3:
        arr = arr[0] if arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3) else arr[..., 0]
    if arr.dtype == np.uint16:
        return (arr >> 8).astype(np.uint8)
    if arr.dtype != np.uint8:
        return np.clip(np.rint(arr.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(arr)


def _strokes(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bool (H, W) twice: the flat, sharp-edged bright strokes of ``img`` (uint8) with their
    anti-aliased rim (the ink: what glyphs are read on), and the same with the dark outlines
    drawn around them (what the layer keeps). A
    candidate too large or not flat (a glyph touching a bright device) is split once at its own
    ink level (``2 * CORE_SPREAD`` below its brightest pixels) and its parts tried again, where
    they reach the film's top levels (``SPLIT_QUANTILE``)."""
    h, w = img.shape
    side = min(h, w)
    ink_out, full_out = np.zeros((h, w), bool), np.zeros((h, w), bool)
    if MAX_GLYPH_SIDE * side < 2:  # no stroke both 2 px wide and small enough (a sliver film)
        return ink_out, full_out
    min_area = max(4, round(MIN_AREA_FRACTION * h * w))
    disc = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (_odd(TOPHAT_SIDE * side),) * 2)
    tophat = cv2.morphologyEx(img, cv2.MORPH_TOPHAT, disc)
    level, split_level = (float(v) for v in np.quantile(img, [MIN_LEVEL_QUANTILE, SPLIT_QUANTILE]))
    cand = ((tophat >= MIN_CONTRAST) & ((img >= level) | (tophat >= LONE_CONTRAST))).astype(
        np.uint8
    )
    n, labels, stats, _ = cv2.connectedComponentsWithStats(cand, connectivity=8)
    for i in range(1, n):
        x, y, bw, bh, area = (int(v) for v in stats[i])
        if area < min_area or min(bw, bh) < 2:  # nor can any part of it split off below
            continue
        pad = OUTLINE_FAR + 1
        x0, y0 = max(0, x - pad), max(0, y - pad)
        x1, y1 = min(w, x + bw + pad), min(h, y + bh + pad)
        sub = img[y0:y1, x0:x1]
        comp = labels[y0:y1, x0:x1] == i
        kept = _stroke(sub, comp, level, h * w, side)
        if kept is None:
            top = float(np.quantile(sub[comp], 0.99)) - 2 * CORE_SPREAD
            m, parts, part_stats, _ = cv2.connectedComponentsWithStats(
                (comp & (sub >= top)).astype(np.uint8), connectivity=8
            )
            kept = np.zeros_like(comp), np.zeros_like(comp)
            sh, sw = sub.shape
            for j in range(1, m):
                px, py, pw, ph, part_area = (int(v) for v in part_stats[j])
                if part_area < min_area or min(pw, ph) < 2:  # _stroke refuses it
                    continue
                # each part in its own window (its reach: OUTLINE_FAR), not the whole one: a
                # noisy film splits one candidate into thousands of parts
                qx0, qy0 = max(0, px - pad), max(0, py - pad)
                qx1, qy1 = min(sw, px + pw + pad), min(sh, py + ph + pad)
                part = _stroke(
                    sub[qy0:qy1, qx0:qx1], parts[qy0:qy1, qx0:qx1] == j, split_level, h * w, side
                )
                if part is not None:
                    kept[0][qy0:qy1, qx0:qx1] |= part[0]
                    kept[1][qy0:qy1, qx0:qx1] |= part[1]
        ink_out[y0:y1, x0:x1] |= kept[0]
        full_out[y0:y1, x0:x1] |= kept[1]
    return ink_out, full_out


def _stroke(
    sub: np.ndarray, comp: np.ndarray, level: float, image_area: int, side: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The pixels (core and anti-aliased rim, bool like ``sub``) of the candidate ``comp`` in
    the window ``sub`` if it is a drawn stroke (small, flat, sharp-edged, not a long thin
    line), else None."""
    area = int(comp.sum())
    if area < max(4, round(MIN_AREA_FRACTION * image_area)):
        return None
    ys, xs = np.nonzero(comp)
    bw, bh = int(xs.max() - xs.min()) + 1, int(ys.max() - ys.min()) + 1
    if max(bw, bh) > MAX_GLYPH_SIDE * side or area < MIN_FILL * bw * bh or min(bw, bh) < 2:
        return None
    top = float(np.quantile(sub[comp], 0.9))
    core = comp & (sub >= top - CORE_SPREAD)
    if core.sum() < max(3, MIN_CORE_FRACTION * area) or float(sub[core].std()) > MAX_CORE_STD:
        return None
    core_u8 = core.astype(np.uint8)
    near = cv2.dilate(core_u8, np.ones((3, 3), np.uint8)) > 0
    ring = (cv2.dilate(core_u8, np.ones((2 * EDGE_RING + 1,) * 2, np.uint8)) > 0) & ~near
    if not ring.any():
        return None
    ring_level = float(np.median(sub[ring]))
    # near the film's top levels, or far above the film right around it (a lead marker on the
    # dark air beside the body is dimmer than bone)
    if top < level and top - ring_level < LONE_CONTRAST:
        return None
    if top - ring_level < MIN_EDGE_DROP or _elongation(comp) > MAX_ELONGATION:
        return None
    # the film a little further out (OUTLINE_FAR): what the anti-aliased rim stands above, and
    # what a dark outline drawn around the ink (text legible on white film) is darker than
    far = (cv2.dilate(core_u8, np.ones((2 * OUTLINE_FAR + 1,) * 2, np.uint8)) > 0) & ~(
        cv2.dilate(core_u8, np.ones((2 * EDGE_RING + 3,) * 2, np.uint8)) > 0
    )
    film = float(np.median(sub[far])) if far.any() else ring_level
    rim = near & (sub >= max(ring_level, film) + RIM_LEVELS)
    close = (cv2.dilate(core_u8, np.ones((2 * EDGE_RING + 1,) * 2, np.uint8)) > 0) & ~core
    outline = close & (sub.astype(np.int16) <= film - MIN_CONTRAST)
    return core | rim, core | rim | outline


def _elongation(comp: np.ndarray) -> float:
    """Length over width of a stroke: (perimeter / 2) ** 2 / area (1-ish for a blob, large for
    a thin line; a glyph's strokes fold, so its outline is short for its ink)."""
    contours, _ = cv2.findContours(comp.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    perimeter = sum(cv2.arcLength(c, True) for c in contours)
    return float((perimeter / 2.0) ** 2 / max(1.0, float(comp.sum())))


def _aspect(mask: np.ndarray) -> float:
    """Long over short side of the minimum-area rectangle around a mask's pixels."""
    ys, xs = np.nonzero(mask)
    (_, _), (a, b), _ = cv2.minAreaRect(np.stack([xs, ys], axis=1).astype(np.float32))
    return float(max(a, b) / max(1.0, min(a, b)))


_TEMPLATE_SIZE = 24


def _templates() -> dict[str, list[np.ndarray]]:
    """Rendered "L" and "R" (several fonts and weights, mirrored too), cropped to their ink and
    resized to a square: the shapes a glyph's side is read against."""
    out: dict[str, list[np.ndarray]] = {"L": [], "R": []}
    fonts = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_TRIPLEX)
    for letter in out:
        for font in fonts:
            for thick in (2, 4, 6):
                canvas = np.zeros((80, 80), np.uint8)
                cv2.putText(canvas, letter, (10, 65), font, 2.0, 255, thick, cv2.LINE_AA)
                glyph = _normalised(canvas > 127)
                out[letter] += [glyph, glyph[:, ::-1]]
    return out


def _normalised(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    crop = mask[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1].astype(np.uint8) * 255
    return cv2.resize(crop, (_TEMPLATE_SIZE, _TEMPLATE_SIZE), interpolation=cv2.INTER_AREA) > 127


_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE_CACHE: dict[str, list[np.ndarray]] = {}
MIN_MARKER_SIDE = 0.014  # a marker letter is at least this tall and wide (shorter side)
MIN_SIDE_IOU = 0.6  # a glyph reads as "L"/"R" at this overlap with a template and ...
MIN_SIDE_MARGIN = 0.1  # ... this much better than the other letter
MIN_GROUP_MARGIN = 0.05  # a group's best letter beats any glyph of it read as the other letter


SIDE_ANGLES = range(0, 360, 15)  # a lead marker lies at any angle on the detector


def _rotations(glyph: np.ndarray) -> list[np.ndarray]:
    """The glyph (bool, cropped) turned by each of ``SIDE_ANGLES``, each normalised."""
    hh, ww = glyph.shape
    d = int(np.ceil(np.hypot(hh, ww))) + 2
    canvas = np.zeros((d, d), np.uint8)
    y0, x0 = (d - hh) // 2, (d - ww) // 2
    canvas[y0 : y0 + hh, x0 : x0 + ww] = glyph.astype(np.uint8) * 255
    out = []
    for angle in SIDE_ANGLES:
        turn = cv2.getRotationMatrix2D((d / 2.0, d / 2.0), float(angle), 1.0)
        turned = cv2.warpAffine(canvas, turn, (d, d), flags=cv2.INTER_LINEAR) > 127
        out.append(_normalised(turned) if turned.any() else np.zeros((_TEMPLATE_SIZE,) * 2, bool))
    return out


def side_scores(glyph: np.ndarray) -> dict[str, float]:
    """The best overlap (intersection over union) of a glyph's mask (bool, cropped), turned by
    each of ``SIDE_ANGLES``, with the rendered templates of each letter (mirrored included)."""
    with _TEMPLATE_LOCK:
        if not _TEMPLATE_CACHE:
            _TEMPLATE_CACHE.update(_templates())
    turned = np.stack(_rotations(glyph)).reshape(len(SIDE_ANGLES), -1).astype(np.float32)
    scores = {}
    for letter, shapes in _TEMPLATE_CACHE.items():
        t = np.stack(shapes).reshape(len(shapes), -1).astype(np.float32)
        inter = turned @ t.T
        union = turned.sum(1)[:, None] + t.sum(1)[None, :] - inter
        scores[letter] = float((inter / np.maximum(union, 1.0)).max())
    return scores


def read_side(glyph: np.ndarray) -> str | None:
    """ "L", "R" or None: the letter a single glyph's mask (bool, cropped) is, where its best
    overlap with one letter's templates (``side_scores``) is high and clearly above the other's."""
    if glyph.sum() < 6:
        return None
    best = side_scores(glyph)
    letter, score = max(best.items(), key=lambda kv: kv[1])
    other = min(best.values())
    return letter if score >= MIN_SIDE_IOU and score - other >= MIN_SIDE_MARGIN else None


MAX_MARKER_GLYPHS = 3  # a marker: its letter, perhaps the technologist's initials or a frame


def _marker_side(labels: np.ndarray, stats: np.ndarray, side: int) -> str | None:
    """The side ("L"/"R") a group of glyphs shows: the best-read letter among its glyphs of
    marker size, where the group has at most ``MAX_MARKER_GLYPHS`` glyphs (a marker with its
    initials or frame), or among the glyphs enclosed by another (a letter in a ring or holder,
    beside a caption), unless a glyph read as the other letter comes close
    (``MIN_GROUP_MARGIN``); None otherwise (text, or no letter read)."""
    count = len(stats) - 1
    boxes = [tuple(int(v) for v in stats[i][:4]) for i in range(1, count + 1)]

    def enclosed(k: int) -> bool:
        x, y, bw, bh = boxes[k]
        return any(
            j != k and a <= x and b <= y and x + bw <= a + c and y + bh <= b + d
            for j, (a, b, c, d) in enumerate(boxes)
        )

    read: list[tuple[float, str]] = []
    for k in range(count):
        x, y, bw, bh = boxes[k]
        if min(bw, bh) < MIN_MARKER_SIDE * side or not (count <= MAX_MARKER_GLYPHS or enclosed(k)):
            continue
        glyph = labels[y : y + bh, x : x + bw] == k + 1
        letter = read_side(glyph)
        if letter is None:  # a letter touching its holder's frame: read inside the frame
            glyph = _inside_frame(glyph)
            letter = None if glyph is None else read_side(glyph)
        if letter is not None and glyph is not None:
            read.append((side_scores(glyph)[letter], letter))
    if not read:
        return None
    score, letter = max(read)
    rivals = [c for c, other in read if other != letter]
    return letter if all(c <= score - MIN_GROUP_MARGIN for c in rivals) else None


FRAME_INSET = 0.12  # of a framed glyph's smaller side: its frame's width at most
MIN_FRAME_HOLE = 0.3  # share of a glyph's bbox it encloses where it is a frame (with a letter)


def _enclosed_fraction(glyph: np.ndarray) -> float:
    """The share of a glyph's bbox (bool, cropped) that its ink encloses (holes, 4-connected)."""
    padded = np.pad(~glyph, 1, constant_values=True).astype(np.uint8)
    _, holes = cv2.connectedComponents(padded, connectivity=4)
    outside = holes[0, 0]
    return float(((holes != outside) & (padded > 0)).sum()) / float(glyph.size)


def _inside_frame(glyph: np.ndarray) -> np.ndarray | None:
    """The largest ink component inside a glyph's bbox inset by ``FRAME_INSET`` (cropped), where
    the glyph is a frame (it encloses ``MIN_FRAME_HOLE`` of its bbox), else None: the letter of
    a marker whose frame it touches."""
    if _enclosed_fraction(glyph) < MIN_FRAME_HOLE:
        return None  # not a frame: a letter's counters are small
    t = max(1, round(FRAME_INSET * min(glyph.shape)))
    inner = glyph[t:-t, t:-t].astype(np.uint8)
    if inner.size == 0 or not inner.any():
        return None
    _, labels, stats, _ = cv2.connectedComponentsWithStats(inner, connectivity=8)
    k = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    x, y, bw, bh = (int(v) for v in stats[k][:4])
    return labels[y : y + bh, x : x + bw] == k


def encode_mask(mask: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.packbits(mask.reshape(-1)).tobytes(), 9)).decode()


def decode_mask(text: str, shape: tuple[int, int]) -> np.ndarray:
    bits = np.frombuffer(zlib.decompress(base64.b64decode(text)), np.uint8)
    return np.unpackbits(bits)[: shape[0] * shape[1]].reshape(shape).astype(bool)


def _with_fills(mask: np.ndarray, plane: np.ndarray) -> np.ndarray:
    """``mask`` (an annotation's strokes, cropped to its box) with the flat regions its strokes
    enclose that stand ``MIN_CONTRAST`` apart from the film around it (a marker's filled disc
    or holder): drawn too, unlike film showing through a letter's counter."""
    n, holes, stats, _ = cv2.connectedComponentsWithStats((~mask).astype(np.uint8), connectivity=4)
    h, w = mask.shape
    enclosed = [
        k
        for k in range(1, n)
        if stats[k][0] > 0
        and stats[k][1] > 0
        and stats[k][0] + stats[k][2] < w
        and stats[k][1] + stats[k][3] < h
        and stats[k][4] >= 4
    ]
    if not enclosed:
        return mask
    outside = ~mask & ~np.isin(holes, enclosed)
    film = float(np.median(plane[outside])) if outside.any() else None
    out = mask.copy()
    for k in enclosed:
        values = plane[holes == k]
        flat = float(values.std()) <= MAX_CORE_STD
        if flat and (film is None or abs(float(np.median(values)) - film) >= MIN_CONTRAST):
            out |= holes == k
    return out


def _annotations(
    ink: np.ndarray, strokes: np.ndarray, polarity: str, plane: np.ndarray
) -> list[dict[str, Any]]:
    """The annotations of one polarity: ``strokes`` (with outlines) grouped by proximity; each
    group's glyphs are read on its ``ink``."""
    h, w = strokes.shape
    gap = _odd(GROUP_GAP * min(h, w))
    groups = cv2.dilate(strokes.astype(np.uint8), np.ones((gap, gap), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(groups, connectivity=8)
    out = []
    for i in range(1, n):
        x, y, bw, bh, _ = (int(v) for v in stats[i])
        box_mask = strokes[y : y + bh, x : x + bw] & (labels[y : y + bh, x : x + bw] == i)
        if not box_mask.any():
            continue
        ys, xs = np.nonzero(box_mask)
        x0, y0, x1, y1 = (
            x + int(xs.min()),
            y + int(ys.min()),
            x + int(xs.max()) + 1,
            y + int(ys.max()) + 1,
        )
        group = labels[y0:y1, x0:x1] == i
        drawn = ink[y0:y1, x0:x1] & group
        if not drawn.any():
            continue
        glyphs, glyph_labels, glyph_stats, _ = cv2.connectedComponentsWithStats(
            drawn.astype(np.uint8), connectivity=8
        )
        side = _marker_side(glyph_labels, glyph_stats, min(h, w))
        lone = glyphs - 1 == 1 and side is None
        if lone and (
            _aspect(drawn) > MAX_LONE_ASPECT or min(drawn.shape) < MIN_MARKER_SIDE * min(h, w)
        ):
            continue  # a wire segment, or a speck: a lone glyph is at least a marker's size
        mask = _with_fills(box_mask[y0 - y : y1 - y, x0 - x : x1 - x], plane[y0:y1, x0:x1])
        out.append(
            {
                "box": [x0, y0, x1, y1],
                "type": "marker" if side is not None else "text",
                "side": side,
                "glyphs": glyphs - 1,
                "polarity": polarity,
                "mask": encode_mask(mask),
            }
        )
    return out


def analyse(image: np.ndarray) -> dict[str, Any]:
    """The radiograph scene descriptor of one gray film (any layout ``gray_u8`` reads)."""
    g = gray_u8(image)
    h, w = g.shape
    found = []
    for polarity in polarities(g):
        plane = g if polarity == "bright" else 255 - g
        found += _annotations(*_strokes(plane), polarity, plane)
    found.sort(key=lambda a: (a["box"][1], a["box"][0]))
    return {
        "kind": KIND,
        "version": RADIOGRAPH_VERSION,
        "size": [h, w],
        "annotations": found if found else NONE_FOUND,
    }


POLARITY_MARGIN = 5.0  # levels between mediastinum and lungs below which both polarities are read


def polarity_cue(g: np.ndarray) -> float:
    """Mean level of the central column (mediastinum, spine) minus the two lung columns, rows
    30-65 %: positive on a frontal chest film shown as MONOCHROME2, negative when inverted."""
    h, w = g.shape
    r0, r1 = int(0.30 * h), int(0.65 * h)
    centre = float(g[r0:r1, int(0.45 * w) : int(0.55 * w)].mean())
    lungs = float(
        np.concatenate(
            [
                g[r0:r1, int(0.22 * w) : int(0.32 * w)].ravel(),
                g[r0:r1, int(0.68 * w) : int(0.78 * w)].ravel(),
            ]
        ).mean()
    )
    return centre - lungs


def polarities(g: np.ndarray) -> tuple[str, ...]:
    """The ink polarities read on a film: bright on a MONOCHROME2 film, dark on an inverted one,
    both where the film's polarity is not clear (``POLARITY_MARGIN``)."""
    cue = polarity_cue(g)
    if cue > POLARITY_MARGIN:
        return ("bright",)
    if cue < -POLARITY_MARGIN:
        return ("dark",)
    return ("bright", "dark")


def unread_markers(desc: dict[str, Any]) -> list[dict[str, Any]]:
    """Annotations that may be a laterality marker whose side was not read: at most
    ``MAX_MARKER_GLYPHS`` glyphs, at least marker size (``MIN_MARKER_SIDE``) both ways."""
    side = min(int(v) for v in desc["size"])
    return [
        a
        for a in annotations_of(desc)
        if a["side"] is None
        and a.get("glyphs", 0) <= MAX_MARKER_GLYPHS
        and min(a["box"][2] - a["box"][0], a["box"][3] - a["box"][1]) >= MIN_MARKER_SIDE * side
    ]


def is_radiograph(desc: Any) -> bool:
    return isinstance(desc, dict) and desc.get("kind") == KIND


def annotations_of(desc: dict[str, Any]) -> list[dict[str, Any]]:
    """The descriptor's annotations (empty where none were found)."""
    found = desc.get("annotations")
    return found if isinstance(found, list) else []


def check_descriptor(desc: dict[str, Any]) -> None:
    if desc.get("version") != RADIOGRAPH_VERSION:
        raise ValueError(
            f"radiograph scene descriptor of version {desc.get('version')} cannot be read by "
            f"version {RADIOGRAPH_VERSION}; use the perturb version named in the record"
        )


_MASKS: OrderedDict[str, np.ndarray] = OrderedDict()
_MASKS_LOCK = threading.Lock()
_MASKS_SIZE = 64


def _cached_mask(
    cache: OrderedDict[str, np.ndarray],
    desc: dict[str, Any],
    key: str | None,
    select: Callable[[dict[str, Any]], list[dict[str, Any]]],
) -> np.ndarray:
    """bool (H, W), read-only: the pixels of the annotations ``select`` picks from ``desc``
    (called only when the mask is not held), held in ``cache`` by the descriptor's sorted JSON
    (``key`` when given)."""
    key = json.dumps(desc, sort_keys=True) if key is None else key
    with _MASKS_LOCK:
        held = cache.get(key)
        if held is not None:
            cache.move_to_end(key)
            return held
    h, w = (int(v) for v in desc["size"])
    mask = np.zeros((h, w), bool)
    for a in select(desc):
        x0, y0, x1, y1 = (int(v) for v in a["box"])
        mask[y0:y1, x0:x1] |= decode_mask(a["mask"], (y1 - y0, x1 - x0))
    mask.flags.writeable = False
    with _MASKS_LOCK:
        cache[key] = mask
        while len(cache) > _MASKS_SIZE:
            cache.popitem(last=False)
    return mask


def mask_of(desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """bool (H, W), read-only: the annotation pixels of ``desc`` (cached by its sorted JSON)."""
    return _cached_mask(_MASKS, desc, key, annotations_of)


# annotation types that are physical objects on the detector, imaged with the exposure (the
# lead laterality marker): where the beam was stopped (collimation) they were never imaged. The
# other types (burned-in text) are added digitally after acquisition and always show.
LEAD_TYPES = frozenset({"marker"})

_LEAD: OrderedDict[str, np.ndarray] = OrderedDict()


def lead_mask(desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """bool (H, W), read-only: the pixels of ``desc``'s annotations of a ``LEAD_TYPES`` type,
    and of those that may be a marker whose side was not read (``unread_markers``: a lone
    letter of marker size is most often the lead marker), cached by the descriptor's sorted
    JSON."""
    return _cached_mask(_LEAD, desc, key, _lead_annotations)


def _lead_annotations(desc: dict[str, Any]) -> list[dict[str, Any]]:
    unread = unread_markers(desc)
    return [
        a
        for a in annotations_of(desc)
        if a.get("type") in LEAD_TYPES or any(a is b for b in unread)
    ]


def composite_alpha(desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """float32 (H, W): 1 where an acquisition op shows (the film), 0 on the annotation pixels."""
    return (~mask_of(desc, key)).astype(np.float32)


EXT_GROW = 2  # pixels the inpainted area reaches beyond the strokes (their faint halo)


def extension_alpha(desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """float32 (H, W): 0 on the annotations grown by ``EXT_GROW`` px (replaced by the film
    under them before a spatial op), 1 elsewhere."""
    grown = cv2.dilate(
        mask_of(desc, key).astype(np.uint8), np.ones((2 * EXT_GROW + 1,) * 2, np.uint8)
    )
    return (grown == 0).astype(np.float32)


def extension_fill(image: np.ndarray, desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """``image`` (CHW, its dtype) with the grown annotation pixels filled from the film around
    them (a normalised gaussian convolution of the rest, per annotation box): the film as the
    exposure made it, for spatial ops that would otherwise smear the annotation."""
    alpha = extension_alpha(desc, key)
    out = np.array(image, copy=True)
    h, w = alpha.shape
    side = min(h, w)
    reach = max(3, round(0.01 * side))
    for a in annotations_of(desc):
        x0, y0, x1, y1 = (int(v) for v in a["box"])
        pad = EXT_GROW + 3 * reach
        bx0, by0, bx1, by1 = max(0, x0 - pad), max(0, y0 - pad), min(w, x1 + pad), min(h, y1 + pad)
        keep = alpha[by0:by1, bx0:bx1]
        hole = keep < 0.5
        if not hole.any():
            continue
        weight = cv2.GaussianBlur(keep, (0, 0), reach, borderType=cv2.BORDER_REPLICATE)
        for c in range(out.shape[0]):
            plane = out[c, by0:by1, bx0:bx1].astype(np.float32)
            filled = cv2.GaussianBlur(plane * keep, (0, 0), reach, borderType=cv2.BORDER_REPLICATE)
            filled = filled / np.maximum(weight, 1e-6)
            if out.dtype != np.float32:
                filled = np.clip(np.rint(filled), 0, np.iinfo(out.dtype).max)
            out[c, by0:by1, bx0:bx1][hole] = filled[hole].astype(out.dtype)
    return out


def compose_numpy(
    src: np.ndarray,
    dst: np.ndarray,
    desc: dict[str, Any],
    key: str | None = None,
    shadow: np.ndarray | None = None,
) -> None:
    """In place: ``dst`` (CHW, the perturbed sample) takes ``src``'s pixels (the clean sample)
    on the annotation layer, exactly; elsewhere it stays as it is. ``shadow`` (float32 (H, W),
    the share of the beam an op stopped: ``KernelEntry.shadow``): on a lead marker's pixels
    (``lead_mask``) the op's pixels show in that share, ``src + shadow (dst - src)`` in float32
    (integer levels rounded half to even), as ``perturb.engine.run.compose_tissue`` blends."""
    mask = mask_of(desc, key)
    if not mask.any():
        return
    if shadow is None:
        np.copyto(dst, src, where=np.broadcast_to(mask, src.shape))
        return
    lead = lead_mask(desc, key)
    a = np.where(lead & mask, shadow.astype(np.float32), np.float32(0.0))
    keep = mask & (a < 1.0)
    ys, xs = np.nonzero(keep)
    for c in range(src.shape[0]):
        s = src[c][ys, xs].astype(np.float32)
        mixed = s + a[ys, xs] * (dst[c][ys, xs].astype(np.float32) - s)
        if dst.dtype != np.float32:
            mixed = np.clip(np.rint(mixed), 0, np.iinfo(dst.dtype).max)
        dst[c][ys, xs] = mixed.astype(dst.dtype)


def extend_numpy(
    src: np.ndarray, dst: np.ndarray, desc: dict[str, Any], key: str | None = None
) -> None:
    """``dst`` becomes ``src`` with its (grown) annotation pixels filled from the film around
    them (``extension_fill``): what a spatial acquisition op reads."""
    np.copyto(dst, extension_fill(src, desc, key))


def analysed(image: Any, chw: bool = False) -> tuple[dict[str, Any], str, str]:
    """``analyse(image)`` with its texts: (descriptor; its JSON text; its sorted JSON, the key
    of the mask caches). ``image``: a CHW torch tensor, a CHW NumPy array (``chw``), or what
    ``gray_u8`` reads."""
    if hasattr(image, "detach"):
        image, chw = image.detach().cpu().numpy(), True
    arr = np.ascontiguousarray(image)
    plane = arr[0] if chw else arr
    return described(analyse(plane))
