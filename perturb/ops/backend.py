"""Per-device dispatch: OpenCV/NumPy kernels on CPU, torch kernels on CUDA.

Both paths of an op agree within 1/255. ``use_backend("torch")`` forces the torch path on CPU
too (tests use it to check the CUDA code path against the OpenCV one without a GPU).

CPU fast paths
--------------
An op may register a per-sample host function with ``register_cpu(name)``:
``fn(src, dst, params, key)`` reads one sample ``src`` (CHW NumPy, uint8, uint16 or float32 in
[0, 1]), writes ``dst`` (same shape and dtype) and gets that sample's parameters (``params[name]``
is the sample's row of the collated float32 parameters) and key. ``dtypes`` names the sample
dtypes ``fn`` reads directly (default uint8 and float32). The engine runs it through ``run_cpu``
on the ``opencv`` backend: a batch of a dtype it reads stays in it end to end (lookup tables,
8-bit codecs and filters); a uint16 batch for a path that does not read uint16 goes through float32
one sample at a time (``x / 65535`` in, rounded back), as the torch path converts it; a dtype
the path does not take at all (e.g. float32 for a lookup-table path) runs the torch kernel.

A sample's output is computed from that sample alone, by the same sequence of calls whatever
the batch, so it cannot depend on batch size, position, order or on how many samples run at
once. Samples run on a small thread pool (OpenCV and NumPy release the GIL). While a batch
runs, OpenCV's own threading is switched off (``cv2.setNumThreads(1)``, restored afterwards;
in a DataLoader worker set once, at first use):
the two levels would oversubscribe the cores, and a single-threaded OpenCV call computes each
element the same way every time, so outputs cannot depend on OpenCV's thread count either.

Fork safety: a forked child (a DataLoader worker) resets the pool, locks and counters
(``os.register_at_fork``) and never reconfigures OpenCV's thread pool, which it inherited from
the parent without the threads (``cv2.setNumThreads`` there crashes the child).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import cv2
import numpy as np
import torch

from perturb.ops.composite import compose_numpy, extend_numpy  # endoscopy or radiograph scene
from perturb.registry import Registry
from perturb.scene.radiograph import is_radiograph, lead_mask

if TYPE_CHECKING:
    from perturb.ops.kernels import Shadow

R = TypeVar("R")
Backend = Literal["auto", "opencv", "torch"]
_BACKEND: contextvars.ContextVar[Backend] = contextvars.ContextVar(
    "perturb_backend", default="auto"
)

CpuFn = Callable[..., None]  # fn(src, dst, params, key) or fn(src, dst, params, key, scene=...)
DEFAULT_DTYPES: tuple[type, ...] = (np.uint8, np.float32)
_DEFAULT_DTYPE_SET = frozenset(np.dtype(d) for d in DEFAULT_DTYPES)
_TOPS = {np.dtype(np.uint8): 255, np.dtype(np.uint16): 65535}


@contextlib.contextmanager
def use_backend(backend: Backend) -> Iterator[None]:
    if backend not in ("auto", "opencv", "torch"):
        raise ValueError(f"backend must be 'auto', 'opencv' or 'torch', not {backend!r}")
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def resolve(device: torch.device) -> Literal["opencv", "torch"]:
    """The backend that runs on ``device`` under the current setting."""
    choice = _BACKEND.get()
    if device.type != "cpu":
        return "torch"
    return "torch" if choice == "torch" else "opencv"


def opencv_path(x: torch.Tensor) -> bool:
    return resolve(x.device) == "opencv"


def by_path(x: torch.Tensor, host: Callable[[], R], device: Callable[[], R]) -> R:
    """``host()`` where ``x`` takes the OpenCV/NumPy path, else ``device()`` (the torch path):
    the one place a kernel with two implementations is dispatched."""
    return host() if opencv_path(x) else device()


def to_hwc(x: torch.Tensor) -> list:
    """Per-sample contiguous HWC (or HW for one channel) float32 NumPy views of a CPU batch."""
    arr = x.detach().permute(0, 2, 3, 1).contiguous().numpy()
    return [a[..., 0] if a.shape[-1] == 1 else a for a in arr]


def from_hwc(images: list, like: torch.Tensor) -> torch.Tensor:
    stacked = np.stack([a if a.ndim == 3 else a[..., None] for a in images])
    return torch.from_numpy(stacked).permute(0, 3, 1, 2).contiguous().to(like.dtype)


def per_sample_hwc(
    x: torch.Tensor,
    host_fn: Callable[[np.ndarray, Any], np.ndarray],
    items: Sequence[Any],
    torch_fn: Callable[[torch.Tensor, Sequence[Any]], torch.Tensor],
) -> torch.Tensor:
    """A batch function with an OpenCV and a torch path (not an op: ops' paths are picked by
    the engine through ``cpu_path``): on the ``opencv`` backend ``host_fn(image, item)`` on
    each sample as an HWC float32 NumPy image with its item of ``items``, else
    ``torch_fn(x, items)``."""
    if not opencv_path(x):
        return torch_fn(x, items)
    images = to_hwc(x)
    return from_hwc([host_fn(img, item) for img, item in zip(images, items, strict=True)], x)


# ---------------------------------------------------------------------------------------------
# Registry of per-sample CPU fast paths


@dataclass(frozen=True)
class CpuPath:
    """An op's per-sample CPU fast path ``fn(src, dst, params, key)``, the sample dtypes it
    reads directly, and whether it also takes ``scene=``."""

    fn: CpuFn
    dtypes: frozenset[np.dtype]
    uses_scene: bool = False


CPU_PATHS: Registry[CpuPath] = Registry("CPU path")


def register_cpu(
    name: str,
    dtypes: Sequence[type] = DEFAULT_DTYPES,
    *,
    uses_scene: bool = False,
) -> Callable[[CpuFn], CpuFn]:
    """Register ``fn(src, dst, params, key)`` as the CPU fast path of op ``name``; ``dtypes``
    are the sample dtypes it reads directly. ``uses_scene``: ``fn`` also takes ``scene=`` (the
    sample's ``perturb.scene.Scene`` or None). The engine runs ``fn`` and composites after it."""

    def decorator(fn: CpuFn) -> CpuFn:
        CPU_PATHS.add(name, CpuPath(fn, frozenset(np.dtype(d) for d in dtypes), uses_scene))
        return fn

    return decorator


def cpu_uses_scene(name: str) -> bool:
    return name in CPU_PATHS and CPU_PATHS.get(name).uses_scene


def cpu_path(name: str, dtype: torch.dtype) -> tuple[CpuFn, frozenset[np.dtype]] | None:
    """The fast path of ``name`` and the dtypes it reads if it takes a ``dtype`` batch (uint16
    also through float32), else None."""
    if name not in CPU_PATHS:
        return None
    path = CPU_PATHS.get(name)
    reads = path.dtypes
    want = np.dtype(_NUMPY_OF[dtype])
    if want in reads or (want == np.uint16 and np.dtype(np.float32) in reads):
        return path.fn, reads
    return None


_NUMPY_OF = {torch.uint8: np.uint8, torch.uint16: np.uint16, torch.float32: np.float32}


@lru_cache(maxsize=4)
def levels(dtype: np.dtype) -> np.ndarray:
    """float32 value of every level of an integer dtype, as the engine converts a batch
    (``x.to(float32) / 255`` or ``/ 65535``); read-only."""
    top = _TOPS[np.dtype(dtype)]
    table = (torch.arange(top + 1, dtype=torch.float32) / float(top)).numpy()
    table.flags.writeable = False
    return table


def load_float(src: np.ndarray) -> np.ndarray:
    """A sample as float32 in [0, 1] (integer levels through ``levels``)."""
    if src.dtype == np.float32:
        return src
    if (
        src.dtype == np.uint8 and src.ndim >= 2 and src.flags.c_contiguous
    ):  # the same table, read by OpenCV
        flat = src.reshape(-1, src.shape[-1])
        return np.asarray(cv2.LUT(flat, levels(src.dtype)), dtype=np.float32).reshape(src.shape)
    return np.take(levels(src.dtype), src)


def store_float(res: np.ndarray, dst: np.ndarray) -> None:
    """Write a float32 result in [0, 1] to ``dst`` in its dtype, rounded as the engine rounds
    (``round(x * top)`` half to even, clipped)."""
    if dst.dtype == np.float32:
        np.copyto(dst, res)
        return
    if (
        dst.dtype == np.uint8
        and res.dtype == np.float32
        and res.shape == dst.shape
        and res.ndim >= 2
        and dst.flags.c_contiguous
    ):  # two passes: negatives to 0, then OpenCV's float32 255 x, rounded half to even, saturated
        width = dst.shape[-1]
        positive = cv2.max(np.ascontiguousarray(res).reshape(-1, width), 0.0)  # type: ignore[call-overload]
        cv2.convertScaleAbs(positive, dst=dst.reshape(-1, width), alpha=255.0)
        return
    top = _TOPS[dst.dtype]
    scaled = res * np.float32(top)
    np.rint(scaled, out=scaled)
    np.clip(scaled, 0, top, out=scaled)
    np.copyto(dst, scaled, casting="unsafe")


# ---------------------------------------------------------------------------------------------
# Running per-sample functions over a batch

_CPUS = os.cpu_count() or 1
_POOL_LOCK = threading.Lock()
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_CV2_LOCK = threading.Lock()
_CV2_USERS = 0
_CV2_SAVED = 1
# False in a forked child: OpenCV's thread pool was copied from the parent without its threads,
# and reconfiguring it there (``cv2.setNumThreads``) crashes or hangs the child
_CV2_OWN_PROCESS = True
# True once a (spawned) DataLoader worker has set OpenCV to one thread for the rest of its life
_CV2_WORKER_SET = False


def _in_dataloader_worker() -> bool:
    """Whether this process is a torch DataLoader worker (its torch runs one thread; nothing
    else in it needs OpenCV's threads, so ``_serial_opencv`` sets them once, not per batch)."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) starts with no worker threads: the pool, its
    locks (possibly held by a parent thread at the fork) and the OpenCV user count are reset,
    and OpenCV's thread setting is left as the child inherited it."""
    global _POOL, _POOL_LOCK, _CV2_LOCK, _CV2_USERS, _CV2_OWN_PROCESS
    _POOL = None
    _POOL_LOCK = threading.Lock()
    _CV2_LOCK = threading.Lock()
    _CV2_USERS = 0
    _CV2_OWN_PROCESS = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _pool() -> ThreadPoolExecutor:
    """The module's worker pool (made on first use; a forked child makes its own)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (
                os.getpid(),
                ThreadPoolExecutor(max_workers=_CPUS, thread_name_prefix="perturb"),
            )
        return _POOL[1]


def workers_for(n: int) -> int:
    """How many samples run at once: at most the batch and torch's intra-op thread count (a
    DataLoader worker, which sets torch to one thread, runs its samples inline)."""
    return max(1, min(n, torch.get_num_threads(), _CPUS))


@contextlib.contextmanager
def _serial_opencv() -> Iterator[None]:
    """OpenCV single-threaded while our pool runs (reference-counted across callers; each
    ``cv2.setNumThreads`` costs milliseconds where the count changes). In a DataLoader worker
    it is set to one thread once, at first use, and left so. In a forked child OpenCV's setting
    is not touched (see ``_after_fork_in_child``): its calls run as the parent configured them,
    which gives the same bytes (OpenCV splits work by rows)."""
    global _CV2_USERS, _CV2_SAVED, _CV2_WORKER_SET
    if not _CV2_OWN_PROCESS or _CV2_WORKER_SET:
        yield
        return
    if _in_dataloader_worker():  # the process is ours: one thread for good, set once
        with _CV2_LOCK:
            if not _CV2_WORKER_SET:
                if cv2.getNumThreads() != 1:
                    cv2.setNumThreads(1)
                _CV2_WORKER_SET = True
        yield
        return
    with _CV2_LOCK:
        if _CV2_USERS == 0:
            _CV2_SAVED = cv2.getNumThreads()
            cv2.setNumThreads(1)
        _CV2_USERS += 1
    try:
        yield
    finally:
        with _CV2_LOCK:
            _CV2_USERS -= 1
            if _CV2_USERS == 0:
                cv2.setNumThreads(_CV2_SAVED)


def map_samples(work: Callable[[int], None], n: int) -> None:
    """Run ``work(i)`` for i in 0..n-1 on up to ``workers_for(n)`` threads."""
    k = workers_for(n)
    if k == 1:
        with _serial_opencv():
            for i in range(n):
                work(i)
        return
    lock = threading.Lock()
    indices = iter(range(n))

    def drain() -> None:
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return
            work(i)

    with _serial_opencv():
        futures: list[Future[None]] = [_pool().submit(drain) for _ in range(k)]
        for f in futures:
            f.result()


def _via_float32(fn: CpuFn) -> CpuFn:
    """``fn`` (float32 samples) on a uint16 sample: converted in and rounded back with the
    engine's own torch operations, so the result is the one of a float32 batch."""

    def run(
        src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int, **kw: Any
    ) -> None:
        x = torch.from_numpy(src).to(torch.float32) / 65535.0
        out = torch.empty_like(x)
        fn(x.numpy(), out.numpy(), p, key, **kw)
        dst[...] = (out * 65535.0).round_().clamp_(0, 65535).to(torch.uint16).numpy()

    return run


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A per-thread buffer of ``shape`` and ``dtype`` (reused: contents undefined)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape != shape or buf.dtype != dtype:
        buf = np.empty(shape, dtype)
        _SCRATCH.buf = buf
    return buf


