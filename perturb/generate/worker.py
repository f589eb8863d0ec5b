"""The job function: decode a chunk of images, run every missing (op, severity, variant) on it,
encode and write the outputs atomically, return their manifest rows and the errors.

Every engine (in-process or a process pool: ``perturb.generate.local``; Ray Data:
``perturb.generate.ray_engine``) calls ``process_chunk``. A sample's bytes depend only on its
image, its img_id and the suite: never on the chunk, batch, worker, order or process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perturb._version import __version__
from perturb.configs.suites import parse_suite
from perturb.contracts.suite import Suite, Task
from perturb.datasets import composite
from perturb.engine.memory import release_memory, tune_malloc
from perturb.generate.naming import resolve_inside
from perturb.generate.output import (
    encode_bgr,
    encode_problem,
    encoding_json,
    quantize_bgr,
    sha256,
)
from perturb.io.images import (
    ImageDecodeError,
    decode_image_info,
    fsync_path,
    read_header,
    to_tensor,
    write_atomic,
)

OnOutput = Callable[[int], None]  # called with n after n more outputs are written or failed


@dataclass(frozen=True)
class WorkerConfig:
    """What every chunk of one run shares (picklable)."""

    suite: dict[str, Any]
    seed: int
    device: str
    max_pixels: int
    out: str
    threads: int | None = None
    max_memory: int | None = None  # bytes this worker's batches may take (None: no budget)
    # the resume journal this worker commits each output to as it is finished (``{pid}``, ``{host}``:
    # this process's id and host name, for a pool or Ray worker's own file); None: the driver
    # journals each chunk's rows
    journal: str | None = None


@dataclass
class ImageJob:
    """One unique image and the outputs still missing for it."""

    img_id: str
    file_id: str
    data: bytes
    tasks: list[tuple[Task, str]]  # (task, relative path)
    qa_rows: int = 0
    param_key: str | None = None  # sample (study, case) whose images share scalar parameters
    input_sha256: str | None = None  # of ``data``, recorded in each output's manifest row


@dataclass
class ChunkResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    images_ok: int = 0
    images_failed: int = 0
    journaled: bool = False  # ``rows`` are already in the journal (committed by the worker)


@lru_cache(maxsize=4)
def _suite(text: str) -> Suite:
    return parse_suite(json.loads(text), "<suite>")


_THREADS_SET = False


def _set_threads(threads: int | None) -> None:
    global _THREADS_SET
    if threads is None or _THREADS_SET:
        return
    import cv2

    torch.set_num_threads(threads)
    cv2.setNumThreads(threads)
    _THREADS_SET = True


def error_row(job: ImageJob, stage: str, reason: str, task: Task | None = None) -> dict[str, Any]:
    return {
        "img_id": job.img_id,
        "file_id": job.file_id,
        "stage": stage,
        "op": task.op if task else None,
        "severity": task.severity if task else None,
        "variant": task.variant if task else None,
        "qa_rows": job.qa_rows,
        "reason": reason,
    }


@dataclass
class _Decoded:
    job: ImageJob
    arr: np.ndarray  # HWC / HW, uint8 or uint16, as decoded
    orientation: int = 1  # EXIF orientation applied by the decoder
    _x: torch.Tensor | None = None
    _f: np.ndarray | None = None
    _scenes: dict[int, Any] = field(default_factory=dict)  # channels -> perturb.scene.Scene

    @property
    def bit_depth(self) -> int:
        return 16 if self.arr.dtype == np.uint16 else 8

    @property
    def x(self) -> torch.Tensor:
        """CHW float32 in [0, 1]."""
        if self._x is None:
            self._x = to_tensor(self.arr)
        return self._x

    def float_array(self) -> np.ndarray:
        """HWC / HW float32 in [0, 1], the same values as ``x`` (computed once, read-only)."""
        if self._f is None:
            scale = np.float32(65535.0 if self.arr.dtype == np.uint16 else 255.0)
            self._f = self.arr.astype(np.float32) / scale
            self._f.flags.writeable = False
        return self._f

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.arr.shape)

    def scene(self, image: torch.Tensor) -> Any:
        """The scene of this source image as the ops see it (``image``: its CHW float32 tensor,
        gray expanded to RGB for a colour op), analysed once and handed to every op of it."""
        channels = int(image.shape[0])
        found = self._scenes.get(channels)
        if found is None:
            from perturb.scene import Scene

            found = self._scenes[channels] = Scene.of(image)
        return found


def _stacked(
    batch: list[_Decoded], device: torch.device, cache: dict[Any, torch.Tensor]
) -> torch.Tensor:
    """The batch as one BCHW tensor on ``device``, made once per chunk for all its tasks (ops
    never write into their input)."""
    key = tuple(id(d) for d in batch)
    x = cache.get(key)
    if x is None:
        x = cache[key] = to_device([d.x for d in batch], device)
    return x


def _run_task(
    task: Task,
    batch: list[_Decoded],
    suite: Suite,
    seed: int,
    device: torch.device,
    cache: dict[Any, torch.Tensor] | None = None,
) -> tuple[list[np.ndarray], list[dict[str, Any]], int]:
    """Run one task on images of one shape; returns float32 HWC/HW outputs, per-sample
    (key, params, record, op_version) and the channel count."""
    cache = {} if cache is None else cache
    ids = [d.job.img_id for d in batch]
    if task.composite:
        transformed = composite(task.op)  # the dataset's composite, through the registry
        spec = transformed.spec_of(suite.composite_params(task.op))
        height, width = batch[0].arr.shape[:2]
        infos, params = [], []
        for img_id in ids:
            key = transformed.track_key(seed, img_id, task.variant)
            p = transformed.sample_params(key, width, height, spec)
            params.append(p)
            record = {"composite": task.op, "version": transformed.VERSION, "params": p}
            infos.append(
                {
                    "key": f"{key:016x}",
                    "params": p,
                    "record": record,
                    "op_version": transformed.VERSION,
                }
            )
        # upstream works on PIL RGB images and saves RGB JPEGs: a frame whose three channels
        # happen to be equal (decoded as gray) still comes out with three channels
        if device.type == "cpu":
            outs = [
                transformed.transformed_array(d.float_array(), p)
                for d, p in zip(batch, params, strict=True)
            ]
        else:
            outs = _to_arrays(transformed.apply_transformed(_stacked(batch, device, cache), params))
        return [np.repeat(o[..., None], 3, axis=2) if o.ndim == 2 else o for o in outs], infos, 3
    from perturb.catalog.ops import get_op
    from perturb.engine.run import apply

    op = get_op(task.op)
    x = _stacked(batch, device, cache)
    groups = [d.job.param_key or d.job.img_id for d in batch]
    if x.shape[1] not in op.spec.channels and x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1).contiguous()  # gray frame, colour op: treated as RGB
    if x.shape[1] not in op.spec.channels:  # colour image, gray-only op: each channel alike
        out, records = _per_channel(x, task, ids, groups, seed)
    else:
        # each source image's scene, analysed once for all its ops (the engine would analyse
        # it again for each op); the records store the same descriptor either way
        scenes = [d.scene(x[i]) for i, d in enumerate(batch)] if op.spec.protects_border else None
        out, records = apply(
            x,
            task.op,
            task.severity,
            ids,
            seed=seed,
            variant=task.variant,
            param_keys=groups,
            scenes=scenes,
        )
    infos = [
        {"key": r.key, "params": r.params, "record": r.to_dict(), "op_version": r.op_version}
        for r in records
    ]
    return _to_arrays(out), infos, x.shape[1]


def _per_channel(
    x: torch.Tensor, task: Task, ids: list[str], groups: list[str], seed: int
) -> tuple[torch.Tensor, list[Any]]:
    """A 1-channel op on colour images: every channel with the image's key, so the channels
    get the same parameters and fields (a gray image stored as RGB stays gray). One call per
    channel: a sample's output does not depend on its batch, and within a call every image
    needs its own key."""
    from perturb.catalog.ops import get_op
    from perturb.engine.run import apply, scene_kind
    from perturb.scene import Scene

    # one scene for every channel (the first's: e.g. a radiograph's annotations), recorded once
    scenes = (
        [Scene.of(x[i, :1], scene_kind(task.op)) for i in range(x.shape[0])]
        if get_op(task.op).spec.protects_border
        else None
    )
    outs: list[torch.Tensor] = []
    records: list[Any] = []
    for ch in range(x.shape[1]):
        out, records = apply(
            x[:, ch : ch + 1].contiguous(),
            task.op,
            task.severity,
            ids,
            seed=seed,
            variant=task.variant,
            param_keys=groups,
            scenes=scenes,
        )
        outs.append(out)
    firsts = [replace(r, extra={**r.extra, "per_channel": True}) for r in records]
    return torch.cat(outs, dim=1), firsts


def to_device(images: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The decoded batch on ``device``: on CUDA through pinned (page-locked) host memory, so
    the copy is one DMA transfer that does not stage through pageable memory."""
    x = torch.stack(images)
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def _to_arrays(y: torch.Tensor) -> list[np.ndarray]:
    arr = y.detach().cpu().permute(0, 2, 3, 1).numpy()
    return [a[..., 0] if a.shape[-1] == 1 else a for a in arr]


