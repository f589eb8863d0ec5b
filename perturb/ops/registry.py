"""Kernel registry: op name -> (kernel, sampler). Metadata and severity tables live in
``perturb.catalog`` (data, no torch); ``perturb.catalog.registry`` joins the two."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from perturb.registry import Registry

Params = dict[str, Any]
Level = Mapping[str, tuple[float, float]]
Kernel = Callable[..., torch.Tensor]  # (x, params, keys) or (x, params, keys, scenes=...)
Sampler = Callable[[np.random.Generator, Level], Params]


@dataclass(frozen=True)
class KernelEntry:
    """An op's torch kernel and keyed sampler. ``uses_scene``: the kernel also takes
    ``scenes=`` (one ``perturb.scene.Scene`` or None per sample: the frame's field of view and
    overlays, for tissue-layer ops of endoscopy frames)."""

    name: str
    kernel: Kernel
    sampler: Sampler
    uses_scene: bool = False


KERNELS: Registry[KernelEntry] = Registry("kernel")


def draw(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    """Uniform draw in [lo, hi] as ``lo + u (hi - lo)``: one uniform ``u`` per call whatever the
    range, so the same generator gives the same quantile at every severity."""
    lo, hi = float(bounds[0]), float(bounds[1])
    return lo + float(rng.random()) * (hi - lo)


def draw_int(rng: np.random.Generator, bounds: tuple[float, float]) -> int:
    """Uniform integer in [lo, hi], by quantile like ``draw``."""
    lo, hi = int(bounds[0]), int(bounds[1])
    return min(hi, lo + int(float(rng.random()) * (hi - lo + 1)))


def draw_sign(rng: np.random.Generator) -> float:
    return 1.0 if rng.random() < 0.5 else -1.0


def uniform_sampler(rng: np.random.Generator, level: Level) -> Params:
    """Each table parameter drawn uniformly from its range, in table order."""
    return {name: draw(rng, bounds) for name, bounds in level.items()}


def register_kernel(
    name: str, sampler: Sampler = uniform_sampler, *, uses_scene: bool = False
) -> Callable[[Kernel], Kernel]:
    """Register ``kernel(x, params, keys)`` (with ``uses_scene``: ``kernel(x, params, keys,
    scenes=...)``) and its sampler under ``name``."""

    def decorator(kernel: Kernel) -> Kernel:
        KERNELS.add(name, KernelEntry(name, kernel, sampler, uses_scene))
        return kernel

    return decorator


def get_kernel(name: str) -> KernelEntry:
    return KERNELS.get(name)


def kernel_names() -> list[str]:
    return sorted(KERNELS)
