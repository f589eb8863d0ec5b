"""What lies on or in the patient and attenuates the beam: devices, foreign objects, skin folds.

Attenuating objects add to the display value (``v + mu t / MU``: the Beer-Lambert attenuation
of an object is a factor on the fluence ``I``, a shift in ``v``; perturb.ops.radiometry).
Positions are fractions of the film (chest films are centred on the thorax by positioning),
sizes fractions of the shorter side. Device appearance after Hunter et al., "Medical devices on
chest radiographs", RadioGraphics 24 (2004).

* ``xray_support_devices``: ECG electrodes and leads, central venous catheter, endotracheal and
  nasogastric tubes, pacemaker with its lead, drawn as attenuating objects with their real
  radiodensity and placed on the film's own anatomy (``perturb.ops.landmarks``: midline, lungs,
  apex, domes, the body outline and skin sites inside it). Beer-Lambert in the linear domain:
  behind an object of attenuation ``mu t`` the fluence is ``I exp(-mu t)``, i.e. ``v + a`` with
  ``a = mu t / MU`` (perturb.ops.radiometry), and the quanta fall by the same factor, so the
  film's noise grows by ``exp(MU a / 2)`` there; the detector's unsharpness blurs the edges.
  Plastic tubes are radiolucent walls seen tangentially with a barium stripe (ET tube tip
  3-7 cm above the carina, here 4.5 cm; NG tube down the oesophagus, through the hiatus left of
  the midline, into the gastric fundus); a central line is a thin catheter with a radiopaque
  core from the right internal jugular or subclavian vein to the lower SVC, right of the spine
  and above the right atrium; a pacemaker generator is a titanium can with its battery, hybrid
  circuit and capacitor, and an epoxy header with a dense connector block, in a pectoral
  pocket, its lead through the subclavian vein, SVC and tricuspid valve to the RV apex; ECG
  electrodes are foam pads with a faint silver-chloride eyelet ring round the snap stud (a
  hollow brass post whose projected path length is ray-marched: densest at its rim), under
  the lead's own snap, a spring clip, a push-on cup or a lead clip (a moulded housing of
  rounded section round a brass socket ring, a stamped steel lever bent in 3D over it, a
  torsion coil), or tabs under an alligator clip, seen at a tilt,
  their leads (a cylinder's chord: a stranded copper conductor in a PVC sheath, or a braided
  shield seen tangentially as two bright margins round a thinner core, varying in density as
  the cable rolls) hanging in gravity's slack curves, sometimes in a loop, most running to
  the monitor's side and leaving the film near one height, so they cross the chest and
  gather in a loose bundle. Plastic is barely denser than soft tissue; the display curve
  shoulders dense metal towards the film's brightest structures (``place_devices``, its
  0.999 quantile, at least ``DEVICE_MIN_ROOM`` above the film: a small dense object keeps
  its own contrast over bright regions; clip metal may reach the brightness of dense bone). Sources: Hunter et al., "Medical devices on chest
  radiographs", RadioGraphics 24 (2004); Godoy et al., "Chest radiography in the ICU: Part 2,
  evaluation of cardiovascular lines and other devices", AJR 198 (2012); Goodman et al.,
  "Radiographic evaluation of endotracheal tube position", AJR 127 (1976); Bushberg et al.,
  The Essential Physics of Medical Imaging, 3rd ed., ch. 7 (unsharpness) and 10 (quantum
  noise).
* ``xray_foreign_objects``: radiopaque things on the patient, each the projected thickness of
  its 3D metal shape (round wires: the chord ``2 sqrt(r^2 - d^2)``; flat plates: thickness
  over the cosine of their tilt) at ``STEEL_MU``, turned by keyed 3D angles: a cable chain
  necklace (links alternating face-on and edge-on along a sagging catenary) with a pendant or
  its clasp (a pendant cast in relief, never a flat disc), a bra's closure (bowed, unevenly
  pulled rows of wire eyes with stamped sheet hooks engaged), its strap slider (a figure-8
  of flat band seen in perspective) and underwire, snaps and buttons of several designs, a
  bobby pin, an earring; placed on the found anatomy and blurred and noised like the devices.
* ``xray_skin_fold``: a fold of skin trapped between the patient's back and the detector (supine
  and portable films): the doubled skin adds attenuation that ends in a sharp curvilinear edge
  over the lateral lung and fades away from it, the classic pneumothorax mimic (lung markings
  continue across it).

Devices and foreign objects are drawn with OpenCV's anti-aliased primitives and analytic wire
profiles; their canvases depend on the key alone, so they are drawn on the host from the
(host-side) keys and selected
and scaled on the device by the ``items`` and ``opacity`` tensors. Devices are drawn in a
canonical frame and moved onto each film's anatomy on the device, found there in one batched
pass (``chest_landmarks``, ``skin_sites``): per-sample translations for the electrodes and the
generator, stretches for the leads, one thin-plate-spline warp for the lines and tubes (one
``grid_sample`` per moved canvas for the whole batch; the CPU path runs the same code one film
at a time). Modality is catalog data, not this module's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops import backend, keyed_fields
from perturb.ops._math import per_sample
from perturb.ops.kernels import Level, Params, draw, draw_int, register_kernel
from perturb.ops.landmarks import (
    CANONICAL,
    CANONICAL_SITES,
    LANDMARK_GRID,
    chest_landmarks,
    gastric_bubble,
    skin_sites,
)
from perturb.ops.radiometry import FIELD_CM, MU, _wide

ITEMS = 8  # the most devices / foreign objects a film gets (the catalog's bound on ``items``)


def _curve(points: np.ndarray, n: int = 48) -> np.ndarray:
    """A smooth polyline (Catmull-Rom through ``points``, (k, 2) float) as int32 (n, 1, 2)."""
    pts = np.asarray(points, dtype=np.float64)
    if len(pts) < 3:
        return np.round(pts).astype(np.int32).reshape(-1, 1, 2)
    padded = np.vstack([pts[0], pts, pts[-1]])
    t = np.linspace(0.0, 1.0, max(2, n // (len(pts) - 1)), endpoint=False)[None, :, None]
    t2, t3 = t * t, t * t * t
    p0, p1, p2, p3 = (padded[k : k + len(pts) - 1, None, :] for k in range(4))
    out = 0.5 * (
        2 * p1
        + (-p0 + p2) * t
        + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t2
        + (-p0 + 3 * p1 - 3 * p2 + p3) * t3
    )
    out = np.vstack([out.reshape(-1, 2), pts[-1:]])
    return np.round(out).astype(np.int32).reshape(-1, 1, 2)


def _level_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"items": draw_int(rng_, level["items"]), "opacity": draw(rng_, level["opacity"])}


LUNG_CM = 24.0  # apex to dome of an adult lung, the scale of the device offsets


def device_anchors(
    lm: torch.Tensor,
    sites: torch.Tensor,
    bubble: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Where the devices go, (B, 2) (x, y) fractions of the film, from (B, 10) landmarks
    (``chest_landmarks``) and (B, 6, 2) skin sites (``skin_sites``):

    * ``ecg0``-``ecg3``: the ECG electrodes on the skin inside the body outline;
    * ``carina`` 38 % of the way from the apex to the domes on the midline; ``et_tip`` the
      endotracheal tube tip 4.5 cm above it (adult target 3-7 cm; the lung height is
      ``LUNG_CM``); ``trachea`` the cervical trachea 1.5 cm below the apex;
    * ``cvc_tip`` the central line tip in the lower SVC, 2 cm below the carina, a quarter of
      the way from the midline to the right lung's centre (image left: the SVC runs along the
      right mediastinal border, right of the spine), above the right atrium;
    * ``ng_tip`` the nasogastric tube tip in the stomach under the left (image-right)
      dome, 5 cm below it, halfway from the midline to the left lung's centre, or, where
      ``bubble`` ((B, 2) places, (B,) seen: ``gastric_bubble``) saw the gastric gas bubble,
      in it (a white lung base can hide the dome, not the fundus below it); ``hiatus``
      the oesophageal hiatus 2 cm left of the midline at the dome level;
    * ``pocket_left`` / ``pocket_right`` the pacemaker pockets (pectoral, below the lateral
      clavicle, inside the body); ``rv_apex`` the right-ventricular apex: the lower cardiac
      silhouette, a third of the way from the midline to the left lung, 2 cm above the dome;
    * ``top`` the midline at the film's top edge, ``heart`` the centre of the cardiac
      silhouette, ``lung_left`` / ``lung_right`` the lung centres, ``dome_left`` /
      ``dome_right`` the domes (control points of the warp that carries the lines);
    * for the foreign objects: ``bra_band`` a bra's back closure on the midline 80 % of the
      way from the carina to the domes, ``strap_left`` / ``strap_right`` its straps over the
      shoulders above the lung centres, 1 cm below the apex."""
    mid, left, right = lm[:, 0], lm[:, 1], lm[:, 2]
    apex, dome_l, dome_r = lm[:, 3], lm[:, 4], lm[:, 5]
    dome = (dome_l + dome_r) / 2.0
    cm = (dome - apex) / LUNG_CM
    carina = apex + 0.38 * (dome - apex)

    def xy(px: torch.Tensor, py: torch.Tensor) -> torch.Tensor:
        return torch.stack([px, py], dim=1)

    ng_tip = xy(mid + 0.5 * (right - mid), dome_r + 5.0 * cm)
    if bubble is not None:
        ng_tip = torch.where(bubble[1].view(-1, 1), bubble[0].to(ng_tip.dtype), ng_tip)

    found = {f"ecg{i}": sites[:, i] for i in range(4)}
    found.update(
        {
            "pocket_left": sites[:, 4],
            "pocket_right": sites[:, 5],
            "top": xy(mid, torch.zeros_like(mid)),
            "trachea": xy(mid, apex + 1.5 * cm),
            "carina": xy(mid, carina),
            "et_tip": xy(mid, carina - 4.5 * cm),
            "cvc_tip": xy(mid - 0.25 * (mid - left), carina + 2.0 * cm),
            "heart": xy(mid + 0.15 * (right - mid), dome - 6.0 * cm),
            "rv_apex": xy(mid + 0.33 * (right - mid), dome_r - 2.0 * cm),
            "hiatus": xy(mid + 0.1 * (right - mid), dome_r),
            "ng_tip": ng_tip,
            "lung_left": xy(left, (apex + dome_l) / 2.0),
            "lung_right": xy(right, (apex + dome_r) / 2.0),
            "dome_left": xy(left, dome_l),
            "dome_right": xy(right, dome_r),
            "bra_band": xy(mid, carina + 0.8 * (dome - carina)),
            "strap_left": xy(left, apex + 1.0 * cm),
            "strap_right": xy(right, apex + 1.0 * cm),
        }
    )
    return found


def _canonical_anchors() -> dict[str, tuple[float, float]]:
    lm = torch.tensor([CANONICAL], dtype=torch.float64)
    sites = torch.tensor([CANONICAL_SITES], dtype=torch.float64)
    return {n: (float(v[0, 0]), float(v[0, 1])) for n, v in device_anchors(lm, sites).items()}


_CANONICAL_ANCHORS = _canonical_anchors()

# the control points of the warp that carries the lines and tubes from the canonical film
# onto each film's anatomy (thin-plate spline through these anchors; ``pocket`` is the
# pacemaker's own pocket, left or right)
WARP_POINTS = (
    "top",
    "trachea",
    "et_tip",
    "carina",
    "cvc_tip",
    "heart",
    "rv_apex",
    "hiatus",
    "ng_tip",
    "pocket",
)


class _Placed:
    """One film's devices drawn in the canonical frame: uint8 canvases (255 = the canvas's
    densest attenuation ``scale``, display units at opacity 1), each with its item and its
    placement ``(kind, anchor)``: ``move`` (translated with its anchor: an electrode, the
    generator), ``left``/``right`` (stretched from that film edge to its anchor and moved
    down with it: a lead wire running off the body), ``warp`` (carried by the anatomical
    warp: lines and tubes). ``pocket`` names the pacemaker's side; ``placed`` says, per item,
    which device went where (the record's account for device-presence questions)."""

    def __init__(self, h: int, w: int) -> None:
        self.shape = (h, w)
        self.canvases: list[np.ndarray] = []
        self.items: list[int] = []
        self.scales: list[float] = []
        self.placements: list[tuple[str, str]] = []
        self.pocket = "pocket_right"
        self.choices: dict[str, str] = {}  # a side-chosen anchor (``SIDED``) -> this film's
        self.placed: list[str] = []

    def add(self, item: int, attenuation: np.ndarray, placement: tuple[str, str]) -> None:
        scale = float(attenuation.max())
        canvas = np.zeros(self.shape, np.uint8)
        if scale > 0:
            canvas = np.round(attenuation * (255.0 / scale)).astype(np.uint8)
        self.canvases.append(canvas)
        self.items.append(item)
        self.scales.append(scale)
        self.placements.append(placement)


# anchors whose side each film chooses (its ``_Placed.choices``): the name a canvas is placed
# by and the concrete anchors it may stand for
SIDED = {"strap": ("strap_left", "strap_right"), "breast": ("dome_left", "dome_right")}


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


def _meander(curve: np.ndarray, g: np.random.Generator, px: float, amp: float) -> np.ndarray:
    """The curve moved sideways by a keyed slow meander (two incommensurate waves of 5-13 cm,
    up to ``amp`` cm together, vanishing at both ends): a flexible tube lying in the anatomy
    (the oesophagus' own deviations, the slack of a tube between its fixed points)."""
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(curve, axis=0), axis=1))])
    u = arc / max(float(arc[-1]), 1e-9)
    shift = np.zeros(len(curve))
    for weight in g.dirichlet([2.0, 2.0]):
        period = g.uniform(5.0, 13.0) * px
        shift += weight * np.sin(2 * math.pi * arc / period + g.uniform(0, 2 * math.pi))
    shift *= g.uniform(0.5, 1.0) * amp * px * np.sin(math.pi * u)  # the ends stay put
    tangent = np.gradient(curve, axis=0)
    tangent /= np.maximum(np.linalg.norm(tangent, axis=1, keepdims=True), 1e-9)
    return curve + shift[:, None] * np.stack([-tangent[:, 1], tangent[:, 0]], axis=1)


