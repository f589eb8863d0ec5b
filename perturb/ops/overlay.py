"""What covers part of a radiograph: burned-in text, laterality markers, collimator shutters.

Display-side masks composited over the MONOCHROME2 value ``v`` (perturb.ops.radiometry):

* ``xray_burned_text``: one annotation set per film (patient, study, projection, site and
  technique lines) in the corners, clear of the annotations already burned into the film (its
  radiograph scene, ``annotation_boxes``).
* ``xray_laterality_marker``: the lead L/R marker in a top corner, kept clear of the film's
  annotations and never contradicting its detected markers (``marker_plan``); ``SCENE_NOTES``
  gives the engine the note the record carries when the marker differs from its parameters.
* ``xray_collimation``: collimation borders (white: an unexposed film-like shutter, black: an
  electronic shutter) with a penumbra of ``PENUMBRA`` of the shorter side.

The masks are rendered on the host (integer rasterisation, identical for CPU and CUDA); the CPU
paths blend inside each mask's bounding box. Modality is catalog data, not this module's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from perturb import rng
from perturb.ops import backend
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
    src: np.ndarray, dst: np.ndarray, mask: np.ndarray, value: float, boxes: list[Box]
) -> None:
    """``_blend`` of one sample on the host: float32 ``v (1 - m) + value m`` inside ``boxes``
    (disjoint, covering every nonzero of the mask); elsewhere ``m = 0`` and the result is ``v``
    itself (every level of an integer sample rounds back to itself), so those pixels are copied."""
    np.copyto(dst, src)
    for box in boxes:
        m = mask[box]
        keep = np.float32(1.0) - m
        paint = np.float32(value) * m
        for c in range(src.shape[0]):
            out = _load(src[c][box]) * keep
            out += paint
            np.clip(out, np.float32(0.0), np.float32(1.0), out=out)
            _store(out, dst[c][box])


def _blend(x: torch.Tensor, masks: list[np.ndarray], value: torch.Tensor | float) -> torch.Tensor:
    """``v (1 - m) + value m`` with one host-rendered float32 mask (H, W) per sample, uploaded
    as one (B,1,H,W) stack; ``value``: (B,) per sample, or one number."""
    m = torch.from_numpy(np.stack(masks)).unsqueeze(1).to(x.device)
    paint = per_sample(value) if isinstance(value, torch.Tensor) else value
    return (x * (1.0 - m) + paint * m).clamp_(0.0, 1.0)


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


_PROJECTIONS = ("PA ERECT", "AP SUPINE", "AP ERECT", "AP SITTING", "PA INSP", "AP PORTABLE")
_SITES = ("ICU", "ED", "WARD 4", "OR", "BEDSIDE", "CLINIC")


def _text_lines(key: int, n: int) -> list[str]:
    """The burned-in annotation set of one film: at most one line of each kind (patient id,
    date, time, projection, technique, site, accession number, distance), the same values at
    every severity; ``n`` lines are its first ``n`` (at most 8)."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_text"))
    patient = int(g.integers(10**6, 10**7))
    day, month, year = int(g.integers(1, 29)), int(g.integers(1, 13)), int(g.integers(10, 25))
    hour, minute = int(g.integers(0, 24)), int(g.integers(0, 60))
    projection = _PROJECTIONS[int(g.integers(len(_PROJECTIONS)))]
    kvp, mas = int(g.integers(70, 125)), float(g.integers(5, 50)) / 10
    site = _SITES[int(g.integers(len(_SITES)))]
    accession = int(g.integers(10**7, 10**8))
    sid = (100, 150, 180)[int(g.integers(3))]
    lines = [
        f"ID {patient}",
        f"{day:02d}/{month:02d}/20{year}",
        projection,
        f"{kvp} kVp {mas:.1f} mAs",
        f"{hour:02d}:{minute:02d}",
        site,
        f"ACC {accession}",
        f"SID {sid} cm",
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


def text_layout(
    h: int, w: int, lines: list[str], height: float, avoid: Sequence[Box4] = ()
) -> list[tuple[str, int, int]]:
    """(text, x, y) origins of text lines stacked in the four corners in turn (line i goes to
    corner i % 4, below (above, at the bottom) the lines already there), each kept a line's
    height away from the boxes of ``avoid`` (annotations already on the film): a line that would
    touch one moves one row further from its corner, then to the next corner; a line that fits
    in no corner's band (the outer quarter of the film's height) is left out. Without ``avoid``
    line i sits at row i // 4 (while the band holds it)."""
    font = cv2.FONT_HERSHEY_SIMPLEX
    scale = max(height / 22.0, 0.1)  # SIMPLEX caps are about 22 px at scale 1
    thick = max(1, round(height / 9.0))
    margin = max(1, round(0.6 * height))
    step = round(1.6 * height) + 1
    rows = [0, 0, 0, 0]  # the next free row of each corner
    taken = list(avoid)
    out = []
    for i, text in enumerate(lines):
        (tw, th), base = cv2.getTextSize(text, font, scale, thick)
        for corner in [(i + k) % 4 for k in range(4)]:
            placed = None
            row = rows[corner]
            while placed is None:
                x0 = margin if corner in (0, 2) else w - margin - tw
                y0 = margin + th + row * step if corner in (0, 1) else h - margin - row * step
                box = (x0, y0 - th, x0 + tw, y0 + base)
                if (corner in (0, 1) and y0 + base > h // 4) or (
                    corner in (2, 3) and y0 - th < h - h // 4
                ):
                    break  # out of the corner's band (a quarter of the film): the next corner
                if _clear(box, avoid, height):
                    placed = (text, int(x0), int(y0))
                    taken.append(box)
                    rows[corner] = row + 1
                row += 1
            if placed is not None:
                out.append(placed)
                break
    return out


def text_mask(
    h: int, w: int, lines: list[str], height: float, avoid: Sequence[Box4] = ()
) -> np.ndarray:
    """Anti-aliased mask (float32, H x W) of text lines laid out by ``text_layout``; ``height``
    is the cap height in pixels."""
    canvas = np.zeros((h, w), dtype=np.uint8)
    font = cv2.FONT_HERSHEY_SIMPLEX
    scale = max(height / 22.0, 0.1)
    thick = max(1, round(height / 9.0))
    for text, x0, y0 in text_layout(h, w, lines, height, avoid):
        cv2.putText(canvas, text, (x0, y0), font, scale, 255, thick, cv2.LINE_AA)
    return canvas.astype(np.float32) / np.float32(255.0)


def _text_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "lines": draw_int(rng_, level["lines"]),
        "height": draw(rng_, level["height"]),
        "value": draw(rng_, level["value"]),
    }


