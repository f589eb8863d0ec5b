"""The composite of a perturbed layer back into its image, as the ops apply it (the scene is the
model: which pixels are tissue, overlay, glyph; this module is what an op does with it).

* ``compose_numpy``: in place, ``dst`` (the perturbed sample) takes ``src``'s (the clean
  sample's) pixels where the scene's protected layers are: of an endoscopy frame its surround
  and overlays (``compose_frame``: a precomputed plan per descriptor, blended inside the field's
  bounding box; text lines over the tissue keep only their glyph strokes, whose cover depends on
  the clean pixels and is kept per content of the glyph windows), of a radiograph its burned-in
  annotations (``perturb.scene.radiograph.compose_numpy``).
* ``extend_numpy``: what a spatial (PSF) op reads instead of the raw sample: the tissue with the
  surround and the overlays replaced by a smooth extension of it (``extend_frame``: normalised
  gaussian fill from a coarse grid of tissue samples, ``EXT_*``), or the film with its
  annotations filled from around them.
* ``scene_extension_alpha`` / ``scene_extension_fill``: the same per scene and clean image,
  computed once and kept by the ``Scene`` (the engine's batched torch path blends with them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from perturb.scene import Scene, check_fits, radiograph
from perturb.scene.masks import (
    _alpha_without_text_cached,
    _key,
    _memo,
    _tissue_alpha,
    bbox,
    glyph_strokes,
    glyph_window,
    text_boxes,
)


@dataclass(frozen=True)
class _ComposePlan:
    """What ``compose_frame`` needs of a descriptor, precomputed once: ``keep`` (uint8 (H, W),
    1 where the output is the source: outside the bbox, alpha 0), the flat indices ``part`` of
    the pixels of partial alpha and their alpha ``part_alpha``, both outside ``text``: the
    rectangle around the text lines inside the bbox (x0, y0, x1, y1), whose alpha depends on the
    image and is composed separately, or None."""

    keep: np.ndarray
    part: np.ndarray
    part_alpha: np.ndarray
    text: tuple[int, int, int, int] | None
    part3: np.ndarray  # ``part`` in each plane of a CHW 3-plane sample (flat indices)
    part_alpha3: np.ndarray


@_memo
def _compose_plan(key: str) -> _ComposePlan:
    desc = json.loads(key)
    h, w = desc["size"]
    x0, y0, x1, y1 = bbox(desc)
    boxes = text_boxes(desc)
    static = _alpha_without_text_cached(key) if boxes else _tissue_alpha(key)
    keep = np.ones((h, w), np.uint8)
    a = static[y0:y1, x0:x1]
    keep[y0:y1, x0:x1] = a == 0.0
    partial = np.zeros((h, w), bool)
    partial[y0:y1, x0:x1] = (a > 0.0) & (a < 1.0)
    text = None
    if boxes:
        tx0, ty0 = max(x0, min(b[0] for b in boxes)), max(y0, min(b[1] for b in boxes))
        tx1, ty1 = min(x1, max(b[2] for b in boxes)), min(y1, max(b[3] for b in boxes))
        if tx1 > tx0 and ty1 > ty0:
            text = (tx0, ty0, tx1, ty1)  # alpha 0 there stays 0 under the glyph cover (a minimum)
            partial[ty0:ty1, tx0:tx1] = False
    part = np.flatnonzero(partial)
    part_alpha = static.reshape(-1)[part]
    part3 = np.concatenate([part + c * (h * w) for c in range(3)])
    part_alpha3 = np.tile(part_alpha, 3)
    for arr in (keep, part, part_alpha, part3, part_alpha3):
        arr.flags.writeable = False
    return _ComposePlan(keep, part, part_alpha, text, part3, part_alpha3)


def _check_size(desc: dict[str, Any], src: np.ndarray) -> None:
    if tuple(desc["size"]) != tuple(src.shape[-2:]):
        raise ValueError(
            f"scene of size {tuple(desc['size'])} does not fit an image of size {src.shape[-2:]}"
        )


def compose_frame(
    src: np.ndarray, dst: np.ndarray, desc: dict[str, Any], key: str | None = None
) -> None:
    """In place: ``dst`` (CHW, the perturbed sample) becomes ``alpha * dst + (1 - alpha) * src``
    with ``composite_alpha(desc, src)`` (the tissue alpha; glyph strokes only of text lines);
    pixels with alpha 0 are ``src`` exactly, alpha 1 ``dst`` exactly. Work is per-descriptor
    precomputed (``_compose_plan``): a masked copy of the source where alpha is 0 (outside the
    field's bbox, the surround and the overlays), the blend only on the soft edge, and the
    glyph cover only inside the rectangle of the text lines. ``key``: ``descriptor_key(desc)``
    where the caller has it (e.g. ``Scene.key``)."""
    _check_size(desc, src)
    key = _key(desc) if key is None else key
    plan = _compose_plan(key)
    planes = src.shape[0]
    fast = src.flags.c_contiguous and dst.flags.c_contiguous and src.dtype == dst.dtype
    for c in range(planes):
        s, d = src[c], dst[c]
        if fast:
            cv2.copyTo(s, plan.keep, d)  # in place: both planes are contiguous
        else:
            np.copyto(d, s, where=plan.keep.astype(bool))
    if plan.part.size:
        _blend_at(
            src,
            dst,
            *((plan.part3, plan.part_alpha3) if planes == 3 else (plan.part, plan.part_alpha)),
        )
    if plan.text is not None:
        # alpha 1 keeps ``dst``, static alpha 0 was copied above; the rest (glyph cover, soft
        # edge) blends, where alpha 0 gives ``src`` exactly: base + 0 * (d - base) = base
        index, alpha = _text_blend(desc, key, src, plan.text)
        if index.size:
            _blend_at(src, dst, index, alpha)


def _blend_at(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> None:
    """In place: ``dst`` at the flat ``index`` (into CHW) becomes ``src + alpha (dst - src)`` in
    float32, integer levels rounded half to even (1-D gathers: far faster than per plane).
    With ``alpha`` in [0, 1] the float32 result lies between the two levels (every step of it
    rounds monotonically and both ends are exact), so no clip is needed before the cast."""
    if src.dtype != dst.dtype or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        _blend_at_any(src, dst, index, alpha)
        return
    s_flat = src.reshape(-1)
    d_flat = dst.reshape(-1)
    base = s_flat[index].astype(np.float32, copy=False)
    mixed = d_flat[index].astype(np.float32, copy=False)
    mixed -= base
    mixed *= alpha
    mixed += base  # == base + alpha * (dst - base): float addition and product commute exactly
    if dst.dtype == np.float32:
        d_flat[index] = mixed
    else:
        np.rint(mixed, out=mixed)
        d_flat[index] = mixed.astype(dst.dtype)


def _blend_at_any(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> None:
    """``_blend_at`` for any layout and pair of dtypes (a reshape may copy)."""
    s_flat = src.reshape(-1)
    d_flat = dst.reshape(-1)
    base = s_flat[index].astype(np.float32)
    mixed = base + alpha * (d_flat[index].astype(np.float32) - base)
    if dst.dtype == np.float32:
        d_flat[index] = mixed
    else:
        top = 255.0 if dst.dtype == np.uint8 else 65535.0
        d_flat[index] = np.clip(np.rint(mixed), 0, top).astype(dst.dtype)
    if not np.shares_memory(d_flat, dst):  # reshape made a copy
        dst[...] = d_flat.reshape(dst.shape)


@dataclass(frozen=True)
class _TextCover:
    """The composite alpha of one image inside the rectangle of its text lines (``rect`` of
    ``_ComposePlan.text``): ``flat`` (flat indices into one plane) of the pixels that blend
    there, alpha below 1 where the static alpha is above 0, in raster order, their ``alpha``,
    and both for every plane of the image (``index`` into CHW, ``index_alpha``)."""

    flat: np.ndarray
    alpha: np.ndarray
    index: np.ndarray
    index_alpha: np.ndarray


def _text_blend(
    desc: dict[str, Any], key: str, image: np.ndarray, rect: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(flat index into CHW, alpha) of the pixels inside ``rect`` that ``compose_frame``
    blends there (``_text_cover``)."""
    cover = _text_cover(desc, key, image, rect)
    return cover.index, cover.index_alpha


def _text_cover(
    desc: dict[str, Any], key: str, image: np.ndarray, rect: tuple[int, int, int, int]
) -> _TextCover:
    """The ``_TextCover`` of ``image`` (CHW NumPy) inside ``rect``."""
    tx0, ty0, tx1, ty1 = rect
    alpha = _text_alpha(desc, key, image, rect)
    static = _alpha_without_text_cached(key)[ty0:ty1, tx0:tx1]
    rows, cols = np.nonzero((alpha < 1.0) & (static > 0.0))
    h, w = desc["size"]
    flat = (rows + ty0) * int(w) + (cols + tx0)
    planes = image.shape[0]
    values = alpha[rows, cols]
    value = _TextCover(
        flat,
        values,
        np.concatenate([flat + c * (h * w) for c in range(planes)]),
        np.tile(values, planes),
    )
    for arr in (value.flat, value.alpha, value.index, value.index_alpha):
        arr.flags.writeable = False
    return value


def _text_alpha(
    desc: dict[str, Any], key: str, image: Any, rect: tuple[int, int, int, int]
) -> np.ndarray:
    """``composite_alpha(desc, image)`` inside ``rect`` (x0, y0, x1, y1), computed there only."""
    rx0, ry0, rx1, ry1 = rect
    alpha = _alpha_without_text_cached(key)[ry0:ry1, rx0:rx1].copy()
    for box in text_boxes(desc):
        x0, y0, x1, y1 = box
        cx0, cy0, cx1, cy1 = max(x0, rx0), max(y0, ry0), min(x1, rx1), min(y1, ry1)
        if cx1 <= cx0 or cy1 <= cy0:
            continue
        wx0, wy0, wx1, wy1, _ = glyph_window(desc, box)
        window = image[:, wy0:wy1, wx0:wx1]
        if hasattr(window, "detach"):
            window = window.detach().cpu().numpy()
        cover = glyph_strokes(np.asarray(window), desc, box)[
            cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0
        ]
        cut = alpha[cy0 - ry0 : cy1 - ry0, cx0 - rx0 : cx1 - rx0]
        np.minimum(cut, np.float32(1.0) - cover, out=cut)
    return alpha


EXT_GRID_SHORT = 64  # coarse grid of the tissue extension: shorter side in cells
EXT_SIGMA = 0.04  # width of the extension's normalised gaussian, fraction of the shorter side
# How far past the field's bbox the extension is written (fraction of the shorter side): beyond
# the reach of every spatial op's PSF at severity 5 (gaussian 3 sigma 0.081, motion half-length
# 0.05, defocus 0.032, lens droplets, distortion and lateral colour below 0.04).
EXT_MARGIN = 0.1


@dataclass(frozen=True)
class _ExtensionPlan:
    """What ``extend_frame`` needs of a descriptor, precomputed once: the coarse grid ``size``
    (ch, cw), its tissue ``weight`` (cells wholly tissue), ``inv_den`` (1 / the weight's
    gaussian), the gaussian's ``sigma`` in cells; ``rect`` (x0, y0, x1, y1) around every
    pixel the extension writes (alpha below 1 within ``EXT_MARGIN`` of the bbox; None: none)
    and its ``keep`` mask (uint8, 1 where alpha is 0: the fill replaces the pixel); ``part``/``part_alpha`` (flat indices and alpha
    of partial alpha outside ``text``) and ``text``, as in ``_ComposePlan``."""

    size: tuple[int, int]
    weight: np.ndarray
    inv_den: np.ndarray
    sigma: float
    rect: tuple[int, int, int, int] | None
    keep: np.ndarray
    part: np.ndarray
    part_alpha: np.ndarray
    text: tuple[int, int, int, int] | None


@_memo
def _extension_need(key: str) -> np.ndarray:
    """bool (H, W), read-only: the pixels ``extend_frame`` may write (alpha below 1 within
    ``EXT_MARGIN`` of the field's bbox, and the rectangle of the text lines)."""
    desc = json.loads(key)
    h, w = desc["size"]
    static = _alpha_without_text_cached(key) if text_boxes(desc) else _tissue_alpha(key)
    margin = round(EXT_MARGIN * min(h, w))
    bx0, by0, bx1, by1 = bbox(desc)
    rx0, ry0, rx1, ry1 = (
        max(0, bx0 - margin),
        max(0, by0 - margin),
        min(w, bx1 + margin),
        min(h, by1 + margin),
    )
    need = np.zeros((h, w), bool)
    need[ry0:ry1, rx0:rx1] = static[ry0:ry1, rx0:rx1] < 1.0
    text = _compose_plan(key).text
    if text is not None:
        tx0, ty0, tx1, ty1 = text
        need[ty0:ty1, tx0:tx1] = True
    need.flags.writeable = False
    return need


def extension_grid(h: int, w: int) -> tuple[tuple[int, int], float]:
    """((ch, cw), sigma): the coarse grid of the tissue extension of an h x w image and its
    gaussian's sigma in cells."""
    f = max(1.0, min(h, w) / EXT_GRID_SHORT)
    ch, cw = max(1, round(h / f)), max(1, round(w / f))
    return (ch, cw), EXT_SIGMA * min(ch, cw)


def extension_alpha(key: str, composite: np.ndarray) -> np.ndarray:
    """float32 (H, W): the weight of the clean pixels in the tissue extension of the scene of
    ``key`` (``composite``: its composite alpha with the clean image): the composite alpha where
    ``extend_frame`` writes, 1 elsewhere, so ``extended = fill + a (src - fill)`` (``src`` where
    ``a`` is 1) is ``extend_frame``'s result with any fill."""
    return np.where(_extension_need(key), composite, np.float32(1.0)).astype(np.float32)


@_memo
def _extension_plan(key: str) -> _ExtensionPlan:
    desc = json.loads(key)
    h, w = desc["size"]
    (ch, cw), sigma = extension_grid(h, w)
    cells = cv2.resize(_tissue_alpha(key), (cw, ch), interpolation=cv2.INTER_AREA)
    weight = np.ascontiguousarray((cells >= 0.999).astype(np.float32))
    inv_den = (1.0 / np.maximum(cv2.GaussianBlur(weight, (0, 0), sigma), 1e-6)).astype(np.float32)
    plan = _compose_plan(key)
    static = _alpha_without_text_cached(key) if text_boxes(desc) else _tissue_alpha(key)
    need = _extension_need(key)
    keep_all = static == 0.0
    rect, keep = None, np.zeros((0, 0), np.uint8)
    ys, xs = np.nonzero(need.any(axis=1))[0], np.nonzero(need.any(axis=0))[0]
    if ys.size:
        rect = (int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1)
        x0, y0, x1, y1 = rect
        keep = (keep_all[y0:y1, x0:x1] & need[y0:y1, x0:x1]).astype(np.uint8)
    partial = need & (static > 0.0) & (static < 1.0)
    if plan.text is not None:
        tx0, ty0, tx1, ty1 = plan.text
        partial[ty0:ty1, tx0:tx1] = False
    part = np.flatnonzero(partial)
    part_alpha = static.reshape(-1)[part]
    for arr in (weight, inv_den, keep, part, part_alpha):
        arr.flags.writeable = False
    return _ExtensionPlan((ch, cw), weight, inv_den, sigma, rect, keep, part, part_alpha, plan.text)


def extend_frame(
    src: np.ndarray, dst: np.ndarray, desc: dict[str, Any], key: str | None = None
) -> None:
    """``dst`` (CHW, ``src``'s shape and dtype) becomes ``src`` (the clean sample) with its
    surround and overlays (of a text line, its glyph strokes) replaced by a smooth extension of
    the nearby tissue, ``alpha * src + (1 - alpha) * fill`` with the composite's alpha, so a
    spatial op (a PSF, a warp) applied to ``dst`` does not pull the dark surround or the
    overlays into the field's edge. ``fill`` is a normalised convolution of the tissue (a
    gaussian of ``EXT_SIGMA`` of the shorter side over the cells wholly inside the tissue) on a
    coarse grid (``EXT_GRID_SHORT`` cells, bilinear samples of ``src``), interpolated bilinearly; it is written only within
    ``EXT_MARGIN`` of the field's bbox (beyond, ``src``). ``key``: as in ``compose_frame``."""
    _check_size(desc, src)
    key = _key(desc) if key is None else key
    plan = _extension_plan(key)
    np.copyto(dst, src)
    if plan.rect is None:
        return
    out = dst if dst.flags.c_contiguous else np.empty_like(dst)  # written through flat views
    if out is not dst:
        np.copyto(out, src)
    top = _TOP.get(src.dtype)
    cover = None if plan.text is None else _text_cover(desc, key, src, plan.text)
    x0, y0, x1, y1 = plan.rect
    fills = extension_fill(extension_samples(src, desc, key), desc, src.dtype, key)
    for c in range(src.shape[0]):
        fill = fills[c]
        d = out[c]
        cv2.copyTo(fill[y0:y1, x0:x1], plan.keep, d[y0:y1, x0:x1])
        d_flat, s_flat, f_flat = d.reshape(-1), src[c].reshape(-1), fill.reshape(-1)
        if plan.part.size:
            _blend(d_flat, s_flat, f_flat, plan.part, plan.part_alpha, top)
        if cover is not None and cover.flat.size:
            _blend(d_flat, s_flat, f_flat, cover.flat, cover.alpha, top)
    if out is not dst:
        np.copyto(dst, out)


_TOP = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}


