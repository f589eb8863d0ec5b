"""Keyed randomness: every random quantity derives from (seed, sample key, op, severity, variant).

* ``derive_key`` hashes the canonical string ``seed|sample_key|op|severity|variant`` with
  BLAKE2b into a 64-bit key. Python's ``hash()`` and global RNG state are never used. The key
  functions (``canonical``, ``derive_key``, ``sub_key``, ``key_to_hex``, ``key_from_hex``) live in
  the torch-free :mod:`perturb.contracts.keys`; this module re-exports them beside the streams.
* ``scalar_rng`` builds a NumPy ``Generator`` (PCG64) from a key, for scalar parameters drawn on
  the host.
* ``uniform_field`` / ``normal_field`` are per-pixel fields: pure functions of (key, stream,
  element index) computed with an integer hash. Integer arithmetic is exact, so a field is
  identical on CPU (NumPy, uint32 wrap-around) and CUDA (torch int64 with masking), and
  independent of batch size, position and order.
"""

from __future__ import annotations

import sys
import threading
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from numpy.random.bit_generator import ISpawnableSeedSequence

from perturb._pcg_seed import seed_words
from perturb.contracts.keys import canonical, derive_key, key_from_hex, key_to_hex, sub_key

_MASK32 = 0xFFFFFFFF
_MULT = 0x045D9F3B  # odd constant < 2**31: products with 32-bit values fit in int64
_NORMAL_LUT_BITS = 16

__all__ = [
    "canonical",
    "derive_key",
    "hash_bits",
    "hash_numpy",
    "key_from_hex",
    "key_to_hex",
    "normal_field",
    "normal_lut_numpy",
    "normal_numpy",
    "scalar_rng",
    "sub_key",
    "uniform_field",
    "uniform_numpy",
    "uniform_numpy_at",
]


def scalar_rng(key: int) -> np.random.Generator:
    """Host generator for scalar parameters of one sample: ``Generator(PCG64(key))``, its seed
    words computed by ``perturb._pcg_seed`` where compiled (the same state, 8x faster)."""
    words = seed_words() if 0 <= key < 1 << 64 else None
    if words is None:
        return np.random.Generator(np.random.PCG64(key))
    seq = _SeedWords(words(key & _MASK32, key >> 32), key)
    return np.random.Generator(np.random.PCG64(seq))


class _SeedWords(ISpawnableSeedSequence):
    """A seed sequence whose words are already drawn (``np.random.SeedSequence(key)``'s); for
    anything else (``Generator.spawn``, ``entropy``, ...) it is that SeedSequence, made on first
    use, so the generator behaves as ``Generator(PCG64(key))`` does."""

    __slots__ = ("_key", "_seq", "_words")

    def __init__(self, words: np.ndarray, key: int) -> None:
        self._words, self._key = words, key
        self._seq: np.random.SeedSequence | None = None

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words == self._words.size and np.dtype(dtype) == np.uint64:
            return self._words
        return self._numpy().generate_state(n_words, dtype)  # any other request: NumPy's

    def _numpy(self) -> np.random.SeedSequence:
        if self._seq is None:
            self._seq = np.random.SeedSequence(self._key)
        return self._seq

    def spawn(self, n_children: int) -> list[Any]:  # NumPy's SeedSequences
        return self._numpy().spawn(n_children)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (e.g. while unpickling): no SeedSequence to ask
            raise AttributeError(name)
        return getattr(self._numpy(), name)


# --------------------------------------------------------------------------------------------
# Counter-based integer hash (two rounds of a xorshift-multiply mixer with both key halves).


def _hash_numpy(counter: np.ndarray, k0: int, k1: int) -> np.ndarray:
    """The mixer on a uint32 array (a new array; ``counter`` is not modified). In-place ufuncs
    with one scratch buffer: no temporaries, so no fresh pages to fault in per operation."""
    x = np.bitwise_xor(counter, np.uint32(k0))
    t = np.empty_like(x)
    np.right_shift(x, np.uint32(16), out=t)
    x ^= t
    x *= np.uint32(_MULT)
    x ^= np.uint32(k1)
    np.right_shift(x, np.uint32(16), out=t)
    x ^= t
    x *= np.uint32(_MULT)
    np.right_shift(x, np.uint32(16), out=t)
    x ^= t
    x *= np.uint32(_MULT)
    np.right_shift(x, np.uint32(16), out=t)
    x ^= t
    return x


_COUNTER_LOCK = threading.Lock()
_COUNTER: np.ndarray = np.arange(0, dtype=np.uint32)


def _counter(n: int) -> np.ndarray:
    """Read-only ``arange(n)`` as uint32 (a view of a cached, growing array)."""
    global _COUNTER
    counter = _COUNTER
    if counter.shape[0] < n:
        with _COUNTER_LOCK:
            if _COUNTER.shape[0] < n:
                grown = np.arange(max(n, 2 * _COUNTER.shape[0]), dtype=np.uint32)
                grown.flags.writeable = False
                _COUNTER = grown
            counter = _COUNTER
    return counter[:n]