def run_cpu(
    fn: CpuFn,
    x: torch.Tensor,
    params: dict[str, torch.Tensor],
    keys: Sequence[int],
    scenes: Sequence[Any | None],
    dtypes: Collection[np.dtype] = _DEFAULT_DTYPE_SET,
    uses_scene: bool = False,
    kernel_scenes: Sequence[Any | None] | None = None,
    extend: bool = False,
    rows: Sequence[int] | None = None,
    out: torch.Tensor | None = None,
    shadow: Shadow | None = None,
) -> torch.Tensor:
    """Run a registered CPU path over a uint8, uint16 or float32 CPU batch (BCHW); same dtype
    out. ``dtypes`` are the dtypes ``fn`` reads; a uint16 batch otherwise goes through float32
    per sample. ``scenes`` (one ``perturb.scene.Scene`` or None per sample): where given, the
    result is composited back as the tissue layer (field of view, under the overlays).
    ``kernel_scenes`` (default ``scenes``): what a ``uses_scene`` path receives. ``extend``
    (spatial ops): ``fn`` reads each sample that has a scene in ``scenes`` with its surround and
    overlays replaced by a smooth extension of its tissue (``extend_numpy``, in a per-thread
    scratch buffer), so its PSF does not pull them into the field's edge.

    ``rows`` and ``out``: sample i of the call (its parameters, key and scene) is the row
    ``rows[i]`` of ``x``, and its result is written to the row ``rows[i]`` of ``out`` (a
    contiguous CPU batch like ``x`` that shares no memory with it), which is returned; the
    other rows of ``out`` are left as they are. Each sample is computed exactly as in a batch
    of its own rows. ``shadow`` (the op's ``KernelEntry.shadow``): where a radiograph's lead
    marker lies in the share of the beam the op stopped, it is not pasted back
    (``perturb.scene.radiograph.compose_numpy``)."""
    given = scenes if kernel_scenes is None else kernel_scenes
    if x.dtype not in _NUMPY_OF:
        raise TypeError(f"CPU fast paths take uint8, uint16 or float32 batches, got {x.dtype}")
    src = x.detach().contiguous().numpy()
    if (rows is None) != (out is None):
        raise ValueError("rows and out go together")
    if src.dtype not in dtypes:
        if src.dtype != np.uint16 or np.dtype(np.float32) not in dtypes:
            raise TypeError(
                f"this CPU path takes {sorted(str(d) for d in dtypes)} batches, got {src.dtype}"
            )
        fn = _via_float32(fn)
    if out is None:
        dst = np.empty_like(src)
        at: Sequence[int] = range(src.shape[0])
    else:
        if out.dtype != x.dtype or out.shape[1:] != x.shape[1:] or not out.is_contiguous():
            raise ValueError("out must be a contiguous batch of x's dtype and image shape")
        dst = out.detach().numpy()
        if np.may_share_memory(src, dst):
            raise ValueError("out must not share memory with x")
        assert rows is not None
        at = list(rows)
    host = {name: value.detach().cpu().numpy() for name, value in params.items()}

    def work(i: int) -> None:
        p = {name: value[i] for name, value in host.items()}
        row = at[i]
        clean = src[row]
        sample = clean
        scene = scenes[i]
        if extend and scene is not None:
            sample = _scratch(sample.shape, sample.dtype)
            extend_numpy(clean, sample, scene.descriptor, getattr(scene, "key", None))
        if uses_scene:
            fn(sample, dst[row], p, int(keys[i]), scene=given[i])
        else:
            fn(sample, dst[row], p, int(keys[i]))
        if scene is not None:
            key = getattr(scene, "key", None)
            stopped = None
            if (
                shadow is not None
                and is_radiograph(scene.descriptor)
                and lead_mask(scene.descriptor, key).any()
            ):
                one = {name: torch.from_numpy(np.atleast_1d(v)) for name, v in p.items()}
                stopped = shadow(torch.from_numpy(clean)[None], one)[0, 0].numpy()
            compose_numpy(clean, dst[row], scene.descriptor, key, stopped)

    map_samples(work, len(at))
    return torch.from_numpy(dst) if out is None else out
