"""Scene model of an endoscopy frame: field of view, on-screen overlays, highlights.

    s = perturb.scene(image)          # HWC NumPy or CHW tensor; computed once per image
    s.field        # float32 (H, W) alpha of the field of view (smooth, anti-aliased edge)
    s.overlay      # bool (H, W): text, icons, scope-position box, picture-in-picture, black boxes
    s.highlight    # bool (H, W): specular highlights inside the field
    s.tissue       # float32 (H, W): field minus overlays (whole rectangles)
    s.tissue_of(image), s.overlay_of(image)  # the same where a text line over the tissue keeps
                   #   only its glyph strokes: what the engine's composite uses (needs the clean image)
    s.bbox         # (x0, y0, x1, y1) of the field
    s.descriptor   # compact JSON-able dict; Scene.from_descriptor rebuilds the masks exactly

The engine stores the descriptor in each record of a tissue-layer op (``record.extra["scene"]``)
so replay rebuilds the same masks without re-analysing the (possibly already perturbed) input.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perturb.scene import masks
from perturb.scene.analysis import SCENE_VERSION, analyse, analysed, highlight_mask, to_hwc_u8

__all__ = ["SCENE_VERSION", "Scene", "analyse", "scene"]


@dataclass(frozen=True)
class Scene:
    """The scene of one image; masks are rebuilt from ``descriptor`` (cached, keyed once per
    scene: treat ``descriptor`` as read-only)."""

    descriptor: dict[str, Any]
    highlight_: np.ndarray | None = field(default=None, repr=False, compare=False)
    # ``masks.descriptor_key(descriptor)`` once known; not an init field, so ``dataclasses.replace``
    # with another descriptor cannot carry it over
    key_: str | None = field(default=None, init=False, repr=False, compare=False)
    # digest of the exact pixels (CHW, own dtype) the engine analysed this scene from, set only
    # by the engine on the scenes of the samples it runs (``perturb.engine``), never by the
    # public constructors: a scene handed on to another image must not carry it
    pixels_: bytes | None = field(default=None, init=False, repr=False, compare=False)
    # set by the engine on a scene guessed for a sample before the sample's digest is checked
    # (``perturb.engine._RecordScenes.guess``): per-frame caches must not store what they
    # compute under ``pixels_`` from such a scene
    guessed_: bool = field(default=False, init=False, repr=False, compare=False)

    @classmethod
    def keyed(cls, descriptor: dict[str, Any], key: str) -> Scene:
        """The scene of ``descriptor`` whose ``descriptor_key`` is already known (``key``)."""
        scene = cls(descriptor)
        object.__setattr__(scene, "key_", key)
        return scene

    @classmethod
    def of(cls, image: Any) -> Scene:
        """The scene of one image as the engine composites it (``analyse``), without the highlight
        mask; its descriptor may be shared with the analysis cache: read it, never change it."""
        desc, _, key = analysed(image)
        return cls.keyed(desc, key)

    @property
    def key(self) -> str:
        """``masks.descriptor_key(descriptor)``: what the mask caches are keyed by (computed once)."""
        if self.key_ is None:
            object.__setattr__(self, "key_", masks.descriptor_key(self.descriptor))  # a cache, not state
        assert self.key_ is not None
        return self.key_

    @classmethod
    def from_descriptor(cls, descriptor: dict[str, Any]) -> Scene:
        if not isinstance(descriptor, dict) or descriptor.get("version") != SCENE_VERSION:
            raise ValueError(
                f"scene descriptor of version {descriptor.get('version') if isinstance(descriptor, dict) else None}"
                f" cannot be read by scene version {SCENE_VERSION}; use the perturb version named in the record"
            )
        return cls(descriptor)

    @property
    def size(self) -> tuple[int, int]:
        h, w = self.descriptor["size"]
        return int(h), int(w)

    @property
    def field(self) -> np.ndarray:
        return masks._field_alpha(self.key)  # the cached masks of this descriptor, keyed once

    @property
    def overlay(self) -> np.ndarray:
        return masks._overlay_mask(self.key)  # the cached masks of this descriptor, keyed once

    @property
    def tissue(self) -> np.ndarray:
        return masks._tissue_alpha(self.key)  # the cached masks of this descriptor, keyed once

    def tissue_of(self, image: Any) -> np.ndarray:
        """float32 (H, W): where a tissue-layer op shows in the composite of the clean ``image``
        (HW/HWC NumPy or CHW tensor): ``tissue`` with text lines cut to their glyph strokes."""
        return masks.composite_alpha(self.descriptor, self._chw(image))

    def overlay_of(self, image: Any) -> np.ndarray:
        """bool (H, W): the overlay pixels the composite keeps from the clean ``image``:
        ``overlay`` with text lines cut to their glyph strokes."""
        return masks.overlay_of(self.descriptor, self._chw(image))

    def _chw(self, image: Any) -> np.ndarray:
        chw = np.moveaxis(to_hwc_u8(image), -1, 0)
        if chw.shape[-2:] != self.size:
            raise ValueError(f"scene of size {self.size} does not fit an image of size {chw.shape[-2:]}")
        return chw

    @property
    def highlight(self) -> np.ndarray:
        if self.highlight_ is None:
            raise ValueError("highlight mask is only known for a scene computed from its image (perturb.scene(image))")
        return self.highlight_

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        return masks.bbox(self.descriptor)

    @property
    def overlays(self) -> list[tuple[int, int, int, int, str]]:
        return [(int(a), int(b), int(c), int(d), str(k)) for a, b, c, d, k in self.descriptor["overlays"]]


def scene(image: Any) -> Scene:
    """The scene of one image (HW/HWC NumPy uint8/uint16/float in [0, 1], or a CHW torch tensor).
    A pure function of the pixels."""
    rgb = to_hwc_u8(image)
    desc = analyse(rgb)
    return Scene(desc, highlight_mask(rgb, masks.field_alpha(desc)))


class _CallableModule(types.ModuleType):
    """``perturb.scene`` is this package and also callable: ``perturb.scene(image)``."""

    def __call__(self, image: Any) -> Scene:
        return scene(image)


sys.modules[__name__].__class__ = _CallableModule