def _write_output(
    d: _Decoded,
    task: Task,
    rel: str,
    y: np.ndarray,
    info: dict[str, Any],
    suite: Suite,
    cfg: WorkerConfig,
    channels: int,
) -> dict[str, Any]:
    img = quantize_bgr(y, suite.output, d.bit_depth)
    data = encode_bgr(img, suite.output)
    target = resolve_inside(Path(cfg.out), rel)
    write_atomic(target, data, sync=False)  # synced with its commit group (_Writer.commit)
    return {
        "img_id": d.job.img_id,
        "suite": suite.suite,
        "op": task.op,
        "severity": task.severity,
        "variant": task.variant,
        "seed": cfg.seed,
        "key": info["key"],
        "params": json.dumps(info["params"], sort_keys=True),
        "risk_tags": json.dumps(suite.risk_tags(task)),
        "path": rel,
        "sha256": sha256(data),
        "width": int(img.shape[1]),
        "height": int(img.shape[0]),
        "perturb_version": __version__,
        "file_id": d.job.file_id,
        "op_version": int(info["op_version"]),
        "channels": channels,
        "bit_depth": 16 if img.dtype == np.uint16 else 8,
        "format": suite.output.format,
        "encoding": encoding_json(suite.output),
        "size_bytes": len(data),
        "device": cfg.device,
        "record": json.dumps(info["record"], sort_keys=True),
        "input_sha256": d.job.input_sha256 or sha256(d.job.data),
        "orientation": d.orientation,
        "_target": str(target),  # popped by _Writer, which fsyncs it
    }


