"""Scene model of an endoscopy frame: field of view, on-screen overlays, highlights.

    s = perturb.scene(image)          # HWC NumPy or CHW tensor; computed once per image
    s.field        # float32 (H, W) alpha of the field of view (smooth, anti-aliased edge)
    s.overlay      # bool (H, W): text, icons, scope-position box, picture-in-picture, black boxes
    s.highlight    # bool (H, W): specular highlights inside the field (not overlay pixels)
    s.tissue       # float32 (H, W): field minus overlays (whole rectangles)
    s.tissue_of(image), s.overlay_of(image)  # the same where a text line over the tissue keeps
                   #   only its glyph strokes: what the engine's composite uses (needs the clean image)
    s.bbox         # (x0, y0, x1, y1) of the field
    s.descriptor   # compact JSON-able dict; Scene.from_descriptor rebuilds the masks exactly

The engine stores the descriptor in each record of a tissue-layer op (``record.extra["scene"]``)
so replay rebuilds the same masks without re-analysing the (possibly already perturbed) input.

A radiograph's scene (``perturb.scene.radiograph``; ``Scene.of(image, kind="radiograph")``, what
the engine analyses for an X-ray op) has one layer over the film: its burned-in annotations
(text, laterality markers and holders). ``overlay`` is their pixels, ``field`` the whole image,
and the composite keeps them exactly under an acquisition op; its descriptor says
``"annotations": "none found"`` where none were found.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perturb.scene import masks, radiograph
from perturb.scene.analysis import SCENE_VERSION, analyse, analysed, highlight_mask, to_hwc_u8

__all__ = [
    "KINDS",
    "SCENE_VERSION",
    "Scene",
    "analyse",
    "check_fits",
    "kind_of",
    "scene",
]

KINDS = ("endoscopy", "radiograph")  # what a scene models: an endoscopy frame, a radiograph


def kind_of(descriptor: Any) -> str:
    """ "radiograph" for a radiograph's descriptor, else "endoscopy"."""
    return "radiograph" if radiograph.is_radiograph(descriptor) else "endoscopy"


