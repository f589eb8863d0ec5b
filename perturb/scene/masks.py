"""Masks rebuilt from a scene descriptor (deterministic: the same descriptor gives the same
bytes), and the composite of a perturbed tissue layer back into the frame."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
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


def _memo(fn: Callable[[str], _T]) -> Callable[[str], _T]:
    """Cache ``fn(key)`` (a pure function of the descriptor key) in the shared budgeted LRU."""
    name = fn.__qualname__

    @wraps(fn)
    def cached(key: str) -> _T:
        slot = (name, key)
        with _MEMO_LOCK:
            hit = _MEMO.get(slot)
            if hit is not None:
                _MEMO.move_to_end(slot)
                return cast(_T, hit[0])
        value = fn(key)
        size = _nbytes(value)
        with _MEMO_LOCK:
            if slot not in _MEMO:
                _MEMO[slot] = (value, size)
                _MEMO_STATE["bytes"] += size
                while _MEMO_STATE["bytes"] > _MEMO_BUDGET and len(_MEMO) > 1:
                    _, (_, freed) = _MEMO.popitem(last=False)
                    _MEMO_STATE["bytes"] -= freed
        return value

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
    alpha[overlay_mask(desc)] = 0.0
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
        max(float(GLYPH_HIGH), GLYPH_FULL * float(np.median(strong)))
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
        ink_luma = np.float32(np.median(luma[inside][is_strong]))
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
                level = int(np.median(box_plane[apart]))
                lifted |= box_plane.astype(np.int16) - level >= GLYPH_LOW
            cover[~lifted] = 0.0
        ink = int(np.median(luma[inside][is_strong]))
        blocks = solid_blocks(u8, luma, (x0 - wx0, y0 - wy0, x1 - wx0, y1 - wy0), ink)
        if blocks is not None:
            np.maximum(cover, blocks[inside], out=cover)
        # an outline of the opposite polarity hugging the strokes (within 2 px): darker than
        # the tissue of the line (the median away from its strokes), which the tissue showing
        # between two strokes is not
        near = cv2.dilate(is_strong.view(np.uint8), np.ones((5, 5), np.uint8)).view(bool)
        box_luma = luma[inside]
        away = box_luma[~near]
        background = np.float32(np.median(away)) if away.size else np.float32(0.0)
        below = background - box_luma.astype(np.float32)
        outline = (below - np.float32(GLYPH_LOW)) * np.float32(1.0 / (GLYPH_HIGH - GLYPH_LOW))
        np.clip(outline, np.float32(0.0), np.float32(1.0), out=outline)
        outline[~near] = 0.0
        np.maximum(cover, outline, out=cover)
    else:
        cover = np.ascontiguousarray(cover)
    rim = cv2.dilate((cover >= 1.0).view(np.uint8), np.ones((3, 3), np.uint8)).view(bool)
    cover[rim] = 1.0
    return cover


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
        level, background = float(np.median(patch[block])), float(np.median(patch[ring]))
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


def glyph_windows_bytes(desc: dict[str, Any], image: np.ndarray) -> bytes:
    """A digest of the pixels of ``image`` (CHW NumPy) that the glyph cover of ``desc``'s text
    lines reads (their ``glyph_window`` s): what a composite alpha with text depends on."""
    digest = hashlib.blake2b(str(image.shape).encode(), digest_size=16)
    for box in text_boxes(desc):
        wx0, wy0, wx1, wy1, _ = glyph_window(desc, box)
        digest.update(np.ascontiguousarray(image[:, wy0:wy1, wx0:wx1]).data)
    return digest.digest()


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


@dataclass(frozen=True)
class _ComposePlan:
    """What ``compose_numpy`` needs of a descriptor, precomputed once: ``keep`` (uint8 (H, W),
    1 where the output is the source: outside the bbox, alpha 0), the flat indices ``part`` of
    the pixels of partial alpha and their alpha ``part_alpha``, both outside ``text``: the
    rectangle around the text lines inside the bbox (x0, y0, x1, y1), whose alpha depends on the
    image and is composed separately, or None."""

    keep: np.ndarray
    part: np.ndarray
    part_alpha: np.ndarray
    text: tuple[int, int, int, int] | None
    part3: np.ndarray  # ``part`` in each plane of a CHW 3-plane sample (flat indices)
    part_alpha3: np.ndarray


@_memo
def _compose_plan(key: str) -> _ComposePlan:
    desc = json.loads(key)
    h, w = desc["size"]
    x0, y0, x1, y1 = bbox(desc)
    boxes = text_boxes(desc)
    static = _alpha_without_text_cached(key) if boxes else _tissue_alpha(key)
    keep = np.ones((h, w), np.uint8)
    a = static[y0:y1, x0:x1]
    keep[y0:y1, x0:x1] = a == 0.0
    partial = np.zeros((h, w), bool)
    partial[y0:y1, x0:x1] = (a > 0.0) & (a < 1.0)
    text = None
    if boxes:
        tx0, ty0 = max(x0, min(b[0] for b in boxes)), max(y0, min(b[1] for b in boxes))
        tx1, ty1 = min(x1, max(b[2] for b in boxes)), min(y1, max(b[3] for b in boxes))
        if tx1 > tx0 and ty1 > ty0:
            text = (tx0, ty0, tx1, ty1)  # alpha 0 there stays 0 under the glyph cover (a minimum)
            partial[ty0:ty1, tx0:tx1] = False
    part = np.flatnonzero(partial)
    part_alpha = static.reshape(-1)[part]
    part3 = np.concatenate([part + c * (h * w) for c in range(3)])
    part_alpha3 = np.tile(part_alpha, 3)
    for arr in (keep, part, part_alpha, part3, part_alpha3):
        arr.flags.writeable = False
    return _ComposePlan(keep, part, part_alpha, text, part3, part_alpha3)


def _check_size(desc: dict[str, Any], src: np.ndarray) -> None:
    if tuple(desc["size"]) != tuple(src.shape[-2:]):
        raise ValueError(
            f"scene of size {tuple(desc['size'])} does not fit an image of size {src.shape[-2:]}"
        )


def compose_numpy(
    src: np.ndarray, dst: np.ndarray, desc: dict[str, Any], key: str | None = None
) -> None:
    """In place: ``dst`` (CHW, the perturbed sample) becomes ``alpha * dst + (1 - alpha) * src``
    with ``composite_alpha(desc, src)`` (the tissue alpha; glyph strokes only of text lines);
    pixels with alpha 0 are ``src`` exactly, alpha 1 ``dst`` exactly. Work is per-descriptor
    precomputed (``_compose_plan``): a masked copy of the source where alpha is 0 (outside the
    field's bbox, the surround and the overlays), the blend only on the soft edge, and the
    glyph cover only inside the rectangle of the text lines. ``key``: ``descriptor_key(desc)``
    where the caller has it (e.g. ``Scene.key``)."""
    _check_size(desc, src)
    key = _key(desc) if key is None else key
    plan = _compose_plan(key)
    planes = src.shape[0]
    fast = src.flags.c_contiguous and dst.flags.c_contiguous and src.dtype == dst.dtype
    for c in range(planes):
        s, d = src[c], dst[c]
        if fast:
            cv2.copyTo(s, plan.keep, d)  # in place: both planes are contiguous
        else:
            np.copyto(d, s, where=plan.keep.astype(bool))
    if plan.part.size:
        _blend_at(
            src,
            dst,
            *((plan.part3, plan.part_alpha3) if planes == 3 else (plan.part, plan.part_alpha)),
        )
    if plan.text is not None:
        # alpha 1 keeps ``dst``, static alpha 0 was copied above; the rest (glyph cover, soft
        # edge) blends, where alpha 0 gives ``src`` exactly: base + 0 * (d - base) = base
        index, alpha = _text_blend(desc, key, src, plan.text)
        if index.size:
            _blend_at(src, dst, index, alpha)


def _blend_at(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> None:
    """In place: ``dst`` at the flat ``index`` (into CHW) becomes ``src + alpha (dst - src)`` in
    float32, integer levels rounded half to even (1-D gathers: far faster than per plane).
    With ``alpha`` in [0, 1] the float32 result lies between the two levels (every step of it
    rounds monotonically and both ends are exact), so no clip is needed before the cast."""
    if src.dtype != dst.dtype or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        _blend_at_any(src, dst, index, alpha)
        return
    s_flat = src.reshape(-1)
    d_flat = dst.reshape(-1)
    base = s_flat[index].astype(np.float32, copy=False)
    mixed = d_flat[index].astype(np.float32, copy=False)
    mixed -= base
    mixed *= alpha
    mixed += base  # == base + alpha * (dst - base): float addition and product commute exactly
    if dst.dtype == np.float32:
        d_flat[index] = mixed
    else:
        np.rint(mixed, out=mixed)
        d_flat[index] = mixed.astype(dst.dtype)


def _blend_at_any(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> None:
    """``_blend_at`` for any layout and pair of dtypes (a reshape may copy)."""
    s_flat = src.reshape(-1)
    d_flat = dst.reshape(-1)
    base = s_flat[index].astype(np.float32)
    mixed = base + alpha * (d_flat[index].astype(np.float32) - base)
    if dst.dtype == np.float32:
        d_flat[index] = mixed
    else:
        top = 255.0 if dst.dtype == np.uint8 else 65535.0
        d_flat[index] = np.clip(np.rint(mixed), 0, top).astype(dst.dtype)
    if not np.shares_memory(d_flat, dst):  # reshape made a copy
        dst[...] = d_flat.reshape(dst.shape)


# Glyph covers of recent frames: keyed by the descriptor and a digest of the pixels the glyph
# windows read, so the same frame under several ops or severities finds its text lines' cover.
_TEXT_BLEND: OrderedDict[tuple[str, bytes], _TextCover] = OrderedDict()
_TEXT_BLEND_SIZE = 256
_TEXT_BLEND_LOCK = threading.Lock()


@dataclass(frozen=True)
class _TextCover:
    """The composite alpha of one image inside the rectangle of its text lines (``rect`` of
    ``_ComposePlan.text``): ``flat`` (flat indices into one plane) of the pixels that blend
    there, alpha below 1 where the static alpha is above 0, in raster order, their ``alpha``,
    and both for every plane of the image (``index`` into CHW, ``index_alpha``)."""

    flat: np.ndarray
    alpha: np.ndarray
    index: np.ndarray
    index_alpha: np.ndarray


def _text_blend(
    desc: dict[str, Any], key: str, image: np.ndarray, rect: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(flat index into CHW, alpha) of the pixels inside ``rect`` that ``compose_numpy``
    blends there (``_text_cover``)."""
    cover = _text_cover(desc, key, image, rect)
    return cover.index, cover.index_alpha


def _text_cover(
    desc: dict[str, Any], key: str, image: np.ndarray, rect: tuple[int, int, int, int]
) -> _TextCover:
    """The ``_TextCover`` of ``image`` (CHW NumPy) inside ``rect`` (cached per descriptor and
    glyph window pixels)."""
    slot = (key, image.dtype.str.encode() + glyph_windows_bytes(desc, image))
    with _TEXT_BLEND_LOCK:
        hit = _TEXT_BLEND.get(slot)
        if hit is not None:
            _TEXT_BLEND.move_to_end(slot)
            return hit
    tx0, ty0, tx1, ty1 = rect
    alpha = _text_alpha(desc, key, image, rect)
    static = _alpha_without_text_cached(key)[ty0:ty1, tx0:tx1]
    rows, cols = np.nonzero((alpha < 1.0) & (static > 0.0))
    h, w = desc["size"]
    flat = (rows + ty0) * int(w) + (cols + tx0)
    planes = image.shape[0]
    values = alpha[rows, cols]
    value = _TextCover(
        flat,
        values,
        np.concatenate([flat + c * (h * w) for c in range(planes)]),
        np.tile(values, planes),
    )
    for arr in (value.flat, value.alpha, value.index, value.index_alpha):
        arr.flags.writeable = False
    with _TEXT_BLEND_LOCK:
        _TEXT_BLEND[slot] = value
        while len(_TEXT_BLEND) > _TEXT_BLEND_SIZE:
            _TEXT_BLEND.popitem(last=False)
    return value


def _text_alpha(
    desc: dict[str, Any], key: str, image: Any, rect: tuple[int, int, int, int]
) -> np.ndarray:
    """``composite_alpha(desc, image)`` inside ``rect`` (x0, y0, x1, y1), computed there only."""
    rx0, ry0, rx1, ry1 = rect
    alpha = _alpha_without_text_cached(key)[ry0:ry1, rx0:rx1].copy()
    for box in text_boxes(desc):
        x0, y0, x1, y1 = box
        cx0, cy0, cx1, cy1 = max(x0, rx0), max(y0, ry0), min(x1, rx1), min(y1, ry1)
        if cx1 <= cx0 or cy1 <= cy0:
            continue
        wx0, wy0, wx1, wy1, _ = glyph_window(desc, box)
        window = image[:, wy0:wy1, wx0:wx1]
        if hasattr(window, "detach"):
            window = window.detach().cpu().numpy()
        cover = glyph_strokes(np.asarray(window), desc, box)[
            cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0
        ]
        cut = alpha[cy0 - ry0 : cy1 - ry0, cx0 - rx0 : cx1 - rx0]
        np.minimum(cut, np.float32(1.0) - cover, out=cut)
    return alpha


EXT_GRID_SHORT = 64  # coarse grid of the tissue extension: shorter side in cells
EXT_SIGMA = 0.04  # width of the extension's normalised gaussian, fraction of the shorter side
# How far past the field's bbox the extension is written (fraction of the shorter side): beyond
# the reach of every spatial op's PSF at severity 5 (gaussian 3 sigma 0.081, motion half-length
# 0.05, defocus 0.032, lens droplets, distortion and lateral colour below 0.04).
EXT_MARGIN = 0.1


@dataclass(frozen=True)
class _ExtensionPlan:
    """What ``extend_numpy`` needs of a descriptor, precomputed once: the coarse grid ``size``
    (ch, cw), its tissue ``weight`` (cells wholly tissue), ``inv_den`` (1 / the weight's
    gaussian), the gaussian's ``sigma`` in cells; ``rect`` (x0, y0, x1, y1) around every
    pixel the extension writes (alpha below 1 within ``EXT_MARGIN`` of the bbox; None: none)
    and its ``keep`` mask (uint8, 1 where alpha is 0: the fill replaces the pixel); ``part``/``part_alpha`` (flat indices and alpha
    of partial alpha outside ``text``) and ``text``, as in ``_ComposePlan``."""

    size: tuple[int, int]
    weight: np.ndarray
    inv_den: np.ndarray
    sigma: float
    rect: tuple[int, int, int, int] | None
    keep: np.ndarray
    part: np.ndarray
    part_alpha: np.ndarray
    text: tuple[int, int, int, int] | None


@_memo
def _extension_need(key: str) -> np.ndarray:
    """bool (H, W), read-only: the pixels ``extend_numpy`` may write (alpha below 1 within
    ``EXT_MARGIN`` of the field's bbox, and the rectangle of the text lines)."""
    desc = json.loads(key)
    h, w = desc["size"]
    static = _alpha_without_text_cached(key) if text_boxes(desc) else _tissue_alpha(key)
    margin = round(EXT_MARGIN * min(h, w))
    bx0, by0, bx1, by1 = bbox(desc)
    rx0, ry0, rx1, ry1 = (
        max(0, bx0 - margin),
        max(0, by0 - margin),
        min(w, bx1 + margin),
        min(h, by1 + margin),
    )
    need = np.zeros((h, w), bool)
    need[ry0:ry1, rx0:rx1] = static[ry0:ry1, rx0:rx1] < 1.0
    text = _compose_plan(key).text
    if text is not None:
        tx0, ty0, tx1, ty1 = text
        need[ty0:ty1, tx0:tx1] = True
    need.flags.writeable = False
    return need


def extension_grid(h: int, w: int) -> tuple[tuple[int, int], float]:
    """((ch, cw), sigma): the coarse grid of the tissue extension of an h x w image and its
    gaussian's sigma in cells."""
    f = max(1.0, min(h, w) / EXT_GRID_SHORT)
    ch, cw = max(1, round(h / f)), max(1, round(w / f))
    return (ch, cw), EXT_SIGMA * min(ch, cw)


def extension_alpha(key: str, composite: np.ndarray) -> np.ndarray:
    """float32 (H, W): the weight of the clean pixels in the tissue extension of the scene of
    ``key`` (``composite``: its composite alpha with the clean image): the composite alpha where
    ``extend_numpy`` writes, 1 elsewhere, so ``extended = fill + a (src - fill)`` (``src`` where
    ``a`` is 1) is ``extend_numpy``'s result with any fill."""
    return np.where(_extension_need(key), composite, np.float32(1.0)).astype(np.float32)


@_memo
def _extension_plan(key: str) -> _ExtensionPlan:
    desc = json.loads(key)
    h, w = desc["size"]
    (ch, cw), sigma = extension_grid(h, w)
    cells = cv2.resize(_tissue_alpha(key), (cw, ch), interpolation=cv2.INTER_AREA)
    weight = np.ascontiguousarray((cells >= 0.999).astype(np.float32))
    inv_den = (1.0 / np.maximum(cv2.GaussianBlur(weight, (0, 0), sigma), 1e-6)).astype(np.float32)
    plan = _compose_plan(key)
    static = _alpha_without_text_cached(key) if text_boxes(desc) else _tissue_alpha(key)
    need = _extension_need(key)
    keep_all = static == 0.0
    rect, keep = None, np.zeros((0, 0), np.uint8)
    ys, xs = np.nonzero(need.any(axis=1))[0], np.nonzero(need.any(axis=0))[0]
    if ys.size:
        rect = (int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1)
        x0, y0, x1, y1 = rect
        keep = (keep_all[y0:y1, x0:x1] & need[y0:y1, x0:x1]).astype(np.uint8)
    partial = need & (static > 0.0) & (static < 1.0)
    if plan.text is not None:
        tx0, ty0, tx1, ty1 = plan.text
        partial[ty0:ty1, tx0:tx1] = False
    part = np.flatnonzero(partial)
    part_alpha = static.reshape(-1)[part]
    for arr in (weight, inv_den, keep, part, part_alpha):
        arr.flags.writeable = False
    return _ExtensionPlan((ch, cw), weight, inv_den, sigma, rect, keep, part, part_alpha, plan.text)


def extend_numpy(
    src: np.ndarray, dst: np.ndarray, desc: dict[str, Any], key: str | None = None
) -> None:
    """``dst`` (CHW, ``src``'s shape and dtype) becomes ``src`` (the clean sample) with its
    surround and overlays (of a text line, its glyph strokes) replaced by a smooth extension of
    the nearby tissue, ``alpha * src + (1 - alpha) * fill`` with the composite's alpha, so a
    spatial op (a PSF, a warp) applied to ``dst`` does not pull the dark surround or the
    overlays into the field's edge. ``fill`` is a normalised convolution of the tissue (a
    gaussian of ``EXT_SIGMA`` of the shorter side over the cells wholly inside the tissue) on a
    coarse grid (``EXT_GRID_SHORT`` cells, bilinear samples of ``src``), interpolated bilinearly; it is written only within
    ``EXT_MARGIN`` of the field's bbox (beyond, ``src``). ``key``: as in ``compose_numpy``."""
    _check_size(desc, src)
    key = _key(desc) if key is None else key
    plan = _extension_plan(key)
    np.copyto(dst, src)
    if plan.rect is None:
        return
    out = dst if dst.flags.c_contiguous else np.empty_like(dst)  # written through flat views
    if out is not dst:
        np.copyto(out, src)
    top = _TOP.get(src.dtype)
    cover = None if plan.text is None else _text_cover(desc, key, src, plan.text)
    x0, y0, x1, y1 = plan.rect
    fills = extension_fill(extension_samples(src, desc, key), desc, src.dtype, key)
    for c in range(src.shape[0]):
        fill = fills[c]
        d = out[c]
        cv2.copyTo(fill[y0:y1, x0:x1], plan.keep, d[y0:y1, x0:x1])
        d_flat, s_flat, f_flat = d.reshape(-1), src[c].reshape(-1), fill.reshape(-1)
        if plan.part.size:
            _blend(d_flat, s_flat, f_flat, plan.part, plan.part_alpha, top)
        if cover is not None and cover.flat.size:
            _blend(d_flat, s_flat, f_flat, cover.flat, cover.alpha, top)
    if out is not dst:
        np.copyto(dst, out)


_TOP = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}


