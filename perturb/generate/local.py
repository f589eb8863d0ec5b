"""The local engine of ``perturb generate``: the pending chunks in this process
(``--workers 1``) or on a pool of spawned worker processes, each result committed to the
journal through ``perturb.generate.core.Commit`` as it arrives."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from functools import partial
from multiprocessing import get_context
from typing import Any

from perturb.generate.core import Commit, Pending
from perturb.generate.lifeline import start_pool_worker
from perturb.generate.progress import pool_ticks
from perturb.generate.worker import ChunkResult, WorkerConfig, process_chunk, run_with_ticks


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
) -> None:
    """Run every chunk of ``batches``: in this process when ``workers`` is 1, else on a pool.
    With a local DIR each output is committed to the journal by the worker as it is finished
    (a pool worker to its own ``journal-<pid>.jsonl``, see ``perturb.generate.core``)."""
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
        _run_pool(cfg, workers, inp, batches, commit, job)


def _run_pool(
    cfg: WorkerConfig,
    workers: int,
    inp: Any,
    batches: list[list[Pending]],
    commit: Commit,
    job: Callable[..., ChunkResult],
) -> None:
    """Chunks on ``workers`` spawned processes (ended with the driver), at most two in flight
    per worker; the driver reads the images and commits each result as it finishes."""
    ctx = get_context("spawn")
    with (
        pool_ticks(commit.progress, ctx) as ticks,
        ProcessPoolExecutor(
            max_workers=workers,
            mp_context=ctx,
            initializer=start_pool_worker,
            initargs=(os.getpid(), ticks),
        ) as pool,
    ):
        in_flight: dict[Future[ChunkResult], tuple[int, int]] = {}
        queue = list(reversed(list(enumerate(batches))))
        try:
            while True:
                while queue and len(in_flight) < 2 * workers:
                    chunk, batch = queue.pop()
                    jobs, n_tasks = commit.read(inp, batch)
                    fut = pool.submit(run_with_ticks, job, cfg, jobs, chunk)
                    in_flight[fut] = (n_tasks, chunk)
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for fut in finished:
                    commit.take(fut.result(), *in_flight.pop(fut))
        except (
            BaseException
        ):  # Ctrl-C: no new chunk starts; those under way commit what they finish
            pool.shutdown(wait=True, cancel_futures=True)
            raise