def _stroke(target: np.ndarray, curve: np.ndarray, width: float, value: float) -> None:
    """Add ``value`` along an anti-aliased polyline of ``width`` pixels (sub-pixel widths as
    a one-pixel line of proportionally lower value: the same line integral)."""
    canvas = np.zeros(target.shape, np.uint8)
    pts = np.round(curve * 4).astype(np.int32).reshape(-1, 1, 2)
    cv2.polylines(canvas, [pts], False, 255, max(1, round(width)), cv2.LINE_AA, shift=2)
    value *= min(1.0, width)
    target += canvas.astype(np.float32) * np.float32(value / 255.0)


def _poly(target: np.ndarray, points: np.ndarray, value: float, thickness: int = -1) -> None:
    """Add ``value`` inside (or, ``thickness`` >= 1, along the outline of) a polygon (pixels,
    quarter-pixel precision, anti-aliased)."""
    canvas = np.zeros(target.shape, np.uint8)
    pts = np.round(points * 4).astype(np.int32).reshape(-1, 1, 2)
    if thickness < 0:
        cv2.fillPoly(canvas, [pts], 255, cv2.LINE_AA, shift=2)
    else:
        cv2.polylines(canvas, [pts], True, 255, thickness, cv2.LINE_AA, shift=2)
    target += canvas.astype(np.float32) * np.float32(value / 255.0)


def _ellipse(cx: float, cy: float, a: float, b: float, angle: float, n: int = 48) -> np.ndarray:
    """Points of an ellipse (pixels): semi-axes ``a``, ``b``, rotated by ``angle`` (radians)."""
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    x, y = a * np.cos(t), b * np.sin(t)
    c, s = math.cos(angle), math.sin(angle)
    return np.stack([cx + c * x - s * y, cy + s * x + c * y], axis=1)


def _tube(
    target: np.ndarray,
    curve: np.ndarray,
    outer: float,
    wall: float,
    stripe: float,
    px: float,
    stripe_side: float = -1.0,
) -> None:
    """A plastic tube seen from the side: the walls seen tangentially at its edges (``wall``
    over a 0.6 mm band each) around a nearly radiolucent lumen (the plastic crossed twice,
    a quarter of that), and the radiopaque (barium) line along ONE side (``stripe``, 0.8 mm,
    on the ``stripe_side`` (-1 or +1) of the curve's normal, next to that wall); ``outer``
    the outer diameter in pixels, ``px`` pixels per cm."""
    wall_px = max(1.0, 0.06 * px)
    for side in (-1.0, 1.0):
        _stroke(target, _offset(curve, side * (outer - wall_px) / 2.0), wall_px, wall)
    _stroke(target, curve, max(1.0, outer - 2 * wall_px), wall * 0.25)
    stripe_at = stripe_side * max(0.0, outer / 2.0 - wall_px - 0.04 * px)
    _stroke(target, _offset(curve, stripe_at), max(1.0, 0.08 * px), stripe)


def _lead_path(
    g: np.random.Generator,
    start: np.ndarray,
    edge_x: float,
    exit_y: float,
    h: int,
    w: int,
    px: float,
) -> np.ndarray:
    """A lead wire's course (pixels) from ``start`` to the film edge at ``edge_x``, leaving
    it near ``exit_y`` (the leads of one monitor cable gather towards one place, so they run
    alongside and across each other as a loose bundle): a flexible cable hanging under
    gravity between the connector and where it leaves the body, a catenary-like sag
    downwards (1-6 cm) with an irregular keyed wander (+-3.5 mm at unevenly spaced points),
    one or two gentle kinks (where the cable was bent and has set: 4-9 mm bends spread
    over neighbouring points) and, on a third of leads, a slack loop (3-7 cm across, an
    uneven turn of cable lying on the patient, closed or open) part way along."""
    direction = 1.0 if edge_x > start[0] else -1.0
    end = np.array([edge_x + direction * 0.05 * w, exit_y + g.uniform(-0.03, 0.03) * h])
    sag = g.uniform(1.0, 6.0) * px
    t = np.linspace(0.0, 1.0, 10)
    t[1:-1] += g.uniform(-0.02, 0.02, size=8)
    chord = start[None] + t[:, None] * (end - start)[None]
    wander = np.zeros((len(t), 2))
    wander[:, 1] = g.uniform(-0.35, 0.35, size=len(t)) * px
    for k in g.choice(np.arange(3, len(t) - 2), size=int(g.integers(1, 3)), replace=False):
        bend = g.choice([-1.0, 1.0]) * g.uniform(0.4, 0.9) * px  # a set bend, over 3 points
        wander[k - 1 : k + 2, 1] += bend * np.array([0.45, 1.0, 0.45])
    wander[0] = 0.0
    points = chord + wander
    points[:, 1] += sag * np.sin(math.pi * t)  # y down: gravity pulls the middle lower
    leave = start + np.array([direction * 0.6 * px, g.uniform(-0.2, 0.4) * px])
    course = [start, leave, *points[2:]]
    if g.random() < 0.35:  # a slack loop: the cable turns once round on itself
        k = int(g.integers(3, 7))
        at = points[k]
        heading = points[k + 1] - points[k - 1]
        heading /= max(float(np.linalg.norm(heading)), 1e-9)
        r_loop = g.uniform(1.5, 3.5) * px
        hand = float(g.choice([-1.0, 1.0]))
        normal = hand * np.array([-heading[1], heading[0]])
        centre = at + normal * r_loop
        phase = math.atan2(at[1] - centre[1], at[0] - centre[0])
        spin = np.linspace(0.0, 2 * math.pi * g.uniform(0.85, 1.1), 9)[1:]
        radius = r_loop * (1.0 + g.uniform(-0.2, 0.2, size=len(spin)))
        turn = centre + np.stack(
            [radius * np.cos(phase - hand * spin), radius * np.sin(phase - hand * spin)], 1
        )
        turn += heading * np.linspace(0.0, 1.0, len(spin))[:, None] * g.uniform(0.5, 1.5) * px
        course = [start, leave, *points[2 : k + 1], *turn, *points[k + 1 :]]
    return _dense_curve(np.array(course))


def _arc_map(shape: tuple[int, int], curve: np.ndarray, width: float) -> np.ndarray:
    """Each pixel within ``width`` pixels of ``curve`` labelled with the arc length (pixels)
    of its nearest-drawn segment (float32; where the curve crosses itself, the later one)."""
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(curve, axis=0), axis=1))])
    label = np.zeros(shape, np.float32)
    thick = max(1, math.ceil(width))
    pts = np.round(curve * 4).astype(np.int32)
    for k in range(len(curve) - 1):
        a, b = pts[k], pts[k + 1]
        value = float(0.5 * (arc[k] + arc[k + 1]))
        cv2.line(label, (int(a[0]), int(a[1])), (int(b[0]), int(b[1])), value, thick, 8, 2)
    return label


def _lead_wire(target: np.ndarray, g: np.random.Generator, curve: np.ndarray, px: float) -> None:
    """An ECG or monitoring lead along ``curve`` (pixels), its projected metal a cylinder's
    chord (``_wire``: densest along the axis, falling to nothing at the edge, blurred later
    by the detector). Two constructions: a plain lead, a stranded copper conductor (0.6-1 mm
    bundle, about half of it metal) in a PVC sheath (2-2.8 mm, barely denser than soft
    tissue); or (40 %) a shielded lead, a braided copper shield (a sparse tube of 1.6-2.4
    mm, 0.1-0.2 mm of metal, seen tangentially at its edges: two bright margins round a
    fainter middle, a "tramline") round a thin (0.25-0.4 mm) conductor. The strands are laid helically and the sheath
    is ridged, so the projected density ripples along the cable at the lay's pitch
    (2.5-4.5 mm, +-30 %), and the cable rolls, so it also varies slowly (period 3-8 cm,
    +-25 %): both as functions of the arc length. Sometimes (60 %) the lead's inline
    connector (a moulded plastic body, 1.2-2 cm, round a brass pin and socket) lies on the
    film part way along."""
    copper = 0.5 * STEEL_MU / MU  # display units per cm of stranded copper (half metal)
    wire = np.zeros(target.shape, np.float32)
    sheath = g.uniform(0.1, 0.14)  # cm, outer radius
    if g.random() < 0.4:
        outer = sheath - 0.02
        inner = outer - g.uniform(0.012, 0.02)  # the braid's metal-equivalent wall
        _wire(wire, curve, outer * px, 2 * outer * copper * 0.8)
        _wire(wire, curve, inner * px, -2 * inner * copper * 0.8)
        core = g.uniform(0.012, 0.02)  # a thin conductor inside the shield
    else:
        core = g.uniform(0.03, 0.05)
    _wire(wire, curve, core * px, 2 * core * copper)
    _wire(wire, curve, sheath * px, 2 * sheath * g.uniform(0.04, 0.07))  # PVC
    np.maximum(wire, 0.0, out=wire)  # a sub-pixel braid's partial volume never goes negative
    ys, xs = np.nonzero(wire)
    along = _arc_map(target.shape, curve, sheath * px + 2.0)[ys, xs]
    lay = g.uniform(0.25, 0.45) * px
    roll = g.uniform(3.0, 8.0) * px
    phase = g.uniform(0, 2 * math.pi, size=2)
    ripple = (1.0 + 0.3 * np.sin(2 * math.pi * along / lay + phase[0])) * (
        1.0 + 0.25 * np.sin(2 * math.pi * along / roll + phase[1])
    )
    target[ys, xs] += wire[ys, xs] * ripple.astype(np.float32)
    if g.random() < 0.6:
        arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(curve, axis=0), axis=1))])
        at = int(np.searchsorted(arc, g.uniform(0.3, 0.7) * arc[-1]))
        at = min(max(at, 1), len(curve) - 2)
        tangent = curve[at + 1] - curve[at - 1]
        tangent /= max(float(np.linalg.norm(tangent)), 1e-9)
        normal = np.array([-tangent[1], tangent[0]])
        length, half = g.uniform(1.2, 2.0) * px, g.uniform(0.22, 0.32) * px
        body = np.array(
            [
                curve[at] + s * 0.5 * length * tangent + n * half * normal
                for s, n in ((-1, -1), (1, -1), (1, 1), (-1, 1))
            ]
        )
        _poly(target, body, g.uniform(0.015, 0.025))  # the moulded body, sharp-edged
        pin = np.array([curve[at] - 0.3 * length * tangent, curve[at] + 0.25 * length * tangent])
        _stroke(target, pin, max(1.0, 0.1 * px), g.uniform(0.06, 0.1))  # the brass pin
        socket = pin[1] + np.array([0.0 * tangent, 0.15 * length * tangent])
        _stroke(target, socket, max(1.0, 0.2 * px), g.uniform(0.04, 0.07))  # its socket


