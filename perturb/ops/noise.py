"""Sensor and transmission noise. Every field is a keyed per-pixel function (perturb.rng),
drawn on the grain grid of the frame (``GRAIN_CELLS`` cells across the shorter side, see
perturb.ops.grain): the model runs on the frame brought to that grid (a nominal sensor) and its
residual reaches the frame as a band-limited field integrated over the frame's pixels, as
demosaicing and the processor's scaler spread sensor noise, at any frame size.

* gaussian: additive read noise, ``x + sigma * z`` (display domain).
* shot: photon (Poisson) noise in linear light: ``Poisson(N * lin) / N`` for a full-well of
  ``N`` photons; normal approximation above ``POISSON_EXACT_BELOW`` expected counts, exact
  inversion of the CDF below.
* speckle: multiplicative, ``x * (1 + sigma * z)``: the speckle of coherent (ultrasound) imaging,
  retired from endoscopy (catalog).
* impulse: salt-and-pepper on a fraction ``amount`` of pixels (all channels of a pixel); retired
  (catalog), kept so older records replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from perturb import rng
from perturb.ops import backend, keyed_fields
from perturb.ops._math import (
    LEVELS_U8,
    _graph,
    linear_to_srgb,
    per_sample,
    plane2d,
    shorter_side,
    srgb_to_linear,
    srgb_to_linear_u8,
    to_u8_levels,
)
from perturb.ops.grain import grain_cpu, grain_kernel
from perturb.ops.kernels import register_kernel
from perturb.ops.keyed_fields import normal_fields, uniform_fields
from perturb.ops.radiometry import (
    ALL_DTYPES,
    MU,
    REFERENCE_SIDE,
    _store,
    curve_to_display,
    curve_to_log,
    pixel_quanta,
)

POISSON_EXACT_BELOW = 16.0
POISSON_MAX_COUNT = 48


def _normal(x: torch.Tensor, keys: Sequence[int], stream: str) -> torch.Tensor:
    """Each sample's keyed standard-normal field of its (C, H, W) shape, the batch in one pass."""
    return keyed_fields.normal_fields(keys, stream, tuple(x.shape[1:]), x.device)


def _uniform(
    x: torch.Tensor, keys: Sequence[int], stream: str, shape: tuple[int, ...]
) -> torch.Tensor:
    """Each sample's keyed uniform field of ``shape``, the batch in one pass."""
    return keyed_fields.uniform_fields(keys, stream, shape, x.device)