def extension_samples(src: np.ndarray, desc: dict[str, Any], key: str | None = None) -> np.ndarray:
    """float32 (C, ch, cw): the bilinear samples of ``src`` (CHW) on the extension's coarse grid,
    all of the image that its fill (``extension_fill``) depends on. Bilinear samples, not area
    means: 15x cheaper, and the gaussian of ``EXT_SIGMA`` averages some hundred of them, so the
    fill moves by about half a level (8-bit) on real frames."""
    ch, cw = _extension_plan(_key(desc) if key is None else key).size
    return np.stack(
        [cv2.resize(plane, (cw, ch), interpolation=cv2.INTER_LINEAR) for plane in src]
    ).astype(np.float32)


def extension_fill(
    samples: np.ndarray, desc: dict[str, Any], dtype: np.dtype, key: str | None = None
) -> np.ndarray:
    """(C, H, W) of ``dtype``: the tissue extension's fill from the coarse ``samples``
    (``extension_samples``): their normalised convolution over the cells wholly inside the
    tissue (integer levels rounded and clipped), interpolated bilinearly to the image size."""
    plan = _extension_plan(_key(desc) if key is None else key)
    h, w = desc["size"]
    top = _TOP.get(np.dtype(dtype))
    planes = []
    for small in samples:
        weighted = small * plan.weight
        coarse = cv2.GaussianBlur(weighted, (0, 0), plan.sigma)
        coarse *= plan.inv_den
        if top is not None:
            np.rint(coarse, out=coarse)
            coarse = np.clip(coarse, 0.0, top, out=coarse).astype(dtype)
        planes.append(cv2.resize(coarse, (int(w), int(h)), interpolation=cv2.INTER_LINEAR))
    return np.stack(planes)


