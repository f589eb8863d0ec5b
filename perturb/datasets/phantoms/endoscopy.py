"""Synthetic endoscopy-like frames whose content is known, deterministic from a key.

A phantom is a colonoscopy-like frame: a dark octagonal or circular field-of-view border,
pinkish-red mucosa with smooth shading, a dark lumen, branching vessels and fine texture; 0-3
polyps (shaded domes, one colour per frame, each in its own cell of the 3x3 location grid);
optionally a green position box at the bottom left (like the ScopeGuide overlay of
HyperKvasir) and burned-in text at the top left. Everything is drawn with NumPy and OpenCV from
a generator seeded by the key, so a key always gives the same pixels.

``qa_rows`` writes questions in the Kvasir-VQA-x1 schema (image, img_id, complexity, question,
answer, original = JSON list of {"q", "a"} atomic pairs, question_class = list of slugs) whose
answers follow from the phantom's ``Truth``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import cv2
import numpy as np

from perturb import rng as keyed
from perturb.datasets.phantoms._sizes import DEFAULT_SIZE

ROWS = ("upper", "center", "lower")
COLS = ("left", "center", "right")
POLYP_COLORS: dict[str, tuple[float, float, float]] = {
    "pink": (0.95, 0.60, 0.62),
    "red": (0.72, 0.12, 0.12),
    "white": (0.93, 0.88, 0.80),
}
POLYP_TYPES = ("paris is", "paris ip", "paris iia")


def grid_cell(row: int, col: int) -> str:
    """Name of a cell of the 3x3 location grid (``center`` for the middle one)."""
    if ROWS[row] == "center" and COLS[col] == "center":
        return "center"
    return f"{ROWS[row]}-{COLS[col]}"


def cell_of(x: float, y: float, width: int, height: int) -> str:
    """Grid cell of a point (pixels)."""
    col = min(2, max(0, int(3 * x / width)))
    row = min(2, max(0, int(3 * y / height)))
    return grid_cell(row, col)


@dataclass(frozen=True)
class Polyp:
    cx: float  # centre, pixels
    cy: float
    rx: float  # semi-axes, pixels
    ry: float
    angle: float  # degrees
    cell: str
    size: str  # size class


@dataclass(frozen=True)
class Truth:
    """What a phantom shows: the answers its QA rows are built from."""

    width: int
    height: int
    fov: str
    fov_margin: float = 0.0
    polyps: list[Polyp] = field(default_factory=list)
    polyp_color: str | None = None
    polyp_type: str | None = None
    box: bool = False
    text: str | None = None
    procedure: str = "colonoscopy"

    @property
    def polyp_count(self) -> int:
        return len(self.polyps)

    @property
    def locations(self) -> list[str]:
        order = [grid_cell(r, c) for r in range(3) for c in range(3)]
        return sorted({p.cell for p in self.polyps}, key=order.index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Phantom:
    image: np.ndarray  # HWC uint8 RGB
    truth: Truth


def _generator(key: str | int) -> np.random.Generator:
    return keyed.scalar_rng(keyed.derive_key(0, str(key), "phantom", 0))


def _smooth_field(gen: np.random.Generator, width: int, height: int, cells: int) -> np.ndarray:
    coarse = gen.standard_normal((cells, max(2, round(cells * width / height)))).astype(np.float32)
    return cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)


def fov_mask(width: int, height: int, shape: str, margin: float) -> np.ndarray:
    """Float mask (H, W) of the field of view: 1 inside, anti-aliased edge. A circle may be cut
    by the top and bottom of the frame, as on many scopes."""
    scale = 4  # supersampled polygon/circle for a soft edge
    big = np.zeros((height * scale, width * scale), np.uint8)
    if shape == "circle":
        r = int(min(width * (0.5 - margin), height * (0.5 + 2.5 * margin)) * scale)
        cv2.circle(big, (width * scale // 2, height * scale // 2), r, 255, -1)
    else:
        x0, x1 = margin * width, (1 - margin) * width
        y0, y1 = margin * height, (1 - margin) * height
        cut = 0.22 * min(width, height)
        pts = np.array(
            [
                [x0 + cut, y0],
                [x1 - cut, y0],
                [x1, y0 + cut],
                [x1, y1 - cut],
                [x1 - cut, y1],
                [x0 + cut, y1],
                [x0, y1 - cut],
                [x0, y0 + cut],
            ]
        )
        cv2.fillPoly(big, [np.round(pts * scale).astype(np.int32)], 255)
    small = cv2.resize(big, (width, height), interpolation=cv2.INTER_AREA)
    return small.astype(np.float32) / 255.0


def _vessels(gen: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Mask (H, W) in [0, 1] of thin branching vessels (smooth random walks)."""
    mask = np.zeros((height, width), np.uint8)
    side = min(width, height)
    for _ in range(int(gen.integers(7, 14))):
        x, y = gen.uniform(0, width), gen.uniform(0, height)
        heading = gen.uniform(0, 2 * math.pi)
        thickness = 1 if gen.random() < 0.7 else 2
        pts = [(x, y)]
        for _ in range(int(gen.integers(12, 30))):
            heading += gen.normal(0.0, 0.35)
            step = side * gen.uniform(0.015, 0.035)
            x, y = x + step * math.cos(heading), y + step * math.sin(heading)
            pts.append((x, y))
            if gen.random() < 0.06:  # a side branch
                bx, by, bh = x, y, heading + gen.choice([-1.0, 1.0]) * gen.uniform(0.5, 1.2)
                branch = [(bx, by)]
                for _ in range(int(gen.integers(4, 10))):
                    bh += gen.normal(0.0, 0.3)
                    bx, by = bx + step * math.cos(bh), by + step * math.sin(bh)
                    branch.append((bx, by))
                cv2.polylines(
                    mask,
                    [np.round(np.array(branch) * 4).astype(np.int32)],
                    False,
                    160,
                    1,
                    cv2.LINE_AA,
                    2,
                )
        cv2.polylines(
            mask,
            [np.round(np.array(pts) * 4).astype(np.int32)],
            False,
            255,
            thickness,
            cv2.LINE_AA,
            2,
        )
    return cv2.GaussianBlur(mask.astype(np.float32) / 255.0, (0, 0), 0.6)


