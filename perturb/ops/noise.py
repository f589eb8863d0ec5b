"""Sensor and transmission noise. Every field is a keyed per-pixel function (perturb.rng).

* gaussian: additive read noise, ``x + sigma * z`` (display domain).
* shot: photon (Poisson) noise in linear light: ``Poisson(N * lin) / N`` for a full-well of
  ``N`` photons; normal approximation above ``POISSON_EXACT_BELOW`` expected counts, exact
  inversion of the CDF below.
* speckle: multiplicative, ``x * (1 + sigma * z)``.
* impulse: salt-and-pepper on a fraction ``amount`` of pixels (all channels of a pixel).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from perturb import rng
from perturb.ops._math import linear_to_srgb, srgb_to_linear
from perturb.ops.registry import register_kernel

POISSON_EXACT_BELOW = 16.0
POISSON_MAX_COUNT = 48


def _per_sample_normal(x: torch.Tensor, keys: Sequence[int], stream: str) -> torch.Tensor:
    shape = tuple(x.shape[1:])
    return torch.stack([rng.normal_field(k, stream, shape, x.device) for k in keys])


def _per_sample_uniform(
    x: torch.Tensor, keys: Sequence[int], stream: str, shape: tuple[int, ...]
) -> torch.Tensor:
    return torch.stack([rng.uniform_field(k, stream, shape, x.device) for k in keys])


def _b(p: torch.Tensor) -> torch.Tensor:
    return p.view(-1, 1, 1, 1)


@register_kernel("gaussian_noise")
def gaussian_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    z = _per_sample_normal(x, keys, "gaussian_noise")
    return (x + _b(p["sigma"]) * z).clamp_(0.0, 1.0)


@register_kernel("speckle_noise")
def speckle_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    z = _per_sample_normal(x, keys, "speckle_noise")
    return (x + x * _b(p["sigma"]) * z).clamp_(0.0, 1.0)


def poisson_counts(mean: torch.Tensor, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Poisson draws with the given means from a standard-normal field ``z`` (normal
    approximation, continuity-corrected) and a uniform field ``u`` (exact CDF inversion where
    the mean is below ``POISSON_EXACT_BELOW``)."""
    approx = torch.floor(mean + mean.clamp_min(0).sqrt() * z + 0.5).clamp_min(0)
    small = mean < POISSON_EXACT_BELOW
    if not bool(small.any()):
        return approx
    lam = mean[small].double()
    uu = u[small].double()
    term = torch.exp(-lam)
    cdf = term.clone()
    count = torch.zeros_like(lam)
    for k in range(1, POISSON_MAX_COUNT + 1):
        below = uu > cdf
        count += below.to(count.dtype)
        term = term * lam / k
        cdf = cdf + term
    out = approx.clone()
    out[small] = count.to(out.dtype)
    return out


@register_kernel("shot_noise")
def shot_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    photons = _b(p["photons"])
    mean = srgb_to_linear(x) * photons
    z = _per_sample_normal(x, keys, "shot_noise/normal")
    u = _per_sample_uniform(x, keys, "shot_noise/uniform", tuple(x.shape[1:]))
    counts = poisson_counts(mean, z, u)
    return linear_to_srgb(counts / photons)


@register_kernel("impulse_noise")
def impulse_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    h, w = x.shape[-2:]
    u = _per_sample_uniform(x, keys, "impulse_noise", (1, h, w))
    half = _b(p["amount"]) / 2
    out = torch.where(u < half, torch.zeros_like(x), x)
    return torch.where(u > 1 - half, torch.ones_like(x), out)