def _electrode(
    layers: _Placed,
    g: np.random.Generator,
    item: int,
    anchor: str,
    px: float,
    lead_side: str,
    exit_y: float,
) -> None:
    """An ECG electrode and its lead, seen at a keyed tilt (a circle seen obliquely is an
    ellipse, axis ratio 0.55-1). Every snap electrode is a foam pad (barely denser than the
    soft tissue under it) holding a gel disc and the sensor: a silver/silver-chloride coated
    eyelet around the snap stud, seen as a faint grey annulus with a lucent centre; the metal
    is thin, so it is grey, never white. On it, one of five connectors:

    * none visible: the lead's small snap socket over the stud (the commonest look: a faint
      ring and a thin lead);
    * a spring clip: two thin steel jaws over the stud, a hinge pin, a plastic body;
    * a push-on cup (``_push_cup``): a drawn-steel shell with a rolled lip, ray-marched at
      the tilt: densest where its wall is seen tangentially;
    * a lead clip (``_lead_clip``): a moulded housing round a brass socket ring and a
      stamped spring-steel lever bent in 3D over it (``_ribbon``), mirrored at random;
    * a tab electrode (a faint rectangle) under an alligator clip with a row of teeth.

    The lead (``_lead_wire``) leaves the connector and hangs to the film edge on
    ``lead_side`` (the monitor's side, or its own), leaving it near ``exit_y``
    (``_lead_path``); its canvas starts under the connector so the stretch that keeps it
    reaching the edge keeps it joined."""
    h, w = layers.shape
    cx, cy = _px(_CANONICAL_ANCHORS[anchor], w, h)
    kind = int(g.choice(5, p=[0.1, 0.1, 0.1, 0.55, 0.15]))
    tilt = g.uniform(0.55, 1.0)
    angle = g.uniform(0, math.pi)
    lead_angle = (math.pi if lead_side == "left" else 0.0) + g.uniform(-0.9, 0.9)
    body = np.zeros((h, w), np.float32)
    along = np.array([math.cos(lead_angle), math.sin(lead_angle)])
    across = np.array([-along[1], along[0]])
    centre = np.array([cx, cy])
    if kind != 4:
        r_pad = g.uniform(1.7, 2.2) * px
        pad = _ellipse(cx, cy, r_pad, r_pad * tilt, angle)
        _poly(body, pad, g.uniform(0.002, 0.005))  # foam and gel: no edge of their own
        _snap_stud(body, g, centre, px, tilt, angle)
    else:
        half = np.array([g.uniform(1.0, 1.3), g.uniform(1.4, 1.8)]) * px
        rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * half * [1.0, tilt]
        _poly(body, centre + corners @ rot.T, g.uniform(0.002, 0.005))  # the tab: no outline
    if kind == 0:  # the lead's own small snap socket over the stud
        exit_point = centre + along * g.uniform(0.2, 0.5) * px
        _stroke(body, np.array([centre, exit_point]), 0.3 * px, g.uniform(0.01, 0.02))
    elif kind == 1:  # spring clip: jaws over the stud, hinge, plastic body
        length = g.uniform(1.6, 2.2) * px
        jaw = 0.28 * px
        for side in (-1.0, 1.0):
            a = centre + across * side * jaw - along * 0.3 * px
            b = centre + across * side * jaw * 0.6 + along * 0.6 * length
            _stroke(body, np.array([a, b]), max(1.0, 0.12 * px), g.uniform(0.05, 0.09))
        hinge = centre + along * 0.6 * length
        _poly(body, _ellipse(hinge[0], hinge[1], 0.2 * px, 0.2 * px * tilt, angle), 0.08)
        grip = np.array(
            [
                hinge + across * 0.45 * px,
                hinge + along * 0.4 * length + across * 0.3 * px,
                hinge + along * 0.4 * length - across * 0.3 * px,
                hinge - across * 0.45 * px,
            ]
        )
        _poly(body, grip, 0.02)  # the clip's plastic body
        exit_point = hinge + along * 0.4 * length
    elif kind == 2:  # push-on cup over the stud
        r_cup = g.uniform(0.5, 0.65) * px
        _push_cup(body, g, centre, r_cup / px, tilt, angle, px)
        sleeve = centre + along * r_cup
        exit_point = centre + along * (r_cup + 0.9 * px)
        _stroke(body, np.array([sleeve, exit_point]), 0.35 * px, 0.025)  # strain relief
    elif kind == 3:
        exit_point = _lead_clip(body, g, centre, along, across, px)
    else:  # alligator clip on the tab's edge, its teeth in a row
        mouth = centre + along * 0.8 * px
        tip = mouth - along * 0.9 * px
        for side in (-1.0, 1.0):
            bar = np.array([tip + across * side * 0.12 * px, mouth + across * side * 0.35 * px])
            _stroke(body, bar, max(1.0, 0.14 * px), g.uniform(0.06, 0.1))
        for t in np.linspace(0.15, 0.85, int(g.integers(3, 7))):
            tooth = tip + (mouth - tip) * t
            _stroke(
                body, np.array([tooth - across * 0.2 * px, tooth + across * 0.2 * px]), 1.0, 0.03
            )
        back = mouth + along * g.uniform(1.4, 1.9) * px
        lever = g.uniform(0.04, 0.07)  # the stamped steel levers (two sheets, face-on)
        spread = g.uniform(0.25, 0.35) * px * tilt
        plate = np.array(
            [
                mouth + across * 0.3 * px,
                back + across * spread,
                back - across * spread,
                mouth - across * 0.3 * px,
            ]
        )
        _poly(body, plate, lever)  # sharp-edged: drawn like the wire, blurred only by the film
        for t in sorted(g.uniform(0.35, 0.85, size=int(g.integers(1, 3)))):  # punched holes
            hole = mouth + (back - mouth) * t
            r_hole = g.uniform(0.08, 0.14) * px
            _poly(body, _ellipse(hole[0], hole[1], r_hole, r_hole * tilt, angle, 16), -0.9 * lever)
        pivot = mouth + along * 0.3 * px
        coil = int(g.integers(3, 6))  # the torsion spring's turns, seen side-on
        for k in range(coil):
            at = pivot + along * (k - (coil - 1) / 2) * 0.07 * px
            _wire(
                body,
                np.array([at - across * 0.35 * px, at + across * 0.35 * px]),
                0.03 * px,
                0.5 * lever,
            )
        exit_point = back
    layers.add(item, body, ("move", anchor))
    lead = np.zeros((h, w), np.float32)
    edge_x = 0.0 if lead_side == "left" else float(w)
    curve = _lead_path(g, exit_point, edge_x, exit_y, h, w, px)
    curve = np.vstack([centre, curve])  # from under the connector: stays joined when stretched
    _lead_wire(lead, g, curve, px)
    layers.add(item, lead, (lead_side, anchor))


def _push_cup(
    body: np.ndarray,
    g: np.random.Generator,
    centre: np.ndarray,
    radius: float,
    tilt: float,
    angle: float,
    px: float,
) -> None:
    """A push-on lead cup over the stud (``radius`` cm), seen at the electrode's tilt: a
    drawn-steel shell (wall 0.3-0.5 mm, 2.5-4 mm deep, closed top) with a rolled lip at
    its open end, its projected path length ray-marched (``_march``): face-on a dense ring
    where the beam runs down the wall round the faint top; tilted, a rim densest where the
    wall is seen tangentially, the lip off the top's centre along the minor axis."""
    height = g.uniform(0.25, 0.4)
    wall = g.uniform(0.03, 0.05)
    lip = g.uniform(0.04, 0.06)
    rot = _tilt_rotation(tilt, angle, float(g.choice([-1.0, 1.0])))

    def inside(p: np.ndarray) -> np.ndarray:
        rho = np.hypot(p[..., 0], p[..., 1])
        z = p[..., 2]
        shell = (rho <= radius) & (z >= 0.0) & (z <= height)
        shell &= (rho >= radius - wall) | (z >= height - wall)
        rolled = np.hypot(rho - radius, z - lip) <= lip
        return shell | rolled

    steel = g.uniform(0.5, 0.7) * STEEL_MU / MU
    _march(body, inside, centre, radius + height + 2 * lip, rot, px, steel)


def _snap_stud(
    body: np.ndarray,
    g: np.random.Generator,
    centre: np.ndarray,
    px: float,
    tilt: float,
    angle: float,
) -> None:
    """An ECG electrode's sensor seen at a tilt (``tilt`` the cosine, ``angle`` the ellipse's
    major axis): a faint pressed silver-chloride flange (1-1.3 cm, thin sheet, its rolled rim
    a little denser on one keyed side) under the snap stud, a hollow drawn-brass post (neck
    3-4 mm, a head up to 0.6 mm wider, 2-3.5 mm high, wall 0.4-0.7 mm, closed cap), the
    densest part of the electrode: its projected thickness is ray-marched (``_march``) at the
    electrode's tilt, so face-on it is a dense ring (the wall seen along its height) round a
    faint centre (the cap alone), and tilted its top moves off the base along the minor axis
    by ``height sin(tilt)``, its near and far walls densest: a round metal button with a
    density gradient, off the flange's centre (never concentric drawn rings)."""
    minor = np.array([-math.sin(angle), math.cos(angle)])
    r_flange = g.uniform(0.5, 0.65) * px
    flange = _ellipse(centre[0], centre[1], r_flange, r_flange * tilt, angle, 40)
    sheet = g.uniform(0.012, 0.025)
    _poly(body, flange, sheet)
    rim = np.roll(flange, int(g.integers(0, 40)), axis=0)[: int(g.integers(12, 26))]
    _stroke(body, rim, max(1.0, 0.05 * px), 0.8 * sheet)  # the rolled rim, part way round
    r_neck = g.uniform(0.15, 0.2)
    r_head = r_neck + g.uniform(0.0, 0.03)
    height = g.uniform(0.2, 0.35)
    wall = g.uniform(0.04, 0.07)
    rot = _tilt_rotation(tilt, angle, float(g.choice([-1.0, 1.0])))
    base = centre + minor * g.uniform(-0.08, 0.08) * px

    def inside(p: np.ndarray) -> np.ndarray:
        rho = np.hypot(p[..., 0], p[..., 1])
        z = p[..., 2]
        radius = np.where(z > 0.45 * height, r_head, r_neck)
        solid = (rho <= radius) & (z >= 0.0) & (z <= height)
        return solid & ~((rho < radius - wall) & (z < height - wall))

    brass = g.uniform(0.45, 0.7) * STEEL_MU / MU  # drawn brass, partly hollow in the pressing
    _march(body, inside, base, r_head + height + 0.02, rot, px, brass)


def _tilt_rotation(tilt: float, angle: float, lean: float) -> np.ndarray:
    """The 3D orientation (3 x 3, object to film, z along the beam) of a disc seen as an
    ellipse of axis ratio ``tilt`` whose major axis lies at ``angle`` (radians): a turn by
    ``acos(tilt)`` about the major axis (``lean`` +-1 says which way), then the spin."""
    theta = lean * math.acos(min(1.0, max(0.0, tilt)))
    c, s = math.cos(theta), math.sin(theta)
    about_major = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])
    c, s = math.cos(angle), math.sin(angle)
    spin = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    return spin @ about_major


def _march(
    target: np.ndarray,
    inside: Callable[[np.ndarray], np.ndarray],
    centre: np.ndarray,
    reach: float,
    rot: np.ndarray,
    px: float,
    value: float,
    step: float = 0.008,
) -> None:
    """Add ``value`` times the path length (cm) of the beam through a solid: ``inside`` takes
    object-frame points (..., 3) in cm (``rot`` turns them onto the film, z along the beam)
    and says which lie in the metal; the solid lies within ``reach`` cm of its origin, which
    projects onto ``centre`` (pixels). Rays every half pixel (2 x 2 per pixel, averaged:
    the pixel's partial volume), ``step`` cm apart along the beam: thin walls seen edge-on
    give long paths, face-on only their thickness (a hollow stud is densest at its rim)."""
    h, w = target.shape
    x0, y0 = (np.floor(centre - reach * px) - 1).astype(int)
    x1, y1 = (np.ceil(centre + reach * px) + 2).astype(int)
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    z = np.arange(-reach, reach, step)[None, :]
    sub = np.array([0.25, 0.75])
    for row in range(y0, y1):
        xs = (np.arange(x0, x1)[:, None] + sub[None, :]).ravel()
        total = np.zeros(x1 - x0)
        for dy in sub:
            # each ray's samples start at its own fraction of a step (a fixed additive
            # recurrence over the rays): a wall a few steps thick is not quantised into bands
            start = ((0.7548776662 * xs + 0.5698402910 * (row + dy)) % 1.0)[:, None]
            fx = np.broadcast_to(((xs - centre[0]) / px)[:, None], (len(xs), z.shape[1]))
            fy = np.full_like(fx, (row + dy - centre[1]) / px)
            film = np.stack([fx, fy, z + start * step], axis=-1)
            length = inside(film @ rot).sum(axis=1) * step  # object = rot^T film
            total += length.reshape(x1 - x0, 2).sum(axis=1)
        target[row, x0:x1] += np.float32(value) * (total / 4.0).astype(np.float32)


def _moulded(target: np.ndarray, outline: np.ndarray, value: float, rounding: float) -> None:
    """Add a moulded plastic body's projected thickness (``value`` display units where it is
    thickest) inside ``outline`` (pixels): its edges rounded over ``rounding`` pixels (a
    quarter-ellipse section: the beam crosses less plastic towards the rim), so the body is
    graded, sharp at its outline, never a flat template."""
    h, w = target.shape
    x0, y0 = (np.floor(outline.min(axis=0)) - 2).astype(int)
    x1, y1 = (np.ceil(outline.max(axis=0)) + 2).astype(int)
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    fine = np.zeros((4 * (y1 - y0), 4 * (x1 - x0)), np.uint8)
    pts = np.round((outline - [x0, y0]) * 4 * 4).astype(np.int32).reshape(-1, 1, 2)
    cv2.fillPoly(fine, [pts], 1, cv2.LINE_8, shift=2)
    depth = cv2.distanceTransform(fine, cv2.DIST_L2, 5) / (4.0 * max(rounding, 0.5))
    section = np.sqrt(1.0 - (1.0 - np.clip(depth, 0.0, 1.0)) ** 2) * (fine > 0)
    cells = section.reshape(y1 - y0, 4, x1 - x0, 4).mean(axis=(1, 3))
    target[y0:y1, x0:x1] += np.float32(value) * cells.astype(np.float32)


def _ribbon(
    target: np.ndarray,
    path: np.ndarray,
    normal: np.ndarray,
    width: float,
    thickness: float,
    rot: np.ndarray,
    local: Callable[[np.ndarray], np.ndarray],
    px: float,
    per_cm: float,
) -> None:
    """Add a bent metal strip (``width`` x ``thickness`` cm) along a 3D ``path`` (n, 3, cm,
    the object frame of ``rot``; ``normal`` its face's normal there), projected along the
    beam: each segment its quad (``local`` maps object (u, v) to pixels) at the density of
    the metal crossed, ``per_cm`` times ``thickness / |n_z|`` (face-on the sheet's
    thickness, towards edge-on up to its width). One strip never adds to itself (segments
    taken by their maximum: its bends are continuous); separate strips add where they
    overlap (a fold doubles the metal)."""
    pts = path @ rot.T
    nn = normal @ rot.T
    nn /= np.linalg.norm(nn, axis=1, keepdims=True)
    tangent = np.gradient(pts, axis=0)
    side = np.cross(tangent, nn)
    side /= np.maximum(np.linalg.norm(side, axis=1, keepdims=True), 1e-9)
    half = 0.5 * width * side[:, :2]
    strip = np.zeros(target.shape, np.float32)
    for i in range(len(pts) - 1):
        quad = np.array(
            [
                pts[i, :2] + half[i],
                pts[i + 1, :2] + half[i + 1],
                pts[i + 1, :2] - half[i + 1],
                pts[i, :2] - half[i],
            ]
        )
        crossed = thickness / max(abs(float(nn[i, 2] + nn[i + 1, 2])) / 2, thickness / width)
        seg = np.zeros(target.shape, np.float32)
        _poly(seg, local(quad), per_cm * crossed)
        np.maximum(strip, seg, out=strip)
    target += strip


