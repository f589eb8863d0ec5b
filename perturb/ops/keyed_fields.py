"""Keyed per-pixel fields of a whole batch in one pass (the torch path's ``perturb.rng`` fields).

``perturb.rng.uniform_field`` / ``normal_field`` give one sample's field; a kernel that stacks
them loops over the batch. Here the counter-based hash runs on a (B, n) grid at once: the
sample's stream key halves (host ints from its key, no device read) as a (B, 1) tensor against
the element counter as a (1, n) tensor. The arithmetic is ``perturb.rng``'s, int64 with 32-bit
masking (exact on CPU and CUDA), so each sample's field is bit for bit the one
``perturb.rng`` gives for its key, whatever the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from perturb import rng

_MASK32 = 0xFFFFFFFF
_MULT = 0x045D9F3B  # perturb.rng's mixer constant (tests/ops/test_keyed_fields.py pins the bits)
_NORMAL_LUT_BITS = 16


def _stream_halves(
    keys: Sequence[int], stream: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 1) int64 tensors of the low and high 32-bit halves of each key's stream key."""
    subs = [rng.sub_key(int(k), stream) for k in keys]
    halves = torch.tensor([[s & _MASK32, (s >> 32) & _MASK32] for s in subs], dtype=torch.int64)
    halves = halves.to(device)
    return halves[:, :1], halves[:, 1:]


def _mix(counter: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor) -> torch.Tensor:
    """``perturb.rng``'s two-round xorshift-multiply mixer on int64 values below 2^32 (products
    of a 32-bit value and the 27-bit constant fit in int64)."""
    x = counter ^ k0
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    x = x ^ k1
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    return x ^ (x >> 16)


def hash_bits_batch(
    keys: Sequence[int], stream: str, n: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(B, n) uniform 32-bit integers (int64): row b is ``rng.hash_bits(keys[b], stream, n)``."""
    device = torch.device(device)
    k0, k1 = _stream_halves(keys, stream, device)
    counter = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(0)
    return _mix(counter, k0, k1)


def uniform_fields(
    keys: Sequence[int], stream: str, shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(B, *shape) float32 uniforms in (0, 1): sample b's is ``rng.uniform_field(keys[b], ...)``."""
    n = _numel(shape)
    bits = hash_bits_batch(keys, stream, n, device)
    u = (bits >> 8).to(torch.float32) * (2.0**-24) + 2.0**-25
    return u.reshape(len(keys), *shape)


@lru_cache(maxsize=8)
def _normal_lut(device: str) -> torch.Tensor:
    """The inverse-CDF table of ``rng.normal_field`` (65536 float32 values) on ``device``."""
    return torch.from_numpy(rng.normal_lut_numpy().copy()).to(device)


def normal_fields(
    keys: Sequence[int], stream: str, shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(B, *shape) float32 standard normals: sample b's is ``rng.normal_field(keys[b], ...)``
    (element i < m from the low half-word of counter i, element m + i from its high half,
    m = ceil(n / 2), through the inverse-CDF table)."""
    device = torch.device(device)
    n = _numel(shape)
    m = (n + 1) // 2
    bits = hash_bits_batch(keys, stream, m, device)
    idx = torch.cat([bits & 0xFFFF, bits >> _NORMAL_LUT_BITS], dim=1)[:, :n]
    return _normal_lut(str(device))[idx].reshape(len(keys), *shape)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
