"""What covers part of a radiograph: burned-in text, laterality markers, collimator shutters.

Display-side masks composited over the MONOCHROME2 value ``v`` (perturb.ops.radiometry):

* ``xray_burned_text``: one annotation set per film (patient, study, projection, site and
  technique lines), burned in at acquisition resolution and resized with the film, in the corners, clear of the annotations already burned into the film (its
  radiograph scene, ``annotation_boxes``).
* ``xray_laterality_marker``: the lead L/R marker on its plastic plate where technologists put
  it (near the shoulder: the film's air by a top corner, else the edge of the field), kept clear of the film's
  annotations, never contradicting its detected markers nor doubling one beside it
  (``marker_spots``); ``SCENE_NOTES``
  gives the engine the note the record carries when the marker differs from its parameters.
* ``xray_collimation``: collimation borders (the blades' shadow: their transmission, the
  body's scatter and the off-focal halo through the log display, brightening outwards, the
  anatomy a smooth trace, never darker than the film it covers, grainy with the quantum and
  readout noise of its low dose, uneven along the band, the display's edge enhancement on
  the new edge; on a few films a scanned film's edge with a light rim on the scanner's dark
  backing) behind a penumbra that widens off centre, one to four independently tilted blades
  (most often one side or a corner) meeting at near-square or slightly rounded corners,
  sometimes a second overlapping blade edge.

The masks are rendered on the host (integer rasterisation, identical for CPU and CUDA); the CPU
paths blend inside each mask's bounding box. The marker's spot, white level and noise are read
from the film in integer arithmetic, on the device by the torch kernel (no read back). Modality is catalog data, not this module's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops import backend, blur, keyed_fields
from perturb.ops._math import per_sample
from perturb.ops.kernels import Level, Params, as_float32, draw, draw_int, register_kernel
from perturb.ops.radiometry import ALL_DTYPES, _load, _store
from perturb.scene import radiograph

Box = tuple[slice, slice]
Box4 = tuple[int, int, int, int]  # x0, y0, x1, y1


def _quadrant_boxes(mask: np.ndarray) -> list[Box]:
    """Bounding boxes of the mask's nonzero pixels in each quadrant (text sits in the corners)."""
    h, w = mask.shape
    boxes = []
    for rows in (slice(0, h // 2), slice(h // 2, h)):
        for cols in (slice(0, w // 2), slice(w // 2, w)):
            part = mask[rows, cols]
            r = np.flatnonzero(part.any(axis=1))
            if r.size:
                c = np.flatnonzero(part.any(axis=0))
                boxes.append(
                    (
                        slice(rows.start + int(r[0]), rows.start + int(r[-1]) + 1),
                        slice(cols.start + int(c[0]), cols.start + int(c[-1]) + 1),
                    )
                )
    return boxes


def _blend_np(
    src: np.ndarray, dst: np.ndarray, mask: np.ndarray, paint: np.ndarray, boxes: list[Box]
) -> None:
    """``_blend`` of one sample on the host: float32 ``v (1 - m) + paint`` inside ``boxes``
    (disjoint, covering every nonzero of the mask and of ``paint``); elsewhere ``m = 0`` and the
    result is ``v`` itself (every level of an integer sample rounds back to itself), so those
    pixels are copied."""
    np.copyto(dst, src)
    for box in boxes:
        keep = np.float32(1.0) - mask[box]
        for c in range(src.shape[0]):
            out = _load(src[c][box]) * keep
            out += paint[box]
            np.clip(out, np.float32(0.0), np.float32(1.0), out=out)
            _store(out, dst[c][box])


def _blend(
    x: torch.Tensor, masks: Sequence[np.ndarray], paints: Sequence[np.ndarray]
) -> torch.Tensor:
    """``v (1 - m) + paint`` with host-rendered float32 layers (H, W) per sample: the coverage
    ``m`` and the premultiplied value ``paint`` (what the layer shows, times its coverage),
    uploaded as two (B,1,H,W) stacks and blended in one pass."""
    m = torch.from_numpy(np.stack(masks)).unsqueeze(1).to(x.device)
    paint = torch.from_numpy(np.stack(paints)).unsqueeze(1).to(x.device)
    return (x * (1.0 - m) + paint).clamp_(0.0, 1.0)


def _over(
    mask: np.ndarray, paint: np.ndarray, alpha: np.ndarray, value: float | np.ndarray
) -> None:
    """Composite a layer of coverage ``alpha`` and value ``value`` over (``mask``, ``paint``) in
    place (Porter-Duff "over", premultiplied): what is drawn later covers what is below."""
    keep = np.float32(1.0) - alpha
    paint *= keep
    if isinstance(value, np.ndarray):
        paint += value * alpha
    else:
        paint += np.float32(value) * alpha
    mask *= keep
    mask += alpha


def _host_rows(
    p: dict[str, torch.Tensor],
    host_params: Sequence[Mapping[str, Any]] | None,
    names: Sequence[str],
) -> list[list[float]]:
    """The named parameters as one host list per sample, as the kernel sees them (float32): the
    overlay ops rasterise with OpenCV on the host, which needs the values. From ``host_params``
    (the records' dicts the engine passes: no device read); a bare call without them reads the
    (B,) tensors back in one transfer."""
    if host_params is not None:
        return [[as_float32(hp[name]) for name in names] for hp in host_params]
    return torch.stack([p[name] for name in names], dim=1).tolist()


# what hospital consoles burn into portable and department chest films (English and German
# sites, as in the NIH and Hannover collections): projection, patient position, technique
_PROJECTIONS_EN = ("AP PORTABLE", "PA ERECT", "AP SUPINE", "SEMI-ERECT", "AP SITTING", "PORTABLE")
_POSITIONS_EN = ("SUPINE", "ERECT", "UPRIGHT", "SEMI-ERECT", "SITTING", "PORTABLE")
_PROJECTIONS_DE = ("Bettaufnahme", "a.p. liegend", "p.a. stehend", "a.p. sitzend", "Bettaufnahme")
_POSITIONS_DE = ("liegend", "sitzend", "halbsitzend", "stehend", "Intensiv")
_SITES_EN = ("ICU", "ED", "WARD 4", "CCU", "BEDSIDE", "NICU", "PICU", "RECOVERY")
_SITES_DE = ("ITS 2", "Station 14", "Notaufnahme", "IMC", "OP 3")
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
CAP_PER_SIZE = 0.75  # cap height of OpenCV's "sans" face over its nominal size (measured: "H")
# plain white glyphs (most consoles), white on a black band (vendor annotation bars, as on the
# Hannover films), white with a thin dark outline (as on some NIH portable films)
TEXT_STYLES = ("plain", "band", "outlined")
TEXT_STYLE_WEIGHTS = (0.55, 0.25, 0.2)
FILM_SOFTNESS = 0.45  # px: gaussian sigma of the film's own resampling after the downsampling


def _text_lines(key: int, n: int) -> list[str]:
    """The burned-in annotation set of one film, as a hospital console writes it: projection,
    patient position, date, time, technique, site, patient id and source-image distance (German
    wording on a quarter of the films), at most one line of each kind, the same values at every
    severity; ``n`` lines are its first ``n`` (at most 8)."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_text"))
    german = bool(g.random() < 0.25)
    day, month, year = int(g.integers(1, 29)), int(g.integers(1, 13)), int(g.integers(2005, 2025))
    hour, minute, second = int(g.integers(0, 24)), int(g.integers(0, 60)), int(g.integers(0, 60))
    kv, mas = int(g.integers(70, 126)), float(g.integers(8, 64)) / 10
    patient, sid = int(g.integers(10**6, 10**7)), (100, 115, 150, 180)[int(g.integers(4))]
    date_form, kv_form = int(g.integers(3)), int(g.integers(3))
    if german:
        projection = _PROJECTIONS_DE[int(g.integers(len(_PROJECTIONS_DE)))]
        position = _POSITIONS_DE[int(g.integers(len(_POSITIONS_DE)))]
        site = _SITES_DE[int(g.integers(len(_SITES_DE)))]
        date = f"{day:02d}.{month:02d}.{year}"
        technique = f"{kv} kV  {mas:.1f} mAs".replace(".", ",")
        distance = f"FFA {sid} cm"
        ident = f"Pat.-Nr. {patient}"
    else:
        projection = _PROJECTIONS_EN[int(g.integers(len(_PROJECTIONS_EN)))]
        position = _POSITIONS_EN[int(g.integers(len(_POSITIONS_EN)))]
        site = _SITES_EN[int(g.integers(len(_SITES_EN)))]
        date = (
            f"{month:02d}/{day:02d}/{year}",
            f"{day:02d}-{_MONTHS[month - 1]}-{year}",
            f"{year}-{month:02d}-{day:02d}",
        )[date_form]
        technique = (f"{kv} kVp  {mas:.1f} mAs", f"kV {kv}  mAs {mas:.1f}", f"{kv}kV {mas:.1f}mAs")[
            kv_form
        ]
        distance = f"SID {sid} cm"
        ident = f"MRN {patient}"
    if position in projection:  # one word of each kind: the position line names the place then
        position = site
        site = ("L" if g.random() < 0.5 else "R") if not german else "Station 7"
    lines = [
        projection,
        position,
        date,
        f"{hour:02d}:{minute:02d}:{second:02d}",
        technique,
        site,
        ident,
        distance,
    ]
    return lines[: max(0, min(n, len(lines)))]


def annotation_boxes(scene: Any, h: int, w: int) -> list[Box4]:
    """The boxes (x0, y0, x1, y1) of the annotations already burned into a film: its
    radiograph scene's (``perturb.scene.radiograph``, given by the engine); none without one."""
    if scene is None or tuple(scene.size) != (h, w) or scene.kind != "radiograph":
        return []
    return [tuple(int(v) for v in a["box"]) for a in radiograph.annotations_of(scene.descriptor)]  # type: ignore[misc]


def _clear(box: Box4, taken: Sequence[Box4], gap: float) -> bool:
    """Whether ``box`` keeps ``gap`` pixels from every box of ``taken``."""
    x0, y0, x1, y1 = box
    return all(
        x1 + gap <= a0 or a1 + gap <= x0 or y1 + gap <= b0 or b1 + gap <= y0
        for a0, b0, a1, b1 in taken
    )


def _line_layers(
    text: str, cap: float, style: int, weight: float, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """(fill, dark) float32 coverages of one line, same shape: the console burns the text into
    the film at acquisition resolution (``scale`` times the film's: OpenCV's anti-aliased "sans"
    face at ``weight``), then the film is resized with the text in it (area filter, and the
    resampler's ``FILM_SOFTNESS``), so the glyph edges are as soft as the anatomy's. ``dark``
    is nothing (``plain``), a thin outline of about one film pixel (``outlined``), or a black
    band behind the line with soft edges (``band``)."""
    kind = TEXT_STYLES[style]
    big = cap * scale
    size = max(4, round(big / CAP_PER_SIZE))
    pad = round(big * 0.7) + 2
    face = cv2.FontFace("sans")
    tw = size * (len(text) + 1)  # wider than any line of the face at this size
    canvas: np.ndarray = np.zeros((round(1.6 * size) + 2 * pad, tw + 2 * pad), dtype=np.uint8)
    cv2.putText(canvas, text, (pad, pad + round(1.1 * size)), 255, face, size, int(weight))
    rows, cols = np.flatnonzero(canvas.any(axis=1)), np.flatnonzero(canvas.any(axis=0))
    if rows.size == 0:
        empty = np.zeros((1, 1), dtype=np.float32)
        return empty, empty.copy()
    r0, r1 = max(0, int(rows[0]) - pad), min(canvas.shape[0], int(rows[-1]) + 1 + pad)
    c0, c1 = max(0, int(cols[0]) - pad), min(canvas.shape[1], int(cols[-1]) + 1 + pad)
    fill = canvas[r0:r1, c0:c1].astype(np.float32) / np.float32(255.0)
    if kind == "outlined":
        width = max(1, round(scale * max(1.0, cap / 14.0)))
        disc = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * width + 1, 2 * width + 1))
        dark = cv2.dilate(fill, disc)
    elif kind == "band":
        dark = np.zeros_like(fill)  # the bar: 0.55 cap above and below the ink, 0.6 beside it
        rim_y, rim_x = max(0, pad - round(0.55 * big)), max(0, pad - round(0.6 * big))
        dark[rim_y : fill.shape[0] - rim_y, rim_x : fill.shape[1] - rim_x] = 1.0
    else:
        dark = np.zeros_like(fill)
    out_w = max(1, round(fill.shape[1] / scale))
    out_h = max(1, round(fill.shape[0] / scale))

    def film(layer: np.ndarray) -> np.ndarray:
        small = cv2.resize(layer, (out_w, out_h), interpolation=cv2.INTER_AREA)
        soft = cv2.GaussianBlur(small, (0, 0), FILM_SOFTNESS)
        if kind == "band" and layer is dark:
            soft = cv2.GaussianBlur(small, (0, 0), max(FILM_SOFTNESS, 0.1 * cap))
        return np.clip(soft, np.float32(0.0), np.float32(1.0)).astype(np.float32)

    return film(fill), film(dark)


def text_layout(
    h: int, w: int, sizes: Sequence[tuple[int, int]], height: float, avoid: Sequence[Box4] = ()
) -> list[tuple[int, int, int]]:
    """(line index, x0, y0) top-left corners of line boxes of ``sizes`` (width, height) stacked
    in the four corners in turn (line i goes to corner i % 4, below (above, at the bottom) the
    lines already there), each kept a line's ``height`` away from the boxes of ``avoid``
    (annotations already on the film): a line that would touch one moves one row further from
    its corner, then to the next corner; a line that fits in no corner's band (the outer
    quarter of the film's height) is left out. Lines align with the film's edges."""
    margin = max(1, round(0.8 * height))
    step = round(1.7 * height) + 1
    rows = [0, 0, 0, 0]  # the next free row of each corner
    out = []
    for i, (tw, th) in enumerate(sizes):
        for corner in [(i + k) % 4 for k in range(4)]:
            placed = None
            row = rows[corner]
            while placed is None:
                x0 = margin if corner in (0, 2) else w - margin - tw
                y0 = margin + row * step if corner in (0, 1) else h - margin - th - row * step
                box = (x0, y0, x0 + tw, y0 + th)
                if (
                    x0 < 0
                    or x0 + tw > w  # wider than the film (a sliver film)
                    or (corner in (0, 1) and y0 + th > h // 4)
                    or (corner in (2, 3) and y0 < h - h // 4)
                ):
                    break  # out of the corner's band (a quarter of the film): the next corner
                if _clear(box, avoid, height):
                    placed = (i, int(x0), int(y0))
                    rows[corner] = row + 1
                row += 1
            if placed is not None:
                out.append(placed)
                break
    return out


def text_mask(
    h: int,
    w: int,
    lines: list[str],
    height: float,
    avoid: Sequence[Box4] = (),
    style: int = 0,
    value: float = 1.0,
    dark: float = 0.02,
    weight: float = 500.0,
    scale: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, premultiplied value) float32 (H, W) of burned-in text lines laid out by
    ``text_layout``: a fill of ``value`` over ``dark`` (an outline or a band, ``_line_layers``),
    with no noise over it (burned in after acquisition); ``height`` is the cap height in pixels.
    A ``band`` is one black block from the film's edges to the lines of each corner."""
    mask = np.zeros((h, w), dtype=np.float32)
    paint = np.zeros((h, w), dtype=np.float32)
    layers = [_line_layers(t, height, style, weight, scale) for t in lines]
    placed = text_layout(h, w, [f.shape[::-1] for f, _ in layers], height, avoid)
    if TEXT_STYLES[style] == "band" and placed:
        # a vendor's annotation bar: one black block from the film's corner edges to each line
        # (stacked lines merge), its edges as soft as the band's own (``_line_layers``)
        bar = np.zeros((h, w), dtype=np.float32)
        inset = round(0.3 * height)
        for i, x0, y0 in placed:
            fh, fw = layers[i][0].shape
            xs = slice(0, x0 + fw - inset) if x0 + fw / 2 < w / 2 else slice(x0 + inset, w)
            ys = slice(0, y0 + fh - inset) if y0 + fh / 2 < h / 2 else slice(y0 + inset, h)
            bar[ys, xs] = 1.0
        soft: np.ndarray = cv2.GaussianBlur(bar, (0, 0), max(FILM_SOFTNESS, 0.1 * height))
        _over(mask, paint, np.clip(soft, np.float32(0.0), np.float32(1.0)), dark)
    for i, x0, y0 in placed:
        fill, shade = layers[i]
        box = (slice(y0, y0 + fill.shape[0]), slice(x0, x0 + fill.shape[1]))
        if TEXT_STYLES[style] != "band":
            _over(mask[box], paint[box], shade, dark)
        _over(mask[box], paint[box], fill, value)
    return mask, paint


TEXT_PARAMS = ("lines", "height", "value", "style", "weight", "scale")


def _text_sampler(rng_: np.random.Generator, level: Level) -> Params:
    u = float(rng_.random())
    style = int(np.searchsorted(np.cumsum(TEXT_STYLE_WEIGHTS), u, side="right"))
    return {
        "lines": draw_int(rng_, level["lines"]),
        "height": draw(rng_, level["height"]),
        "value": draw(rng_, level["value"]),
        "style": float(min(len(TEXT_STYLES) - 1, style)),
        "weight": 450.0 + 250.0 * float(rng_.random()),  # a console's regular to bold face
        "scale": 2.0 + 2.0 * float(rng_.random()),  # acquisition over film resolution
    }


def _text_layers(
    key: int, h: int, w: int, row: Sequence[float], scene: Any
) -> tuple[np.ndarray, np.ndarray]:
    """One film's text layers from its ``TEXT_PARAMS`` (host floats, as the kernel sees them)."""
    lines, height, value, style, weight, scale = row
    return text_mask(
        h,
        w,
        _text_lines(key, round(lines)),
        height * min(h, w),
        annotation_boxes(scene, h, w),
        round(style),
        value,
        weight=weight,
        scale=scale,
    )


@register_kernel("xray_burned_text", sampler=_text_sampler, host_params=True, uses_scene=True)
def xray_burned_text(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    host_params: Sequence[Mapping[str, Any]] | None = None,
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Burned-in console annotations (projection, position, date, time, technique, site, id,
    distance) along the film's top and bottom edges, as an X-ray console writes them into the
    pixels at acquisition resolution before the film is resized for storage: light glyphs of a
    proportional sans face at a keyed weight, as soft as the film's own resampling
    (``_line_layers``), mostly plain, else on a black vendor band or with a thin dark outline
    (``TEXT_STYLES``, keyed), no quantum noise over them. ``lines`` grows with severity and the
    first lines of a sample are the same at every severity. Lines keep clear of the annotations
    already on the film (its radiograph scene: ``text_layout``).

    Kornia: own kernel: the layers are rendered on the host (OpenCV text, identical on every
    device, the CPU path's pixels bit for bit) from the records' parameters on the host
    (``host_params``), uploaded once and blended in one pass; Kornia has no text rendering."""
    h, w = x.shape[-2:]
    rows = _host_rows(p, host_params, TEXT_PARAMS)
    given = list(scenes) if scenes is not None else [None] * len(keys)
    layers = [
        _text_layers(int(k), h, w, row, sc) for k, row, sc in zip(keys, rows, given, strict=True)
    ]
    return _blend(x, [m for m, _ in layers], [v for _, v in layers])


@backend.register_cpu("xray_burned_text", dtypes=ALL_DTYPES, uses_scene=True)
def xray_burned_text_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    row = [as_float32(p[n]) for n in TEXT_PARAMS]
    mask, paint = _text_layers(key, h, w, row, scene)
    _blend_np(src, dst, mask, paint, _quadrant_boxes(mask))


Spot = tuple[int, int, int, int, int]  # a candidate: the planning square's x0, y0; the
# marker's x0, y0; its tier (``marker_spots``: 0 near the corner, 1 further along, 2 down)


def marker_spots(
    h: int, w: int, letter: str, size: float, right_corner: bool, scene: Any = None
) -> tuple[str | None, list[Spot], int, str | None]:
    """Where the laterality marker may go: (letter or None for no marker, the candidate spots,
    the planning square's side, why it differs from the drawn letter and corner, or None). A film's detected markers
    (its radiograph scene) decide the letter: the added marker never contradicts them (one side
    read: that letter, on that marker's side of the film; both: no marker; a marker-like
    annotation whose side was not read (``radiograph.unread_markers``): no marker).

    Technologists put the marker in the air beside the body or at the very edge of the field,
    near a shoulder: the candidate squares (margin 3 % of the shorter side) run in three tiers
    from the drawn top corner: along the top edge (up to twice the marker's size), further
    along it (above the shoulder, clear of a marker the film shows in its corner, but never
    over the neck, spine or mediastinum: every square within the outer ``OUTER`` of the
    width) and down the outer edge beside the body (to ``DOWN_REACH`` of the height),
    each keeping half its size from every detected annotation and ``APART`` of the shorter
    side from the film's own marker (read or marker-like: a second marker is never a duplicate
    beside the first); the first corner (drawn top, other top, then the bottom ones, along
    their edge) with a clear candidate gives them. ``choose_spot`` picks one by the
    film's levels. The spots depend on the scene only, never the film's pixels."""
    side = min(h, w)
    margin = round(0.03 * side)
    s = max(2, round(size))
    found = radiograph.annotations_of(scene.descriptor) if _fits(scene, h, w) else []
    sides = sorted({str(a["side"]) for a in found if a["type"] == "marker" and a["side"]})
    if len(sides) > 1:
        return None, [], 0, "no marker added: the film already shows both an L and an R marker"
    if not sides and _fits(scene, h, w):
        unread = radiograph.unread_markers(scene.descriptor)
        if unread:
            box = ", ".join(str(a["box"]) for a in unread)
            return (
                None,
                [],
                0,
                f"no marker added: marker-like annotation(s) at {box}, side not read",
            )
    why = None
    if sides and sides[0] != letter:
        why = f"letter {sides[0]} (drawn {letter}): the film's detected marker is {sides[0]}"
        letter = sides[0]
    if sides:  # on the film's side of that marker: an L on the patient's left, wherever shown
        read = [a["box"] for a in found if a["type"] == "marker" and a["side"]]
        on_right = sum(b[0] + b[2] for b in read) / (2 * len(read)) > w / 2
        if on_right != right_corner:
            side_note = "on the side of the film's detected marker"
            why = side_note if why is None else f"{why}; {side_note}"
            right_corner = on_right
    avoid = [tuple(int(v) for v in a["box"]) for a in found]
    # a film's own marker is never doubled by one beside it: a second marker (a technologist's
    # second lead marker, the console's letter) sits well apart from it
    unread = radiograph.unread_markers(scene.descriptor) if _fits(scene, h, w) else []
    own = [tuple(int(v) for v in a["box"]) for a in found if a["type"] == "marker"]
    own += [tuple(int(v) for v in a["box"]) for a in unread]
    # the place is found for the largest marker (severity 5) and the square grows from the same
    # outer corner, so a film's marker at every severity sits at one place, nested
    big = max(s, round(PLAN_SIZE * side))
    step = max(1, big // 2)
    corners = [
        (right_corner, True),
        (not right_corner, True),
        (right_corner, False),
        (not right_corner, False),
    ]
    if sides:  # only the detected marker's side of the film
        corners = [c for c in corners if c[0] == right_corner]
    reach_x = round(OUTER * w) - big - margin  # the farthest shift off the spine
    along = range(0, max(0, min(2 * big, reach_x)) + 1, step)
    down = range(step, max(step, round(DOWN_REACH * h) - margin - big + 1), step)
    # further along the top edge, but never over the neck, spine or mediastinum (the middle
    # ``1 - 2 OUTER`` of the width): the square stays within the outer ``OUTER`` of the width
    far = range(2 * big + step, max(2 * big + step, reach_x + 1), step)

    def squares(right: bool, top: bool, shifts: range, sides_too: bool) -> list[tuple[int, int]]:
        edge_x = w - margin - big if right else margin
        y_edge = margin if top else h - margin - big
        out = [(w - margin - big - k if right else margin + k, y_edge) for k in shifts]
        if sides_too and top:  # down the outer edge, beside the shoulder
            out += [(edge_x, margin + k) for k in down]
        return out

    def clear(x0: int, y0: int) -> bool:
        inside = x0 >= 0 and y0 >= 0 and x0 + big <= w and y0 + big <= h
        square = (x0, y0, x0 + big, y0 + big)
        return (
            inside
            and _clear(square, avoid, 0.5 * big)  # type: ignore[arg-type]
            and _clear(square, own, APART * side)  # type: ignore[arg-type]
        )

    for k, (right, top) in enumerate(corners):
        # the tiers in the order ``choose_spot`` prefers them: the edge near the corner, the
        # same edge further along (nearer the neck), down the outer edge beside the body
        tiers = (
            squares(right, top, along, False),
            squares(right, top, far, False),
            squares(right, top, range(0), True),
        )
        found_ = [(x, y, t) for t, sq in enumerate(tiers) for x, y in sq if clear(x, y)]
        if not found_:
            continue
        if k or all(t == 1 for _, _, t in found_):
            moved = "moved clear of the film's annotations"
            why = moved if why is None else f"{why}; {moved}"
        # the marker's square in the outer corner of the planned one
        inner = (big - s if right else 0, 0 if top else big - s)
        return letter, [(x, y, x + inner[0], y + inner[1], t) for x, y, t in found_], big, why
    return None, [], 0, "no marker added: no corner of the film is clear of its annotations"


def is_air(square_sum: int, big: int, film_sum: int, pixels: int) -> bool:
    """Whether a planning square of ``big`` px a side with integer level sum ``square_sum`` is
    air: its mean level at most ``AIR_OF_MEAN`` of the film's mean (``film_sum`` over
    ``pixels``), in exact integer arithmetic (the torch kernel's test is the same)."""
    num, den = AIR_OF_MEAN
    return den * square_sum * pixels <= num * film_sum * big * big


def at_edge(spot: Spot, s: int, h: int, w: int) -> Spot:
    """``spot`` (the marker's square of side ``s``) pushed from the corner's margin out to
    ``EDGE`` inside the film's edge, on each axis where it sits at the margin (a spot further
    along an edge keeps that coordinate, clear of the annotations it was planned round)."""
    px, py, x0, y0, tier = spot
    side = min(h, w)
    margin, e = round(0.03 * side), round(EDGE * side)
    x = w - s - e if x0 == w - margin - s else (e if x0 == margin else x0)
    y = e if y0 == margin else (h - s - e if y0 == h - margin - s else y0)
    return px, py, x, y, tier


def exposed(film: np.ndarray, x: int, y: int, big: int) -> bool:
    """Whether the planning square at (x, y) of ``big`` px a side is real exposure: its
    horizontal neighbour differences (within the square) average at least ``1 / FLAT_OF``
    level, the film's quantum noise, never flat digital padding, a clipped black or white
    band, or a flat fill (the torch kernel's test, ``_place_markers``, is the same integers)."""
    patch = film[y : y + big, x : x + big].astype(np.int64)
    rough = int(np.abs(patch[:, 1:] - patch[:, :-1]).sum())
    return FLAT_OF * rough >= big * (big - 1)


def choose_spot(film: np.ndarray | None, spots: Sequence[Spot], big: int, s: int) -> Spot:
    """Of the spots whose planning square is air (``is_air``: the unattenuated air beside the
    body or above the shoulder, not the white collimation band, tissue or lung) and real
    exposure (``exposed``: it carries the film's quantum noise, not digital padding), the one
    whose square holds the film's lowest sum of levels (``film_levels``: the darkest, most
    exposed air, beyond the skin line; the first on a tie, nearest the drawn corner); with no
    such air where the marker may go (the body fills the corner), the spot nearest the drawn
    corner (the first: where technologists put it over the shoulder, not the thinner tissue
    further down the outer edge), pushed out to just inside the film's edge (``at_edge``); the
    first spot without the film. The spots never cover the spine or mediastinum (``marker_spots``).
    Integer sums: the torch kernel's choice (``_place_markers``) is the same."""
    if film is None:
        return spots[0]
    total = int(film.sum(dtype=np.int64))
    ranks: list[int] = []
    for x, y, _, _, _ in spots:
        square = int(film[y : y + big, x : x + big].sum(dtype=np.int64))
        air = is_air(square, big, total, film.size) and exposed(film, x, y, big)
        # with no air: the spot nearest the drawn corner (the order of ``spots``)
        ranks.append(square if air else NEVER + len(ranks))
    best = int(np.argmin(ranks))
    if ranks[best] >= NEVER:
        return at_edge(spots[best], s, *film.shape)
    return spots[best]


def marker_plan(
    h: int,
    w: int,
    letter: str,
    size: float,
    right_corner: bool,
    scene: Any = None,
    film: np.ndarray | None = None,
) -> tuple[str | None, int, int, str | None]:
    """Where the laterality marker goes (``marker_spots``, ``choose_spot``): (letter or None
    for no marker, x0, y0 of its square, why it differs from the drawn letter and corner, or
    None)."""
    letter_, spots, big, why = marker_spots(h, w, letter, size, right_corner, scene)
    if letter_ is None:
        return None, 0, 0, why
    _, _, x0, y0, _ = choose_spot(film, spots, big, max(2, round(size)))
    return letter_, x0, y0, why


PLAN_SIZE = 0.104  # the largest marker (catalog: severity 5's upper size), shorter side
DOWN_REACH = 0.7  # how far down the outer edge (fraction of the height) the marker may go
APART = 0.18  # a film's own marker: the added one keeps this far from it (shorter side)
EDGE = 0.005  # with no air: the marker's inset from the film's edge, shorter side
AIR_OF_MEAN = (9, 20)  # air: a square's mean level at most 9/20 of the film's mean level
OUTER = 0.35  # the marker's square stays within this outer share of the width (off the spine)
FLAT_OF = 5  # exposure: the mean neighbour difference in a square at least 1/5 level
NEVER = 1 << 40  # a square that is not exposed air ranks above every air square


def _fits(scene: Any, h: int, w: int) -> bool:
    return scene is not None and tuple(scene.size) == (h, w) and scene.kind == "radiograph"


@dataclass(frozen=True)
class MarkerStyle:
    """How one film's marker was made (the sampler's keyed draws, level-invariant).

    lead: a lead letter radiographed with the patient (else the console's digital letter);
    angle: its tilt on the detector, degrees; mirrored: placed reversed (seen mirrored);
    initials: how many technologist's initials sit in a row with the letter (0, 2 or 3, lead only);
    density: the density of the bead beside a lead letter, relative to the lead (the digital
    letter reaches the display's white); blur: the Gaussian sigma of the focal-spot penumbra
    and detector MTF, fraction of the shorter side; holder: the plastic holder's extra density
    over air (0: none); ring: the digital letter sits in a ring; level: the lead's coverage
    (its level's share of the way from the film under it to the film's white level); layout: the initials beside the
    letter (> 0.5) rather than under it."""

    lead: bool = False
    angle: float = 0.0
    mirrored: bool = False
    initials: int = 0
    density: float = 1.0
    blur: float = 0.0
    holder: float = 0.0
    ring: bool = False
    level: float = 1.0
    layout: float = 0.0

    @classmethod
    def of(cls, p: Mapping[str, Any]) -> MarkerStyle:
        """The style a record's (or the CPU path's) parameters give, as the kernel sees them."""
        f = {n: as_float32(p[n]) for n in MARKER_STYLE_PARAMS}
        return cls(
            lead=f["lead"] > 0.5,
            angle=f["angle"],
            mirrored=f["mirrored"] > 0.5,
            initials=round(f["initials"]),
            density=f["density"],
            blur=f["blur"],
            holder=f["holder"],
            ring=f["ring"] > 0.5,
            level=f["level"],
            layout=f["layout"],
        )


MARKER_STYLE_PARAMS = (
    "lead",
    "angle",
    "mirrored",
    "initials",
    "density",
    "blur",
    "holder",
    "ring",
    "level",
    "layout",
)
INITIALS = "ABCDEFGHJKMNPSTVW"  # technologists' initials: never an L or an R beside the letter
SUPERSAMPLE = 4  # the marker is drawn at 4x and area-averaged down (its edges anti-aliased)
# lead marker letters: a heavy block sans (most), and a wide stroke face drawn with round ends
# and joins (the rounded letters cut from lead sheet)
LEAD_FONTS = ("block", "rounded_wide")
FILM_NOISE = (0.002, 0.04)  # bounds of the film's own noise sigma read round the marker
DISC_PLATE = 0.05  # the least plate density a disc sits on (a faint plate makes it a lone dot)
ROUGH = 0.12  # the lead letters' edge wander: the threshold's keyed shift, of the ink's range
LEAD_NOISE = 0.4  # of the film's noise sigma added under the lead (its scatter's own noise)
WHITE_PIXELS = 4  # pixels at the film's white level (its maximum, robust to a stray pixel)


@lru_cache(maxsize=1)
def _normal_table() -> np.ndarray:
    """The keyed normal fields' inverse-CDF table on the host, read once (no device read per
    marker on the torch path)."""
    return rng.normal_lut_numpy().copy()


def _letter(canvas: np.ndarray, text: str, cap: float, x: float, base: float, bold: int) -> None:
    """Draw ``text`` with a cap height of ``cap`` px, its left end at ``x``, baseline ``base``."""
    size = max(4, round(cap / CAP_PER_SIZE))
    ink = np.zeros_like(canvas)
    cv2.putText(ink, text, (round(x), round(base)), 255, cv2.FontFace("uni"), size, 400)
    if bold > 1:
        ink = cv2.dilate(ink, np.ones((bold, bold), np.uint8))
    np.maximum(canvas, ink, out=canvas)


def _lead_text(
    text: str, cap: float, font: str, condense: float = 1.0, thin: bool = False
) -> np.ndarray:
    """``text`` as a lead-marker face would cut it, cap height ``cap`` px, on its own tight
    uint8 canvas: a heavy block sans (OpenCV's sans at weight 900) or a wide stroke face drawn
    with round caps and joins (Hershey duplex, stroke 0.28 of the cap height), narrowed to
    ``condense`` of its width (faces of lead letters run from square to tall and narrow), its
    corners rounded by about 0.06 of the cap height (letters stamped or cut from lead sheet
    have no sharp corners). ``thin``: the initials' lighter strokes (weight 600, stroke 0.2 of
    the cap height: the reference films' initials are thinner than their letter, and greyer
    once the blur spreads them)."""
    pad = round(0.5 * cap) + 2
    wide = round(len(text) * 1.3 * cap) + 2 * pad
    canvas = np.zeros((round(cap) + 2 * pad, wide), dtype=np.uint8)
    if font == "block":
        size = max(4, round(cap / CAP_PER_SIZE))
        weight = 600 if thin else 900
        cv2.putText(canvas, text, (pad, pad + round(cap)), 255, cv2.FontFace("sans"), size, weight)
    else:
        face = cv2.FONT_HERSHEY_DUPLEX
        stroke = max(1, round((0.2 if thin else 0.28) * cap))
        probe = np.zeros((200, 400), dtype=np.uint8)  # the face's height at scale 4 (OpenCV's
        cv2.putText(probe, text, (10, 150), face, 4.0, 255, 1)  # thick strokes keep it)
        rows = np.flatnonzero(probe.any(axis=1))
        scale = 4.0 * cap / max(1, int(rows[-1] - rows[0]))
        base = pad + round(cap) - round((rows[-1] - 150) * scale / 4.0)
        cv2.putText(canvas, text, (pad, base), face, scale, 255, stroke, cv2.LINE_AA)
    soft = cv2.GaussianBlur(canvas, (0, 0), max(0.5, 0.04 * cap))
    ink = np.where(soft >= 128, np.uint8(255), np.uint8(0)).astype(np.uint8)
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    tight = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    if condense == 1.0:
        return tight
    width = max(1, round(tight.shape[1] * condense))
    return np.asarray(
        cv2.resize(tight, (width, tight.shape[0]), interpolation=cv2.INTER_AREA), dtype=np.uint8
    )


def _paste(canvas: np.ndarray, ink: np.ndarray, cx: float, top: float) -> None:
    """``ink`` onto ``canvas`` (maximum), centred on column ``cx``, its top row at ``top``."""
    y0, x0 = round(top), round(cx - ink.shape[1] / 2)
    h, w = ink.shape
    region = canvas[y0 : y0 + h, x0 : x0 + w]
    np.maximum(region, ink[: region.shape[0], : region.shape[1]], out=region)


def _rounded_box(
    canvas: np.ndarray, box: tuple[float, float, float, float], r: float, v: float
) -> None:
    """Fill the rectangle ``box`` (x0, y0, x1, y1) with corners rounded by ``r`` px, value ``v``."""
    x0, y0, x1, y1 = (round(c) for c in box)
    r_ = max(1, min(round(r), (x1 - x0) // 2, (y1 - y0) // 2))
    cv2.rectangle(canvas, (x0 + r_, y0), (x1 - r_, y1), v, -1)
    cv2.rectangle(canvas, (x0, y0 + r_), (x1, y1 - r_), v, -1)
    for cx, cy in ((x0 + r_, y0 + r_), (x1 - r_, y0 + r_), (x0 + r_, y1 - r_), (x1 - r_, y1 - r_)):
        cv2.circle(canvas, (cx, cy), r_, v, -1)


def film_levels(v: np.ndarray) -> np.ndarray:
    """One film's display value (H, W, float in [0, 1]) as uint8 levels: what placement, white
    level and noise are read from (identical for the CPU path's and the torch path's floats)."""
    return np.rint(np.clip(v, 0.0, 1.0) * np.float32(255.0)).astype(np.uint8)


def film_white(film: np.ndarray) -> float:
    """The film's white level (display value): the highest level at least ``WHITE_PIXELS``
    pixels reach (its display's saturation: burned-in text, an existing marker, the unexposed
    band): the top a lead marker's level lies below, on this film's display curve
    (``_film_whites``)."""
    hist = np.bincount(film.ravel(), minlength=256)
    above = np.cumsum(hist[::-1])  # pixels at or above each level, from the top
    level = 255 - int(np.argmax(above >= WHITE_PIXELS))
    return level / 255.0


def _lower_median(hist: np.ndarray) -> int:
    """The lower median's bin of a histogram of integers (its total at least 1)."""
    return int(np.argmax(np.cumsum(hist) >= (int(hist.sum()) - 1) // 2 + 1))


def _sigma_of(n: int, mad: int, abs_sum: int) -> float:
    """The noise sigma (display value) from neighbour differences: 1.4826 MAD / sqrt 2, or
    where the MAD is 0 (integer levels) the mean absolute difference sqrt(pi) / 2; within
    ``FILM_NOISE`` (its low bound for fewer than 16 differences)."""
    if n < 16:
        return FILM_NOISE[0]
    if mad > 0:
        sigma = 1.4826 * mad / math.sqrt(2.0) / 255.0
    else:
        sigma = abs_sum / n * math.sqrt(math.pi) / 2.0 / 255.0
    return min(max(sigma, FILM_NOISE[0]), FILM_NOISE[1])


def noise_window(box: Box4, h: int, w: int) -> Box4:
    """Where the film's noise is read round a marker square ``box`` (x0, y0, x1, y1): the
    square grown by its size on every side, within the film."""
    x0, y0, x1, y1 = box
    s = max(x1 - x0, y1 - y0)
    return max(0, x0 - s), max(0, y0 - s), min(w, x1 + s), min(h, y1 + s)


def film_noise(film: np.ndarray, box: Box4) -> float:
    """The film's own noise sigma (display value) round ``box`` (``noise_window``): from the
    horizontal neighbour differences of unclipped levels (``_sigma_of``), with integer medians
    (the torch kernel's ``_film_sigmas`` gives the same)."""
    wx0, wy0, wx1, wy1 = noise_window(box, *film.shape)
    patch = film[wy0:wy1, wx0:wx1].astype(np.int16)
    a, b = patch[:, 1:], patch[:, :-1]
    d = (a - b)[(a > 0) & (a < 255) & (b > 0) & (b < 255)].astype(np.int64)
    if d.size < 16:
        return FILM_NOISE[0]
    hist = np.bincount(d + 255, minlength=511)
    med = _lower_median(hist) - 255
    dev = np.abs(np.arange(511) - 255 - med)
    mad = _lower_median(np.bincount(dev, weights=hist, minlength=511).astype(np.int64))
    return _sigma_of(int(d.size), mad, int(np.abs(d).sum()))


def _lead_marker(
    s: int, letter: str, style: MarkerStyle, key: int, side: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A lead marker in its s x s square, as radiographed with the patient: (coverage, value
    per unit white level, value per unit noise sigma) without its plastic plate, and the
    plate's coverage (the same per unit white) and value per unit noise sigma; its value
    ``white unit + sigma grain`` with the plate's share scaled by the film's ``plate_gain``
    (``marker_mask``, ``_place_markers``) for the film's white level and noise.

    The lead letter (a keyed face of ``LEAD_FONTS``: chunky block letters, most of them, or a
    wide rounded stroke face; square to tall and narrow; corners rounded) with the
    technologist's initials or a number in smaller type of the same face in one row, under the
    letter or beside it (``style.layout``), cut from the same sheet, in a radiolucent acrylic
    holder on most (a plate 1.05-1.3 times as long as wide that the lead mostly fills, longer
    at one end where a metal disc or rivet sits on a tenth of the plates of at least ``DISC_PLATE``
    density (never a lone dot on an unseen plate), keyed margins and corner radius, a
    denser moulded rim on half; some markers have none), tilted by ``style.angle`` (a few
    degrees, sometimes turned on its side or upside down) and the whole marker mirrored when
    placed face down; the letters' cut edges wander by a fraction of a pixel (``ROUGH``); the
    initials in lighter strokes than the letter (``_lead_text``'s ``thin``). Lead stops almost
    all of the primary beam, but the patient's scatter reaches the detector under it: the
    letter covers the film by ``style.level`` (0.75-0.97 of the way from the film to its white:
    the reference films measure about 0.9 over air, 0.6-0.85 over tissue), with a little noise
    of its own (``LEAD_NOISE``); the disc covers it by
    ``style.density`` of that. The focal spot's geometric unsharpness and the detector's MTF
    blur every edge by ``style.blur`` (0.7-1.2 px at 1024 px), and the plastic carries the
    film's own noise. The CR/DR display processing's unsharp mask then pulls the film round
    the dense lead towards black: a faint dark halo of keyed gain (0.05-0.15) and width (2.5-5 px at
    1024 px), ``v - k b (white - v)`` with ``b`` the wide blur's excess over the lead's
    coverage (a negative coverage in the returned layers, clipped at black in the blend)."""
    ss = SUPERSAMPLE
    big = s * ss
    work = 3 * big
    cap = 0.62 * big
    g = rng.scalar_rng(rng.sub_key(key, "xray_marker"))
    font = LEAD_FONTS[int(g.random() >= 0.7)]  # the block face on most
    condense = 0.72 + 0.3 * g.random()
    if style.initials and g.random() < 0.25:  # a numbered marker instead of initials
        sub = "".join(str(int(g.integers(10))) for _ in range(style.initials))
    else:
        sub = "".join(INITIALS[int(g.integers(len(INITIALS)))] for _ in range(style.initials))
    glyph = _lead_text(letter, cap, font, condense)
    small = (
        _lead_text(sub, (0.4 + 0.15 * g.random()) * cap, font, condense, thin=True)
        if sub
        else None
    )
    gap = (0.08 + 0.1 * g.random()) * cap
    beside = small is not None and style.layout > 0.5 and len(sub) <= 2
    if small is None:
        block_w, block_h = float(glyph.shape[1]), float(glyph.shape[0])
    elif beside:  # one row: the letter, then the initials on its baseline
        block_w = glyph.shape[1] + gap + small.shape[1]
        block_h = float(glyph.shape[0])
    else:  # the initials in a row under the letter
        block_w = float(max(glyph.shape[1], small.shape[1]))
        block_h = glyph.shape[0] + gap + small.shape[0]
    # the plate round the lead (its box relative to the lead's centre): wider than the lead
    # by keyed margins; oblong (1.05-1.3 times as long as wide, along the lead's longer side:
    # the lead fills most of the plate, as on the reference films), the extra length the grip
    # at one end, where a metal disc or rivet sits on a tenth
    pad_x, pad_y = (0.08 + 0.14 * g.random()) * cap, (0.07 + 0.12 * g.random()) * cap
    px0, py0 = -block_w / 2 - pad_x, -block_h / 2 - pad_y
    px1, py1 = block_w / 2 + pad_x, block_h / 2 + pad_y
    aspect = 1.05 + 0.25 * g.random()
    upright = py1 - py0 >= px1 - px0
    grip = max(0.0, aspect * min(px1 - px0, py1 - py0) - max(px1 - px0, py1 - py0))
    grip_top = g.random() < 0.6  # the grip above (or left of) the lead
    r = (0.13 + 0.11 * g.random()) * cap
    disc = g.random() < 0.1 and style.holder >= DISC_PLATE  # never a lone dot: on a plate that shows
    if disc:
        grip = max(grip, 2.0 * r + 1.2 * (pad_y if upright else pad_x))
    if style.holder <= 0:  # a bare lead letter: only the lead decides the size
        px0, py0, px1, py1 = -block_w / 2, -block_h / 2, block_w / 2, block_h / 2
    elif upright:
        py0, py1 = (py0 - grip, py1) if grip_top else (py0, py1 + grip)
    else:
        px0, px1 = (px0 - grip, px1) if grip_top else (px0, px1 + grip)
    # the plate's centre at the canvas's
    cx, cy = work / 2 - (px0 + px1) / 2, work / 2 - (py0 + py1) / 2
    hx0, hy0, hx1, hy1 = cx + px0, cy + py0, cx + px1, cy + py1
    top, left = cy - block_h / 2, cx - block_w / 2
    letter_ink = np.zeros((work, work), dtype=np.uint8)
    if small is None:
        _paste(letter_ink, glyph, cx, top)
    elif beside:
        _paste(letter_ink, glyph, left + glyph.shape[1] / 2, top)
        _paste(letter_ink, small, left + block_w - small.shape[1] / 2, top + block_h - small.shape[0])
    else:
        _paste(letter_ink, glyph, cx, top)
        _paste(letter_ink, small, cx, top + glyph.shape[0] + gap)
    holder = np.zeros((work, work), dtype=np.float32)
    bead = np.zeros((work, work), dtype=np.float32)
    if style.holder > 0:
        if disc:  # in the grip, off the lead's axis by a keyed shift
            if upright:
                by_ = hy0 + pad_y + r if grip_top else hy1 - pad_y - r
                bx_ = cx + (g.random() - 0.5) * max(0.0, block_w - 2 * r)
            else:
                bx_ = hx0 + pad_x + r if grip_top else hx1 - pad_x - r
                by_ = cy + (g.random() - 0.5) * max(0.0, block_h - 2 * r)
            cv2.circle(bead, (round(bx_), round(by_)), round(r), 1.0, -1)
        radius = (0.08 + 0.3 * g.random()) * min(hx1 - hx0, hy1 - hy0) / 2
        if g.random() < 0.5:  # a moulded plate: its edge a little denser than its face
            rim = max(1, round(0.05 * cap))
            _rounded_box(holder, (hx0, hy0, hx1, hy1), radius, 1.25)
            _rounded_box(holder, (hx0 + rim, hy0 + rim, hx1 - rim, hy1 - rim), radius - rim, 1.0)
        else:
            _rounded_box(holder, (hx0, hy0, hx1, hy1), radius, 1.0)
    # the display's unsharp mask (CR/DR processing) leaves a dark halo round the dense lead:
    # the film minus ``halo_k`` times its blurred excess, a keyed kernel of 2.5-5 px at 1024 px
    halo_k = 0.05 + 0.1 * g.random()
    halo_px = (0.0025 + 0.0025 * g.random()) * side
    # letters cut or stamped from lead sheet by hand: their edges wander by a fraction of a
    # pixel (a keyed smooth field of about a tenth of the cap height moving the threshold)
    cell = max(2, round(0.1 * cap))
    field = g.standard_normal((work // cell + 2, work // cell + 2)).astype(np.float32)
    field = np.asarray(
        cv2.resize(field, (work, work), interpolation=cv2.INTER_CUBIC), dtype=np.float32
    )
    soft = cv2.GaussianBlur(letter_ink.astype(np.float32), (0, 0), 0.5 * ss)
    rough = soft + np.float32(ROUGH * 255.0) * field
    ink = (rough >= np.float32(127.5)).astype(np.float32)
    ink = np.asarray(cv2.GaussianBlur(ink, (0, 0), 0.35 * ss), dtype=np.float32)  # a cut edge
    layers = np.stack([ink, holder, bead], axis=-1)
    if style.mirrored:
        layers = layers[:, ::-1].copy()
    angle = math.radians(style.angle)
    blur_px = style.blur * side
    span_w = abs(math.cos(angle)) * (hx1 - hx0) + abs(math.sin(angle)) * (hy1 - hy0)
    span_h = abs(math.sin(angle)) * (hx1 - hx0) + abs(math.cos(angle)) * (hy1 - hy0)
    room = big - 2 * (2.0 * blur_px + halo_px + 0.5) * ss
    scale = min(1.0, max(room, 0.2 * big) / max(span_w, span_h))
    mid_x = (hx0 + hx1) / 2  # the holder's centre (mirrored with it when placed face down)
    if style.mirrored:
        mid_x = work - mid_x
    mid_y = (hy0 + hy1) / 2
    turn = cv2.getRotationMatrix2D((mid_x, mid_y), style.angle, scale)
    shift = np.zeros((2, 3))
    shift[0, 2] = big / 2 - mid_x
    shift[1, 2] = big / 2 - mid_y
    turn = np.asarray(turn, dtype=np.float64) + shift  # the holder's centre to the square's
    placed = cv2.warpAffine(layers, turn, (big, big), flags=cv2.INTER_LINEAR)
    if blur_px > 0:
        placed = cv2.GaussianBlur(placed, (0, 0), blur_px * ss)
    down = cv2.resize(placed, (s, s), interpolation=cv2.INTER_AREA)
    letter_a = np.clip(down[..., 0], 0.0, 1.0)
    holder_a = np.clip(down[..., 1] * np.float32(style.holder), 0.0, 1.0)
    bead_a = np.clip(down[..., 2] * np.float32(style.density * style.level), 0.0, 1.0)
    mask = np.zeros((s, s), dtype=np.float32)
    unit = np.zeros((s, s), dtype=np.float32)
    grain = np.zeros((s, s), dtype=np.float32)
    noise = rng.normal_numpy(key, "xray_marker", s * s, _normal_table()).reshape(s, s)
    # the plate's share of the coverage under the disc and the lead (its coverage is scaled
    # per film by ``plate_gain``: coverage and value are linear in it)
    plate = holder_a * (np.float32(1.0) - bead_a)
    grain += noise * bead_a
    _over(mask, unit, bead_a, 1.0)
    # the lead lets ``1 - level`` of the film through (thin lead at the tube's kV, plus the
    # patient's scatter under it), with a little of the film's noise of its own (LEAD_NOISE)
    lead_a = letter_a * np.float32(style.level)
    plate *= np.float32(1.0) - lead_a
    grain *= np.float32(1.0) - lead_a
    grain += np.float32(LEAD_NOISE) * noise * lead_a
    _over(mask, unit, lead_a, 1.0)
    # the unsharp mask's undershoot round the lead and disc: ``v - k (white - v) b`` where b is
    # how far the wide blur of the dense coverage exceeds it; written as coverage and value,
    # ``v (1 + k b) - k b white`` (a negative coverage: the film darkened, clipped at black)
    dense = np.maximum(letter_a, bead_a)
    wide = cv2.GaussianBlur(dense, (0, 0), max(0.5, halo_px))
    under = np.float32(halo_k) * np.clip(wide - dense, 0.0, None)
    mask -= under
    unit -= under
    return mask, unit, grain, plate, noise * plate


def _digital_marker(s: int, letter: str, style: MarkerStyle) -> tuple[np.ndarray, np.ndarray]:
    """The console's digital letter in its s x s square: flat, sharp (anti-aliased only), at
    the display's white (the console burns it in at the top of the range), optionally in a
    white ring on a dark disc."""
    ss = SUPERSAMPLE
    big = s * ss
    cap = (0.42 if style.ring else 0.6) * big
    ink = np.zeros((big, big), dtype=np.uint8)
    probe = np.zeros((big, big), dtype=np.uint8)
    size = max(4, round(cap / CAP_PER_SIZE))
    cv2.putText(probe, letter, (0, round(cap) + 2), 255, cv2.FontFace("uni"), size, 400)
    letter_w = int(np.flatnonzero(probe.any(axis=0))[-1]) + 1
    bold = max(1, round(0.05 * cap))
    _letter(ink, letter, cap, (big - letter_w) / 2, (big + cap) / 2, bold)
    mask = np.zeros((s, s), dtype=np.float32)
    paint = np.zeros((s, s), dtype=np.float32)
    if style.ring:
        disc = np.zeros((big, big), dtype=np.float32)
        ring = np.zeros((big, big), dtype=np.float32)
        r = round(0.46 * big)
        cv2.circle(disc, (big // 2, big // 2), r, 1.0, -1)
        cv2.circle(ring, (big // 2, big // 2), r, 1.0, max(1, round(0.05 * big)))
        _over(mask, paint, cv2.resize(disc, (s, s), interpolation=cv2.INTER_AREA), 0.02)
        _over(mask, paint, cv2.resize(ring, (s, s), interpolation=cv2.INTER_AREA), 1.0)
    glyph = cv2.resize(
        ink.astype(np.float32) / np.float32(255.0), (s, s), interpolation=cv2.INTER_AREA
    )
    _over(mask, paint, glyph, 1.0)
    return mask, paint


@dataclass(frozen=True)
class MarkerTile:
    """One film's marker before it is placed: its candidate spots (``marker_spots``), the
    planning square's side, the marker square's side ``s`` and its (coverage, value per unit
    white, value per unit noise) in the s x s square without the plate, and the plate's
    (coverage and value per unit white, value per unit noise), scaled per film by
    ``plate_gain``; ``lead``: the value scales with the film's white level and noise (else the
    digital letter's own value, ``unit``, and no plate)."""

    spots: list[Spot]
    big: int
    s: int
    mask: np.ndarray
    unit: np.ndarray
    grain: np.ndarray
    plate: np.ndarray
    plate_grain: np.ndarray
    lead: bool


def marker_tile(
    h: int,
    w: int,
    letter: str,
    size: float,
    right_corner: bool,
    scene: Any = None,
    style: MarkerStyle | None = None,
    key: int = 0,
) -> MarkerTile | None:
    """The marker of ``size`` px a film gets before the film's levels place and light it
    (None where no marker is added): a lead marker (``_lead_marker``) or the console's digital
    letter (``_digital_marker``, the default style: a flat white letter)."""
    letter_, spots, big, _ = marker_spots(h, w, letter, size, right_corner, scene)
    if letter_ is None:
        return None
    s = max(2, round(size))
    style = style or MarkerStyle()
    if style.lead:
        m, unit, grain, plate, plate_grain = _lead_marker(s, letter_, style, key, min(h, w))
    else:
        m, unit = _digital_marker(s, letter_, style)
        grain = plate = plate_grain = np.zeros_like(unit)
    return MarkerTile(spots, big, s, m, unit, grain, plate, plate_grain, style.lead)


PLATE_FULL = 102  # level (of 255) under the marker from which the plate shows in full
PLATE_LEAST = 0.2  # the plate's least share, on black air
PLATE_MOST = 3.0  # its most, over bright tissue (where the display nears its white)


def plate_gain(level_sum: int, s: int) -> float:
    """How much of the plate's coverage the display shows over a marker square of side ``s``
    whose film levels sum to ``level_sum`` (float64 from exact integers: the torch kernel's
    is the same). The acrylic removes a few % of the exposure: a fixed step of the log
    display over tissue and thin air, which the plate's blend towards white (coverage times
    the distance to white) gives at ``PLATE_FULL``; over brighter tissue the same step needs
    more coverage (``(255 - PLATE_FULL) / (255 - mean)``, at most ``PLATE_MOST``: near white
    the display's shoulder flattens it), and in the heavily exposed air the display's toe
    flattens it (the mean over ``PLATE_FULL``, at least ``PLATE_LEAST``). The reference films:
    about 4 levels over air at 22, 8 to 50 over tissue at 80 to 160."""
    if level_sum <= s * s * PLATE_FULL:
        return max(PLATE_LEAST, level_sum / (s * s * PLATE_FULL))
    below_white = 255 - level_sum / (s * s)
    return PLATE_MOST if below_white <= 0 else min(PLATE_MOST, (255 - PLATE_FULL) / below_white)


def marker_mask(
    h: int,
    w: int,
    letter: str,
    size: float,
    right_corner: bool,
    scene: Any = None,
    style: MarkerStyle | None = None,
    key: int = 0,
    film: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A laterality marker (``marker_tile``) placed by the film's levels (``choose_spot``)
    and, for a lead marker, lit by its white level and noise (``film_white``, ``film_noise``);
    without the film, the drawn top corner, white 1 and the faintest noise. Returns (coverage,
    premultiplied value) float32 (H, W) images, zeros where no marker is added."""
    mask = np.zeros((h, w), dtype=np.float32)
    paint = np.zeros((h, w), dtype=np.float32)
    tile = marker_tile(h, w, letter, size, right_corner, scene, style, key)
    if tile is None:
        return mask, paint
    _, _, x0, y0, _ = choose_spot(film, tile.spots, tile.big, tile.s)
    s = tile.s
    inside = (slice(y0, y0 + s), slice(x0, x0 + s))  # the marker never leaves its square
    if not tile.lead:
        mask[inside] = tile.mask
        paint[inside] = tile.unit
        return mask, paint
    white, sigma, gain = 1.0, FILM_NOISE[0], 1.0
    if film is not None:
        white, sigma = film_white(film), film_noise(film, (x0, y0, x0 + s, y0 + s))
        gain = plate_gain(int(film[inside].sum(dtype=np.int64)), s)
    k = np.float32(gain)
    mask[inside] = tile.mask + k * tile.plate
    unit = tile.unit + k * tile.plate
    grain = tile.grain + k * tile.plate_grain
    paint[inside] = np.float32(white) * unit + np.float32(sigma) * grain
    return mask, paint


def laterality_note(params: Mapping[str, Any], scene: Any, h: int, w: int) -> str | None:
    """Why a record's marker differs from its drawn letter and corner (``marker_plan``), or
    None: what the engine writes in the record (``extra["note"]``). The film's levels choose
    a square within the corner, never the letter or corner, so the note needs only the scene."""
    letter = "R" if float(params["letter_r"]) > 0.5 else "L"
    size = as_float32(params["size"]) * min(h, w)
    return marker_plan(h, w, letter, size, as_float32(params["right_corner"]) > 0.5, scene)[3]


# ops whose record says why their result differs from what their parameters alone would give,
# read from the film's scene: note(params, scene, h, w)
SCENE_NOTES = {"xray_laterality_marker": laterality_note}


def _marker_sampler(rng_: np.random.Generator, level: Level) -> Params:
    u = [float(rng_.random()) for _ in range(16)]
    # placed by hand: tilted a few degrees (never exactly upright), some further, some on their
    # side or upside down
    turn = 180.0 if u[11] < 0.08 else (90.0 if u[11] < 0.14 else 0.0)
    tilt = 2.0 + (13.0 * u[12] if u[13] < 0.7 else 13.0 + 20.0 * u[12])
    return {
        "size": level["size"][0] + u[0] * (level["size"][1] - level["size"][0]),
        "letter_r": float(u[1] < 0.5),
        "right_corner": float(u[2] < 0.5),
        "lead": float(u[3] < 0.85),  # most films carry a radiographed lead marker
        "angle": turn + math.copysign(tilt, u[4] - 0.5),
        "mirrored": float(u[5] < 0.2),  # placed face down
        # none, two or three initials (a lone initial beside the letter read as a glyph)
        "initials": 0.0 if u[6] < 0.3 else (2.0 if u[6] < 0.75 else 3.0),
        "density": 0.45 + 0.5 * u[7],  # the disc's, relative to the lead's
        "blur": 0.0007 + 0.0005 * u[8],  # 0.7-1.2 px on a 1024 px film
        # the plate on most: 2-18 % of the way from the film to its white, most below 6 %
        # (thin acrylic, faint on air; a few thick moulded plates stand out)
        "holder": (0.02 + 0.16 * (u[9] / 0.88) ** 2.5) if u[9] < 0.88 else 0.0,
        "ring": float(u[10] < 0.5),  # the console's letter (digital markers only) in a ring
        # the lead's share of the way from the film to its white: the primary nearly stopped,
        # the patient's scatter reaching the detector under it (reference films: about 0.9 over
        # air, 0.6-0.85 over tissue)
        "level": 0.75 + 0.22 * u[14],
        "layout": float(u[15] < 0.15),  # the initials beside the letter (most: under it)
    }


def _marker_args(h: int, w: int, p: Mapping[str, Any]) -> tuple[str, float, bool]:
    """The letter, size in px and corner a record's parameters give (as the kernel sees them)."""
    letter = "R" if as_float32(p["letter_r"]) > 0.5 else "L"
    return letter, as_float32(p["size"]) * min(h, w), as_float32(p["right_corner"]) > 0.5


MARKER_PARAMS = ("size", "letter_r", "right_corner", *MARKER_STYLE_PARAMS)


def _lower_medians(hist: torch.Tensor) -> torch.Tensor:
    """``_lower_median`` of each row of a (B, N) integer histogram (rows of total 0: bin 0)."""
    target = (hist.sum(dim=1, keepdim=True) - 1).div(2, rounding_mode="floor") + 1
    return (hist.cumsum(dim=1) >= target).to(torch.int32).argmax(dim=1)


def _film_whites(levels: torch.Tensor) -> torch.Tensor:
    """``film_white`` of each film of (B, H, W) integer levels, float64 (B,)."""
    b = levels.shape[0]
    offsets = 256 * torch.arange(b, device=levels.device, dtype=levels.dtype).view(-1, 1, 1)
    hist = torch.bincount((levels + offsets).reshape(-1), minlength=256 * b).view(b, 256)
    above = hist.flip(1).cumsum(dim=1)
    return (255 - (above >= WHITE_PIXELS).to(torch.int32).argmax(dim=1)).double() / 255.0


def _film_sigmas(levels: torch.Tensor, windows: torch.Tensor, span: int) -> torch.Tensor:
    """``film_noise`` of each film of (B, H, W) integer levels in its window (B, 4: x0, y0, x1,
    y1, ``noise_window``, at most ``span`` px a side), float64 (B,): the same integer
    histograms and medians, on (B, span, span) patches gathered at the windows."""
    b, h, w = levels.shape
    dev = levels.device
    step = torch.arange(span, device=dev).view(1, -1)
    ry, rx = windows[:, 1:2] + step, windows[:, 0:1] + step
    in_y, in_x = ry < windows[:, 3:4], rx < windows[:, 2:3]
    patch = levels[
        torch.arange(b, device=dev).view(-1, 1, 1),
        ry.clamp(max=h - 1).view(b, -1, 1),
        rx.clamp(max=w - 1).view(b, 1, -1),
    ].to(torch.int64)
    a, c = patch[:, :, 1:], patch[:, :, :-1]
    valid = (a > 0) & (a < 255) & (c > 0) & (c < 255)
    valid &= in_y.view(b, -1, 1) & in_x[:, 1:].view(b, 1, -1)  # both columns of a pair inside
    d = (a - c).reshape(b, -1)
    valid = valid.reshape(b, -1)
    bins = torch.where(valid, d + 255, torch.full_like(d, 511))  # bin 511: not counted
    hist = torch.zeros(b, 512, dtype=torch.int64, device=levels.device)
    hist.scatter_add_(1, bins, torch.ones_like(bins))
    hist = hist[:, :511]
    n = hist.sum(dim=1)
    med = _lower_medians(hist) - 255
    spread = (torch.arange(511, device=dev).view(1, -1) - 255 - med.view(-1, 1)).abs()
    mad_hist = torch.zeros(b, 511, dtype=torch.int64, device=dev)
    mad_hist.scatter_add_(1, spread, hist)
    mad = _lower_medians(mad_hist)
    abs_sum = (hist * (torch.arange(511, device=levels.device) - 255).abs().view(1, -1)).sum(1)
    by_mad = mad.double() * 1.4826 / math.sqrt(2.0) / 255.0
    by_mean = abs_sum.double() / n.clamp(min=1).double() * math.sqrt(math.pi) / 2.0 / 255.0
    sigma = torch.where(mad > 0, by_mad, by_mean).clamp(FILM_NOISE[0], FILM_NOISE[1])
    return torch.where(n < 16, torch.full_like(sigma, FILM_NOISE[0]), sigma)


def _place_markers(x: torch.Tensor, tiles: Sequence[MarkerTile | None]) -> torch.Tensor:
    """Blend each film's marker tile at its chosen spot, in one batched pass on x's device:
    the spot of lowest integer sum of levels (``choose_spot``, from the films' integral
    images), a lead marker lit by the film's white level and noise round it (``_film_whites``,
    ``_film_sigmas``), placed by a gather; bit for bit the CPU path's ``marker_mask``."""
    b, _, h, w = x.shape
    dev = x.device
    k = max([len(t.spots) for t in tiles if t is not None] + [1])
    side = max([t.s for t in tiles if t is not None] + [1])
    spots = np.zeros((b, k, 5), dtype=np.int64)
    valid = np.zeros((b, k), dtype=bool)
    sizes = np.zeros((b, 3), dtype=np.int64)  # big, s, lead
    layers = np.zeros((b, 5, side, side), dtype=np.float32)
    for i, t in enumerate(tiles):
        if t is None:
            continue
        spots[i, : len(t.spots)] = t.spots
        valid[i, : len(t.spots)] = True
        sizes[i] = (t.big, t.s, int(t.lead))
        layers[i, :, : t.s, : t.s] = np.stack([t.mask, t.unit, t.grain, t.plate, t.plate_grain])
    spots_d = torch.from_numpy(spots).to(dev)
    valid_d = torch.from_numpy(valid).to(dev)
    sizes_d = torch.from_numpy(sizes).to(dev)
    layers_d = torch.from_numpy(layers).to(dev).view(b, 5, side * side)
    # exact integer sums: int32 while a film's total level fits, else int64
    wide = torch.int32 if 255 * h * w < 2**31 else torch.int64
    levels = torch.round(x[:, 0].to(torch.float32).clamp(0.0, 1.0) * 255.0).to(wide)
    reach = int((spots[..., 1] + sizes[:, 0:1]).max())  # the rows any planning square covers
    integral = levels[:, :reach].cumsum(dim=1, dtype=wide).cumsum(dim=2, dtype=wide)
    integral = F.pad(integral, (1, 0, 1, 0)).view(b, -1)
    big = sizes_d[:, 0:1]
    bx, by = spots_d[..., 0], spots_d[..., 1]

    def at(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        return integral.gather(1, yy * (w + 1) + xx)

    sums = at(by + big, bx + big) - at(by, bx + big) - at(by + big, bx) + at(by, bx)
    # ``exposed``: the horizontal neighbour differences within each square, from their own
    # integral image (pair j: columns j and j + 1; a square's pairs bx .. bx + big - 2)
    rough = (levels[:, :reach, 1:] - levels[:, :reach, :-1]).abs()
    rough_int = rough.cumsum(dim=1, dtype=wide).cumsum(dim=2, dtype=wide)
    rough_int = F.pad(rough_int, (1, 0, 1, 0)).view(b, -1)

    def at_r(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        return rough_int.gather(1, yy * w + xx)

    end = (bx + big - 1).clamp(min=0)  # (a film without a marker: big 0, no spots)
    roughs = at_r(by + big, end) - at_r(by, end) - at_r(by + big, bx) + at_r(by, bx)
    # ``choose_spot``: the exposed air squares (``is_air``, ``exposed``) ranked by level sum;
    # with none, the spot nearest the drawn corner, just inside the film's edge
    num, den = AIR_OF_MEAN
    film_sum = levels.sum(dim=(1, 2), dtype=torch.int64)
    sums64 = sums.to(torch.int64)
    is_air_ = den * sums64 * (h * w) <= num * film_sum.view(-1, 1) * big * big
    is_air_ &= FLAT_OF * roughs.to(torch.int64) >= big * (big - 1)
    order = torch.arange(sums64.shape[1], device=dev).view(1, -1)  # with no air: the first spot
    ranks = torch.where(is_air_, sums64, order + NEVER)
    ranks = ranks.masked_fill(~valid_d, 1 << 62)
    best = ranks.argmin(dim=1)
    air = ranks.gather(1, best.view(-1, 1))[:, 0] < NEVER
    chosen = spots_d.gather(1, best.view(-1, 1, 1).expand(-1, 1, 5))[:, 0]
    x0, y0, s = chosen[:, 2], chosen[:, 3], sizes_d[:, 1]
    # ``at_edge``: pushed out to just inside the film's edge where there is no air
    margin, e = round(0.03 * min(h, w)), round(EDGE * min(h, w))
    edge_x = torch.where(x0 == w - margin - s, w - s - e, torch.where(x0 == margin, e, x0))
    edge_y = torch.where(y0 == margin, e, torch.where(y0 == h - margin - s, h - s - e, y0))
    x0, y0 = torch.where(air, x0, edge_x), torch.where(air, y0, edge_y)
    windows = torch.stack(
        [
            (x0 - s).clamp(min=0),
            (y0 - s).clamp(min=0),
            (x0 + 2 * s).clamp(max=w),
            (y0 + 2 * s).clamp(max=h),
        ],
        dim=1,
    )
    lead = sizes_d[:, 2] > 0
    white = torch.where(lead, _film_whites(levels), 1.0).to(torch.float32).view(-1, 1, 1)
    sigma = (
        torch.where(lead, _film_sigmas(levels, windows, 3 * side), 0.0)
        .to(torch.float32)
        .view(-1, 1, 1)
    )
    # the tiles' pixels of the films, blended and written back (padding to a dummy pixel)
    step = torch.arange(side, device=dev).view(1, -1)
    ry, rx = (y0.view(-1, 1) + step).clamp(max=h - 1), (x0.view(-1, 1) + step).clamp(max=w - 1)
    in_tile = step < s.view(-1, 1)
    index = ry.view(b, -1, 1) * w + rx.view(b, 1, -1)
    index = torch.where(in_tile.view(b, -1, 1) & in_tile.view(b, 1, -1), index, h * w)
    c = x.shape[1]
    # ``plate_gain``: the film's levels summed over the marker's square (exact integers)
    flat = index.view(b, -1)
    under_sum = (
        levels.view(b, h * w)
        .to(torch.int64)
        .gather(1, flat.clamp(max=h * w - 1))
        .masked_fill(flat >= h * w, 0)
        .sum(dim=1)
    )
    dark = (under_sum.double() / (s * s * PLATE_FULL).double()).clamp(min=PLATE_LEAST)
    bright = (255 - PLATE_FULL) / (255 - under_sum.double() / (s * s).double())
    gain = torch.where(under_sum <= s * s * PLATE_FULL, dark, bright.clamp(max=PLATE_MOST))
    gain = torch.where(lead, gain, 1.0).to(torch.float32).view(-1, 1, 1)
    index = index.view(b, 1, -1).expand(-1, c, -1)
    films = x.reshape(b, c, h * w)
    under = films.gather(2, index.clamp(max=h * w - 1))
    plate = gain * layers_d[:, 3:4]
    m = layers_d[:, 0:1] + plate
    unit = layers_d[:, 1:2] + plate
    grain = layers_d[:, 2:3] + gain * layers_d[:, 4:5]
    paint = white * unit + sigma * grain
    blended = (under * (1.0 - m) + paint).clamp_(0.0, 1.0).to(x.dtype)
    out = torch.cat([films, films.new_zeros(b, c, 1)], dim=2)
    out.scatter_(2, index, blended)
    return out[:, :, : h * w].reshape(b, c, h, w).contiguous()


@register_kernel(
    "xray_laterality_marker", sampler=_marker_sampler, host_params=True, uses_scene=True
)
def xray_laterality_marker(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    host_params: Sequence[Mapping[str, Any]] | None = None,
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """A laterality marker where technologists put it: in the unattenuated air beside the
    body or above the shoulder, near a top corner, along the top edge (never over the neck,
    spine or mediastinum) or down the outer edge (``marker_spots``): the darkest of those
    squares that is real exposure (the film's quantum noise, not flat padding: ``choose_spot``).
    Most are lead markers radiographed with the patient (``_lead_marker``: chunky lead L/R
    letters on an acrylic plate (on most; a fixed step of the log display over tissue,
    flattened by its toe on black air: ``plate_gain``), sometimes with a metal disc in its
    grip, with the technologist's initials or a number in one row, at a keyed tilt, sometimes
    on its side or upside down, the whole marker mirrored when face down; the lead stops
    almost all of the primary beam, so letter and initials lie most of the way from the film
    to its white, the patient's scatter under them (with its own noise), their edges blurred
    by the focal spot's geometric unsharpness and the detector's MTF by about a pixel, the
    display's unsharp mask leaving a faint dark halo round them, the plastic carrying the
    film's own noise); the rest are the console's flat digital letter at display white, often
    ringed. With no exposed air where it may go the marker goes to the spot nearest the drawn
    corner, just inside the film's edge (``choose_spot``). The
    letter is keyed and need not match the anatomy (a wrong or misplaced marker is the failure
    mode it probes), but it never contradicts a marker already on the film, is never a
    duplicate beside it (``APART``) and keeps clear of its annotations.

    Kornia: own kernel: the marker tiles are rendered on the host (identical on every device)
    from the records' parameters on the host (``host_params``) and the scenes, uploaded once;
    the spot, white level and noise are read from the films on the device and the tiles
    placed and blended in one batched pass (``_place_markers``: no read back; the CPU path's
    pixels bit for bit); Kornia has no text rendering."""
    h, w = x.shape[-2:]
    given = list(scenes) if scenes is not None else [None] * len(keys)
    rows = _host_rows(p, host_params, MARKER_PARAMS)
    tiles = []
    for k, row, sc in zip(keys, rows, given, strict=True):
        params = dict(zip(MARKER_PARAMS, row, strict=True))
        tiles.append(
            marker_tile(h, w, *_marker_args(h, w, params), sc, MarkerStyle.of(params), int(k))
        )
    return _place_markers(x, tiles)


@backend.register_cpu("xray_laterality_marker", dtypes=ALL_DTYPES, uses_scene=True)
def xray_laterality_marker_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    film = film_levels(_load(src[0]))
    style = MarkerStyle.of(p)
    mask, paint = marker_mask(h, w, *_marker_args(h, w, p), scene, style, key, film)
    _blend_np(src, dst, mask, paint, _quadrant_boxes(mask))


SHUTTER_NOISE = (0.004, 0.03)  # bounds of the film's own noise sigma (display values)


def _film_noise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,1,1,1) each the film's own noise sigma and the display level it was measured at: the
    robust spread (1.4826 x median absolute deviation, scaled for the 3x3 mean's own share) of
    the first channel minus its 3x3 local mean, and the median level, over the film's exposed
    half (levels at or below its median: lungs, soft tissue, where the display's slope shows
    the noise) but for pixels whose 3x3 neighbourhood is flat (clipped white or black, digital
    padding: no noise to measure there); the sigma clamped to ``SHUTTER_NOISE``. What the
    shutter region's quantum noise is sized on."""
    v = x[:, :1].double()
    padded = F.pad(v, (1, 1, 1, 1), mode="replicate")
    local = F.avg_pool2d(padded, 3, stride=1)
    flat = F.max_pool2d(padded, 3, stride=1) <= -F.max_pool2d(-padded, 3, stride=1)
    mid = v.flatten(1).median(dim=1).values.view(-1, 1, 1, 1)
    skip = (flat | (v > mid)).flatten(1)
    dev = (v - local).abs().flatten(1).masked_fill(skip, float("nan"))
    spread = dev.nanmedian(dim=1).values.nan_to_num(0.0) * (1.4826 * 9.0 / 8.0)
    level = v.flatten(1).masked_fill(skip, float("nan")).nanmedian(dim=1).values
    level = torch.where(level.isnan(), mid.view(-1), level)
    return spread.clamp(*SHUTTER_NOISE).view(-1, 1, 1, 1), level.view(-1, 1, 1, 1)


def _smooth(v: torch.Tensor, sigma_px: torch.Tensor) -> torch.Tensor:
    """Gaussian-like low-pass of a (B,1,H,W) float64 batch with a sigma (pixels, (B,1,1,1)) per
    sample: three box pass pairs (``blur.box_radii``), O(1) per pixel whatever the sigma,
    reflected borders, each sample's windows read at its own radius (no batch dependence)."""
    h, w = v.shape[-2:]
    rx, ry = blur.box_radii(sigma_px, max(2, w)), blur.box_radii(sigma_px, max(2, h))
    if h < 2 or w < 2:
        return v
    for _ in range(3):
        v = blur._box_batch(blur._box_batch(v, rx, -1), ry, -2)
    return v


def _shoulder(y: torch.Tensor, knee: float, top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The display LUT's shoulder: identity below ``knee``, above it an exponential roll-off
    towards ``top`` (C1 at the knee); the values and the slope (what the noise is scaled by)."""
    span = (top - knee).clamp_min(1e-3)
    over = (y - knee).clamp_min(0.0)
    roll = torch.exp(-over / span)
    return torch.where(y > knee, knee + span * (1.0 - roll), y), torch.where(y > knee, roll, 1.0)


SHOULDER_KNEE = 0.75  # display value where the LUT's shoulder starts rolling off


BLADES = ("left", "right", "top", "bottom")


def _blade_distances(
    h: int, w: int, col: Callable[[str], torch.Tensor], dev: torch.device
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The signed distances (px, positive under the blade) past each blade edge: the four
    blades (left, right, top, bottom; a blade at 0 is open: a film's width outside), each
    tilted about the film's centre by ``tilt`` plus its own ``skew_<side>`` (the leaves of a
    collimator are never exactly parallel nor square to each other), and, where ``leaf`` is
    1, a fifth edge on the side ``leaf_side`` (0-3) at ``leaf_depth`` of that side, tilted
    ``leaf_angle`` degrees further (a second blade edge overlapping the first at a different
    angle); and each pixel's distance from the centre over the half diagonal."""
    ys = torch.arange(h, dtype=torch.float64, device=dev).view(1, 1, h, 1) + 0.5 - h / 2
    xs = torch.arange(w, dtype=torch.float64, device=dev).view(1, 1, 1, w) + 0.5 - w / 2
    far = float(2 * max(h, w))

    def rotated(deg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        theta = torch.deg2rad(deg)
        cos, sin = torch.cos(theta), torch.sin(theta)
        return xs * cos + ys * sin + w / 2, -xs * sin + ys * cos + h / 2

    def edge(frac: torch.Tensor, deg: torch.Tensor, i: int) -> torch.Tensor:
        u, t = rotated(deg)
        size, coord = (w, u) if i < 2 else (h, t)
        at = (1.0 - frac) * size if i % 2 else frac * size
        dist = coord - at if i % 2 else at - coord
        return torch.where(frac > 0.0, dist, torch.full_like(dist, -far))

    tilt = col("tilt")
    dists = [edge(col(n), tilt + col(f"skew_{n}"), i) for i, n in enumerate(BLADES)]
    side = col("leaf_side").round().clamp(0.0, 3.0)
    leaf = torch.full_like(dists[0], -far)
    for i, n in enumerate(BLADES):
        frac = torch.where((col("leaf") > 0.5) & (side == i), col("leaf_depth"), 0.0)
        leaf = torch.maximum(leaf, edge(frac, tilt + col(f"skew_{n}") + col("leaf_angle"), i))
    off_centre = torch.sqrt(xs**2 + ys**2) / (0.5 * math.hypot(h, w))
    return [*dists, leaf], off_centre


def _blade_stop(
    h: int, w: int, col: Callable[[str], torch.Tensor], dev: torch.device,
    keys: Sequence[int] | None = None, inset: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B,1,H,W) float64: the share of the beam the blades stop. Each blade edge stops its own
    share behind its penumbra (``penumbra`` of the shorter side at the centre, widened by
    ``spread`` x the distance off centre; smoothstep), a ``tail`` of it behind a penumbra
    ``TAIL_WIDTH`` times as wide (the tube's off-focal radiation). With ``corner`` 0 the
    blades' transmissions multiply: a corner is the square crossing of two independent tilted
    edges; with ``corner`` > 0 (of the shorter side) the field is the rounded intersection of
    the edges' half planes (``_round_field``): the corner an arc of that radius behind the same
    penumbra (the focal spot's blur of the crossing seen at display size). On a scanned film's
    edge (``white`` 0) the edge is the film's cut edge: a ``scan_blur`` px scanner blur and a
    keyed waviness of ``wobble`` px (``keys`` given). ``inset`` (px, per sample) moves every
    edge that far into the field."""
    side = min(h, w)
    dists, off_centre = _blade_distances(h, w, col, dev)
    scanned = col("white") < 0.5
    pen = (col("penumbra") * side * (1.0 + col("spread") * off_centre)).clamp_min(1.0)
    pen = torch.where(scanned, col("scan_blur").clamp_min(0.5) + 0.0 * pen, pen)
    tail = torch.where(scanned, 0.0, col("tail"))
    shift = torch.zeros_like(off_centre) if inset is None else inset
    if keys is not None:
        wavy = _lumps(keys, h, w, dev, torch.full_like(col("wobble"), 0.04 * side), "edge")
        shift = shift + torch.where(scanned, col("wobble"), 0.0) * wavy

    def stopped(e: torch.Tensor) -> torch.Tensor:
        r = (0.5 + e / pen).clamp(0.0, 1.0)
        q = (0.5 + e / (TAIL_WIDTH * pen)).clamp(0.0, 1.0)
        return (1.0 - tail) * (r * r * (3.0 - 2.0 * r)) + tail * (q * q * (3.0 - 2.0 * q))

    passed = torch.ones_like(dists[0] + shift)
    for d in dists:
        passed = passed * (1.0 - stopped(d + shift))
    radius = col("corner") * side
    rounded = stopped(_round_field([d + shift for d in dists], radius))
    return torch.where(radius > 0.0, rounded, 1.0 - passed)


def _round_field(dists: list[torch.Tensor], radius: torch.Tensor) -> torch.Tensor:
    """The signed distance (px, positive outside) of the field, the intersection of the half
    planes ``d <= 0`` of ``dists``, with every corner rounded to an arc of ``radius`` px (per
    sample): each pair of edges joined by the arc tangent to both, the straight edges away
    from the corners as they were."""
    out = dists[0]
    for d in dists[1:]:
        a = (radius + out).clamp_min(0.0)
        b = (radius + d).clamp_min(0.0)
        out = torch.minimum(-radius, torch.maximum(out, d)) + torch.sqrt(a * a + b * b)
    return out


TAIL_WIDTH = 4.0  # the off-focal halo's penumbra over the focal spot's
FAR_REACH = 0.2  # fraction of the shorter side: the long-range scatter's low-pass sigma
TOE = 0.04  # display level below which the display's toe halves a dark rebound
QUANTUM_GAIN = 8.0  # the most the shadow's noise grows over the film's (before the shoulder)
WIDE = 4.0  # the scatter's broad low-pass under a blade, in units of its reach


def collimation_shadow(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B,1,H,W) float32 on ``x``'s device: where the collimation leaves the detector unexposed
    (the blades' share of the beam), or, on a scanned film, beyond the film's edge: a lead
    marker lying there could not have been imaged (the engine's annotation composite reads
    it)."""
    h, w = x.shape[-2:]
    dev = x.device

    def col(name: str) -> torch.Tensor:
        return per_sample(p[name]).to(dev, torch.float64)

    m = _blade_stop(h, w, col, dev)
    return m.expand(x.shape[0], 1, h, w).float()


def _each_std(v: torch.Tensor) -> torch.Tensor:
    """(B,1,1,1): each sample's standard deviation, reduced one sample at a time (a reduction
    over the last dims of a whole batch rounds differently from one sample's: the result would
    depend on the batch)."""
    return torch.stack([s.std() for s in v]).view(-1, 1, 1, 1)


def _each_mean(v: torch.Tensor) -> torch.Tensor:
    """(B,1,1,1): each sample's mean, one sample at a time (as ``_each_std``)."""
    return torch.stack([s.mean() for s in v]).view(-1, 1, 1, 1)


AIR_SHARE = 0.005  # the share of the film's exposed pixels at or below its open beam's level
DENSE_SHARE = 0.98  # the film's light end: the share of its pixels at or below it
DENSE_LIFT = 0.03  # how far above the film's light end the shutter's floor shows at least
LEAD_WHITE = (0.97, 0.99)  # display levels over which a film's pixel reads as lead (white)


def _film_quantiles(
    low: torch.Tensor, keep: torch.Tensor, shares: Sequence[float]
) -> list[torch.Tensor]:
    """(B,1,1,1) each: every film's ``share`` quantile of its low-pass outside the digital
    padding (the whole film where all of it is padding), the k-th smallest of its n values with
    k = max(1, floor(share n)); one sort of the batch serves every share (exact: batch-independent)."""
    use = keep > 0.5
    use = use | ~use.flatten(1).any(dim=1).view(-1, 1, 1, 1)
    ordered = torch.where(use, low, torch.inf).flatten(1).sort(dim=1).values
    count = use.flatten(1).sum(dim=1, keepdim=True).double()
    return [
        ordered.gather(1, (count * share).floor().clamp_min(1).long() - 1).view(-1, 1, 1, 1)
        for share in shares
    ]


def _lumps(
    keys: Sequence[int], h: int, w: int, dev: torch.device, sigma: torch.Tensor, variant: str = ""
) -> torch.Tensor:
    """(B,1,H,W) float64: a keyed smooth field of unit spread (white noise low-passed over
    ``sigma`` px, divided by its own standard deviation)."""
    name = "xray_collimation/lumps" + (f"/{variant}" if variant else "")
    z = keyed_fields.normal_fields(keys, name, (h, w), dev).unsqueeze(1).double()
    s = _smooth(z, sigma)
    return s / _each_std(s).clamp_min(1e-12)


def collimation(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """The collimated film (B,C,H,W) float32, on ``x``'s device; the CPU path calls it too (one
    sample), so both give the same pixels. Three stages, as in the imaging chain:

    1. Geometry (``_blade_stop``). Up to four straight lead blades (``left`` ... fractions of
       the width/height; 0: that blade open), each tilted on its own about the film's centre,
       and on some films a second blade edge overlapping one of them at a different angle.
       Each stops its share of the beam behind its focal-spot penumbra (focal spot x
       (magnification - 1), smoothstep), ``penumbra`` of the shorter side at the centre,
       widening by ``spread`` x the distance off the central ray, plus a ``tail`` behind a
       four times wider penumbra (off-focal radiation); the shares multiply, so corners are
       square crossings of tilted edges, or (``corner`` > 0) the field's corner is rounded
       to an arc behind the same penumbra (the focal spot's blur of the crossing as it shows
       at display size).
    2. Exposure. The film's low-pass (its anatomy; sigma 1 px) maps to a log exposure,
       E = exp(-``range`` v). Under the blade a fraction ``transmission`` (well under 1 %) of the beam
       gets through, plus scatter from the irradiated body beside it: ``scatter`` x the field's
       exposure low-passed over ``reach`` of the shorter side (its source the body, E x mu t:
       the primary times a scatter-to-primary ratio growing with the e-folds of attenuation
       counted from the film's open-beam level, its darkest exposed level, so none from the air
       however far above black the film shows it), strongest at the edge and falling off away
       from the field, and the long-range scatter and off-focal floor (at the display level
       ``deep``, but never below the film's own light end, ``DENSE_SHARE`` quantile, plus
       ``DENSE_LIFT``: the system's LUT is set from the field's histogram, the shutter left
       out, so the shutter, exposed less than any part of the body, shows lighter than the
       densest anatomy beside it), and the tube's
       off-focal halo (``halo`` of the beam beside the field, over ``halo_reach``; it crosses
       the body like the primary beam, so the body attenuates it: the anatomy faintly shows
       in it next to the edge); all uneven with the anode heel effect (``heel`` e-folds over
       the half side along ``heel_dir``) and the beam's unevenness (``lumps``: broad, and
       along the band at a fortieth of the side; ``streak``: over a sixteenth of the side).
       The scatter under a blade is part of what the body sends everywhere, so the shadow is
       never darker than the film it covers (a soft cap at the film's exposure low-passed
       over ``WIDE`` times ``reach``, its detail at the ``reach`` scale kept at ``trace`` of
       its contrast: no bar darker than the soft tissue beside it, no marker or wire showing
       through, ribs and clavicle only a faint blurred trace). The film's digital
       padding under a blade is filled with the film beside it. Back through the log and
       the display LUT's shoulder (``_shoulder``, towards ``shade``): the unexposed border is
       light, brightening outwards as the scatter falls off, the anatomy attenuated but
       faintly there (not pressed below the film's level low-passed the same way as the
       cap). Its noise is that of its dose: the film's own fine texture (its
       residual above the 1 px low-pass, its fine anatomy edges faded) carries on at
       ``texture`` times its amplitude, and a keyed grain (white noise through a binomial
       [1 2 1] / 4 filter each way) brings the total to the film's own noise sigma (measured
       at its median exposed level) times the dose's gain: sqrt(F (1 + ``readout`` F) /
       (1 + ``readout``)), F = exp(``range`` (lin - level)) the exposure ratio (quantum
       variance ~ 1 / E, the detector's readout and structure noise ~ 1 / E^2), at most
       ``QUANTUM_GAIN``, times the shoulder's slope, and at least ``band_noise`` (the real
       bands' grain, whatever the field's: a dose-starved region the DR's noise reduction and
       resampling did not smooth like the field). A blade only takes exposure away: a lead
       marker on the detector, at the display's white on the film (``LEAD_WHITE``), stays
       white under the shadow, carrying on into the band instead of being cut by it.
    3. Display processing. The system's edge enhancement acts on the new step like on any
       edge (the film's anatomy was processed already, so only the shutter's share of each
       band-pass is added): an unsharp mask (gain ``enhance``, sigma ``radius`` of the shorter
       side: a bright overshoot along the blade's side of the edge, a dark rebound just inside
       the field) and the wide-band equalisation (gain ``equalize``, sigma ``band``). A
       rebound over the film's darkest parts shrinks with their level (the display's toe,
       ``TOE``), so dark air beside the edge keeps its texture instead of clipping flat; the
       field's own anatomy and noise are not touched.
    ``white`` 0: a scanned film's edge instead (no collimation shadow): beyond the film's cut
    edge, slightly wavy (``wobble`` px) and blurred by the scanner's optics (``scan_blur``
    px), the scanner's backing beyond (``black``, a few levels above 0, uneven, with a faint
    scanner noise), and along the edge a thin rim lighter than the film beside it (``rim`` of
    the shorter side wide, at ``rim_level``, both varying along the edge: the unexposed film
    margin and the light the cut edge scatters into the scanner). The film's own digital padding (``_padding``) is kept where no shadow reaches it;
    a blade's shadow over it fills it (a padded strip inside a collimated border would be the
    digitiser padding a film it had cropped)."""
    h, w = x.shape[-2:]
    dev = x.device
    side = min(h, w)

    def col(name: str) -> torch.Tensor:
        return per_sample(p[name]).to(dev, torch.float64)

    m = _blade_stop(h, w, col, dev, keys)
    white = col("white") > 0.5
    v = x.double()
    v1 = v[:, :1]
    low = _smooth(v1, torch.full_like(col("range"), 1.0))
    detail = v1 - low
    sigma, level = _film_noise(x)
    # the grain: keyed white noise through a [1 2 1] / 4 binomial filter each way (correlated
    # over about 0.7 px, as a film's quantum noise after the detector's and the resampling's
    # blur), of unit spread
    z = keyed_fields.normal_fields(keys, "xray_collimation", (h, w), dev).unsqueeze(1).double()
    tap = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64, device=dev)
    z = F.conv2d(F.pad(z, (1, 1, 0, 0), mode="replicate"), tap.view(1, 1, 1, 3))
    z = F.conv2d(F.pad(z, (0, 0, 1, 1), mode="replicate"), tap.view(1, 1, 3, 1))
    grain = z / _each_std(z).clamp_min(1e-12)
    span = col("range")
    # the film's digital padding was never exposed: under a blade it is filled with the film
    # around it (its 0 would read as air the blade's transmission shows)
    pad = _padding(v1)
    near = F.max_pool2d(pad, 5, stride=1, padding=2)  # with the low-pass's reach past its edge
    keep = 1.0 - near
    fill = _smooth(low * keep, torch.full_like(span, 0.01 * side))
    fill = fill / _smooth(keep, torch.full_like(span, 0.01 * side)).clamp_min(1e-9)
    low = low + near * (fill - low)
    exposure = torch.exp(-span * low.clamp(0.0, 1.0))
    reach = (col("reach") * side).clamp_min(1.0)
    # the scatter's source: the primary beam in the field times the share the body scatters,
    # which grows with its thickness (the scatter-to-primary ratio ~ mu t, the e-folds of
    # attenuation counted from the film's unattenuated beam, its darkest exposed level: the
    # display maps the open beam near black, so the air beside the body scatters nothing
    # however far above 0 the film shows it)
    air, dense = _film_quantiles(low, keep, (AIR_SHARE, DENSE_SHARE))
    tau = (span * (low - air)).clamp_min(0.0)
    source = (1.0 - m) * exposure * tau
    scatter = col("scatter") * _smooth(source, reach)
    far = _smooth(source, torch.full_like(reach, FAR_REACH * side))
    far = far / _each_mean(far).clamp_min(1e-6)
    # the floor's display level: ``deep``, but never below the film's own light end (its
    # ``DENSE_SHARE`` quantile) plus ``DENSE_LIFT``: the system sets its LUT from the field's
    # histogram (the shutter left out), so the shutter's exposure, below the least any part of
    # the body let through, shows lighter than the densest anatomy beside it (the real bands
    # stand 130-190 levels of 255 above the field next to them)
    deep = torch.maximum(col("deep"), dense + DENSE_LIFT)
    floor = torch.exp(-span * deep) * far.clamp(0.25, 4.0)
    ys = torch.arange(h, dtype=torch.float64, device=dev).view(1, 1, h, 1) + 0.5 - h / 2
    xs = torch.arange(w, dtype=torch.float64, device=dev).view(1, 1, 1, w) + 0.5 - w / 2
    phi = torch.deg2rad(col("heel_dir"))
    ramp = (xs * torch.cos(phi) + ys * torch.sin(phi)) / (0.5 * side)
    # the beam's unevenness at two scales: broad (a tenth of the side) and along the band
    # (a fortieth: the scatter of the body beside it varies from rib to rib)
    lumps = _lumps(keys, h, w, dev, torch.full_like(col("lumps"), 0.1 * side))
    lumps = lumps + 0.4 * _lumps(keys, h, w, dev, torch.full_like(col("lumps"), 0.025 * side), "fine")
    uneven = torch.exp(col("heel") * ramp + col("lumps") * lumps)
    # the off-focal radiation's halo: the beam itself (not the body's scatter) reaching under
    # the blade, falling off away from the field over ``halo_reach``, next to air as next to
    # the body; it crosses the body like the primary beam, so the body attenuates it (blurred
    # by the off-focal source's size)
    halo_px = (col("halo_reach") * side).clamp_min(1.0)
    # (blurred by the off-focal source's size: over the halo's own reach, so ribs and clavicle
    # do not show through it, only the body's broad shape)
    halo = col("halo") * _smooth(1.0 - m, halo_px) * _smooth(exposure, halo_px)
    # along the band the beam is uneven on a third scale: the blade's own edge region (its
    # bevel, the collimator's mirror and the off-focal source seen past it) lets a little more
    # or less through over about a sixteenth of the side (a few shades within any crop of
    # the band); ``streak`` e-folds
    streak = _lumps(keys, h, w, dev, torch.full_like(col("lumps"), 0.06 * side), "streak")
    uneven = uneven * torch.exp(col("streak") * streak)
    behind = (col("transmission") * exposure + scatter + halo + floor) * uneven
    # the scatter under a blade is part of what the body beside it sends everywhere: the film
    # there, had it been exposed, would have had at least as much; the shadow is never darker
    # than the film it covers (a soft cap at its exposure, low-passed over the scatter's
    # reach: a small dense object there, a marker or a wire, does not show through). Scatter
    # carries the anatomy only as a blurred, low-contrast trace: the cap and the floor below
    # follow the film low-passed over ``WIDE`` times the reach, its detail at the reach's
    # scale kept at ``trace`` of its contrast (ribs and clavicle faint, not the film's own)
    wide = reach * WIDE
    broad = _smooth(exposure, wide)
    cover = broad * (_smooth(exposure, reach) / broad.clamp_min(1e-12)) ** col("trace")
    behind = behind / (1.0 + (behind / cover) ** 4) ** 0.25
    shadowed = torch.maximum(exposure * (1.0 - m) + m * behind, exposure * 1e-4)
    lin = low - torch.log(shadowed / exposure) / span  # the log display, anatomy shifted
    lut, slope = _shoulder(lin, SHOULDER_KNEE, col("shade"))
    base = lin + m * (lut - lin)  # the shoulder acts on the shadow's share
    # the film as shown is already past the shoulder: the shadow over a light film is not
    # pressed below it (its level low-passed over ``reach``, like the cap above)
    low_wide = _smooth(low, wide)
    trace = low_wide + col("trace") * (_smooth(low, reach) - low_wide)
    base = base + m * (trace - base).clamp_min(0.0)
    for gain, scale, least in (("enhance", "radius", 0.5), ("equalize", "band", 1.0)):
        s = (col(scale) * side).clamp_min(least)
        step = col(gain) * ((base - _smooth(base, s)) - (1.0 - m) * (low - _smooth(low, s)))
        # the display's toe: a dark rebound over the film's darkest parts (air) shrinks with
        # their level, as a log display's toe compresses them, instead of clipping them flat
        dim = base.clamp_min(0.0) ** 2
        base = base + torch.where(step < 0.0, step * dim / (dim + TOE**2), step)
    # under the shadow the film's texture is its noise: its fine anatomy edges (residuals of
    # several sigmas: bone cortex, wires, burned-in glyphs) fade like the rest of the anatomy
    # (and the padding's step is no texture)
    soft = detail * torch.exp(-0.5 * (detail / (2.5 * sigma)) ** 2)
    soft = soft * keep
    # the shadow's own noise at its dose: the fewer quanta, the larger their relative spread
    # (variance ~ 1 / E in the log display), and the detector's readout and structure noise,
    # a small share of the film's noise at its exposure, grows as 1 / E^2 (``readout``: its
    # variance over the quantum noise's at the film's exposure). From the film's own sigma at
    # its median exposed level (``_film_noise``) the dose falls to exp(-range (lin - level))
    # under the blade; the shoulder's slope flattens the result. What the film's texture
    # (continued at ``texture``) does not already carry, a keyed grain adds (at least half
    # the film's sigma)
    fewer = torch.exp(span * (lin - level)).clamp(1.0, QUANTUM_GAIN**2)
    dose = torch.sqrt(fewer * (1.0 + col("readout") * fewer) / (1.0 + col("readout")))
    dose = dose.clamp_max(QUANTUM_GAIN) * slope
    quantum = sigma * torch.sqrt((dose * dose - col("texture") ** 2).clamp_min(0.25))
    # the shutter region is dose-starved whatever the film's own noise: on the real bands it
    # stays grainy (the NIH bands' high-pass sigma 1.8-2.8 levels of 255 beside fields of 0-1.8,
    # the DR's noise reduction and resampling having smoothed the field, not the band's few
    # quanta): the grain at least ``band_noise`` (keyed; display units, its spread before the
    # high-pass)
    quantum = torch.maximum(quantum, col("band_noise"))
    texture = detail + m * (col("texture") * soft - detail + quantum * grain)
    shot = base + texture
    # a blade only takes exposure away: a lead marker on the detector, at the display's white
    # (``LEAD_WHITE`` and above) on the film, stays there under the shadow (the band cuts no
    # marker in half: it carries on into it); lighter anatomy than that is left to the cap's
    # blurred trace above (no ribs at their own contrast through the band)
    lead = ((v1 - LEAD_WHITE[0]) / (LEAD_WHITE[1] - LEAD_WHITE[0])).clamp(0.0, 1.0)
    shot = shot + m * lead * (torch.maximum(shot, v1) - shot)
    # a scanned film's edge: the film as it is, a thin bright rim inside its cut edge, the
    # scanner's black beyond
    # the rim's width and brightness vary along it (the margin's fog, the cut's angle), the
    # scanner's backing beyond is a few levels above 0, uneven and noisy
    along = torch.full_like(col("rim"), 0.03 * side)
    rim_px = (col("rim") * side * (1.0 + 0.4 * _lumps(keys, h, w, dev, along, "rim")).clamp(0.3, 2.0))
    inner = _blade_stop(h, w, col, dev, keys, inset=rim_px.clamp_min(0.5))
    rim = (inner - m).clamp(0.0, 1.0)
    rim_level = col("rim_level") * (1.0 + 0.06 * _lumps(keys, h, w, dev, along, "rim_level"))
    backing = _lumps(keys, h, w, dev, torch.full_like(col("black"), 0.08 * side), "backing")
    surround = col("black") * (1.0 + 0.3 * backing) + (0.25 * sigma + 0.004) * grain
    # the unexposed margin is lighter than the film beside it, however light the film is
    rim_level = torch.maximum(rim_level, (low + 0.06).clamp_max(1.0))
    scan = v1 + rim * (rim_level + detail - v1)
    scan = scan + m * (surround - scan)
    out = torch.where(white, shot, scan)
    # the film's own digital padding stays where no shadow reaches it
    out = out + pad * (1.0 - m) * (v1 - out)
    return out.expand_as(v).clamp(0.0, 1.0).to(torch.float32)


PADDING_BAND = 0.03  # fraction of the side: how far from the film's edge padding may reach
PADDING_RUN = 0.1  # fraction of the side: how far along the edge its inner edge runs straight


def _left_band(zero: torch.Tensor) -> torch.Tensor:
    """(B,1,H,W) float64: the pixels of a band of 0 along the left edge whose inner edge is
    straight (the same width, within 1 px, over ``PADDING_RUN`` of the height), at most
    ``PADDING_BAND`` of the width wide."""
    h, w = zero.shape[-2:]
    run = torch.cumprod(zero, dim=-1)  # 1 while the row is still 0 from the left edge
    width = run.sum(dim=-1, keepdim=True)  # (B,1,H,1)
    k = max(3, int(PADDING_RUN * h)) | 1
    hi = F.max_pool2d(width, (k, 1), 1, (k // 2, 0))
    lo = -F.max_pool2d(-width, (k, 1), 1, (k // 2, 0))
    straight = ((hi - lo) <= 1.0).double()
    straight = F.max_pool2d(straight, (k, 1), 1, (k // 2, 0))  # to the band's ends
    inside = (width > 0.0) & (width <= PADDING_BAND * w)
    return run * straight * inside.double()


def _padding(v: torch.Tensor) -> torch.Tensor:
    """(B,1,H,W) float64: 1 on the film's digital padding, a band of exactly 0 along one of the
    film's edges with a straight inner edge (``_left_band`` on each edge): black the digitiser
    or the archive added after the exposure. Clipped black air is not padding (its exposure
    was real, its edge follows the body)."""
    zero = (v <= 0.0).double()
    left = _left_band(zero)
    right = _left_band(zero.flip(-1)).flip(-1)
    top = _left_band(zero.transpose(-1, -2)).transpose(-1, -2)
    bottom = _left_band(zero.flip(-2).transpose(-1, -2)).transpose(-1, -2).flip(-2)
    return torch.maximum(torch.maximum(left, right), torch.maximum(top, bottom))


def _collimation_sampler(rng_: np.random.Generator, level: Level) -> Params:
    blades = {n: draw(rng_, level[n]) for n in BLADES}
    u = [float(rng_.random()) for _ in range(44)]
    # which blades show on the film: most often one or a corner's two (the field coned down on
    # one side, the others open past the film's edge: their blade at 0), less often an opposite
    # pair, three, or all four
    names = BLADES
    pick = min(3, int(4 * u[16]))
    if u[15] < 0.35:
        shown = {names[pick]}
    elif u[15] < 0.65:
        shown = {names[pick // 2], names[2 + pick % 2]}
    elif u[15] < 0.75:
        shown = {"left", "right"} if pick < 2 else {"top", "bottom"}
    elif u[15] < 0.92:
        shown = set(names) - {names[pick]}
    else:
        shown = set(names)
    blades = {n: (b if n in shown else 0.0) for n, b in blades.items()}
    order = [i for i, n in enumerate(names) if n in shown]
    leaf_side = order[min(len(order) - 1, int(len(order) * u[24]))]
    scanned = u[0] < 0.07
    return {
        **blades,
        # the collimator's shadow on most films; a scanned film's own edge on a black scanner
        # surround on some (the films digitised from film archives)
        "white": float(not scanned),
        # the collimator never sits exactly square to the detector: 0.3-3 degrees either way,
        # and each blade's edge a little off the others' (up to 0.8 degrees)
        "tilt": (0.3 + 2.7 * u[1]) * (1.0 if u[2] < 0.5 else -1.0),
        **{f"skew_{n}": 0.8 * (2.0 * u[25 + i] - 1.0) for i, n in enumerate(names)},
        # a second blade edge overlapping one of the shown ones at 2-9 degrees to it, on a
        # quarter of the films
        "leaf": float(u[29] < 0.25 and not scanned),
        "leaf_side": float(leaf_side),
        "leaf_depth": blades[names[leaf_side]] * (0.6 + 0.6 * u[30]),
        "leaf_angle": (2.0 + 7.0 * u[31]) * (1.0 if u[32] < 0.5 else -1.0),
        "penumbra": 0.003 + 0.004 * u[3],  # 3-7 px of a 1024 px film at the centre
        "spread": 0.2 + 0.5 * u[4],  # 1.2-1.7x as wide in the corners
        "tail": 0.03 + 0.1 * u[21],  # the off-focal halo's share of the blade's stop
        # the lead blades let 0.1-0.5 % through: under them the anatomy barely shows, what
        # shows is the smooth scatter
        "transmission": 0.001 + 0.004 * u[5],
        # the field's corners: near square (the crossing blurred by the penumbra, a radius of
        # 1-3 px of 1024) on 60 % of the films, slightly rounded (8-30 px of 1024) on the others
        "corner": (0.001 + 0.002 * u[38]) if u[37] < 0.6 else (0.008 + 0.022 * u[38]),
        "scatter": 0.05 + 0.25 * u[6],  # many times the transmitted beam beside the field
        "reach": 0.01 + 0.03 * u[7],  # the scatter fades over 10-40 px of 1024
        "halo": 0.03 + 0.1 * u[23],  # the off-focal halo's exposure beside the field
        "halo_reach": 0.015 + 0.035 * u[36],  # over 15-50 px of 1024
        "range": 3.5 + 2.0 * u[8],  # log exposure range of the display (e-folds)
        "shade": 0.93 + 0.09 * u[9],  # where the display's shoulder rolls off to
        "texture": 0.8 + 0.6 * u[10],  # the film's texture's amplitude under the shadow
        # the detector's readout noise variance over the quantum noise's at the film's level
        "readout": 0.03 + 0.17 * u[40],
        # the system's edge enhancement (unsharp mask): a bright overshoot and dark rebound
        "enhance": 0.2 + 0.5 * u[12],
        "radius": 0.003 + 0.005 * u[13],  # its sigma: 3-8 px of a 1024 px film
        # the wide-band equalisation: a dark rebound band inside the field, light outside
        "equalize": 0.1 + 0.3 * u[14],
        "band": 0.015 + 0.035 * u[17],  # its sigma: 15-50 px of 1024
        "heel": 0.05 + 0.25 * u[18],  # e-folds of the heel ramp over the half side
        "heel_dir": 360.0 * u[19],
        "lumps": 0.15 + 0.3 * u[20],  # e-folds: under the shoulder several levels of 255
        # the band's unevenness along its length (over a sixteenth of the side): real bands
        # vary by 35-180 levels of 255 along the edge (the NIH films, real_bands in the catalog)
        "streak": 0.15 + 0.45 * u[41],
        # the anatomy's contrast under a blade as a share of the film's (scatter: a blurred trace)
        "trace": 0.25 + 0.25 * u[42],
        # the least grain of the shutter region's own dose (2.5-3.9 levels of 255: a high-pass
        # sigma of 1.8-2.8, as on the real NIH bands, see the catalog entry)
        "band_noise": (2.5 + 1.4 * u[43]) / 255.0,
        # the display level of the shadow's floor (long-range scatter, off-focal radiation)
        # before the shoulder: the band at about 160-230 of 255, as on the NIH films (their
        # collimated borders 170-225), on the shoulder's slope, not pressed into its flat top
        "deep": 0.6 + 0.3 * u[22],
        # a scanned film's edge: the scanner's black, the rim's width and level, the waviness
        "black": 0.012 + 0.035 * u[11],  # 3-12 levels of 255, the scanner's backing
        "scan_blur": 1.5 + 2.0 * u[39],  # the scanner optics' blur of the cut edge, px
        "rim": 0.001 + 0.003 * u[33],  # 1-4 px of a 1024 px film
        "rim_level": 0.7 + 0.3 * u[34],
        "wobble": 0.3 + 0.9 * u[35],  # px, over bends of about 40 px of 1024
    }


@register_kernel("xray_collimation", sampler=_collimation_sampler, shadow=collimation_shadow)
def xray_collimation(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Collimation as it shows on a real chest film: the x-ray tube's lead blades (which ones
    show varies per film: most often one side or a corner's two, at independent depths, less
    often an opposite pair, three or all four), each tilted on its own by 0.3-3 degrees, on a
    quarter of the films a second blade edge overlapping at a different angle; corners where
    two tilted edges cross near square or slightly rounded (keyed); behind a focal-spot penumbra of a few px that widens off
    the central ray, plus the faint halo of the tube's off-focal radiation. Under the blades
    the detector sees their transmission (well under 1 %: the anatomy barely there) and the scatter of the irradiated body
    (strongest beside the field, falling off away from it) over a long-range floor, uneven with
    the anode heel effect: through the log display and its shoulder the border is light and
    brightens outwards, the anatomy a scatter-blurred trace at a fraction of the film's
    contrast, never darker than the film it covers, and
    grainy with the detector's quantum and readout noise at its low dose (the fewer quanta, the
    larger their relative spread; at least the grain measured on the real bands), lighter
    than the densest anatomy beside it (the LUT set from the field, the shutter left out), a
    lead marker on the detector white under it (carrying on into the band), uneven along the
    band at three scales. The bands are
    as thin as on real films (0.3-9 % of the side; the NIH/Hannover sample films' collimated
    bands measure 0.4-5.6 %, median 1.3 %, see the catalog entry). The system's edge enhancement acts on the new edge as on any: a bright overshoot
    on the blade's side, a dark rebound just inside the field. On a few films (``white`` 0) the
    edge is instead a scanned film's own edge: slightly wavy, blurred by the scanner's optics,
    a thin light rim varying along it, the scanner's dark, uneven backing beyond. A lead marker the blades cover was never imaged: the engine's annotation
    composite does not paste it back there (``collimation_shadow``). Refs: Bushberg et al., The
    Essential Physics of Medical Imaging, ch. 5 (anode heel effect, off-focal radiation), ch. 7
    (collimation, penumbra = focal spot x (magnification - 1), scatter) and ch. 10 (CR/DR image
    processing: log transform, LUT, unsharp masking and multi-frequency equalisation); Boyle et
    al., PMB 2013 (scatter tails at field edges).

    Kornia: own kernel: no Kornia equivalent (blade geometry, scatter and unsharp-mask
    low-passes as per-sample box passes, keyed noise field and blend in one batched pass)."""
    return collimation(x, p, keys)


@backend.register_cpu("xray_collimation", dtypes=ALL_DTYPES)
def xray_collimation_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    x = torch.from_numpy(np.ascontiguousarray(_load(src)))[None]
    params = {n: torch.tensor([as_float32(v)], dtype=torch.float32) for n, v in p.items()}
    out = collimation(x, params, [key])[0].numpy()
    for c in range(src.shape[0]):
        _store(out[c], dst[c])