def _lead_clip(
    body: np.ndarray,
    g: np.random.Generator,
    centre: np.ndarray,
    along: np.ndarray,
    across: np.ndarray,
    px: float,
) -> np.ndarray:
    """A monitoring lead's snap clip over the stud (``body`` pixels), after the common
    designs: a moulded housing (round, heart-shaped or a teardrop narrowing into the cable;
    glass-filled plastic, rounded edges: ``_moulded``) round a brass snap socket (a ring of
    round section, ``_wire``: densest along its middle, its spring finger part way round)
    and a spring-steel wire bail: a round wire bent in an irregular open loop round the
    socket, one end hooked round a hinge pin in a few coil turns, the other bent out as the
    thumb lever at a keyed angle; the cable leaves through a tapering strain relief with a
    crimped ferrule. Mirrored at random (left- and right-handed clips), so the parts overlap
    in graded density, a 3D metal object, not line art. Returns where the lead leaves it."""
    hand = float(g.choice([-1.0, 1.0]))

    def local(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        uv = np.asarray(points, np.float64)
        return centre + (uv[:, :1] * along + hand * uv[:, 1:] * across) * px

    brass = STEEL_MU / MU  # display units per cm of metal
    r = g.uniform(0.55, 0.8)
    t = np.linspace(0, 2 * math.pi, 48, endpoint=False)
    design = int(g.integers(3))
    if design == 0:  # round
        outline = np.stack([r * np.cos(t), r * np.sin(t)], 1)
    elif design == 1:  # heart-shaped, its point away from the cable
        x = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t)) / 17
        outline = np.stack([x * r, np.sin(t) ** 3 * r * 1.05], 1)
    else:  # a teardrop narrowing into the cable
        x = r * np.cos(t) + 0.35 * r * (1 + np.cos(t)) ** 2 / 4
        outline = np.stack([x, r * np.sin(t) * (1 - 0.35 * np.clip(np.cos(t), 0, 1))], 1)
    outline = outline * (1.0 + g.uniform(-0.04, 0.04, size=(1, 2)))
    _moulded(body, local(outline), g.uniform(0.05, 0.09), g.uniform(0.15, 0.3) * px)
    r_socket = g.uniform(0.22, 0.3)
    socket = local(np.stack([r_socket * np.cos(t), r_socket * np.sin(t)], 1))
    section = g.uniform(0.05, 0.07)  # cm: the ring's round section
    _wire(body, socket, section * px, 2 * section * brass * g.uniform(0.7, 1.0), closed=True)
    start = int(g.integers(0, 48))
    finger = np.roll(socket, -start, axis=0)[: int(g.integers(20, 34))]
    inner = centre + (finger - centre) * 0.7
    _wire(body, inner, 0.6 * section * px, 1.2 * section * brass * 0.6)
    # the spring-steel lever: a stamped strip arched over the socket from its hinge, bent
    # down at the far side and folded back up and out as the thumb tab, all at a keyed 3D
    # tilt: face-on the strip shows its thickness, twisted towards edge-on its width
    rot = _rotation(g, 1.1, 0.0)  # lying tilted on the curved chest, or up on its edge
    strip = g.uniform(0.16, 0.28)  # cm wide
    sheet = g.uniform(0.07, 0.1)  # cm thick
    reach = g.uniform(0.75, 1.0) * r
    rise = g.uniform(0.2, 0.6)
    u = np.linspace(-1.0, 1.0, 17)
    arch = np.stack(
        [g.uniform(-0.15, 0.25) + 0.25 * u**2, reach * u, rise * (1.0 - u**4)], 1
    )  # hinge at v = -reach, over the socket, down at v = +reach
    slope = np.gradient(arch[:, 2]) / np.maximum(np.gradient(arch[:, 1]), 1e-9)
    arch_normal = np.stack([np.zeros_like(u), -slope, np.ones_like(u)], 1)
    out = g.uniform(0.5, 1.4)  # the thumb tab, bent back up and out towards the cable
    lift = g.uniform(0.3, 1.1)
    v = np.linspace(0.0, 1.0, 7)
    tab = arch[-1] + np.stack(
        [out * v, -g.uniform(0.1, 0.4) * v, lift * out * v * (1 - 0.3 * v)], 1
    )
    tab_normal = np.tile([-math.sin(math.atan(lift)), 0.0, math.cos(math.atan(lift))], (7, 1))
    for path, normal in ((arch, arch_normal), (tab, tab_normal)):
        _ribbon(body, path, normal, strip, sheet, rot, local, px, brass * g.uniform(0.8, 1.0))
    coil_turns = int(g.integers(2, 5))  # the torsion coil round the hinge pin, seen side-on
    gauge = g.uniform(0.03, 0.045)
    hinge = (rot @ arch[0])[:2]
    for k in range(coil_turns):
        at = hinge + np.array([(k - (coil_turns - 1) / 2) * 2.2 * gauge, 0.0])
        ring = np.stack([0.6 * gauge * np.cos(t) + at[0], 2.5 * gauge * np.sin(t) + at[1]], 1)
        _wire(body, local(ring), 0.8 * gauge * px, 1.6 * gauge * brass, closed=True)
    # the cable's strain relief, tapering, and the crimp on the conductor
    start_u = float(outline[:, 0].max()) - 0.05
    end = start_u + g.uniform(0.8, 1.3)
    wide, narrow = g.uniform(0.16, 0.22), g.uniform(0.1, 0.13)
    relief = local([[start_u, -wide], [end, -narrow], [end, narrow], [start_u, wide]])
    _moulded(body, relief, g.uniform(0.03, 0.05), narrow * px)
    ferrule = local([[end - 0.35, 0.0], [end - 0.2, 0.0]])
    _wire(body, ferrule, 0.05 * px, 0.1 * brass * g.uniform(0.5, 0.8))
    return local([[end, 0.0]])[0]


def _generator(
    target: np.ndarray, g: np.random.Generator, cx: float, cy: float, px: float, side: float
) -> tuple[float, float]:
    """A pacemaker generator seen face-on, drawn into ``target``; returns where its lead
    leaves the header (pixels). A titanium can of keyed outline (a "D": a straight upper
    edge with rounded corners over a half-elliptical lower edge, or a rounded rectangle),
    4.2-5 x 3.8-4.5 cm, its rim denser where the shell is seen tangentially; the
    lithium-iodine battery filling its lower part along the can's curve (dense, with its
    terminal plate); the hybrid circuit board above it (a faint substrate populated with a
    keyed grid of small dense components and a few larger chips, a round capacitor); and the
    epoxy header on its upper edge (nearly radiolucent) holding 1-3 dense connector blocks
    with their set screws and the lead's proximal pin; ``side`` +1 puts the header's outlet
    towards image right."""
    angle = math.radians(g.uniform(-30, 30))
    a, b = g.uniform(2.1, 2.5) * px, g.uniform(1.9, 2.25) * px  # half-width, half-height
    c, s = math.cos(angle), math.sin(angle)

    def frame(points: np.ndarray) -> np.ndarray:
        """Frame points (pixels from the centre, y down) rotated and moved onto the film."""
        x, y = points[:, 0], points[:, 1]
        return np.stack([cx + c * x - s * y, cy + s * x + c * y], axis=1)

    def rect(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])

    corner = g.uniform(0.2, 0.35) * a
    t = np.linspace(0, 0.5 * math.pi, 8)
    round_top = np.vstack(
        [
            np.stack([-a + corner - corner * np.cos(t), -b + corner - corner * np.sin(t)], 1),
            np.stack([a - corner + corner * np.sin(t), -b + corner - corner * np.cos(t)], 1),
        ]
    )
    if g.random() < 0.6:  # a "D": the lower edge a half ellipse below the shoulders
        shoulder = g.uniform(-0.2, 0.1) * b
        u = np.linspace(0, math.pi, 40)
        lower = np.stack([a * np.cos(u), shoulder + (b - shoulder) * np.sin(u)], 1)
    else:  # a rounded rectangle
        lower = np.vstack(
            [
                np.stack([a - corner + corner * np.cos(t), b - corner + corner * np.sin(t)], 1),
                np.stack([-a + corner - corner * np.sin(t), b - corner + corner * np.cos(t)], 1),
            ]
        )
    shell = np.vstack([round_top, lower])
    wall = g.uniform(0.14, 0.2)  # the can's two titanium walls and what lines them
    _poly(target, frame(shell), wall)
    # the rounded side wall crossed tangentially: a dense rim, fading inwards
    _poly(target, frame(shell), wall, max(1, round(0.08 * px)))
    _poly(target, frame(shell * 0.97), 0.4 * wall, max(1, round(0.1 * px)))
    _poly(target, frame(shell * 0.94), 0.02, max(1, round(0.05 * px)))  # the inner weld seam
    split = g.uniform(-0.05, 0.2) * b  # the battery below, the circuit above
    battery = shell[shell[:, 1] > split] * 0.9
    battery = np.vstack([[battery[:, 0].min(), split], [battery[:, 0].max(), split], battery])
    battery = battery[np.argsort(np.arctan2(battery[:, 1] - split - 0.3 * b, battery[:, 0]))]
    _poly(target, frame(battery), g.uniform(0.13, 0.2))
    _poly(target, frame(battery), 0.05, 1)
    _poly(target, frame(rect(-0.3 * a, split + 0.05 * b, 0.3 * a, split + 0.1 * b)), 0.08)
    board = rect(-0.8 * a, -0.82 * b, 0.8 * a, split - 0.06 * b)
    _poly(target, frame(board), 0.04)  # the circuit's substrate
    _poly(target, frame(board), 0.03, 1)
    rows, cols = int(g.integers(4, 8)), int(g.integers(5, 10))
    cell_w, cell_h = 1.5 * a / cols, (split + 0.7 * b) / rows
    for r in range(rows):
        for k in range(cols):
            if g.random() < 0.45:
                continue
            x0 = -0.75 * a + k * cell_w + g.uniform(0.05, 0.3) * cell_w
            y0 = -0.78 * b + r * cell_h + g.uniform(0.05, 0.3) * cell_h
            x1 = x0 + g.uniform(0.3, 0.65) * cell_w
            y1 = y0 + g.uniform(0.3, 0.65) * cell_h
            _poly(target, frame(rect(x0, y0, x1, y1)), g.uniform(0.04, 0.16))
    for _ in range(int(g.integers(1, 4))):  # larger chips
        x0, y0 = g.uniform(-0.7, 0.3) * a, g.uniform(-0.75, -0.4) * b
        chip = rect(x0, y0, x0 + g.uniform(0.2, 0.4) * a, y0 + g.uniform(0.15, 0.3) * b)
        _poly(target, frame(chip), g.uniform(0.06, 0.12))
        _poly(target, frame(chip), 0.05, 1)
    ring = np.stack([np.cos(t * 4), np.sin(t * 4)], axis=1) * 0.15 * a
    ring = ring + np.array([-0.5 * side * a, split - 0.25 * b])
    _poly(target, frame(ring), 0.06, 1)  # capacitor
    blocks = int(g.integers(1, 4))
    header = rect(-0.1 * a * side, -1.45 * b, 0.85 * a * side, -0.9 * b)
    _poly(target, frame(header), 0.02)  # epoxy header
    _poly(target, frame(header), 0.015, 1)
    for k in range(blocks):  # connector blocks and set screws
        x0 = (0.05 + 0.27 * k) * a * side
        x1 = x0 + 0.18 * a * side
        _poly(target, frame(rect(x0, -1.32 * b, x1, -1.0 * b)), g.uniform(0.22, 0.32))
        screw = _ellipse((x0 + x1) / 2, -1.16 * b, 0.05 * a, 0.05 * a, 0.0, 12)
        _poly(target, frame(screw), -0.08)  # the screw's hex socket
    pin = rect(0.0, -1.18 * b, 0.85 * a * side, -1.14 * b)
    _poly(target, frame(pin), 0.12)  # the lead's proximal pin in the bore
    exit_point = frame(np.array([[0.88 * a * side, -1.16 * b]]))[0]
    return float(exit_point[0]), float(exit_point[1])


# the clinical order of the items: a film's first ``items`` are placed (severity ladder in
# the catalog: 2, 4, 5, 7, 8 items)
DEVICES = (
    ("ecg_electrode", "skin of the right upper chest"),
    ("ecg_electrode", "skin of the left upper chest"),
    ("ecg_electrode", "skin of the right lower chest"),
    ("ecg_electrode", "skin of the left lower chest"),
    ("central_venous_catheter", "tip in the lower superior vena cava"),
    ("endotracheal_tube", "tip in the trachea 4.5 cm above the carina"),
    ("nasogastric_tube", "tip in the gastric fundus"),
    ("pacemaker", "generator in the pectoral pocket, lead tip at the right-ventricular apex"),
)


def placed_devices(items: int) -> list[dict[str, str]]:
    """What ``xray_support_devices`` places with ``items`` items: each device and where (the
    answer key of a device-presence question)."""
    return [{"device": d, "where": where} for d, where in DEVICES[: max(0, min(items, ITEMS))]]


