"""Synthetic PA chest radiographs whose content is known, deterministic from a key.

A phantom is built as projected attenuation (line integrals, arbitrary units) and shown the way
a detector's display LUT shows it: the transmitted intensity ``exp(-A)`` through a log display,
so dense structures are bright (MONOCHROME2). The anatomy is coarse but placed where it is on a
PA film: a soft-tissue body, two air-filled lungs (the left lung, on the image's right, smaller
behind the heart), a mediastinum with the spine, a heart shadow bulging to the image's right,
diaphragm domes with the abdomen under them, clavicles and posterior ribs as curved bands
across the lungs, optional a round nodule in one lung zone (its box is known), and a lead
laterality marker (``L`` or ``R``) burned in at a top corner. Images are 1-channel uint16 (or
uint8), drawn with NumPy and OpenCV from a generator seeded by the key.

``qa_rows`` writes questions in the VinDr-CXR-VQA schema (``type`` Is_there / Where / How_many /
Which, answers with ``<loc_x1_y1_x2_y2>`` tags, ``gt_finding``, ``gt_location``) whose answers
follow from the phantom's ``XrayTruth``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from perturb import rng as keyed
from perturb.contracts.boxes import loc_tag

if TYPE_CHECKING:  # pragma: no cover
    from perturb.io.datasets import InputDataset

XRAY_SIZE = (256, 320)  # (width, height): portrait, like a PA film
ZONES = ("upper", "middle", "lower")


@dataclass(frozen=True)
class XrayTruth:
    """What a chest phantom shows."""

    width: int
    height: int
    nodule_box: tuple[int, int, int, int] | None  # x1, y1, x2, y2 in pixels
    nodule_side: str | None  # patient side: "right" (image left) or "left"
    nodule_zone: str | None  # upper / middle / lower lung zone
    marker: str  # "L" or "R"
    marker_box: tuple[int, int, int, int]


@dataclass(frozen=True)
class XrayPhantom:
    image: np.ndarray  # HW uint16 or uint8
    truth: XrayTruth


def _generator(key: str | int) -> np.random.Generator:
    return keyed.scalar_rng(keyed.derive_key(0, str(key), "xray-phantom", 0))


def _ellipse(
    xx: np.ndarray, yy: np.ndarray, cx: float, cy: float, rx: float, ry: float
) -> np.ndarray:
    """Smooth-edged filled ellipse in [0, 1]."""
    r = np.sqrt(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2)
    return np.clip((1.0 - r) * 12.0, 0.0, 1.0)


def _lung(
    xx: np.ndarray, yy: np.ndarray, w: int, h: int, side: float, gen: np.random.Generator
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """One lung field (a rounded, apex-up shape), side -1 for the image's left; returns the
    mask and its (cx, top, half-width, bottom)."""
    cx = w * (0.5 + side * gen.uniform(0.19, 0.22))
    top = h * gen.uniform(0.10, 0.14)
    bottom = h * gen.uniform(0.66, 0.72) - (h * 0.03 if side > 0 else 0.0)
    half = w * gen.uniform(0.17, 0.19) * (0.92 if side > 0 else 1.0)
    t = np.clip((yy - top) / (bottom - top), 0.0, 1.0)
    width_at = half * np.sqrt(np.clip(t, 0.0, 1.0)) ** 0.7 * (1.0 - 0.15 * t)
    inside = (np.abs(xx - cx) < width_at) & (yy > top) & (yy < bottom)
    mask = cv2.GaussianBlur(inside.astype(np.float32), (0, 0), sigmaX=max(1.0, w * 0.01))
    return mask, (cx, top, half, bottom)


_Lung = tuple[float, float, float, float]  # cx, top, half-width, bottom


def _anatomy(
    xx: np.ndarray, yy: np.ndarray, w: int, h: int, gen: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, _Lung, _Lung]:
    """Attenuation of body, lungs, mediastinum, heart, diaphragm, ribs and clavicles; returns it,
    the two lung masks summed and each lung's (cx, top, half-width, bottom)."""
    body = _ellipse(xx, yy, w * 0.5, h * 0.52, w * gen.uniform(0.44, 0.48), h * 0.62)
    atten = 1.2 * body
    right_lung, right = _lung(xx, yy, w, h, -1.0, gen)
    left_lung, left = _lung(xx, yy, w, h, 1.0, gen)
    atten -= 0.75 * (right_lung + left_lung)
    # mediastinum and spine, heart bulging to the image's right (patient's left)
    spine = np.exp(-(((xx - w * 0.5) / (w * 0.05)) ** 2)) * body
    atten += 0.45 * spine
    heart = _ellipse(
        xx, yy, w * gen.uniform(0.55, 0.58), h * 0.58, w * gen.uniform(0.15, 0.18), h * 0.13
    )
    atten += 0.5 * heart * (left_lung + 0.3)
    # diaphragm domes: abdomen below a curve under each lung
    for cx, bottom in ((right[0], right[3]), (left[0], left[3])):
        dome = bottom - h * 0.05 + ((xx - cx) / (w * 0.25)) ** 2 * h * 0.04
        below = 0.5 * (1.0 + np.tanh((yy - dome) / (h * 0.012)))
        atten += 0.55 * below * (np.abs(xx - cx) < w * 0.24) * body
    ribs = _ribs(xx, yy, w, h, right, left)
    atten += 0.22 * cv2.GaussianBlur(ribs, (0, 0), sigmaX=max(0.8, w * 0.003)) * body
    return atten, right_lung + left_lung, right, left


