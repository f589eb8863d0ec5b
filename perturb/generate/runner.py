"""``perturb generate``: suite x dataset -> images, manifest.parquet, errors.jsonl, dataset/.

The driver, and the top of a flow that runs one way: it checks the options, opens the input,
plans the suite once into jobs (``perturb.generate.plan.plan_jobs``), picks the engine
(``perturb.generate.local`` or ``perturb.generate.ray_engine``) and hands plan and engine down
to ``perturb.generate.core.execute``, which prepares DIR, resumes, runs the engine, whose
workers make the outputs, and writes the manifest, errors.jsonl, dataset/ and summary.json
(the layout of DIR and the resume rules are described there); only the summary comes back. A
run refuses a DIR made with other settings (suite, seed, input, --limit, --id-from), a DIR that
is not a perturb output, and a DIR inside a folder input.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from perturb.contracts.suite import Suite
from perturb.generate.core import (
    CACHE,
    MAX_SEED,
    STATE_DIR,
    Commit,
    Engine,
    Pending,
    RunError,
    RunOptions,
    RunSummary,
    execute,
    output_path,
    output_url,
)
from perturb.generate.plan import open_run_input, plan_jobs
from perturb.generate.shard import Shard, ShardError, parse_shard
from perturb.generate.worker import WorkerConfig


def _resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RunError("--device cuda: no CUDA GPU is available here; use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise RunError(f"--device must be auto, cpu or cuda, got {name!r}")
    return name


def generate(suite: Suite, options: RunOptions) -> RunSummary:
    """Run ``suite`` over the input and write DIR; returns the summary. Raises RunError for
    problems that stop the run before it starts."""
    if options.engine not in ("local", "ray"):
        raise RunError(f"--engine must be local or ray, got {options.engine!r}")
    device = _resolve_device(options.device) if options.engine == "local" else ""
    _check_numbers(options)
    try:
        shard = options.shard if isinstance(options.shard, Shard) else parse_shard(options.shard)
    except ShardError as exc:
        raise RunError(str(exc)) from None
    url = output_url(options.out)
    out = None if url else output_path(options.out)
    seed = suite.seed if options.seed is None else options.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise RunError(f"--seed must be an integer from 0 to 2**63-1 = {MAX_SEED}, got {seed}")
    if options.id_from not in ("stem", "path"):
        raise RunError(f"--id-from must be stem or path, got {options.id_from!r}")
    if out is not None:
        _refuse_out_inside_input(out, options.dataset)
        if not options.dry_run:
            check_out_writable(out)
    if options.dry_run:  # the plan, measured on the first image; nothing written in DIR
        return _dry_run(suite, options, seed, shard, out)
    if options.cache_dir is None:
        from perturb.generate.store import staging_folder

        state = (out if out is not None else staging_folder(url or "")) / STATE_DIR
        options = replace(options, cache_dir=str(state / CACHE))
    inp = _open_input(suite, options)
    if options.engine == "local":
        return execute(
            plan_jobs(suite, inp, options, seed, device, shard), options, _engine(options)
        )
    from perturb.generate.ray_engine import connect, disconnect

    try:
        device = connect(options)
        return execute(
            plan_jobs(suite, inp, options, seed, device, shard), options, _engine(options)
        )
    finally:
        disconnect()


def _check_numbers(options: RunOptions) -> None:
    """The numeric options, each with its valid range."""
    if options.batch_size < 1:
        raise RunError(f"--batch-size must be at least 1, got {options.batch_size}")
    if options.workers < 1:
        raise RunError(f"--workers must be at least 1, got {options.workers}")
    if options.limit is not None and options.limit < 0:
        raise RunError(f"--limit must be non-negative, got {options.limit}")
    if options.max_pixels < 4:
        raise RunError(f"--max-pixels must be at least 4, got {options.max_pixels}")
    if options.max_memory is not None and options.max_memory < 1:
        raise RunError(f"--max-memory must be a positive size (e.g. 8G), got {options.max_memory}")
    if options.max_retries < 0:
        raise RunError(f"--max-retries must be non-negative, got {options.max_retries}")
    if options.stall_timeout is not None and not options.stall_timeout >= 0:
        raise RunError(
            f"--stall-timeout must be a number of seconds >= 0 (0 turns the guard off), "
            f"got {options.stall_timeout}"
        )


def _open_input(suite: Suite, options: RunOptions) -> Any:
    """The run's input, its ids checked (colliding derived ids refused) before anything is
    written, and a modality column where the suite picks ops by each image's modality."""
    from perturb.io.datasets import DatasetError

    try:
        inp = open_run_input(
            suite, options.dataset, options.split, options.image_column, options.builtin_images,
            options.images, id_from=options.id_from, cache_dir=options.cache_dir,
        )  # fmt: skip
        inp.row_ids()
    except DatasetError as exc:
        raise RunError(str(exc)) from None
    if suite.per_image_modality and inp.modality_column is None:
        from perturb.datasets import DATASETS

        per_image = [n for n, e in DATASETS.items() if e.adapter and e.modality == "any"]
        raise RunError(
            f"suite {suite.suite} picks ops by each image's modality (modality: from_image) but "
            f"{inp.source} has no modality column; use a dataset adapter that gives one "
            f"(input.adapter: {' or '.join(per_image) or 'one with a modality column'}) or name "
            "a modality in the suite's jobs"
        )
    return inp


