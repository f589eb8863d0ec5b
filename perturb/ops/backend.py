"""Per-device dispatch: OpenCV/NumPy kernels on CPU, torch kernels on CUDA.

Both paths of an op agree within 1/255. ``use_backend("torch")`` forces the torch path on CPU
too (tests use it to check the CUDA code path against the OpenCV one without a GPU).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Literal

import torch

Backend = Literal["auto", "opencv", "torch"]
_BACKEND: contextvars.ContextVar[Backend] = contextvars.ContextVar("perturb_backend", default="auto")


@contextlib.contextmanager
def use_backend(backend: Backend) -> Iterator[None]:
    if backend not in ("auto", "opencv", "torch"):
        raise ValueError(f"backend must be 'auto', 'opencv' or 'torch', not {backend!r}")
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def resolve(device: torch.device) -> Literal["opencv", "torch"]:
    """The backend that runs on ``device`` under the current setting."""
    choice = _BACKEND.get()
    if device.type != "cpu":
        return "torch"
    return "torch" if choice == "torch" else "opencv"


def opencv_path(x: torch.Tensor) -> bool:
    return resolve(x.device) == "opencv"


def to_hwc(x: torch.Tensor) -> list:
    """Per-sample contiguous HWC (or HW for one channel) float32 NumPy views of a CPU batch."""
    arr = x.detach().permute(0, 2, 3, 1).contiguous().numpy()
    return [a[..., 0] if a.shape[-1] == 1 else a for a in arr]


def from_hwc(images: list, like: torch.Tensor) -> torch.Tensor:
    import numpy as np

    stacked = np.stack([a if a.ndim == 3 else a[..., None] for a in images])
    return torch.from_numpy(stacked).permute(0, 3, 1, 2).contiguous().to(like.dtype)