def _size_class(radius_fraction: float) -> str:
    if radius_fraction < 0.06:
        return "<5mm"
    if radius_fraction < 0.085:
        return "5-10mm"
    return "11-20mm"


def _place_polyps(
    gen: np.random.Generator, width: int, height: int, count: int, fov: np.ndarray
) -> list[Polyp]:
    side = min(width, height)
    cells = [(r, c) for r in range(3) for c in range(3)]
    order = gen.permutation(len(cells))
    polyps: list[Polyp] = []
    for idx in order:
        if len(polyps) == count:
            break
        r, c = cells[int(idx)]
        cw, ch = width / 3.0, height / 3.0
        radius = side * gen.uniform(0.045, 0.11)
        rx, ry = radius * gen.uniform(0.85, 1.15), radius * gen.uniform(0.85, 1.15)
        room_x, room_y = max(0.0, cw / 2 - rx * 1.1), max(0.0, ch / 2 - ry * 1.1)
        cx = (c + 0.5) * cw + gen.uniform(-0.5, 0.5) * room_x
        cy = (r + 0.5) * ch + gen.uniform(-0.5, 0.5) * room_y
        # the whole polyp must sit inside the field of view and inside its cell
        ys, xs = np.ogrid[:height, :width]
        inside = ((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1.0
        if float(fov[inside].min(initial=1.0)) < 0.99:
            continue
        polyps.append(
            Polyp(
                float(cx),
                float(cy),
                float(rx),
                float(ry),
                float(gen.uniform(0, 180)),
                grid_cell(r, c),
                _size_class(radius / side),
            )
        )
    return polyps


def _draw_polyp(img: np.ndarray, p: Polyp, color: np.ndarray, kind: str) -> None:
    height, width = img.shape[:2]
    ys, xs = np.mgrid[:height, :width].astype(np.float32)
    t = math.radians(p.angle)
    dx, dy = xs - p.cx, ys - p.cy
    u = (dx * math.cos(t) + dy * math.sin(t)) / p.rx
    v = (-dx * math.sin(t) + dy * math.cos(t)) / p.ry
    r2 = u * u + v * v
    alpha = np.clip((1.0 - r2) * min(p.rx, p.ry) / 1.5, 0.0, 1.0)  # ~1.5 px soft edge
    height_map = np.sqrt(np.clip(1.0 - r2, 0.0, 1.0))
    if kind == "paris iia":
        height_map = np.clip(height_map * 2.5, 0.0, 1.0) * 0.35  # flat, slightly elevated
    # lambertian shading, light from the scope (upper left), plus a rim darkening
    nx, ny = -dx / (p.rx * 1.6), -dy / (p.ry * 1.6)
    shade = 0.72 + 0.28 * height_map + 0.12 * np.clip(-(nx + ny), -1, 1) * height_map
    body = color[None, None, :] * shade[..., None]
    if kind == "paris ip":  # pedunculated: a darker stalk ring
        ring = np.exp(-(((np.sqrt(r2) - 0.8) / 0.12) ** 2))
        body = body * (1.0 - 0.25 * ring[..., None])
    img[:] = img * (1.0 - alpha[..., None]) + body * alpha[..., None]


def _draw_box(img: np.ndarray, gen: np.random.Generator) -> None:
    """Green position box (ScopeGuide-like) at the bottom left, with a scope trace inside."""
    height, width = img.shape[:2]
    bw, bh = int(0.2 * width), int(0.24 * height)
    x0, y0 = int(0.01 * width), height - bh - int(0.015 * height)
    img[y0 : y0 + bh, x0 : x0 + bw] = (0.05, 0.33, 0.11)
    pts = []
    for k in range(12):
        t = k / 11.0
        pts.append(
            (
                x0 + bw * (0.15 + 0.7 * t),
                y0 + bh * (0.5 + 0.3 * math.sin(t * 5 + gen.uniform(0, 1))),
            )
        )
    trace = np.zeros(img.shape[:2], np.uint8)
    cv2.polylines(
        trace, [np.round(np.array(pts)).astype(np.int32)], False, 255, max(1, bw // 30), cv2.LINE_AA
    )
    alpha = trace.astype(np.float32)[..., None] / 255.0
    img[:] = img * (1 - alpha) + np.array([0.55, 0.95, 0.55], np.float32) * alpha


def _draw_text(img: np.ndarray, text: str) -> None:
    height, width = img.shape[:2]
    layer = np.zeros(img.shape[:2], np.uint8)
    scale = height / 700.0
    cv2.putText(
        layer,
        text,
        (int(0.012 * width), int(0.05 * height)),
        cv2.FONT_HERSHEY_SIMPLEX,
        scale,
        255,
        1,
        cv2.LINE_AA,
    )
    a = layer.astype(np.float32)[..., None] / 255.0
    img[:] = img * (1 - a) + a * 0.95


def render(key: str | int, size: tuple[int, int] = DEFAULT_SIZE) -> Phantom:
    """The phantom of ``key`` at ``size`` = (width, height)."""
    width, height = int(size[0]), int(size[1])
    if width < 64 or height < 64:
        raise ValueError(f"phantom size must be at least 64x64, got {width}x{height}")
    gen = _generator(key)
    fov_shape = "circle" if gen.random() < 0.35 else "octagon"
    margin = float(gen.uniform(0.01, 0.04))
    fov = fov_mask(width, height, fov_shape, margin)

    base = np.array([0.80, 0.40, 0.36], np.float32) + gen.normal(0, 0.025, 3).astype(np.float32)
    shading = 0.85 + 0.12 * _smooth_field(gen, width, height, 4)
    ys, xs = np.mgrid[:height, :width].astype(np.float32)
    lx, ly = gen.uniform(0.25, 0.75) * width, gen.uniform(0.25, 0.75) * height
    lumen_r = min(width, height) * gen.uniform(0.10, 0.2)
    lumen = np.exp(-(((xs - lx) ** 2 + (ys - ly) ** 2) / (2 * lumen_r**2)))
    img = base[None, None, :] * shading[..., None] * (1.0 - 0.75 * lumen[..., None])
    texture = cv2.GaussianBlur(gen.standard_normal((height, width)).astype(np.float32), (0, 0), 1.2)
    img *= (1.0 + 0.05 * texture)[..., None]
    vessels = _vessels(gen, width, height)
    img *= 1.0 - vessels[..., None] * np.array([0.30, 0.55, 0.45], np.float32)

    count = int(gen.choice([0, 1, 1, 2, 2, 3]))
    color_name = str(gen.choice(list(POLYP_COLORS)))
    kind = str(gen.choice(POLYP_TYPES))
    polyps = _place_polyps(gen, width, height, count, fov)
    color = np.array(POLYP_COLORS[color_name], np.float32)
    for p in polyps:
        _draw_polyp(img, p, color * (1.0 + gen.normal(0, 0.02)), kind)

    img *= fov[..., None]
    box = bool(gen.random() < 0.5)
    if box:
        _draw_box(img, gen)
    text = None
    if gen.random() < 0.5:
        text = f"{int(gen.integers(1, 9999)):04d} 20{int(gen.integers(15, 24))}/{int(gen.integers(1, 13)):02d}/{int(gen.integers(1, 29)):02d}"
        _draw_text(img, text)
    out = np.clip(np.round(img * 255.0), 0, 255).astype(np.uint8)
    truth = Truth(
        width=width,
        height=height,
        fov=fov_shape,
        fov_margin=margin,
        polyps=polyps,
        polyp_color=color_name if polyps else None,
        polyp_type=kind if polyps else None,
        box=box,
        text=text,
    )
    return Phantom(out, truth)


# ---------------------------------------------------------------------------------------------
# Questions in the Kvasir-VQA-x1 schema


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def atomic_questions(truth: Truth) -> list[tuple[str, str, str]]:
    """(question, answer, question_class) pairs that the phantom answers."""
    n = truth.polyp_count
    qa = [
        ("How many polyps are in the image?", str(n), "polyp_count"),
        ("How many findings are present?", str(n), "finding_count"),
        (
            "Are there any abnormalities in the image?",
            "polyp" if n else "none",
            "abnormality_presence",
        ),
        ("Is there a finding in the image?", _yes_no(n > 0), "finding_presence"),
        ("Is there a green/black box artefact?", _yes_no(truth.box), "box_artifact_presence"),
        ("Is there text?", _yes_no(truth.text is not None), "text_presence"),
        ("Are there any instruments in the image?", "none", "instrument_presence"),
        ("How many instruments are in the image?", "0", "instrument_count"),
        ("What type of procedure is the image taken from?", truth.procedure, "procedure_type"),
        ("Are there any anatomical landmarks in the image?", "none", "landmark_presence"),
    ]
    if n:
        sizes = sorted({p.size for p in truth.polyps})
        qa += [
            ("What color is the abnormality?", str(truth.polyp_color), "abnormality_color"),
            (
                "Where in the image is the abnormality?",
                ", ".join(truth.locations),
                "abnormality_location",
            ),
            ("What type of polyp is present?", str(truth.polyp_type), "polyp_type"),
            ("What is the size of the polyp?", ", ".join(sizes), "polyp_size"),
            ("Have all polyps been removed?", "no", "polyp_removal_status"),
        ]
    return qa


def _combine(parts: list[tuple[str, str, str]]) -> tuple[str, str]:
    questions = [q.rstrip("?") for q, _, _ in parts]
    question = questions[0] + "".join(f", and {q[0].lower()}{q[1:]}" for q in questions[1:]) + "?"
    answer = "; ".join(f"{q.rstrip('?').lower()}: {a}" for q, a, _ in parts)
    return question, answer


def qa_rows(img_id: str, truth: Truth, key: str | int | None = None) -> list[dict[str, Any]]:
    """QA rows (without the image) for one phantom: three of complexity 1, two of complexity 2
    and one of complexity 3, chosen by the key; no question repeats within an image."""
    gen = _generator(f"qa|{img_id if key is None else key}")
    pool = atomic_questions(truth)
    rows = []
    used: set[tuple[int, ...]] = set()
    for complexity, count in ((1, 3), (2, 2), (3, 1)):
        while sum(1 for u in used if len(u) == complexity) < count:
            idx = tuple(sorted(gen.choice(len(pool), size=complexity, replace=False).tolist()))
            if idx in used:
                continue
            used.add(idx)
            parts = [pool[i] for i in idx]
            question, answer = _combine(parts) if complexity > 1 else (parts[0][0], parts[0][1])
            rows.append(
                {
                    "img_id": img_id,
                    "complexity": complexity,
                    "question": question,
                    "answer": answer,
                    "original": json.dumps([{"q": q, "a": a} for q, a, _ in parts]),
                    "question_class": [c for _, _, c in parts],
                }
            )
    return rows
