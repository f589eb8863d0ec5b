"""What lies on or in the patient and attenuates the beam: devices, foreign objects, skin folds.

Attenuating objects add to the display value (``v + mu t / MU``: the Beer-Lambert attenuation
of an object is a factor on the fluence ``I``, a shift in ``v``; perturb.ops.radiometry).
Positions are fractions of the film (chest films are centred on the thorax by positioning),
sizes fractions of the shorter side. Device appearance after Hunter et al., "Medical devices on
chest radiographs", RadioGraphics 24 (2004).

* ``xray_support_devices``: ECG electrodes and leads, central venous catheter, endotracheal and
  nasogastric tubes, pacemaker with its lead, drawn as attenuating objects with their real
  radiodensity (lucent tube lumens with a barium stripe, a generator with battery, circuit
  and header, electrodes with dense snap studs) and placed on the film's own anatomy
  (midline, lungs, apices, domes and body edges found from the pixels:
  ``perturb.ops.landmarks.chest_landmarks``).
* ``xray_foreign_objects``: radiopaque things on the patient: clothing buttons, bra hooks and
  snaps, a necklace with a pendant, hair clips, earrings.
* ``xray_skin_fold``: a fold of skin trapped between the patient's back and the detector (supine
  and portable films): the doubled skin adds attenuation that ends in a sharp curvilinear edge
  over the lateral lung and fades away from it, the classic pneumothorax mimic (lung markings
  continue across it).

Devices and foreign objects are drawn with OpenCV's anti-aliased primitives; their canvases
depend on the key alone, so they are drawn on the host from the (host-side) keys and selected
and scaled on the device by the ``items`` and ``opacity`` tensors. Devices are drawn in a
canonical frame and moved onto each film's landmarks by per-sample axis-aligned maps (one
``grid_sample`` per canvas for the whole batch; the CPU path runs the same code one film at a
time). Modality is catalog data, not this module's name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops import backend
from perturb.ops._math import per_sample
from perturb.ops.kernels import Level, Params, draw, draw_int, register_kernel
from perturb.ops.landmarks import CANONICAL, chest_landmarks
from perturb.ops.radiometry import FIELD_CM, _wide


def _frac_px(value: float, size: int) -> int:
    return round(value * size)


def _add_attenuation(x: torch.Tensor, maps: list[np.ndarray]) -> torch.Tensor:
    """``clip(v + a)`` per sample with host-rendered attenuation maps ``a`` (display units)."""
    a = torch.from_numpy(np.stack(maps)[:, None]).to(x.device)
    return (x + a).clamp_(0.0, 1.0)


def _canvas(h: int, w: int) -> np.ndarray:
    return np.zeros((h, w), dtype=np.uint8)


def _accumulate(total: np.ndarray, canvas: np.ndarray, attenuation: float) -> None:
    """``total += attenuation * canvas / 255`` where anything was drawn (float32)."""
    total += canvas.astype(np.float32) * np.float32(attenuation / 255.0)


ITEMS = 8  # the most devices / foreign objects a film gets (the catalog's bound on ``items``)


class _Layers:
    """One film's drawn objects: uint8 canvases (255 = fully covered) in drawing order, each
    with the item it belongs to and its attenuation at opacity 1 (display units). The items
    come in a fixed order per film, so a film's first ``n`` items are the same at every
    severity and every ``items`` count: drawing all of them once serves any ``items``."""

    def __init__(self, h: int, w: int) -> None:
        self.shape = (h, w)
        self.item = 0
        self.canvases: list[np.ndarray] = []
        self.items: list[int] = []
        self.attenuations: list[float] = []

    def add(self, canvas: np.ndarray, attenuation: float) -> None:
        self.canvases.append(canvas)
        self.items.append(self.item)
        self.attenuations.append(attenuation)

    def total(self, opacity: float) -> np.ndarray:
        """``sum attenuation * opacity * canvas / 255`` (float32, in drawing order)."""
        total = np.zeros(self.shape, dtype=np.float32)
        for canvas, attenuation in zip(self.canvases, self.attenuations, strict=True):
            _accumulate(total, canvas, attenuation * opacity)
        return total


def _add_layers(x: torch.Tensor, p: dict[str, torch.Tensor], films: list[_Layers]) -> torch.Tensor:
    """``clip(v + a)`` for the whole batch, ``a`` the sum of each film's canvases of its first
    ``items`` items at its ``opacity`` (both (B,) tensors, never read back to the host). The
    canvases are drawn on the host from the keys alone (the items and opacity select and
    scale them); they travel as one (K, B, H, W) uint8 stack padded with empty canvases, and
    are summed in drawing order in float32, the host's ``_Layers.total`` value for value."""
    b = x.shape[0]
    h, w = x.shape[-2:]
    k = max((len(f.canvases) for f in films), default=0)
    canvases = np.zeros((k, b, h, w), dtype=np.uint8)
    items = np.full((b, k), ITEMS, dtype=np.int64)  # padding: never among the first ``items``
    attenuations = np.zeros((b, k), dtype=np.float64)
    for i, film in enumerate(films):
        n = len(film.canvases)
        if n:
            canvases[:n, i] = np.stack(film.canvases)
        items[i, :n] = film.items
        attenuations[i, :n] = film.attenuations
    dev = x.device
    drawn = torch.from_numpy(canvases).to(dev)
    chosen = torch.from_numpy(items).to(dev) < torch.round(p["items"]).view(b, 1)
    opacity = p["opacity"].double().view(b, 1)
    weights = ((torch.from_numpy(attenuations).to(dev) * opacity) / 255.0).to(torch.float32)
    weights = weights * chosen.to(torch.float32)
    total = torch.zeros(b, h, w, dtype=torch.float32, device=dev)
    for j in range(k):  # k is the op's canvas count per film, not the batch size
        total = total + drawn[j].to(torch.float32) * weights[:, j].view(b, 1, 1)
    return (x + total.unsqueeze(1)).clamp_(0.0, 1.0)


