"""Numerics shared by kernels, written so a sample's result never depends on the batch.

PyTorch's CPU kernels finish each thread's chunk with a scalar tail whose transcendental
functions can differ from the vectorised ones by an ulp; chunk borders move with batch size and
thread count. On CPU these helpers therefore evaluate transcendental functions and reductions in
float64 and round to float32, which makes the float32 result independent of the chunking. The
sRGB curves also come as float32 tables (``srgb_to_linear_lut``): interpolation is made of exact
IEEE operations and lookups only, as batch-independent as float64 and several times cheaper.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache

import cv2
import numpy as np
import torch


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.device.type == "cpu" else x


def _graph(x: torch.Tensor) -> bool:
    """Whether autograd records operations on ``x`` (then no in-place or ``out=`` steps)."""
    return torch.is_grad_enabled() and x.requires_grad


def power(x: torch.Tensor, exponent: torch.Tensor | float) -> torch.Tensor:
    """``x ** exponent`` for x >= 0."""
    e = exponent.to(_wide(x).dtype) if isinstance(exponent, torch.Tensor) else exponent
    return torch.pow(_wide(x), e).to(x.dtype)


def srgb_to_linear(x: torch.Tensor) -> torch.Tensor:
    """IEC 61966-2-1 sRGB decoding of values in [0, 1].

    Kornia: ``kornia.color.rgb_to_linear_rgb`` on CUDA for 3-channel batches (the same float32
    formula); own kernel on CPU and for other channel counts, because Kornia's takes only 3
    channels and computes in float32, whose CPU result moves with thread chunking (see the
    module docstring), while the CPU paths' uint8 tables are built from this float64 result."""
    if x.device.type != "cpu" and x.dim() >= 3 and x.shape[-3] == 3:
        import kornia  # lazily: only the torch path needs it

        return kornia.color.rgb_to_linear_rgb(x)
    w = _wide(x)
    if _graph(x):
        low = w / 12.92
        high = torch.pow((w.clamp_min(0.04045) + 0.055) / 1.055, 2.4)
        return torch.where(w <= 0.04045, low, high).to(x.dtype)
    # the same operations in place: two float64 batches instead of seven
    dark = w <= 0.04045
    high = w.clamp_min(0.04045).add_(0.055).div_(1.055).pow_(2.4)
    low = w.div_(12.92) if w is not x else w / 12.92  # the float64 copy itself, where made here
    return torch.where(dark, low, high, out=high).to(x.dtype)


def linear_to_srgb(x: torch.Tensor) -> torch.Tensor:
    """IEC 61966-2-1 sRGB encoding of linear values (clipped to [0, 1]).

    Kornia: ``kornia.color.linear_rgb_to_rgb`` on CUDA for 3-channel batches (clipped first);
    own kernel on CPU and for other channel counts, for the reasons of ``srgb_to_linear``."""
    if x.device.type != "cpu" and x.dim() >= 3 and x.shape[-3] == 3:
        import kornia  # lazily: only the torch path needs it

        return kornia.color.linear_rgb_to_rgb(x.clamp(0.0, 1.0))
    w = _wide(x).clamp(0.0, 1.0)
    if _graph(x):
        low = w * 12.92
        high = 1.055 * torch.pow(w.clamp_min(0.0031308), 1.0 / 2.4) - 0.055
        return torch.where(w <= 0.0031308, low, high).to(x.dtype)
    dark = w <= 0.0031308  # the same operations in place: two float64 batches instead of six
    high = w.clamp_min(0.0031308).pow_(1.0 / 2.4).mul_(1.055).sub_(0.055)
    return torch.where(dark, w.mul_(12.92), high, out=high).to(x.dtype)


SRGB_NODES = 4096  # table nodes over [0, 1] of the float32 sRGB curves (``*_lut``)


@lru_cache(maxsize=8)
def _srgb_tables(encode: bool, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, steps), float32 (``SRGB_NODES``,) on ``device``: the float64 sRGB curve at
    nodes k / (SRGB_NODES - 1), rounded once, and each node's step to the next (0 at the last)."""
    nodes = torch.linspace(0.0, 1.0, SRGB_NODES, dtype=torch.float64)
    values = (linear_to_srgb(nodes) if encode else srgb_to_linear(nodes)).to(torch.float32)
    steps = torch.zeros_like(values)
    steps[:-1] = values[1:] - values[:-1]
    return values.to(device), steps.to(device)


def _interpolate(x: torch.Tensor, encode: bool) -> torch.Tensor:
    """The sRGB curve at ``x`` in [0, 1] (float32 CPU): linear interpolation between table
    nodes, ``value[i] + f * step[i]`` with ``i``, ``f`` the integer and fractional parts of
    ``x (n - 1)``. Each step is one IEEE float32 operation or an exact lookup (no
    transcendental function, no fused multiply-add), so a value's result never depends on
    where it sits in the batch or the thread's chunk."""
    values, steps = _srgb_tables(encode, str(x.device))
    u = x * float(SRGB_NODES - 1)
    # int32 indices and index_select: on the CPU about 10x faster than int64 and x[index]
    i = u.to(torch.int32).view(-1)  # truncation: the floor of u >= 0
    u.frac_()  # u - trunc(u), exact
    out = steps.index_select(0, i).view_as(u)
    out *= u
    out += values.index_select(0, i).view_as(u)
    return out


