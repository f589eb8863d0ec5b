"""Masks rebuilt from a scene descriptor (deterministic: the same descriptor gives the same
bytes): field, overlays, tissue, text lines and their glyph strokes. How ops composite a
perturbed layer back into the frame with them is :mod:`perturb.ops.composite`."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from functools import wraps
from typing import Any, TypeVar, cast

import cv2
import numpy as np

from perturb.scene.analysis import TEXT_KINDS

FEATHER_GRID_PX = 0.6  # sigma of the aperture's soft edge, in analysis-grid pixels
# 8-bit luma excess over the local background: no glyph .. full glyph
GLYPH_LOW, GLYPH_HIGH = 24, 64
# full cover from this fraction of the median excess of the line's strong stroke pixels
GLYPH_FULL = 0.85
# ink of the opposite polarity enclosed by the strokes (``_enclosed_ink``): in gaps up to this
# fraction of the cap height wide, wholly covered from at least this many levels below the tissue
ENCLOSED_WIDTH, OUTLINE_FULL_MIN = 0.15, 40
GLYPH_KERNEL = 0.6  # top-hat square side, as a fraction of the text box's height
# ... or from the ink's share of a pixel against the tissue right behind it: no cover at this
# share, full cover from this share; the ink stands at least this many levels off that tissue
GLYPH_SHARE_LOW, GLYPH_SHARE_FULL, GLYPH_SHARE_SPAN = 0.35, 0.75, 32
# Solid blocks of a text line (progress bars "■■■/■■■", a cursor): wider than a stroke, so the
# top-hat misses their inside; drawn in the line's ink, so they are found by colour and shape.
# 8-bit luma at most this below the line's ink (the median luma of its strong strokes)
BLOCK_TOL = 32
BLOCK_CHROMA = 32  # max - min channel (8-bit) at most this: white or gray, not tissue colour
# a block holds a square of this fraction of the text box's height; a stroke does not
BLOCK_SIDE = 0.3
BLOCK_FILL = 0.9  # a block fills at least this fraction of its bounding rectangle
BLOCK_EDGE = 64  # a block stands at least this many levels above the ring 3 px around it (a drawn
#   edge; a specular highlight falls off softly)


def descriptor_key(desc: dict[str, Any]) -> str:
    """The canonical text of a descriptor (sorted JSON): what the mask caches are keyed by."""
    return json.dumps(desc, sort_keys=True)


_key = descriptor_key


# Masks of recent descriptors, kept within a byte budget (a batch of 32 frames at 720x576 fits;
# fewer at full HD): the same frames under several ops or rounds rebuild nothing.
_MEMO: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
_MEMO_BUDGET = 320 << 20
_MEMO_STATE = {"bytes": 0}
_MEMO_LOCK = threading.Lock()
_T = TypeVar("_T")


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, tuple):
        return sum(_nbytes(v) for v in value) + 64
    if is_dataclass(value):
        return sum(_nbytes(getattr(value, f.name)) for f in fields(value)) + 64
    return 64


def derived(name: str, key: str, compute: Callable[[], _T]) -> _T:
    """``compute()`` kept under (``name``, ``key``) in the shared budgeted LRU of what scenes
    derive: ``compute`` must be a pure function of the descriptor key ``key`` (and of what
    ``name`` says, e.g. a parameter), never of pixels."""
    slot = (name, key)
    with _MEMO_LOCK:
        hit = _MEMO.get(slot)
        if hit is not None:
            _MEMO.move_to_end(slot)
            return cast(_T, hit[0])
    value = compute()
    size = _nbytes(value)
    with _MEMO_LOCK:
        if slot not in _MEMO:
            _MEMO[slot] = (value, size)
            _MEMO_STATE["bytes"] += size
            while _MEMO_STATE["bytes"] > _MEMO_BUDGET and len(_MEMO) > 1:
                _, (_, freed) = _MEMO.popitem(last=False)
                _MEMO_STATE["bytes"] -= freed
    return value


def _memo(fn: Callable[[str], _T]) -> Callable[[str], _T]:
    """Cache ``fn(key)`` (a pure function of the descriptor key) in the shared budgeted LRU."""
    name = fn.__qualname__

    @wraps(fn)
    def cached(key: str) -> _T:
        return derived(name, key, lambda: fn(key))

    return cached


def field_alpha(desc: dict[str, Any]) -> np.ndarray:
    """float32 (H, W) in [0, 1]: 1 inside the field of view, 0 in the surround, a smooth
    anti-aliased edge (read-only, cached)."""
    return _field_alpha(_key(desc))


@_memo
def _field_alpha(key: str) -> np.ndarray:
    desc = json.loads(key)
    h, w = desc["size"]
    if desc.get("full"):
        out = np.ones((h, w), np.float32)
    else:
        gh, gw = desc["grid"]
        canvas = np.zeros((gh, gw), np.float32)
        cv2.fillPoly(canvas, [np.asarray(desc["field"], np.int32)], 1.0)
        canvas = cv2.GaussianBlur(canvas, (0, 0), FEATHER_GRID_PX, borderType=cv2.BORDER_REPLICATE)
        out = np.asarray(
            cv2.resize(canvas, (w, h), interpolation=cv2.INTER_LINEAR), dtype=np.float32
        )
        # exact 0 and 1 away from the edge: rescale so 1/512 -> 0 and 1 - 1/512 -> 1, then clip
        out -= np.float32(1.0 / 512)
        out *= np.float32(1.0 / (1.0 - 2.0 / 512))
        np.clip(out, 0.0, 1.0, out=out)
    out.flags.writeable = False
    return out


def overlay_mask(desc: dict[str, Any]) -> np.ndarray:
    """bool (H, W): on-screen overlays (text, icons, scope boxes, insets, black boxes)."""
    return _overlay_mask(_key(desc))


@_memo
def _overlay_mask(key: str) -> np.ndarray:
    desc = json.loads(key)
    h, w = desc["size"]
    out = np.zeros((h, w), bool)
    for x0, y0, x1, y1, _kind in desc["overlays"]:
        out[y0:y1, x0:x1] = True
    out.flags.writeable = False
    return out


def tissue_alpha(desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """float32 (H, W): where a perturbation of the tissue layer shows, the field of view minus
    the overlays (read-only, cached). ``key``: ``descriptor_key(desc)`` where known."""
    return _tissue_alpha(_key(desc) if key is None else key)


@_memo
def _tissue_alpha(key: str) -> np.ndarray:
    desc = json.loads(key)
    alpha = field_alpha(desc).copy()
    # 0 on the overlay mask (the union of the overlays' rectangles, ``_overlay_mask``), set
    # rectangle by rectangle: a boolean-mask assignment scans every pixel (about 0.5 ms at 512 px,
    # paid by every scene a warp moves)
    for x0, y0, x1, y1, _kind in desc["overlays"]:
        alpha[y0:y1, x0:x1] = 0.0
    alpha.flags.writeable = False
    return alpha


def tissue_alpha_sum(desc: dict[str, Any], key: str | None = None) -> float:
    """The float64 sum of ``tissue_alpha(desc)`` (cached). ``key``: as in ``tissue_alpha``."""
    return _tissue_alpha_sum(_key(desc) if key is None else key)


@_memo
def _tissue_alpha_sum(key: str) -> float:
    return float(_tissue_alpha(key).astype(np.float64).sum())


def bbox(desc: dict[str, Any]) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the field of view in image pixels (outside it nothing changes)."""
    x0, y0, x1, y1 = desc["bbox"]
    return int(x0), int(y0), int(x1), int(y1)


