"""Keyed randomness: every random quantity derives from (seed, sample key, op, severity, variant).

* ``derive_key`` hashes the canonical string ``seed|sample_key|op|severity|variant`` with
  BLAKE2b into a 64-bit key. Python's ``hash()`` and global RNG state are never used. The key
  functions (``canonical``, ``derive_key``, ``sub_key``, ``key_to_hex``, ``key_from_hex``) live in
  the torch-free :mod:`perturb.contracts.keys`; this module re-exports them beside the streams.
* ``scalar_rng`` builds a NumPy ``Generator`` (PCG64) from a key, for scalar parameters drawn on
  the host; ``scalar_streams`` gives the same streams for a batch of keys, seeded in one NumPy
  pass (what a batch's parameter draw uses).
* ``uniform_field`` / ``normal_field`` are per-pixel fields: pure functions of (key, stream,
  element index) computed with an integer hash. Integer arithmetic is exact, so a field is
  identical on CPU (NumPy, uint32 wrap-around) and CUDA (torch int64 with masking), and
  independent of batch size, position and order.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

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
    "scalar_streams",
    "sub_key",
    "uniform_field",
    "uniform_numpy",
    "uniform_numpy_at",
]


def scalar_rng(key: int) -> np.random.Generator:
    """Host generator for scalar parameters of one sample:
    ``Generator(PCG64(SeedSequence(key)))``, NumPy's own seeding of a PCG64 from an integer."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))


# --------------------------------------------------------------------------------------------
# Scalar streams for a batch of keys: NumPy's SeedSequence -> PCG64 seeding, vectorized over the
# keys (the per-key constructors cost ~40 us each, more than a batch's kernel at 128x128), and
# the draws ``random()`` / ``uniform(lo, hi)`` that samplers make, bit for bit as NumPy's
# Generator makes them. Constants and steps: numpy/random/bit_generator.pyx (SeedSequence
# mix_entropy, generate_state) and numpy/random/src/pcg64 (pcg_setseq_128_srandom_r, XSL-RR).

_SS_INIT_A, _SS_MULT_A = 0x43B0D7E5, 0x931E8875
_SS_INIT_B, _SS_MULT_B = 0x8B51F9DD, 0x58F38DED
_SS_MIX_L, _SS_MIX_R = 0xCA01F9DD, 0x4973F715
_SS_POOL = 4
_MASK64 = (1 << 64) - 1
_MASK128 = (1 << 128) - 1
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_DOUBLE_UNIT = 1.0 / 9007199254740992.0  # 2**-53, NumPy's next_double


def _hash_consts(init: int, mult: int, n: int) -> np.ndarray:
    """(n + 1,) uint32: the constants a SeedSequence hash runs through, ``init`` first (they do
    not depend on the data); hash ``j`` (from 1) xors with entry ``j - 1``, multiplies by ``j``."""
    out, c = [init], init
    for _ in range(n):
        c = (c * mult) & _MASK32
        out.append(c)
    return np.array(out, np.uint32)


# mix_entropy on a 2-word entropy (a 64-bit key) and a pool of 4: 4 + 12 hashmix calls
_MIX_CONSTS = _hash_consts(_SS_INIT_A, _SS_MULT_A, _SS_POOL * _SS_POOL)[:, None]
_STATE_CONSTS = _hash_consts(_SS_INIT_B, _SS_MULT_B, 8)[:, None]  # generate_state(4, uint64)


def _pcg_seeds(keys: np.ndarray) -> np.ndarray:
    """(B, 4) uint64: ``SeedSequence(key).generate_state(4, np.uint64)`` for each uint64 key,
    one array operation per step of NumPy's loops (the hashes of one source word into the
    other three pool words are independent, so they run as one (3, B) step)."""
    u32, shift = np.uint32, np.uint32(16)
    a = _MIX_CONSTS
    pool = np.zeros((_SS_POOL, keys.shape[0]), u32)
    pool[0] = keys & np.uint64(_MASK32)
    pool[1] = keys >> np.uint64(32)
    pool ^= a[0:4]
    pool *= a[1:5]
    pool ^= pool >> shift
    j = 5  # index of the next hash's multiplier
    for src in range(_SS_POOL):
        dst = [d for d in range(_SS_POOL) if d != src]
        hashed = (pool[src] ^ a[j - 1 : j + 2]) * a[j : j + 3]
        hashed ^= hashed >> shift
        j += 3
        mixed = u32(_SS_MIX_L) * pool[dst] - u32(_SS_MIX_R) * hashed
        mixed ^= mixed >> shift
        pool[dst] = mixed
    b = _STATE_CONSTS
    state = (pool[[0, 1, 2, 3, 0, 1, 2, 3]] ^ b[:8]) * b[1:]
    state ^= state >> shift
    return np.ascontiguousarray(state.T).astype("<u4").view("<u8").astype(np.uint64)