def device_layers(key: int, h: int, w: int) -> _Placed:
    """Every device of this film's keyed set drawn in the canonical frame, in clinical order
    (``DEVICES``): items 0-3 the ECG electrodes with their leads, 4 a central venous catheter
    (right internal jugular or right subclavian) to the lower SVC, 5 an endotracheal tube,
    6 a nasogastric tube, 7 a pacemaker (left pectoral, a fifth of films right) with its
    right-ventricular lead. Sizes are in cm (the shorter side spans ``FIELD_CM``); shapes are
    jittered per film, the same at every severity. ``place_devices`` moves them onto the
    film's anatomy."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_support_devices"))
    side = min(h, w)
    px = side / FIELD_CM
    layers = _Placed(h, w)
    # the monitor's side: most leads run to it and leave the film near one height, a loose
    # bundle crossing the chest; some run off the body on their own side
    monitor = str(g.choice(["left", "right"]))
    exit_y = g.uniform(0.25, 0.85) * h
    for item, own_side in enumerate(("left", "right", "left", "right")):
        lead_side = own_side if g.random() < 0.3 else monitor
        _electrode(layers, g, item, f"ecg{item}", px, lead_side, exit_y)
    anchor = {k: np.array(_px(v, w, h)) for k, v in _CANONICAL_ANCHORS.items()}
    # central line (radiopaque polyurethane: a thin line with a denser core) down the right
    # internal jugular, or in from the right subclavian under the clavicle, into the SVC
    tip = anchor["cvc_tip"]
    cvc = np.zeros((h, w), np.float32)
    if g.random() < 0.6:
        neck = tip[0] - g.uniform(0.04, 0.06) * w
        course = [
            [neck, 0.0],
            [neck + 0.008 * w, 0.4 * tip[1]],
            [tip[0] - 0.01 * w, 0.75 * tip[1]],
        ]
    else:
        entry = anchor["pocket_left"] + np.array([0.02 * w, -0.05 * h])
        course = [
            entry,
            [(entry[0] + tip[0]) / 2, entry[1] + 0.01 * h],
            [tip[0] - 0.004 * w, tip[1] - 0.12 * h],
        ]
    lie = np.array([*course, tip], np.float64)
    lie[1:-1] += g.uniform(-0.006, 0.006, size=(len(lie) - 2, 2)) * w  # each film its own
    curve = _dense_curve(lie)
    _stroke(cvc, curve, g.uniform(0.18, 0.26) * px, g.uniform(0.009, 0.015))  # the wall
    _stroke(cvc, curve, g.uniform(0.06, 0.09) * px, g.uniform(0.08, 0.12))  # radiopaque core
    layers.add(4, cvc, ("warp", "cvc_tip"))
    # endotracheal tube: from the mouth (often at one corner, taped) down the trachea, the tip
    # above the carina; a flexible tube curving gently with the neck's position, never a
    # ruled line: a keyed sway at the mouth, a bow in the neck and a lean at the thoracic inlet
    tip = anchor["et_tip"]
    et = np.zeros((h, w), np.float32)
    sway = g.uniform(-0.025, 0.025) * w
    bow = g.uniform(-0.018, 0.018) * w
    lean = g.uniform(-0.008, 0.008) * w
    curve = _dense_curve(
        np.array(
            [
                [tip[0] + sway, -0.02 * h],
                [tip[0] + 0.6 * sway + bow, 0.3 * tip[1]],
                [tip[0] + 0.2 * sway + 0.5 * bow + lean, 0.62 * tip[1]],
                [tip[0] + 0.5 * lean, 0.85 * tip[1]],
                tip,
            ]
        )
    )
    curve = _meander(curve, g, px, 0.3)
    stripe_side = float(g.choice([-1.0, 1.0]))
    outer = g.uniform(0.8, 1.05) * px  # 7.0-8.5 mm tubes (the adult range)
    _tube(et, curve, outer, g.uniform(0.008, 0.015), g.uniform(0.07, 0.12), px, stripe_side)
    bevel = curve[-1] + np.array([0.0, 0.25 * px])
    _stroke(et, np.array([curve[-1] - [0.45 * px, 0.0], bevel]), max(1.0, 0.06 * px), 0.03)
    layers.add(5, et, ("warp", "et_tip"))
    # nasogastric tube: the oesophagus (behind the trachea, a little left of the midline:
    # image right) through the hiatus into the stomach below the left dome, the tip curled
    top, hiatus, ng_tip = anchor["top"], anchor["hiatus"], anchor["ng_tip"]
    ng = np.zeros((h, w), np.float32)
    curl = g.uniform(0.6, 1.4)
    # the oesophagus deviates (left at the aortic arch, back to the right at the left atrium)
    # and a tube lies in it slackly: a keyed lateral course for each film
    drift = g.uniform(-0.012, 0.012, size=4) * w
    path = np.array(
        [
            top + np.array([0.008 * w + drift[0], -0.02 * h]),
            [top[0] + 0.012 * w + drift[1], 0.3 * hiatus[1]],
            [top[0] + 0.006 * w + drift[2], 0.6 * hiatus[1]],
            [hiatus[0] - 0.01 * w + 0.5 * drift[3], hiatus[1] - 0.05 * h],
            hiatus,
            ng_tip + np.array([-0.03 * w, -0.01 * h]),
            ng_tip,
            ng_tip + np.array([0.025 * w, -0.02 * h * curl]),
        ]
    )
    curve = _dense_curve(path)
    cut = max(2, int(np.argmax(curve[:, 1] >= hiatus[1])))  # the oesophagus meanders
    curve = np.vstack([_meander(curve[: cut + 1], g, px, 0.45), curve[cut + 1 :]])
    ng_side = float(g.choice([-1.0, 1.0]))
    ng_outer, ng_stripe = g.uniform(0.4, 0.55) * px, g.uniform(0.07, 0.12)
    _tube(ng, curve, ng_outer, g.uniform(0.008, 0.015), ng_stripe, px, ng_side)
    stripe_at = ng_side * max(0.0, ng_outer / 2.0 - max(1.0, 0.06 * px) - 0.04 * px)
    holes = _offset(curve, stripe_at)[-max(3, len(curve) // 10) :]
    for k in range(0, len(holes) - 1, 3):  # side holes: gaps in the stripe near the tip
        _stroke(ng, holes[k : k + 2], max(1.0, 0.1 * px), -0.8 * ng_stripe)
    layers.add(6, ng, ("warp", "ng_tip"))
    # pacemaker: generator in a pectoral pocket, the lead through the subclavian vein, the
    # SVC and the tricuspid valve into the right-ventricular apex, with a slack loop
    right_pocket = g.random() < 0.2
    layers.pocket = "pocket_left" if right_pocket else "pocket_right"
    gen, rv, svc = anchor[layers.pocket], anchor["rv_apex"], anchor["cvc_tip"]
    side_sign = -1.0 if right_pocket else 1.0
    can = np.zeros((h, w), np.float32)
    exit_x, exit_y = _generator(can, g, gen[0], gen[1], px, -side_sign)
    lead = np.zeros((h, w), np.float32)
    start = np.array([exit_x, exit_y])
    loop = g.uniform(0.9, 1.6) * px  # the slack coiled in the pocket: 1-2 turns by the can
    turns = g.uniform(1.0, 2.0)
    toward = np.array([side_sign * g.uniform(-0.2, 0.5), 1.0])
    centre = start + loop * toward / np.linalg.norm(toward)
    phase = math.atan2(start[1] - centre[1], start[0] - centre[0])
    spin = np.linspace(0.0, 2 * math.pi * turns, max(8, round(12 * turns)))
    radius = loop * np.linspace(1.0, g.uniform(0.8, 1.2), len(spin))
    radius *= 1.0 + g.uniform(-0.12, 0.12, size=len(spin))  # slack coiled by hand, uneven
    coil = centre + np.stack(
        [radius * np.cos(phase - side_sign * spin), radius * np.sin(phase - side_sign * spin)], 1
    )
    path = np.array(
        [
            *coil,
            [(coil[-1][0] + svc[0]) / 2, min(coil[-1][1], start[1]) - 0.015 * h],
            [svc[0] + 0.004 * w, (start[1] + svc[1]) / 2],
            svc + np.array([0.0, 0.03 * h]),
            [rv[0] - 0.05 * w, rv[1] - 0.035 * h],
            rv,
        ]
    )
    curve = _dense_curve(path)
    _stroke(lead, curve, 0.22 * px, 0.025)  # silicone insulation over the coil
    _stroke(lead, curve, 0.1 * px, 0.12)  # the conductor coil (MP35N), grey
    tip_mark = np.zeros((h, w), np.float32)
    _stroke(tip_mark, curve[-max(2, round(0.25 * px)) :], 0.3 * px, 0.22)  # tip electrode
    ring = curve[max(0, len(curve) - 1 - round(1.2 * px / 2)) :][: max(2, round(0.2 * px))]
    _stroke(tip_mark, ring, 0.3 * px, 0.16)  # ring electrode
    lead += tip_mark
    layers.add(7, can, ("move", "pocket"))
    layers.add(7, lead, ("warp", "rv_apex"))
    return layers


def _tps_grid(src: torch.Tensor, dst: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The sampling grid (B, H, W, 2, grid_sample's [-1, 1] units) of the thin-plate spline
    that takes each film's control points ``src`` to the canonical ``dst`` (both (B, K, 2)
    fractions): output pixel -> canonical pixel. Solved in one batched linear system
    (float64, a tiny ridge for coincident points), evaluated on the ``LANDMARK_GRID``
    square and interpolated bilinearly to the film (the warp is smooth at that scale)."""
    b, k = src.shape[:2]
    dev = src.device

    def kernel(d2: torch.Tensor) -> torch.Tensor:
        return d2 * torch.log(d2.clamp(min=1e-12))

    d2 = ((src.unsqueeze(2) - src.unsqueeze(1)) ** 2).sum(dim=3)
    ones = torch.ones(b, k, 1, dtype=torch.float64, device=dev)
    affine = torch.cat([ones, src], dim=2)  # (B, K, 3)
    top = torch.cat([kernel(d2) + 1e-6 * torch.eye(k, dtype=torch.float64, device=dev), affine], 2)
    bottom = torch.cat(
        [affine.transpose(1, 2), torch.zeros(b, 3, 3, dtype=torch.float64, device=dev)], 2
    )
    system = torch.cat([top, bottom], dim=1)
    rhs = torch.cat([dst - src, torch.zeros(b, 3, 2, dtype=torch.float64, device=dev)], dim=1)
    coef = torch.linalg.solve(system, rhs)  # (B, K + 3, 2): displacement weights
    n = LANDMARK_GRID
    centre = (torch.arange(n, device=dev, dtype=torch.float64) + 0.5) / n
    gy, gx = torch.meshgrid(centre, centre, indexing="ij")
    pts = torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1).view(1, -1, 2).expand(b, -1, 2)
    e2 = ((pts.unsqueeze(2) - src.unsqueeze(1)) ** 2).sum(dim=3)  # (B, n*n, K)
    basis = torch.cat([kernel(e2), torch.ones_like(e2[..., :1]), pts], dim=2)
    moved = pts + basis @ coef  # canonical fractions, (B, n*n, 2)
    coarse = (moved * 2.0 - 1.0).view(b, n, n, 2).permute(0, 3, 1, 2)
    fine = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
    return fine.permute(0, 2, 3, 1).to(torch.float32)


def _translation_grid(
    found: torch.Tensor, canonical: torch.Tensor, h: int, w: int, stretch: str
) -> torch.Tensor:
    """(B, H, W, 2) grid of a per-sample translation taking the canonical point onto
    ``found`` ((B, 2) fractions); ``stretch`` ``left``/``right`` also scales x about that film
    edge so the canvas still reaches it (a lead wire), ``top`` scales y about the film's top
    edge instead of moving it (a necklace hanging from the neck)."""
    b = found.shape[0]
    dev = found.device
    xs = ((torch.arange(w, dtype=torch.float64, device=dev) + 0.5) / w).view(1, 1, w)
    ys = ((torch.arange(h, dtype=torch.float64, device=dev) + 0.5) / h).view(1, h, 1)
    fx, fy = found[:, 0].view(b, 1, 1), found[:, 1].view(b, 1, 1)
    cx, cy = canonical[:, 0].view(b, 1, 1), canonical[:, 1].view(b, 1, 1)
    src_y = ys - (fy - cy)
    if stretch in ("left", "right"):
        edge = 0.0 if stretch == "left" else 1.0
        sx = ((fx - edge) / (cx - edge)).clamp(0.3, 3.0)
        src_x = edge + (xs - edge) / sx
    else:
        src_x = xs - (fx - cx)
    if stretch == "top":  # hangs from the film's top edge down to its anchor (a necklace)
        src_y = ys / (fy / cy).clamp(0.3, 3.0)
    return torch.stack(
        [(src_x * 2.0 - 1.0).expand(b, h, w), (src_y * 2.0 - 1.0).expand(b, h, w)], dim=-1
    ).to(torch.float32)


def _film_noise(x: torch.Tensor) -> torch.Tensor:
    """(B,) the film's own noise (display units): the lower quartile, over the
    ``LANDMARK_GRID`` cells, of the RMS of the film minus its 3 x 3 mean (flat cells carry
    only noise; edges raise the upper quantiles), scaled to the noise's own standard
    deviation (white noise keeps 8/9 of its variance there)."""
    v = x[:, :1].to(torch.float64)
    residual = (v - F.avg_pool2d(v, 3, 1, 1, count_include_pad=False)) ** 2
    cells = F.adaptive_avg_pool2d(residual, (LANDMARK_GRID, LANDMARK_GRID)).flatten(1)
    return (torch.quantile(cells, 0.25, dim=1) * (9.0 / 8.0)).sqrt()


DETECTOR_BLUR_CM = 0.035  # sigma of the detector's unsharpness (MTF 50 % near 2.5 lp/mm)
MIN_ROOM = 0.08  # the least headroom the display curve's shoulder leaves (display units)
# the support devices' least headroom: a digital chest film's multi-scale processing
# equalises large areas (the liver, the shoulder) but keeps a small dense object's own
# contrast, so a clip over a bright region still shows its metal graded, not one flat blob
DEVICE_MIN_ROOM = 0.2