def srgb_to_linear_lut(x: torch.Tensor) -> torch.Tensor:
    """``srgb_to_linear`` of float32 values in [0, 1], for the torch kernels: on a CPU device
    in float32 from a 4096-node table (within 2e-7 of the float64 curve, and about 4x faster
    than it at B=32, 128x128); elsewhere (CUDA, Kornia's float32) and under autograd
    ``srgb_to_linear`` itself."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or _graph(x):
        return srgb_to_linear(x)
    return _interpolate(x, encode=False)


def linear_to_srgb_lut(x: torch.Tensor) -> torch.Tensor:
    """``linear_to_srgb`` (clipped to [0, 1]) for the torch kernels, as ``srgb_to_linear_lut``
    (within 2e-5 of the float64 curve: the table's error peaks at the curve's knee, 0.0031)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or _graph(x):
        return linear_to_srgb(x)
    return _interpolate(x.clamp(0.0, 1.0), encode=True)


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
    """Rec. 601 luma (B,1,H,W) of an RGB batch; a 1-channel batch is returned as is.

    Kornia: ``kornia.color.rgb_to_grayscale`` (the same weights, ``LUMA_REC601``)."""
    if x.shape[1] == 1:
        return x
    import kornia  # lazily: only the torch path needs it

    return kornia.color.rgb_to_grayscale(x)


def shorter_side(x: torch.Tensor | np.ndarray) -> int:
    """The shorter of the last two dimensions (height, width) of an image or batch."""
    return int(min(x.shape[-2], x.shape[-1]))


def per_sample(p: torch.Tensor) -> torch.Tensor:
    """A per-sample parameter ``(B,)`` as ``(B, 1, 1, 1)``, to broadcast over a BCHW batch."""
    return p.view(-1, 1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Host (NumPy/OpenCV) helpers for the CPU fast paths. Each works on one sample, so its result
# depends on that sample alone; float32 arithmetic here is elementwise (no reductions across
# thread chunks), so float64 is not needed for determinism.

LEVELS_U8 = np.arange(256, dtype=np.float32) / np.float32(255.0)  # what u8 / 255 gives in torch
LEVELS_U8.flags.writeable = False
LEVELS_ROW_U8 = np.arange(256, dtype=np.uint8)[None, :]  # the uint8 levels as a (1, 256) image
LEVELS_ROW_U8.flags.writeable = False


def to_u8_levels(x: torch.Tensor) -> np.ndarray:
    """A float32 result in [0, 1] rounded to uint8 the way the engine rounds (half to even)."""
    return (x * 255.0).round_().clamp_(0, 255).to(torch.uint8).numpy()


def plane2d(a: np.ndarray) -> np.ndarray:
    """A contiguous array as a 2-D (rows, W) view, the layout OpenCV takes for any CHW/HW data."""
    return a.reshape(-1, a.shape[-1])


_SCRATCH = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype: type | np.dtype) -> np.ndarray:
    """A per-thread work array (uninitialised) reused across calls of one shape: a fresh
    multi-megabyte array costs page faults that can exceed a point-wise op's arithmetic. The
    array is overwritten by the next call with the same ``name`` on the thread; never return it."""
    pool: dict[str, np.ndarray] | None = getattr(_SCRATCH, "pool", None)
    if pool is None:
        pool = _SCRATCH.pool = {}
    buf = pool.get(name)
    if buf is None or buf.shape != shape or buf.dtype != np.dtype(dtype):
        buf = pool[name] = np.empty(shape, dtype)
    return buf


