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

import hashlib
import json
import marshal
import threading
from collections import OrderedDict
from typing import Any

import cv2
import numpy as np

SCENE_VERSION = 3  # 2: text lines over the tissue keep only their glyph strokes in the composite;
#   3: and their solid blocks (progress bars, a cursor) whole (masks.solid_blocks)
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
        raise ValueError(f"scene() takes an (H, W), (H, W, 1|3) or (1|3, H, W) image, got shape {arr.shape}")
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
    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    return n, labels, stats


def _edge_connected(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` connected to the image edge."""
    n, labels, _ = _components(mask)
    edge = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    keep = np.zeros(n, dtype=bool)
    keep[edge] = True
    keep[0] = False
    return keep[labels] & mask.astype(bool)


def _rect(stats_row: np.ndarray) -> tuple[int, int, int, int]:
    x, y, w, h = (int(v) for v in stats_row[:4])
    return x, y, x + w, y + h


def _scope_boxes(small: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Saturated, flat, green-to-blue rectangles (scope-position / shape display boxes) on the grid."""
    hsv = cv2.cvtColor(small, cv2.COLOR_RGB2HSV)
    hue, sat, val = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    colour = (hue >= 38) & (hue <= 135) & (sat >= 100) & (val >= 70)
    grad = cv2.morphologyEx(cv2.cvtColor(small, cv2.COLOR_RGB2GRAY), cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8))
    flat = grad <= 24
    cand = cv2.morphologyEx((colour & flat).astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    cand = cv2.morphologyEx(cand, cv2.MORPH_CLOSE, np.ones((5, 5), np.uint8))
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


def _text_lines(small: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Burned-in text over the tissue or the surround: rows of thin bright strokes (white
    top-hat), merged along the row, that stand in a left-aligned block of at least two lines
    (patient data, time, scope settings). Specular streaks rarely stack left-aligned."""
    gray = cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)
    short = min(gray.shape)
    k = max(3, round(0.02 * short)) | 1
    tophat = cv2.morphologyEx(gray, cv2.MORPH_TOPHAT, cv2.getStructuringElement(cv2.MORPH_RECT, (k, k)))
    strokes = ((tophat > 50) & (gray > 150)).astype(np.uint8)
    joiner = cv2.getStructuringElement(cv2.MORPH_RECT, (max(3, round(0.03 * short)), 1))
    rows = cv2.morphologyEx(strokes, cv2.MORPH_CLOSE, joiner)
    n, _, stats = _components(rows)
    lines = []
    for i in range(1, n):
        x, y, w, h, area = (int(v) for v in stats[i])
        if 0.01 * short <= h <= 0.05 * short and w >= 3 * h and w >= 0.05 * short and area >= 0.25 * w * h:
            lines.append((x, y, x + w, y + h))
    return [
        a
        for a in lines
        if any(b is not a and abs(b[0] - a[0]) <= 0.02 * short and abs(b[1] - a[1]) <= 4 * max(a[3] - a[1], b[3] - b[1]) for b in lines)
    ]


try:  # a fast non-cryptographic digest where installed (``datasets`` brings it), else BLAKE2
    import xxhash

    def _digest(buf: Any) -> bytes:
        # the same digest either way; the streaming update releases the GIL (the one-shot call
        # holds it), so the samples of a batch hash their frames in parallel on the worker pool
        if memoryview(buf).nbytes >= 1 << 16:
            return bytes(xxhash.xxh3_128(buf).digest())
        return bytes(xxhash.xxh3_128_digest(buf))

except ImportError:  # pragma: no cover - depends on the environment

    def _digest(buf: Any) -> bytes:
        return hashlib.blake2b(buf, digest_size=16).digest()


_CACHE: OrderedDict[tuple[str, tuple[int, ...], str, bytes], tuple[dict[str, Any], str, str]] = OrderedDict()
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()


def _pixels(image: Any) -> tuple[str, np.ndarray]:
    """The pixels of ``image`` as a C-contiguous array without a copy where possible, with a
    tag of their layout: a CPU torch tensor (CHW) as it is, a NumPy array as it is, anything
    else converted by ``to_hwc_u8``."""
    if hasattr(image, "detach"):
        t = image.detach()
        if t.device.type == "cpu" and t.is_contiguous() and t.ndim == 3 and str(t.dtype) in _NATIVE_TORCH:
            return "chw", t.numpy()
    elif isinstance(image, np.ndarray) and image.flags.c_contiguous and image.dtype in _NATIVE_NUMPY:
        return "np", image
    return "hwc", to_hwc_u8(image)


_NATIVE_TORCH = frozenset({"torch.uint8", "torch.uint16", "torch.float32"})
_NATIVE_NUMPY = frozenset({np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32)})


def analyse(image: Any) -> dict[str, Any]:
    """The scene descriptor of one image (see the module docstring); JSON-able, deterministic.
    Recent results are cached by a digest of the pixels as given (the same frame at five
    severities, or under several ops, is analysed once; a hit costs one pass of a fast hash
    over the input, no conversion)."""
    return dict(json.loads(analysed(image)[1]))


def analysed(image: Any) -> tuple[dict[str, Any], str, str]:
    """``analyse(image)`` as the cache holds it: (descriptor, shared with the cache: read it,
    never change it; its JSON text, whose ``json.loads`` is what ``analyse`` returns; its
    ``perturb.scene.masks.descriptor_key``, the sorted JSON the mask caches are keyed by)."""
    return analysed_with_digest(image)[:3]


def analysed_with_digest(image: Any) -> tuple[dict[str, Any], str, str, bytes | None]:
    """``analysed(image)`` and the digest of ``image``'s bytes as given (a CHW tensor or NumPy
    array of its own dtype, C-contiguous), which ``analysed`` keys its cache by; None where the
    image was converted first (the digest is then not of its own bytes)."""
    layout, arr = _pixels(image)
    digest = _digest(arr.data)
    cache_key = (layout, arr.shape, arr.dtype.str, digest)
    own = digest if layout != "hwc" else None
    if own is not None:
        _remember_print(layout, arr, digest)
    with _CACHE_LOCK:
        hit = _CACHE.get(cache_key)
        if hit is not None:
            _CACHE.move_to_end(cache_key)
            return (*hit, own)
    desc = _analyse(to_hwc_u8(image) if layout != "hwc" else arr)
    text = json.dumps(desc)
    # the key is masks.descriptor_key's sorted JSON, written here: masks imports this module
    value = (json.loads(text), text, json.dumps(desc, sort_keys=True))
    with _CACHE_LOCK:
        _CACHE[cache_key] = value
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return (*value, own)


# A guess of which cached frame an image is, from a fingerprint of a few kilobytes at its middle:
# the caller (``perturb.engine``'s lookup-table path) then takes the image's full digest in the
# same pass that perturbs it, and keeps the result only where that digest is the guessed one.
_PRINT_BYTES = 4096
_PRINTS: OrderedDict[tuple[str, tuple[int, ...], str, int], bytes] = OrderedDict()


def _fingerprint(arr: np.ndarray) -> int:
    flat = arr.reshape(-1).view(np.uint8)
    mid = max(0, flat.size // 2 - _PRINT_BYTES // 2)
    return int.from_bytes(_digest(flat[mid : mid + _PRINT_BYTES])[:8], "little")


def _remember_print(layout: str, arr: np.ndarray, digest: bytes) -> None:
    slot = (layout, arr.shape, arr.dtype.str, _fingerprint(arr))
    with _CACHE_LOCK:
        seen = _PRINTS.get(slot)
        # two frames with one fingerprint (a uniform middle): never guessed again (b"")
        _PRINTS[slot] = digest if seen is None or seen == digest else b""
        _PRINTS.move_to_end(slot)
        while len(_PRINTS) > 4 * _CACHE_SIZE:
            _PRINTS.popitem(last=False)


def guess(image: Any) -> tuple[tuple[dict[str, Any], str, str], bytes] | None:
    """The cached ``analysed`` value of the frame ``image`` (a CPU CHW tensor or NumPy array of
    its own dtype, C-contiguous) most likely is, with that frame's digest, from a fingerprint of
    its middle; None where no cached frame matches. A guess only: the caller must check that
    ``image``'s digest is the one returned before it relies on the value."""
    layout, arr = _pixels(image)
    if layout == "hwc":
        return None
    slot = (layout, arr.shape, arr.dtype.str, _fingerprint(arr))
    with _CACHE_LOCK:
        digest = _PRINTS.get(slot)
        hit = None if not digest else _CACHE.get((layout, arr.shape, arr.dtype.str, digest))
        if hit is None or not digest:
            return None
        _CACHE.move_to_end((layout, arr.shape, arr.dtype.str, digest))
        _PRINTS.move_to_end(slot)  # a frame in use keeps its fingerprint
    return hit, digest


_COPIES: OrderedDict[str, bytes] = OrderedDict()  # descriptor text -> its marshalled dict


def descriptor_copy(text: str) -> dict[str, Any]:
    """A fresh ``json.loads(text)`` of a cached descriptor's text (the same values and types),
    made from its marshalled form: 2-3x faster, for the copy each record keeps of its scene."""
    with _CACHE_LOCK:
        blob = _COPIES.get(text)
    if blob is None:
        blob = marshal.dumps(json.loads(text))
        with _CACHE_LOCK:
            _COPIES[text] = blob
            while len(_COPIES) > 4 * _CACHE_SIZE:
                _COPIES.popitem(last=False)
    copy: dict[str, Any] = marshal.loads(blob)  # new objects on every call
    return copy


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
    if n <= 1:
        return _full_frame(h, w, gh, gw, overlays)
    areas = stats[1:, cv2.CC_STAT_AREA]
    main = 1 + int(np.argmax(areas))
    if areas[main - 1] < MIN_FIELD_FRACTION * gh * gw:
        return _full_frame(h, w, gh, gw, overlays)
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
    for line in _text_lines(small):
        to_image(line, "text")
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
    }


def _full_frame(h: int, w: int, gh: int, gw: int, overlays: list[list[Any]]) -> dict[str, Any]:
    """Descriptor of a frame without a detectable dark surround: the field is the whole image."""
    return {
        "version": SCENE_VERSION,
        "size": [h, w],
        "grid": [gh, gw],
        "field": [[0, 0], [gw - 1, 0], [gw - 1, gh - 1], [0, gh - 1]],
        "full": True,
        "bbox": [0, 0, w, h],
        "overlays": overlays,
    }


def highlight_mask(rgb: np.ndarray, field: np.ndarray) -> np.ndarray:
    """Bool (H, W): specular highlights (near-white, every channel above ``HIGHLIGHT_LEVEL``)
    inside the field."""
    low = cv2.min(cv2.min(rgb[..., 0], rgb[..., 1]), rgb[..., 2])
    white = np.greater_equal(low, round(HIGHLIGHT_LEVEL * 255))
    white &= field > 0.5
    return white