def place_devices(
    x: torch.Tensor,
    p: Mapping[str, torch.Tensor],
    films: list[_Placed],
    keys: Sequence[int],
    noise_name: str = "xray_support_devices/noise",
    ceiling: float = 0.995,
    exposed_only: bool = False,
    min_room: float = MIN_ROOM,
) -> torch.Tensor:
    """``clip(v + s(a) + n)`` for the whole batch. ``a``: the sum of each film's canvases of
    its first ``items`` items at its ``opacity``, moved from the canonical frame onto the
    film's anatomy (``chest_landmarks``, ``skin_sites``, ``device_anchors``): electrodes and
    the generator translated onto their skin sites, leads stretched to the film edge, lines
    and tubes carried by one thin-plate-spline warp through the anatomical anchors; then the
    detector's unsharpness (a Gaussian of ``DETECTOR_BLUR_CM``) over it, which with the
    pixel's own partial volume leaves a sub-millimetre wire grey. ``s``: the shoulder of the
    processed film's display curve, ``s(a) = r (1 - exp(-a / r))`` with ``r`` the room left
    below the film's own ``ceiling`` (``_film_ceiling``, at least ``MIN_ROOM``): faint
    objects add linearly, dense metal is graded towards the film's brightest structures
    instead of clipping to white. ``n``: the quantum noise the objects add: fewer quanta
    reach the detector behind them (``I = exp(-MU v)``), so the film's noise ``sigma`` grows
    to ``sigma exp(MU a / 2)``; the extra, ``sigma sqrt(exp(MU a) - 1)`` times a keyed normal
    field, is added through the same shoulder (times its slope ``exp(-a / r)``; none on a
    noiseless film): grain in the film's own domain over the objects. ``exposed_only``: an
    object attenuates only the x-rays that reach the detector, so ``s`` and ``n`` go through
    the display curve's toe at the film's unexposed level (``exposure_toe``): nothing shows
    where the film is unexposed (a collimator band, a burned-out label), full contrast where
    it is exposed.
    The canvases travel as one (K, B, H, W) uint8 stack; one ``grid_sample`` per moved canvas
    and one for all warped ones serve the whole batch."""
    b = x.shape[0]
    h, w = x.shape[-2:]
    dev = x.device
    lm = chest_landmarks(x)
    found = device_anchors(lm, skin_sites(x, lm), gastric_bubble(x, lm))
    right_pocket = torch.tensor([f.pocket == "pocket_right" for f in films], device=dev)
    found["pocket"] = torch.where(
        right_pocket.view(b, 1), found["pocket_right"], found["pocket_left"]
    )
    canonical = dict(_CANONICAL_ANCHORS)
    canonical_pocket = torch.tensor(
        [canonical[f.pocket] for f in films], dtype=torch.float64, device=dev
    )
    chosen_origin: dict[str, torch.Tensor] = {}
    for name in films[0].choices:  # a fixed set per op; the host-side films' own sides
        options = SIDED[name]
        pick = torch.tensor([options.index(f.choices[name]) for f in films], device=dev)
        found[name] = torch.stack([found[o] for o in options], dim=1)[torch.arange(b), pick]
        chosen_origin[name] = torch.tensor(
            [canonical[f.choices[name]] for f in films], dtype=torch.float64, device=dev
        )
    drawn = torch.from_numpy(np.stack([np.stack(f.canvases) for f in films], axis=1)).to(dev)
    items = torch.tensor([f.items for f in films], dtype=torch.int64, device=dev)  # (B, K)
    scales = torch.tensor([f.scales for f in films], dtype=torch.float64, device=dev)
    chosen = (items < torch.round(p["items"]).view(b, 1)).to(torch.float64)
    weights = (scales * p["opacity"].double().view(b, 1) * chosen / 255.0).to(torch.float32)

    def anchor_of(point: tuple[float, float]) -> torch.Tensor:
        return torch.tensor(point, dtype=torch.float64, device=dev).expand(b, 2)

    total = torch.zeros(b, 1, h, w, dtype=torch.float32, device=dev)
    warped = torch.zeros(b, 1, h, w, dtype=torch.float32, device=dev)
    for j, (kind, name) in enumerate(films[0].placements):  # the op's canvas count, not B
        layer = drawn[j].unsqueeze(1).to(torch.float32) * weights[:, j].view(b, 1, 1, 1)
        if kind == "warp":
            warped = warped + layer
            continue
        if name == "pocket":
            origin = canonical_pocket
        elif name in chosen_origin:
            origin = chosen_origin[name]
        else:
            origin = anchor_of(canonical[name])
        # each film's own stretch (a lead runs to its film's keyed side): one grid per kind
        # present in the batch, each film taking its own
        kinds = [f.placements[j][0] for f in films]
        grid = _translation_grid(found[name], origin, h, w, kinds[0])
        for other in sorted(set(kinds) - {kinds[0]}):
            mine = torch.tensor([k == other for k in kinds], device=dev).view(b, 1, 1, 1)
            grid = torch.where(mine, _translation_grid(found[name], origin, h, w, other), grid)
        total = total + F.grid_sample(layer, grid, "bilinear", "zeros", align_corners=False)
    if any(kind == "warp" for kind, _ in films[0].placements):
        src = torch.stack([found[n] for n in WARP_POINTS], dim=1)
        dst = torch.stack(
            [canonical_pocket if n == "pocket" else anchor_of(canonical[n]) for n in WARP_POINTS],
            dim=1,
        )
        grid = _tps_grid(src, dst, h, w)
        total = total + F.grid_sample(warped, grid, "bilinear", "zeros", align_corners=False)
    total = _gaussian_blur(total, DETECTOR_BLUR_CM * min(h, w) / FIELD_CM).double()
    shown, slope = display_shoulder(
        x[:, :1].to(torch.float64),
        total,
        _film_ceiling(x, ceiling).view(b, 1, 1, 1),
        min_room,
    )
    sigma = _film_noise(x).view(b, 1, 1, 1)
    extra = sigma * torch.sqrt(torch.expm1(MU * total.clamp(min=0.0))) * slope
    if exposed_only:
        shown, exposed = exposure_toe(unexposed_depth(x), shown)
        extra = extra * exposed
    noise = keyed_fields.normal_fields(keys, noise_name, (1, h, w), dev)
    out = x.to(torch.float64) + shown + extra * noise.double()
    return out.clamp_(0.0, 1.0).to(x.dtype)


def display_shoulder(
    v: torch.Tensor, a: torch.Tensor, ceiling: torch.Tensor, min_room: float = MIN_ROOM
) -> tuple[torch.Tensor, torch.Tensor]:
    """What an added attenuation ``a`` (display units) shows as on a film of value ``v`` whose
    display curve shoulders at ``ceiling``, and the curve's slope there: ``s(a) = r (1 -
    exp(-a / r))``, ``r`` the room left below the ceiling (at least ``min_room``), so
    ``s ~ a`` for faint objects, ``s < r`` however dense (graded, never clipped); a negative
    ``a`` (a hole in a plate) is shown as it is."""
    # at least ``min_room``, never past the display's white (a ceiling is a film value, so
    # with ``min_room`` at ``MIN_ROOM`` the second bound never binds)
    room = torch.minimum((ceiling - v).clamp(min=min_room), (1.0 - v).clamp(min=MIN_ROOM))
    dense = a.clamp(min=0.0)
    slope = torch.exp(-dense / room)
    return torch.where(a > 0, room * (1.0 - slope), a), slope


TOE = 0.02  # display units: the width of the display curve's toe at the unexposed level
SHUTTER_DEPTH = 0.15  # the deepest a collimator band reaches in from the film's top edge
SHUTTER_CONTRAST = 0.1  # display units: a band stands at least this far above the film's median
UNEXPOSED_FLOOR = 0.9  # display units: the lowest a processed film shows its unexposed level at
LOCAL = 5  # pixels: the neighbourhood a pixel's exposure is read from (the grain averaged)