@register_kernel("xray_burned_text", sampler=_text_sampler, host_params=True, uses_scene=True)
def xray_burned_text(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    host_params: Sequence[Mapping[str, Any]] | None = None,
    scenes: Sequence[Any] | None = None,
) -> torch.Tensor:
    """Burned-in annotation text (ID, date, projection, technique) in the corners; ``lines``
    grows with severity and the first lines of a sample are the same at every severity. Lines
    keep clear of the annotations already on the film (its radiograph scene: ``text_layout``).

    Kornia: own kernel: the glyph masks are rendered on the host (OpenCV text, identical on every
    device, the CPU path's pixels bit for bit) from the records' parameters on the host
    (``host_params``), uploaded once and blended in one pass; Kornia has no text rendering. A
    glyph bitmap scaled on the device would not be OpenCV's anti-aliased strokes at the sample's
    continuous height."""
    h, w = x.shape[-2:]
    side = min(h, w)
    rows = _host_rows(p, host_params, ("lines", "height"))
    given = list(scenes) if scenes is not None else [None] * len(keys)
    masks = [
        text_mask(
            h, w, _text_lines(int(k), round(lines)), height * side, annotation_boxes(sc, h, w)
        )
        for k, (lines, height), sc in zip(keys, rows, given, strict=True)
    ]
    return _blend(x, masks, p["value"])


@backend.register_cpu("xray_burned_text", dtypes=ALL_DTYPES, uses_scene=True)
def xray_burned_text_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    lines = _text_lines(key, round(float(p["lines"])))
    avoid = annotation_boxes(scene, h, w)
    mask = text_mask(h, w, lines, float(p["height"]) * min(h, w), avoid)
    _blend_np(src, dst, mask, float(p["value"]), _quadrant_boxes(mask))