# bytes the outputs waiting for their encode may hold (float32 arrays): a large image's outputs
# are encoded one after another instead of 2 per encoder thread
PENDING_BYTES = 256 << 20

# an output's journal row is written once its file is renamed into place and synced; files are
# synced in groups: after each op's batch of outputs, and whenever this many wait
COMMIT_OUTPUTS = 32


def _host_name() -> str:
    """This machine's name as a file-name part (Ray workers on several nodes share DIR)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


class Journal:
    """The append-only resume journal a worker commits finished outputs to: one JSON row a
    line, each group written with one ``write`` on an O_APPEND descriptor and synced."""

    def __init__(self, template: str) -> None:
        self.path = template.format(pid=os.getpid(), host=_host_name())
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, rows: list[dict[str, Any]]) -> None:
        data = memoryview("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())
        while data:
            data = data[os.write(self.fd, data) :]
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the block runs (on the main thread, where Python delivers
    them), then deliver a held one to the handler that was in place: the block is never cut
    in the middle, so a commit is journaled once or not at all (a Ctrl-C between a group's
    journal write and its bookkeeping journaled the group twice on the retry in ``close``)."""
    numbers = (signal.SIGINT, signal.SIGTERM)
    on_main = threading.current_thread() is threading.main_thread()
    if not on_main or any(signal.getsignal(n) is None for n in numbers):  # None: set from C
        yield
        return
    held: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        held.append((signum, frame))

    previous = {n: signal.signal(n, hold) for n in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for signum, frame in held[:1]:
            was = previous[signal.Signals(signum)]
            if callable(was):
                was(signum, frame)
            elif was == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


class _Writer:
    """Encodes and writes outputs on a thread pool (OpenCV's encoders release the GIL) while
    the ops run on the calling thread; at most ``2 x threads`` outputs wait in memory. Each
    write records its own result on its encoder thread (a Ctrl-C, raised on the calling thread,
    cannot lose one). Finished outputs are committed in groups (after each op's batch, or every
    ``COMMIT_OUTPUTS``): their files and folders fsynced, then their rows appended to
    ``journal`` (the commit point: a re-run adopts them), so a kill loses at most the outputs in
    flight: the op's batch under way and the ``2 x threads`` encodes behind it."""

    def __init__(
        self,
        result: ChunkResult,
        on_output: OnOutput | None,
        threads: int,
        journal: Journal | None = None,
    ) -> None:
        self.result = result
        self.on_output = on_output
        self.journal = journal
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="perturb-encode")
        self.limit = 2 * threads
        self.pending: deque[Future[None]] = deque()
        self.sizes: deque[int] = deque()  # bytes each pending output holds, as ``pending``
        self.submitted = 0
        self.lock = threading.Lock()
        # written (row) or failed (exception), by submission number, recorded by the encoder thread
        self.finished: dict[
            int, tuple[ImageJob, Task, dict[str, Any] | None, Exception | None]
        ] = {}
        self.group: list[tuple[dict[str, Any], Path]] = []  # written, not yet committed
        self.closed = False  # the pool is shut down

    def submit(
        self, job: ImageJob, task: Task, fn: Callable[[], dict[str, Any]], size: int = 0
    ) -> None:
        """Queue one output's encode and write; ``size``: the bytes it holds until written
        (outputs wait while those under way hold ``PENDING_BYTES``, one at least)."""
        while self.pending and (
            len(self.pending) >= self.limit or sum(self.sizes) + size > PENDING_BYTES
        ):
            self._collect()
        self.sizes.append(size)
        self.submitted += 1
        self.pending.append(self.pool.submit(self._write, self.submitted, job, task, fn))

    def _write(
        self, number: int, job: ImageJob, task: Task, fn: Callable[[], dict[str, Any]]
    ) -> None:
        """On an encoder thread: run ``fn`` and record its row or its error."""
        entry: tuple[ImageJob, Task, dict[str, Any] | None, Exception | None]
        try:
            entry = (job, task, fn(), None)
        except Exception as exc:
            entry = (job, task, None, exc)
        with self.lock:
            self.finished[number] = entry

    def error(self, row: dict[str, Any], outputs: int = 1) -> None:
        self.result.errors.append(row)
        if self.on_output is not None and outputs:
            self.on_output(outputs)

    def _take(self) -> None:
        """Move the finished writes (in submission order) into the group and the result; an
        entry leaves ``finished`` as it is taken, with Ctrl-C held, so a stop loses none and
        takes none twice."""
        with self.lock:
            entries = sorted(self.finished.items())
        with _signals_held():  # an entry taken twice would be journaled twice
            for number, (job, task, row, exc) in entries:
                if row is None:
                    self.error(error_row(job, "write", f"{type(exc).__name__}: {exc}", task))
                else:
                    clean = {k: v for k, v in row.items() if k != "_target"}
                    self.group.append((clean, Path(row["_target"])))
                    self.result.rows.append(clean)
                    if self.on_output is not None:
                        self.on_output(1)
                with self.lock:
                    del self.finished[number]
        if len(self.group) >= COMMIT_OUTPUTS:
            self.commit()

    def _collect(self) -> None:
        """Wait for the oldest write under way, then take what is finished."""
        self.pending[0].result()
        self.pending.popleft()
        self.sizes.popleft()
        self._take()

    def poll(self) -> None:
        """After an op's batch: take the outputs already written and commit them."""
        while self.pending and self.pending[0].done():
            self.pending.popleft()
            self.sizes.popleft()
        self._take()
        self.commit()

    def commit(self) -> None:
        """fsync the group's files and their folders, then journal their rows."""
        if not self.group:
            return
        files = [target for _, target in self.group]
        folders = sorted({p.parent for p in files})
        run = map if self.closed else self.pool.map  # the pool is shut down by ``close``
        list(run(fsync_path, [*files, *folders]))
        with _signals_held():
            if self.journal is not None:
                self.journal.append([row for row, _ in self.group])
            self.group = []

    def close(self) -> None:
        """Wait for every write, take and commit them all; a Ctrl-C meanwhile is held until
        the commit is done (then raised), so a stopped run keeps every output it finished."""
        stop: KeyboardInterrupt | None = None
        while True:
            try:
                # every write submitted, even one whose future a Ctrl-C kept from ``pending``
                self.pool.shutdown(wait=True)
                self.closed = True
                self.pending.clear()
                self.sizes.clear()
                self._take()
                self.commit()
                break
            except KeyboardInterrupt as exc:
                stop = exc
        if stop is not None:
            raise stop


