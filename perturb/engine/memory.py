"""The process's heap for batches of images (glibc): keep freed image-sized buffers for the next
op instead of unmapping them and faulting their pages in again.

By default glibc serves an allocation above its mmap threshold (128 kB, raised to the largest
such block freed, at most 32 MiB) by an mmap of its own and returns freed memory at the top of
the heap beyond its trim threshold (twice the mmap threshold) to the system, so each op's
image-sized temporaries fault their pages in zeroed on every call. ``perturb generate`` sets
this in its workers (``perturb.generate.worker``); a library caller opts in with
``perturb.tune_malloc()`` (it changes the whole process's allocator: a training process
running the torch path on the CPU, or a DataLoader worker's ``worker_init_fn``). Outputs never
depend on it."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
# an image's float32 planes and frames (a 1070x1348 RGB frame: 17 MB) come from the heap, not
# from mmap: glibc's largest mmap threshold (HEAP_MAX_SIZE / 2 on 64-bit)
MMAP_THRESHOLD = 32 << 20
# freed memory the heap keeps for the next op instead of returning it at once (it is handed
# back after each batch: ``release_memory``)
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20
_MALLOC_TUNED = False


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once per process (``find_library`` runs ``ldconfig``); None
    where there is none to load."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def tune_malloc() -> None:
    """Once per process (glibc; elsewhere nothing): keep the freed buffers of one op for the
    next instead of unmapping and re-faulting them. By default an allocation of an image's size
    is an mmap of its own, unmapped when freed, and each of its pages faults in zeroed when next
    allocated: the artifact suite on two frames (2 forked workers, ``/usr/bin/time``) took
    1.95 M page faults and 7 of its 48.5 CPU-seconds in the kernel, with this 0.53 M and 3 of
    43.1 (the round's A/B: ``benchmarks/results/end-to-end-cpu-r9-amd.json``). Outputs do not
    depend on it; ``perturb generate`` still hands the heap back after each batch
    (``release_memory``). The torch path on the CPU at 128x128, B=32
    (``benchmarks/bench_torch_batching.py --tune-malloc``): the ops whose kernels make several
    batch-sized temporaries run up to 2x faster per sample
    (``benchmarks/results/torch-batching-cpu-128-r11-malloc.json``)."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    libc = _libc()
    if libc is None:
        return
    try:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        libc.mallopt(_M_TOP_PAD, TOP_PAD)
    except AttributeError:  # not glibc
        return


def release_memory() -> None:
    """Hand the heap's free pages back to the system after a batch (glibc keeps freed
    arenas of the encoder threads otherwise, and the next batch's budget would not hold)."""
    libc = _libc()
    if libc is None:
        return
    try:
        libc.malloc_trim(0)
    except AttributeError:  # not glibc
        return