def _box_u8(crop: np.ndarray) -> np.ndarray:
    """uint8 (C, h, w) of a CHW crop (uint8, uint16, or float in [0, 1]); the same bytes on every path."""
    if crop.dtype == np.uint8:
        return crop
    if crop.dtype == np.uint16:
        return (crop >> 8).astype(np.uint8)
    return np.clip(np.rint(crop.astype(np.float32) * np.float32(255.0)), 0, 255).astype(np.uint8)


def _box_luma(u8: np.ndarray) -> np.ndarray:
    """uint8 (h, w) BT.601 luma of a uint8 CHW crop, integer arithmetic so every path gets the
    same bytes."""
    if u8.shape[0] == 1:
        return np.ascontiguousarray(u8[0])
    r, g, b = (u8[c].astype(np.uint32) for c in range(3))
    return ((77 * r + 150 * g + 29 * b + 128) >> 8).astype(np.uint8)


def text_boxes(desc: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """(x0, y0, x1, y1) of the overlays of kinds ``TEXT_KINDS`` (burned-in lines of light or
    dark ink, possibly over tissue)."""
    return [
        (int(a), int(b), int(c), int(d)) for a, b, c, d, k in desc["overlays"] if k in TEXT_KINDS
    ]


def _dark_ink(desc: dict[str, Any], box: tuple[int, int, int, int]) -> bool:
    """Whether the text line of ``box`` is drawn in dark ink (kind ``text_dark``)."""
    return any(k == "text_dark" and (a, b, c, d) == box for a, b, c, d, k in desc["overlays"])


def glyph_window(
    desc: dict[str, Any], box: tuple[int, int, int, int]
) -> tuple[int, int, int, int, int]:
    """(x0, y0, x1, y1, k): the window around a text box that ``glyph_strokes`` reads (the box
    padded by the top-hat size ``k``, clipped to the image)."""
    h, w = desc["size"]
    x0, y0, x1, y1 = box
    k = max(3, round(GLYPH_KERNEL * (y1 - y0))) | 1
    return max(0, x0 - k), max(0, y0 - k), min(w, x1 + k), min(h, y1 + k), k


def glyph_strokes(
    window: np.ndarray, desc: dict[str, Any], box: tuple[int, int, int, int]
) -> np.ndarray:
    """float32 (y1 - y0, x1 - x0) in [0, 1]: how much of each pixel of a text box is glyph
    stroke, from ``window`` (CHW pixels of the clean image inside ``glyph_window(desc, box)``).
    The stroke's excess over the local background (the largest white top-hat of the three
    channels: a channel minus its opening by a square of ``k``; coloured ink may differ from
    the tissue more in hue than in luma) ramps from 0 at ``GLYPH_LOW`` levels to 1 at ``GLYPH_FULL`` of
    the median excess of the line's strong pixels (at least ``GLYPH_HIGH``), so the anti-aliased
    edge of a stroke is a partial cover in proportion, as the processor drew it. Solid blocks
    of the line (``solid_blocks``) are covered whole. A line of dark ink (kind ``text_dark``)
    is read on the inverted luma. The pixels next to a fully covered one (a 1 px rim: the
    anti-aliased edge a processor blends into the tissue) and an outline of the opposite
    polarity within 2 px of the strong strokes are covered too, so the drawn glyph survives an
    op that moves the tissue by many levels."""
    wx0, wy0, _, _, k = glyph_window(desc, box)
    u8 = _box_u8(window)
    luma = _box_luma(u8)
    dark = _dark_ink(desc, box)
    if dark:
        luma = cv2.bitwise_not(luma)
    square = cv2.getStructuringElement(cv2.MORPH_RECT, (k, k))
    # the excess in any channel: ink may differ from the tissue more in hue than in luma
    planes = [cv2.bitwise_not(c) if dark else c for c in u8] if u8.shape[0] == 3 else [luma]
    tophat: np.ndarray | None = None
    for plane in planes:
        th = cv2.morphologyEx(
            np.ascontiguousarray(plane), cv2.MORPH_TOPHAT, square, borderType=cv2.BORDER_REPLICATE
        )
        tophat = th if tophat is None else cv2.max(tophat, th)
    assert tophat is not None
    x0, y0, x1, y1 = box
    inside = (slice(y0 - wy0, y1 - wy0), slice(x0 - wx0, x1 - wx0))
    excess = tophat[inside].astype(np.float32)
    is_strong = excess >= GLYPH_HIGH
    strong = excess[is_strong]
    # a stroke's full excess: most of the line's strong stroke pixels reach it
    full = (
        max(float(GLYPH_HIGH), GLYPH_FULL * float(_median(strong)))
        if strong.size
        else float(GLYPH_HIGH)
    )
    cover = (excess - np.float32(GLYPH_LOW)) * np.float32(1.0 / (full - GLYPH_LOW))
    np.clip(cover, np.float32(0.0), np.float32(1.0), out=cover)
    if strong.size:
        # the ink's share of a pixel against the tissue right behind it (its luma less its luma
        # top-hat): a stroke over bright tissue stands out of it less than over dark tissue, but
        # it is as much ink
        luma_hat = cv2.morphologyEx(luma, cv2.MORPH_TOPHAT, square, borderType=cv2.BORDER_REPLICATE)
        hat = luma_hat[inside].astype(np.float32)
        behind = luma[inside].astype(np.float32) - hat
        ink_luma = np.float32(_median(luma[inside][is_strong]))
        share = hat / np.maximum(ink_luma - behind, np.float32(GLYPH_SHARE_SPAN))
        share = (share - np.float32(GLYPH_SHARE_LOW)) * np.float32(
            1.0 / (GLYPH_SHARE_FULL - GLYPH_SHARE_LOW)
        )
        share[hat < GLYPH_LOW] = 0.0
        np.clip(share, np.float32(0.0), np.float32(1.0), out=share)
        np.maximum(cover, share, out=cover)
        # ink also stands out of the line's tissue (each channel's median away from the
        # strokes) in some channel: the tissue beside a wide dark block, lifted in the top-hat
        # by the block, does not
        apart = ~cv2.dilate(is_strong.view(np.uint8), np.ones((5, 5), np.uint8)).view(bool)
        if apart.any():
            lifted = np.zeros(excess.shape, bool)
            for plane in planes:
                box_plane = plane[inside]
                level = int(_median(box_plane[apart]))
                lifted |= box_plane.astype(np.int16) - level >= GLYPH_LOW
            cover[~lifted] = 0.0
        ink = int(_median(luma[inside][is_strong]))
        blocks = solid_blocks(u8, luma, (x0 - wx0, y0 - wy0, x1 - wx0, y1 - wy0), ink)
        if blocks is not None:
            np.maximum(cover, blocks[inside], out=cover)
        # an outline of the opposite polarity hugging the strokes (within 2 px): darker than
        # the tissue of the line (the median away from its strokes), which the tissue showing
        # between two strokes is not
        near = cv2.dilate(is_strong.view(np.uint8), np.ones((5, 5), np.uint8)).view(bool)
        box_luma = luma[inside]
        away = box_luma[~near]
        background = np.float32(_median(away)) if away.size else np.float32(0.0)
        below = background - box_luma.astype(np.float32)
        outline = (below - np.float32(GLYPH_LOW)) * np.float32(1.0 / (GLYPH_HIGH - GLYPH_LOW))
        np.clip(outline, np.float32(0.0), np.float32(1.0), out=outline)
        outline[~near] = 0.0
        np.maximum(cover, outline, out=cover)
        np.maximum(cover, _enclosed_ink(below, is_strong, y1 - y0), out=cover)
    else:
        cover = np.ascontiguousarray(cover)
    rim = cv2.dilate((cover >= 1.0).view(np.uint8), np.ones((3, 3), np.uint8)).view(bool)
    cover[rim] = 1.0
    return cover


def _median(values: np.ndarray) -> float:
    """``np.median`` of a non-empty array of 8-bit levels (or their halves and quarters, all
    exact in float32): the middle of the sorted values, the mean of the two middle ones for an
    even count, the same value by one partial sort. ``np.median``'s generic path (a mean
    reduction, dtype checks) costs about 60 us a call, several times this on the small text
    windows ``glyph_strokes`` reads seven times each."""
    flat = values.reshape(-1)
    half = flat.size // 2
    if flat.size % 2:
        return float(np.partition(flat, half)[half])
    ordered = np.partition(flat, (half - 1, half))
    return (float(ordered[half - 1]) + float(ordered[half])) / 2.0


def _enclosed_ink(below: np.ndarray, is_strong: np.ndarray, box_height: int) -> np.ndarray:
    """float32 cover of ink of the opposite polarity enclosed by a line's strong strokes (dark
    ink inside a light outline, which the search may find as the light line; ``below``: each
    pixel's depth below the line's tissue, 8-bit levels): the pixels in the gaps between strong
    strokes no wider than ``ENCLOSED_WIDTH`` of the cap height along a row, a column or a diagonal
    (closings by a line), ramped
    from ``GLYPH_LOW`` to ``GLYPH_SHARE_FULL`` (the ink's share of a pixel from which a stroke is
    wholly ink) of the median depth of those at least ``GLYPH_LOW`` deep
    (within ``OUTLINE_FULL_MIN`` .. ``GLYPH_HIGH``). Such ink is one flat colour, but over
    bright tissue it may stand less than ``GLYPH_HIGH`` below it: its own pixels set the scale,
    as the strokes' do for their cover."""
    cap = box_height / (1.0 + 2.0 * 0.3)  # the text box pads the cap height by 0.3 each side
    side = 2 * max(2, round(ENCLOSED_WIDTH * cap / 2)) + 1
    strong = is_strong.view(np.uint8)
    closed = np.zeros_like(strong)
    for line in _lines(side):
        cv2.bitwise_or(closed, cv2.morphologyEx(strong, cv2.MORPH_CLOSE, line), dst=closed)
    enclosed = closed.view(bool) & ~is_strong
    out = np.zeros(below.shape, np.float32)
    deep = below[enclosed & (below >= GLYPH_LOW)]
    if not deep.size:
        return out
    full = min(float(GLYPH_HIGH), max(float(OUTLINE_FULL_MIN), GLYPH_SHARE_FULL * float(_median(deep))))
    ramp = (below[enclosed] - np.float32(GLYPH_LOW)) * np.float32(1.0 / (full - GLYPH_LOW))
    out[enclosed] = np.clip(ramp, np.float32(0.0), np.float32(1.0))
    return out


def _lines(side: int) -> tuple[np.ndarray, ...]:
    """Structuring elements of ``side`` pixels along a row, a column and both diagonals."""
    diagonal = np.eye(side, dtype=np.uint8)
    return np.ones((1, side), np.uint8), np.ones((side, 1), np.uint8), diagonal, diagonal[::-1].copy()


def solid_blocks(
    u8: np.ndarray, luma: np.ndarray, box: tuple[int, int, int, int], ink: int
) -> np.ndarray | None:
    """float32 (h, w) cover of the solid blocks of a text line in a glyph window (``u8``: its
    uint8 CHW pixels, ``luma`` their luma; ``box``: the text box in window pixels; ``ink``: the
    luma of the line's strokes), or None where it has none. A block is a region as bright as the
    ink (at most ``BLOCK_TOL`` below), white or gray (``BLOCK_CHROMA``), that holds a square of
    ``BLOCK_SIDE`` of the box height, fills ``BLOCK_FILL`` of its bounding rectangle, lies within
    the box's rows and stands ``BLOCK_EDGE`` above the ring around it. It is covered whole; its
    anti-aliased rim (2 px) ramps with the excess over the ring's median as a stroke's does."""
    bx0, by0, bx1, by1 = box
    side = (
        max(3, round(BLOCK_SIDE * (by1 - by0))) | 1
    )  # odd: an even square would shift the opening
    if by1 - by0 < side or bx1 - bx0 < side:
        return None
    near = luma >= ink - BLOCK_TOL
    if u8.shape[0] == 3:
        near &= (
            cv2.subtract(
                cv2.max(cv2.max(u8[0], u8[1]), u8[2]), cv2.min(cv2.min(u8[0], u8[1]), u8[2])
            )
            <= BLOCK_CHROMA
        )
    solid = cv2.morphologyEx(near.astype(np.uint8), cv2.MORPH_OPEN, np.ones((side, side), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(solid, connectivity=4)
    out: np.ndarray | None = None
    h, w = luma.shape
    for i in range(1, n):
        x, y, bw, bh, area = (int(v) for v in stats[i])
        if y < by0 or y + bh > by1 or area < BLOCK_FILL * bw * bh:
            continue
        cy0, cx0, cy1, cx1 = max(0, y - 3), max(0, x - 3), min(h, y + bh + 3), min(w, x + bw + 3)
        block = labels[cy0:cy1, cx0:cx1] == i
        rim = cv2.dilate(block.view(np.uint8), np.ones((5, 5), np.uint8)).view(bool)  # within 2 px
        ring = (
            cv2.dilate(block.view(np.uint8), np.ones((7, 7), np.uint8)).view(bool) & ~rim
        )  # at 3 px
        patch = luma[cy0:cy1, cx0:cx1]
        if not ring.any():
            continue
        level, background = float(_median(patch[block])), float(_median(patch[ring]))
        if level - background < BLOCK_EDGE:
            continue
        full = GLYPH_FULL * (level - background)
        ramp = (patch.astype(np.float32) - np.float32(background + GLYPH_LOW)) * np.float32(
            1.0 / (full - GLYPH_LOW)
        )
        np.clip(ramp, np.float32(0.0), np.float32(1.0), out=ramp)
        ramp[~rim] = 0.0
        ramp[block] = 1.0
        if out is None:
            out = np.zeros((h, w), np.float32)
        np.maximum(out[cy0:cy1, cx0:cx1], ramp, out=out[cy0:cy1, cx0:cx1])
    return out


def _alpha_without_text(desc: dict[str, Any]) -> np.ndarray:
    return _alpha_without_text_cached(_key(desc))


@_memo
def _alpha_without_text_cached(key: str) -> np.ndarray:
    """The field alpha minus the overlays of every kind but ``TEXT_KINDS`` (read-only, cached)."""
    desc = json.loads(key)
    alpha = field_alpha(desc).copy()
    for x0, y0, x1, y1, kind in desc["overlays"]:
        if kind not in TEXT_KINDS:
            alpha[y0:y1, x0:x1] = 0.0
    alpha.flags.writeable = False
    return alpha


def composite_alpha(desc: dict[str, Any], image: Any) -> np.ndarray:
    """float32 (H, W): where the perturbed tissue layer shows in the frame ``image`` (CHW, the
    clean input: NumPy or torch, uint8/uint16/float in [0, 1]). The tissue alpha, except that a
    burned-in text line keeps only its glyph strokes (``glyph_strokes``, a soft cover): a video processor draws
    the characters over the tissue, so the tissue between and around them takes the op. Other
    overlays stay whole rectangles. A deterministic function of the descriptor and the image;
    read-only when there is no text (the cached tissue alpha)."""
    boxes = text_boxes(desc)
    if not boxes:
        return tissue_alpha(desc)
    alpha = _alpha_without_text(desc).copy()
    for box in boxes:
        wx0, wy0, wx1, wy1, _ = glyph_window(desc, box)
        window = image[:, wy0:wy1, wx0:wx1]
        if hasattr(window, "detach"):
            window = window.detach().cpu().numpy()
        x0, y0, x1, y1 = box
        cut = alpha[y0:y1, x0:x1]
        np.minimum(cut, np.float32(1.0) - glyph_strokes(np.asarray(window), desc, box), out=cut)
    return alpha


def overlay_of(desc: dict[str, Any], image: Any) -> np.ndarray:
    """bool (H, W): the overlay pixels the composite keeps exactly from the clean ``image`` (CHW):
    the overlay rectangles, except that a text line counts only where its glyph strokes
    (``glyph_strokes``) cover a pixel fully (their anti-aliased edges are partial mixes)."""
    out = overlay_mask(desc).copy()
    for box in text_boxes(desc):
        wx0, wy0, wx1, wy1, _ = glyph_window(desc, box)
        window = image[:, wy0:wy1, wx0:wx1]
        if hasattr(window, "detach"):
            window = window.detach().cpu().numpy()
        x0, y0, x1, y1 = box
        out[y0:y1, x0:x1] = glyph_strokes(np.asarray(window), desc, box) >= 1.0
    for x0, y0, x1, y1, kind in desc["overlays"]:  # other kinds win where boxes overlap
        if kind not in TEXT_KINDS:
            out[y0:y1, x0:x1] = True
    return out
