"""Keyed per-pixel fields of a whole batch in one pass: the counter hash of ``perturb.rng`` with
one key per sample, as a (B, 1) tensor broadcast against the element counter.

Each sample's row is bit for bit the field ``perturb.rng.uniform_field`` / ``normal_field`` gives
for its key alone (integer arithmetic is exact; the float conversion and the inverse-CDF gather
are the same operations), so a sample's field never depends on the batch. The stream keys are
derived on the host from the (host-side) integer keys; nothing is read back from the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from perturb import rng

_MASK32 = 0xFFFFFFFF
_MULT = 0x045D9F3B  # perturb.rng's mixer constant


def _stream_halves(
    keys: Sequence[int], stream: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k0, k1): the low and high 32-bit halves of each key's stream key, (B, 1) int64."""
    subs = [rng.sub_key(int(k), stream) for k in keys]
    halves = torch.tensor(
        [[s & _MASK32, (s >> 32) & _MASK32] for s in subs], dtype=torch.int64, device=device
    )
    return halves[:, :1], halves[:, 1:]


def hash_bits_batch(
    keys: Sequence[int], stream: str, n: int, device: torch.device | str
) -> torch.Tensor:
    """(B, n) uniform 32-bit integers (int64): row ``i`` is ``rng.hash_bits(keys[i], stream, n)``."""
    device = torch.device(device)
    k0, k1 = _stream_halves(keys, stream, device)
    x = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(0) ^ k0
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    x = x ^ k1
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    return x ^ (x >> 16)


def uniform_fields(
    keys: Sequence[int], stream: str, shape: tuple[int, ...], device: torch.device | str
) -> torch.Tensor:
    """(B, *shape) float32 in (0, 1): row ``i`` is ``rng.uniform_field(keys[i], stream, shape)``."""
    n = math.prod(shape)
    bits = hash_bits_batch(keys, stream, n, device)
    u = (bits >> 8).to(torch.float32) * (2.0**-24) + 2.0**-25
    return u.view(len(keys), *shape)


def normal_fields(
    keys: Sequence[int], stream: str, shape: tuple[int, ...], device: torch.device | str
) -> torch.Tensor:
    """(B, *shape) standard-normal float32: row ``i`` is ``rng.normal_field(keys[i], stream,
    shape)`` (low half-words of the counters first, then the high ones, through the table)."""
    device = torch.device(device)
    n = math.prod(shape)
    m = (n + 1) // 2
    bits = hash_bits_batch(keys, stream, m, device)
    idx = torch.cat([bits & 0xFFFF, bits >> 16], dim=1)[:, :n]
    return rng._normal_lut(str(device))[idx].view(len(keys), *shape)
