"""Specular glare on wet mucosa, after the dichromatic reflection model (Shafer, 1985):
``I = m_d * D + m_s * L``. The specular term has the colour of the illuminant ``L`` and is added
to the diffuse image; where it exceeds the sensor's range the pixel clips to a saturated core,
surrounded by a faint halo (lens and sensor scatter).

Highlights come in clusters of small elliptical lobes (sigma 0.5-2.5 % of the shorter side) on
tissue: cluster centres are drawn inside the central ellipse of the frame and the engine keeps
the endoscope's dark border untouched. Lobes are axis-aligned gaussians, so the specular field is
a sum of separable terms and is evaluated as one small matrix product per sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import shorter_side
from perturb.ops.registry import Level, Params, draw, draw_int, register_kernel

HALO_SCALE = 3.0
HALO_AMPLITUDE = 0.12
LOBES_PER_CLUSTER = (2, 5)
CLUSTER_SPREAD = 2.5  # lobe offsets from the cluster centre, in lobe sigmas
PLACEMENT_RADIUS = 0.36  # cluster centres within this fraction of the frame around its centre


def _glare_sampler(rng: np.random.Generator, level: Level) -> Params:
    n_clusters = draw_int(rng, level["clusters"])
    sigma = draw(rng, level["sigma"])
    peak = draw(rng, level["peak"])
    tint = rng.uniform(0.94, 1.0, size=3)
    centres: list[list[float]] = []
    sigmas: list[list[float]] = []
    amplitudes: list[float] = []
    for _ in range(n_clusters):
        radius = PLACEMENT_RADIUS * np.sqrt(rng.uniform())
        phi = rng.uniform(0.0, 2.0 * np.pi)
        cx, cy = 0.5 + radius * np.cos(phi), 0.5 + radius * np.sin(phi)
        for _ in range(draw_int(rng, LOBES_PER_CLUSTER)):
            s = sigma * rng.uniform(0.5, 1.2)
            aspect = rng.uniform(0.5, 2.0)
            sx, sy = s * np.sqrt(aspect), s / np.sqrt(aspect)
            ox, oy = rng.normal(0.0, CLUSTER_SPREAD * sigma, size=2)
            centres.append([float(cx + ox), float(cy + oy)])
            sigmas.append([float(sx), float(sy)])
            amplitudes.append(float(peak * rng.uniform(0.6, 1.0)))
    return {
        "clusters": n_clusters,
        "sigma": sigma,
        "peak": peak,
        "illuminant": [float(t / tint.max()) for t in tint],
        "centres": centres,
        "sigmas": sigmas,
        "amplitudes": amplitudes,
    }


def _profiles(
    coord: torch.Tensor, centre: torch.Tensor, sigma: torch.Tensor, size: int
) -> torch.Tensor:
    """Gaussian profiles (B, K, size) along one axis; centre in [0,1] of ``size``, sigma px."""
    d = coord.view(1, 1, -1) - centre.unsqueeze(-1) * size
    return torch.exp(-0.5 * (d / sigma.clamp_min(1e-3).unsqueeze(-1)) ** 2)


def specular_field(
    h: int, w: int, centres: torch.Tensor, sigmas: torch.Tensor, amplitudes: torch.Tensor, side: int
) -> torch.Tensor:
    """Specular intensity (B,1,H,W): lobes plus halo, as a sum of separable terms (bmm)."""
    dev, dt = centres.device, torch.float64 if centres.device.type == "cpu" else torch.float32
    centres, sigmas, amplitudes = centres.to(dt), sigmas.to(dt), amplitudes.to(dt)
    xs = torch.arange(w, device=dev, dtype=dt) + 0.5
    ys = torch.arange(h, device=dev, dtype=dt) + 0.5
    sx, sy = sigmas[..., 0] * side, sigmas[..., 1] * side
    gx = torch.cat([_profiles(xs, centres[..., 0], sx, w), _profiles(xs, centres[..., 0], sx * HALO_SCALE, w)], 1)
    gy = torch.cat([_profiles(ys, centres[..., 1], sy, h), _profiles(ys, centres[..., 1], sy * HALO_SCALE, h)], 1)
    weights = torch.cat([amplitudes, amplitudes * HALO_AMPLITUDE], 1).unsqueeze(-1)
    field = torch.bmm(gy.transpose(1, 2), gx * weights)  # (B, H, W)
    return field.unsqueeze(1).float()


@register_kernel("specular_glare", sampler=_glare_sampler)
def specular_glare(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    h, w = x.shape[-2:]
    out = []
    # One sample at a time: the lobe count differs between samples (zero-padded lists).
    for i in range(x.shape[0]):
        k = int((p["amplitudes"][i] != 0).sum())  # drop the zero padding of shorter lists
        field = specular_field(
            h,
            w,
            p["centres"][i : i + 1, :k],
            p["sigmas"][i : i + 1, :k],
            p["amplitudes"][i : i + 1, :k],
            shorter_side(x),
        )
        illuminant = p["illuminant"][i].view(1, 3, 1, 1)[:, : x.shape[1]]
        if x.shape[1] == 1:
            illuminant = illuminant.new_ones(1, 1, 1, 1)
        out.append((x[i : i + 1] + field * illuminant).clamp_(0.0, 1.0))
    return torch.cat(out)


def specular_field_np(h: int, w: int, centres: np.ndarray, sigmas: np.ndarray, amplitudes: np.ndarray, side: int) -> np.ndarray:
    """``specular_field`` of one sample on the host in NumPy (float64, one (H, 2K) x (2K, W)
    product; within float64 rounding of the torch field), as float32 (H, W). ``centres`` and
    ``sigmas`` are (K, 2), ``amplitudes`` (K,), as float32 parameters."""
    c, sg, a = centres.astype(np.float64), sigmas.astype(np.float64), amplitudes.astype(np.float64)
    sx, sy = sg[:, 0] * side, sg[:, 1] * side

    def profiles(size: int, centre: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        d = (np.arange(size, dtype=np.float64) + 0.5)[:, None] - centre[None, :] * size
        d /= np.maximum(sigma, 1e-3)[None, :]
        d *= d
        d *= -0.5
        return np.exp(d, out=d)  # (size, K)

    gx = np.concatenate([profiles(w, c[:, 0], sx), profiles(w, c[:, 0], sx * HALO_SCALE)], axis=1)
    gy = np.concatenate([profiles(h, c[:, 1], sy), profiles(h, c[:, 1], sy * HALO_SCALE)], axis=1)
    weights = np.concatenate([a, a * HALO_AMPLITUDE])
    gx *= weights[None, :]
    return (gy @ np.ascontiguousarray(gx.T)).astype(np.float32)


@backend.register_cpu("specular_glare")
def specular_glare_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """One sample on the host: the specular field, added per channel (uint8 in level units and
    rounded once; float32 as the kernel adds it)."""
    c_count, h, w = src.shape
    amplitudes = np.asarray(p["amplitudes"], dtype=np.float32)
    k = int((amplitudes != 0).sum())
    field = specular_field_np(h, w, np.asarray(p["centres"])[:k], np.asarray(p["sigmas"])[:k], amplitudes[:k], min(h, w))
    illuminant = np.asarray(p["illuminant"], dtype=np.float32)
    for c in range(c_count):
        gain = np.float32(1.0) if c_count == 1 else illuminant[c]
        if src.dtype == np.uint8:
            cv2.addWeighted(src[c], 1.0, field, float(gain) * 255.0, 0.0, dst=dst[c], dtype=cv2.CV_8U)
        else:
            np.multiply(field, gain, out=dst[c])
            dst[c] += src[c]
            np.clip(dst[c], np.float32(0.0), np.float32(1.0), out=dst[c])
