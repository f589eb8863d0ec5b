"""Blur: gaussian (separable), defocus (anti-aliased disk PSF) and motion (line PSF at an angle).

Sizes are fractions of the image's shorter side, so a severity means the same at any
resolution. Borders are reflected (OpenCV BORDER_REFLECT_101 == torch ``reflect``). The
OpenCV path (CPU) and the torch path (CUDA) use the same PSF taps.

PSF models: defocus of a thin lens is a uniform disk (circle of confusion); linear camera motion
during the exposure is a uniform line segment (e.g. Gonzalez & Woods, Digital Image Processing,
ch. 5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import shorter_side
from perturb.ops.registry import Level, Params, draw, register_kernel


def gaussian_taps(sigma_px: float) -> np.ndarray:
    """Normalised 1-D gaussian taps with radius ceil(3 sigma)."""
    radius = max(1, math.ceil(3.0 * sigma_px))
    t = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.exp(-0.5 * (t / max(sigma_px, 1e-6)) ** 2)
    return (taps / taps.sum()).astype(np.float32)


def disk_psf(radius_px: float) -> np.ndarray:
    """Anti-aliased uniform disk: coverage of each pixel by a disk of the given radius."""
    r = max(radius_px, 0.5)
    half = math.ceil(r)
    y, x = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float64)
    weight = np.clip(r + 0.5 - np.hypot(x, y), 0.0, 1.0)
    return (weight / weight.sum()).astype(np.float32)


def line_psf(length_px: float, angle_deg: float) -> np.ndarray:
    """Anti-aliased line segment of the given length and angle (bilinear splatting of points
    spaced a quarter pixel apart along the segment)."""
    length = max(length_px, 1.0)
    half = math.ceil(length / 2.0) + 1
    size = 2 * half + 1
    psf = np.zeros((size, size), dtype=np.float64)
    n = max(2, math.ceil(length * 4.0) + 1)
    t = np.linspace(-length / 2.0, length / 2.0, n)
    theta = math.radians(angle_deg)
    px = half + t * math.cos(theta)
    py = half - t * math.sin(theta)
    x0, y0 = np.floor(px).astype(int), np.floor(py).astype(int)
    fx, fy = px - x0, py - y0
    for dx, dy, w in (
        (0, 0, (1 - fx) * (1 - fy)),
        (1, 0, fx * (1 - fy)),
        (0, 1, (1 - fx) * fy),
        (1, 1, fx * fy),
    ):
        np.add.at(psf, (y0 + dy, x0 + dx), w)
    return (psf / psf.sum()).astype(np.float32)


def _clamp_radius(radius: int, x: torch.Tensor) -> int:
    return max(0, min(radius, x.shape[-2] - 1, x.shape[-1] - 1))


def _crop_psf(psf: np.ndarray, sample: torch.Tensor) -> torch.Tensor:
    """The PSF as a (1, kh, kw) tensor on the sample's device, cropped to what a reflected
    border allows on a tiny image (radius < side) and renormalised."""
    kh, kw = psf.shape
    ph, pw = _clamp_radius(kh // 2, sample), _clamp_radius(kw // 2, sample)
    weight = torch.from_numpy(psf).to(sample.device)
    weight = weight[kh // 2 - ph : kh // 2 + ph + 1, kw // 2 - pw : kw // 2 + pw + 1]
    return (weight / weight.sum()).unsqueeze(0)


def _conv_torch(sample: torch.Tensor, psf: np.ndarray) -> torch.Tensor:
    """2-D correlation of one CHW sample with a (k, k) PSF, reflected borders: Kornia's
    ``filter2d`` (OpenCV's ``filter2D`` with BORDER_REFLECT_101 computes the same sums)."""
    import kornia  # lazily: only the torch path needs it

    return kornia.filters.filter2d(sample.unsqueeze(0), _crop_psf(psf, sample), border_type="reflect")[0]


def _sep_torch(sample: torch.Tensor, taps: np.ndarray) -> torch.Tensor:
    """Separable filter of one CHW sample (rows, then columns), reflected borders: Kornia's
    ``filter2d_separable`` (OpenCV's ``sepFilter2D`` computes the same sums)."""
    import kornia  # lazily: only the torch path needs it

    k = _crop_psf(taps[None, :], sample)[0]  # (1, k), cropped along its length only
    return kornia.filters.filter2d_separable(sample.unsqueeze(0), k, k, border_type="reflect")[0]


def _apply_per_sample(
    x: torch.Tensor, psfs: list[np.ndarray], separable: bool
) -> torch.Tensor:
    """Each sample with its own PSF: one call per sample, so a sample's result never depends on
    the batch (kernel sizes differ between samples). The torch path (CUDA)."""
    conv = _sep_torch if separable else _conv_torch
    return torch.stack([conv(s, p) for s, p in zip(x, psfs, strict=True)]).clamp_(0.0, 1.0)


def filter_sample(src: np.ndarray, dst: np.ndarray, psf: np.ndarray, separable: bool) -> None:
    """OpenCV path of one CHW sample (uint8 or float32), plane by plane, reflected borders.

    The filter runs in float32 (uint8 planes are read as 0..255; OpenCV's 8-bit-to-8-bit
    filters would quantise the taps to 8 or 11 fractional bits, which can move a pixel by
    more than a level) and the result is rounded (uint8) or clipped to [0, 1] (float32)."""
    border = cv2.BORDER_REFLECT_101
    for c in range(src.shape[0]):
        if separable:
            res = cv2.sepFilter2D(src[c], cv2.CV_32F, psf, psf, borderType=border)
        else:
            res = cv2.filter2D(src[c], cv2.CV_32F, psf, borderType=border)
        if dst.dtype == np.uint8:
            cv2.convertScaleAbs(res, dst[c])  # round half to even, saturate; res >= -1e-6
        else:
            np.clip(res, np.float32(0.0), np.float32(1.0), out=dst[c])


@backend.register_cpu("gaussian_blur")
def gaussian_blur_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    filter_sample(src, dst, gaussian_taps(float(p["sigma"]) * shorter_side(src)), separable=True)


@register_kernel("gaussian_blur")
def gaussian_blur(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Gaussian PSF; ``sigma`` is a fraction of the shorter side.

    Kornia: ``kornia.filters.gaussian_blur2d`` at the CPU path's window (radius ceil(3 sigma))."""
    import kornia  # lazily: only the torch path needs it

    side = shorter_side(x)
    out = []
    for sample, sigma in zip(x, p["sigma"].tolist(), strict=True):
        sigma_px = max(float(sigma) * side, 1e-6)
        # the taps of gaussian_taps (radius ceil(3 sigma), cropped on tiny images), from Kornia
        size = 2 * _clamp_radius(len(gaussian_taps(sigma_px)) // 2, sample) + 1
        blurred = kornia.filters.gaussian_blur2d(
            sample.unsqueeze(0), (size, size), (sigma_px, sigma_px), border_type="reflect"
        )
        out.append(blurred[0])
    return torch.stack(out).clamp_(0.0, 1.0)


@backend.register_cpu("defocus_blur")
def defocus_blur_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    filter_sample(src, dst, disk_psf(float(p["radius"]) * shorter_side(src)), separable=False)


@register_kernel("defocus_blur")
def defocus_blur(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Uniform disk PSF; ``radius`` is a fraction of the shorter side.

    Kornia: ``kornia.filters.filter2d`` with our own PSF (``disk_psf``): Kornia has no anti-aliased
    disk kernel."""
    side = shorter_side(x)
    psfs = [disk_psf(float(r) * side) for r in p["radius"].tolist()]
    return _apply_per_sample(x, psfs, separable=False)


def _motion_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"length": draw(rng, level["length"]), "angle": draw(rng, level["angle"])}


@backend.register_cpu("motion_blur")
def motion_blur_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    psf = line_psf(float(p["length"]) * shorter_side(src), float(p["angle"]))
    filter_sample(src, dst, psf, separable=False)


@register_kernel("motion_blur", sampler=_motion_sampler)
def motion_blur(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Line PSF of ``length`` (fraction of the shorter side) at ``angle`` degrees.

    Kornia: ``kornia.filters.filter2d`` with our own PSF (``line_psf``): Kornia's
    ``get_motion_kernel2d`` draws an odd-sized line and rotates it with a bilinear warp, so its
    length is quantised to odd pixel counts and its taps differ from a sub-pixel segment (and from
    the OpenCV path, which uses ``line_psf``) by far more than 1/255 at short lengths."""
    side = shorter_side(x)
    psfs = [
        line_psf(float(length) * side, float(angle))
        for length, angle in zip(p["length"].tolist(), p["angle"].tolist(), strict=True)
    ]
    return _apply_per_sample(x, psfs, separable=False)