def unexposed_depth(x: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) float64: how far (display units) each pixel's neighbourhood (``LOCAL``
    square mean) lies below the film's unexposed level, 0 where no x-rays reached it. The
    unexposed level is the film's brightest neighbourhood (base and fog under a burned-out
    label or a shutter), never below ``UNEXPOSED_FLOOR`` (a film whose brightest part is
    darker shows no unexposed area: a flat field is uniformly exposed); a collimator band at the top edge (``shutter_rows``) is unexposed
    wherever its processed brightness lies (the film's processing grades it unevenly)."""
    b = x.shape[0]
    film = x[:, :1].to(torch.float64)
    local = F.avg_pool2d(film, LOCAL, 1, LOCAL // 2, count_include_pad=False)
    top = local.flatten(1).amax(dim=1).clamp(min=UNEXPOSED_FLOOR).view(b, 1, 1, 1)
    depth = (top - local).clamp(min=0.0)
    return depth.masked_fill(shutter_rows(film), 0.0)


def shutter_rows(film: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, 1) bool: the rows of a collimator band along the film's top edge, found on
    the film's own rows (unsmoothed: the band is found up to its edge): the rows, counted
    from the edge and at most ``SHUTTER_DEPTH`` of the height, that are bright across the
    whole width (their lowest decile at least the film's median, their mean at least its
    upper quartile and ``SHUTTER_CONTRAST`` above its median: a flat field has no band). A
    chest film's first rows without a band hold dark air above the shoulders or beside the
    neck, so they fail at once."""
    b, _, h, _ = film.shape
    rows = max(1, int(SHUTTER_DEPTH * h))
    flat = film.flatten(1)
    median = torch.quantile(flat, 0.5, dim=1).view(b, 1)
    upper = torch.quantile(flat, 0.75, dim=1).view(b, 1)
    top = film[:, 0, :rows]
    mean = top.mean(dim=2)
    bright = (torch.quantile(top, 0.1, dim=2) >= median) & (mean >= upper)
    bright &= mean >= median + SHUTTER_CONTRAST
    band = torch.cumprod(bright.to(torch.int64), dim=1).bool()  # a run from the edge only
    out = torch.zeros(b, 1, h, 1, dtype=torch.bool, device=film.device)
    out[:, 0, :rows, 0] = band
    return out


def exposure_toe(depth: torch.Tensor, shown: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What an object shown as ``shown`` (display units, on an exposed film) becomes at a
    pixel ``depth`` below the film's unexposed level, and the fraction of the film's signal
    that is exposure there. The object's transmission multiplies the exposure ``E`` in the
    linear domain (``E T``, ``T = exp(-MU shown)``); the display curve's toe maps ``E`` to the
    depth ``d = TOE log(1 + (E / E_t)^(1 / (MU TOE)))`` (``E_t`` the toe's exposure):
    logarithmic once exposed (``d' = d - shown``, the plain shift) and zero at no exposure,
    where ``E T`` is zero too: ``d' = TOE log(1 + (exp(d / TOE) - 1) exp(-shown / TOE))``."""
    after = TOE * torch.log1p(torch.expm1(depth / TOE) * torch.exp(-shown / TOE))
    return depth - after, -torch.expm1(-depth / TOE)


def _film_ceiling(x: torch.Tensor, q: float) -> torch.Tensor:
    """(B,) the film's own brightest structures (display units): the ``q`` quantile of the
    film averaged over ``CEILING_CELLS`` squares (0.995: bone, the mediastinum, a lone pixel
    too small to count; 1: its brightest square, a lead marker or the densest bone), where
    a processed film's display curve shoulders: metal denser than that is drawn towards
    it, not to white."""
    v = x[:, :1].to(torch.float64)
    cells = F.adaptive_avg_pool2d(v, (CEILING_CELLS, CEILING_CELLS)).flatten(1)
    return torch.quantile(cells, q, dim=1)


CEILING_CELLS = 64


def _gaussian_blur(img: torch.Tensor, sigma: float) -> torch.Tensor:
    """A separable Gaussian of ``sigma`` pixels (at least 0.4) over (B, 1, H, W), zero padded
    (the canvases are empty at the film's edge but for leads leaving it)."""
    sigma = max(0.4, sigma)
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=torch.float32, device=img.device)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    # tap by tap, in one fixed order: every pixel's sum is the same whatever the batch (a CPU's
    # convolution library or a GPU's picks its blocking and summation order from the batch)
    return _taps_along(_taps_along(img, k, -1), k, -2)


def _taps_along(img: torch.Tensor, taps: torch.Tensor, dim: int) -> torch.Tensor:
    """Zero-padded correlation of every plane with the odd 1-D ``taps`` along ``dim`` (-1 or
    -2), summed tap by tap in one order."""
    radius = taps.numel() // 2
    pad = (radius, radius, 0, 0) if dim == -1 else (0, 0, radius, radius)
    padded = F.pad(img, pad)
    n = img.shape[dim]
    out = padded.narrow(dim, 0, n) * taps[0]
    for t in range(1, taps.numel()):
        out = out + padded.narrow(dim, t, n) * taps[t]
    return out


@register_kernel("xray_support_devices", sampler=_level_sampler)
def xray_support_devices(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Support devices as attenuating objects placed on the film's own anatomy (see
    ``chest_landmarks``, ``skin_sites``, ``device_anchors``, ``device_layers`` and
    ``place_devices``).

    Kornia: own kernel: no Kornia equivalent (host-drawn attenuation canvases moved onto the
    landmarks by per-sample translations and a thin-plate-spline warp through ``grid_sample``)."""
    return _placed_on_anatomy(
        x,
        p,
        keys,
        device_layers,
        "xray_support_devices/noise",
        0.999,
        exposed_only=True,
        min_room=DEVICE_MIN_ROOM,
    )


def _placed_on_anatomy(
    x: torch.Tensor,
    p: Mapping[str, torch.Tensor],
    keys: Sequence[int],
    layers: Callable[[int, int, int], _Placed],
    noise_name: str,
    ceiling: float,
    exposed_only: bool = False,
    min_room: float = MIN_ROOM,
) -> torch.Tensor:
    """``place_devices`` (its display ``ceiling`` quantile and ``min_room``) with each key's canvases from ``layers(key, h, w)``: the whole batch at
    once on the device path, sample by sample on the host path."""
    h, w = x.shape[-2:]
    return backend.by_path(
        x,
        host=lambda: torch.cat(
            [
                place_devices(
                    x[i : i + 1],
                    {n: v[i : i + 1] for n, v in p.items()},
                    [layers(int(k), h, w)],
                    [int(k)],
                    noise_name,
                    ceiling,
                    exposed_only,
                    min_room,
                )
                for i, k in enumerate(keys)
            ]
        ),
        device=lambda: place_devices(
            x,
            p,
            [layers(int(k), h, w) for k in keys],
            [int(k) for k in keys],
            noise_name,
            ceiling,
            exposed_only,
            min_room,
        ),
    )


# --- foreign objects: metal on or in the patient's clothing, projected through 3D ------------

STEEL_MU = 10.0  # 1/cm: steel and brass at a chest film's effective energy (about 60 keV)


def _rotation(g: np.random.Generator, tilt: float, spin: float = math.pi) -> np.ndarray:
    """A keyed 3D orientation (3 x 3): a spin of up to ``spin`` radians about the beam (small
    for what gravity or the garment orients), then tilts of up to ``tilt`` radians about two
    axes in the film plane (how a flat object lies on a curved chest)."""
    spin, ax, ay = g.uniform(-spin, spin), g.uniform(-tilt, tilt), g.uniform(-tilt, tilt)
    c, s = math.cos(spin), math.sin(spin)
    rz = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    c, s = math.cos(ax), math.sin(ax)
    rx = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])
    c, s = math.cos(ay), math.sin(ay)
    ry = np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])
    return ry @ rx @ rz


def _project(points: np.ndarray, rot: np.ndarray, centre: np.ndarray, px: float) -> np.ndarray:
    """Object points (n, 3) in cm, rotated, projected along the beam onto the film (pixels)."""
    return (np.asarray(points, np.float64) @ rot.T)[:, :2] * px + centre


def _wire(
    target: np.ndarray, curve: np.ndarray, radius: float, value: float, closed: bool = False
) -> None:
    """Add the projected thickness of a round wire of ``radius`` pixels along ``curve``
    (pixels): the chord ``2 sqrt(r^2 - d^2)`` at distance ``d`` from its axis, ``value`` at
    the axis (display units). Sub-pixel wires keep their cross-section (radius at least 0.7
    px, value scaled by the area ratio)."""
    pts = np.asarray(curve, np.float64)
    if closed:
        pts = np.vstack([pts, pts[:1]])
    r = max(radius, 0.7)
    value *= (radius / r) ** 2
    h, w = target.shape
    x0, y0 = np.floor(pts.min(axis=0) - r - 1).astype(int)
    x1, y1 = np.ceil(pts.max(axis=0) + r + 2).astype(int)
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    a, b = pts[:-1], pts[1:]
    ab = b - a
    if len(ab) == 0:
        ab, a, b = np.zeros((1, 2)), pts[:1], pts[:1]
    length2 = np.maximum((ab**2).sum(axis=1), 1e-12)
    d2 = np.full((y1 - y0, x1 - x0), np.inf)
    for i0 in range(0, len(ab), 64):  # bounded memory for long wires
        aa, vv, ll = a[i0 : i0 + 64], ab[i0 : i0 + 64], length2[i0 : i0 + 64]
        # only the pixels near this run of segments: farther ones get no chord from it, so
        # the cost follows the wire's length, not its bounding box (a diagonal or a wire
        # on a 3 x 100000 film)
        ends = np.concatenate([aa, b[i0 : i0 + 64]])
        cx0, cy0 = np.maximum(np.floor(ends.min(axis=0) - r - 1).astype(int), [x0, y0])
        cx1, cy1 = np.minimum(np.ceil(ends.max(axis=0) + r + 2).astype(int), [x1, y1])
        if cx1 <= cx0 or cy1 <= cy0:
            continue
        ys, xs = np.mgrid[cy0:cy1, cx0:cx1]
        pix = np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], axis=1)
        t = np.clip(((pix[:, None, :] - aa[None]) * vv[None]).sum(axis=2) / ll[None], 0.0, 1.0)
        near = aa[None] + t[..., None] * vv[None]
        nearest = ((pix[:, None, :] - near) ** 2).sum(axis=2).min(axis=1).reshape(ys.shape)
        box = d2[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0]
        np.minimum(box, nearest, out=box)
    chord = np.sqrt(np.clip(1.0 - d2 / (r * r), 0.0, None))
    target[y0:y1, x0:x1] += np.float32(value) * chord.astype(np.float32)


def _plate(target: np.ndarray, polygon: np.ndarray, value: float) -> None:
    """Add ``value`` inside a flat plate's projected outline (pixels, anti-aliased): a plate
    of uniform thickness crossed at a tilt (``value`` already divided by the cosine)."""
    _poly(target, polygon, value)


def _relief_plate(
    target: np.ndarray, g: np.random.Generator, polygon: np.ndarray, value: float, px: float
) -> None:
    """Add a cast or stamped pendant inside ``polygon`` (pixels): ``value`` its thickest
    metal (display units), the thickness rising from a bevelled edge to a domed face
    (the square root of the depth below the edge, from 45 %) and modulated by a keyed
    embossed relief (three plane waves of 1.5-4 mm, +-25 %): metal of graded density, not a
    flat disc."""
    h, w = target.shape
    x0, y0 = np.floor(polygon.min(axis=0) - 2).astype(int)
    x1, y1 = np.ceil(polygon.max(axis=0) + 3).astype(int)
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
    pts = np.round((polygon - [x0, y0]) * 4).astype(np.int32).reshape(-1, 1, 2)
    cv2.fillPoly(mask, [pts], 255, cv2.LINE_AA, shift=2)
    inside = cv2.distanceTransform((mask > 127).astype(np.uint8), cv2.DIST_L2, 3)
    depth = inside.astype(np.float32) / max(float(inside.max()), 1.0)
    ys, xs = np.mgrid[0 : y1 - y0, 0 : x1 - x0].astype(np.float32)
    relief = np.zeros_like(xs)
    for _ in range(3):
        k = 2 * math.pi / (g.uniform(0.15, 0.4) * px)
        heading = g.uniform(0, math.pi)
        relief += np.sin(k * (math.cos(heading) * xs + math.sin(heading) * ys) + g.uniform(0, 6.3))
    thickness = (0.45 + 0.55 * np.sqrt(depth)) * (1.0 + 0.25 * relief / 3.0)
    target[y0:y1, x0:x1] += np.float32(value) * (mask / np.float32(255.0)) * thickness


def _loop(a: float, b: float, n: int = 24, square: float = 1.0) -> np.ndarray:
    """A closed loop in its own plane (n, 3) cm: an ellipse of semi-axes ``a``, ``b``, made
    more rectangular by ``square`` < 1 (a superellipse exponent)."""
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    c, s = np.cos(t), np.sin(t)
    x = a * np.sign(c) * np.abs(c) ** square
    y = b * np.sign(s) * np.abs(s) ** square
    return np.stack([x, y, np.zeros_like(x)], axis=1)


def _necklace(target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float) -> None:
    """A chain around the neck: a sagging catenary from both sides of the neck (off the film's
    top) down over the sternal notch, made of wire links (keyed link size and wire gauge)
    alternating in orientation, each twisted a little more or less (a cable chain: one link
    seen face-on as an oval loop, the next edge-on as a short dense bar); sometimes a pendant
    (a flat plate on a bail ring) at its lowest point, sometimes the clasp (a spring ring) on
    one side."""
    half = g.uniform(2.6, 4.0) * px  # half the span between the neck's sides
    depth = g.uniform(3.0, 7.0) * px
    skew = g.uniform(-0.6, 0.6) * px
    cat = g.uniform(0.8, 1.6)
    u = np.linspace(-1.0, 1.0, 400)
    sag = (np.cosh(cat) - np.cosh(cat * u)) / (np.cosh(cat) - 1.0)  # 1 at the bottom
    path = np.stack([centre[0] + skew + half * u, centre[1] - depth * (1.0 - sag)], axis=1)
    rise = np.linspace(8.0 * px, 0.0, 80, endpoint=False)[:, None] * np.array([[0.0, -1.0]])
    path = np.vstack([path[0] + rise, path, path[-1] + rise[::-1]])
    arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(path, axis=0), axis=1))])

    def along(at: float) -> np.ndarray:
        return np.array([np.interp(at, arc, path[:, 0]), np.interp(at, arc, path[:, 1])])

    link_a = g.uniform(0.16, 0.3)  # cm, half the link's length
    link_b = link_a * g.uniform(0.55, 0.75)
    wire = g.uniform(0.025, 0.045)  # cm, the wire's radius
    metal = STEEL_MU * g.uniform(0.8, 1.5) / MU  # display units per cm of metal
    pitch = 1.5 * link_a * px
    twist = g.uniform(0.0, 0.5)
    beads = g.random() < 0.3  # a ball chain: hollow beads on short wire bars
    at, k = 0.5 * pitch, 0
    while at < arc[-1]:
        # the chain lies loosely: links bunch up and spread (pitch 70-115 %), each turned
        # and twisted its own way and a little larger or smaller (wear, a soldered joint),
        # so neighbours overlap unevenly and the overlaps add (denser, towards saturation)
        p = along(at)
        tangent = along(at + 1.0) - along(at - 1.0)
        tangent /= max(float(np.linalg.norm(tangent)), 1e-9)
        yaw = g.normal(0.0, 0.25)
        tangent = np.array(
            [
                math.cos(yaw) * tangent[0] - math.sin(yaw) * tangent[1],
                math.sin(yaw) * tangent[0] + math.cos(yaw) * tangent[1],
            ]
        )
        normal = np.array([-tangent[1], tangent[0]])
        size = g.uniform(0.85, 1.15)
        step = pitch * (g.uniform(1.3, 1.5) if beads else g.uniform(0.7, 1.15))
        if beads:  # a hollow ball (its shell: the outer sphere's chord less the inner one's)
            bead = 0.8 * link_b * size
            centre_ = np.array([p, p])
            _wire(target, centre_, bead * px, 2 * bead * metal)
            _wire(target, centre_, 0.75 * bead * px, -1.5 * bead * metal)
            bar = np.array([p + 0.8 * bead * px * tangent, p + (step - 0.8 * bead * px) * tangent])
            _wire(target, bar, 0.6 * wire * px, 1.2 * wire * metal)
        else:
            phi = (k % 2) * math.pi / 2 + g.normal(0.0, 0.35) + twist
            t = np.linspace(0, 2 * math.pi, 16, endpoint=False)
            pts = (
                p
                + np.outer(size * link_a * px * np.cos(t), tangent)
                + np.outer(size * link_b * px * np.sin(t) * math.cos(phi), normal)
            )
            _wire(target, pts, wire * px, 2 * wire * metal, closed=True)
        at += step
        k += 1
    low = path[int(np.argmax(path[:, 1]))]
    if g.random() < 0.4:  # a pendant on a bail
        rot = _rotation(g, 0.7)
        bail = _loop(0.12, 0.12)
        _wire(
            target,
            _project(bail, rot, low + np.array([0, 0.12 * px]), px),
            0.03 * px,
            0.06 * metal,
            True,
        )
        kind = int(g.integers(0, 3))
        size = g.uniform(0.5, 1.1)
        t = np.linspace(0, 2 * math.pi, 40, endpoint=False)
        if kind == 0:  # a round or oval medallion
            shape = np.stack([size / 2 * np.cos(t), size / 2 * g.uniform(0.8, 1.2) * np.sin(t)], 1)
        elif kind == 1:  # a heart
            x = 16 * np.sin(t) ** 3
            y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
            shape = np.stack([x, y], 1) * size / 34
        else:  # a cross
            a_, b_ = size / 2, size / 7
            shape = np.array(
                [
                    [-b_, -a_ * 0.6],
                    [b_, -a_ * 0.6],
                    [b_, -b_],
                    [a_ * 0.6, -b_],
                    [a_ * 0.6, b_],
                    [b_, b_],
                    [b_, a_],
                    [-b_, a_],
                    [-b_, b_],
                    [-a_ * 0.6, b_],
                    [-a_ * 0.6, -b_],
                    [-b_, -b_],
                ]
            )
        shape = shape - [0.0, shape[:, 1].min() - 0.24]  # hangs below the bail
        flat = np.hstack([shape, np.zeros((len(shape), 1))])
        thick = g.uniform(0.04, 0.1)
        outline = _project(flat, rot, low, px)
        _relief_plate(target, g, outline, thick * metal / max(abs(rot[2, 2]), 0.3), px)
        _wire(target, _project(flat, rot, low, px), 0.02 * px, 0.3 * thick * metal, True)
    if g.random() < 0.5:  # the clasp: a spring ring and its tag on one side of the neck
        j = int(len(path) * g.uniform(0.12, 0.3))
        if g.random() < 0.5:
            j = len(path) - 1 - j
        rot = _rotation(g, 1.0)
        clasp = path[j]
        _wire(target, _project(_loop(0.22, 0.22), rot, clasp, px), 0.05 * px, 0.1 * metal, True)
        tag = _project(_loop(0.3, 0.13, 16, 0.5), rot, clasp + np.array([0.0, 0.4 * px]), px)
        _plate(target, tag, 0.04 * metal)


def _hook_eye(flip: float, size: float) -> np.ndarray:
    """One bra eye (cm, its own plane): a round steel wire bent in a U, its loop towards
    +x (``flip`` +1) or -x, its two legs sewn into the tape; ``size`` cm per unit (an eye
    about 0.6 x 0.4 cm at 1.8)."""
    t = np.linspace(-0.5 * math.pi, 0.5 * math.pi, 9)
    loop = np.stack([0.12 + 0.1 * np.cos(t), 0.1 * np.sin(t)], 1)
    legs = np.vstack([[[-0.22, -0.1]], loop, [[-0.22, 0.1]]])
    return np.hstack([legs * [flip * size, size], np.zeros((len(legs), 1))])


def _stamped_hook(
    target: np.ndarray,
    rot: np.ndarray,
    centre: np.ndarray,
    at: np.ndarray,
    px: float,
    value: float,
    size: float,
) -> None:
    """A stamped steel bra hook at ``at`` (cm in the closure's plane, ``size`` cm per unit
    as ``_hook_eye``): a flat shank plate
    sewn into the hook tape and its narrower tongue pointing to -x, bent back on itself at
    the end (two layers of sheet there: twice as dense); ``value`` one sheet's attenuation
    (display units, before the tilt's cosine)."""
    flat = max(abs(rot[2, 2]), 0.3)
    shank = np.array([[0.0, -0.13], [0.42, -0.12], [0.45, 0.0], [0.42, 0.12], [0.0, 0.13]])
    tongue = np.array([[-0.28, -0.05], [0.0, -0.06], [0.0, 0.06], [-0.28, 0.05]])
    bent = np.array([[-0.3, -0.05], [-0.16, -0.05], [-0.16, 0.05], [-0.3, 0.05]])
    for part in (shank, tongue, bent):
        local = np.hstack([part * size + at, np.zeros((len(part), 1))])
        _plate(target, _project(local, rot, centre, px), value / flat)


def _bra_hooks(target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float) -> None:
    """A bra's back closure: two or three rows 1.2-1.9 cm apart, each a row of two or three
    wire eyes (``_hook_eye``, 0.8-1.4 cm apart) with one hook engaged in a keyed column:
    mostly a stamped sheet hook (``_stamped_hook``: solid metal, not an outline), else a
    formed-wire hook (a U like an eye, its end bent back). Sewn into elastic tape that
    curves round the back and pulls unevenly, so the rows are bowed and each hook and eye
    sits a little off its grid (0.5 mm jitter, a few degrees of turn); the whole closure at
    a keyed 3D tilt."""
    rot = _rotation(g, 0.5, 0.2)
    rows = int(g.integers(2, 4))
    gap = g.uniform(1.2, 1.9)
    columns = int(g.integers(2, 4))
    size = g.uniform(1.6, 2.1)
    pitch = size * g.uniform(0.5, 0.65)
    engaged = int(g.integers(0, columns))
    metal = STEEL_MU * g.uniform(0.9, 1.3) / MU
    wire = g.uniform(0.02, 0.03)  # cm, the eye wire's radius
    stamped = g.random() < 0.7
    sheet = g.uniform(0.025, 0.04) * metal  # one layer of 0.25-0.4 mm steel sheet
    bow = g.uniform(-0.12, 0.12)  # cm of bow per cm^2 off the closure's middle row
    for r in range(rows):
        y = (r - (rows - 1) / 2) * gap
        shift = bow * y * y + g.normal(0.0, 0.06)
        for c in range(columns):
            spin = g.normal(0.0, 0.06)
            cs, sn = math.cos(spin), math.sin(spin)
            turn = np.array([[cs, -sn, 0.0], [sn, cs, 0.0], [0.0, 0.0, 1.0]])
            at = np.array([c * pitch + shift, y, 0.0])
            at[:2] += g.normal(0.0, 0.05, 2)
            eye = _hook_eye(1.0, size) @ turn.T + at
            _wire(target, _project(eye, rot, centre, px), wire * px, 2 * wire * metal)
        at = np.array([engaged * pitch + shift + 0.22 * size, y + g.normal(0.0, 0.04)])
        if stamped:
            _stamped_hook(target, rot, centre, at, px, sheet, size)
        else:
            hook = _hook_eye(-1.0, size)[::-1] + np.array([at[0] + 0.1 * size, at[1], 0.0])
            tip = np.array([[-0.02, 0.1, 0.0], [0.06, 0.04, 0.0]]) * size + np.append(at, 0.0)
            formed = np.vstack([hook, tip])
            _wire(target, _project(formed, rot, centre, px), 1.3 * wire * px, 2.6 * wire * metal)


def _strap_slider(
    target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float
) -> None:
    """A bra strap's adjuster over the shoulder, one of three keyed designs in steel: a
    slider (a frame with its central bar, the bar off-centre so the two openings differ,
    sometimes bowed), a plain ring (an O or a rounded rectangle) or a hook (a G-hook: a
    frame open on one side, bent back into a hook); of flattened wire 1-1.8 mm wide
    (its round-ish section denser along its middle, ``_wire``), in perspective at a keyed
    3D tilt, the frame's size and squareness keyed, sometimes with the strap's O ring
    beside it."""
    rot = _rotation(g, 1.0, 0.5)
    a, b = g.uniform(0.5, 0.9), g.uniform(0.3, 0.5)
    band = g.uniform(0.05, 0.09)  # cm: the flattened wire's half-width
    metal = STEEL_MU * g.uniform(0.8, 1.3) / MU
    value = 2 * g.uniform(0.04, 0.06) * metal / max(abs(rot[2, 2]), 0.3)
    design = int(g.choice(3, p=[0.45, 0.35, 0.2]))
    frame = _loop(a, b, 64, g.uniform(0.3, 1.0))
    if design == 2:  # a G-hook: the frame open on one side, its end turned back in
        frame = frame[6:-6]
        turn = frame[-1] + np.array([-0.3 * a, 0.25 * b, 0.0])
        frame = np.vstack([frame, turn])
    ring = _project(frame, rot, centre, px)
    _wire(target, ring, band * px, value, closed=design != 2)
    if design == 0:
        at = g.uniform(-0.35, 0.35) * a
        bow = g.uniform(-0.15, 0.15) * b
        bar = np.array([[at, -b * 0.95, 0.0], [at + bow, 0.0, 0.0], [at, b * 0.95, 0.0]])
        _wire(target, _project(bar, rot, centre, px), band * px, value)
    if g.random() < 0.4:
        wire = g.uniform(0.04, 0.06)
        o_ring = _loop(0.5, 0.5, 32) + np.array([0.0, b + 0.6, 0.0])
        _wire(target, _project(o_ring, rot, centre, px), wire * px, 2 * wire * metal, True)


def _underwire(target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float) -> None:
    """A bra's underwire: a flat steel band (2-3 mm wide, under 1 mm thick) bent in a U
    under the breast, seen at a tilt, so its projected width varies along the arc."""
    rot = _rotation(g, 0.6, 0.3)
    half, depth = g.uniform(4.0, 6.0), g.uniform(3.0, 4.5)
    t = np.linspace(g.uniform(0.0, 0.1) * math.pi, g.uniform(0.9, 1.0) * math.pi, 60)
    arc = np.stack([half * np.cos(t), depth * np.sin(t), 0.8 * np.sin(t) ** 2], 1)
    arc[:, 1] -= depth
    metal = STEEL_MU * g.uniform(0.8, 1.2) / MU
    _wire(target, _project(arc, rot, centre, px), 0.05 * px, 0.07 * metal)


def _fastener(target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float) -> None:
    """A clothing fastener of a keyed design, seen at a keyed tilt: a snap (a socket ring, a
    hollow torus denser at its edges, around the stud), a metal shank button (a domed disc
    with a rolled rim), or a plastic sew-through button (nearly radiolucent, two or four
    holes)."""
    rot = _rotation(g, 0.8)
    kind = int(g.integers(0, 3))
    metal = STEEL_MU * g.uniform(0.8, 1.3) / MU
    flat = max(abs(rot[2, 2]), 0.3)
    if kind == 0:
        r = g.uniform(0.4, 0.55)
        _wire(target, _project(_loop(r, r, 40), rot, centre, px), 0.08 * px, 0.16 * metal, True)
        _wire(
            target,
            _project(_loop(0.45 * r, 0.45 * r, 24), rot, centre, px),
            0.05 * px,
            0.1 * metal,
            True,
        )
        _plate(target, _project(_loop(r, r, 40), rot, centre, px), 0.02 * metal / flat)
    elif kind == 1:
        r = g.uniform(0.45, 0.7)
        disc = _project(_loop(r, r, 48), rot, centre, px)
        _relief_plate(target, g, disc, 0.03 * metal / flat, px)  # domed, embossed face
        _wire(target, disc, 0.04 * px, 0.05 * metal, True)  # the rolled rim
        _wire(
            target,
            _project(np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -0.3]]), rot, centre, px),
            0.08 * px,
            0.1 * metal,
        )
    else:
        r = g.uniform(0.55, 0.8)
        plastic = 0.5 / MU  # nylon / polyester: about 0.25 1/cm
        holes = (
            [(-0.25, 0.0), (0.25, 0.0)]
            if g.random() < 0.5
            else [(-0.22, -0.22), (0.22, -0.22), (-0.22, 0.22), (0.22, 0.22)]
        )
        _plate(target, _project(_loop(r, r, 48), rot, centre, px), 0.3 * plastic / flat)
        _wire(target, _project(_loop(r, r, 48), rot, centre, px), 0.06 * px, 0.4 * plastic, True)
        for hx, hy in holes:
            hole = _loop(0.08 * r / 0.6, 0.08 * r / 0.6, 12) + np.array(
                [hx * r / 0.6, hy * r / 0.6, 0.0]
            )
            _plate(target, _project(hole, rot, centre, px), -0.3 * plastic / flat)