def _dry_run(
    suite: Suite, options: RunOptions, seed: int, shard: Shard | None, out: Path | None
) -> RunSummary:
    """``--dry-run``: the plan (``perturb.generate.plan``), the input cached in a temporary
    folder unless --cache-dir names one; nothing written in DIR."""
    from perturb.generate.plan import plan_run

    with tempfile.TemporaryDirectory(prefix="perturb-dry-run-cache-") as cache:
        if options.cache_dir is None:
            options = replace(options, cache_dir=cache)
        inp = _open_input(suite, options)
        device = _resolve_device(options.device if options.engine == "local" else "cpu")
        plan = plan_run(suite, inp, options, seed, device, shard, out)
    return RunSummary(
        suite=suite.suite,
        input=inp.source,
        device=device,
        engine=options.engine,
        images=plan.images,
        images_selected=plan.images_selected,
        outputs_expected=plan.outputs,
        estimated_bytes=plan.estimated_bytes,
        plan=plan.to_dict(),
    )


def check_out_writable(out: Path) -> None:
    """--out is a folder (or can be made) that this user can write in, else a RunError naming
    the real cause before the input is opened (whose cache lives in DIR). Probes with a
    temporary file in the nearest existing folder, removed at once (permission bits do not
    tell for root or for a read-only mount)."""
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file, not a folder; choose a folder path (it is created)")
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RunError(
            f"--out {out}: {existing} is a file, so no folder can be made under it; choose another --out"
        )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise RunError(
            f"--out {out}: cannot write in {existing} ({exc.strerror or exc}); choose a folder you "
            "can write to (or fix its permissions, or remount it read-write)"
        ) from None


def _refuse_out_inside_input(out: Path, dataset: str | None) -> None:
    """A DIR inside a folder input would be read back as input images on the next run."""
    if dataset is None or output_url(dataset) is not None:
        return
    source = Path(dataset).expanduser()
    if not source.is_dir():
        return
    src, target = source.resolve(), out.expanduser().resolve()
    if target == src or src in target.parents:
        raise RunError(
            f"--out {out} is inside the input folder {dataset}: its images would be read as input "
            "on the next run; choose an --out outside the input folder"
        )


def _engine(options: RunOptions) -> Engine:
    """The engine ``options`` ask for, as ``execute`` calls it."""
    return partial(_run_ray if options.engine == "ray" else _run_local, options)


def _run_local(
    options: RunOptions, cfg: WorkerConfig, inp: Any, batches: list[list[Pending]], commit: Commit
) -> None:
    """The local engine: in this process or on a pool of ``options.workers`` processes."""
    from perturb.generate.local import run_local

    run_local(
        cfg, options.workers, inp, batches, commit, commit.folder.url, fork=options.fork_workers
    )


def _run_ray(
    options: RunOptions, cfg: WorkerConfig, inp: Any, batches: list[list[Pending]], commit: Commit
) -> None:
    """The Ray Data engine; its losses, retries and stalls go to the summary."""
    from perturb.generate.ray_engine import run_ray

    url = commit.folder.url
    if url is None:  # each Ray worker commits its outputs to its own journal as it finishes them
        journal = commit.folder.journal_path.parent / "journal-ray-{host}-{pid}.jsonl"
        cfg = replace(cfg, journal=str(journal))
    stats = run_ray(cfg, options, inp, batches, commit.take, url=url)
    summary = commit.summary
    commit.errors.extend(stats.errors)
    summary.images_failed += stats.images_lost
    summary.retries = stats.retries
    summary.worker_failures = stats.failures
    summary.stalls = stats.stalls
    commit.progress.advance(sum(len(e) for e in stats.lost_tasks))