@dataclass(frozen=True)
class Scene:
    """The scene of one image; masks are rebuilt from ``descriptor`` (treat it as read-only).

    A scene computes what it derives from its descriptor alone once and keeps it in ``_memo``:
    the descriptor key, the composite alpha of a frame without text lines and the device
    copies of such alphas (``held_on``). What also reads the clean image's pixels (a text
    line's glyph strokes, the fill of spatial ops) is computed where it is used, not kept."""

    descriptor: dict[str, Any]
    highlight_: np.ndarray | None = field(default=None, repr=False, compare=False)
    # values derived from the descriptor (and the clean image's glyph windows); not an init
    # field, so ``dataclasses.replace`` with another descriptor starts afresh
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def keyed(cls, descriptor: dict[str, Any], key: str) -> Scene:
        """The scene of ``descriptor`` whose ``descriptor_key`` is already known (``key``)."""
        scene = cls(descriptor)
        scene._memo["key"] = key
        return scene

    @classmethod
    def of(cls, image: Any, kind: str = "endoscopy") -> Scene:
        """The scene of one image as the engine composites it (``analyse``; a radiograph's with
        ``kind="radiograph"``), without the highlight mask; its descriptor may be shared with the
        analysis cache: read it, never change it."""
        if kind not in KINDS:
            raise ValueError(f"scene kind must be one of {KINDS}, got {kind!r}")
        desc, _, key = radiograph.analysed(image) if kind == "radiograph" else analysed(image)
        return cls.keyed(desc, key)

    @property
    def kind(self) -> str:
        """What the scene models: "endoscopy" or "radiograph" (``kind_of`` its descriptor)."""
        return kind_of(self.descriptor)

    @property
    def key(self) -> str:
        """``masks.descriptor_key(descriptor)``: what the mask caches are keyed by (computed once)."""
        key = self._memo.get("key")
        if key is None:
            key = self._memo["key"] = masks.descriptor_key(self.descriptor)
        return str(key)

    @classmethod
    def from_descriptor(cls, descriptor: dict[str, Any]) -> Scene:
        if radiograph.is_radiograph(descriptor):
            radiograph.check_descriptor(descriptor)
            return cls(descriptor)
        if not isinstance(descriptor, dict) or descriptor.get("version") != SCENE_VERSION:
            raise ValueError(
                f"scene descriptor of version {descriptor.get('version') if isinstance(descriptor, dict) else None}"
                f" cannot be read by scene version {SCENE_VERSION}; use the perturb version named in the record"
            )
        return cls(descriptor)

    def composite_alpha(self, image: np.ndarray | None) -> np.ndarray:
        """float32 (H, W), read-only: ``masks.composite_alpha`` of this scene with the clean
        ``image`` (CHW NumPy, its own dtype): from the descriptor alone (kept) unless the scene
        has text lines, whose glyph strokes are read from ``image`` on each call; of a
        radiograph: 0 on its annotations, 1 elsewhere. ``image`` may be None for a scene that
        reads no pixels (``reads_pixels``)."""
        if self.kind == "radiograph":
            return self.derived("composite", radiograph.composite_alpha)
        if not masks.text_boxes(self.descriptor):
            return masks.tissue_alpha(self.descriptor, self.key)
        if image is None:
            raise ValueError("this scene has text lines: its composite reads the clean image's glyph windows")
        alpha = masks.composite_alpha(self.descriptor, image)
        alpha.flags.writeable = False
        return alpha

    @property
    def reads_pixels(self) -> bool:
        """Whether the composite (and the extension alpha of spatial ops) depend on the clean
        image's pixels: an endoscopy frame with burned-in text lines (their glyph strokes).
        Otherwise they follow from the descriptor alone, so a device copy can be kept
        (``held_on``)."""
        return self.kind != "radiograph" and bool(masks.text_boxes(self.descriptor))

    def held_on(self, name: str, device: Any, value: Any = None) -> Any:
        """The device copy of a pixel-free alpha kept under ``name`` for ``device`` (None when
        none is kept yet); with ``value``, keep it (never for a scene that ``reads_pixels``).
        The engine uploads an image's alpha once and every later op of its chain reuses it."""
        slot = ("device", name, str(device))
        if value is not None and not self.reads_pixels:
            self._memo[slot] = value
        return self._memo.get(slot)

    def remember(self, name: str, compute: Any) -> np.ndarray:
        """``compute()`` kept under ``name`` (computed on the first call only)."""
        held = self._memo.get(name)
        if held is None:
            held = self._memo[name] = compute()
        return np.asarray(held)

    def derived(self, name: str, compute: Any) -> np.ndarray:
        """``compute(descriptor, key)`` kept under ``name`` (read-only)."""
        held = self._memo.get(name)
        if held is None:
            held = compute(self.descriptor, self.key)
            held.flags.writeable = False
            self._memo[name] = held
        return np.asarray(held)

    @property
    def size(self) -> tuple[int, int]:
        h, w = self.descriptor["size"]
        return int(h), int(w)

    @property
    def field(self) -> np.ndarray:
        if self.kind == "radiograph":  # the whole film
            return self.derived("field", lambda d, _k: np.ones(self.size, np.float32))
        return masks._field_alpha(self.key)  # the cached masks of this descriptor, keyed once

    @property
    def overlay(self) -> np.ndarray:
        if self.kind == "radiograph":  # the annotation pixels
            return radiograph.mask_of(self.descriptor, self.key)
        return masks._overlay_mask(self.key)  # the cached masks of this descriptor, keyed once

    @property
    def tissue(self) -> np.ndarray:
        if self.kind == "radiograph":
            return self.derived("composite", radiograph.composite_alpha)
        return masks._tissue_alpha(self.key)  # the cached masks of this descriptor, keyed once

    def tissue_of(self, image: Any) -> np.ndarray:
        """float32 (H, W): where a tissue-layer op shows in the composite of the clean ``image``
        (HW/HWC NumPy or CHW tensor): ``tissue`` with text lines cut to their glyph strokes."""
        if self.kind == "radiograph":
            return self.tissue.copy()
        return masks.composite_alpha(self.descriptor, self._chw(image))

    def overlay_of(self, image: Any) -> np.ndarray:
        """bool (H, W): the overlay pixels the composite keeps from the clean ``image``:
        ``overlay`` with text lines cut to their glyph strokes."""
        if self.kind == "radiograph":
            return self.overlay.copy()
        return masks.overlay_of(self.descriptor, self._chw(image))

    def _chw(self, image: Any) -> np.ndarray:
        chw = np.moveaxis(to_hwc_u8(image), -1, 0)
        check_fits(self, chw)
        return chw

    @property
    def highlight(self) -> np.ndarray:
        if self.highlight_ is None:
            raise ValueError(
                "highlight mask is only known for a scene computed from its image (perturb.scene(image))"
            )
        return self.highlight_

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        if self.kind == "radiograph":
            h, w = self.size
            return 0, 0, w, h
        return masks.bbox(self.descriptor)

    @property
    def overlays(self) -> list[tuple[int, int, int, int, str]]:
        if self.kind == "radiograph":  # kind: "text", "marker L", "marker R"
            found = []
            for a in radiograph.annotations_of(self.descriptor):
                x0, y0, x1, y1 = (int(v) for v in a["box"])
                found.append((x0, y0, x1, y1, a["type"] + (f" {a['side']}" if a["side"] else "")))
            return found
        return [
            (int(a), int(b), int(c), int(d), str(k))
            for a, b, c, d, k in self.descriptor["overlays"]
        ]


def check_fits(scene: Scene, chw: np.ndarray) -> None:
    if tuple(chw.shape[-2:]) != scene.size:
        raise ValueError(
            f"scene of size {scene.size} does not fit an image of size {tuple(chw.shape[-2:])}"
        )


def scene(image: Any) -> Scene:
    """The scene of one image (HW/HWC NumPy uint8/uint16/float in [0, 1], or a CHW torch tensor).
    A pure function of the pixels."""
    rgb = to_hwc_u8(image)
    desc = analyse(rgb)
    kept = masks.overlay_of(desc, np.ascontiguousarray(np.moveaxis(rgb, -1, 0)))
    return Scene(desc, highlight_mask(rgb, masks.field_alpha(desc)) & ~kept)  # glyphs are not


class _CallableModule(types.ModuleType):
    """``perturb.scene`` is this package and also callable: ``perturb.scene(image)``."""

    def __call__(self, image: Any) -> Scene:
        return scene(image)


sys.modules[__name__].__class__ = _CallableModule
