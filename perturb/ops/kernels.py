"""Kernel registry: op name -> (kernel, sampler). Metadata and severity tables live in
``perturb.catalog`` (data, no torch); ``perturb.catalog.ops`` joins the two."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from perturb.registry import Registry

Params = dict[str, Any]
Level = Mapping[str, tuple[float, float]]
# (x, params, keys), plus scenes=... and host_params=... where the entry declares them
Kernel = Callable[..., torch.Tensor]
Sampler = Callable[[np.random.Generator, Level], Params]
# (seed, variant) -> parameters shared by every sample drawn under that seed and variant
DeviceParams = Callable[[int, int], Params]
# (one sample's recorded parameters, width, height) -> 3x3 forward map (input -> output)
MatrixFn = Callable[[Mapping[str, Any], int, int], np.ndarray]
# (one sample's recorded parameters, (N, 2) points, width, height) -> moved (N, 2) points
PointsFn = Callable[[Mapping[str, Any], np.ndarray, int, int], np.ndarray]
# (label maps (B, C, H, W), collated parameters the image kernel got) -> moved label maps
LabelMapFn = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
# (the batch an op runs on) -> name of the codec that runs there (recorded as the backend)
CodecFn = Callable[[torch.Tensor], str]
# (the batch (B, C, H, W), collated parameters) -> (B, 1, H, W) share of the beam stopped
Shadow = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Geometry:
    """How a geometric op moves coordinates, so that boxes, ``<loc>`` tags and masks follow
    the pixels. Coordinates are continuous pixel coordinates (pixel ``(i, j)`` covers
    ``[i, i+1) x [j, j+1)``) of a ``width`` x ``height`` image; parameters are one sample's
    as its record stores them (the functions round them to float32, as the kernel sees them).

    * ``matrix``: the 3x3 forward map (input -> output) of a projective op (affine or a
      homography); or
    * ``points``: moves (N, 2) points, for an op that is not projective (a box then becomes
      the bounding box of its moved outline);
    * ``label_maps``: moves label maps (segmentation masks) as the image: nearest sampling,
      0 where the image is black fill."""

    label_maps: LabelMapFn
    matrix: MatrixFn | None = None
    points: PointsFn | None = None

    def __post_init__(self) -> None:
        if (self.matrix is None) == (self.points is None):
            raise ValueError("a Geometry needs exactly one of matrix (projective ops) and points")

    @property
    def projective(self) -> bool:
        return self.matrix is not None

    def forward_points(
        self, params: Mapping[str, Any], points: np.ndarray, width: int, height: int
    ) -> np.ndarray:
        """(N, 2) continuous points moved by the op with ``params``."""
        if self.points is not None:
            return self.points(params, points, width, height)
        assert self.matrix is not None
        m = self.matrix(params, width, height)
        moved = points @ m[:2, :2].T + m[:2, 2]
        return moved / (points @ m[2, :2] + m[2, 2])[:, None]  # homographies divide; affine: / 1


def as_float32(value: Any) -> float:
    """A recorded parameter as the kernel sees it (collated to float32)."""
    return float(np.float32(value))


@dataclass(frozen=True)
class KernelEntry:
    """An op's torch kernel, keyed sampler and behaviour. ``uses_scene``: the kernel also takes
    ``scenes=`` (one ``perturb.scene.Scene`` or None per sample: the frame's field of view and
    overlays, for tissue-layer ops of endoscopy frames). ``geometry``: how the op moves
    coordinates (None: it leaves them where they are). ``codec``: for a codec op, the name of
    the codec that runs on a batch (its records name it as their backend). ``host_params``: the
    kernel also takes ``host_params=`` (each sample's parameter dict as recorded, on the host),
    for a kernel that needs Python values (e.g. to rasterise with OpenCV) without reading the
    (B, ...) tensors back from the device. ``device_params``: parameters keyed by (seed,
    variant) instead of the sample, added to every record (a fixed property of the imaging
    device that all frames of a run share, e.g. a sensor's defect map); the declared exception
    to per-sample keying, recorded like any parameter so replay needs nothing else. ``shadow``:
    for an op that leaves part of the detector unexposed (collimation), ``shadow(x, params)``
    gives (B, 1, H, W) float32 in [0, 1] on ``x``'s device, the share of the beam stopped there:
    the engine's annotation composite does not paste a film's lead marker (a physical object on
    the detector, ``perturb.scene.radiograph.LEAD_TYPES``) back where the beam was stopped."""

    name: str
    kernel: Kernel
    sampler: Sampler
    uses_scene: bool = False
    geometry: Geometry | None = None
    codec: CodecFn | None = None
    host_params: bool = False
    device_params: DeviceParams | None = None
    shadow: Shadow | None = None


KERNELS: Registry[KernelEntry] = Registry("kernel")
# transforms that records of other tools may name (e.g. a torchvision flip), not catalog ops:
# annotations follow them too
FOREIGN_GEOMETRY: Registry[Geometry] = Registry("foreign geometry")


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
    name: str,
    sampler: Sampler = uniform_sampler,
    *,
    uses_scene: bool = False,
    geometry: Geometry | None = None,
    codec: CodecFn | None = None,
    host_params: bool = False,
    device_params: DeviceParams | None = None,
    shadow: Shadow | None = None,
) -> Callable[[Kernel], Kernel]:
    """Register ``kernel(x, params, keys)`` (with ``uses_scene``: ``kernel(x, params, keys,
    scenes=...)``; with ``host_params``: also ``host_params=...``), its sampler and its
    behaviour (``geometry``, ``codec``, ``device_params``, ``shadow``: see ``KernelEntry``)
    under ``name``."""

    def decorator(kernel: Kernel) -> Kernel:
        if name in FOREIGN_GEOMETRY:
            raise ValueError(f"kernel {name!r} is registered as a foreign geometry")
        KERNELS.add(
            name,
            KernelEntry(
                name, kernel, sampler, uses_scene, geometry, codec, host_params, device_params, shadow
            ),
        )
        return kernel

    return decorator


def register_foreign_geometry(geometry: Geometry, *names: str) -> None:
    """``geometry`` for records that name a transform of another tool (not a catalog op)."""
    for name in names:
        if name in KERNELS:
            raise ValueError(f"{name!r} is a kernel; its geometry goes with register_kernel")
        FOREIGN_GEOMETRY.add(name, geometry)


def foreign_geometry(name: str) -> Geometry | None:
    return FOREIGN_GEOMETRY.get(name) if name in FOREIGN_GEOMETRY else None


def get_kernel(name: str) -> KernelEntry:
    return KERNELS.get(name)


def kernel_names() -> list[str]:
    return sorted(KERNELS)
