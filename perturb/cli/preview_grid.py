"""A labelled grid of an image under ops: clean + severities 1..5, one row per op of thumbnails
(``thumb_width`` px wide) and, with ``crop``, a second row of full-resolution crops (one image
pixel per grid pixel) of the same size, where noise, grid lines and fringes stay visible."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from perturb.catalog.ops import all_ops, get_op
from perturb.catalog.specs import op_names
from perturb.engine.run import apply
from perturb.errors import InputError
from perturb.io.images import from_tensor


class NoOpForImage(InputError):
    """No op of the asked modality takes the image's channel count."""


LABEL_HEIGHT = 22
ROW_LABEL_WIDTH = 150


def _thumb(x: torch.Tensor, width: int) -> np.ndarray:
    img = from_tensor(x, np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    h = max(1, round(img.shape[0] * width / img.shape[1]))
    return cv2.resize(img, (width, h), interpolation=cv2.INTER_AREA)


def _crop(x: torch.Tensor, width: int, height: int, centre: tuple[float, float]) -> np.ndarray:
    """A ``width`` x ``height`` crop at full resolution around ``centre`` (fractions of the
    image), moved inside the image and padded white where the image is smaller."""
    img = from_tensor(x, np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    h, w = img.shape[:2]
    cw, ch = min(width, w), min(height, h)
    x0 = min(max(0, round(centre[0] * w - cw / 2)), w - cw)
    y0 = min(max(0, round(centre[1] * h - ch / 2)), h - ch)
    cell = np.full((height, width, 3), 255, np.uint8)
    cell[:ch, :cw] = img[y0 : y0 + ch, x0 : x0 + cw]
    return cell


def _label(canvas: np.ndarray, text: str, x: int, y: int) -> None:
    cv2.putText(canvas, text, (x + 4, y + 16), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (20, 20, 20), 1, cv2.LINE_AA)


def most_changed(
    clean: torch.Tensor, changed: torch.Tensor, width: int, height: int
) -> tuple[float, float]:
    """Centre (fractions of the width and height) of the ``width`` x ``height`` window where
    ``changed`` differs most from ``clean`` (CHW), the middle when nothing changed: a 1:1 crop
    that shows the op even where it acts on a small part of the frame (a highlight, a marker)."""
    if changed.shape != clean.shape:  # a geometric op that changes the size: no common window
        return 0.5, 0.5
    diff = (changed.float() - clean.float()).abs().sum(0).numpy().astype(np.float32)
    h, w = diff.shape
    if not diff.any():
        return 0.5, 0.5
    kw, kh = min(width, w), min(height, h)
    window = cv2.boxFilter(diff, -1, (kw, kh), normalize=False, borderType=cv2.BORDER_CONSTANT)
    y, x = np.unravel_index(int(np.argmax(window)), window.shape)
    # the change's centre of mass inside that window (many windows tie around a small change)
    x0, y0 = max(0, int(x) - kw // 2), max(0, int(y) - kh // 2)
    part = diff[y0 : y0 + kh, x0 : x0 + kw]
    ys, xs = np.indices(part.shape)
    total = float(part.sum())
    cx, cy = float((xs * part).sum()) / total + x0, float((ys * part).sum()) / total + y0
    return (cx + 0.5) / w, (cy + 0.5) / h


def preview_grid(
    image: torch.Tensor,
    ops: Sequence[str] | None = None,
    *,
    sample_key: str = "preview",
    seed: int = 0,
    thumb_width: int = 224,
    crop: bool = False,
    crop_centre: tuple[float, float] | None = (0.5, 0.5),
    modality: str | None = None,
) -> tuple[np.ndarray, list[str]]:
    """RGB uint8 grid of ``image`` (CHW float32) under each op at severities 1..5, and the ops
    skipped because they do not take the image's channel count. Without ``ops``: every active op
    tagged with ``modality`` (None: every active op) that takes the image's channel count; retired
    ops are never shown unless named. ``crop`` adds, under each op's
    thumbnails, full-resolution crops of the same size around ``crop_centre`` (fractions of the
    width and height; None: for each op, where its severity 5 changes the image most)."""
    if thumb_width < 16:
        raise ValueError(f"thumbnail width must be at least 16 px, got {thumb_width}")
    channels = image.shape[0]
    if ops is None:
        shown = set(op_names(modality))
        candidates = {n: op for n, op in all_ops().items() if n in shown}  # catalog order
        names = [n for n, op in candidates.items() if channels in op.spec.channels]
        skipped = [n for n, op in candidates.items() if channels not in op.spec.channels]
        if not names:
            of = f"{modality} op" if modality else "op"
            raise NoOpForImage(f"no {of} takes a {channels}-channel image")
    else:
        names, skipped = list(ops), []
        for name in names:
            get_op(name)  # unknown names fail here with the list of valid ones
    batch = image.unsqueeze(0).expand(5, -1, -1, -1).contiguous()
    clean = _thumb(image, thumb_width)
    th, tw = clean.shape[:2]
    per_op = 2 if crop else 1
    rows = len(names) * per_op
    canvas = np.full((LABEL_HEIGHT + rows * (th + LABEL_HEIGHT), ROW_LABEL_WIDTH + 6 * tw, 3), 255, np.uint8)
    for col, title in enumerate(["clean", *[f"severity {s}" for s in range(1, 6)]]):
        _label(canvas, title, ROW_LABEL_WIDTH + col * tw, 0)
    for row, name in enumerate(names):
        out, _ = apply(batch, name, [1, 2, 3, 4, 5], [sample_key] * 5, seed=seed)
        y = LABEL_HEIGHT + row * per_op * (th + LABEL_HEIGHT)
        _label(canvas, name, 0, y + th // 2 - 8)
        panels = [[clean, *[_thumb(o, thumb_width) for o in out]]]
        if crop:
            full = [image, *out]
            centre = crop_centre or most_changed(image, out[-1], tw, th)
            panels.append([_crop(c, tw, th, centre) for c in full])
            _label(canvas, "1:1 crop", 0, y + th + LABEL_HEIGHT + th // 2 - 8)
        for k, cells in enumerate(panels):
            yk = y + k * (th + LABEL_HEIGHT)
            for col, cell in enumerate(cells):
                x = ROW_LABEL_WIDTH + col * tw
                canvas[yk : yk + th, x : x + tw] = cell
    return canvas, skipped


def scene_panel(image: torch.Tensor, width: int = 640, kind: str | None = None) -> np.ndarray:
    """RGB uint8 panel of the scene model on ``image`` (CHW): the frame, the field of view
    (surround tinted blue, aperture edge in white), the overlays (yellow boxes with their kind),
    the overlay pixels the composite keeps inside the field (magenta: the glyph strokes of a text
    line), the specular highlights (green) and what the text search found (the descriptor's
    ``text``), side by side with the plain frame. ``kind`` (default: "radiograph" for a gray
    image, else "endoscopy"): a radiograph shows its annotation layer (``radiograph_panel``)."""
    from perturb.scene import scene

    if (kind or ("radiograph" if image.shape[0] == 1 else "endoscopy")) == "radiograph":
        return radiograph_panel(image, width)
    img = from_tensor(image, np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    s = scene(img)
    vis = img.astype(np.float32)
    vis[..., 2] += (1.0 - s.field) * 110.0
    vis[..., :2] *= (0.45 + 0.55 * s.field)[..., None]
    vis[s.highlight] = (0, 255, 0)
    vis[s.overlay_of(img) & (s.field > 0)] = (255, 0, 255)  # what the composite keeps: glyphs
    vis = np.clip(vis, 0, 255).astype(np.uint8)
    edge = ((s.field > 0.02) & (s.field < 0.98)).astype(np.uint8)
    vis[cv2.dilate(edge, np.ones((3, 3), np.uint8)) > 0] = (255, 255, 255)
    scale = width / img.shape[1]
    left = cv2.resize(img, (width, max(1, round(img.shape[0] * scale))), interpolation=cv2.INTER_AREA)
    right = cv2.resize(vis, (left.shape[1], left.shape[0]), interpolation=cv2.INTER_AREA)
    for x0, y0, x1, y1, kind in s.overlays:
        p0 = (round(x0 * scale), round(y0 * scale))
        p1 = (round(x1 * scale), round(y1 * scale))
        cv2.rectangle(right, p0, p1, (255, 220, 0), 1)
        if kind != "glyph":
            cv2.putText(right, kind, (p0[0] + 2, p0[1] + 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 220, 0), 1, cv2.LINE_AA)
    canvas = np.full((left.shape[0] + LABEL_HEIGHT, 2 * left.shape[1], 3), 255, np.uint8)
    canvas[LABEL_HEIGHT:, : left.shape[1]] = left
    canvas[LABEL_HEIGHT:, left.shape[1] :] = right
    _label(canvas, f"frame; text: {s.descriptor.get('text', 'not searched')}", 0, 0)
    _label(
        canvas,
        "surround blue, edge white, overlays yellow, glyphs kept magenta, highlights green",
        left.shape[1],
        0,
    )
    return canvas


def radiograph_panel(image: torch.Tensor, width: int = 640) -> np.ndarray:
    """RGB uint8 panel of a radiograph's scene (``perturb.scene.radiograph``) on ``image``
    (CHW): the film, and beside it the annotation layer the acquisition ops keep (pixels in
    red, each annotation boxed in yellow with its kind), or "annotations: none found"."""
    from perturb.scene import Scene

    s = Scene.of(image, "radiograph")
    img = from_tensor(image, np.uint8)
    img = np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img
    if img.shape[-1] == 1:
        img = np.repeat(img, 3, axis=2)
    vis = img.copy()
    vis[s.overlay] = (255, 0, 0)
    scale = width / img.shape[1]
    size = (width, max(1, round(img.shape[0] * scale)))
    left = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    right = cv2.resize(vis, size, interpolation=cv2.INTER_AREA)
    for x0, y0, x1, y1, kind in s.overlays:
        p0 = (round(x0 * scale) - 2, round(y0 * scale) - 2)
        p1 = (round(x1 * scale) + 2, round(y1 * scale) + 2)
        cv2.rectangle(right, p0, p1, (255, 220, 0), 1)
        cv2.putText(right, kind, (p0[0], max(10, p0[1] - 3)), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 220, 0), 1, cv2.LINE_AA)
    canvas = np.full((left.shape[0] + LABEL_HEIGHT, 2 * left.shape[1], 3), 255, np.uint8)
    canvas[LABEL_HEIGHT:, : left.shape[1]] = left
    canvas[LABEL_HEIGHT:, left.shape[1] :] = right
    found = s.descriptor["annotations"]
    _label(canvas, "film", 0, 0)
    text = "annotations: none found" if isinstance(found, str) else f"annotations kept by acquisition ops (red): {len(found)}"
    _label(canvas, text, left.shape[1], 0)
    return canvas