def _ribs(xx: np.ndarray, yy: np.ndarray, w: int, h: int, right: _Lung, left: _Lung) -> np.ndarray:
    """Posterior ribs (curved bands descending laterally) and the clavicles, unblurred."""
    rcx, rtop, _, rbottom = right
    ribs = np.zeros((h, w), np.float32)
    n_ribs = 9
    for i in range(n_ribs):
        y0 = rtop + (rbottom - rtop) * (i + 0.4) / n_ribs
        for cx, sign in ((rcx, -1.0), (left[0], 1.0)):
            curve = y0 + ((xx - w * 0.5) / (w * 0.3)) ** 2 * h * 0.05
            band = np.exp(-(((yy - curve) / (h * 0.008)) ** 2))
            side_ok = ((xx - w * 0.5) * sign > w * 0.03) & ((xx - cx) * sign < w * 0.2)
            ribs += band * side_ok
    clav_y = rtop + h * 0.02
    clav = np.exp(-(((yy - clav_y - np.abs(xx - w * 0.5) * -0.12) / (h * 0.009)) ** 2))
    ribs += clav * (np.abs(xx - w * 0.5) < w * 0.32) * (np.abs(xx - w * 0.5) > w * 0.04)
    return ribs


def _nodule(
    gen: np.random.Generator, w: int, h: int, right_lung: _Lung, left_lung: _Lung
) -> tuple[bool, bool, int, float, float, float]:
    """The nodule's draw (always made, so forcing it in or out keeps the rest of the film):
    (drawn, in the right lung, zone index, cx, cy, radius)."""
    drawn = bool(gen.random() < 0.6)
    right = bool(gen.random() < 0.5)
    cx0, top, half, bottom = right_lung if right else left_lung
    zone = int(gen.integers(0, 3))
    cy = top + (bottom - top) * (zone + gen.uniform(0.35, 0.65)) / 3.0
    cx = cx0 + half * gen.uniform(-0.3, 0.3) * (1.0 if zone else 0.5)
    r = min(w, h) * gen.uniform(0.03, 0.05)
    return drawn, right, zone, cx, cy, r


def _burn_marker(
    display: np.ndarray, gen: np.random.Generator, w: int, h: int
) -> tuple[np.ndarray, str, tuple[int, int, int, int]]:
    """A lead laterality marker burned in at a top corner: (display, letter, its box)."""
    marker = "R" if gen.random() < 0.5 else "L"
    scale = min(w, h) / 220.0
    (tw, th), _ = cv2.getTextSize(marker, cv2.FONT_HERSHEY_SIMPLEX, scale, max(1, round(2 * scale)))
    on_left = marker == "R"  # PA film: the patient's right is on the image's left
    x0 = int(w * 0.05) if on_left else int(w * 0.95) - tw
    y0 = int(h * 0.05) + th
    ink = np.zeros((h, w), np.uint8)
    cv2.putText(
        ink,
        marker,
        (x0, y0),
        cv2.FONT_HERSHEY_SIMPLEX,
        scale,
        255,
        max(1, round(2 * scale)),
        cv2.LINE_AA,
    )
    display = np.maximum(display, ink.astype(np.float32) * (0.98 / 255.0))
    return display, marker, (x0, y0 - th, x0 + tw, y0 + 2)


