"""Test helpers: the real samples beside the repo (../shared/samples), devices, small batches."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from perturb.io.images import read_image, to_tensor

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
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
        pytest.fail(f"sample images not found under {SAMPLES}: the repo expects ../shared/samples beside it")


@lru_cache(maxsize=64)
def sample_tensor(path: Path) -> torch.Tensor:
    return to_tensor(read_image(path))


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
