"""Chest X-ray artifacts of the acquisition and of what lies on or in the patient.

Display model and helpers of :mod:`perturb.ops.xray` (MONOCHROME2 display ``v``, linear fluence
``I = exp(-MU v)``). Attenuating objects add to the display value (``v + mu t / MU``: the
Beer-Lambert attenuation of an object is a factor on ``I``, a shift in ``v``). Every op is
gray, 8- and 16-bit native in that the engine rounds the float32 result back to the input's
depth; none quantises on its own. Positions of devices and objects are fractions of the film
(chest films are centred on the thorax by positioning), sizes fractions of the shorter side.

Ops (physics after Bushberg et al., The Essential Physics of Medical Imaging, 3rd ed., ch. 7-8;
Hunter et al., "Medical devices on chest radiographs", RadioGraphics 24 (2004) for device
appearance; the flat-panel defects after Padgett & Kotre, Br J Radiol 77 (2004)):

* ``xray_patient_rotation``: the patient turned about the long axis (oblique projection). The
  thorax's mid-coronal plane, rotated by ``degrees`` about a vertical axis through the spine
  and projected from a point source at ``SID_CM`` onto the detector: a 2-D homography
  (foreshortening ``cos``, a lateral shift of the mediastinum away from the spine line, the
  side turned towards the source magnified more than the other). A projection has no depth per
  pixel, so the parallax between anterior and posterior structures (clavicle heads against
  the spinous processes) is modelled only through that plane. Boxes and ``<loc>`` tags follow
  (``forward_homography``, registered as the op's ``Geometry``).
* ``xray_under_penetration`` / ``xray_over_penetration``: a tube voltage below / above the
  technique's. Attenuation coefficients scale roughly as ``kVp^-n`` (``n = KVP_EXPONENT``), so
  the line integrals become ``m = (kVp/kVp0)^-n`` times larger (``v' = m v``: under-penetration
  raises contrast, whites out the mediastinum and hides the spine behind the heart;
  over-penetration flattens and darkens the film; the op claims lower contrast); the quanta reaching the detector change with
  the transmission and the tube output (``~ kVp^2`` at fixed mAs), and the added quantum noise
  is the difference between the new and the old noise variance (never negative).
* ``xray_support_devices``: ECG electrodes and leads, central venous catheter, endotracheal and
  nasogastric tubes, pacemaker with its lead, drawn as attenuating objects with their real
  radiodensity (lucent tube lumens with a barium stripe, a generator with battery, circuit
  and header, electrodes with dense snap studs) and placed on the film's own anatomy
  (midline, lungs, apices, domes and body edges found from the pixels: ``chest_landmarks``).
* ``xray_detector_defects``: uncorrected flat-panel defects: dead (white) and hot (black)
  pixels, dead lines (a row or column without signal, or with half gain), and the seam between
  detector tiles with a gain mismatch across it.
* ``xray_grid_cutoff``: a focused grid used off focus / upside down (transmission falling with
  the lateral distance from the grid centre, both sides) or decentred (one side), as
  ``1 - loss |x - c|`` on the fluence (Bushberg 7.5: lost fraction ~ ratio x |1/f0 - 1/f1|).
* ``xray_edge_enhancement``: vendor unsharp-mask processing ``v + k (v - G_sigma * v)`` with a
  wide kernel: rebound halos (overshoot and undershoot) along every edge.
* ``xray_double_exposure``: the same plate exposed twice with the patient moved in between: the
  detector adds the fluences ``(I + w I(x - d)) / (1 + w)``.
* ``xray_foreign_objects``: radiopaque things on the patient: clothing buttons, bra hooks and
  snaps, a necklace with a pendant, hair clips, earrings.
* ``xray_cardiac_motion``: the heart and the diaphragm move during a long exposure (portable
  films, a patient who cannot hold the breath): the left heart border blurs laterally and the
  diaphragm domes vertically; a box (line) PSF of ``length`` on the linear fluence, weighted by
  smooth masks at the usual places of the left ventricle and the domes (``motion_masks``), the
  rest of the film sharp.
* ``xray_skin_fold``: a fold of skin trapped between the patient's back and the detector (supine
  and portable films): the doubled skin adds attenuation that ends in a sharp curvilinear edge
  over the lateral lung and fades away from it, the classic pneumothorax mimic (lung markings
  continue across it).

Torch path (what runs on CUDA): each op is one batched computation over the batch, its
per-sample parameters used as (B, ...) tensors and never read back to the host. Keyed fields
come from ``keyed_fields.uniform_fields`` / ``normal_fields`` (the rows are ``perturb.rng``'s per-sample fields
bit for bit), box filters with per-sample radii from ``box_mean`` (one cumulative sum), the
rotation from one ``warp_perspective`` call with (B, 3, 3) matrices. Devices and foreign objects
are drawn with OpenCV's anti-aliased primitives; their canvases depend on the key alone, so
they are drawn on the host from the (host-side) keys and selected and scaled on the device by
the ``items`` and ``opacity`` tensors. Devices are drawn in a canonical frame and moved onto
each film's landmarks, found on the device in one batched pass, by per-sample axis-aligned
maps (one ``grid_sample`` per canvas for the whole batch; the CPU path runs the same code one
film at a time). The CPU path of every op is the per-sample code whose
bytes the golden outputs pin; the torch path gives the same values (the rotation within 5e-5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from perturb import rng
from perturb.ops import backend, keyed_fields
from perturb.ops._math import per_sample, shorter_side
from perturb.ops.registry import (
    Geometry,
    Level,
    Params,
    as_float32,
    draw,
    draw_int,
    draw_sign,
    register_kernel,
)
from perturb.ops.xray import (
    FIELD_CM,
    FULL_DOSE_QUANTA,
    MU,
    REFERENCE_SIDE,
    _box_torch,
    _coords,
    _wide,
    box_radius,
    scale_linear,
    to_display,
    to_linear,
)

SID_CM = 180.0  # source-image distance of a PA chest film
MIDPLANE_CM = 12.0  # height of the thorax's mid-coronal plane above the detector (PA)
SPINE_CM = 5.0  # height of the rotation axis (the spine) above the detector
KVP_EXPONENT = 1.2  # effective mu ~ kVp^-n over the diagnostic range (soft tissue and bone mixed)


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


# ---------------------------------------------------------------------------------------------
# Batched torch-path helpers: keyed fields and box means for a whole batch in one pass


def box_mean(v: torch.Tensor, r: torch.Tensor, dim: int) -> torch.Tensor:
    """Box mean of width ``2 r + 1`` along ``dim`` (-1 or -2) of a (B, C, H, W) float64 batch
    with a per-sample radius ``r`` ((B,) int64, 0 <= r <= size - 1), reflected borders
    (BORDER_REFLECT_101, as ``_box_torch``), from one cumulative sum ``P`` (``P[m]`` the sum
    of the first ``m`` values): the window's in-range part ``P[min(j + r, n - 1) + 1] -
    P[max(j - r, 0)]`` plus its reflected parts, ``P[k + 1] - P[1]`` for the ``k`` values
    reflected at the start and ``P[n - 1] - P[n - 1 - k]`` for those at the end."""
    n = v.shape[dim]
    b = v.shape[0]
    c = torch.cumsum(v, dim=dim)
    prefix = torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c], dim=dim)  # n + 1 entries
    j = torch.arange(n, device=v.device).view(1, n)
    rr = r.view(b, 1)
    lo, hi = j - rr, j + rr
    shape = (b, 1, 1, n) if dim == -1 else (b, 1, n, 1)

    def at(index: torch.Tensor) -> torch.Tensor:
        return torch.take_along_dim(prefix, index.view(shape), dim=dim)

    total = at(hi.clamp(max=n - 1) + 1) - at(lo.clamp(min=0))
    total = total + (at((-lo).clamp(min=0) + 1) - prefix.narrow(dim, 1, 1))
    total = total + (prefix.narrow(dim, n - 1, 1) - at(n - 1 - (hi - (n - 1)).clamp(min=0)))
    return total / (2 * r + 1).to(v.dtype).view(b, 1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Patient rotation (oblique projection): a homography of the mid-coronal plane


def forward_homography(degrees: float, pivot: float, width: int, height: int) -> np.ndarray:
    """3x3 map from clean to rotated continuous pixel coordinates: the mid-coronal plane
    rotated by ``degrees`` about a vertical axis through the spine at lateral position
    ``pivot`` (fraction of the width from the centre) and at height ``SPINE_CM``, projected
    from a point source ``SID_CM`` above the film centre. The shorter side spans ``FIELD_CM``."""
    side = min(width, height)
    cm = FIELD_CM / side  # cm per pixel
    cx, cy = width / 2.0, height / 2.0
    d, z0, zp = SID_CM, MIDPLANE_CM, SPINE_CM
    xp = pivot * width * cm
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    # clean pixel -> (X, Y) on the plane (cm): undo the magnification d / (d - z0)
    to_plane = np.array(
        [
            [cm * (d - z0) / d, 0, -cx * cm * (d - z0) / d],
            [0, cm * (d - z0) / d, -cy * cm * (d - z0) / d],
            [0, 0, 1],
        ]
    )
    # rotated position: X' = xp + (X - xp) c - (z0 - zp) s, Z' = zp + (X - xp) s + (z0 - zp) c
    # projection: x = X' d / (d - Z'), y = Y d / (d - Z'): homogeneous (X' d, Y d, d - Z')
    rot = np.array(
        [
            [c * d, 0.0, (xp - xp * c - (z0 - zp) * s) * d],
            [0.0, d, 0.0],
            [-s, 0.0, d - zp + xp * s - (z0 - zp) * c],
        ]
    )
    to_pixels = np.array([[1 / cm, 0, cx], [0, 1 / cm, cy], [0, 0, 1]])
    h = to_pixels @ rot @ to_plane
    return h / h[2, 2]


def forward_homographies(
    degrees: torch.Tensor, pivot: torch.Tensor, width: int, height: int
) -> torch.Tensor:
    """``forward_homography`` of every sample at once: (B, 3, 3) float64 from (B,) tensors."""
    side = min(width, height)
    cm = FIELD_CM / side
    cx, cy = width / 2.0, height / 2.0
    d, z0, zp = SID_CM, MIDPLANE_CM, SPINE_CM
    xp = pivot.double() * width * cm
    angle = degrees.double() * (math.pi / 180.0)
    c, s = torch.cos(angle), torch.sin(angle)
    shrink = cm * (d - z0) / d
    to_plane = torch.tensor(
        [[shrink, 0.0, -cx * shrink], [0.0, shrink, -cy * shrink], [0.0, 0.0, 1.0]],
        dtype=torch.float64,
        device=degrees.device,
    )
    to_pixels = torch.tensor(
        [[1 / cm, 0.0, cx], [0.0, 1 / cm, cy], [0.0, 0.0, 1.0]],
        dtype=torch.float64,
        device=degrees.device,
    )
    zero, one = torch.zeros_like(c), torch.ones_like(c)
    rot = torch.stack(
        [
            c * d,
            zero,
            (xp - xp * c - (z0 - zp) * s) * d,
            zero,
            one * d,
            zero,
            -s,
            zero,
            d - zp + xp * s - (z0 - zp) * c,
        ],
        dim=-1,
    ).view(-1, 3, 3)
    h = to_pixels @ rot @ to_plane
    return h / h[:, 2:3, 2:3]


def _inverse3(m: torch.Tensor) -> torch.Tensor:
    """Inverses of a (B, 3, 3) stack through the adjugate (elementwise: no solver, no sync)."""
    a, b, c = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2]
    d, e, f = m[:, 1, 0], m[:, 1, 1], m[:, 1, 2]
    g, h, i = m[:, 2, 0], m[:, 2, 1], m[:, 2, 2]
    adj = torch.stack(
        [
            e * i - f * h,
            c * h - b * i,
            b * f - c * e,
            f * g - d * i,
            a * i - c * g,
            c * d - a * f,
            d * h - e * g,
            b * g - a * h,
            a * e - b * d,
        ],
        dim=-1,
    ).view(-1, 3, 3)
    det = a * adj[:, 0, 0] + b * adj[:, 1, 0] + c * adj[:, 2, 0]
    return adj / det.view(-1, 1, 1)


def _rotation_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "degrees": draw(rng_, level["degrees"]) * draw_sign(rng_),
        "pivot": draw(rng_, level["pivot"]) * draw_sign(rng_),
    }


def _source_positions(
    inverse: np.ndarray, h: int, w: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (H, W) source positions (continuous pixel coordinates) of every output pixel
    centre under the output -> input homography ``inverse``."""
    ys = torch.arange(h, dtype=torch.float64, device=device) + 0.5
    xs = torch.arange(w, dtype=torch.float64, device=device) + 0.5
    m = torch.from_numpy(inverse).to(device)
    den = m[2, 0] * xs[None, :] + m[2, 1] * ys[:, None] + m[2, 2]
    px = (m[0, 0] * xs[None, :] + m[0, 1] * ys[:, None] + m[0, 2]) / den
    py = (m[1, 0] * xs[None, :] + m[1, 1] * ys[:, None] + m[1, 2]) / den
    return px, py


