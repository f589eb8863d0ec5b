"""Real endoscopy frames for the scene and contract tests, from ONE place: ``frame_dir()``.

Point it elsewhere with ``PERTURB_SAMPLES`` (a folder, or a folder with an ``endoscopy/``
subfolder); by default ``perturb.calibrate.run.default_sample_dir()`` finds
``../shared/samples/endoscopy`` beside the repository or ``tests/data/endoscopy``. Frames are
loaded once and downscaled for speed where a test allows it; their scenes are computed once.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.calibrate.run import default_sample_dir, load_images
from perturb.scene import Scene

NO_FRAMES = (
    "no real endoscopy frame found: set PERTURB_SAMPLES to a folder of frames, or provide "
    "../shared/samples/endoscopy or tests/data/endoscopy"
)


def frame_dir() -> Path | None:
    return default_sample_dir()


@lru_cache(maxsize=1)
def frames() -> tuple[tuple[str, np.ndarray], ...]:
    """(name, HWC uint8 RGB) of every real frame at its stored size."""
    return tuple(load_images(frame_dir())) if frame_dir() is not None else ()


def require_frames() -> tuple[tuple[str, np.ndarray], ...]:
    found = frames()
    if not found:
        pytest.skip(NO_FRAMES)
    return found


def frame(name: str) -> np.ndarray | None:
    """A frame by file name, or None where the sample set does not hold it."""
    for n, img in require_frames():
        if n == name:
            return img
    return None


def downscale(img: np.ndarray, short: int) -> np.ndarray:
    h, w = img.shape[:2]
    s = short / min(h, w)
    if s >= 1:
        return img
    return cv2.resize(img, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)


@lru_cache(maxsize=64)
def small_frame(name: str, short: int = 288) -> tuple[np.ndarray, Scene]:
    """A frame downscaled to ``short`` px and its scene (computed once)."""
    img = frame(name)
    assert img is not None
    small = downscale(img, short)
    return small, perturb.scene(small)


def frames_with_overlays(limit: int = 3) -> list[str]:
    """Names of frames whose scene finds on-screen overlays next to or over the field, and a dark
    surround (the cases the contract is about), at most ``limit``."""
    picked = []
    for name, _img in require_frames():
        _small, s = small_frame(name)
        if s.overlay.any() and (s.field == 0).mean() > 0.1:
            picked.append(name)
        if len(picked) == limit:
            break
    return picked


def overlay_batch(limit: int = 3) -> torch.Tensor:
    """``frames_with_overlays(limit)`` downscaled (``small_frame``) as one uint8 BCHW batch,
    cropped to their common size; skips where the sample set has none."""
    names = frames_with_overlays(limit=limit)
    if not names:
        pytest.skip("no real frame with overlays and a dark surround in the sample set")
    frames = [torch.from_numpy(np.ascontiguousarray(small_frame(n)[0])).permute(2, 0, 1) for n in names]
    h = min(f.shape[1] for f in frames)
    w = min(f.shape[2] for f in frames)
    return torch.stack([f[:, :h, :w].contiguous() for f in frames])