def marker_plan(
    h: int, w: int, letter: str, size: float, right_corner: bool, scene: Any = None
) -> tuple[str | None, int, int, str | None]:
    """Where the laterality marker goes: (letter or None for no marker, x0, y0 of its square,
    why it differs from the drawn letter and corner, or None). A film's detected markers
    (its radiograph scene) decide the letter: the added marker never contradicts them (one side
    read: that letter, on that marker's side of the film; both: no marker; a marker-like
    annotation whose side was not read (``radiograph.unread_markers``): no marker). The square
    starts in the drawn top corner (margin
    3 % of the shorter side) and keeps half its size from every detected annotation: it moves
    up to twice its size along the edge from the drawn corner, the other top corner, then the
    bottom ones, before it goes further towards the middle."""
    side = min(h, w)
    margin = round(0.03 * side)
    s = max(2, round(size))
    found = radiograph.annotations_of(scene.descriptor) if _fits(scene, h, w) else []
    sides = sorted({str(a["side"]) for a in found if a["type"] == "marker" and a["side"]})
    if len(sides) > 1:
        return None, 0, 0, "no marker added: the film already shows both an L and an R marker"
    if not sides and _fits(scene, h, w):
        unread = radiograph.unread_markers(scene.descriptor)
        if unread:
            box = ", ".join(str(a["box"]) for a in unread)
            return None, 0, 0, f"no marker added: marker-like annotation(s) at {box}, side not read"
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
    near = range(0, 2 * big + 1, step)  # first each corner's own neighbourhood, then further in
    far = range(2 * big + step, max(2 * big + step, w // 2 - big - margin), step)
    for shifts in (near, far):
        for k, (right, top) in enumerate(corners):
            for shift in shifts:
                x0 = w - margin - big - shift if right else margin + shift
                y0 = margin if top else h - margin - big
                if _clear((x0, y0, x0 + big, y0 + big), avoid, 0.5 * big):  # type: ignore[arg-type]
                    if k or shift:
                        moved = "moved clear of the film's annotations"
                        why = moved if why is None else f"{why}; {moved}"
                    # the marker's square in the outer corner of the planned one
                    return letter, x0 + (big - s if right else 0), y0 + (0 if top else big - s), why
    return None, 0, 0, "no marker added: no corner of the film is clear of its annotations"


PLAN_SIZE = 0.09  # the largest marker (catalog: severity 5's upper size), shorter side


def _fits(scene: Any, h: int, w: int) -> bool:
    return scene is not None and tuple(scene.size) == (h, w) and scene.kind == "radiograph"


def marker_mask(
    h: int, w: int, letter: str, size: float, right_corner: bool, scene: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """A lead laterality marker placed by ``marker_plan``: a square of ``size`` px, a faint
    holder (0.35) with a bright outline and the letter (1.0); all zeros where no marker is
    added. Returns (mask, value) float32 images."""
    mask = np.zeros((h, w), dtype=np.float32)
    value = np.ones((h, w), dtype=np.float32)
    letter_, x0, y0, _ = marker_plan(h, w, letter, size, right_corner, scene)
    if letter_ is None:
        return mask, value
    s = max(2, round(size))
    mask[y0 : y0 + s, x0 : x0 + s] = 0.35
    glyph = np.zeros((h, w), dtype=np.uint8)
    thick = max(1, round(s / 12.0))
    cv2.rectangle(glyph, (x0, y0), (x0 + s - 1, y0 + s - 1), 255, thick, cv2.LINE_AA)
    scale = max(0.7 * s / 22.0, 0.1)
    (tw, th), _ = cv2.getTextSize(letter_, cv2.FONT_HERSHEY_DUPLEX, scale, max(1, 2 * thick))
    org = (x0 + (s - tw) // 2, y0 + (s + th) // 2)
    cv2.putText(
        glyph, letter_, org, cv2.FONT_HERSHEY_DUPLEX, scale, 255, max(1, 2 * thick), cv2.LINE_AA
    )
    inside = (slice(y0, y0 + s), slice(x0, x0 + s))  # the marker never leaves its square
    np.maximum(mask[inside], glyph[inside].astype(np.float32) / np.float32(255.0), out=mask[inside])
    return mask, value


def laterality_note(params: Mapping[str, Any], scene: Any, h: int, w: int) -> str | None:
    """Why a record's marker differs from its drawn letter and corner (``marker_plan``), or
    None: what the engine writes in the record (``extra["note"]``)."""
    letter = "R" if float(params["letter_r"]) > 0.5 else "L"
    size = as_float32(params["size"]) * min(h, w)
    return marker_plan(h, w, letter, size, as_float32(params["right_corner"]) > 0.5, scene)[3]


# ops whose record says why their result differs from what their parameters alone would give,
# read from the film's scene: note(params, scene, h, w)
SCENE_NOTES = {"xray_laterality_marker": laterality_note}


def _marker_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "size": draw(rng_, level["size"]),
        "letter_r": float(rng_.random() < 0.5),
        "right_corner": float(rng_.random() < 0.5),
    }


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
    """A radiopaque "L"/"R" marker in a top corner; the letter is keyed and need not match the
    anatomy (a wrong or misplaced marker is the failure mode it probes), but it never
    contradicts a marker already on the film and keeps clear of its annotations (``marker_plan``).

    Kornia: own kernel: the marker mask is rendered on the host (identical on every device, the
    CPU path's pixels bit for bit) from the records' parameters on the host (``host_params``),
    uploaded once and blended in one pass; Kornia has no text rendering."""
    h, w = x.shape[-2:]
    side = min(h, w)
    given = list(scenes) if scenes is not None else [None] * len(keys)
    masks = [
        marker_mask(h, w, "R" if letter_r > 0.5 else "L", size * side, right > 0.5, sc)[0]
        for (size, letter_r, right), sc in zip(
            _host_rows(p, host_params, ("size", "letter_r", "right_corner")), given, strict=True
        )
    ]
    return _blend(x, masks, 1.0)  # the marker's value image is all ones


@backend.register_cpu("xray_laterality_marker", dtypes=ALL_DTYPES, uses_scene=True)
def xray_laterality_marker_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, scene: Any = None
) -> None:
    h, w = src.shape[-2:]
    letter = "R" if float(p["letter_r"]) > 0.5 else "L"
    mask, _ = marker_mask(
        h, w, letter, float(p["size"]) * min(h, w), float(p["right_corner"]) > 0.5, scene
    )
    _blend_np(src, dst, mask, 1.0, _quadrant_boxes(mask))  # the marker's value image is all ones


PENUMBRA = 0.004  # collimator edge blur, fraction of the shorter side


def collimation_mask(
    h: int, w: int, left: float, right: float, top: float, bottom: float
) -> np.ndarray:
    """Shutter mask (float32, H x W): 1 outside the open field, a linear penumbra of
    ``PENUMBRA`` x shorter side at each blade edge. Blade positions are fractions of the
    width (left/right) and height (top/bottom)."""
    pen = max(PENUMBRA * min(h, w), 1.0)
    xs = np.arange(w, dtype=np.float64) + 0.5
    ys = np.arange(h, dtype=np.float64) + 0.5

    def ramp(d: np.ndarray) -> np.ndarray:  # d: signed distance into the shutter, px
        return np.clip(0.5 + d / pen, 0.0, 1.0)

    mx = np.maximum(ramp(left * w - xs), ramp(xs - (1.0 - right) * w))
    my = np.maximum(ramp(top * h - ys), ramp(ys - (1.0 - bottom) * h))
    return np.maximum(mx[None, :], my[:, None]).astype(np.float32)


def _collimation_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "left": draw(rng_, level["left"]),
        "right": draw(rng_, level["right"]),
        "top": draw(rng_, level["top"]),
        "bottom": draw(rng_, level["bottom"]),
        "white": float(rng_.random() < 0.5),
    }


@register_kernel("xray_collimation", sampler=_collimation_sampler)
def xray_collimation(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Collimator shutters: borders of keyed width per side, white (unexposed, MONOCHROME2)
    or black (electronic shutter), with a soft penumbra.

    Kornia: own kernel: no Kornia equivalent (a host-rendered shutter mask with penumbra, blended in
    one pass)."""
    h, w = x.shape[-2:]
    mask = collimation_masks(h, w, p, x.device)
    return (x * (1.0 - mask) + per_sample(p["white"]) * mask).clamp_(0.0, 1.0)


def collimation_masks(
    h: int, w: int, p: dict[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """``collimation_mask`` of every sample at once, (B,1,H,W) float32: the same float64
    operations on the (B,) blade positions (bit for bit)."""
    pen = max(PENUMBRA * min(h, w), 1.0)
    xs = (torch.arange(w, dtype=torch.float64, device=device) + 0.5).view(1, 1, 1, w)
    ys = (torch.arange(h, dtype=torch.float64, device=device) + 0.5).view(1, 1, h, 1)

    def ramp(d: torch.Tensor) -> torch.Tensor:  # d: signed distance into the shutter, px
        return (0.5 + d / pen).clamp_(0.0, 1.0)

    def blade(name: str) -> torch.Tensor:
        return per_sample(p[name]).double()

    mx = torch.maximum(ramp(blade("left") * w - xs), ramp(xs - (1.0 - blade("right")) * w))
    my = torch.maximum(ramp(blade("top") * h - ys), ramp(ys - (1.0 - blade("bottom")) * h))
    return torch.maximum(mx, my).to(torch.float32)


@backend.register_cpu("xray_collimation", dtypes=ALL_DTYPES)
def xray_collimation_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    h, w = src.shape[-2:]
    mask = collimation_mask(h, w, *(float(p[s]) for s in ("left", "right", "top", "bottom")))
    # the open field is the rectangle of rows and columns whose edge profile is zero
    rows, cols = np.flatnonzero(mask[:, w // 2] == 0), np.flatnonzero(mask[h // 2] == 0)
    if rows.size == 0 or cols.size == 0:
        boxes = [(slice(0, h), slice(0, w))]
    else:
        r0, r1, c0, c1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
        boxes = [(slice(0, r0), slice(0, w)), (slice(r1, h), slice(0, w))]
        boxes += [(slice(r0, r1), slice(0, c0)), (slice(r0, r1), slice(c1, w))]
    _blend_np(src, dst, mask, float(p["white"]), boxes)