def _hair_clip(target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float) -> None:
    """A bobby pin: a flat steel wire bent back on itself, one leg straight, the other crimped
    in waves, tilted in 3D."""
    rot = _rotation(g, 0.8)
    length = g.uniform(4.5, 6.0)
    s = np.linspace(0.0, length, 240)
    straight = np.stack([s, np.full_like(s, 0.1), np.zeros_like(s)], 1)
    wavy = np.stack(
        [s, -0.1 - 0.08 * (1 - np.cos(2 * math.pi * s / 0.6)) * (s > 0.5), np.zeros_like(s)], 1
    )
    turn = np.linspace(0.5 * math.pi, 1.5 * math.pi, 10)
    bend = np.stack([0.1 * np.cos(turn), 0.1 * np.sin(turn), np.zeros_like(turn)], 1)
    pin = np.vstack([straight[::-1], bend, wavy])
    metal = STEEL_MU * g.uniform(0.9, 1.2) / MU
    _wire(target, _project(pin - [length / 2, 0.0, 0.0], rot, centre, px), 0.04 * px, 0.08 * metal)


def _earring(target: np.ndarray, g: np.random.Generator, centre: np.ndarray, px: float) -> None:
    """An earring: a hoop (a round wire ring seen at a tilt, an ellipse denser where the beam
    runs along the wire) or a stud with its post and butterfly back."""
    rot = _rotation(g, 1.2)
    metal = STEEL_MU * g.uniform(1.0, 1.6) / MU
    if g.random() < 0.6:
        r = g.uniform(0.6, 1.2)
        _wire(target, _project(_loop(r, r, 48), rot, centre, px), 0.05 * px, 0.1 * metal, True)
    else:
        _plate(target, _project(_loop(0.25, 0.25, 20), rot, centre, px), 0.15 * metal)
        _wire(
            target,
            _project(np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -0.8]]), rot, centre, px),
            0.04 * px,
            0.08 * metal,
        )
        _plate(
            target,
            _project(_loop(0.3, 0.18, 20) + np.array([0.0, 0.0, -0.6]), rot, centre, px),
            0.05 * metal,
        )


# the foreign objects a film can get, each an item drawn in the canonical frame and moved with
# its anchor (``device_anchors``)
OBJECTS = (
    "necklace",
    "bra_hooks",
    "strap_slider",
    "fastener",
    "fastener",
    "underwire",
    "hair_clip",
    "earring",
)


def object_layers(key: int, h: int, w: int) -> _Placed:
    """This film's foreign objects drawn in the canonical frame, in a keyed order (a film's
    first ``items`` are shown: the same objects in the same places at every severity), each
    with its anchor: a necklace hanging from the neck to the sternal notch (stretched from the
    film's top to the found trachea), bra hooks on the back at the lower thorax, a strap slider
    over a shoulder, clothing fasteners down the front, an underwire under a breast, a hair
    clip and an earring at the film's top. Metal is drawn as the projected thickness of its 3D
    shape (``_wire``, ``_plate``) at ``STEEL_MU``."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_foreign_objects"))
    px = min(h, w) / FIELD_CM
    layers = _Placed(h, w)
    anchor = {k: np.array(_px(v, w, h)) for k, v in _CANONICAL_ANCHORS.items()}
    rank = np.argsort(g.permutation(len(OBJECTS)))  # canvas j is the film's rank[j]-th item
    right = g.random() < 0.5
    layers.choices = {
        "strap": "strap_right" if right else "strap_left",
        "breast": "dome_right" if g.random() < 0.5 else "dome_left",
    }
    fasteners = 0
    for j, kind in enumerate(OBJECTS):  # a fixed canvas order: the same placements per film
        target = np.zeros((h, w), np.float32)
        jitter = g.uniform(-1.0, 1.0, size=2) * px
        if kind == "necklace":
            name, placement = "trachea", "top"
            _necklace(target, g, anchor[name] + np.array([0.0, g.uniform(0.0, 3.0) * px]), px)
        elif kind == "bra_hooks":
            name, placement = "bra_band", "move"
            _bra_hooks(target, g, anchor[name] + jitter, px)
        elif kind == "strap_slider":
            name, placement = "strap", "move"
            _strap_slider(target, g, anchor[layers.choices[name]] + jitter, px)
        elif kind == "fastener":
            name, placement = "carina", "move"
            down = np.array([0.5 * jitter[0], (2.0 + 6.0 * fasteners) * px + jitter[1]])
            _fastener(target, g, anchor[name] + down, px)
            fasteners += 1
        elif kind == "underwire":
            name, placement = "breast", "move"
            at = anchor[layers.choices[name]] + np.array([0.0, -2.0 * px]) + jitter
            _underwire(target, g, at, px)
        elif kind == "hair_clip":
            name, placement = "top", "move"
            offset = g.choice([-1.0, 1.0]) * g.uniform(4.0, 8.0) * px
            _hair_clip(target, g, anchor[name] + np.array([offset, g.uniform(1.0, 2.5) * px]), px)
        else:
            name, placement = "top", "move"
            offset = g.choice([-1.0, 1.0]) * g.uniform(5.0, 9.0) * px
            _earring(target, g, anchor[name] + np.array([offset, g.uniform(1.0, 3.0) * px]), px)
        layers.add(int(rank[j]), target, (placement, name))
    layers.placed = [OBJECTS[j] for j in np.argsort(rank)]
    return layers


@register_kernel("xray_foreign_objects", sampler=_level_sampler)
def xray_foreign_objects(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Radiopaque objects on the patient (see ``object_layers``), moved onto the film's
    anatomy, blurred by the detector and noised like the film (``place_devices``).

    Kornia: own kernel: no Kornia equivalent (host-drawn attenuation canvases moved onto the
    landmarks by per-sample translations through ``grid_sample``)."""
    return _placed_on_anatomy(x, p, keys, object_layers, "xray_foreign_objects/noise", 1.0)


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
