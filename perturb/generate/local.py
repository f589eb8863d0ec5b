"""The local engine of ``perturb generate``: the pending chunks in this process
(``--workers 1``) or on a pool of worker processes, each result committed to the journal
through ``perturb.generate.core.Commit`` as it arrives.

Pool workers are forked where the driver is known to have done no pixel work (``fork=True``:
the ``perturb generate`` command, whose driver only plans from image headers, on Linux, on the
CPU): a forked worker inherits the driver's imports (torch, OpenCV, pyarrow: about 2.5
CPU-seconds a worker when spawned) and starts at once. Elsewhere (a library caller whose process
may have run OpenCV's or OpenMP's thread pools, whose threads a fork does not copy; CUDA, which
a forked child cannot re-initialise; macOS) they are spawned: a fresh interpreter each."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from functools import partial
from multiprocessing import get_context
from multiprocessing.context import BaseContext
from typing import Any

from perturb.generate.core import Commit, Pending
from perturb.generate.lifeline import start_pool_worker
from perturb.generate.progress import pool_ticks
from perturb.generate.worker import (
    ChunkResult,
    ImageJob,
    WorkerConfig,
    process_chunk,
    run_with_ticks,
)


def chunk_job(url: str | None) -> Callable[..., ChunkResult]:
    """The job function: ``process_chunk``, or for outputs at a URL, write to scratch then copy."""
    if url is None:
        return process_chunk
    from perturb.generate.store import publish_chunk

    return partial(publish_chunk, url=url)


def run_local(
    cfg: WorkerConfig,
    workers: int,
    inp: Any,
    batches: list[list[Pending]],
    commit: Commit,
    url: str | None,
    fork: bool = False,
) -> None:
    """Run every chunk of ``batches``: in this process when ``workers`` is 1, else on a pool
    (forked workers when ``fork`` and ``pool_context`` allow it, else spawned). With a local DIR
    each output is committed to the journal by the worker as it is finished (a pool worker to
    its own ``journal-<pid>.jsonl``, see ``perturb.generate.core``)."""
    job = chunk_job(url)
    if url is None:
        state = commit.folder.journal_path.parent
        own = state / ("journal.jsonl" if workers <= 1 else "journal-{pid}.jsonl")
        cfg = replace(cfg, journal=str(own))
    if workers <= 1:
        for chunk, batch in enumerate(batches):
            jobs, n_tasks = commit.read(inp, batch)
            commit.take(
                job(cfg, jobs, on_output=partial(commit.progress.tick, chunk)), n_tasks, chunk
            )
    else:
        ctx = pool_context(cfg.device, fork)
        if ctx.get_start_method() == "fork":
            # the op registry (every op module, SciPy's spatial and linear algebra) imported
            # once here and inherited, instead of imported by each worker at its first op
            import perturb.catalog.ops  # noqa: F401
        _run_pool(cfg, workers, inp, batches, commit, job, ctx)


# chunks in flight per worker, and the fewest chunks per worker a run is cut into (when it has
# fewer): enough that no worker waits while another finishes a large last chunk
IN_FLIGHT = 2
SPREAD = 3


def _pieces(tasks: list[Any], parts: int) -> list[list[Any]]:
    """``tasks`` in ``parts`` consecutive pieces of near-equal size (no empty piece)."""
    parts = max(1, min(parts, len(tasks)))
    size, extra = divmod(len(tasks), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(tasks[start:end])
        start = end
    return out


def spread(batches: list[list[Pending]], workers: int) -> list[list[list[Pending]]]:
    """The run's chunks for a pool of ``workers``: ``batches`` as they are when there are at
    least ``SPREAD`` per worker; else the images dealt into that many chunks, and where there are
    fewer images than that, each image's missing outputs cut into pieces (one image per chunk:
    every piece decodes the image again, a small cost beside its outputs). Each item is one
    image's pieces in a list (a single piece for a whole image or a batch of whole images), so the
    driver reads an image's bytes once for all its pieces. Outputs do not depend on the chunking."""
    target = SPREAD * workers
    if len(batches) >= target:
        return [[batch] for batch in batches]
    images = [pending for batch in batches for pending in batch]
    if len(images) >= target:
        per = -(-len(images) // target)
        return [[images[i : i + per]] for i in range(0, len(images), per)]
    cuts = -(-target // max(1, len(images)))
    return [
        [[(group, file_id, piece)] for piece in _pieces(missing, cuts)]
        for group, file_id, missing in images
    ]


def _image_level(result: ChunkResult) -> ChunkResult:
    """A later piece of a cut image without what belongs to the image rather than to its
    outputs (counted once, with its first piece): the images decoded or failed and the error
    rows of a decode or of the memory budget."""
    return replace(
        result,
        images_ok=0,
        images_failed=0,
        errors=[e for e in result.errors if e["stage"] not in IMAGE_STAGES],
    )


IMAGE_STAGES = ("decode", "memory")


def pool_context(device: str, fork: bool) -> BaseContext:
    """How pool workers start: forked when the caller vouches that the driver ran no pixel work
    (``fork``), on Linux, for a CPU run; else spawned (see the module docstring)."""
    if fork and sys.platform.startswith("linux") and device == "cpu":
        return get_context("fork")
    return get_context("spawn")


def _run_pool(
    cfg: WorkerConfig,
    workers: int,
    inp: Any,
    batches: list[list[Pending]],
    commit: Commit,
    job: Callable[..., ChunkResult],
    ctx: BaseContext,
) -> None:
    """Chunks on ``workers`` processes started by ``ctx`` (ended with the driver), at most
    ``IN_FLIGHT`` per worker, cut finer than ``batches`` when there are too few to keep every
    worker busy (``spread``); the driver reads the images and commits each result as it
    finishes. The progress thread starts after the first submit, which starts the processes (a
    forked worker inherits no driver thread)."""
    with (
        pool_ticks(commit.progress, ctx) as (ticks, start_ticks),
        ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=start_pool_worker,
            initargs=(os.getpid(), ticks),
        ) as pool,
    ):
        in_flight: dict[Future[ChunkResult], tuple[int, int, bool]] = {}
        queue = list(reversed(spread(batches, workers)))
        waiting: list[tuple[list[ImageJob], int, bool]] = []  # read pieces not yet submitted
        chunk = 0
        try:
            while True:
                while (queue or waiting) and len(in_flight) < IN_FLIGHT * workers:
                    if not waiting:
                        waiting = list(reversed(_read(commit, inp, queue.pop())))
                        continue
                    jobs, n_tasks, later = waiting.pop()
                    fut = pool.submit(run_with_ticks, job, cfg, jobs, chunk)
                    in_flight[fut] = (n_tasks, chunk, later)
                    chunk += 1
                    start_ticks()
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for fut in finished:
                    n_tasks, number, later = in_flight.pop(fut)
                    result = fut.result()
                    commit.take(_image_level(result) if later else result, n_tasks, number)
        except (
            BaseException
        ):  # Ctrl-C: no new chunk starts; those under way commit what they finish
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _read(
    commit: Commit, inp: Any, pieces: list[list[Pending]]
) -> list[tuple[list[ImageJob], int, bool]]:
    """The jobs of one item of ``spread``, its bytes read once: (jobs, task count, whether the
    piece is a later piece of a cut image). A single piece is read as it is; the pieces of one
    cut image are read as the whole image and its jobs given each piece's tasks."""
    if len(pieces) == 1:
        jobs, n_tasks = commit.read(inp, pieces[0])
        return [(jobs, n_tasks, False)]
    (group, file_id, _), *_ = (piece[0] for piece in pieces)
    whole = [(group, file_id, [task for piece in pieces for task in piece[0][2]])]
    jobs, _ = commit.read(inp, whole)
    if not jobs:  # unreadable: one error row for the image, its outputs all failed
        return []
    (image,) = jobs
    return [
        ([replace(image, tasks=piece[0][2])], len(piece[0][2]), i > 0)
        for i, piece in enumerate(pieces)
    ]
