"""Keyed per-pixel fields of a whole batch in one pass (the torch path's ``perturb.rng`` fields).

``perturb.rng.uniform_field`` / ``normal_field`` give one sample's field; a kernel that stacks
them loops over the batch. Here the counter-based hash runs on a (B, n) grid at once: the
sample's stream key halves (host ints from its key, no device read) as a (B, 1) tensor against
the element counter as a (1, n) tensor. The arithmetic is ``perturb.rng``'s, int64 with 32-bit
masking (exact on CPU and CUDA), so each sample's field is bit for bit the one
``perturb.rng`` gives for its key, whatever the batch. On a CPU device the same hash runs as
NumPy uint32 ufuncs in place over the (B, n) grid (as ``perturb.rng`` does on the host: a
quarter of the memory traffic of int64 tensors and no temporaries), then one ``from_numpy``:
about 6x faster than the int64 tensor arithmetic on the CPU (B=16, 3x256x256: uniform 137 vs
856 ms, normal 88 vs 644 ms). tests/ops/test_keyed_fields.py pins both arithmetics' bits.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from perturb import rng

_MASK32 = 0xFFFFFFFF
_MULT = 0x045D9F3B  # perturb.rng's mixer constant (tests/ops/test_keyed_fields.py pins the bits)


def _stream_halves(keys: Sequence[int], stream: str) -> np.ndarray:
    """(B, 2) uint32: the low and high 32-bit halves of each key's stream key (host ints)."""
    subs = [rng.sub_key(int(k), stream) for k in keys]
    pairs = [[s & _MASK32, (s >> 32) & _MASK32] for s in subs]
    return np.array(pairs, dtype=np.uint32).reshape(-1, 2)


def _mix_numpy(n: int, halves: np.ndarray) -> np.ndarray:
    """The mixer on the (B, n) grid of counters 0..n-1 against (B, 1) key halves, as uint32
    ufuncs in place with one scratch buffer (``perturb.rng``'s host arithmetic)."""
    k0, k1 = halves[:, :1], halves[:, 1:]
    x = np.bitwise_xor(np.arange(n, dtype=np.uint32)[None, :], k0)
    t = np.empty_like(x)
    for step in range(3):
        np.right_shift(x, np.uint32(16), out=t)
        x ^= t
        x *= np.uint32(_MULT)
        if step == 0:
            x ^= k1
    np.right_shift(x, np.uint32(16), out=t)
    x ^= t
    return x


def _on_host(device: torch.device, host: bool | None) -> bool:
    """Whether a field is computed by NumPy (``host``; default: on a CPU device) rather than by
    torch on ``device`` (what CUDA runs; ``host=False`` runs it on a CPU device too)."""
    return device.type == "cpu" if host is None else host and device.type == "cpu"


def hash_bits_batch(
    keys: Sequence[int],
    stream: str,
    n: int,
    device: torch.device | str = "cpu",
    host: bool | None = None,
) -> torch.Tensor:
    """(B, n) uniform 32-bit integers (int64): row b is ``rng.hash_bits(keys[b], stream, n)``.
    ``host``: see ``_on_host``."""
    device = torch.device(device)
    halves = _stream_halves(keys, stream)
    if _on_host(device, host):
        return torch.from_numpy(_mix_numpy(n, halves).astype(np.int64))
    return _hash_torch(n, halves, device)


def _hash_torch(n: int, halves: np.ndarray, device: torch.device) -> torch.Tensor:
    """(B, n) int64 hash bits computed by torch on ``device`` (the CUDA path; on a CPU device
    it gives the NumPy path's bits, tests/ops/test_keyed_fields.py)."""
    k = torch.from_numpy(halves.astype(np.int64)).to(device)
    counter = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(0)
    return rng.mix_torch(counter, k[:, :1], k[:, 1:])


def uniform_fields(
    keys: Sequence[int],
    stream: str,
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
    host: bool | None = None,
) -> torch.Tensor:
    """(B, *shape) float32 uniforms in (0, 1): sample b's is ``rng.uniform_field(keys[b], ...)``.
    ``host``: see ``_on_host``."""
    device = torch.device(device)
    n = math.prod(shape)
    halves = _stream_halves(keys, stream)
    if _on_host(device, host):
        bits = _mix_numpy(n, halves)
        bits >>= np.uint32(8)
        u = bits.astype(np.float32)
        u *= np.float32(2.0**-24)
        u += np.float32(2.0**-25)
        return torch.from_numpy(u).reshape(len(keys), *shape)
    bits_t = _hash_torch(n, halves, device)
    return ((bits_t >> 8).to(torch.float32) * (2.0**-24) + 2.0**-25).reshape(len(keys), *shape)


@lru_cache(maxsize=1)
def _normal_lut_host() -> np.ndarray:
    """The inverse-CDF table of ``rng.normal_field`` (65536 float32 values), read once, read-only."""
    table = rng.normal_lut_numpy().copy()
    table.flags.writeable = False
    return table


def normal_fields(
    keys: Sequence[int],
    stream: str,
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
    host: bool | None = None,
) -> torch.Tensor:
    """(B, *shape) float32 standard normals: sample b's is ``rng.normal_field(keys[b], ...)``
    (element i < m from the low half-word of counter i, element m + i from its high half,
    m = ceil(n / 2), through the inverse-CDF table). ``host``: see ``_on_host``."""
    device = torch.device(device)
    n = math.prod(shape)
    m = (n + 1) // 2
    b = len(keys)
    halves = _stream_halves(keys, stream)
    if _on_host(device, host) and sys.byteorder == "little":
        # half-words of counter i sit at [2i] (low) and [2i + 1] (high) of each row
        words = _mix_numpy(m, halves).view(np.uint16).reshape(b, m, 2).transpose(0, 2, 1)
        z = np.take(_normal_lut_host(), words.reshape(b, 2 * m)[:, :n])
        return torch.from_numpy(z).reshape(b, *shape)
    bits = _hash_torch(m, halves, device)
    idx = torch.cat([bits & 0xFFFF, bits >> 16], dim=1)[:, :n]
    return rng._normal_lut(str(device))[idx].reshape(b, *shape)