def _stream_halves(key: int, stream: str) -> tuple[int, int]:
    k = sub_key(key, stream)
    return k & _MASK32, (k >> 32) & _MASK32


def hash_numpy(key: int, stream: str, n: int) -> np.ndarray:
    """``n`` uniform uint32 values of a keyed stream, on the host (same bits as ``hash_bits``)."""
    k0, k1 = _stream_halves(key, stream)
    return _hash_numpy(_counter(n), k0, k1)


def uniform_numpy(key: int, stream: str, n: int) -> np.ndarray:
    """Host float32 twin of ``uniform_field`` (bit-identical values), flat."""
    return _uniform_of_bits(hash_numpy(key, stream, n))


def uniform_numpy_at(key: int, stream: str, index: np.ndarray) -> np.ndarray:
    """``uniform_numpy(key, stream, n)[index]`` for flat indices below 2^32, computed at those
    elements only (the hash is counter-based)."""
    k0, k1 = _stream_halves(key, stream)
    return _uniform_of_bits(_hash_numpy(np.asarray(index).astype(np.uint32), k0, k1))


def _uniform_of_bits(bits: np.ndarray) -> np.ndarray:
    bits >>= np.uint32(8)
    u = bits.astype(np.float32)
    u *= np.float32(2.0**-24)
    u += np.float32(2.0**-25)
    return u


def normal_numpy(key: int, stream: str, n: int, lut: np.ndarray | None = None) -> np.ndarray:
    """Host float32 twin of ``normal_field`` (bit-identical values), flat. ``lut`` replaces the
    inverse-CDF table, e.g. by ``sigma * table`` (float32) to get ``sigma * z`` in one gather."""
    m = (n + 1) // 2
    bits = hash_numpy(key, stream, m)
    table = normal_lut_numpy() if lut is None else lut
    if sys.byteorder == "little":  # half-words of counter i sit at [2i] (low) and [2i + 1] (high)
        halves = bits.view(np.uint16).reshape(m, 2).T
        return np.take(table, halves).reshape(-1)[:n]
    idx = np.empty(2 * m, dtype=np.uint32)
    np.bitwise_and(bits, np.uint32(0xFFFF), out=idx[:m])
    np.right_shift(bits, np.uint32(16), out=idx[m:])
    return np.take(table, idx[:n])


def _hash_torch(counter: torch.Tensor, k0: int, k1: int) -> torch.Tensor:
    x = counter ^ k0
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    x = x ^ k1
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MULT) & _MASK32
    return x ^ (x >> 16)


def hash_bits(key: int, stream: str, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``n`` uniform 32-bit integers (as int64) for elements 0..n-1 of a keyed stream."""
    k = sub_key(key, stream)
    k0, k1 = k & _MASK32, (k >> 32) & _MASK32
    device = torch.device(device)
    if device.type == "cpu":
        return torch.from_numpy(hash_numpy(key, stream, n).astype(np.int64))
    counter = torch.arange(n, dtype=torch.int64, device=device)
    return _hash_torch(counter, k0, k1)


def uniform_field(
    key: int, stream: str, shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Uniform float32 values in the open interval (0, 1), 24 bits of resolution."""
    n = int(np.prod(shape))
    k = sub_key(key, stream)
    k0, k1 = k & _MASK32, (k >> 32) & _MASK32
    device = torch.device(device)
    if device.type == "cpu":
        return torch.from_numpy(uniform_numpy(key, stream, n)).reshape(shape)
    bits = _hash_torch(torch.arange(n, dtype=torch.int64, device=device), k0, k1)
    u = (bits >> 8).to(torch.float32) * (2.0**-24) + 2.0**-25
    return u.reshape(shape)


@lru_cache(maxsize=8)
def _normal_lut(device: str) -> torch.Tensor:
    levels = 1 << _NORMAL_LUT_BITS
    p = (torch.arange(levels, dtype=torch.float64) + 0.5) / levels
    return torch.special.ndtri(p).to(torch.float32).to(device)


def normal_lut_numpy() -> np.ndarray:
    return _normal_lut("cpu").numpy()


def normal_field(
    key: int, stream: str, shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Standard-normal float32 values: a 16-bit uniform through an inverse-CDF table.

    One 32-bit hash gives two values (low and high half-words): element ``i < m`` takes the
    low half of counter ``i``, element ``m + i`` the high half, with ``m = ceil(n / 2)``.
    Values are capped at about ±4.4 σ by the table's resolution.
    """
    n = int(np.prod(shape))
    m = (n + 1) // 2
    k = sub_key(key, stream)
    k0, k1 = k & _MASK32, (k >> 32) & _MASK32
    device = torch.device(device)
    if device.type == "cpu":
        return torch.from_numpy(normal_numpy(key, stream, n)).reshape(shape)
    bits = _hash_torch(torch.arange(m, dtype=torch.int64, device=device), k0, k1)
    idx = torch.cat([bits & 0xFFFF, bits >> 16])[:n]
    return _normal_lut(str(device))[idx].reshape(shape)
