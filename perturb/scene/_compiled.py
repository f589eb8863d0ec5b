"""The numba kernels of ``perturb.scene.native`` (imported by it on first use: importing this
module imports numba). Module-level functions, so numba's on-disk cache serves them to every
process after the first."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic


def _typed_lookup_call(
    typingctx: Any, address: Any, target: Any, length: Any, source: Any, table: Any
) -> Any:
    """Call the C function at ``address`` as ``void f(u64 target, u64 length, u64 source, u64
    table)`` (stringzilla's ``sz_lookup``: byte addresses and a length, one register each):
    a direct call, so the kernel's dispatch does not type a ctypes object on every call."""
    sig = types.void(address, target, length, source, table)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        values = [
            context.cast(builder, v, t, types.uint64)
            for v, t in zip(args, signature.args, strict=True)
        ]
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * 4)
        fn = builder.inttoptr(values[0], fnty.as_pointer())
        builder.call(fn, values[1:])
        return context.get_dummy_value()

    return sig, codegen


call_lookup: Any = intrinsic(_typed_lookup_call)


def _typed_update_call(typingctx: Any, address: Any, state: Any, source: Any, length: Any) -> Any:
    """Call the C function at ``address`` as ``int f(u64 state, u64 source, u64 length)``
    (xxHash's ``XXH3_128bits_update``: a state's and the input's addresses and the input's
    length); its error code is dropped (it fails only on a null state or input)."""
    sig = types.void(address, state, source, length)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        values = [
            context.cast(builder, v, t, types.uint64)
            for v, t in zip(args, signature.args, strict=True)
        ]
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(64)] * 3)
        fn = builder.inttoptr(values[0], fnty.as_pointer())
        builder.call(fn, values[1:])
        return context.get_dummy_value()

    return sig, codegen


call_update: Any = intrinsic(_typed_update_call)


def _njit(fn: Any) -> Any:
    """``numba.njit`` without the GIL or bounds checks, kept in numba's on-disk cache where numba
    finds a writable folder for it, else compiled in memory in each process: for ``cache=True``
    numba raises where it finds none (a read-only install whose user has no writable home and
    no ``NUMBA_CACHE_DIR``), which would fail every border-protected op."""
    try:
        return numba.njit(nogil=True, cache=True, boundscheck=False)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
        return numba.njit(nogil=True, cache=False, boundscheck=False)(fn)


magic = np.float32(2.0**23)  # x + 2^23 - 2^23 rounds x in [0, 2^23) half to even, as rint


@_njit
def mix(source: Any, perturbed: Any, alpha: Any) -> Any:  # pragma: no cover - compiled
    """``rint((perturbed - source) * alpha + source)`` in float32, the NumPy path's steps."""
    base = np.float32(source)
    return ((np.float32(perturbed) - base) * alpha + base + magic) - magic


@_njit
def copy_span(src: Any, dst: Any, a: int, b: int) -> None:  # pragma: no cover - compiled
    """``dst[a:b] = src[a:b]``: a loop over views from 0, compiled as a block copy."""
    sv, dv = src[a:b], dst[a:b]
    for j in range(b - a):
        dv[j] = sv[j]


@_njit
def blend_runs(
    src: Any, dst: Any, part_starts: Any, part_stops: Any, alpha: Any, off: int
) -> None:  # pragma: no cover - compiled
    taken = 0  # alpha of the runs before this one
    for r in range(part_starts.size):
        a = off + part_starts[r]
        n = part_stops[r] - part_starts[r]
        sv, dv, av = src[a : a + n], dst[a : a + n], alpha[taken : taken + n]
        for j in range(n):  # contiguous: compiled to vector instructions
            dv[j] = mix(sv[j], dv[j], av[j])
        taken += n


@_njit
def copy_runs(
    src: Any, dst: Any, starts: Any, stops: Any, off: int
) -> None:  # pragma: no cover - compiled
    for r in range(starts.size):
        copy_span(src, dst, off + starts[r], off + stops[r])


@_njit
def compose(
    src: Any,
    dst: Any,
    starts: Any,
    stops: Any,
    part_starts: Any,
    part_stops: Any,
    alpha: Any,
    planes: int,
) -> None:  # pragma: no cover - compiled
    size = src.size // planes
    for c in range(planes):
        copy_runs(src, dst, starts, stops, c * size)
        blend_runs(src, dst, part_starts, part_stops, alpha, c * size)