def warp_homography(
    sample: torch.Tensor, inverse: np.ndarray, mode: str = "bicubic"
) -> torch.Tensor:
    """Resample one CHW float sample through the output -> input homography ``inverse``
    (continuous pixel coordinates): bicubic (a = -0.75, ``grid_sample``) or ``nearest`` (label
    maps), 0 outside the film."""
    _c, h, w = sample.shape
    px, py = _source_positions(inverse, h, w, sample.device)
    inside = (px >= 0) & (px < w) & (py >= 0) & (py < h)
    grid = torch.stack([px * (2.0 / w) - 1.0, py * (2.0 / h) - 1.0], dim=-1).to(sample.dtype)
    out = F.grid_sample(
        sample[None], grid[None], mode=mode, padding_mode="border", align_corners=False
    )[0]
    out = out * inside.to(out.dtype)
    return out.clamp_(0.0, 1.0) if mode == "bicubic" else out


def rotation_label_maps(m: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label maps (B, C, H, W, any dtype) moved as ``xray_patient_rotation`` moves the image:
    nearest sampling, 0 where the film is uncovered."""
    h, w = m.shape[-2:]
    out = []
    for i in range(m.shape[0]):
        fwd = forward_homography(float(p["degrees"][i]), float(p["pivot"][i]), w, h)
        out.append(
            warp_homography(m[i].to(torch.float64), np.linalg.inv(fwd), mode="nearest").to(m.dtype)
        )
    return torch.stack(out) if out else m.clone()


def _rotation_homography(p: Mapping[str, Any], width: int, height: int) -> np.ndarray:
    return forward_homography(as_float32(p["degrees"]), as_float32(p["pivot"]), width, height)


@register_kernel(
    "xray_patient_rotation",
    sampler=_rotation_sampler,
    geometry=Geometry(rotation_label_maps, matrix=_rotation_homography),
)
def xray_patient_rotation(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Oblique projection of a rotated patient (see the module docstring).

    Kornia: ``kornia.geometry.transform.warp_perspective`` on the torch path, one call for
    the batch with its (B, 3, 3) matrices (bicubic; within 8e-5 of the reference, 2-3x faster
    on CPU); the CPU path (there is no OpenCV one) keeps ``warp_homography``'s float64 sampling
    grid, whose bytes the golden outputs pin."""
    h, w = x.shape[-2:]

    def host() -> torch.Tensor:
        forwards = [
            forward_homography(float(p["degrees"][i]), float(p["pivot"][i]), w, h)
            for i in range(x.shape[0])
        ]
        return torch.stack(
            [warp_homography(x[i], np.linalg.inv(f)) for i, f in enumerate(forwards)]
        )

    return backend.by_path(
        x,
        host=host,
        device=lambda: _warp_homographies_kornia(
            x, forward_homographies(p["degrees"], p["pivot"], w, h)
        ),
    )


def _warp_homographies_kornia(x: torch.Tensor, forwards: torch.Tensor) -> torch.Tensor:
    """``warp_homography`` of a batch through Kornia: ``forwards`` ((B, 3, 3) float64, input
    -> output, continuous pixel coordinates) moved to pixel-index coordinates (centres at
    integers), bicubic with border padding, then 0 outside the film (the same float64 test
    as ``warp_homography``)."""
    import kornia  # lazily: only the torch path needs it

    b = x.shape[0]
    h, w = x.shape[-2:]
    shift = torch.eye(3, dtype=torch.float64, device=x.device)
    to_index, from_index = shift.clone(), shift.clone()
    to_index[:2, 2], from_index[:2, 2] = -0.5, 0.5
    matrices = (to_index @ forwards @ from_index).to(x.dtype)
    out = kornia.geometry.transform.warp_perspective(
        x, matrices, (h, w), mode="bicubic", padding_mode="border", align_corners=True
    )
    m = _inverse3(forwards).view(b, 3, 3, 1, 1)
    ys = (torch.arange(h, dtype=torch.float64, device=x.device) + 0.5).view(1, h, 1)
    xs = (torch.arange(w, dtype=torch.float64, device=x.device) + 0.5).view(1, 1, w)
    den = m[:, 2, 0] * xs + m[:, 2, 1] * ys + m[:, 2, 2]
    px = (m[:, 0, 0] * xs + m[:, 0, 1] * ys + m[:, 0, 2]) / den
    py = (m[:, 1, 0] * xs + m[:, 1, 1] * ys + m[:, 1, 2]) / den
    inside = ((px >= 0) & (px < w) & (py >= 0) & (py < h)).view(b, 1, h, w)
    return (out * inside.to(out.dtype)).clamp_(0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Under- and over-penetration (tube voltage): contrast and noise together


def _kvp_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"kvp_ratio": draw(rng_, level["kvp_ratio"])}


def penetration(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], stream: str
) -> torch.Tensor:
    """``v' = m v`` with ``m = kvp_ratio^-KVP_EXPONENT``, plus the extra quantum noise: display
    noise std ``1 / (MU sqrt(Q I))`` at full dose with ``Q = N0 ratio^2`` after and ``N0``
    before; the old noise is scaled by ``m`` with the image, the new one is added as the
    gaussian difference ``sqrt(max(s_new^2 - m^2 s_old^2, 0))``."""
    ratio = per_sample(p["kvp_ratio"]).double()
    m = torch.pow(ratio, -KVP_EXPONENT)
    v = _wide(x)
    q_old = FULL_DOSE_QUANTA * (REFERENCE_SIDE / shorter_side(x)) ** 2
    q_new = q_old * ratio * ratio
    v_new = v * m
    var_old = torch.exp(v * MU) / (MU * MU * q_old)
    var_new = torch.exp(v_new * MU) / (MU * MU * q_new)
    extra = (var_new - m * m * var_old).clamp_(min=0.0).sqrt_()
    shape = tuple(x.shape[1:])
    z = backend.by_path(
        x,
        host=lambda: torch.stack([rng.normal_field(k, stream, shape, x.device) for k in keys]),
        device=lambda: keyed_fields.normal_fields(keys, stream, shape, x.device),
    ).double()
    return (v_new + extra * z).clamp_(0.0, 1.0).to(x.dtype)


