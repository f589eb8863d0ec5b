"""Compiled loops of the composite (numba, ``perturb.scene._compiled``), for integer samples: one
pass over each plane that copies the source back where the composite alpha is 0 and blends the
soft edge, without the GIL, so the samples of a batch composite in parallel on the worker
threads; for lookup-table ops the same pass also looks the tissue up (``lookup_kernel``).

They give the bytes of the NumPy path in ``perturb.scene.masks`` exactly: the same float32
steps in the same order (``(dst - src) * alpha + src``, no fused multiply-add: numba compiles
without fast-math), rounded half to even. ``kernels()`` is None where numba is not installed
or compiles something else than that path on a probe; the NumPy path then runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Kernels:
    """The compiled loops (``perturb.scene._compiled``), on flat C-contiguous CHW integer samples:

    * ``compose(src, dst, starts, stops, part_starts, part_stops, alpha, planes)``: per plane,
      ``dst[a:b] = src[a:b]`` for each run [a, b) of ``starts`` / ``stops`` (flat indices into
      one plane) and ``dst[i] = rint((dst[i] - src[i]) * alpha + src[i])`` over the runs of
      ``part_starts`` / ``part_stops`` (``alpha``: one value per pixel of those runs, in order);
    * ``blend(src, dst, index, alpha)``: the blend alone at flat indices ``index`` into the
      whole sample;
    * ``lookup_compose(src, dst, tables, starts, stops, part_starts, part_stops, alpha, planes,
      lookup_at)``: the bytes of uint8 ``dst = tables[c][src]`` then ``compose``, in one pass per
      plane: the runs are copied, the pixels between them looked up, the soft edge blended (a
      plane stays in the second-level cache from one step to the next); ``tables`` (T, 256)
      uint8, T 1 (every plane) or ``planes``; ``lookup_at`` the address of a C function
      ``(target, length, source, table)`` of byte addresses (stringzilla's ``sz_lookup``);
      ``state_at, update_at`` (0, 0: no digest) an xxHash XXH3-128 state and the address of its
      update function (``StreamHasher``): each plane of ``src`` goes into the digest right after
      it is looked up and composited, while it is still in cache, so the sample's digest costs no
      second read of it from memory.
    """

    compose: Callable[..., None]
    blend: Callable[..., None]
    lookup_compose: Callable[..., None]


def _build() -> Kernels | None:
    try:
        from perturb.scene import _compiled
    except ImportError:  # numba (or llvmlite) is not installed
        return None
    return Kernels(_compiled.compose, _compiled.blend, _compiled.lookup_compose)


def _reference(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> None:
    """The NumPy path's blend (``masks._blend_at``) on flat arrays."""
    base = src[index].astype(np.float32)
    mixed = dst[index].astype(np.float32)
    mixed -= base
    mixed *= alpha
    mixed += base
    dst[index] = np.rint(mixed).astype(dst.dtype)


def runs_of(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, stops) of the runs of consecutive values of a sorted index array."""
    if index.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(index) != 1)
    starts = np.concatenate([index[:1], index[breaks + 1]]).astype(np.int64)
    stops = np.concatenate([index[breaks] + 1, index[-1:] + 1]).astype(np.int64)
    return starts, stops


def _frozen(*arrays: np.ndarray) -> list[np.ndarray]:
    """Read-only copies: the probes call the kernels with the argument types of the real calls
    (the plans' read-only arrays), so numba compiles, or loads from its cache, one version."""
    out = []
    for a in arrays:
        b = np.array(a)
        b.flags.writeable = False
        out.append(b)
    return out


def _agrees(k: Kernels) -> bool:
    """The kernels give the NumPy path's bytes on a probe: every pair of levels at alphas that
    round at half levels and in between, and runs copied over."""
    levels = np.arange(256, dtype=np.uint8)
    src = np.repeat(levels, 256)
    dst = np.tile(levels, 256)
    rng = np.random.default_rng(0)
    alpha = np.concatenate(
        [np.full(src.size // 2, 0.5, np.float32), rng.random(src.size // 2, np.float32)]
    )
    index = np.arange(src.size, dtype=np.int64)
    want = dst.copy()
    _reference(src, want, index, alpha)
    got = dst.copy()
    k.blend(src, got, *_frozen(index, alpha))
    two = np.stack([src, dst])  # two planes: runs and blends per plane
    starts, stops = np.array([0, 40_000], np.int64), np.array([100, 50_000], np.int64)
    part = np.concatenate([np.arange(200, 20_000, 7), np.arange(30_000, 30_040)]).astype(np.int64)
    composed = two[1::-1].copy().reshape(-1)
    k.compose(
        two.reshape(-1), composed, *_frozen(starts, stops, *runs_of(part), alpha[: part.size]), 2
    )
    expect = two[1::-1].copy()
    for c in range(2):
        for a, b in zip(starts, stops, strict=True):
            expect[c, a:b] = two[c, a:b]
        _reference(two[c], expect[c], part, alpha[: part.size])
    return np.array_equal(got, want) and np.array_equal(composed, expect.reshape(-1))


@lru_cache(maxsize=1)
def kernels() -> Kernels | None:
    """The compiled kernels (compiled or loaded from numba's cache on the first call), or None
    where numba is missing or the probe disagrees with the NumPy path."""
    k = _build()
    if k is None:
        return None
    try:
        ok = _agrees(k)
    except Exception:  # a numba that cannot compile these loops: the NumPy path
        return None
    return k if ok else None


def _lookup_agrees(k: Kernels, lookup: Any) -> bool:
    """``lookup_compose`` with ``lookup`` gives a lookup followed by ``compose`` on a probe of
    two planes with per-plane tables, runs at both ends and between, and blends between."""
    rng = np.random.default_rng(1)
    size = 25_353  # odd: runs and blends at unaligned ends
    src = rng.integers(0, 256, 2 * size, dtype=np.uint8)
    tables = rng.integers(0, 256, (2, 256), dtype=np.uint8)
    starts = np.array([0, 8187, 16484, size - 3], np.int64)
    stops = np.array([10, 16391, 16485, size], np.int64)
    part = np.concatenate([np.arange(11, size - 4, 13), np.arange(8300, 8337)]).astype(np.int64)
    inside = np.zeros(size, bool)
    for a, b in zip(starts, stops, strict=True):
        inside[a:b] = True
    part = part[~inside[part]]  # as in a plan: the soft edge lies outside the copied runs
    alpha = rng.random(part.size, dtype=np.float32)
    want = np.concatenate([tables[0][src[:size]], tables[1][src[size:]]])
    k.compose(src, want, *_frozen(starts, stops, *runs_of(part), alpha), 2)
    got = np.zeros_like(src)
    k.lookup_compose(
        src, got, *_frozen(tables, starts, stops, *runs_of(part), alpha), 2, address_of(lookup), 0, 0
    )
    hashed = np.zeros_like(src)
    digest_ok = _hashed_call_agrees(
        src,
        lambda state_at, update_at: k.lookup_compose(
            src, hashed, *_frozen(tables, starts, stops, *runs_of(part), alpha), 2, address_of(lookup), state_at, update_at
        ),
    )
    return bool(np.array_equal(got, want)) and bool(np.array_equal(hashed, want)) and digest_ok


def _hashed_call_agrees(src: np.ndarray, call: Callable[[int, int], None]) -> bool:
    """``call(state_at, update_at)``, a kernel asked to digest ``src`` as it runs, leaves the
    digest ``xxhash.xxh3_128`` gives (True where no stream hasher is installed: nothing to ask)."""
    hasher = stream_hasher()
    if hasher is None:
        return True
    import xxhash

    state = hasher.state()
    hasher.reset(state)
    call(state, hasher.update_at)
    return hasher.digest(state) == bytes(xxhash.xxh3_128(src.tobytes()).digest())


_LOOKUPS: dict[int, tuple[Any, bool, int]] = {}  # id -> (the function, kept alive; agrees; address)


def address_of(lookup: Any) -> int:
    """The address of a ctypes function (what ``lookup_compose`` calls)."""
    import ctypes

    address = ctypes.cast(lookup, ctypes.c_void_p).value
    if not address:
        raise ValueError("a ctypes function with an address is needed")
    return int(address)


def lookup_kernel(lookup: Any) -> tuple[Callable[..., None], int] | None:
    """``kernels().lookup_compose`` and the address of ``lookup`` (its last argument) where they
    give a lookup followed by ``compose`` (checked once per function), else None."""
    k = kernels()
    if k is None:
        return None
    seen = _LOOKUPS.get(id(lookup))
    if seen is None:
        try:
            ok = _lookup_agrees(k, lookup)
        except Exception:  # cannot compile or call it: the two-step path
            ok = False
        seen = _LOOKUPS[id(lookup)] = (lookup, ok, address_of(lookup) if ok else 0)
    return (k.lookup_compose, seen[2]) if seen[1] else None


class StreamHasher:
    """xxHash's streaming XXH3-128 from the ``xxhash`` package's own library, through ctypes:
    the digest ``perturb.scene.analysis`` keys scenes by (``xxhash.xxh3_128(buf).digest()``,
    big-endian high then low half), taken by ``lookup_compose`` plane by plane while it reads
    them. ``state()`` is a per-thread state (``XXH3_createState``, freed when the thread
    ends); ``reset(state)`` starts a digest, ``digest(state)`` ends it; ``update_at`` the
    address of the update function (its runtime-dispatched SIMD variant where exported)."""

    def __init__(self, library: Any) -> None:
        import ctypes
        import threading

        class Hash128(ctypes.Structure):
            _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]

        self._create = library.XXH3_createState
        self._create.restype, self._create.argtypes = ctypes.c_void_p, []
        self._reset = library.XXH3_128bits_reset
        self._reset.restype, self._reset.argtypes = ctypes.c_int, [ctypes.c_void_p]
        self._digest = library.XXH3_128bits_digest
        self._digest.restype, self._digest.argtypes = Hash128, [ctypes.c_void_p]
        self._free = library.XXH3_freeState
        self._free.restype, self._free.argtypes = ctypes.c_int, [ctypes.c_void_p]
        update = getattr(library, "XXH3_128bits_update_dispatch", None) or library.XXH3_128bits_update
        update.restype = ctypes.c_int
        update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self._update = update
        self.update_at = address_of(update)
        self._local = threading.local()

    def state(self) -> int:
        held = getattr(self._local, "state", None)
        if held is None:
            address = self._create()
            if not address:
                raise MemoryError("XXH3_createState returned no state")
            held = self._local.state = _HeldState(int(address), self._free)
        return held.address

    def reset(self, state: int) -> None:
        if self._reset(state) != 0:
            raise RuntimeError("XXH3_128bits_reset failed")

    def update(self, state: int, buf: np.ndarray) -> None:
        self._update(state, buf.ctypes.data, buf.nbytes)

    def digest(self, state: int) -> bytes:
        h = self._digest(state)
        return int(h.high64).to_bytes(8, "big") + int(h.low64).to_bytes(8, "big")


class _HeldState:
    """A thread's XXH3 state, freed when the thread ends (its thread-local slot is cleared)."""

    __slots__ = ("_free", "address")

    def __init__(self, address: int, free: Callable[[int], int]) -> None:
        self.address, self._free = address, free

    def __del__(self) -> None:
        try:  # noqa: SIM105 - no contextlib lookup: module globals may be gone at shutdown
            self._free(self.address)
        except Exception:  # pragma: no cover - interpreter shutdown: ctypes may be gone
            pass


def _hasher_agrees(hasher: StreamHasher) -> bool:
    """Planes fed one by one give ``xxhash.xxh3_128`` of the whole buffer."""
    import xxhash

    rng = np.random.default_rng(2)
    for size in (0, 1, 47, 240, 70_001):  # XXH3's short-input, mid-size and streamed branches
        buf = rng.integers(0, 256, 3 * size, dtype=np.uint8)
        state = hasher.state()
        hasher.reset(state)
        for plane in buf.reshape(3, -1):
            hasher.update(state, plane)
        if hasher.digest(state) != bytes(xxhash.xxh3_128(buf.tobytes()).digest()):
            return False
    return True


@lru_cache(maxsize=1)
def stream_hasher() -> StreamHasher | None:
    """The ``StreamHasher`` of the installed ``xxhash``, or None where it is not installed, its
    library does not export the streaming functions, or they disagree with ``xxhash`` itself."""
    try:
        import ctypes

        import xxhash._xxhash as library_module

        hasher = StreamHasher(ctypes.CDLL(library_module.__file__))
        return hasher if _hasher_agrees(hasher) else None
    except Exception:  # no xxhash, another build of it, no such symbols: the separate digest
        return None


MATRIX_STEPS = 1024  # cv2.transform's fixed-point unit for uint8 (10 bits)
_MATRIX_LIMIT = 32.0  # cv2 takes the fixed-point path for coefficients below this in magnitude


def matrix_steps(matrix: np.ndarray) -> np.ndarray | None:
    """A 3x3 colour matrix in ``cv2.transform``'s uint8 fixed-point steps (int64, read-only:
    ``rint(matrix * 1024)`` of its float32 values), or None where a coefficient is not finite
    or too large for that path (OpenCV then computes in floating point)."""
    m = np.asarray(matrix, dtype=np.float32).reshape(3, 3)
    if not np.isfinite(m).all() or np.abs(m).max() >= _MATRIX_LIMIT:
        return None
    steps = np.rint(m.astype(np.float64) * MATRIX_STEPS).astype(np.int64)
    steps.flags.writeable = False
    return steps


# no runs to copy and no soft edge: (starts, stops, part_starts, part_stops, alpha), read-only
_NO_RUNS = tuple(_frozen(*[np.zeros(0, np.int64)] * 4, np.zeros(0, np.float32)))


def transform_planes(src: np.ndarray, dst: np.ndarray, matrix: np.ndarray) -> bool:
    """``dst = cv2.transform``'s uint8 result of ``matrix`` on the C-contiguous 3-plane CHW
    sample ``src``, by the compiled loop (``transform_kernel``). False, with nothing written,
    where the loop is not available or ``matrix`` leaves OpenCV's fixed-point path."""
    kernel = transform_kernel()
    steps = matrix_steps(matrix)
    if kernel is None or steps is None or src.shape[0] != 3 or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        return False
    if src.shape != dst.shape or src.dtype != np.uint8 or dst.dtype != np.uint8:
        raise ValueError(f"transform_planes takes uint8 samples of one shape, got {src.dtype} {src.shape} and {dst.dtype} {dst.shape}")
    kernel(src.reshape(-1), dst.reshape(-1), steps, *_NO_RUNS, 0, 0)
    return True


def _transform_agrees(kernel: Callable[..., None]) -> bool:
    """``kernel`` (``transform_compose``) gives ``cv2.transform``'s bytes on random images of odd
    widths (vector bodies and tails) with random matrices, and composites as ``compose`` does."""
    import cv2

    rng = np.random.default_rng(3)
    for h, w, scale in ((7, 61, 1.0), (16, 33, 3.0), (5, 1029, 0.6), (1, 1, 2.0)):
        img = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
        matrix = (rng.uniform(-1.0, 1.0, (3, 3)) * scale + np.eye(3)).astype(np.float32)
        steps = matrix_steps(matrix)
        if steps is None:
            return False
        want = np.ascontiguousarray(cv2.transform(np.ascontiguousarray(img.transpose(1, 2, 0)), matrix).transpose(2, 0, 1))
        got = np.zeros_like(img)
        kernel(img.reshape(-1), got.reshape(-1), steps, *_NO_RUNS, 0, 0)
        if not np.array_equal(got, want):
            return False
    k = kernels()
    if k is None:
        return False
    img = rng.integers(0, 256, (3, 16, 33), dtype=np.uint8)  # runs at both ends and between
    size = img.shape[1] * img.shape[2]
    starts, stops = np.array([0, 300, size - 2], np.int64), np.array([10, 420, size], np.int64)
    part = np.arange(11, 299, 3, dtype=np.int64)
    alpha = rng.random(part.size, dtype=np.float32)
    flat = img.reshape(-1)
    expect = np.zeros_like(flat)
    kernel(flat, expect, steps, *_NO_RUNS, 0, 0)
    k.compose(flat, expect, *_frozen(starts, stops, *runs_of(part), alpha), 3)
    fused = np.zeros_like(flat)
    kernel(flat, fused, steps, *_frozen(starts, stops, *runs_of(part), alpha), 0, 0)
    hashed = np.zeros_like(flat)
    digest_ok = _hashed_call_agrees(
        flat,
        lambda state_at, update_at: kernel(
            flat, hashed, steps, *_frozen(starts, stops, *runs_of(part), alpha), state_at, update_at
        ),
    )
    return bool(np.array_equal(fused, expect)) and bool(np.array_equal(hashed, expect)) and digest_ok


@lru_cache(maxsize=1)
def transform_kernel() -> Callable[..., None] | None:
    """``perturb.scene._compiled.transform_compose`` (``(src, dst, steps, starts, stops,
    part_starts, part_stops, alpha, state_at, update_at)`` on flat 3-plane uint8 samples, the
    bytes of ``cv2.transform`` then ``compose``), or None where numba is missing or the probe
    against OpenCV disagrees (an OpenCV whose uint8 transform computes otherwise)."""
    try:
        from perturb.scene import _compiled

        kernel: Callable[..., None] = _compiled.transform_compose
        return kernel if _transform_agrees(kernel) else None
    except Exception:  # no numba, or it cannot compile the loop: OpenCV's path
        return None