def encode_threads(cfg: WorkerConfig) -> int:
    """Encoder threads of a worker: its torch/OpenCV thread budget, else the cores."""
    return max(1, cfg.threads or cpu_count())


def process_chunk(
    cfg: WorkerConfig, jobs: list[ImageJob], on_output: OnOutput | None = None
) -> ChunkResult:
    """Decode ``jobs``' images, run their missing tasks, write the outputs; never raises for a
    bad image or a failing op (those become error rows). ``on_output(n)`` is called (on this
    thread) each time n more of the jobs' tasks are done, written or failed."""
    _set_threads(cfg.threads)
    tune_malloc()
    suite = _suite(json.dumps(cfg.suite, sort_keys=True))
    device = torch.device(cfg.device)
    result = ChunkResult(journaled=cfg.journal is not None)
    journal = None if cfg.journal is None else Journal(cfg.journal)
    writer = _Writer(result, on_output, encode_threads(cfg), journal)
    try:
        for part in _memory_parts(jobs, cfg, suite, writer, result):
            _process_part(part, cfg, suite, device, writer, result)
            writer.poll()
            release_memory()
    finally:
        try:
            writer.close()
        finally:
            if journal is not None:
                journal.close()
    return result


# bytes a sample takes while its ops run, per pixel of an RGB image: the decoded frame, its
# float32 tensor and array, an op's intermediates and output, the quantized copy and the encode
# (measured on 65000x90 JPEGs through gaussian_noise, defocus_blur and brightness: 113 bytes a
# pixel for the first image, up to 176 as a run goes on; the process's libraries, ~0.3 GB, are
# not in it: benchmarks/results/reliability-cpu.json)
MEMORY_PER_PIXEL = 128