def _blend(
    d: np.ndarray,
    s: np.ndarray,
    fill: np.ndarray,
    idx: np.ndarray,
    alpha: np.ndarray,
    top: float | None,
) -> None:
    """In place on flat planes: ``d[idx] = fill + alpha (s - fill)`` at ``idx`` in float32 (integer
    levels rounded half to even; as in ``_blend_at``, the mix lies between its two levels)."""
    base = fill[idx].astype(np.float32, copy=False)
    mixed = s[idx].astype(np.float32, copy=False)
    mixed -= base
    mixed *= alpha
    mixed += base
    if top is None:
        d[idx] = mixed
    else:
        np.rint(mixed, out=mixed)
        d[idx] = mixed.astype(d.dtype)


def compose_numpy(
    src: np.ndarray,
    dst: np.ndarray,
    desc: dict[str, Any],
    key: str | None = None,
    shadow: np.ndarray | None = None,
) -> None:
    """``compose_frame``, or for a radiograph ``radiograph.compose_numpy`` (``shadow``: the
    share of the beam the op stopped, where a lead marker is not pasted back): in place,
    ``dst`` takes ``src``'s pixels where the scene's protected layers are."""
    if radiograph.is_radiograph(desc):
        radiograph.compose_numpy(src, dst, desc, key, shadow)
    else:
        compose_frame(src, dst, desc, key)