@register_kernel("xray_under_penetration", sampler=_kvp_sampler)
def xray_under_penetration(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Too low a tube voltage (``kvp_ratio`` < 1): more contrast, white mediastinum, more noise
    behind the dense parts (see ``penetration``).

    Kornia: own kernel: no Kornia equivalent (kVp-scaled attenuation and keyed quantum noise)."""
    return penetration(x, p, keys, "xray_under_penetration/noise")


@register_kernel("xray_over_penetration", sampler=_kvp_sampler)
def xray_over_penetration(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Too high a tube voltage (``kvp_ratio`` > 1): flat, dark, gray film; lower contrast (the
    op claims it); the noise falls, but in the lungs less than the contrast does, so a little is
    added there (see ``penetration``).

    Kornia: own kernel: no Kornia equivalent (kVp-scaled attenuation and keyed quantum noise)."""
    return penetration(x, p, keys, "xray_over_penetration/noise")


# ---------------------------------------------------------------------------------------------
# Support devices: placed from landmarks found on the film


def _level_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"items": draw_int(rng_, level["items"]), "opacity": draw(rng_, level["opacity"])}


LANDMARK_GRID = 64  # the films are reduced to this square (area means) to find the landmarks
# landmarks (fractions of the width for x, of the height for y): midline, image-left and
# image-right lung centres, lung apex, image-left and image-right diaphragm domes, body edges
# (image left and right) at the upper and at the lower electrode rows
LANDMARKS = (
    "mid",
    "lung_left",
    "lung_right",
    "apex",
    "dome_left",
    "dome_right",
    "body_left_upper",
    "body_right_upper",
    "body_left_lower",
    "body_right_lower",
)
# an average centred PA film (the canonical frame the devices are drawn in), and the range a
# detected landmark must fall in to be used (else the canonical value stands)
CANONICAL = (0.5, 0.3, 0.7, 0.12, 0.66, 0.7, 0.04, 0.96, 0.04, 0.96)
PLAUSIBLE = (
    (0.38, 0.62),
    (0.12, 0.45),
    (0.55, 0.88),
    (0.02, 0.35),
    (0.45, 0.95),
    (0.45, 0.95),
    (0.0, 0.3),
    (0.7, 1.0),
    (0.0, 0.3),
    (0.7, 1.0),
)
LUNG_CM = 24.0  # apex to dome of an adult lung, the scale of the device offsets


