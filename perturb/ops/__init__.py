"""Pure batched kernels by family.

A kernel takes ``x`` (BCHW float32 in [0, 1]), a dict of per-sample parameter tensors (shape
``(B,)`` or ``(B, k, ...)``, float32 on ``x.device``) and the samples' 64-bit keys (used only to
evaluate keyed per-pixel fields), and returns a new tensor of the same shape. Kernels hold no
randomness and never mutate their input. Importing this package registers every kernel.
"""

from perturb.ops import (  # noqa: F401  (registration)
    attenuation,
    blur,
    clinical,
    color,
    detector,
    display,
    exposure,
    geometry,
    glare,
    jpeg,
    noise,
    optics,
    overlay,
    sensor,
    sequential,
    video,
)
from perturb.ops.kernels import KernelEntry, get_kernel, kernel_names

__all__ = ["KernelEntry", "get_kernel", "kernel_names"]