def render(
    key: str | int,
    size: tuple[int, int] = XRAY_SIZE,
    *,
    bit_depth: int = 16,
    nodule: bool | None = None,
) -> XrayPhantom:
    """The chest phantom of ``key`` at ``size`` = (width, height); ``nodule`` forces the
    nodule in or out (the rest of the film stays the same)."""
    w, h = size
    gen = _generator(key)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5
    atten, lungs, right_lung, left_lung = _anatomy(xx, yy, w, h, gen)
    drawn, right, zone, cx, cy, r = _nodule(gen, w, h, right_lung, left_lung)
    nodule_box = nodule_side = nodule_zone = None
    if drawn if nodule is None else nodule:
        atten += 0.45 * _ellipse(xx, yy, cx, cy, r, r)
        nodule_box = (
            math.floor(cx - r),
            math.floor(cy - r),
            math.ceil(cx + r),
            math.ceil(cy + r),
        )
        nodule_side = "right" if right else "left"
        nodule_zone = ZONES[zone]
    # fine texture (vessels, noise of the anatomy), then the display: log of transmission
    coarse = gen.standard_normal((h // 4 + 1, w // 4 + 1)).astype(np.float32)
    tex = cv2.resize(cv2.GaussianBlur(coarse, (0, 0), 1.0), (w, h), interpolation=cv2.INTER_CUBIC)
    atten += 0.03 * tex * lungs
    atten = np.clip(atten, 0.0, None)
    transmission = np.exp(-2.2 * atten)
    display = np.clip(-np.log(np.maximum(transmission, 1e-4)) / 4.0, 0.0, 1.0)
    display = 0.04 + 0.9 * display
    display, marker, marker_box = _burn_marker(display, gen, w, h)
    peak = 65535.0 if bit_depth == 16 else 255.0
    dtype = np.uint16 if bit_depth == 16 else np.uint8
    image = np.rint(np.clip(display, 0.0, 1.0) * peak).astype(dtype)
    truth = XrayTruth(w, h, nodule_box, nodule_side, nodule_zone, marker, marker_box)
    return XrayPhantom(image, truth)


def qa_rows(img_id: str, truth: XrayTruth) -> list[dict[str, Any]]:
    """VinDr-CXR-VQA-style QA rows (without the image) whose answers follow from ``truth``."""
    box = truth.nodule_box
    tag = loc_tag(box) if box else ""
    finding = "Nodule/Mass" if box else "No finding"
    rows = [
        (
            "Is_there",
            "Is there a nodule or mass in this chest X-ray?",
            f"Yes, there is a nodule {tag}." if box else "No, there is no nodule or mass.",
        ),
        ("How_many", "How many nodules are visible?", "1" if box else "0"),
        ("Which", "Which laterality marker is shown on the film?", truth.marker),
    ]
    if box:
        rows.append(
            (
                "Where",
                "Where is the nodule located?",
                f"In the {truth.nodule_side} {truth.nodule_zone} lung zone {tag}.",
            )
        )
    return [
        {
            "img_id": img_id,
            "qa_idx": i,
            "type": kind,
            "question": q,
            "answer": a,
            "gt_finding": finding,
            "gt_location": tag,
        }
        for i, (kind, q, a) in enumerate(rows)
    ]


def xray_id(index: int) -> str:
    return f"cxr_phantom_{index:04d}"


def builtin_xray_rows(n_images: int, size: tuple[int, int] = XRAY_SIZE) -> list[dict[str, Any]]:
    """QA rows of ``n_images`` chest phantoms, each with its 16-bit PNG as ``image``."""
    from perturb.datasets.phantoms._rows import phantom_rows

    ids = [xray_id(i) for i in range(n_images)]
    return phantom_rows(ids, lambda img_id: render(img_id, size), qa_rows)


def builtin_xray_input(
    n_images: int | None = None, size: tuple[int, int] = XRAY_SIZE
) -> InputDataset:
    """The built-in X-ray sample as an input whose loc tags follow geometric ops."""
    import datasets

    from perturb.datasets.phantoms._sizes import BUILTIN_IMAGES
    from perturb.io.datasets import Annotations, InputDataset, _quiet

    n = BUILTIN_IMAGES if n_images is None else n_images
    features = datasets.Features(
        {
            "image": datasets.Image(decode=False),
            "img_id": datasets.Value("string"),
            "qa_idx": datasets.Value("int64"),
            "type": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "gt_finding": datasets.Value("string"),
            "gt_location": datasets.Value("string"),
        }
    )
    rows = builtin_xray_rows(n, size)
    with _quiet():
        ds = datasets.Dataset.from_dict(
            {name: [r[name] for r in rows] for name in features}, features=features
        )
    return InputDataset(
        ds,
        "image",
        "img_id",
        "built-in chest X-ray phantoms",
        f"builtin-xray:{n}",
        None,
        annotations=Annotations(("answer", "gt_location")),
    )
