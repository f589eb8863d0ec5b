"""Test helpers: the real sample images, devices, small batches.

Real-image tests read ``SAMPLES``: ``$PERTURB_SAMPLES_DIR`` when set, else the project's
shared samples beside the repo (``../shared/samples``, 21 endoscopy frames and 18 chest
X-rays) when present, else the few real images shipped in ``tests/data`` (11 PolypGen frames, 5
NIH chest X-rays; ATTRIBUTION.md there), so a clone with nothing beside it passes its tests.
``PERTURB_SAMPLES_DIR=tests/data`` runs the suite as such a clone does (CI does, once).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from perturb.io.images import read_image, to_tensor

SHARED_SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
BUNDLED_SAMPLES = Path(__file__).resolve().parent / "data"


def samples_dir() -> Path:
    """The folder of real images the tests use (see the module docstring)."""
    chosen = os.environ.get("PERTURB_SAMPLES_DIR")
    if chosen:
        return Path(chosen).resolve()
    return SHARED_SAMPLES if (SHARED_SAMPLES / "endoscopy").is_dir() else BUNDLED_SAMPLES


SAMPLES = samples_dir()
ENDOSCOPY = sorted((SAMPLES / "endoscopy").glob("*.jpg"))
XRAY = sorted((SAMPLES / "xray").glob("*.png"))

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
    ),
]


def require_samples() -> None:
    if not ENDOSCOPY:
        pytest.fail(
            f"sample images not found under {SAMPLES}: tests/data ships them, or set "
            "PERTURB_SAMPLES_DIR to a folder with endoscopy/*.jpg and xray/*.png"
        )


@lru_cache(maxsize=64)
def sample_tensor(path: Path) -> torch.Tensor:
    return to_tensor(read_image(path))


def downscaled(image: torch.Tensor, max_side: int, levels: int = 255) -> torch.Tensor:
    """``image`` (CHW float) shrunk with area averaging (OpenCV INTER_AREA) so that its longer
    side is at most ``max_side``, then put back on the grid of ``levels`` (8-bit by default,
    like the sample files), as a resized image saved to disk would be: ops that model bit depth
    or compression then see stored values. Smaller images come back as they are."""
    c, h, w = image.shape
    scale = max_side / max(h, w)
    if scale >= 1:
        return image
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    small = cv2.resize(image.permute(1, 2, 0).numpy(), size, interpolation=cv2.INTER_AREA)
    small = np.clip(np.round(small * levels), 0, levels) / levels
    return torch.from_numpy(small.reshape(size[1], size[0], c)).permute(2, 0, 1).float().contiguous()


def small_batch(n: int, h: int = 40, w: int = 56, channels: int = 3) -> torch.Tensor:
    """``n`` distinct small crops of the real endoscopy samples (float32 BCHW)."""
    require_samples()
    rng = np.random.default_rng(1234)
    crops = []
    for i in range(n):
        img = sample_tensor(ENDOSCOPY[i % len(ENDOSCOPY)])
        y = int(rng.integers(0, img.shape[1] - h))
        x = int(rng.integers(0, img.shape[2] - w))
        crop = img[:, y : y + h, x : x + w]
        if channels == 1:
            crop = (0.299 * crop[0:1] + 0.587 * crop[1:2] + 0.114 * crop[2:3]).clamp(0, 1)
        crops.append(crop)
    return torch.stack(crops).contiguous()


def cpuinfo_field(name: str) -> str | None:
    """The first ``name`` field of /proc/cpuinfo (None where there is none, off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.split(":", 1)[0].strip() == name), None)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` or the machine's
    architecture elsewhere): named beside golden digests and benchmark results."""
    import platform

    model = cpuinfo_field("model name")
    if model:
        return model
    return platform.processor() or platform.machine()
