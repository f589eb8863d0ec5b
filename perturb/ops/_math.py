"""Numerics shared by kernels, written so a sample's result never depends on the batch.

PyTorch's CPU kernels finish each thread's chunk with a scalar tail whose transcendental
functions can differ from the vectorised ones by an ulp; chunk borders move with batch size and
thread count. On CPU these helpers therefore evaluate transcendental functions and reductions in
float64 and round to float32, which makes the float32 result independent of the chunking.
"""

from __future__ import annotations

import torch


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.device.type == "cpu" else x


def power(x: torch.Tensor, exponent: torch.Tensor | float) -> torch.Tensor:
    """``x ** exponent`` for x >= 0."""
    e = exponent.to(_wide(x).dtype) if isinstance(exponent, torch.Tensor) else exponent
    return torch.pow(_wide(x), e).to(x.dtype)


def srgb_to_linear(x: torch.Tensor) -> torch.Tensor:
    """IEC 61966-2-1 sRGB decoding of values in [0, 1]."""
    w = _wide(x)
    low = w / 12.92
    high = torch.pow((w.clamp_min(0.04045) + 0.055) / 1.055, 2.4)
    return torch.where(w <= 0.04045, low, high).to(x.dtype)


def linear_to_srgb(x: torch.Tensor) -> torch.Tensor:
    """IEC 61966-2-1 sRGB encoding of linear values (clipped to [0, 1])."""
    w = _wide(x).clamp(0.0, 1.0)
    low = w * 12.92
    high = 1.055 * torch.pow(w.clamp_min(0.0031308), 1.0 / 2.4) - 0.055
    return torch.where(w <= 0.0031308, low, high).to(x.dtype)


def sample_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample mean over (C, H, W) as (B, 1, 1, 1); with ``mask`` (B,1,H,W) only where True."""
    w = x.double()
    if mask is None:
        m = w.mean(dim=(1, 2, 3), keepdim=True)
    else:
        weight = mask.to(w.dtype).expand_as(w)
        m = (w * weight).sum(dim=(1, 2, 3), keepdim=True) / weight.sum(
            dim=(1, 2, 3), keepdim=True
        ).clamp_min(1.0)
    return m.to(x.dtype)


LUMA_REC601 = (0.299, 0.587, 0.114)


def luma(x: torch.Tensor) -> torch.Tensor:
    """Rec. 601 luma (B,1,H,W) of an RGB batch; a 1-channel batch is returned as is."""
    if x.shape[1] == 1:
        return x
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return r * LUMA_REC601[0] + g * LUMA_REC601[1] + b * LUMA_REC601[2]


def shorter_side(x: torch.Tensor) -> int:
    return int(min(x.shape[-2], x.shape[-1]))