def srgb_to_linear_np(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 sRGB decoding of values in [0, 1] (contiguous); within 1e-6 of
    ``srgb_to_linear``."""
    res = np.empty_like(x) if out is None else out
    t = np.add(x, np.float32(0.055))
    t *= np.float32(1.0 / 1.055)
    cv2.pow(plane2d(t), 2.4, dst=plane2d(res))
    np.multiply(x, np.float32(1.0 / 12.92), out=t)
    np.copyto(res, t, where=x <= np.float32(0.04045))
    return res


def linear_to_srgb_np(y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 sRGB encoding of linear values, clipped to [0, 1] (contiguous); within 1e-6 of
    ``linear_to_srgb``."""
    res = np.empty_like(y) if out is None else out
    w = np.clip(y, np.float32(0.0), np.float32(1.0))
    cv2.pow(plane2d(w), 1.0 / 2.4, dst=plane2d(res))
    res *= np.float32(1.055)
    res -= np.float32(0.055)
    low = w <= np.float32(0.0031308)
    w *= np.float32(12.92)
    np.copyto(res, w, where=low)
    return res


@lru_cache(maxsize=1)
def srgb_to_linear_u8() -> np.ndarray:
    """float32 linear value of each uint8 level, as the torch path computes it."""
    table = srgb_to_linear(torch.tensor(LEVELS_U8)).numpy().copy()
    table.flags.writeable = False
    return table


def lut_u8(src: np.ndarray, dst: np.ndarray, table: np.ndarray) -> None:
    """``dst = table[src]`` for uint8 arrays of one shape and a (256,) uint8 table
    (``cv2.LUT``, over the whole array where both are contiguous, else per plane)."""
    if (
        src.dtype != np.uint8
        or dst.dtype != np.uint8
        or src.shape != dst.shape
        or np.size(table) != 256
    ):
        raise ValueError(
            f"lut_u8 takes uint8 arrays of one shape and a 256-entry table, got {src.dtype} {src.shape}, "
            f"{dst.dtype} {dst.shape} and {np.size(table)} entries"
        )
    if src.flags.c_contiguous and dst.flags.c_contiguous:
        cv2.LUT(plane2d(src), table, dst=plane2d(dst))
        return
    for c in range(src.shape[0]):
        cv2.LUT(src[c], table, dst=dst[c])


def apply_luts(src: np.ndarray, dst: np.ndarray, luts: np.ndarray) -> None:
    """Per-channel 8-bit lookup (``luts`` is (C, 256), or (256,) for every channel)."""
    if luts.ndim == 1:
        lut_u8(src, dst, luts)
        return
    for c in range(src.shape[0]):
        lut_u8(src[c], dst[c], luts[c])


def split_into(hwc: np.ndarray, dst: np.ndarray) -> None:
    """Deinterleave an (H, W, C) array into the planes of ``dst`` (C, H, W) with OpenCV's split,
    which writes straight into the given planes (copied over when a build does not)."""
    planes = [dst[c] for c in range(dst.shape[0])]
    out = cv2.split(hwc, planes)
    for c, plane in enumerate(out):
        if plane.ctypes.data != planes[c].ctypes.data:
            np.copyto(planes[c], plane)


def linear_gain_table_u8(gain: np.float32) -> np.ndarray:
    """uint8 result of ``linear_to_srgb(srgb_to_linear(v / 255) * gain)`` for the 256 levels v,
    the kernels' arithmetic (float32 linear values and product, float64 encoding) rounded as the
    engine rounds."""
    # the float32 product, then in float64: clip to [0, 1]; 12.92 w at or below 0.0031308, else
    # 1.055 w^(1/2.4) - 0.055; to float32, times 255, rounded half to even (in [0, 255] already)
    w = np.multiply(srgb_to_linear_u8(), np.float32(gain)).astype(np.float64)
    np.minimum(w, 1.0, out=w)
    np.maximum(w, 0.0, out=w)
    enc = np.maximum(w, 0.0031308)
    np.power(enc, 1.0 / 2.4, out=enc)
    enc *= 1.055
    enc -= 0.055
    np.copyto(enc, w * 12.92, where=w <= 0.0031308)
    levels = enc.astype(np.float32)
    levels *= np.float32(255.0)
    return np.rint(levels, out=levels).astype(np.uint8)


@lru_cache(maxsize=1024)
def _gain_affine(gain: float) -> tuple[np.ndarray, np.ndarray | None]:
    """The table of ``gain_in_linear_u8`` for one gain, and the affine 1x2 matrix whose OpenCV
    transform gives it (None where the table is the exact one); cached, read-only."""
    g = np.float32(gain)
    table = linear_gain_table_u8(g)
    k = float(g) ** (1.0 / 2.4)
    affine = np.array([[k, 255.0 * 0.055 * (k - 1.0)]], dtype=np.float32)
    transformed = cv2.transform(LEVELS_ROW_U8, affine)[0]
    for arr in (table, transformed, affine):
        arr.flags.writeable = False
    if int(cv2.absdiff(transformed, table).max()) <= 1:
        return transformed, affine
    return table, None


def gain_table_u8(gain: float) -> np.ndarray:
    """The 256-entry table of ``gain_in_linear_u8`` for one gain (see there)."""
    return _gain_affine(gain)[0]


def gain_in_linear_u8(src: np.ndarray, dst: np.ndarray, gains: Sequence[float]) -> None:
    """uint8 ``linear_to_srgb(srgb_to_linear(x) * gain_c)`` per channel (within one level).

    Away from the sRGB curve's linear foot this is affine in the encoded value:
    ``1.055 (g lin)^(1/2.4) - 0.055 = k (x + 0.055) - 0.055`` with ``k = g^(1/2.4)``, clipped.
    So each plane is OpenCV's saturating transform ``k x + 255 * 0.055 (k - 1)`` where that is
    within one level of the exact table on all 256 levels (checked per sample), otherwise the
    exact table. The transform is element-wise, so its table on the 256 levels gives its bytes;
    the transform runs on the plane (faster than OpenCV's LUT)."""
    for c in range(src.shape[0]):
        table, affine = _gain_affine(gains[c] if len(gains) > 1 else gains[0])
        if affine is None:
            lut_u8(src[c], dst[c], table)
        else:
            cv2.transform(src[c], affine, dst=dst[c])