def extend_numpy(
    src: np.ndarray, dst: np.ndarray, desc: dict[str, Any], key: str | None = None
) -> None:
    """``extend_frame``, or for a radiograph ``radiograph.extend_numpy`` (the film with its
    annotations filled from around them)."""
    if radiograph.is_radiograph(desc):
        radiograph.extend_numpy(src, dst, desc, key)
    else:
        extend_frame(src, dst, desc, key)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def scene_extension_alpha(scene: Scene, image: np.ndarray | None) -> np.ndarray:
    """float32 (H, W), read-only: the weight of the clean pixels in the tissue extension of
    spatial ops (``extension_alpha``) of ``scene`` with its clean ``image`` (CHW NumPy, its own
    dtype): kept on the scene where it follows from the descriptor alone, else (text lines)
    computed on each call as ``Scene.composite_alpha``."""
    if scene.kind == "radiograph":
        return scene.derived("extension", radiograph.extension_alpha)
    if not text_boxes(scene.descriptor):
        return scene.remember(
            "extension", lambda: extension_alpha(scene.key, scene.composite_alpha(image))
        )
    if image is None:
        raise ValueError("this scene has text lines: its extension reads the clean image's glyph windows")
    return _read_only(extension_alpha(scene.key, scene.composite_alpha(image)))


def scene_extension_fill(scene: Scene, image: np.ndarray) -> np.ndarray:
    """(C, H, W) of ``image``'s dtype, read-only: the fill of the tissue extension of the clean
    ``image`` (``extension_fill`` of its coarse samples, ``extension_samples``); of a
    radiograph: the film with its annotations filled from around them."""
    check_fits(scene, image)
    if scene.kind == "radiograph":
        fill = radiograph.extension_fill(image, scene.descriptor, scene.key)
    else:
        samples = extension_samples(image, scene.descriptor, scene.key)
        fill = extension_fill(samples, scene.descriptor, image.dtype, scene.key)
    return _read_only(fill)