def gaussian_noise(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Kornia: own kernel: Kornia's noise augmentations draw from torch's global generator, this
    op's normal field is keyed (``perturb.rng``) so records replay bit for bit; the rest is one
    multiply-add."""
    z = _normal(x, keys, "gaussian_noise")
    sigma = per_sample(p["sigma"])
    if z.dtype == x.dtype == torch.result_type(z, sigma) and not _graph(x):
        return z.mul_(sigma).add_(x).clamp_(0.0, 1.0)  # the fresh field scaled, shifted in place
    return (x + sigma * z).clamp_(0.0, 1.0)


def speckle_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: own kernel: Kornia's noise augmentations draw from torch's global generator, this
    op's normal field is keyed (``perturb.rng``) so records replay bit for bit; the rest is one
    multiply-add."""
    z = _normal(x, keys, "speckle_noise")
    return (x + x * per_sample(p["sigma"]) * z).clamp_(0.0, 1.0)


def poisson_counts(
    mean: torch.Tensor, z: torch.Tensor, u: torch.Tensor, compact: bool | None = None
) -> torch.Tensor:
    """Poisson draws with the given means from a standard-normal field ``z`` (normal
    approximation, continuity-corrected) and a uniform field ``u`` (exact CDF inversion where
    the mean is below ``POISSON_EXACT_BELOW``).

    ``compact`` (default: on a CPU device) runs the inversion on the small means gathered
    first; else on every element, the others' means replaced by 0 and their counts discarded:
    no data-dependent shape, so no device read (CUDA). Each element's float64 recurrence is the
    same either way, so are the counts."""
    if _graph(mean) or torch.result_type(mean, z) != mean.dtype:
        approx = torch.floor(mean + mean.clamp_min(0).sqrt() * z + 0.5).clamp_min(0)
    else:  # the same operations in place: one batch-sized block instead of seven
        approx = mean.clamp_min(0).sqrt_().mul_(z).add_(mean).add_(0.5).floor_().clamp_min_(0)
    small = mean < POISSON_EXACT_BELOW
    if compact is None:
        compact = mean.device.type == "cpu"
    if compact:
        counts = _inversion_counts_shrinking(
            mean[small].double(), u.expand_as(mean)[small].double()
        )
        out = approx if not _graph(mean) else approx.clone()  # approx: a fresh block
        out[small] = counts.to(out.dtype)
        return out
    lam = torch.where(small, mean, torch.zeros_like(mean)).double()
    count = _inversion_counts(lam, u.double().expand_as(lam))
    return torch.where(small, count.to(approx.dtype), approx)


def _inversion_counts(lam: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """#{k < POISSON_MAX_COUNT : u > C_k(lam)} elementwise, float64, with the CDF recurrence
    C_0 = exp(-lam), C_k = C_{k-1} + term_{k-1} lam / k."""
    term = torch.exp(-lam)
    cdf = term.clone()
    count = torch.zeros_like(lam)
    for k in range(1, POISSON_MAX_COUNT + 1):
        count.add_(torch.gt(u, cdf))
        term.mul_(lam).div_(k)
        cdf.add_(term)
    return count


SHRINK_EVERY = 8  # iterations between drops of settled elements (``_inversion_counts_shrinking``)


def _inversion_counts_shrinking(lam: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``_inversion_counts`` of 1-D ``lam`` and ``u`` (the compact path), every
    ``SHRINK_EVERY`` iterations keeping only the elements still above their CDF: the CDF never
    decreases (its terms are >= 0), so a settled element adds nothing more. Each element's
    float64 recurrence is unchanged, so are the counts; most means settle long before
    ``POISSON_MAX_COUNT`` (a count rarely passes mean + 5 sqrt(mean)). One data-dependent shape
    per drop: CPU only."""
    term = torch.exp(-lam)
    cdf = term.clone()
    count = torch.zeros_like(lam)
    out = torch.empty_like(lam)
    where = torch.arange(lam.numel(), device=lam.device)
    for k in range(1, POISSON_MAX_COUNT + 1):
        count.add_(torch.gt(u, cdf))
        term.mul_(lam).div_(k)
        cdf.add_(term)
        if k % SHRINK_EVERY == 0 and k < POISSON_MAX_COUNT:
            live = torch.gt(u, cdf)
            settled = ~live
            out[where[settled]] = count[settled]
            keep = live.nonzero().squeeze(1)
            where, lam, u, term, cdf, count = (
                t.index_select(0, keep) for t in (where, lam, u, term, cdf, count)
            )
    out[where] = count
    return out


def shot_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: own kernel: Kornia has no Poisson (photon) noise in linear light, and its random ops
    are not keyed; the sRGB decode/encode is ``perturb.ops._math`` (Kornia on CUDA)."""
    photons = per_sample(p["photons"])
    linear = srgb_to_linear(x)
    in_place = not _graph(x) and torch.result_type(linear, photons) == linear.dtype
    mean = linear.mul_(photons) if in_place else linear * photons
    z = _normal(x, keys, "shot_noise/normal")
    u = _uniform(x, keys, "shot_noise/uniform", tuple(x.shape[1:]))
    counts = poisson_counts(mean, z, u)
    return linear_to_srgb(counts.div_(photons) if in_place else counts / photons)


def impulse_noise(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: own kernel: Kornia's ``RandomSaltAndPepperNoise`` draws from torch's global
    generator; this op's uniform field is keyed (``perturb.rng``) so records replay bit for bit."""
    h, w = x.shape[-2:]
    u = _uniform(x, keys, "impulse_noise", (1, h, w))
    half = per_sample(p["amount"]) / 2
    out = torch.where(u < half, torch.zeros_like(x), x)
    return torch.where(u > 1 - half, torch.ones_like(x), out)


# ---------------------------------------------------------------------------------------------
# CPU fast paths (one sample, NumPy/OpenCV; fields from the same keyed hash as the kernels).
# float32 samples give the kernels' values bit for bit where the kernel's arithmetic is
# float32; uint8 samples are computed in level units and rounded once (within one level of
# the torch path, which rounds the float result).


def _scaled_normal_lut(scale: np.float32) -> np.ndarray:
    return rng.normal_lut_numpy() * np.float32(scale)


def gaussian_noise_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    sigma = np.float32(p["sigma"])
    if src.dtype == np.uint8:
        noise = rng.normal_numpy(
            key, "gaussian_noise", src.size, _scaled_normal_lut(sigma * np.float32(255.0))
        )
        cv2.add(plane2d(src), noise.reshape(-1, src.shape[-1]), dst=plane2d(dst), dtype=cv2.CV_8U)
        return
    noise = rng.normal_numpy(
        key, "gaussian_noise", src.size, _scaled_normal_lut(sigma)
    )  # sigma * z
    np.add(src, noise.reshape(src.shape), out=dst)
    np.clip(dst, np.float32(0.0), np.float32(1.0), out=dst)


def speckle_noise_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    sigma = np.float32(p["sigma"])
    if src.dtype == np.uint8:
        noise = rng.normal_numpy(key, "speckle_noise", src.size, _scaled_normal_lut(sigma))
        grain = cv2.multiply(plane2d(src), noise.reshape(-1, src.shape[-1]), dtype=cv2.CV_32F)
        cv2.add(plane2d(src), grain, dst=plane2d(dst), dtype=cv2.CV_8U)
        return
    z = rng.normal_numpy(key, "speckle_noise", src.size).reshape(src.shape)
    np.multiply(src, sigma, out=dst)  # the kernel's order: x + (x * sigma) * z
    dst *= z
    dst += src
    np.clip(dst, np.float32(0.0), np.float32(1.0), out=dst)


def _impulse_masks(
    h: int, w: int, p: dict[str, np.ndarray], key: int
) -> tuple[np.ndarray, np.ndarray]:
    """(pepper, salt) boolean (h, w) masks of the kernel's uniform field."""
    u = rng.uniform_numpy(key, "impulse_noise", h * w).reshape(h, w)
    half = np.float32(p["amount"]) / np.float32(2.0)
    return u < half, u > np.float32(1.0) - half


def impulse_noise_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    pepper, salt = _impulse_masks(src.shape[-2], src.shape[-1], p, key)
    if src.dtype == np.float32:  # x * keep + salt: x, 0 or 1 exactly
        keep = np.logical_not(pepper | salt).astype(np.float32)
        white = salt.astype(np.float32)
        np.multiply(src, keep, out=dst)
        dst += white
        return
    np.copyto(dst, src)
    np.copyto(dst, src.dtype.type(0), where=pepper)
    np.copyto(dst, np.uint8(255), where=salt)


def poisson_small(lam: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Exact CDF inversion, as ``poisson_counts`` does it (float64, same recurrence), but each
    element leaves the loop as soon as its count is known: the work is the sum of the counts
    instead of ``POISSON_MAX_COUNT`` passes over every element."""
    count = np.zeros(lam.shape[0], dtype=np.float32)
    idx = np.arange(lam.shape[0])
    term = np.exp(-lam)
    cdf = term.copy()
    for k in range(1, POISSON_MAX_COUNT + 1):
        below = u > cdf
        if not below.all():
            idx, u, lam, term, cdf = idx[below], u[below], lam[below], term[below], cdf[below]
        if idx.shape[0] == 0:
            break
        count[idx] += 1
        term = term * lam / k
        cdf = cdf + term
    return count


# The uniform field is u(m) = float32(m * 2^-24 + 2^-25) for m = hash >> 8 (perturb.rng), a
# nondecreasing function of the 24-bit integer m. "u > C" is therefore "m >= t(C)" with the
# integer threshold t(C) = #{m : u(m) <= C}; for one mean (one uint8 level) the exact
# inversion count is #{j < POISSON_MAX_COUNT : m >= t(C_j)}, a step function of m.
_M_BITS = 24
_BUCKET_SHIFT = 14  # buckets of 2^14 consecutive m (1024 per level)


def _u_of_m(m: np.ndarray) -> np.ndarray:
    """u(m) exactly as perturb.rng computes it, as float64."""
    u = m.astype(np.float32) * np.float32(2.0**-24)
    u += np.float32(2.0**-25)
    return u.astype(np.float64)


def _m_thresholds(cdf: np.ndarray) -> np.ndarray:
    """t(C) = #{m in [0, 2^24) : u(m) <= C} for float64 C (any shape), as int64."""
    base = np.clip(np.floor(cdf * 2.0**_M_BITS).astype(np.int64) - 2, 0, (1 << _M_BITS) - 1)
    t = base.copy()
    for i in range(5):  # u(m) is within one step of (m + 0.5) / 2^24: five candidates suffice
        cand = base + i
        ok = (cand < (1 << _M_BITS)) & (_u_of_m(np.minimum(cand, (1 << _M_BITS) - 1)) <= cdf)
        t += ok
    return t


def level_cdfs(lam: np.ndarray) -> np.ndarray:
    """The kernel's CDF values C_0..C_47 (float64 recurrence) for each mean in ``lam``."""
    out = np.empty((lam.shape[0], POISSON_MAX_COUNT), dtype=np.float64)
    term = torch.exp(-torch.from_numpy(lam)).numpy()
    cdf = term.copy()
    for k in range(1, POISSON_MAX_COUNT + 1):
        out[:, k - 1] = cdf
        term = term * lam / k
        cdf = cdf + term
    return out


def poisson_small_by_level(mean_lut: np.ndarray, levels: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Exact inversion counts (float32) for pixels of integer ``levels`` whose means
    ``mean_lut[levels]`` are all below POISSON_EXACT_BELOW, from their float64 uniforms ``u``.

    The kernel's count is #{j < POISSON_MAX_COUNT : u > C_j} with the float64 CDF recurrence
    C_j of the pixel's mean; C is nondecreasing, so the count is the number of C_j below u,
    found by a branch-free binary search in the level's row of CDFs (computed once per level
    present, by ``level_cdfs``) instead of a walk of up to POISSON_MAX_COUNT steps per pixel."""
    used = np.flatnonzero(np.bincount(levels, minlength=mean_lut.size))
    row = np.zeros(mean_lut.size, dtype=np.intp)
    row[used] = np.arange(used.size)
    flat = level_cdfs(mean_lut[used].astype(np.float64)).reshape(-1)
    start = np.take(row * POISSON_MAX_COUNT - 1, levels)  # flat index of C_{c-1} is start + c
    count = np.zeros(levels.size, dtype=np.intp)
    for shift in reversed(range(POISSON_MAX_COUNT.bit_length())):  # steps 32, 16, ..., 1
        cand = np.minimum(count + (1 << shift), POISSON_MAX_COUNT)
        below = np.take(flat, start + cand) < u  # C_{cand - 1} < u: cand values lie below u
        count = np.where(below, cand, count)
    return count.astype(np.float32)


def _poisson_small_levels(mean_lut: np.ndarray, levels: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Exact inversion counts (float32) for pixels of uint8 ``levels`` whose means
    ``mean_lut[levels]`` are below POISSON_EXACT_BELOW, from their 24-bit uniforms ``m``.

    Per level: integer thresholds of its CDF and, per bucket of 2^14 values of m, the count at
    both ends of the bucket; where they agree (almost everywhere) that is the count, elsewhere
    a binary search in the level's thresholds."""
    small_levels = np.flatnonzero(mean_lut < np.float32(POISSON_EXACT_BELOW))
    row = np.full(256, -1, dtype=np.int64)
    row[small_levels] = np.arange(small_levels.size)
    thresholds = _m_thresholds(level_cdfs(mean_lut[small_levels].astype(np.float64)))  # (L, 48)
    buckets = 1 << (_M_BITS - _BUCKET_SHIFT)
    starts = np.arange(buckets, dtype=np.int64) << _BUCKET_SHIFT
    ends = starts + (1 << _BUCKET_SHIFT) - 1
    lo = np.empty((small_levels.size, buckets), dtype=np.int16)
    hi = np.empty_like(lo)
    for r in range(small_levels.size):
        lo[r] = np.searchsorted(thresholds[r], starts, side="right")
        hi[r] = np.searchsorted(thresholds[r], ends, side="right")
    cell = (m >> np.uint32(_BUCKET_SHIFT)).view(np.int32)
    cell += np.take((row * buckets).astype(np.int32), levels)
    count = np.take(lo.reshape(-1), cell)
    unsure = np.flatnonzero(count != np.take(hi.reshape(-1), cell))
    if unsure.size:
        # one sorted key space: level row r owns [r * 2^25, r * 2^25 + 2^24]
        offsets = np.arange(small_levels.size, dtype=np.int64)[:, None] << (_M_BITS + 1)
        keys = row[levels[unsure]] * (1 << (_M_BITS + 1)) + m[unsure].astype(np.int64)
        flat = (thresholds + offsets).reshape(-1)
        found = np.searchsorted(flat, keys, side="right")
        count[unsure] = found - row[levels[unsure]] * POISSON_MAX_COUNT
    return count.astype(np.float32)


def _shot_counts(
    mean: np.ndarray,
    root: np.ndarray,
    key: int,
    levels: np.ndarray | None,
    mean_lut: np.ndarray | None,
) -> np.ndarray:
    """Poisson counts (float32, flat) for float32 means ``mean`` with ``root = sqrt(mean)``: the
    kernel's normal approximation and, below ``POISSON_EXACT_BELOW``, its exact inversion
    (through per-level tables when the pixels are uint8 ``levels`` with means ``mean_lut``)."""
    n = mean.size
    z = rng.normal_numpy(key, "shot_noise/normal", n)
    counts = root.reshape(-1) * z  # floor(mean + sqrt(mean) * z + 0.5), float32 like the kernel
    counts += mean.reshape(-1)
    counts += np.float32(0.5)
    np.floor(counts, out=counts)
    np.maximum(counts, np.float32(0.0), out=counts)
    small = np.flatnonzero(mean.reshape(-1) < np.float32(POISSON_EXACT_BELOW))
    if small.size == 0:
        return counts
    bits = rng.hash_numpy(key, "shot_noise/uniform", n)
    if levels is not None and mean_lut is not None:
        m = bits[small] >> np.uint32(8)
        counts[small] = _poisson_small_levels(mean_lut, levels.reshape(-1)[small], m)
    else:
        u = _u_of_m(bits[small] >> np.uint32(8))
        counts[small] = poisson_small(mean.reshape(-1)[small].astype(np.float64), u)
    return counts


def _encode_counts(photons: np.float32, top: int) -> torch.Tensor:
    """``linear_to_srgb(k / photons)`` for k = 0..top as the kernel computes it (float32)."""
    k = torch.arange(top + 1, dtype=torch.float32)
    return linear_to_srgb(k / torch.tensor(photons, dtype=torch.float32))


def _torch_sqrt(values: np.ndarray) -> np.ndarray:
    """``sqrt(max(v, 0))`` in float32 as torch computes it on the CPU. torch's float32 sqrt is
    not always the correctly rounded one NumPy gives (an ulp off for about 1 value in 6), and
    ``floor(mean + sqrt(mean) z + 0.5)`` can land on the other integer by an ulp, so the
    count must take torch's own root to match the torch path."""
    return torch.from_numpy(np.maximum(values, np.float32(0.0))).sqrt().numpy()


def _as_levels(src: np.ndarray) -> np.ndarray | None:
    """The uint8 levels of a float32 sample that holds only values v / 255 (a decoded 8-bit
    image), else None. Such a sample goes through the exact per-level tables."""
    levels = cv2.convertScaleAbs(plane2d(src), alpha=255.0).reshape(src.shape)
    if not np.array_equal(LEVELS_U8[levels], src):
        return None
    return levels


def shot_noise_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    photons = np.float32(p["photons"])
    levels = src if src.dtype == np.uint8 else _as_levels(src)
    mean_lut = None
    if levels is not None:
        mean_lut = srgb_to_linear_u8() * photons  # the kernel's float32 mean of each level
        mean = cv2.LUT(plane2d(levels), mean_lut)
        root = cv2.LUT(plane2d(levels), _torch_sqrt(mean_lut))
    else:  # srgb_to_linear in float64, rounded to float32, exactly as the kernel computes it
        w = src.astype(np.float64)
        high = np.power((np.maximum(w, 0.04045) + 0.055) / 1.055, 2.4)
        mean = np.multiply(np.where(w <= 0.04045, w / 12.92, high).astype(np.float32), photons)
        root = _torch_sqrt(mean)
    counts = _shot_counts(mean, root, key, levels, mean_lut)
    # counts never exceed this: z is capped near 4.4 and the exact inversion at POISSON_MAX_COUNT
    top = max(int(photons + 4.5 * np.sqrt(photons) + 2), POISSON_MAX_COUNT)
    np.minimum(counts, np.float32(top), out=counts)
    idx = counts.astype(np.intp)
    if src.dtype == np.uint8:
        np.take(to_u8_levels(_encode_counts(photons, top)), idx, out=dst.reshape(-1))
    else:
        np.take(_encode_counts(photons, top).numpy(), idx, out=dst.reshape(-1))


# Registration: each model runs on the grain grid of the frame (perturb.ops.grain), so its grain
# is a fixed fraction of the shorter side at any frame size.
for _name, _kernel, _cpu in (
    ("gaussian_noise", gaussian_noise, grain_cpu(gaussian_noise_cpu)),
    ("speckle_noise", speckle_noise, grain_cpu(speckle_noise_cpu)),
    ("shot_noise", shot_noise, grain_cpu(shot_noise_cpu)),
    ("impulse_noise", impulse_noise, grain_cpu(impulse_noise_cpu)),
):
    register_kernel(_name)(grain_kernel(_kernel))
    backend.register_cpu(_name)(_cpu)


# ---------------------------------------------------------------------------------------------
# Chest X-ray quantum noise (display model: perturb.ops.radiometry). ``Poisson(Q I) + sigma_e z``
# quanta, divided by ``Q = f N0 (1024/side)^2``: dose fraction ``f`` of a full-dose ``N0`` quanta
# per pixel of a 1024 px film (scaled by the pixel area), plus electronic (read) noise
# ``sigma_e``; the signal is floored at half a quantum and shown through the film-like
# presentation curve, so noise beyond the clean film's range compresses into the last gray
# levels instead of clipping to white "snow". The host path draws perturb.rng's NumPy twins of
# the torch path's fields.
# ---------------------------------------------------------------------------------------------


SIGNAL_FLOOR = 0.5  # quanta: the offset-corrected detector signal is clamped here before the log


@register_kernel("xray_quantum_noise")
def xray_quantum_noise(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Reduced-dose acquisition: ``(Poisson(Q I) + sigma_e z) / Q`` in linear fluence with
    ``Q = pixel_quanta(f, side)``: ``dose`` is the fraction ``f`` of the full dose of
    ``N0 = FULL_DOSE_QUANTA`` quanta per reference pixel; ``electronic`` the read-noise std in
    quanta. The variance in ``I`` is ``I / Q`` plus ``(sigma_e / Q)^2``. The detector is linear
    (counts) and the presentation log is re-applied to the noisy counts; the doses of the table
    stay where a real AEC-limited low-dose chest film goes (down to about 1/16 of the dose), so the
    mottle never turns the dense mediastinum into white snow.

    Kornia: own kernel: Kornia has no Poisson-plus-electronic detector noise, and its random ops are
    not keyed (``perturb.rng`` fields replay bit for bit)."""
    shape = tuple(x.shape[1:])
    z = normal_fields(keys, "xray_quantum/normal", shape, x.device)  # each: the whole batch at once
    u = uniform_fields(keys, "xray_quantum/uniform", shape, x.device)
    ze = normal_fields(keys, "xray_quantum/electronic", shape, x.device)
    quanta = pixel_quanta(per_sample(p["dose"]).double(), shorter_side(x))
    mean = (detector_signal(x) * quanta).float()
    read = per_sample(p["electronic"]).double() * (REFERENCE_SIDE / shorter_side(x))
    counts = poisson_counts(mean, z, u).double() + read * ze.double()
    return presented(counts.clamp_(min=SIGNAL_FLOOR) / quanta, x)


def detector_signal(v: torch.Tensor) -> torch.Tensor:
    """Display value -> linear detector signal (float64) through the presentation curve."""
    return torch.exp(curve_to_log(v) * -MU)


def presented(i: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Linear detector signal (float64) -> display value through the presentation curve."""
    u = torch.log(i.clamp_min(1e-300)) / -MU
    return curve_to_display(u).clamp_(0.0, 1.0).to(like.dtype)


@backend.register_cpu("xray_quantum_noise", dtypes=ALL_DTYPES)
def xray_quantum_noise_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    """The kernel per sample on the host with the same fields (perturb.rng's NumPy twins) and
    operations in the same order; the mean ``Q I`` and its root are per-level tables for
    integer samples (the kernel's own torch expressions, evaluated on every level)."""
    n = src.size
    quanta = float(
        pixel_quanta(
            torch.tensor(float(np.float32(p["dose"])), dtype=torch.float64), shorter_side(src)
        )
    )
    flat = src.reshape(-1)
    if src.dtype == np.float32:
        mean_t = (detector_signal(torch.from_numpy(flat)) * quanta).float()
        mean, root = mean_t.numpy(), mean_t.clamp_min(0).sqrt().numpy()
    else:
        lut_t = (
            detector_signal(torch.from_numpy(backend.levels(src.dtype).copy())) * quanta
        ).float()
        mean = np.take(lut_t.numpy(), flat)
        root = np.take(lut_t.clamp_min(0).sqrt().numpy(), flat)
    counts = root * rng.normal_numpy(key, "xray_quantum/normal", n)  # floor(mean + root z + 0.5)
    counts += mean
    counts += np.float32(0.5)
    np.floor(counts, out=counts)
    np.maximum(counts, np.float32(0.0), out=counts)
    small = np.flatnonzero(mean < np.float32(POISSON_EXACT_BELOW))
    if small.size:
        u = rng.uniform_numpy_at(key, "xray_quantum/uniform", small).astype(np.float64)
        if src.dtype == np.float32:
            counts[small] = poisson_small(mean[small].astype(np.float64), u)
        else:
            counts[small] = poisson_small_by_level(lut_t.numpy(), flat[small], u)
    total = counts.astype(np.float64)
    read = float(np.float32(p["electronic"])) * (REFERENCE_SIDE / shorter_side(src))
    total += read * rng.normal_numpy(key, "xray_quantum/electronic", n).astype(np.float64)
    np.maximum(total, SIGNAL_FLOOR, out=total)
    total /= quanta
    out = presented(torch.from_numpy(total), torch.empty(0)).numpy()
    _store(out.reshape(src.shape), dst)