def extension_samples(src: np.ndarray, desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """float32 (C, ch, cw): the bilinear samples of ``src`` (CHW) on the extension's coarse grid,
    all of the image that its fill (``extension_fill``) depends on. Bilinear samples, not area
    means: 15x cheaper, and the gaussian of ``EXT_SIGMA`` averages some hundred of them, so the
    fill moves by about half a level (8-bit) on real frames."""
    ch, cw = _extension_plan(_key(desc) if key is None else key).size
    return np.stack(
        [cv2.resize(plane, (cw, ch), interpolation=cv2.INTER_LINEAR) for plane in src]
    ).astype(np.float32)


def extension_fill(
    samples: np.ndarray, desc: dict[str, Any], dtype: np.dtype, key: str | None = None
) -> np.ndarray:
    """(C, H, W) of ``dtype``: the tissue extension's fill from the coarse ``samples``
    (``extension_samples``): their normalised convolution over the cells wholly inside the
    tissue (integer levels rounded and clipped), interpolated bilinearly to the image size."""
    plan = _extension_plan(_key(desc) if key is None else key)
    h, w = desc["size"]
    top = _TOP.get(np.dtype(dtype))
    planes = []
    for small in samples:
        weighted = small * plan.weight
        coarse = cv2.GaussianBlur(weighted, (0, 0), plan.sigma)
        coarse *= plan.inv_den
        if top is not None:
            np.rint(coarse, out=coarse)
            coarse = np.clip(coarse, 0.0, top, out=coarse).astype(dtype)
        planes.append(cv2.resize(coarse, (int(w), int(h)), interpolation=cv2.INTER_LINEAR))
    return np.stack(planes)


def _blend(
    d: np.ndarray,
    s: np.ndarray,
    fill: np.ndarray,
    idx: np.ndarray,
    alpha: np.ndarray,
    top: float | None,
) -> None:
    """In place on flat planes: ``d[idx] = fill + alpha (s - fill)`` at ``idx`` in float32 (integer
    levels rounded half to even; as in ``_blend_at``, the mix lies between its two levels)."""
    base = fill[idx].astype(np.float32, copy=False)
    mixed = s[idx].astype(np.float32, copy=False)
    mixed -= base
    mixed *= alpha
    mixed += base
    if top is None:
        d[idx] = mixed
    else:
        np.rint(mixed, out=mixed)
        d[idx] = mixed.astype(d.dtype)
