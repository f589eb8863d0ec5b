"""Masks rebuilt from a scene descriptor (deterministic: the same descriptor gives the same
bytes), and the composite of a perturbed tissue layer back into the frame."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import cv2
import numpy as np

FEATHER_GRID_PX = 0.6  # sigma of the aperture's soft edge, in analysis-grid pixels


def _key(desc: dict[str, Any]) -> str:
    return json.dumps(desc, sort_keys=True)


def field_alpha(desc: dict[str, Any]) -> np.ndarray:
    """float32 (H, W) in [0, 1]: 1 inside the field of view, 0 in the surround, a smooth
    anti-aliased edge (read-only, cached)."""
    return _field_alpha(_key(desc))


@lru_cache(maxsize=6)
def _field_alpha(key: str) -> np.ndarray:
    desc = json.loads(key)
    h, w = desc["size"]
    if desc.get("full"):
        out = np.ones((h, w), np.float32)
    else:
        gh, gw = desc["grid"]
        canvas = np.zeros((gh, gw), np.float32)
        cv2.fillPoly(canvas, [np.asarray(desc["field"], np.int32)], 1.0)
        canvas = cv2.GaussianBlur(canvas, (0, 0), FEATHER_GRID_PX, borderType=cv2.BORDER_REPLICATE)
        out = np.asarray(cv2.resize(canvas, (w, h), interpolation=cv2.INTER_LINEAR), dtype=np.float32)
        # exact 0 and 1 away from the edge: rescale so 1/512 -> 0 and 1 - 1/512 -> 1, then clip
        out -= np.float32(1.0 / 512)
        out *= np.float32(1.0 / (1.0 - 2.0 / 512))
        np.clip(out, 0.0, 1.0, out=out)
    out.flags.writeable = False
    return out


def overlay_mask(desc: dict[str, Any]) -> np.ndarray:
    """bool (H, W): on-screen overlays (text, icons, scope boxes, insets, black boxes)."""
    return _overlay_mask(_key(desc))


@lru_cache(maxsize=6)
def _overlay_mask(key: str) -> np.ndarray:
    desc = json.loads(key)
    h, w = desc["size"]
    out = np.zeros((h, w), bool)
    for x0, y0, x1, y1, _kind in desc["overlays"]:
        out[y0:y1, x0:x1] = True
    out.flags.writeable = False
    return out


def tissue_alpha(desc: dict[str, Any]) -> np.ndarray:
    """float32 (H, W): where a perturbation of the tissue layer shows, the field of view minus
    the overlays (read-only, cached)."""
    return _tissue_alpha(_key(desc))


@lru_cache(maxsize=6)
def _tissue_alpha(key: str) -> np.ndarray:
    desc = json.loads(key)
    alpha = field_alpha(desc).copy()
    alpha[overlay_mask(desc)] = 0.0
    alpha.flags.writeable = False
    return alpha


def bbox(desc: dict[str, Any]) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the field of view in image pixels (outside it nothing changes)."""
    x0, y0, x1, y1 = desc["bbox"]
    return int(x0), int(y0), int(x1), int(y1)


def compose_numpy(src: np.ndarray, dst: np.ndarray, desc: dict[str, Any]) -> None:
    """In place: ``dst`` (CHW, the perturbed sample) becomes ``alpha * dst + (1 - alpha) * src``
    with the tissue alpha of ``desc``; pixels with alpha 0 are ``src`` exactly, alpha 1
    ``dst`` exactly."""
    alpha = tissue_alpha(desc)
    if alpha.shape != src.shape[-2:]:
        raise ValueError(f"scene of size {alpha.shape} does not fit an image of size {src.shape[-2:]}")
    x0, y0, x1, y1 = bbox(desc)
    # outside the bbox: the source
    if y0 > 0:
        dst[:, :y0] = src[:, :y0]
    if y1 < dst.shape[1]:
        dst[:, y1:] = src[:, y1:]
    if x0 > 0:
        dst[:, y0:y1, :x0] = src[:, y0:y1, :x0]
    if x1 < dst.shape[2]:
        dst[:, y0:y1, x1:] = src[:, y0:y1, x1:]
    a = alpha[y0:y1, x0:x1]
    partial = (a < 1.0) & (a > 0.0)
    zero = a == 0.0
    for c in range(src.shape[0]):
        s, d = src[c, y0:y1, x0:x1], dst[c, y0:y1, x0:x1]
        if partial.any():
            base = s[partial].astype(np.float32)
            mixed = base + a[partial] * (d[partial].astype(np.float32) - base)
            if d.dtype == np.float32:
                d[partial] = mixed
            else:
                top = 255.0 if d.dtype == np.uint8 else 65535.0
                d[partial] = np.clip(np.rint(mixed), 0, top).astype(d.dtype)
        d[zero] = s[zero]


def extend_tissue(img: np.ndarray, desc: dict[str, Any]) -> np.ndarray:
    """HWC (or HW) image of ``img``'s dtype: the tissue as it is, and outside it (surround,
    overlays) a smooth extension of the nearby tissue, so a spatial filter (blur) applied
    afterwards does not pull the dark surround or the overlays into the field's edge. The
    extension is a normalised convolution on the analysis grid (wide gaussian), upsampled."""
    h, w = img.shape[:2]
    gh, gw = desc["grid"]
    alpha = tissue_alpha(desc)
    idx = _outside_index(_key(desc))
    if idx.size == 0:
        return img
    top = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}.get(img.dtype, 1.0)
    small = cv2.resize(img, (gw, gh), interpolation=cv2.INTER_AREA).astype(np.float32) / np.float32(top)
    weight = cv2.resize(alpha, (gw, gh), interpolation=cv2.INTER_AREA)
    weight = (weight >= 0.999).astype(np.float32)
    sigma = 0.04 * min(gh, gw)
    den = np.maximum(cv2.GaussianBlur(weight, (0, 0), sigma), 1e-6)
    num = cv2.GaussianBlur(small * (weight if small.ndim == 2 else weight[..., None]), (0, 0), sigma)
    fill = (num / (den if num.ndim == 2 else den[..., None])).astype(np.float32)
    full = np.asarray(cv2.resize(fill, (w, h), interpolation=cv2.INTER_LINEAR), np.float32)
    channels = 1 if img.ndim == 2 else img.shape[2]
    out = img.copy()
    flat_out = out.reshape(-1, channels)
    a = alpha.reshape(-1)[idx][:, None]
    src = img.reshape(-1, channels)[idx].astype(np.float32) / np.float32(top)
    mixed = src * a + full.reshape(-1, channels)[idx] * (1.0 - a)
    if top == 1.0:
        flat_out[idx] = mixed.astype(img.dtype)
    else:
        flat_out[idx] = np.clip(np.rint(mixed * np.float32(top)), 0, top).astype(img.dtype)
    return out


@lru_cache(maxsize=6)
def _outside_index(key: str) -> np.ndarray:
    """Flat indices of the pixels whose tissue alpha is below one (read-only, cached)."""
    out = np.flatnonzero(tissue_alpha(json.loads(key)) < 1.0)
    out.flags.writeable = False
    return out