class KeyedStream:
    """One key's scalar stream: ``random()`` and ``uniform(lo, hi)`` drawn here exactly as
    ``scalar_rng(key)`` draws them; any other use (``normal``, ``integers``, sized draws, ...)
    continues on a real ``scalar_rng(key)`` advanced past the draws made here, so every method
    of a ``Generator`` is available and the sequence is the same."""

    __slots__ = ("_drawn", "_generator", "_inc", "_key", "_state")

    def __init__(self, key: int, seed_words: Sequence[int]) -> None:
        s0, s1, i0, i1 = (int(w) for w in seed_words)
        self._key = key
        self._inc = ((((i0 << 64) | i1) << 1) | 1) & _MASK128
        state = (self._inc + ((s0 << 64) | s1)) & _MASK128  # srandom_r: step from 0, add, step
        self._state = (state * _PCG_MULT + self._inc) & _MASK128
        self._drawn = 0
        self._generator: np.random.Generator | None = None

    def _next_double(self) -> float:
        state = (self._state * _PCG_MULT + self._inc) & _MASK128
        self._state = state
        self._drawn += 1
        x = ((state >> 64) ^ state) & _MASK64
        rot = state >> 122
        bits = ((x >> rot) | (x << (64 - rot))) & _MASK64
        return (bits >> 11) * _DOUBLE_UNIT

    def _real(self) -> np.random.Generator:
        if self._generator is None:
            bits = np.random.PCG64(np.random.SeedSequence(self._key))  # as scalar_rng
            bits.advance(self._drawn)
            self._generator = np.random.Generator(bits)
        return self._generator

    def random(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or self._generator is not None:
            return self._real().random(*args, **kwargs)
        return self._next_double()

    def uniform(self, *args: Any, **kwargs: Any) -> Any:
        if self._generator is None and not kwargs and len(args) == 2 and _FAST_UNIFORM:
            lo, hi = args
            if type(lo) is float and type(hi) is float and hi >= lo and math.isfinite(hi - lo):
                return lo + (hi - lo) * self._next_double()
        return self._real().uniform(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)


def scalar_streams(keys: Sequence[int]) -> list[KeyedStream]:
    """``scalar_rng(key)`` for each key, as streams seeded together (``KeyedStream``)."""
    seeds = _pcg_seeds(np.fromiter(keys, np.uint64, len(keys))).tolist()
    return [KeyedStream(k, s) for k, s in zip(keys, seeds, strict=True)]


def _uniform_matches() -> bool:
    """Whether ``lo + (hi - lo) * u`` in Python rounds as NumPy's compiled ``random_uniform``
    does on this build (a build that fuses the multiply-add would differ in the last bit):
    checked once on a few thousand draws; where it does not, ``uniform`` runs on NumPy."""
    gen = scalar_rng(0x5EED)
    stream = KeyedStream(0x5EED, _pcg_seeds(np.array([0x5EED], np.uint64))[0].tolist())
    bounds = [(0.1 * i - 3.7, 0.37 * i + 0.013) for i in range(4096)]
    return all(gen.uniform(lo, hi) == lo + (hi - lo) * stream._next_double() for lo, hi in bounds)


_FAST_UNIFORM = _uniform_matches()


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


def mix_torch(
    counter: torch.Tensor, k0: int | torch.Tensor, k1: int | torch.Tensor
) -> torch.Tensor:
    """The two-round xorshift-multiply mixer of int64 ``counter`` values below 2^32 against
    the stream key's 32-bit halves ``k0``, ``k1`` (ints, or int64 tensors broadcasting against
    ``counter``: one key per sample of a batch); products of a 32-bit value and the 27-bit
    constant fit in int64."""
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
    return mix_torch(counter, k0, k1)


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
    bits = mix_torch(torch.arange(n, dtype=torch.int64, device=device), k0, k1)
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
    bits = mix_torch(torch.arange(m, dtype=torch.int64, device=device), k0, k1)
    idx = torch.cat([bits & 0xFFFF, bits >> 16])[:n]
    return _normal_lut(str(device))[idx].reshape(shape)
