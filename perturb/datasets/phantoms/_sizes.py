"""Sizes of the built-in sample (a leaf: the package and the renderers import it)."""

from __future__ import annotations

BUILTIN_IMAGES = 16  # images of the built-in sample
DEFAULT_SIZE = (400, 320)  # (width, height) of the endoscopy phantoms