def _curve(points: np.ndarray, n: int = 48) -> np.ndarray:
    """A smooth polyline (Catmull-Rom through ``points``, (k, 2) float) as int32 (n, 1, 2)."""
    pts = np.asarray(points, dtype=np.float64)
    if len(pts) < 3:
        return np.round(pts).astype(np.int32).reshape(-1, 1, 2)
    padded = np.vstack([pts[0], pts, pts[-1]])
    out = []
    for i in range(1, len(padded) - 2):
        p0, p1, p2, p3 = padded[i - 1], padded[i], padded[i + 1], padded[i + 2]
        for t in np.linspace(0.0, 1.0, max(2, n // (len(pts) - 1)), endpoint=False):
            t2, t3 = t * t, t * t * t
            out.append(
                0.5
                * (
                    2 * p1
                    + (-p0 + p2) * t
                    + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t2
                    + (-p0 + 3 * p1 - 3 * p2 + p3) * t3
                )
            )
    out.append(pts[-1])
    return np.round(np.array(out)).astype(np.int32).reshape(-1, 1, 2)


def _level_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"items": draw_int(rng_, level["items"]), "opacity": draw(rng_, level["opacity"])}


LUNG_CM = 24.0  # apex to dome of an adult lung, the scale of the device offsets


def device_anchors(lm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Where the devices go, (B, 2) (x, y) fractions of the film from (B, 10) landmarks:

    * ECG electrodes on the skin inside the body outline, 6 % of the width in from the body
      edge, the upper pair just below the apices (shoulders), the lower pair below the domes;
    * the carina 38 % of the way from the apex to the domes on the midline; the endotracheal
      tube tip 4.5 cm above it (the lung height is ``LUNG_CM``);
    * the central line tip at the cavo-atrial junction, 2.5 cm below the carina, a fifth of
      the way from the midline to the right lung's centre (image left: the SVC along the
      right mediastinal border);
    * the nasogastric tube tip in the gastric fundus, 3 cm below the image-right (left) dome;
    * the pacemaker generator in the left pectoral region (image right, 30 % of the way from
      the lung centre to the body edge, 3 cm below the apex), its lead tip at the right-ventricular
      apex (the lower cardiac silhouette just left of the midline, 2 cm above the dome)."""
    mid, left, right = lm[:, 0], lm[:, 1], lm[:, 2]
    apex, dome_l, dome_r = lm[:, 3], lm[:, 4], lm[:, 5]
    dome = (dome_l + dome_r) / 2.0
    cm = (dome - apex) / LUNG_CM
    carina = apex + 0.38 * (dome - apex)

    def xy(px: torch.Tensor, py: torch.Tensor) -> torch.Tensor:
        return torch.stack([px, py], dim=1)

    return {
        "ecg0": xy(lm[:, 6] + 0.06, apex + 0.03),
        "ecg1": xy(lm[:, 7] - 0.06, apex + 0.03),
        "ecg2": xy(lm[:, 8] + 0.06, dome_l + 0.08),
        "ecg3": xy(lm[:, 9] - 0.06, dome_r + 0.08),
        "et_tip": xy(mid, carina - 4.5 * cm),
        "cvc_tip": xy(mid - 0.2 * (mid - left), carina + 2.5 * cm),
        "ng_top": xy(mid, torch.zeros_like(mid)),
        "ng_tip": xy(mid + 0.55 * (right - mid), dome_r + 3.0 * cm),
        "generator": xy(right + 0.3 * (lm[:, 7] - right), apex + 3.0 * cm),
        "rv_apex": xy(mid + 0.3 * (right - mid), dome_r - 2.0 * cm),
    }


_CANONICAL_ANCHORS: dict[str, tuple[float, float]] = {
    name: (float(v[0, 0]), float(v[0, 1]))
    for name, v in device_anchors(torch.tensor([CANONICAL], dtype=torch.float64)).items()
}


class _Placed:
    """One film's devices drawn in the canonical frame: uint8 canvases (255 = the canvas's
    densest attenuation ``scale``, display units at opacity 1), each with its item and its
    placement ``(kind, anchor, second anchor)``: ``move`` (translated with its anchor),
    ``left``/``right`` (stretched from that film edge to its anchor, for leads running off the
    body), ``down`` (moved sideways with its anchor and stretched from the top of the film to
    it, for tubes entering from above), ``span`` (stretched between two anchors)."""

    def __init__(self, h: int, w: int) -> None:
        self.shape = (h, w)
        self.canvases: list[np.ndarray] = []
        self.items: list[int] = []
        self.scales: list[float] = []
        self.placements: list[tuple[str, str, str]] = []

    def add(self, item: int, attenuation: np.ndarray, placement: tuple[str, str, str]) -> None:
        scale = float(attenuation.max())
        canvas = np.zeros(self.shape, np.uint8)
        if scale > 0:
            canvas = np.round(attenuation * (255.0 / scale)).astype(np.uint8)
        self.canvases.append(canvas)
        self.items.append(item)
        self.scales.append(scale)
        self.placements.append(placement)


def _px(point: tuple[float, float], w: int, h: int) -> tuple[float, float]:
    return point[0] * w, point[1] * h


def _dense_curve(points: np.ndarray) -> np.ndarray:
    """``_curve`` through ``points`` (pixels) as float (n, 2), one point every ~2 pixels."""
    length = float(np.linalg.norm(np.diff(points, axis=0), axis=1).sum())
    return _curve(points, n=max(16, int(length / 2))).reshape(-1, 2).astype(np.float64)


def _offset(curve: np.ndarray, distance: float) -> np.ndarray:
    """The curve moved sideways by ``distance`` pixels along its normals."""
    tangent = np.gradient(curve, axis=0)
    tangent /= np.maximum(np.linalg.norm(tangent, axis=1, keepdims=True), 1e-9)
    normal = np.stack([-tangent[:, 1], tangent[:, 0]], axis=1)
    return curve + distance * normal


def _stroke(target: np.ndarray, curve: np.ndarray, width: float, value: float) -> None:
    """Add ``value`` along an anti-aliased polyline of ``width`` pixels (at least one)."""
    canvas = np.zeros(target.shape, np.uint8)
    pts = np.round(curve).astype(np.int32).reshape(-1, 1, 2)
    cv2.polylines(canvas, [pts], False, 255, max(1, round(width)), cv2.LINE_AA)
    target += canvas.astype(np.float32) * np.float32(value / 255.0)


def _tube(
    target: np.ndarray, curve: np.ndarray, outer: float, wall: float, stripe: float, px: float
) -> None:
    """A plastic tube seen from the side: two faint walls (the wall is seen end-on at the
    tube's edges: ``wall``) around a radiolucent lumen, and a thin radiopaque (barium) stripe
    along one side (``stripe``); ``outer`` the outer diameter in pixels, ``px`` pixels per
    cm."""
    wall_px = max(1.0, 0.06 * px)
    for side in (-1.0, 1.0):
        _stroke(target, _offset(curve, side * (outer - wall_px) / 2.0), wall_px, wall)
    _stroke(target, curve, max(1.0, outer - 2 * wall_px), wall * 0.25)  # the lumen's faint wall
    _stroke(target, _offset(curve, -outer / 4.0), max(1.0, 0.08 * px), stripe)


def _electrode(
    layers: _Placed, g: np.random.Generator, item: int, anchor: str, px: float, lead_side: str
) -> None:
    """An ECG electrode: foam pad (barely visible, its rim a little denser), gel disc, metal
    snap stud (dense ring around a less dense cap), the lead's clip on the stud, and the lead
    wire (copper core in insulation) curving off the body to the film edge on its side."""
    h, w = layers.shape
    cx, cy = _px(_CANONICAL_ANCHORS[anchor], w, h)
    cx += g.uniform(-0.015, 0.015) * w
    cy += g.uniform(-0.015, 0.015) * h
    centre = (round(cx), round(cy))
    pad = np.zeros((h, w), np.float32)
    disc = np.zeros((h, w), np.uint8)
    r_pad = max(2, round(g.uniform(1.6, 2.0) * px))
    cv2.circle(disc, centre, r_pad, 255, -1, cv2.LINE_AA)
    pad += disc.astype(np.float32) * np.float32(0.015 / 255)
    disc[:] = 0
    cv2.circle(disc, centre, r_pad, 255, max(1, round(0.1 * px)), cv2.LINE_AA)
    pad += disc.astype(np.float32) * np.float32(0.02 / 255)
    disc[:] = 0
    cv2.circle(disc, centre, max(1, round(0.9 * px)), 255, -1, cv2.LINE_AA)
    pad += disc.astype(np.float32) * np.float32(0.02 / 255)  # gel
    disc[:] = 0
    cv2.circle(disc, centre, max(1, round(0.45 * px)), 255, max(1, round(0.12 * px)), cv2.LINE_AA)
    pad += disc.astype(np.float32) * np.float32(0.4 / 255)  # the stud's rim, seen edge-on
    disc[:] = 0
    cv2.circle(disc, centre, max(1, round(0.35 * px)), 255, -1, cv2.LINE_AA)
    pad += disc.astype(np.float32) * np.float32(0.22 / 255)  # the stud's cap
    angle = g.uniform(0, 2 * math.pi)
    clip = np.array(
        [
            [cx + 0.4 * px * math.cos(angle), cy + 0.4 * px * math.sin(angle)],
            [cx + 1.4 * px * math.cos(angle), cy + 1.4 * px * math.sin(angle)],
        ]
    )
    _stroke(pad, clip, 0.5 * px, 0.18)  # the lead's clip on the stud
    layers.add(item, pad, ("move", anchor, anchor))
    lead = np.zeros((h, w), np.float32)
    edge_x = 0.0 if lead_side == "left" else float(w)
    start = clip[1]
    bend = np.array([(start[0] + edge_x) / 2, start[1] + g.uniform(-0.08, 0.08) * h])
    end = np.array([edge_x, start[1] + g.uniform(-0.15, 0.1) * h])
    curve = _dense_curve(np.array([start, bend, end]))
    _stroke(lead, curve, 0.3 * px, 0.03)  # insulation
    _stroke(lead, curve, max(1.0, 0.1 * px), 0.12)  # the wire
    layers.add(item, lead, (lead_side, anchor, anchor))


def _generator(
    target: np.ndarray, g: np.random.Generator, cx: float, cy: float, px: float
) -> tuple[float, float]:
    """A pacemaker generator seen face-on, drawn into ``target``; returns where its lead
    leaves the header (pixels). A titanium can (a rounded rectangle, a superellipse of 4-5 x
    4-4.5 cm, its rim denser where the shell is seen tangentially), the lithium-iodine
    battery filling its lower half, the hybrid circuit above it (chips and a capacitor), and
    the epoxy header on its upper edge (nearly radiolucent) holding the dense connector block
    and set screws."""
    h, w = target.shape
    angle = math.radians(g.uniform(-25, 25))
    a, b = g.uniform(2.0, 2.4) * px, g.uniform(1.9, 2.2) * px  # half-width, half-height
    c, s = math.cos(angle), math.sin(angle)

    def polygon(points: np.ndarray) -> np.ndarray:
        """Frame points (pixels from the centre, y down) rotated and moved onto the film."""
        x, y = points[:, 0], points[:, 1]
        return np.stack([cx + c * x - s * y, cy + s * x + c * y], axis=1)

    def fill(points: np.ndarray, value: float, thickness: int = -1) -> None:
        canvas = np.zeros((h, w), np.uint8)
        pts = np.round(polygon(points) * 4).astype(np.int32).reshape(-1, 1, 2)
        if thickness < 0:
            cv2.fillPoly(canvas, [pts], 255, cv2.LINE_AA, shift=2)
        else:
            cv2.polylines(canvas, [pts], True, 255, thickness, cv2.LINE_AA, shift=2)
        target[...] += canvas.astype(np.float32) * np.float32(value / 255.0)

    def rect(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])

    t = np.linspace(0, 2 * math.pi, 96, endpoint=False)
    shell = np.stack(
        [
            a * np.sign(np.cos(t)) * np.abs(np.cos(t)) ** 0.5,
            b * np.sign(np.sin(t)) * np.abs(np.sin(t)) ** 0.5,
        ],
        axis=1,
    )
    fill(shell, 0.2)  # the two titanium walls
    fill(shell, 0.08, max(1, round(0.2 * px)))  # the shell seen tangentially
    fill(rect(-0.8 * a, 0.0, 0.8 * a, 0.82 * b), 0.14)  # battery
    fill(rect(-0.8 * a, -0.05 * b, 0.8 * a, 0.05 * b), 0.06)  # its terminal plate
    for _ in range(int(g.integers(4, 8))):  # circuit: chips, resistors
        x0 = g.uniform(-0.75, 0.45) * a
        y0 = g.uniform(-0.8, -0.3) * b
        fill(rect(x0, y0, x0 + g.uniform(0.1, 0.3) * a, y0 + g.uniform(0.08, 0.2) * b), 0.1)
    ring = np.stack([np.cos(t), np.sin(t)], axis=1) * 0.2 * a + [0.5 * a, -0.55 * b]
    fill(ring, 0.08)  # capacitor
    side = 1.0 if g.random() < 0.5 else -1.0
    fill(rect(-0.05 * a * side, -1.45 * b, 0.75 * a * side, -0.85 * b), 0.04)  # epoxy header
    for k in (0.15, 0.45):  # connector block and set screws
        fill(rect(k * a * side, -1.35 * b, (k + 0.18) * a * side, -0.95 * b), 0.35)
    exit_point = polygon(np.array([[0.75 * a * side, -1.2 * b]]))[0]
    return float(exit_point[0]), float(exit_point[1])


def device_layers(key: int, h: int, w: int) -> _Placed:
    """Every device of this film's keyed set drawn in the canonical frame, in clinical order:
    item 0-3 the ECG electrodes, 4 a right internal jugular central venous catheter, 5 an
    endotracheal tube, 6 a nasogastric tube, 7 a left pectoral pacemaker with its
    right-ventricular lead. Sizes are in cm (the shorter side spans ``FIELD_CM``); shapes are
    jittered per film, the same at every severity. ``place_devices`` moves them onto the
    film's landmarks."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_support_devices"))
    side = min(h, w)
    px = side / FIELD_CM
    layers = _Placed(h, w)
    for item, lead_side in enumerate(("left", "right", "left", "right")):
        _electrode(layers, g, item, f"ecg{item}", px, lead_side)
    anchor = {k: np.array(_px(v, w, h)) for k, v in _CANONICAL_ANCHORS.items()}
    # central line: down the right internal jugular, the brachiocephalic vein, the SVC
    tip = anchor["cvc_tip"]
    cvc = np.zeros((h, w), np.float32)
    neck = tip[0] - g.uniform(0.05, 0.07) * w
    path = np.array(
        [[neck, 0.0], [neck + 0.01 * w, 0.35 * tip[1]], [tip[0] - 0.012 * w, 0.7 * tip[1]], tip]
    )
    curve = _dense_curve(path)
    _stroke(cvc, curve, 0.25 * px, 0.07)
    _stroke(cvc, curve, max(1.0, 0.1 * px), 0.07)  # barium-loaded wall, densest centrally
    layers.add(4, cvc, ("down", "cvc_tip", "cvc_tip"))
    # endotracheal tube: down the tracheal midline from the mouth, the tip above the carina
    tip = anchor["et_tip"]
    et = np.zeros((h, w), np.float32)
    sway = g.uniform(-0.008, 0.008) * w
    curve = _dense_curve(np.array([[tip[0] + sway, 0.0], [tip[0] + sway / 2, 0.5 * tip[1]], tip]))
    _tube(et, curve, 0.9 * px, 0.025, 0.16, px)
    layers.add(5, et, ("down", "et_tip", "et_tip"))
    # nasogastric tube: the oesophagus (a little left of the midline: image right) through
    # the hiatus into the stomach below the left dome, the tip curling in the fundus
    top, tip = anchor["ng_top"], anchor["ng_tip"]
    ng = np.zeros((h, w), np.float32)
    hiatus = np.array([top[0] + 0.03 * w, tip[1] - 0.06 * h])
    path = np.array(
        [
            top + np.array([0.004 * w, 0.0]),
            [top[0] + 0.012 * w, 0.4 * hiatus[1]],
            [top[0] + 0.02 * w, 0.75 * hiatus[1]],
            hiatus,
            tip,
            tip + np.array([0.03 * w, -0.02 * h * g.uniform(0.5, 1.5)]),
        ]
    )
    curve = _dense_curve(path)
    _tube(ng, curve, 0.5 * px, 0.05, 0.2, px)
    holes = np.zeros((h, w), np.float32)
    _stroke(holes, curve[-max(2, len(curve) // 12) :], max(1.0, 0.25 * px), 0.12)  # tip marker
    ng += holes
    layers.add(6, ng, ("span", "ng_top", "ng_tip"))
    # pacemaker: generator in the left pectoral pocket, the lead through the subclavian vein
    # and the SVC, a slack loop, into the right-ventricular apex
    gen, rv = anchor["generator"], anchor["rv_apex"]
    can = np.zeros((h, w), np.float32)
    exit_x, exit_y = _generator(can, g, gen[0], gen[1], px)
    layers.add(7, can, ("move", "generator", "generator"))
    lead = np.zeros((h, w), np.float32)
    start = np.array([exit_x, exit_y])
    mid = anchor["cvc_tip"]
    path = np.array(
        [
            start,
            start + np.array([-0.05 * w, -0.03 * h]),
            [(start[0] + mid[0]) / 2, start[1] - 0.01 * h],
            [mid[0] + 0.015 * w, (start[1] + mid[1]) / 2 - 0.02 * h],
            [mid[0] - 0.005 * w, mid[1] - 0.03 * h],
            mid + np.array([0.0, 0.04 * h]),
            [rv[0] - 0.06 * w, rv[1] - 0.02 * h],
            rv,
        ]
    )
    curve = _dense_curve(path)
    _stroke(lead, curve, 0.3 * px, 0.16)  # insulation and coil
    _stroke(lead, curve, max(1.0, 0.12 * px), 0.12)  # the conductor coil
    tip_mark = np.zeros((h, w), np.uint8)
    cv2.circle(
        tip_mark, (round(rv[0]), round(rv[1])), max(1, round(0.3 * px)), 255, -1, cv2.LINE_AA
    )
    lead += tip_mark.astype(np.float32) * np.float32(0.25 / 255)  # tip electrode
    ring = curve[max(0, len(curve) - 1 - round(1.5 * px / 2))]
    tip_mark[:] = 0
    cv2.circle(
        tip_mark, (round(ring[0]), round(ring[1])), max(1, round(0.25 * px)), 255, -1, cv2.LINE_AA
    )
    lead += tip_mark.astype(np.float32) * np.float32(0.2 / 255)  # ring electrode
    layers.add(7, lead, ("span", "generator", "rv_apex"))
    return layers


def _axis_maps(
    placement: tuple[str, str, str],
    found: dict[str, torch.Tensor],
    w: int,
    h: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample axis-aligned map ``x' = sx x + tx``, ``y' = sy y + ty`` (pixels, (B,) each)
    moving a canvas drawn at the canonical anchors onto the found ones."""
    kind, first, second = placement
    size = torch.tensor([w, h], dtype=torch.float64, device=found[first].device)
    p = found[first] * size
    p0 = torch.tensor(_CANONICAL_ANCHORS[first], dtype=torch.float64, device=p.device) * size
    one = torch.ones_like(p[:, 0])
    if kind == "move":
        return one, p[:, 0] - p0[0], one, p[:, 1] - p0[1]
    if kind in ("left", "right"):
        edge = 0.0 if kind == "left" else float(w)
        sx = ((p[:, 0] - edge) / (float(p0[0]) - edge)).clamp(0.5, 2.0)
        return sx, edge * (1.0 - sx), one, p[:, 1] - p0[1]
    if kind == "down":
        sy = (p[:, 1] / p0[1]).clamp(0.5, 2.0)
        return one, p[:, 0] - p0[0], sy, torch.zeros_like(sy)
    q = found[second] * size
    q0 = torch.tensor(_CANONICAL_ANCHORS[second], dtype=torch.float64, device=p.device) * size
    sx = ((q[:, 0] - p[:, 0]) / (q0[0] - p0[0])).clamp(0.5, 2.0)
    sy = ((q[:, 1] - p[:, 1]) / (q0[1] - p0[1])).clamp(0.5, 2.0)
    return sx, p[:, 0] - sx * p0[0], sy, p[:, 1] - sy * p0[1]


def place_devices(
    x: torch.Tensor, p: Mapping[str, torch.Tensor], films: list[_Placed]
) -> torch.Tensor:
    """``clip(v + a)`` for the whole batch: ``a`` the sum of each film's canvases of its first
    ``items`` items at its ``opacity``, each canvas moved from the canonical frame onto the
    film's own landmarks (``chest_landmarks``, ``device_anchors``) by an axis-aligned map
    (bilinear). The canvases travel as one (K, B, H, W) uint8 stack (every film has the same
    K canvases in the same order); one ``grid_sample`` per canvas serves the whole batch."""
    b = x.shape[0]
    h, w = x.shape[-2:]
    dev = x.device
    found = device_anchors(chest_landmarks(x))
    k = len(films[0].canvases) if films else 0
    drawn = torch.from_numpy(np.stack([np.stack(f.canvases) for f in films], axis=1)).to(dev)
    items = torch.tensor([f.items for f in films], dtype=torch.int64, device=dev)  # (B, K)
    scales = torch.tensor([f.scales for f in films], dtype=torch.float64, device=dev)
    chosen = (items < torch.round(p["items"]).view(b, 1)).to(torch.float64)
    weights = (scales * p["opacity"].double().view(b, 1) * chosen / 255.0).to(torch.float32)
    xs = (torch.arange(w, dtype=torch.float64, device=dev) + 0.5).view(1, 1, w)
    ys = (torch.arange(h, dtype=torch.float64, device=dev) + 0.5).view(1, h, 1)
    total = torch.zeros(b, 1, h, w, dtype=torch.float32, device=dev)
    for j in range(k):  # k is the op's canvas count per film, not the batch size
        sx, tx, sy, ty = _axis_maps(films[0].placements[j], found, w, h)
        src_x = (xs - tx.view(b, 1, 1)) / sx.view(b, 1, 1)  # output pixel -> canonical pixel
        src_y = (ys - ty.view(b, 1, 1)) / sy.view(b, 1, 1)
        grid = torch.stack(
            [(src_x * (2.0 / w) - 1.0).expand(b, h, w), (src_y * (2.0 / h) - 1.0).expand(b, h, w)],
            dim=-1,
        ).to(torch.float32)
        moved = F.grid_sample(
            drawn[j].unsqueeze(1).to(torch.float32),
            grid,
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        )
        total = total + moved * weights[:, j].view(b, 1, 1, 1)
    return (x + total).clamp_(0.0, 1.0)


@register_kernel("xray_support_devices", sampler=_level_sampler)
def xray_support_devices(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Support devices as attenuating objects placed on the film's own anatomy (see
    ``chest_landmarks``, ``device_anchors``, ``device_layers`` and ``place_devices``).

    Kornia: own kernel: no Kornia equivalent (host-drawn attenuation canvases, moved onto the
    landmarks by per-sample axis-aligned maps through one ``grid_sample`` per canvas)."""
    h, w = x.shape[-2:]
    return backend.by_path(
        x,
        host=lambda: torch.cat(
            [
                place_devices(
                    x[i : i + 1],
                    {n: v[i : i + 1] for n, v in p.items()},
                    [device_layers(int(k), h, w)],
                )
                for i, k in enumerate(keys)
            ]
        ),
        device=lambda: place_devices(x, p, [device_layers(int(k), h, w) for k in keys]),
    )


def _button(layers: _Layers, side: int, cx: int, cy: int) -> None:
    h, w = layers.shape
    r = max(2, _frac_px(0.013, side))
    canvas = _canvas(h, w)
    cv2.circle(canvas, (cx, cy), r, 255, -1, cv2.LINE_AA)
    hole = max(1, r // 4)
    for dx, dy in ((-1, -1), (1, -1), (-1, 1), (1, 1)):
        cv2.circle(canvas, (cx + dx * r // 3, cy + dy * r // 3), hole, 0, -1, cv2.LINE_AA)
    layers.add(canvas, 0.2)


def _hooks(layers: _Layers, side: int, cx: int, cy: int) -> None:
    h, w = layers.shape
    canvas = _canvas(h, w)
    a, b = max(2, _frac_px(0.012, side)), max(1, _frac_px(0.004, side))
    for dy in (-2 * b, 2 * b):
        cv2.rectangle(canvas, (cx - a, cy + dy - b), (cx + a, cy + dy + b), 255, -1, cv2.LINE_AA)
    layers.add(canvas, 0.5)


def _necklace(layers: _Layers, g: np.random.Generator, side: int) -> None:
    h, w = layers.shape
    canvas = _canvas(h, w)
    depth = g.uniform(0.16, 0.26)
    bead = max(1, _frac_px(0.004, side))
    for t in np.linspace(-1.0, 1.0, 41):
        x = 0.5 + 0.17 * t
        y = depth * (1 - t * t) + 0.02
        cv2.circle(canvas, (int(x * w), int(y * h)), bead, 255, -1, cv2.LINE_AA)
    cv2.circle(
        canvas,
        (int(0.5 * w), int((depth + 0.045) * h)),
        max(2, _frac_px(0.012, side)),
        255,
        -1,
        cv2.LINE_AA,
    )
    layers.add(canvas, 0.6)


def _hair_clip(layers: _Layers, side: int, cx: int, cy: int, angle: float) -> None:
    h, w = layers.shape
    canvas = _canvas(h, w)
    length, gap = _frac_px(0.07, side), max(2, _frac_px(0.006, side))
    c, s = math.cos(angle), math.sin(angle)
    for off in (-gap, gap):
        p0 = (int(cx - off * s), int(cy + off * c))
        p1 = (int(cx + length * c - off * s), int(cy + length * s + off * c))
        cv2.line(canvas, p0, p1, 255, max(1, _frac_px(0.003, side)), cv2.LINE_AA)
    cv2.ellipse(
        canvas,
        (cx, cy),
        (gap, gap),
        math.degrees(angle) + 90,
        0,
        180,
        255,
        max(1, _frac_px(0.003, side)),
        cv2.LINE_AA,
    )
    layers.add(canvas, 0.7)


def _earring(layers: _Layers, side: int, cx: int, cy: int) -> None:
    h, w = layers.shape
    canvas = _canvas(h, w)
    cv2.circle(
        canvas,
        (cx, cy),
        max(2, _frac_px(0.01, side)),
        255,
        max(1, _frac_px(0.003, side)),
        cv2.LINE_AA,
    )
    layers.add(canvas, 0.7)


def objects_map(key: int, h: int, w: int, items: int, opacity: float) -> np.ndarray:
    """Attenuation (display units, float32 H x W) of this film's first ``items`` foreign
    objects at ``opacity`` (see ``object_layers``)."""
    return object_layers(key, h, w, items).total(opacity)


def object_layers(key: int, h: int, w: int, items: int) -> _Layers:
    """The canvases of this film's first ``items`` foreign objects, in a keyed order drawn
    from: a button line of a shirt or gown (each button one
    item), bra hooks, a necklace with a pendant, hair clips, an earring. The same objects in the
    same places at every severity."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_foreign_objects"))
    side = min(h, w)
    layers = _Layers(h, w)
    column = g.uniform(0.44, 0.56)
    kinds = ["button", "necklace", "button", "hooks", "clip", "button", "earring", "button"]
    order = [0, *(1 + g.permutation(len(kinds) - 1))]  # a button first, then a keyed order
    jitter = g.uniform(-0.02, 0.02, size=(len(kinds), 2))
    buttons = 0
    for n, idx in enumerate(order[:items]):
        kind = kinds[idx]
        jx, jy = jitter[n]
        layers.item = n
        if kind == "button":
            _button(layers, side, int((column + jx / 3) * w), int((0.3 + 0.14 * buttons) * h))
            buttons += 1
        elif kind == "hooks":
            _hooks(layers, side, int((0.5 + jx) * w), int((0.62 + jy) * h))
        elif kind == "necklace":
            _necklace(layers, g, side)
        elif kind == "clip":
            _hair_clip(layers, side, int((0.25 + jx) * w), int((0.03 + abs(jy)) * h), 0.3 + jx * 10)
        else:
            _earring(layers, side, int((0.2 + jx) * w), int((0.1 + jy) * h))
    return layers


@register_kernel("xray_foreign_objects", sampler=_level_sampler)
def xray_foreign_objects(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Radiopaque objects on the patient (see ``objects_map``).

    Kornia: own kernel: no Kornia equivalent (host-drawn attenuation canvases added to the
    display value)."""
    h, w = x.shape[-2:]
    return backend.by_path(
        x,
        host=lambda: _add_attenuation(
            x,
            [
                objects_map(int(k), h, w, round(float(p["items"][i])), float(p["opacity"][i]))
                for i, k in enumerate(keys)
            ],
        ),
        device=lambda: _add_layers(x, p, [object_layers(int(k), h, w, ITEMS) for k in keys]),
    )


def _fold_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "density": draw(rng_, level["density"]),
        "position": draw(rng_, level["position"]),
        "curvature": draw(rng_, level["curvature"]),
        "right_side": float(rng_.random() < 0.5),
    }


def fold_attenuation(
    h: int, w: int, p: dict[str, torch.Tensor], i: int, device: torch.device
) -> torch.Tensor:
    """Display-unit attenuation (1,1,H,W float64) of one sample's skin fold. The edge runs down
    the lateral lung at ``position`` (fraction of the width from the film's side) bowing
    outwards by ``curvature`` at mid-height; on its lateral side the added density is
    ``density exp(-d / (0.04 side))`` at distance ``d`` from the edge (one-pixel anti-aliased
    edge), tapered to zero at 15 % and 85 % of the height."""
    side = min(h, w)
    ys = (torch.arange(h, device=device, dtype=torch.float64) + 0.5).view(1, 1, h, 1)
    xs = (torch.arange(w, device=device, dtype=torch.float64) + 0.5).view(1, 1, 1, w)
    t = ys / h
    edge = (
        float(p["position"][i]) + float(p["curvature"][i]) * (1.0 - ((t - 0.5) / 0.35) ** 2)
    ) * w
    right = float(p["right_side"][i]) > 0.5
    d = (xs - (w - edge)) if right else (edge - xs)  # distance beyond the edge, towards the side
    inside = (d + 0.5).clamp(0.0, 1.0)
    taper = torch.sin(((t - 0.15) / 0.7).clamp(0.0, 1.0) * math.pi).clamp(min=0.0)
    return float(p["density"][i]) * inside * torch.exp(-d.clamp(min=0.0) / (0.04 * side)) * taper


def fold_attenuations(
    h: int, w: int, p: dict[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """``fold_attenuation`` of every sample at once, (B,1,H,W) float64: the same formula with
    the parameters as (B,1,1,1) tensors (side chosen per sample by ``right_side``)."""
    side = min(h, w)
    ys = (torch.arange(h, device=device, dtype=torch.float64) + 0.5).view(1, 1, h, 1)
    xs = (torch.arange(w, device=device, dtype=torch.float64) + 0.5).view(1, 1, 1, w)
    t = ys / h
    position = per_sample(p["position"].double())
    curvature = per_sample(p["curvature"].double())
    edge = (position + curvature * (1.0 - ((t - 0.5) / 0.35) ** 2)) * w
    right = per_sample(p["right_side"]) > 0.5
    d = torch.where(right, xs - (w - edge), edge - xs)
    inside = (d + 0.5).clamp(0.0, 1.0)
    taper = torch.sin(((t - 0.15) / 0.7).clamp(0.0, 1.0) * math.pi).clamp(min=0.0)
    density = per_sample(p["density"].double())
    return density * inside * torch.exp(-d.clamp(min=0.0) / (0.04 * side)) * taper


@register_kernel("xray_skin_fold", sampler=_fold_sampler)
def xray_skin_fold(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """A skin fold as added attenuation with a sharp edge (see ``fold_attenuation``).

    Kornia: own kernel: no Kornia equivalent (an analytic attenuation edge added to the display
    value)."""
    h, w = x.shape[-2:]
    return backend.by_path(
        x,
        host=lambda: torch.cat(
            [
                (_wide(x[i : i + 1]) + fold_attenuation(h, w, p, i, x.device))
                .clamp_(0.0, 1.0)
                .to(x.dtype)
                for i in range(x.shape[0])
            ]
        ),
        device=lambda: (
            (_wide(x) + fold_attenuations(h, w, p, x.device)).clamp_(0.0, 1.0).to(x.dtype)
        ),
    )