def footprint(width: int, height: int) -> int:
    """The bytes one image of ``width`` x ``height`` is budgeted at while it is processed."""
    return MEMORY_PER_PIXEL * width * height


def _memory_parts(
    jobs: list[ImageJob], cfg: WorkerConfig, suite: Suite, writer: _Writer, result: ChunkResult
) -> list[list[ImageJob]]:
    """``jobs`` cut into batches whose images fit ``cfg.max_memory`` together (sizes from the
    headers, before any decode): batches by pixels, not by count. An image that cannot fit alone
    becomes an error row naming the budget; an output the suite's encoder cannot write at the
    image's size is an error row at once (nothing decoded or perturbed for it). Images whose
    header cannot be read or is above --max-pixels take no room (their decode reports why)."""
    parts: list[list[ImageJob]] = [[]]
    used = 0
    for job in jobs:
        try:
            header = read_header(
                job.data, source=f"img_id {job.img_id!r}", max_pixels=cfg.max_pixels
            )
            width, height = header.width, header.height
        except ImageDecodeError:
            width = height = 0
        need = 0
        if 0 < width * height <= cfg.max_pixels:  # else its decode refuses it and says why
            writable = _writable(job, width, height, suite, writer)
            if job.tasks and not writable.tasks:  # every output refused: nothing to decode
                result.images_failed += 1
                continue
            job = writable
            need = footprint(width, height)
        if cfg.max_memory is not None and need > cfg.max_memory:
            writer.error(
                error_row(
                    job,
                    "memory",
                    f"img_id {job.img_id!r}: {width}x{height} needs about "
                    f"{need / 1e9:.1f} GB to perturb, above the memory budget of "
                    f"{cfg.max_memory / 1e9:.1f} GB per worker (--max-memory); raise --max-memory, "
                    "use fewer --workers, or shrink the image",
                ),
                len(job.tasks),
            )
            result.images_failed += 1
            continue
        if cfg.max_memory is not None and used + need > cfg.max_memory and parts[-1]:
            parts.append([])
            used = 0
        parts[-1].append(job)
        used += need
    return [p for p in parts if p]


