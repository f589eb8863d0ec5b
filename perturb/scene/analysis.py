"""Per-image scene analysis of an endoscopy frame: the three layers of the imaging chain.

A video endoscope's frame is composed by its processor in three layers: the tissue as the optics
and sensor saw it, cut to the field of view (a circular or octagonal aperture with a soft edge);
the dark surround; and on-screen overlays drawn digitally afterwards (burned-in text and icons,
the green scope-position box, picture-in-picture insets) plus black anonymisation boxes added by
the data curators. ``analyse`` recovers them once per image on a downscaled copy (OpenCV, CPU):

1. surround: dark pixels (max channel below ``DARK_LEVEL``, median-filtered) connected to the
   image edge;
2. overlays: saturated flat green/blue rectangles (scope-position box), bright components outside
   the largest one (text, icons, picture-in-picture), black flat rectangles cut into the field
   (anonymisation boxes);
3. field: the largest remaining bright component, closed over glyphs, and its convex hull (the
   aperture is convex, so a dark lumen touching the edge or a black box cutting it stays tissue).

The result is a compact JSON descriptor (polygon on the analysis grid, overlay rectangles in
image pixels); ``perturb.scene.masks`` rebuilds the masks from it deterministically, so a record
that stores the descriptor replays bit for bit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

SCENE_VERSION = 7  # 2: text lines over the tissue keep only their glyph strokes in the composite;
#   3: and their solid blocks (progress bars, a cursor) whole (masks.solid_blocks);
#   4: text lines found as regular glyph rows of either polarity anywhere over the field (kinds
#   ``text`` and ``text_dark``), the glyph cover keeps a 1 px rim and an outline; ``text`` entry;
#   5: light ink found by its colour distance from a median background (any channel), glyph
#   cover from the largest per-channel top-hat (coloured ink of low luma contrast);
#   6: a found line is extended with its own ink (characters over bright tissue, lines of its
#   block), runs of touching characters count as characters, glyphs from 6 px; glyph cover
#   also from the ink's share against the tissue behind each pixel; 7: ink of the opposite
#   polarity enclosed by a line's strokes (dark ink inside a light outline) wholly covered
#   from its own depth below the tissue (``masks._enclosed_ink``)
TEXT_KINDS = ("text", "text_dark")  # overlay kinds of burned-in text lines (light, dark ink)
GRID_SHORT = 360  # analysis grid: shorter side in pixels
DARK_LEVEL = 24  # max channel (8-bit) below which a pixel may belong to the surround
BLACK_LEVEL = 8
OVERLAY_LEVEL = 60  # text, icons and insets outside the field are at least this bright  # anonymisation boxes are drawn in pure black
MIN_FIELD_FRACTION = 0.05  # below this the image is treated as having no dark surround
HIGHLIGHT_LEVEL = 0.92  # min channel above this inside the field: specular highlight


def to_hwc_u8(image: Any) -> np.ndarray:
    """An image as HWC uint8 RGB (gray repeated): NumPy HW/HWC (uint8, uint16, float in [0, 1]) or
    a torch CHW tensor (float32 in [0, 1], uint8 or uint16)."""
    arr: np.ndarray
    if hasattr(image, "detach"):  # torch tensor, CHW
        t = image.detach()
        if t.ndim != 3:
            raise ValueError(f"scene() takes one image (C, H, W), got shape {tuple(t.shape)}")
        arr = t.cpu().permute(1, 2, 0).numpy()
    else:
        arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3):
        raise ValueError(
            f"scene() takes an (H, W), (H, W, 1|3) or (1|3, H, W) image, got shape {arr.shape}"
        )
    if arr.dtype == np.uint16:
        arr = (arr >> 8).astype(np.uint8)
    elif arr.dtype != np.uint8:
        arr = np.clip(np.rint(arr.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=2)
    return np.ascontiguousarray(arr)


def grid_size(h: int, w: int) -> tuple[int, int]:
    """(gh, gw) of the analysis grid: shorter side ``GRID_SHORT`` (never upsampled)."""
    scale = min(1.0, GRID_SHORT / min(h, w))
    return max(2, round(h * scale)), max(2, round(w * scale))


def _components(mask: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """8-connected components of ``mask`` with their stats. Labelled by BBDT (``CCL_GRANA``):
    the labels and stats of OpenCV's default for 8-connectivity (Spaghetti, the same 2 x 2 block
    scan and label order), at a third of its cost in this build (which spends about 0.8 ms on
    the default's stats of even an empty 360 px mask)."""
    n, labels, stats, _ = cv2.connectedComponentsWithStatsWithAlgorithm(
        mask.astype(np.uint8), 8, cv2.CV_32S, cv2.CCL_GRANA
    )
    return n, labels, stats


def _edge_connected(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` connected to the image edge: filled (8-connected) from a frame of set
    pixels around the image, which touches every pixel on the edge."""
    h, w = mask.shape
    framed = np.ones((h + 2, w + 2), np.uint8)
    framed[1:-1, 1:-1] = mask
    cv2.floodFill(framed, None, (0, 0), 2, flags=8)
    return framed[1:-1, 1:-1] == 2


def _rect(stats_row: np.ndarray) -> tuple[int, int, int, int]:
    x, y, w, h = (int(v) for v in stats_row[:4])
    return x, y, x + w, y + h


def _scope_boxes(small: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Saturated, flat, green-to-blue rectangles (scope-position / shape display boxes) on the grid."""
    hsv = cv2.cvtColor(small, cv2.COLOR_RGB2HSV)
    # hue 38-135, saturation and value at least 100 and 70 (0/255, one pass)
    colour = cv2.inRange(hsv, (38, 100, 70), (135, 255, 255))
    if not cv2.countNonZero(colour):  # no box's colour anywhere: nothing to open or label
        return []
    grad = cv2.morphologyEx(
        cv2.cvtColor(small, cv2.COLOR_RGB2GRAY), cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8)
    )
    flat = (grad <= 24).view(np.uint8)  # 0/1: the mask below is 0/1 as before
    cand = cv2.morphologyEx(cv2.bitwise_and(colour, flat), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    cand = cv2.morphologyEx(cand, cv2.MORPH_CLOSE, np.ones((5, 5), np.uint8))
    if not cv2.countNonZero(cand):
        return []
    n, _, stats = _components(cand)
    area_min = 0.002 * small.shape[0] * small.shape[1]
    boxes = []
    for i in range(1, n):
        x0, y0, x1, y1 = _rect(stats[i])
        area = int(stats[i, cv2.CC_STAT_AREA])
        if area >= area_min and area >= 0.8 * (x1 - x0) * (y1 - y0) and min(x1 - x0, y1 - y0) >= 6:
            boxes.append((x0, y0, x1, y1))
    return boxes


def _black_boxes(v: np.ndarray, hull: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Pure-black axis-aligned rectangles that cut into the field's hull (anonymisation boxes):
    black regions inside the hull that fill their bounding box (as far as it lies in the hull)."""
    black = ((v <= BLACK_LEVEL) & hull.astype(bool)).astype(np.uint8)
    if not black.any():  # nothing black in the hull: nothing to open or label
        return []
    black = cv2.morphologyEx(black, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    n, _, stats = _components(black)
    area_min = 0.001 * v.shape[0] * v.shape[1]
    boxes = []
    for i in range(1, n):
        x0, y0, x1, y1 = _rect(stats[i])
        area = int(stats[i, cv2.CC_STAT_AREA])
        w, h = x1 - x0, y1 - y0
        inside = int(hull[y0:y1, x0:x1].sum())  # the box as far as the hull shows it
        if area >= area_min and area >= 0.92 * inside and min(w, h) >= 4:
            boxes.append((x0, y0, x1, y1))
    return boxes


TEXT_GRID_SHORT = 1080  # text search grid: shorter side in pixels (never upsampled)
TEXT_MIN_HEIGHT = 6  # px: the smallest legible cap height
TEXT_MAX_RUN = 24  # a run of touching characters is at most this many heights wide...
TEXT_SPAN = 0.35  # ...and this share of its columns reach its top and bottom (``_spans``)
TEXT_RUN_MIN_HEIGHT = 8  # px: a run of touching characters at least this tall (and 0.8%)
TEXT_RUN_CHARS = 5  # a line of fewer components spans at least this many characters
TEXT_RUN_HALF = 0.3  # the widest point of a run's strokes at most this of its height across
TEXT_CONTRAST = 40  # 8-bit luma excess of a glyph stroke over its local background (top-hat)
TEXT_MIN_CHARS = 3  # a line holds at least this many separate characters of one height...
TEXT_BLOCK_CHARS = 2  # ...or this many where it stands left-aligned in a block with such a line
TEXT_HEIGHT_TOL = 0.12  # cap heights and baselines of one line agree within this fraction
TEXT_MAX_FILL = 0.9  # a character's strokes leave part of its box open (median of a line)
TEXT_GAP = 2.5  # at most this many cap heights between neighbouring characters of a line
TEXT_BACKGROUND = 0.06  # median window of the tissue behind text, of the shorter side
TEXT_PEAK = 0.02  # ink is a peak narrower than this (top-hat square), of the shorter side
TEXT_HIGHLIGHT_SHARE = 0.02  # a dark line's box holds less of near-white highlight than this
TEXT_IN_FIELD = 0.1  # a text line reaches into the field: at least this fraction of its box
# More of a found line's text, searched with its own ink (``_extended``):
TEXT_INK_TOL = 48  # a pixel within this many 8-bit levels of the line's ink in every channel...
TEXT_WEAK_CONTRAST = 16  # ...that stands at least this far out of the tissue behind it
TEXT_REACH = 12  # cap heights beside a line searched for more of its characters
TEXT_BLOCK_REACH = 2.6  # cap heights above and below a line searched for lines of its block
TEXT_MAX_BLOCK_LINES = 12  # lines searched around per block


@dataclass(frozen=True)
class _Glyph:
    """One character candidate on the text grid: its box, stroke half-width and ink luma."""

    x0: int
    y0: int
    x1: int
    y1: int
    half_width: float
    ink: float
    chars: int  # characters it spans (touching characters merge into one component)
    block: bool  # a solid square cell (progress bar), not a stroke
    fill: float  # fraction of its box it covers

    @property
    def height(self) -> int:
        return self.y1 - self.y0


def _glyphs(
    luma: np.ndarray,
    candidates: np.ndarray,
    short: int,
    blocks: bool,
    dark: bool,
    heights: tuple[int, int] | None = None,
    offset: tuple[int, int] = (0, 0),
) -> list[_Glyph]:
    """Character-sized components of ``candidates`` (pixels of one polarity standing out of their
    surroundings): a cap height of 0.8-7% of the shorter side (at least 8 px: smaller is not legible) and either thin strokes (the
    widest point at most about a third of the height across) that do not fill their box as a
    blob does (a specular highlight fills about 0.8 of it), or (``blocks``) solid square blocks
    (a progress-bar cell: fills 0.88 of its box, which a round highlight does not). ``dark``:
    the ink is darker than the tissue. ``heights``: the (lowest, highest) component height instead;
    ``offset``: (x, y) added to the boxes (``luma`` and ``candidates`` are a crop)."""
    lo, hi = heights or (max(TEXT_MIN_HEIGHT, round(0.0055 * short)), max(10, round(0.07 * short)))
    ox, oy = offset
    run_lo = max(TEXT_RUN_MIN_HEIGHT, round(0.008 * short))  # a run of so few pixels is a streak
    # components by their outer contours (8-connected, as a labelling; a fraction of its cost
    # on a sparse mask), each measured inside its bounding box
    contours, _ = cv2.findContours(candidates, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    out: list[_Glyph] = []
    if not contours:
        return out
    # the bounding boxes of all contours at once (a box's extremes are vertices of its contour,
    # as ``cv2.boundingRect`` finds them), and the size tests that need no pixels
    counts = np.fromiter(map(len, contours), np.int64, len(contours))
    points = np.concatenate(contours).reshape(-1, 2)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    xs0, ys0 = np.minimum.reduceat(points, starts, axis=0).T
    xs1, ys1 = np.maximum.reduceat(points, starts, axis=0).T
    ws, hs = xs1 - xs0 + 1, ys1 - ys0 + 1
    sized = (hs >= lo) & (hs <= hi) & (ws <= TEXT_MAX_RUN * hs)
    if blocks:
        sized &= (ws >= 0.7 * hs) & (ws <= 1.4 * hs)
    for i in np.flatnonzero(sized).tolist():
        contour = contours[i]
        x, y, w, h = int(xs0[i]), int(ys0[i]), int(ws[i]), int(hs[i])
        comp = np.zeros((h + 2, w + 2), np.uint8)
        cv2.drawContours(comp, [contour], 0, 1, -1, offset=(1 - x, 1 - y))
        comp[1:-1, 1:-1] &= candidates[y : y + h, x : x + w]
        area = cv2.countNonZero(comp)
        fill = area / (w * h)
        if blocks:
            if fill < 0.88:
                continue
            half = 0.0
        else:
            if fill > 0.85 and w > 0.4 * h:  # a blob, unless a bar (I, 1, l)
                continue
            half = cv2.minMaxLoc(cv2.distanceTransform(comp, cv2.DIST_L2, 3))[1]
            # a run of touching characters (wider than one) stands on the baseline and reaches
            # up to the x-height in most of its columns; bold strokes that touch may be wider
            run = w > 1.5 * h
            if run and (h < run_lo or _spans(comp[1:-1, 1:-1]) < TEXT_SPAN):
                continue
            if half > (TEXT_RUN_HALF if run else 0.2) * h + 1.5:
                continue
        # the ink of its stroke cores (the anti-aliased edge of a thin stroke is a mix)
        pixels = luma[y : y + h, x : x + w][comp[1:-1, 1:-1].view(bool)]  # comp is 0/1
        ink = _percentile(pixels, 10 if dark else 90)
        chars = max(1, round(w / (0.7 * h)))
        out.append(_Glyph(x + ox, y + oy, x + ox + w, y + oy + h, half, ink, chars, blocks, fill))
    return out


def _percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (linear interpolation) of a small 1-D array, without its
    overhead (called once per character candidate)."""
    ordered = np.sort(values, axis=None)
    pos = (ordered.size - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, ordered.size - 1)
    return float(ordered[lo]) + (pos - lo) * (float(ordered[hi]) - float(ordered[lo]))


def _median(values: list[int] | list[float]) -> float:
    """``float(np.median(values))`` of a short list of Python numbers (the middle one, or the
    mean of the middle two), without NumPy's overhead per call."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def _spans(comp: np.ndarray) -> float:
    """The share of a component's inked columns that reach both its top 40% (up to the x-height
    of lower case) and its bottom quarter (uint8 (h, w) mask): the vertical strokes of a run of touching characters stand on the cap
    line and the baseline; a streak of highlight along a fold crosses few columns top to
    bottom."""
    h = comp.shape[0]
    top = comp[: max(1, round(0.4 * h))].any(axis=0)
    bottom, any_ink = comp[h - max(1, h // 4) :].any(axis=0), comp.any(axis=0)
    return float((top & bottom).sum()) / max(1, int(any_ink.sum()))


def _boxes(glyphs: list[_Glyph]) -> np.ndarray:
    """int64 (n, 4): the boxes (x0, y0, x1, y1) of ``glyphs``."""
    return np.array([(g.x0, g.y0, g.x1, g.y1) for g in glyphs], np.int64).reshape(-1, 4)


def _overlapping(new: list[_Glyph], old: list[_Glyph]) -> np.ndarray:
    """Bool (len(new),): whether the box of each of ``new`` overlaps that of any of ``old`` (one
    character found twice): both their column and their row ranges intersect."""
    if not new or not old:
        return np.zeros(len(new), bool)
    a, b = _boxes(new)[:, None, :], _boxes(old)[None, :, :]
    cols = np.minimum(a[..., 2], b[..., 2]) > np.maximum(a[..., 0], b[..., 0])
    rows = np.minimum(a[..., 3], b[..., 3]) > np.maximum(a[..., 1], b[..., 1])
    return np.asarray((cols & rows).any(axis=1))


def _without_overlaps(new: list[_Glyph], old: list[_Glyph]) -> list[_Glyph]:
    """The glyphs of ``new`` that overlap none of ``old`` (``_overlapping``), in their order."""
    hit = _overlapping(new, old)
    return [g for g, h in zip(new, hit, strict=True) if not h]


_PAIR_ROWS = 256  # glyphs per block of rows of the pair tests (bounds their memory)


def _same_line_pairs(
    x0: np.ndarray,
    y0: np.ndarray,
    x1: np.ndarray,
    y1: np.ndarray,
    hgt: np.ndarray,
    ink: np.ndarray,
    block: np.ndarray,
    rows: slice,
    cols: slice,
) -> tuple[np.ndarray, np.ndarray]:
    """The (i, j) index pairs, i in ``rows``, j in ``cols``, of the glyphs (sorted by left edge)
    that stand on one line, each row i scanned over the later columns up to its first glyph
    starting more than ``TEXT_GAP`` heights (the larger of the two) past its right edge
    (``cols`` starts at or before ``rows`` and reaches that far for every row). Two characters
    of one line: the same cap height and the same baseline or top line (within
    ``TEXT_HEIGHT_TOL`` of the height, at least 1 px; a progress bar's cells beside text: the
    same baseline within 0.3 heights and at least half the height), the same ink (within 40
    levels), at most ``TEXT_GAP`` heights apart (the space between the fields of a line: a date
    and a time; boxes of kerned or merged characters may overlap)."""
    r, c = rows, cols
    col = np.arange(c.start, c.stop)[None, :]
    row = np.arange(r.start, r.stop)[:, None]
    later = col > row
    hmax = np.maximum(hgt[r, None], hgt[None, c]).astype(np.float64)
    stop = later & ((x0[None, c] - x1[r, None]) > TEXT_GAP * hmax)
    scanned = later & (np.cumsum(stop, axis=1) == 0)
    tol = np.maximum(1.0, TEXT_HEIGHT_TOL * hmax)
    dy1 = np.abs(y1[r, None] - y1[None, c])
    dy0 = np.abs(y0[r, None] - y0[None, c])
    hmin = np.minimum(hgt[r, None], hgt[None, c])
    mixed = block[r, None] != block[None, c]
    shape_ok = np.where(
        mixed,
        ~((dy1 > 0.3 * hmax) | (hmin < 0.5 * hmax)),
        ~((np.abs(hgt[r, None] - hgt[None, c]) > tol) | (np.minimum(dy1, dy0) > tol)),
    )
    ink_ok = ~(np.abs(ink[r, None] - ink[None, c]) > 40)
    gap = np.maximum(x0[r, None], x0[None, c]) - np.minimum(x1[r, None], x1[None, c])
    p, q = np.nonzero(scanned & shape_ok & ink_ok & (gap <= TEXT_GAP * hmax))
    return p + r.start, q + c.start


def _lines_of(glyphs: list[_Glyph]) -> list[list[_Glyph]]:
    """Glyphs chained into lines (union of the pairs ``_same_line_pairs`` finds, all at
    once): in the order of their left edges, each glyph against
    those after it up to the first that starts more than ``TEXT_GAP`` heights (the larger of
    the two) past its right edge."""
    n = len(glyphs)
    if n < 2:
        return [list(glyphs)] if glyphs else []
    order = np.argsort(np.array([g.x0 for g in glyphs], np.int64), kind="stable")
    gs = [glyphs[i] for i in order]
    x0, y0, x1, y1 = _boxes(gs).T
    hgt = y1 - y0
    ink = np.array([g.ink for g in gs], np.float64)
    block = np.array([g.block for g in gs], bool)
    # a row's scan never passes the first glyph starting beyond its right edge by TEXT_GAP of
    # the tallest height: rows go in blocks, each against the columns its scans can reach
    reach = np.searchsorted(x0, x1 + TEXT_GAP * float(hgt.max()), side="right")
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    for r0 in range(0, n, _PAIR_ROWS):
        r1 = min(n, r0 + _PAIR_ROWS)
        c1 = max(r0 + 2, int(reach[r0:r1].max()))
        rows, cols = slice(r0, r1), slice(r0, min(n, c1))
        pairs.append(_same_line_pairs(x0, y0, x1, y1, hgt, ink, block, rows, cols))
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for ps, qs in pairs:
        for p, q in zip(ps.tolist(), qs.tolist(), strict=True):
            parent[root(p)] = root(q)
    # groups in the order of their first glyph in the input, as the union of the pairs
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    groups: dict[int, list[_Glyph]] = {}
    for i, g in enumerate(glyphs):
        groups.setdefault(root(int(pos[i])), []).append(g)
    return list(groups.values())


def _regular(line: list[_Glyph]) -> bool:
    """A line's characters are regular: one cap height (half within ``TEXT_HEIGHT_TOL`` of the
    median), one stroke width (within a factor 2) and open strokes (median fill of their box at
    most ``TEXT_MAX_FILL``), as a font draws them; specular speckle is irregular and blobby."""
    heights = np.array([g.height for g in line if not g.block] or [1], np.float32)
    med = float(np.median(heights))
    halves = np.array([g.half_width for g in line if not g.block] or [1.0], np.float32)
    fills = [g.fill for g in line if not g.block]
    return bool(
        float(np.median(np.abs(heights - med))) <= max(1.0, TEXT_HEIGHT_TOL * med)
        and halves.max() <= 2.0 * max(1.0, float(np.median(halves)))
        and (not fills or _median(fills) <= TEXT_MAX_FILL)
    )


def _cells_regular(line: list[_Glyph]) -> list[_Glyph]:
    """``line`` without its blocks unless they form a progress bar: at least three cells of one
    size (within 1 px), as a processor draws them (a cluster of highlights is never that even)."""
    cells = [g for g in line if g.block]
    strokes = [g for g in line if not g.block]
    if len(cells) >= 3:
        hs = [g.height for g in cells]
        ws = [g.x1 - g.x0 for g in cells]
        if max(hs) - min(hs) <= 1 and max(ws) - min(ws) <= 1:
            return line
    return strokes


def _is_line(line: list[_Glyph], field: np.ndarray | None = None) -> bool:
    """A line on its own: at least ``TEXT_MIN_CHARS`` separate character strokes (a highlight
    cluster chained with them is not told apart), or a progress bar (regular cells,
    ``_cells_regular``) with a stroke beside it, or, wholly inside the field (``field``: its
    mask on the text grid; a band of tissue lit along the aperture's rim is no text), fewer
    components (characters that touch merge into runs) spanning ``TEXT_RUN_CHARS`` characters."""
    strokes = [g for g in line if not g.block]
    if len(strokes) >= TEXT_MIN_CHARS or (len(strokes) >= 1 and len(line) - len(strokes) >= 3):
        return True
    if field is None or sum(g.chars for g in strokes) < TEXT_RUN_CHARS:
        return False
    x0, y0 = max(0, min(g.x0 for g in line)), max(0, min(g.y0 for g in line))
    x1, y1 = max(g.x1 for g in line), max(g.y1 for g in line)
    h = max(g.height for g in line)
    inside = field[max(0, y0 - h) : y1 + h, max(0, x0 - h) : x1 + h]
    return bool(inside.size) and bool(inside.min() > 0)


def _background(planes: list[np.ndarray]) -> list[np.ndarray]:
    """The tissue behind any text, per channel (uint8 planes): a median over a window of
    ``TEXT_BACKGROUND`` of the shorter side (on a quarter-size copy), which thin strokes and
    their outlines do not move (a top-hat is pulled down by a dark outline, so the tissue
    beside an outlined glyph stands out of it as ink does)."""
    h, w = planes[0].shape
    qw, qh = max(2, w // 4), max(2, h // 4)
    k = max(5, round(TEXT_BACKGROUND * min(qh, qw))) | 1
    out = []
    for plane in planes:
        q = cv2.medianBlur(cv2.resize(plane, (qw, qh), interpolation=cv2.INTER_AREA), k)
        out.append(cv2.resize(q, (w, h), interpolation=cv2.INTER_LINEAR))
    return out


def _ink_contrast(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (H, W) per polarity (light, dark): how far each pixel stands out of the tissue
    behind it, in any channel (the per-channel excess over the median background, or deficit),
    where that channel is also a narrow peak (its top-hat, or black-hat, by a square of
    ``TEXT_PEAK`` of the shorter side: no wider than a stroke, so the tissue along the field's
    rim, lifted over a background that takes in the dark surround, is not ink; a step edge has
    no top-hat): burned-in ink is a flat colour that may differ from the tissue more in hue
    than in brightness (green on orange)."""
    planes = [np.ascontiguousarray(rgb[..., c]) for c in range(3)]
    backgrounds = _background(planes)
    k = max(5, round(TEXT_PEAK * min(rgb.shape[:2]))) | 1
    square = cv2.getStructuringElement(cv2.MORPH_RECT, (k, k))
    out = []
    for dark in (False, True):
        op = cv2.MORPH_BLACKHAT if dark else cv2.MORPH_TOPHAT
        acc = np.zeros(rgb.shape[:2], np.uint8)
        for plane, bg in zip(planes, backgrounds, strict=True):
            diff = cv2.subtract(bg, plane) if dark else cv2.subtract(plane, bg)
            cv2.max(acc, cv2.min(diff, cv2.morphologyEx(plane, op, square)), dst=acc)
        out.append(acc)
    return out[0], out[1]


def _text_lines_of(
    luma: np.ndarray, rgb: np.ndarray | None = None, field: np.ndarray | None = None
) -> list[tuple[int, int, int, int, bool]]:
    """Lines of burned-in text on the text grid (``luma`` and its ``rgb``, gray where absent;
    ``field``: the field's mask there, where known): (x0, y0, x1, y1, dark) per line."""
    short = min(luma.shape)
    k = max(5, round(0.012 * short)) | 1  # wider than a stroke
    found: list[tuple[int, int, int, int, bool]] = []
    kb = max(7, round(0.03 * short)) | 1  # wider than a progress-bar cell
    if rgb is None:
        rgb = cv2.cvtColor(luma, cv2.COLOR_GRAY2RGB)
    contrasts = _ink_contrast(rgb)
    for dark in (False, True):
        op = cv2.MORPH_BLACKHAT if dark else cv2.MORPH_TOPHAT
        square = cv2.getStructuringElement(cv2.MORPH_RECT, (k, k))
        # light ink: by its colour distance from the tissue behind it (any channel); dark ink:
        # by the luma top-hat, plus the characters only its colour distance finds (a dark
        # colour distance alone also finds the tissue between clustered highlights)
        colour = contrasts[int(dark)] >= TEXT_CONTRAST
        glyphs = _glyphs(luma, colour.view(np.uint8), short, False, dark)
        if dark:
            tophat = cv2.morphologyEx(luma, op, square) >= TEXT_CONTRAST
            glyphs += _without_overlaps(
                _glyphs(luma, tophat.view(np.uint8), short, False, dark), glyphs
            )
        square = cv2.getStructuringElement(cv2.MORPH_RECT, (kb, kb))
        cand = (cv2.morphologyEx(luma, op, square) >= TEXT_CONTRAST).view(np.uint8)
        glyphs += _glyphs(luma, cand, short, True, dark)
        # a lone character is no line unless a run of enough characters (cheap test first)
        lines = [
            _cells_regular(ln)
            for ln in _lines_of(glyphs)
            if len(ln) >= TEXT_BLOCK_CHARS or sum(g.chars for g in ln) >= TEXT_RUN_CHARS
        ]
        lines = [ln for ln in lines if ln and _regular(ln)]
        full = [ln for ln in lines if _is_line(ln, field)]
        for ln in lines:
            if not _is_line(ln, field) and (
                len(ln) < TEXT_BLOCK_CHARS or not any(_in_block(ln, other) for other in full)
            ):
                continue
            ln = _with_marks(ln, glyphs)
            h = _median([g.height for g in ln])
            box = _line_box(ln, h)
            if dark and (_among_highlights(rgb, box) or _shadow_of_light(contrasts, box)):
                continue
            if not _stands_out(rgb, colour.view(np.uint8), box, dark, round(h)):
                continue
            if any(_covers(f, box) for f in found if f[4] == dark):
                found.append((*box, dark))  # searched around already, as a line of a block
                continue
            for part in _extended(ln, rgb, luma, contrasts[int(dark)], dark):
                found.append((*_line_box(part, h), dark))
    return _merged(found)


def _covers(a: tuple[int, int, int, int, bool], b: tuple[int, int, int, int]) -> bool:
    """Whether box ``a`` holds most of box ``b`` (a line found again by its own search)."""
    cols = min(a[2], b[2]) - max(a[0], b[0])
    rows = min(a[3], b[3]) - max(a[1], b[1])
    return cols >= 0.8 * (b[2] - b[0]) and rows >= 0.6 * (b[3] - b[1])


def _line_box(line: list[_Glyph], h: float) -> tuple[int, int, int, int]:
    """The box of a line's characters padded by 0.3 of its cap height ``h`` (at least 1 px)."""
    pad = max(1, round(0.3 * h))
    return (
        min(g.x0 for g in line) - pad,
        min(g.y0 for g in line) - pad,
        max(g.x1 for g in line) + pad,
        max(g.y1 for g in line) + pad,
    )


def _merged(boxes: list[tuple[int, int, int, int, bool]]) -> list[tuple[int, int, int, int, bool]]:
    """Boxes of one polarity that overlap on one row (most of their height) merged into their
    union (a line found twice, once through its marks), in a deterministic order; the lines of a
    block stay apart (a line's box sets the scale of its glyph cover)."""
    out = sorted(boxes)
    merged = True
    while merged:
        merged = False
        for i, a in enumerate(out):
            for j in range(i + 1, len(out)):
                b = out[j]
                rows = min(a[3], b[3]) - max(a[1], b[1])
                if (
                    a[4] == b[4]
                    and min(a[2], b[2]) > max(a[0], b[0])
                    and rows >= 0.6 * min(a[3] - a[1], b[3] - b[1])
                ):
                    out[i] = (
                        min(a[0], b[0]),
                        min(a[1], b[1]),
                        max(a[2], b[2]),
                        max(a[3], b[3]),
                        a[4],
                    )
                    del out[j]
                    merged = True
                    break
            if merged:
                break
    return out


def _with_marks(line: list[_Glyph], glyphs: list[_Glyph]) -> list[_Glyph]:
    """``line`` with the shorter marks beside and within it (brackets, lower case, punctuation
    of 40-100% of the cap height inside its rows, within ``TEXT_GAP`` heights of its ends)."""
    h = _median([g.height for g in line])
    y0, y1 = min(g.y0 for g in line), max(g.y1 for g in line)
    out = list(line)
    members = set(out)  # ``g in out`` by a hash (glyphs are frozen, equal by value)
    changed = True
    while changed:
        changed = False
        x0, x1 = min(g.x0 for g in out), max(g.x1 for g in out)
        for g in glyphs:
            if g in members or g.block or not 0.4 * h <= g.height <= h + 1:
                continue
            inside = g.y0 >= y0 - 0.2 * h and g.y1 <= y1 + 0.2 * h
            if inside and x0 - TEXT_GAP * h <= g.x0 and g.x1 <= x1 + TEXT_GAP * h:
                out.append(g)
                members.add(g)
                changed = True
    return out


def _ink_colour(rgb: np.ndarray, contrast: np.ndarray, line: list[_Glyph]) -> np.ndarray:
    """The ink of a found line, float32 RGB: the per-channel median of the stroke cores of its
    characters (in each glyph box the pixels of at least ``TEXT_CONTRAST`` whose contrast reaches
    the box's upper quartile; an anti-aliased edge is a mix of ink and tissue)."""
    cores = []
    for g in line:
        con = contrast[g.y0 : g.y1, g.x0 : g.x1]
        strong = con >= TEXT_CONTRAST
        if not strong.any():
            continue
        level = max(float(TEXT_CONTRAST), float(np.percentile(con[strong], 75)))
        cores.append(rgb[g.y0 : g.y1, g.x0 : g.x1][con >= level])
    if not cores:
        return np.zeros(3, np.float32)
    return np.median(np.concatenate(cores), axis=0).astype(np.float32)


def _extended(
    seed: list[_Glyph],
    rgb: np.ndarray,
    luma: np.ndarray,
    contrast: np.ndarray,
    dark: bool,
) -> list[list[_Glyph]]:
    """A found line (``seed``) and more of its text, searched with its own ink: its characters
    the search missed (over bright tissue, touching a highlight, of low contrast) and the lines
    of its block. Around the line (``TEXT_REACH`` cap heights to either side, ``TEXT_BLOCK_REACH``
    line heights above and below) a pixel is ink where it lies within ``TEXT_INK_TOL`` levels of
    the line's ink (``_ink_colour``) in every channel and stands ``TEXT_WEAK_CONTRAST`` out of the
    tissue behind it (``contrast``: the line's polarity of ``_ink_contrast``, or a top-hat wider
    than a progress-bar cell). Characters of the line's cap height (within a quarter) on its
    rows extend it, chained at most ``TEXT_GAP`` heights apart, with the shorter marks between;
    on other rows, two or more such characters left-aligned with the line (within one height)
    are a line of its block, which is searched around in turn. Returns the lines, the extended
    seed first."""
    th, tw = luma.shape
    h = _median([g.height for g in seed if not g.block] or [g.height for g in seed])
    ink = _ink_colour(rgb, contrast, seed)
    ink_levels = [np.array([round(float(v))], np.float64) for v in ink]  # OpenCV scalars
    lines = [list(seed)]
    todo = [0]
    seen = 0
    while todo and seen < TEXT_MAX_BLOCK_LINES:
        idx = todo.pop(0)
        seen += 1
        line = lines[idx]
        lx0, ly0 = min(g.x0 for g in line), min(g.y0 for g in line)
        lx1, ly1 = max(g.x1 for g in line), max(g.y1 for g in line)
        reach, rows = round(TEXT_REACH * h), round(TEXT_BLOCK_REACH * h)
        wx0, wy0 = max(0, lx0 - reach), max(0, ly0 - rows)
        wx1, wy1 = min(tw, lx1 + reach), min(th, ly1 + rows)
        if wx1 - wx0 < 3 or wy1 - wy0 < 3:
            continue
        crop = rgb[wy0:wy1, wx0:wx1]
        far = np.zeros(crop.shape[:2], np.uint8)
        for c in range(3):
            cv2.max(far, cv2.absdiff(np.ascontiguousarray(crop[..., c]), ink_levels[c]), dst=far)
        close = far <= TEXT_INK_TOL
        lw = luma[wy0:wy1, wx0:wx1]
        kb = max(3, round(1.6 * h)) | 1
        op = cv2.MORPH_BLACKHAT if dark else cv2.MORPH_TOPHAT
        wide = cv2.morphologyEx(lw, op, cv2.getStructuringElement(cv2.MORPH_RECT, (kb, kb)))
        weak = (contrast[wy0:wy1, wx0:wx1] >= TEXT_WEAK_CONTRAST) | (wide >= TEXT_WEAK_CONTRAST)
        cand = (close & weak).view(np.uint8)
        heights = (max(3, round(0.4 * h)), round(1.4 * h) + 1)
        found = _glyphs(lw, cand, 0, False, dark, heights, (wx0, wy0))
        found += _without_overlaps(_glyphs(lw, cand, 0, True, dark, heights, (wx0, wy0)), found)
        full = [g for g in found if abs(g.height - h) <= 0.25 * h + 1]
        # the line's own rows: chain outward from its ends
        tol = 0.3 * h + 1
        on_row = [
            g for g in full
            if abs(g.y1 - ly1) <= tol or abs(g.y0 - ly0) <= tol
        ]
        x0, x1 = lx0, lx1
        grown = True
        while grown:
            grown = False
            for g in on_row:
                left = x0 - TEXT_GAP * h <= g.x1 <= x0
                right = x1 <= g.x0 <= x1 + TEXT_GAP * h
                if left or right:
                    x0, x1 = min(x0, g.x0), max(x1, g.x1)
                    grown = True
        added = _without_overlaps(
            [
                g for g in found
                if g.x0 >= x0 - 1 and g.x1 <= x1 + 1 and g.y0 >= ly0 - tol and g.y1 <= ly1 + tol
            ],
            line,
        )
        line.extend(added)
        # other rows: lines of the block, left-aligned with this one
        rest = [g for g in full if g.y1 <= ly0 + tol or g.y0 >= ly1 - tol]
        rest = _without_overlaps(rest, [o for ln in lines for o in ln])
        for other in _lines_of(rest):
            other = _cells_regular(other)
            if not other or not _regular(other):
                continue
            if sum(g.chars for g in other) < 2 or abs(min(g.x0 for g in other) - lx0) > h:
                continue
            oy0, oy1 = min(g.y0 for g in other), max(g.y1 for g in other)
            if any(
                min(oy1, max(g.y1 for g in ln)) - max(oy0, min(g.y0 for g in ln)) > 0.5 * h
                for ln in lines
            ):
                continue  # a row already in the block
            in_other = set(other)
            marks = [
                g for g in found
                if g not in in_other and g.y0 >= oy0 - tol and g.y1 <= oy1 + tol
                and min(g.x0 for g in other) - 1 <= g.x0 and g.x1 <= max(g.x1 for g in other) + 1
            ]
            lines.append(other + marks)
            todo.append(len(lines) - 1)
    return lines


def _stands_out(
    rgb: np.ndarray, cand: np.ndarray, box: tuple[int, int, int, int], dark: bool, reach: int
) -> bool:
    """The ink of a line (the per-channel median of its candidate pixels ``cand`` in its box)
    differs from the tissue around the box (the per-channel median of a ring of ``reach`` px) by
    ``TEXT_CONTRAST`` in some channel, in the line's polarity: the tissue showing between and
    inside light glyphs is not dark ink, nor the reverse."""
    h, w = cand.shape
    x0, y0, x1, y1 = max(0, box[0]), max(0, box[1]), min(w, box[2]), min(h, box[3])
    ox0, oy0, ox1, oy1 = max(0, x0 - reach), max(0, y0 - reach), min(w, x1 + reach), min(h, y1 + reach)
    outer = rgb[oy0:oy1, ox0:ox1]
    ring = np.ones(outer.shape[:2], bool)
    ring[y0 - oy0 : y1 - oy0, x0 - ox0 : x1 - ox0] = False
    strokes = cand[y0:y1, x0:x1] > 0
    if not ring.any() or not strokes.any():
        return False
    around = np.median(outer[ring], axis=0)
    ink = np.median(rgb[y0:y1, x0:x1][strokes], axis=0)
    return float(np.max(around - ink if dark else ink - around)) >= TEXT_CONTRAST


def _shadow_of_light(contrasts: tuple[np.ndarray, np.ndarray], box: tuple[int, int, int, int]) -> bool:
    """Whether a dark line's box holds more light ink than dark (``contrasts``: light, dark, as
    ``_ink_contrast``): the drop shadow or outline of light text, whose ink is the light
    strokes, not dark ink with a light outline (the outline is the thinner)."""
    x0, y0, x1, y1 = max(0, box[0]), max(0, box[1]), box[2], box[3]
    light = int(np.count_nonzero(contrasts[0][y0:y1, x0:x1] >= TEXT_CONTRAST))
    return light > int(np.count_nonzero(contrasts[1][y0:y1, x0:x1] >= TEXT_CONTRAST))


def _among_highlights(rgb: np.ndarray, box: tuple[int, int, int, int]) -> bool:
    """Whether a box holds ``TEXT_HIGHLIGHT_SHARE`` of near-white pixels (every channel at least
    ``HIGHLIGHT_LEVEL``): the tissue between clustered specular highlights stands out dark as
    dark ink does; dark ink over the tissue (even with a light outline) has next to none."""
    x0, y0, x1, y1 = max(0, box[0]), max(0, box[1]), box[2], box[3]
    crop = rgb[y0:y1, x0:x1]
    if crop.size == 0:
        return False
    low = crop.min(axis=2)
    return float((low >= round(HIGHLIGHT_LEVEL * 255)).mean()) >= TEXT_HIGHLIGHT_SHARE


def _in_block(line: list[_Glyph], other: list[_Glyph]) -> bool:
    """``line`` stands in a block with ``other``: left-aligned (within one cap height), the
    same cap height and ink, at most 2.5 line heights above or below."""
    h = _median([g.height for g in other])
    hl = _median([g.height for g in line])
    return (
        abs(hl - h) <= 0.2 * h + 1
        and abs(min(g.x0 for g in line) - min(g.x0 for g in other)) <= h
        and abs(min(g.y0 for g in line) - min(g.y0 for g in other)) <= 2.5 * h
        and abs(_median([g.ink for g in line]) - _median([g.ink for g in other]))
        <= 40
    )


def _text_lines(rgb: np.ndarray, hull: np.ndarray) -> list[tuple[int, int, int, int, bool]]:
    """Burned-in text lines over the field (``hull``: the field's hull on the analysis grid), in
    image pixels: (x0, y0, x1, y1, dark). Searched on a grid of shorter side ``TEXT_GRID_SHORT``
    in both polarities; a light and a dark line that overlap are both kept (ink and its outline
    of the other polarity: each keeps its strokes; the tissue between light glyphs does not
    stand out as dark ink, ``_stands_out``); a line must reach into the field (text wholly in the surround is an
    overlay of the surround already)."""
    h, w = rgb.shape[:2]
    scale = min(1.0, TEXT_GRID_SHORT / min(h, w))
    th, tw = max(2, round(h * scale)), max(2, round(w * scale))
    small = cv2.resize(rgb, (tw, th), interpolation=cv2.INTER_AREA) if (th, tw) != (h, w) else rgb
    luma = cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)
    field = cv2.resize(hull, (tw, th), interpolation=cv2.INTER_NEAREST)
    found = _text_lines_of(luma, small, field)
    sx, sy = w / tw, h / th
    out = []
    for ln in found:
        x0, y0, x1, y1, dark = max(0, ln[0]), max(0, ln[1]), min(tw, ln[2]), min(th, ln[3]), ln[4]
        if x1 <= x0 or y1 <= y0 or field[y0:y1, x0:x1].mean() < TEXT_IN_FIELD:
            continue
        out.append(
            (
                max(0, int(np.floor(x0 * sx))),
                max(0, int(np.floor(y0 * sy))),
                min(w, int(np.ceil(x1 * sx))),
                min(h, int(np.ceil(y1 * sy))),
                dark,
            )
        )
    return out


Analysed = tuple[dict[str, Any], str, str]


def described(desc: dict[str, Any]) -> Analysed:
    """(descriptor, its JSON text, its sorted JSON: the key of the mask caches) of a fresh
    analysis, as ``analysed`` returns it. Used by the endoscopy and the radiograph analyses."""
    text = json.dumps(desc)
    # the sorted JSON is masks.descriptor_key's, written here: masks imports this module
    return json.loads(text), text, json.dumps(desc, sort_keys=True)


def _pixels(image: Any) -> tuple[str, np.ndarray]:
    """The pixels of ``image`` as a C-contiguous array without a copy where possible, with a
    tag of their layout: a CPU torch tensor (CHW) as it is, a NumPy array as it is, anything
    else converted by ``to_hwc_u8``."""
    if hasattr(image, "detach"):
        t = image.detach()
        if (
            t.device.type == "cpu"
            and t.is_contiguous()
            and t.ndim == 3
            and str(t.dtype) in _NATIVE_TORCH
        ):
            return "chw", t.numpy()
    elif (
        isinstance(image, np.ndarray) and image.flags.c_contiguous and image.dtype in _NATIVE_NUMPY
    ):
        return "np", image
    return "hwc", to_hwc_u8(image)


_NATIVE_TORCH = frozenset({"torch.uint8", "torch.uint16", "torch.float32"})
_NATIVE_NUMPY = frozenset({np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32)})


def analyse(image: Any) -> dict[str, Any]:
    """The scene descriptor of one image (see the module docstring); JSON-able, deterministic.
    Each call analyses the pixels: callers that need the scene of one image several times
    analyse it once and pass it on (``perturb.apply(..., scenes=)``, ``Scene.of``)."""
    return dict(json.loads(analysed(image)[1]))


def analysed(image: Any, chw: bool = False) -> tuple[dict[str, Any], str, str]:
    """``analyse(image)`` with its texts: (descriptor; its JSON text, whose ``json.loads`` is
    what ``analyse`` returns; its ``perturb.scene.masks.descriptor_key``, the sorted JSON the
    mask caches are keyed by). ``chw``: ``image`` is a CHW NumPy array (uint8, uint16 or
    float32 in [0, 1]), as the engine holds a batch on the host."""
    if chw:
        arr = np.ascontiguousarray(image)
        layout = "chw"
        if arr.dtype not in _NATIVE_NUMPY:
            raise ValueError(
                f"a CHW array to analyse must be uint8, uint16 or float32, got {arr.dtype}"
            )
    else:
        layout, arr = _pixels(image)
    if layout == "hwc":
        rgb = arr
    elif layout == "chw":
        rgb = to_hwc_u8(np.moveaxis(arr, 0, -1))
    else:
        rgb = to_hwc_u8(image)
    return described(_analyse(rgb))


def _analyse(rgb: np.ndarray) -> dict[str, Any]:
    h, w = rgb.shape[:2]
    gh, gw = grid_size(h, w)
    small = cv2.resize(rgb, (gw, gh), interpolation=cv2.INTER_AREA) if (gh, gw) != (h, w) else rgb
    sx, sy = w / gw, h / gh
    v = cv2.medianBlur(cv2.max(cv2.max(small[..., 0], small[..., 1]), small[..., 2]), 3)
    dark = v < DARK_LEVEL
    surround = _edge_connected(dark)
    overlays: list[list[Any]] = []

    def to_image(box: tuple[int, int, int, int], kind: str, pad: int = 1) -> None:
        x0, y0, x1, y1 = box
        overlays.append(
            [
                max(0, int(np.floor((x0 - pad) * sx))),
                max(0, int(np.floor((y0 - pad) * sy))),
                min(w, int(np.ceil((x1 + pad) * sx))),
                min(h, int(np.ceil((y1 + pad) * sy))),
                kind,
            ]
        )

    scope = _scope_boxes(small)
    bright = (~surround).astype(np.uint8)
    for x0, y0, x1, y1 in scope:
        to_image((x0, y0, x1, y1), "scope_box")
        bright[max(0, y0 - 1) : y1 + 1, max(0, x0 - 1) : x1 + 1] = 0
    # thin bright structures (glyph strokes, icon outlines) touching the field are cut off by an
    # opening, then the largest component is the field
    stroke = max(2, round(0.012 * min(gh, gw)))
    opener = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * stroke + 1, 2 * stroke + 1))
    core = cv2.morphologyEx(bright, cv2.MORPH_OPEN, opener)
    n, labels, stats = _components(core)
    areas = stats[1:, cv2.CC_STAT_AREA]
    main = 1 + int(np.argmax(areas)) if n > 1 else 0
    if n <= 1 or areas[main - 1] < MIN_FIELD_FRACTION * gh * gw:
        lines = _text_lines(rgb, np.ones((gh, gw), np.uint8))
        overlays.extend([*box, TEXT_KINDS[int(dark)]] for *box, dark in lines)
        return _full_frame(h, w, gh, gw, overlays, len(lines))
    field = (labels == main).astype(np.uint8)
    radius = max(1, round(0.01 * min(gh, gw)))
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
    field = cv2.morphologyEx(field, cv2.MORPH_CLOSE, kernel)
    contours, _ = cv2.findContours(field, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    hull = cv2.convexHull(np.concatenate(contours))
    poly = cv2.approxPolyDP(hull, 0.5, True).reshape(-1, 2)
    hull_mask = np.zeros((gh, gw), np.uint8)
    cv2.fillPoly(hull_mask, [poly.astype(np.int32)], 1)
    for box in _black_boxes(v, hull_mask):
        to_image(box, "black_box")
    lines = _text_lines(rgb, hull_mask)
    overlays.extend([*box, TEXT_KINDS[int(dark)]] for *box, dark in lines)
    # bright things outside the field's hull (and off its soft edge): text, icons, insets
    near = cv2.dilate(hull_mask, np.ones((5, 5), np.uint8))
    outside = ((v >= OVERLAY_LEVEL) & (near == 0)).astype(np.uint8)
    n_out, _, stats_out = _components(outside)
    for i in range(1, n_out):
        if stats_out[i, cv2.CC_STAT_AREA] < 2:
            continue
        x0, y0, x1, y1 = _rect(stats_out[i])
        if hull_mask[y0:y1, x0:x1].mean() > 0.2:  # a rectangle reaching into the field: leave it
            continue
        big = (x1 - x0) * (y1 - y0) * sx * sy > 0.004 * h * w
        to_image((x0, y0, x1, y1), "inset" if big else "glyph")
    kept = overlays
    fx, fy, fw, fh = cv2.boundingRect(poly.astype(np.int32))
    bbox = [
        max(0, int(np.floor((fx - 2) * sx))),
        max(0, int(np.floor((fy - 2) * sy))),
        min(w, int(np.ceil((fx + fw + 2) * sx))),
        min(h, int(np.ceil((fy + fh + 2) * sy))),
    ]
    return {
        "version": SCENE_VERSION,
        "size": [h, w],
        "grid": [gh, gw],
        "field": [[int(x), int(y)] for x, y in poly],
        "bbox": bbox,
        "overlays": kept,
        "text": _text_entry(len(lines)),
    }


def _text_entry(lines: int) -> str:
    """The descriptor's ``text`` entry: what the text search found over the field, said even
    where it found nothing (records and manifests carry it)."""
    return "none found" if lines == 0 else f"{lines} line{'s' if lines > 1 else ''} over the field"


def _full_frame(
    h: int, w: int, gh: int, gw: int, overlays: list[list[Any]], lines: int
) -> dict[str, Any]:
    """Descriptor of a frame without a detectable dark surround: the field is the whole image."""
    return {
        "version": SCENE_VERSION,
        "size": [h, w],
        "grid": [gh, gw],
        "field": [[0, 0], [gw - 1, 0], [gw - 1, gh - 1], [0, gh - 1]],
        "full": True,
        "bbox": [0, 0, w, h],
        "overlays": overlays,
        "text": _text_entry(lines),
    }


def highlight_mask(rgb: np.ndarray, field: np.ndarray) -> np.ndarray:
    """Bool (H, W): specular highlights (near-white, every channel above ``HIGHLIGHT_LEVEL``)
    inside the field."""
    low = cv2.min(cv2.min(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    white = np.greater_equal(low, round(HIGHLIGHT_LEVEL * 255))
    white &= field > 0.5
    return white