def _smooth(profile: torch.Tensor, width: int = 5) -> torch.Tensor:
    """Running mean along the last axis of a (B, n) profile (replicated ends)."""
    pad = width // 2
    padded = F.pad(profile.unsqueeze(1), (pad, pad), mode="replicate")
    return F.avg_pool1d(padded, width, stride=1).squeeze(1)


def chest_landmarks(x: torch.Tensor) -> torch.Tensor:
    """The landmarks of every film of a (B, 1, H, W) batch, (B, 10) float64 in ``LANDMARKS``
    order, found from the pixels in one batched pass over a 64 x 64 reduction:

    * contrast stretched between the 2nd and 98th percentiles of each film;
    * midline: the brightest column (mediastinum and spine) of the mid-thorax rows, within the
      central 30-70 % of the width; refined in the upper thorax between the lungs;
    * lung centres: the darkest column on either side of it, 8-28 % of the width away (not
      farther: the air beside the chest or between an abducted arm and the chest is darker);
    * apex and domes: along a band through each lung centre, the dark run around its darkest
      row, bounded above by the shoulders and clavicles and below by the diaphragm;
    * body edges: along the upper and lower electrode rows, lateral to each lung, the nearest
      column brighter than air (0.22 of the stretched range: the chest wall), then the nearest
      air column beyond it (the skin's edge; black padding and the gap between an abducted arm
      and the chest wall are air); the film's edge where the body fills the film.

    A landmark outside its plausible range (``PLAUSIBLE``; a flat or featureless image) takes
    the canonical film's value (``CANONICAL``). No value is read back to the host."""
    n = LANDMARK_GRID
    b = x.shape[0]
    dev = x.device
    small = F.adaptive_avg_pool2d(x[:, :1].to(torch.float64), (n, n)).view(b, n, n)
    flat = small.view(b, n * n)
    lo = torch.quantile(flat, 0.02, dim=1).view(b, 1, 1)
    hi = torch.quantile(flat, 0.98, dim=1).view(b, 1, 1)
    s = (small - lo) / (hi - lo).clamp(min=1e-6)
    idx = torch.arange(n, device=dev, dtype=torch.float64).view(1, n)
    centre = (idx + 0.5) / n
    neg = torch.tensor(-1e9, dtype=torch.float64, device=dev)
    pos = torch.tensor(1e9, dtype=torch.float64, device=dev)

    columns = _smooth(s[:, n // 4 : 3 * n // 4].mean(dim=1))
    mid0 = centre[0][torch.where((centre > 0.3) & (centre < 0.7), columns, neg).argmax(dim=1)]
    off = centre - mid0.view(b, 1)
    left = centre[0][torch.where((off < -0.08) & (off > -0.28), columns, pos).argmin(dim=1)]
    right = centre[0][torch.where((off > 0.08) & (off < 0.28), columns, pos).argmin(dim=1)]

    def lung_run(lung: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        band = ((centre - lung.view(b, 1)).abs() < 0.05).to(torch.float64).view(b, 1, n)
        rows = _smooth((s * band).sum(dim=2) / band.sum(dim=2).clamp(min=1.0), 3)
        darkest = torch.where((centre > 0.15) & (centre < 0.7), rows, pos).argmin(dim=1)
        low = rows.gather(1, darkest.view(b, 1))
        threshold = low + 0.45 * (rows.amax(dim=1, keepdim=True) - low)
        bright = rows > threshold
        r0 = darkest.view(b, 1).to(torch.float64)
        above = torch.where(bright & (idx < r0), idx, torch.full_like(idx, -1.0)).amax(dim=1)
        below = torch.where(bright & (idx > r0), idx, torch.full_like(idx, n)).amin(dim=1)
        return (above + 1.0) / n, below / n

    apex_left, dome_left = lung_run(left)
    apex_right, dome_right = lung_run(right)
    dome = (dome_left + dome_right) / 2.0
    apex = torch.minimum(torch.minimum(apex_left, apex_right), dome - 0.42)  # lungs are tall
    upper = (centre > apex.view(b, 1)) & (centre < (apex + 0.3 * (dome - apex)).view(b, 1))
    upper_columns = _smooth(
        (s * upper.to(torch.float64).view(b, n, 1)).sum(dim=1)
        / upper.sum(dim=1).view(b, 1).clamp(min=1)
    )
    between = (centre > left.view(b, 1) + 0.04) & (centre < right.view(b, 1) - 0.04)
    mid = centre[0][torch.where(between, upper_columns, neg).argmax(dim=1)]

    def body_edges(row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Lateral to each lung: the nearest column brighter than air (the chest wall), then
        the nearest column beyond it that is air again (the skin's edge; else the film's)."""
        near = ((centre - row.view(b, 1)).abs() < 0.04).to(torch.float64).view(b, n, 1)
        profile = (s * near).sum(dim=1) / near.sum(dim=1).clamp(min=1.0)
        body = profile > 0.22
        none_left, none_right = torch.full_like(idx, -1.0), torch.full_like(idx, n)
        wall = torch.where(body & (centre < left.view(b, 1)), idx, none_left).amax(dim=1)
        edge = torch.where(~body & (idx < wall.view(b, 1)), idx, none_left).amax(dim=1)
        wall_r = torch.where(body & (centre > right.view(b, 1)), idx, none_right).amin(dim=1)
        edge_r = torch.where(~body & (idx > wall_r.view(b, 1)), idx, none_right).amin(dim=1)
        return (edge + 1.0) / n, edge_r / n

    upper_left, upper_right = body_edges(apex + 0.04)
    lower_left, lower_right = body_edges(dome + 0.06)
    found = torch.stack(
        [
            mid,
            left,
            right,
            apex,
            dome_left,
            dome_right,
            upper_left,
            upper_right,
            lower_left,
            lower_right,
        ],
        dim=1,
    )
    bounds = torch.tensor(PLAUSIBLE, dtype=torch.float64, device=dev)
    canonical = torch.tensor(CANONICAL, dtype=torch.float64, device=dev).view(1, -1)
    ok = (found >= bounds[:, 0]) & (found <= bounds[:, 1])
    ok = ok & ((hi - lo).view(b, 1) > 0.05)  # a featureless film: all canonical
    return torch.where(ok, found, canonical)


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


# ---------------------------------------------------------------------------------------------
# Foreign objects on the patient


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


# ---------------------------------------------------------------------------------------------
# Detector defects


def _defects_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "dead_fraction": draw(rng_, level["dead_fraction"]),
        "lines": draw_int(rng_, level["lines"]),
        "seam_gain": draw(rng_, level["seam_gain"]) * draw_sign(rng_),
    }


MAX_LINES = 8  # candidate dead lines drawn per film (the catalog's bound on ``lines``)


def defect_lines(key: int, h: int, w: int, n: int) -> list[tuple[bool, int, bool]]:
    """The film's first ``n`` dead lines: (is a column, index, dead rather than half gain)."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_detector_defects/lines"))
    out = []
    for _ in range(MAX_LINES):
        column = bool(g.random() < 0.6)
        index = int(g.integers(0, w if column else h))
        out.append((column, index, bool(g.random() < 0.5)))
    return out[:n]


@register_kernel("xray_detector_defects", sampler=_defects_sampler)
def xray_detector_defects(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Uncorrected flat-panel defects. The panel is two tiles side by side with a seam at the
    centre column: the right tile's gain is ``1 + seam_gain`` (a display step of
    ``-ln(1 + g) / MU``) and the seam column has no signal. Dead lines: a row or column with no
    signal (white) or half gain. Dead pixels: a keyed ``dead_fraction`` of pixels, half without
    signal (white), half saturated (hot, black).

    Kornia: own kernel: no Kornia equivalent (keyed dead lines and tile seams)."""
    return backend.by_path(
        x, host=lambda: _defects_host(x, p, keys), device=lambda: _defects_batched(x, p, keys)
    )


def _defects_host(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """The CPU path of ``xray_detector_defects``, one sample at a time (its bytes are pinned)."""
    h, w = x.shape[-2:]
    out = []
    for i, k in enumerate(keys):
        v = _wide(x[i])
        seam = w // 2
        step = math.log1p(float(p["seam_gain"][i])) / MU
        v = torch.cat([v[..., :seam], v[..., seam:] - step], dim=-1)
        v[..., seam] = 1.0
        for column, index, dead in defect_lines(int(k), h, w, round(float(p["lines"][i]))):
            line = v[..., index] if column else v[..., index, :]
            line.copy_(torch.ones_like(line) if dead else line + math.log(2.0) / MU)
        u = rng.uniform_field(
            int(k), "xray_detector_defects/pixels", tuple(x.shape[1:]), x.device
        ).double()
        frac = float(p["dead_fraction"][i])
        v = torch.where(u < frac / 2, torch.ones_like(v), v)
        v = torch.where((u >= frac / 2) & (u < frac), torch.zeros_like(v), v)
        out.append(v.clamp_(0.0, 1.0).to(x.dtype))
    return torch.stack(out)


def _defects_batched(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """``_defects_host`` for the whole batch at once. Each film's candidate dead lines come
    from its key on the host (``defect_lines``) as a (B, MAX_LINES) table; the first ``lines``
    are valid. A pixel on any valid dead line is white; otherwise each half-gain line through
    it adds ``ln 2 / MU`` (the host applies them one after the other: the same values, up to
    float64 rounding where two half-gain lines cross)."""
    b = x.shape[0]
    h, w = x.shape[-2:]
    dev = x.device
    v = _wide(x)
    seam = w // 2
    cols = torch.arange(w, device=dev).view(1, 1, 1, w)
    step = per_sample(torch.log1p(p["seam_gain"].double()) / MU)
    v = torch.where(cols >= seam, v - step, v)
    v = torch.where(cols == seam, torch.ones_like(v), v)
    table = torch.tensor(
        [defect_lines(int(k), h, w, MAX_LINES) for k in keys], dtype=torch.int64, device=dev
    ).view(b, MAX_LINES, 3)
    valid = torch.arange(MAX_LINES, device=dev).view(1, -1) < torch.round(p["lines"]).view(b, 1)
    column, index, dead = table[..., 0] > 0, table[..., 1], table[..., 2] > 0

    def hits(is_axis: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, size) dead-line cover and half-gain line count along one axis."""
        on = (valid & is_axis).unsqueeze(-1) & (
            index.unsqueeze(-1) == torch.arange(size, device=dev).view(1, 1, size)
        )
        return (on & dead.unsqueeze(-1)).any(dim=1), (on & ~dead.unsqueeze(-1)).sum(dim=1)

    dead_rows, half_rows = hits(~column, h)
    dead_cols, half_cols = hits(column, w)
    white = dead_rows.view(b, 1, h, 1) | dead_cols.view(b, 1, 1, w)
    halves = half_rows.view(b, 1, h, 1) + half_cols.view(b, 1, 1, w)
    v = torch.where(white, torch.ones_like(v), v + halves.to(v.dtype) * (math.log(2.0) / MU))
    u = keyed_fields.uniform_fields(keys, "xray_detector_defects/pixels", tuple(x.shape[1:]), dev).double()
    frac = per_sample(p["dead_fraction"].double())
    v = torch.where(u < frac / 2, torch.ones_like(v), v)
    v = torch.where((u >= frac / 2) & (u < frac), torch.zeros_like(v), v)
    return v.clamp_(0.0, 1.0).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Grid cut-off


def _cutoff_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "loss": draw(rng_, level["loss"]),
        "centre": draw(rng_, level["centre"]) * draw_sign(rng_),
        "decentred": float(rng_.random() < 0.35),
    }


def cutoff_gain(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Transmitted fraction (B,1,1,W float64) of a misused focused grid with vertical lead
    strips, ``u`` the lateral position in [-1, 1]: off focus / upside down
    ``1 - loss |u - centre|`` (both sides), decentred ``1 - loss (u - centre + 1) / 2``
    (one side); at least 0.05."""
    _, xs = _coords(x)
    u = xs / (x.shape[-1] / 2.0)
    c = per_sample(p["centre"]).double()
    both = (u - c).abs()
    one = ((u - c) + 1.0) / 2.0
    dec = per_sample(p["decentred"]).double()
    shape = both * (1.0 - dec) + one * dec
    return (1.0 - per_sample(p["loss"]).double() * shape).clamp_(min=0.05)


@register_kernel("xray_grid_cutoff", sampler=_cutoff_sampler)
def xray_grid_cutoff(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Grid cut-off: lateral density fall-off on the fluence (see ``cutoff_gain``).

    Kornia: own kernel: no Kornia equivalent (an analytic lateral fall-off of the fluence)."""
    return scale_linear(x, cutoff_gain(x, p))


# ---------------------------------------------------------------------------------------------
# Edge enhancement (unsharp mask)


def _unsharp_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"amount": draw(rng_, level["amount"]), "sigma": draw(rng_, level["sigma"])}


def box_gaussian(v: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """Three box passes per axis (a gaussian of ``sigma_px`` to within half a pixel), reflected
    borders, float64 cumulative sums (exact summation order on every device)."""
    r = box_radius(sigma_px, min(v.shape[-2], v.shape[-1]))
    g = v
    for _ in range(3):
        g = _box_torch(_box_torch(g, r, -1), r, -2)
    return g


@register_kernel("xray_edge_enhancement", sampler=_unsharp_sampler)
def xray_edge_enhancement(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Unsharp masking of the display image, ``v + amount (v - G_sigma * v)`` (``sigma`` a
    fraction of the shorter side): overshoot on the bright side of every edge, undershoot on
    the dark side (the rebound halo around the heart, diaphragm and devices).

    Kornia: own kernel, because Kornia's ``unsharp_mask`` blurs with ``gaussian_blur2d`` (O(sigma)
    taps per pixel) while this op's low-pass is three box passes through ``_box_torch`` cumulative
    sums (O(1) per pixel; see ``xray_scatter`` for the measured speed) and is also the CPU path,
    whose bytes the golden outputs pin. The torch path runs the whole batch at once with
    per-sample radii (``box_mean``)."""
    side = shorter_side(x)

    def host() -> torch.Tensor:
        out = []
        for i in range(x.shape[0]):
            v = _wide(x[i : i + 1])
            low = box_gaussian(v, float(p["sigma"][i]) * side)
            out.append((v + float(p["amount"][i]) * (v - low)).clamp_(0.0, 1.0).to(x.dtype))
        return torch.cat(out)

    def device() -> torch.Tensor:
        v = _wide(x)
        sigma_px = p["sigma"].double() * side
        width = torch.sqrt(4.0 * sigma_px * sigma_px + 1.0)  # as box_radius, per sample
        r = torch.round((width - 1.0) / 2.0).clamp(1, side - 1).to(torch.int64)
        low = v
        for _ in range(3):
            low = box_mean(box_mean(low, r, -1), r, -2)
        amount = per_sample(p["amount"].double())
        return (v + amount * (v - low)).clamp_(0.0, 1.0).to(x.dtype)

    return backend.by_path(x, host=host, device=device)


# ---------------------------------------------------------------------------------------------
# Double exposure


def _double_sampler(rng_: np.random.Generator, level: Level) -> Params:
    angle = float(rng_.random()) * 2.0 * math.pi
    return {
        "weight": draw(rng_, level["weight"]),
        "shift": draw(rng_, level["shift"]),
        "angle": angle,
    }


def shifted_clamped(v: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    """``v(x - dx, y - dy)`` with edge replication (the second exposure of the same field)."""
    h, w = v.shape[-2:]
    cols = (torch.arange(w, device=v.device) - dx).clamp_(0, w - 1)
    rows = (torch.arange(h, device=v.device) - dy).clamp_(0, h - 1)
    return v.index_select(-1, cols).index_select(-2, rows)


@register_kernel("xray_double_exposure", sampler=_double_sampler)
def xray_double_exposure(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """The plate integrates two exposures, the second ``weight`` as strong and shifted by
    ``shift`` (fraction of the shorter side) along ``angle``; the processing renormalises the
    sum: ``I' = (I + w I(x - d)) / (1 + w)``.

    Kornia: own kernel, because the second exposure is an integer shift with edge replication (an
    index gather, exact); Kornia's ``translate`` resamples every pixel through ``grid_sample``."""
    side = shorter_side(x)

    def host() -> torch.Tensor:
        out = []
        for i in range(x.shape[0]):
            lin = to_linear(x[i])
            d = float(p["shift"][i]) * side
            a = float(p["angle"][i])
            second = shifted_clamped(lin, round(d * math.cos(a)), round(d * math.sin(a)))
            wgt = float(p["weight"][i])
            out.append(to_display((lin + wgt * second) / (1.0 + wgt), x))
        return torch.stack(out)

    def device() -> torch.Tensor:
        b = x.shape[0]
        h, w = x.shape[-2:]
        lin = to_linear(x)
        d = p["shift"].double() * side
        a = p["angle"].double()
        dx = torch.round(d * torch.cos(a)).to(torch.int64).view(b, 1)
        dy = torch.round(d * torch.sin(a)).to(torch.int64).view(b, 1)
        cols = (torch.arange(w, device=x.device).view(1, w) - dx).clamp_(0, w - 1)
        rows = (torch.arange(h, device=x.device).view(1, h) - dy).clamp_(0, h - 1)
        second = torch.take_along_dim(lin, cols.view(b, 1, 1, w), dim=-1)
        second = torch.take_along_dim(second, rows.view(b, 1, h, 1), dim=-2)
        wgt = per_sample(p["weight"].double())
        return to_display((lin + wgt * second) / (1.0 + wgt), x)

    return backend.by_path(x, host=host, device=device)


# ---------------------------------------------------------------------------------------------
# Cardiac and diaphragmatic motion


def motion_masks(h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (1,1,H,W float64) of the moving regions of a centred PA chest film: the left
    heart border (image right of the midline, a gaussian blob at (0.64 w, 0.55 h), sigmas 0.1 w
    and 0.14 h) and the diaphragm domes (a band at 0.72 h, sigma 0.05 h, across 0.15-0.85 w
    with gaussian shoulders)."""
    ys = (torch.arange(h, device=device, dtype=torch.float64) + 0.5).view(1, 1, h, 1) / h
    xs = (torch.arange(w, device=device, dtype=torch.float64) + 0.5).view(1, 1, 1, w) / w
    heart = torch.exp(-0.5 * (((xs - 0.64) / 0.1) ** 2 + ((ys - 0.55) / 0.14) ** 2))
    across = torch.exp(-0.5 * ((xs - 0.5).abs().sub(0.35).clamp(min=0.0) / 0.04) ** 2)
    domes = torch.exp(-0.5 * ((ys - 0.72) / 0.05) ** 2) * across
    return heart, domes


def _cardiac_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {"length": draw(rng_, level["length"])}


@register_kernel("xray_cardiac_motion", sampler=_cardiac_sampler)
def xray_cardiac_motion(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """``I + M_heart (B_x * I - I) + M_domes (B_y * I - I)`` with box PSFs of ``length``
    (fraction of the shorter side) along x (heart) and y (diaphragm), see ``motion_masks``.

    Kornia: own kernel, because its box PSFs along one axis are ``_box_torch`` cumulative sums (O(1)
    per pixel); Kornia's ``box_blur`` is O(length) per pixel (see ``xray_scatter``)."""
    h, w = x.shape[-2:]
    side = shorter_side(x)
    heart, domes = motion_masks(h, w, x.device)

    def host() -> torch.Tensor:
        out = []
        for i in range(x.shape[0]):
            lin = to_linear(x[i : i + 1])
            r = max(1, round(float(p["length"][i]) * side / 2.0))
            along_x = _box_torch(lin, min(r, w - 1), -1)
            along_y = _box_torch(lin, min(r, h - 1), -2)
            out.append(to_display(lin + heart * (along_x - lin) + domes * (along_y - lin), x))
        return torch.cat(out)

    def device() -> torch.Tensor:
        lin = to_linear(x)
        r = torch.round(p["length"].double() * side / 2.0).clamp(min=1).to(torch.int64)
        along_x = box_mean(lin, r.clamp(max=w - 1), -1)
        along_y = box_mean(lin, r.clamp(max=h - 1), -2)
        return to_display(lin + heart * (along_x - lin) + domes * (along_y - lin), x)

    return backend.by_path(x, host=host, device=device)


# ---------------------------------------------------------------------------------------------
# Skin fold


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