def _writable(job: ImageJob, width: int, height: int, suite: Suite, writer: _Writer) -> ImageJob:
    """``job`` without the tasks whose output (the image's size: every op keeps it; a
    composite's size is known only once it ran) the suite's encoder cannot write; each of them
    is a ``write`` error row naming the limit."""
    problem = encode_problem(width, height, suite.output)
    if problem is None:
        return job
    kept = [(task, rel) for task, rel in job.tasks if task.composite]
    for task, _ in job.tasks:
        if not task.composite:
            writer.error(error_row(job, "write", f"img_id {job.img_id!r}: {problem}", task))
    return replace(job, tasks=kept)


def _process_part(
    jobs: list[ImageJob],
    cfg: WorkerConfig,
    suite: Suite,
    device: torch.device,
    writer: _Writer,
    result: ChunkResult,
) -> None:
    """Decode one batch of images and run every missing task on it."""
    decoded: list[_Decoded] = []
    for job in jobs:
        try:
            arr, orientation = decode_image_info(
                job.data, max_pixels=cfg.max_pixels, source=f"img_id {job.img_id!r}"
            )
            if min(arr.shape[:2]) < 2:
                raise ImageDecodeError(
                    f"img_id {job.img_id!r}: {arr.shape[1]}x{arr.shape[0]} is too small (at least 2x2)"
                )
        except ImageDecodeError as exc:
            writer.error(error_row(job, "decode", str(exc)), len(job.tasks))
            result.images_failed += 1
            continue
        decoded.append(_Decoded(job, arr, orientation))
        result.images_ok += 1
    # group by task, then by shape, keeping a deterministic order
    by_task: dict[Task, list[tuple[_Decoded, str]]] = defaultdict(list)
    for d in decoded:
        for task, rel in d.job.tasks:
            by_task[task].append((d, rel))
    cache: dict[Any, torch.Tensor] = {}
    for task, items in by_task.items():
        by_shape: dict[tuple[int, ...], list[tuple[_Decoded, str]]] = defaultdict(list)
        for d, rel in items:
            by_shape[d.shape].append((d, rel))
        for group in by_shape.values():
            _run_group(task, group, suite, cfg, device, writer, cache)
            writer.poll()


def _run_group(
    task: Task,
    group: list[tuple[_Decoded, str]],
    suite: Suite,
    cfg: WorkerConfig,
    device: torch.device,
    writer: _Writer,
    cache: dict[Any, torch.Tensor],
) -> None:
    try:
        out, infos, channels = _run_task(
            task, [d for d, _ in group], suite, cfg.seed, device, cache
        )
    except Exception as exc:
        if len(group) > 1:  # find the sample that fails: the others still get their outputs
            for item in group:
                _run_group(task, [item], suite, cfg, device, writer, cache)
            return
        writer.error(error_row(group[0][0].job, "perturb", f"{type(exc).__name__}: {exc}", task))
        return
    for (d, rel), y, info in zip(group, out, infos, strict=True):
        writer.submit(
            d.job,
            task,
            partial(_write_output, d, task, rel, y, info, suite, cfg, channels),
            y.nbytes,
        )


_TICKS: Any = None  # a worker process's queue to the driver's progress bar


def init_ticks(queue: Any) -> None:
    """Process-pool initializer: per-output progress goes to ``queue`` as (chunk, n)."""
    global _TICKS
    _TICKS = queue


def run_with_ticks(
    job: Callable[..., ChunkResult], cfg: WorkerConfig, jobs: list[ImageJob], chunk: int
) -> ChunkResult:
    """``job(cfg, jobs)`` in a pool worker, reporting each output to the driver's queue."""
    queue = _TICKS
    return job(cfg, jobs, on_output=None if queue is None else partial(_tick, queue, chunk))


def _tick(queue: Any, chunk: int, n: int) -> None:
    queue.put((chunk, n))


def default_threads(workers: int) -> int | None:
    """Threads per worker process: one when several processes share the cores."""
    return 1 if workers > 1 else None


def cpu_count() -> int:
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
