"""Classic-vision measurements of an endoscopy frame: what the probe "sees".

Everything here works on pixels only: colour segmentation in chromaticity space, morphology,
connected components, radial brightness profiles and edge density. No weights, no truth.

Pipeline of :func:`observe`:

1. field of view = pixels brighter than a small threshold (the black scope border is out);
2. green box = share of green pixels in the bottom-left corner;
3. text = white, sharp-edged strokes in the top strip (edge density of near-white pixels);
4. polyps = pixels whose chromaticity is far from the frame's median mucosa colour and close to
   one of the three polyp palettes (pink / red / white), after a light smoothing; opened,
   split into connected components, small ones dropped; one colour per frame (the largest);
5. per polyp: centroid (-> 3x3 grid cell), equivalent radius (-> size class), and the radial
   brightness profile (centre vs. rim -> Paris type);
6. instruments = large, low-saturation grey components (none on the phantoms: a false alarm
   under desaturation is one of the ways the probe breaks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

ROWS = ("upper", "center", "lower")
COLS = ("left", "center", "right")
GRID_ORDER = tuple(
    "center" if (r, c) == ("center", "center") else f"{r}-{c}" for r in ROWS for c in COLS
)

# reference chromaticities (r, g, b) / (r + g + b) of the palettes the probe knows
PALETTE: dict[str, tuple[float, float, float]] = {
    "pink": (0.95, 0.60, 0.62),
    "red": (0.72, 0.12, 0.12),
    "white": (0.93, 0.88, 0.80),
}
MUCOSA: tuple[float, float, float] = (0.80, 0.40, 0.36)
TEXT_CONTRAST = 0.18  # stroke brighter than its 7x7 surroundings by this much
TEXT_EDGE = 0.5  # horizontal gradient next to a stroke
TEXT_DENSITY = 0.3  # stroke pixels per column of the strip


def _chroma(rgb: tuple[float, float, float]) -> np.ndarray:
    v = np.asarray(rgb, np.float32)
    return v / v.sum()


@dataclass(frozen=True)
class Blob:
    """One detected polyp."""

    cx: float
    cy: float
    area: int
    radius_fraction: float  # equivalent radius / min(width, height)
    color: str
    cell: str
    rim_ratio: float  # mean brightness at the centre / at 0.75-0.9 of the radius


@dataclass
class Observation:
    """What the probe measured in one frame."""

    width: int
    height: int
    fov_fraction: float
    box: bool
    box_score: float
    text: bool
    text_score: float
    polyps: list[Blob] = field(default_factory=list)
    instruments: int = 0

    @property
    def polyp_count(self) -> int:
        return len(self.polyps)

    @property
    def color(self) -> str | None:
        return self.polyps[0].color if self.polyps else None

    @property
    def locations(self) -> list[str]:
        return sorted({b.cell for b in self.polyps}, key=GRID_ORDER.index)

    @property
    def sizes(self) -> list[str]:
        return sorted({size_class(b.radius_fraction) for b in self.polyps})

    @property
    def polyp_type(self) -> str | None:
        if not self.polyps:
            return None
        ratio = float(np.median([b.rim_ratio for b in self.polyps]))
        if ratio < 1.07:
            return "paris iia"
        if ratio > 1.25:
            return "paris ip"
        return "paris is"


def cell_of(x: float, y: float, width: int, height: int) -> str:
    """3x3 grid cell of a point."""
    col = min(2, max(0, int(3 * x / width)))
    row = min(2, max(0, int(3 * y / height)))
    return GRID_ORDER[3 * row + col]


def size_class(radius_fraction: float) -> str:
    """Size class of a polyp from its radius relative to the short side of the frame."""
    if radius_fraction < 0.06:
        return "<5mm"
    if radius_fraction < 0.085:
        return "5-10mm"
    return "11-20mm"


def to_float_rgb(img: np.ndarray) -> np.ndarray:
    """HWC/HW uint8/uint16/float -> HWC float32 RGB in [0, 1]."""
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    if img.shape[2] > 3:
        img = img[..., :3]
    if img.dtype == np.uint8:
        return img.astype(np.float32) / np.float32(255.0)
    if img.dtype == np.uint16:
        return img.astype(np.float32) / np.float32(65535.0)
    return np.clip(img.astype(np.float32), 0.0, 1.0)


def _box(img: np.ndarray) -> tuple[bool, float]:
    h, w = img.shape[:2]
    roi = img[int(0.74 * h) : int(0.985 * h), int(0.01 * w) : int(0.21 * w)]
    r, g, b = roi[..., 0], roi[..., 1], roi[..., 2]
    green = (g > 1.6 * r) & (g > 1.6 * b) & (g > 0.12)
    score = float(green.mean()) if green.size else 0.0
    return score > 0.5, score


def _channels_sum(img: np.ndarray) -> np.ndarray:
    out: np.ndarray = img[..., 0] + img[..., 1] + img[..., 2]
    return out


def _sat_range(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max, min) over the channels."""
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    return np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)