@_njit
def blend(src: Any, dst: Any, index: Any, alpha: Any) -> None:  # pragma: no cover - compiled
    for k in range(index.size):
        i = index[k]
        dst[i] = mix(src[i], dst[i], alpha[k])


@_njit
def digest_span(update_at: int, state_at: int, address: int, length: int) -> None:  # pragma: no cover - compiled
    """Feed ``length`` bytes at ``address`` to the digest state (``update_at`` 0: no digest)."""
    if update_at != 0:
        call_update(update_at, state_at, address, length)


@_njit
def lookup_compose(
    src: Any,
    dst: Any,
    tables: Any,
    starts: Any,
    stops: Any,
    part_starts: Any,
    part_stops: Any,
    alpha: Any,
    planes: int,
    lookup_at: int,
    state_at: int,
    update_at: int,
) -> None:  # pragma: no cover - compiled
    size = src.size // planes
    s_at, d_at = src.ctypes.data, dst.ctypes.data
    for c in range(planes):
        off = c * size
        t_at = tables[c if tables.shape[0] > 1 else 0].ctypes.data
        pos = 0  # looked up or copied up to here
        for r in range(starts.size):
            lo, hi = starts[r], stops[r]
            if lo > pos:
                call_lookup(lookup_at, d_at + off + pos, lo - pos, s_at + off + pos, t_at)
            copy_span(src, dst, off + lo, off + hi)
            pos = hi
        if pos < size:
            call_lookup(lookup_at, d_at + off + pos, size - pos, s_at + off + pos, t_at)
        blend_runs(src, dst, part_starts, part_stops, alpha, off)  # the soft edge: looked up
        digest_span(update_at, state_at, s_at + off, size)  # while the plane is in cache


@_njit
def transform_span(src: Any, dst: Any, m: Any, size: int, a: int, b: int) -> None:  # pragma: no cover - compiled
    """OpenCV's uint8 3x3 colour transform of the pixels [a, b) of three CHW planes of ``size``:
    ``dst[c] = saturate((sum_k m[c, k] src[k] + 512) >> 10)``, ``m`` the matrix in 1/1024 steps
    (int64, ``rint(matrix * 1024)``): the exact integer arithmetic of ``cv2.transform``'s
    fixed-point path for uint8 (coefficients below 32 in magnitude)."""
    s0, s1, s2 = src[a:b], src[size + a : size + b], src[2 * size + a : 2 * size + b]
    d0, d1, d2 = dst[a:b], dst[size + a : size + b], dst[2 * size + a : 2 * size + b]
    m00, m01, m02 = m[0, 0], m[0, 1], m[0, 2]
    m10, m11, m12 = m[1, 0], m[1, 1], m[1, 2]
    m20, m21, m22 = m[2, 0], m[2, 1], m[2, 2]
    for j in range(b - a):
        r, g, bl = np.int64(s0[j]), np.int64(s1[j]), np.int64(s2[j])
        d0[j] = min(max((m00 * r + m01 * g + m02 * bl + 512) >> 10, 0), 255)
        d1[j] = min(max((m10 * r + m11 * g + m12 * bl + 512) >> 10, 0), 255)
        d2[j] = min(max((m20 * r + m21 * g + m22 * bl + 512) >> 10, 0), 255)


@_njit
def transform_compose(
    src: Any,
    dst: Any,
    m: Any,
    starts: Any,
    stops: Any,
    part_starts: Any,
    part_stops: Any,
    alpha: Any,
    state_at: int,
    update_at: int,
) -> None:  # pragma: no cover - compiled
    """``transform_span`` over a flat 3-plane uint8 sample, composited in the same pass: the
    runs ``starts`` / ``stops`` (flat indices into one plane) copied from ``src`` in every
    plane, the pixels between them transformed, the soft edge blended (no runs: the whole sample
    transformed); ``state_at, update_at`` as in ``lookup_compose`` (0, 0: no digest)."""
    size = src.size // 3
    pos = 0
    for r in range(starts.size):
        lo, hi = starts[r], stops[r]
        if lo > pos:
            transform_span(src, dst, m, size, pos, lo)
        for c in range(3):
            copy_span(src, dst, c * size + lo, c * size + hi)
        pos = hi
    if pos < size:
        transform_span(src, dst, m, size, pos, size)
    for c in range(3):
        blend_runs(src, dst, part_starts, part_stops, alpha, c * size)
    digest_span(update_at, state_at, src.ctypes.data, src.size)