def _text(img: np.ndarray) -> tuple[bool, float]:
    """Burned-in text in the top strip: density of thin, bright, unsaturated strokes (white
    top-hat) with sharp edges next to them."""
    h, w = img.shape[:2]
    y1, x1 = max(2, int(0.085 * h)), max(2, int(0.5 * w))
    rgb = np.ascontiguousarray(img[:y1, :x1])
    strip = _channels_sum(rgb) / np.float32(3.0)
    mx, mn = _sat_range(rgb)
    kernel = cv2.getStructuringElement(cv2.MORPH_RECT, (7, 7))
    tophat = cv2.morphologyEx(strip, cv2.MORPH_TOPHAT, kernel)
    grad = np.abs(cv2.Sobel(strip, cv2.CV_32F, 1, 0, ksize=3))
    strokes = (
        (tophat > TEXT_CONTRAST)
        & ((mx - mn) < 0.3)
        & (cv2.dilate(grad, np.ones((3, 3), np.uint8)) > TEXT_EDGE)
    )
    score = float(strokes.sum()) / float(x1)
    return score > TEXT_DENSITY, score


def _polyp_masks(img: np.ndarray, fov: np.ndarray) -> dict[str, np.ndarray]:
    """Mask per palette colour (uint8 0/1) of the pixels that look like polyp tissue."""
    total = _channels_sum(img) + np.float32(1e-6)
    chroma = img / total[..., None]
    valid = fov & (total > np.float32(0.36))
    pts = chroma[valid]
    if len(pts) < 100:
        return {}
    # the frame's own mucosa colour: median chromaticity of (a sample of) the valid pixels
    mucosa = np.median(pts[:: max(1, len(pts) // 4000)], axis=0)

    def dist2(ref: np.ndarray) -> np.ndarray:
        d = chroma - ref[None, None, :].astype(np.float32)
        out: np.ndarray = np.einsum("ijk,ijk->ij", d, d)
        return out

    # colour constancy: move the palette by the offset of this frame's mucosa from the usual
    shift = mucosa - _chroma(MUCOSA)
    dist_m = dist2(mucosa)
    dists = {name: dist2(_chroma(rgb) + shift) for name, rgb in PALETTE.items()}
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
    masks: dict[str, np.ndarray] = {}
    for name, d in dists.items():
        others = np.minimum(*[dists[o] for o in dists if o != name])
        m = valid & (d < PALETTE_RADIUS**2) & (d < 0.36 * dist_m) & (d < others)
        m8 = cv2.morphologyEx(m.astype(np.uint8), cv2.MORPH_OPEN, kernel)
        masks[name] = cv2.morphologyEx(m8, cv2.MORPH_CLOSE, kernel)
    return masks


def _rim_ratio(bright: np.ndarray, comp: np.ndarray, cx: float, cy: float, r: float) -> float:
    """Centre / rim brightness of one component (``comp``: its boolean mask in the crop)."""
    ys, xs = np.nonzero(comp)
    rho = np.hypot(xs - cx, ys - cy) / max(r, 1e-6)
    vals = bright[ys, xs]
    centre = vals[rho < 0.3]
    rim = vals[(rho > 0.72) & (rho < 0.88)]
    if centre.size < 3 or rim.size < 3:
        return 1.15
    return float(centre.mean() / max(float(rim.mean()), 1e-6))


PALETTE_RADIUS = 0.06  # chromaticity distance to a palette colour
SCALE = 2  # polyps and instruments are measured at 1/SCALE resolution
RADIUS_BIAS = 0.96  # segmented radius / drawn radius (soft edges lost to the thresholds)


def observe(image: np.ndarray) -> Observation:
    """Measure one frame (HWC RGB, uint8/uint16/float)."""
    img = to_float_rgb(image)
    h, w = img.shape[:2]
    box, box_score = _box(img)
    text, text_score = _text(img)
    sw, sh = max(1, w // SCALE), max(1, h // SCALE)
    small = cv2.resize(img, (sw, sh), interpolation=cv2.INTER_AREA)
    sgray = _channels_sum(small) / np.float32(3.0)
    fov = cv2.GaussianBlur(sgray, (0, 0), 1.0) > 0.06
    excl = np.ones((sh, sw), bool)
    if text:
        excl[: int(0.09 * sh), : int(0.5 * sw)] = False
    if box:
        excl[int(0.72 * sh) :, : int(0.23 * sw)] = False
    fov_ok = fov & excl
    min_area = max(10, int(0.0025 * sh * sw))
    side = min(sh, sw)
    found: dict[str, list[Blob]] = {}
    best: tuple[int, str] | None = None
    masks = _polyp_masks(small, fov_ok)
    for name, m in masks.items():
        n, labels, stats, cents = cv2.connectedComponentsWithStats(m, connectivity=8)
        kept: list[Blob] = []
        for k in range(1, n):
            area = int(stats[k, cv2.CC_STAT_AREA])
            if area < min_area:
                continue
            x0, y0 = int(stats[k, cv2.CC_STAT_LEFT]), int(stats[k, cv2.CC_STAT_TOP])
            bw, bh = int(stats[k, cv2.CC_STAT_WIDTH]), int(stats[k, cv2.CC_STAT_HEIGHT])
            cx, cy = float(cents[k, 0]), float(cents[k, 1])
            r = float(np.sqrt(area / np.pi))
            comp = labels[y0 : y0 + bh, x0 : x0 + bw] == k
            kept.append(
                Blob(
                    cx=cx * SCALE,
                    cy=cy * SCALE,
                    area=area * SCALE * SCALE,
                    radius_fraction=r / side / RADIUS_BIAS,
                    color=name,
                    cell=cell_of(cx, cy, sw, sh),
                    rim_ratio=_rim_ratio(
                        sgray[y0 : y0 + bh, x0 : x0 + bw], comp, cx - x0, cy - y0, r
                    ),
                )
            )
        found[name] = kept
        total = sum(b.area for b in kept)
        if kept and (best is None or total > best[0]):
            best = (total, name)
    blobs = sorted(found[best[1]], key=lambda b: (-b.area, b.cy, b.cx))[:4] if best else []
    instruments = _instruments(small, fov_ok, masks, min_area * 8)
    return Observation(
        width=w,
        height=h,
        fov_fraction=float(fov.mean()),
        box=box,
        box_score=box_score,
        text=text,
        text_score=text_score,
        polyps=blobs,
        instruments=instruments,
    )


def _instruments(
    img: np.ndarray, fov: np.ndarray, masks: dict[str, np.ndarray], min_area: int
) -> int:
    """Large grey (unsaturated, mid-bright) components: metal or plastic tools."""
    mx, mn = _sat_range(img)
    sat = (mx - mn) / (mx + 1e-6)
    grey = fov & (sat < 0.12) & (mx > 0.3) & (mx < 0.9)
    for m in masks.values():
        grey &= m == 0
    g8 = cv2.morphologyEx(
        grey.astype(np.uint8), cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_RECT, (5, 5))
    )
    n, _, stats, _ = cv2.connectedComponentsWithStats(g8, connectivity=8)
    return int(sum(1 for k in range(1, n) if stats[k, cv2.CC_STAT_AREA] >= min_area))
