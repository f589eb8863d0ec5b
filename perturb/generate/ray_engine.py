"""The Ray Data engine of ``perturb generate --engine ray``: the same keyed jobs and the same job
function (``perturb.generate.worker.process_chunk``) as the local engine, on a Ray cluster.

* The driver plans exactly as the local engine (what is missing from the journal, shards,
  ``--limit``) and hands Ray Data a table of small job descriptors (img_id, file stem, input
  rows, missing outputs): no image bytes pass through the driver.
* ``map_batches`` runs ``GenerateWorker``, a stateful callable class: each worker opens the input
  once through ``datasets`` (Arrow, memory-mapped; the input must be at the same path on every
  node, or be a hub id / the built-in phantoms), loads the suite and its ops on its device (one
  GPU per worker where the cluster has GPUs, ``num_gpus=G``; CPU workers otherwise), reads its
  images' bytes, and calls ``process_chunk``, which writes the outputs atomically into DIR (a
  local or shared path that every worker sees).
* Each worker commits every output as it finishes it, as a local pool worker does: files
  synced in groups, rows appended to its own ``.perturb/journal-ray-<host>-<pid>.jsonl`` (DIR is
  shared by every node; outputs at a URL: the driver journals each batch's rows as it arrives).
  A kill of the driver at any moment loses at most the outputs in flight, and a re-run adopts
  the rest. Results stream back to the driver for the summary and progress: the manifest,
  errors.jsonl, dataset/, resume and ``perturb verify`` are those of the local engine. A sample's bytes depend only on its image and key, so
  outputs are the same whatever the worker count, batch size or scheduling order.
* Failures: a batch whose worker died or raised is not fatal (``max_errored_blocks=-1``); after
  each pass, the images that did not come back run again, each image as its own Ray task (so a
  crashing image cannot take another along), for at most ``max_retries`` more passes.
  Images still missing after that land in errors.jsonl (stage ``worker``) with their img_id; the
  summary reports ``retries`` and ``worker_failures``.
* Stalls: a pass from which no result arrives for ``stall_timeout`` seconds is stopped (its Ray
  Data execution shut down: tasks cancelled, actors killed); what came back is kept, the rest
  goes to the next pass as above, and the summary counts ``stalls``.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from perturb.catalog.specs import MODALITIES
from perturb.generate.core import Fault, RunError, open_run_input, read_jobs
from perturb.generate.worker import ChunkResult, WorkerConfig, default_threads, process_chunk

RAY_MISSING = (
    'the Ray engine needs Ray Data, which is not installed: pip install "perturb-medvqa[ray]" '
    "(or use --engine local)"
)
_OWNED = {"ray": False}  # whether this process started the Ray instance it uses


def import_ray() -> Any:
    """``ray`` with Ray Data, or a RunError that names the install command."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise RunError(RAY_MISSING) from None
    return ray


@dataclass(frozen=True)
class Plan:
    """Resources per worker and the number of workers."""

    gpus: float
    workers: int
    device: str


def connect(options: Any) -> str:
    """Start or join Ray (``options.ray_address``: None starts a local instance, ``auto`` or
    host:port joins a cluster) and return the workers' device."""
    return plan(options).device


def _init(address: str | None) -> Any:
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except ConnectionError as exc:
            raise RunError(
                f"--ray-address {address}: cannot reach a Ray cluster ({exc}); start one with "
                "`ray start --head`, or leave --ray-address out to start a local Ray"
            ) from None
        _OWNED["ray"] = address is None
    return ray


def plan(options: Any) -> Plan:
    """Workers and GPUs per worker from the options and the cluster's resources."""
    ray = _init(options.ray_address)
    resources = ray.cluster_resources()
    cluster_gpus = float(resources.get("GPU", 0.0))
    cluster_cpus = float(resources.get("CPU", 1.0))
    if options.device not in ("auto", "cpu", "cuda"):
        raise RunError(f"--device must be auto, cpu or cuda, got {options.device!r}")
    gpus = options.gpus_per_worker
    if gpus is None:
        gpus = 1.0 if cluster_gpus > 0 and options.device != "cpu" else 0.0
    if gpus < 0:
        raise RunError(f"--gpus-per-worker must be non-negative, got {gpus}")
    if gpus > 0 and options.device == "cpu":
        raise RunError("--gpus-per-worker > 0 with --device cpu: leave one of them out")
    if gpus > cluster_gpus:
        raise RunError(
            f"--gpus-per-worker {gpus:g}: the Ray cluster has {cluster_gpus:g} GPU(s); "
            "use --gpus-per-worker 0 for CPU workers"
        )
    if options.device == "cuda" and gpus == 0:
        raise RunError(
            "--device cuda: the Ray cluster has no GPU; use --device cpu or auto, or join a GPU cluster"
        )
    workers = options.concurrency
    if workers is None:
        workers = max(1, int(cluster_gpus // gpus) if gpus > 0 else int(cluster_cpus))
    if workers < 1:
        raise RunError(f"--concurrency must be at least 1, got {workers}")
    return Plan(gpus=float(gpus), workers=int(workers), device="cuda" if gpus > 0 else "cpu")


def disconnect() -> None:
    """Shut down the Ray instance this process started (a joined cluster stays up)."""
    if _OWNED["ray"]:
        import ray

        ray.shutdown()
        _OWNED["ray"] = False


@dataclass(frozen=True)
class InputSource:
    """How a worker re-opens the input (as the driver did, ``core.open_run_input``) and what
    it must see."""

    dataset: str | None
    split: str | None
    image_column: str | None
    builtin_images: int | None
    images: str | None
    fingerprint: str
    rows: int
    id_from: str = "stem"
    cache_dir: str | None = None

    def open(self, suite: Any) -> Any:
        inp = open_run_input(
            suite, self.dataset, self.split, self.image_column, self.builtin_images, self.images,
            id_from=self.id_from, cache_dir=self.cache_dir,
        )  # fmt: skip
        if inp.fingerprint != self.fingerprint or len(inp) != self.rows:
            raise RuntimeError(
                f"this worker sees another input ({inp.fingerprint}, {len(inp)} rows) than the "
                f"driver ({self.fingerprint}, {self.rows} rows): the input must be at the same "
                "path on every node"
            )
        return inp


class GenerateWorker:
    """Ray Data stateful worker: the input and the suite's ops are loaded once per worker."""

    def __init__(
        self,
        cfg: WorkerConfig,
        source: InputSource,
        fault: Fault | None = None,
        url: str | None = None,
    ):
        from perturb.catalog.ops import get_op
        from perturb.configs.suites import parse_suite

        self.cfg = cfg
        self.fault = fault  # tests: called with ("ray-worker", img_id) for each image of a batch
        self.url = url
        suite = parse_suite(cfg.suite)
        self.inp = source.open(suite)
        modalities = sorted(MODALITIES) if suite.per_image_modality else [None]
        self.tasks = {(t.op, t.severity, t.variant): t for m in modalities for t in suite.tasks(m)}
        for name in {t.op for t in self.tasks.values() if not t.composite}:
            get_op(name)  # the catalog's ops for this worker, loaded before the first batch

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        from perturb.io.datasets import ImageGroup

        ids = [str(v) for v in batch["img_id"]]
        for img_id in ids:
            if self.fault is not None:
                self.fault("ray-worker", img_id)
        try:
            pending = [
                (
                    ImageGroup(img_id, json.loads(rows)),
                    str(file_id),
                    [(self.tasks[(op, s, v)], rel) for op, s, v, rel in json.loads(tasks)],
                )
                for img_id, file_id, rows, tasks in zip(
                    ids, batch["file_id"], batch["rows"], batch["tasks"], strict=True
                )
            ]
            jobs, read_errors = read_jobs(self.inp, pending)
            if self.url is None:
                result = process_chunk(self.cfg, jobs)
            else:  # outputs to a URL: write to scratch, then copy
                from perturb.generate.store import publish_chunk

                result = publish_chunk(self.cfg, jobs, self.url)
        except Exception as exc:  # the driver re-runs these images, then reports them
            return _reply(ids, ChunkResult(), 0, f"{type(exc).__name__}: {exc}")
        result.errors = read_errors + result.errors
        result.images_failed += len(read_errors)
        return _reply(ids, result, sum(len(m) for _, _, m in pending), "")


_CACHED: dict[str, GenerateWorker] = {}


def _isolated(batch: dict[str, Any], **state: Any) -> dict[str, list[Any]]:
    """A retry-pass task: the process's GenerateWorker for this run (made once), on one batch."""
    key = repr(sorted(state.items()))
    worker = _CACHED.get(key)
    if worker is None:
        worker = _CACHED[key] = GenerateWorker(**state)
    return worker(batch)


def _reply(ids: list[str], result: ChunkResult, tasks: int, failure: str) -> dict[str, list[Any]]:
    return {
        "img_ids": [json.dumps(ids)],
        "result": [json.dumps(asdict(result))],
        "tasks": [tasks],
        "failure": [failure],
    }


def _descriptors(batch: list[Any]) -> pa.Table:
    return pa.table(
        {
            "img_id": [g.img_id for g, _, _ in batch],
            "file_id": [f for _, f, _ in batch],
            "rows": [json.dumps(g.rows) for g, _, _ in batch],
            "tasks": [
                json.dumps([[t.op, t.severity, t.variant, rel] for t, rel in missing])
                for _, _, missing in batch
            ],
        }
    )


class _Stalled(Exception):
    """No result arrived for the stall timeout; the pass's execution was shut down."""


def _rows(results: Any, stall_timeout: float | None) -> Iterator[dict[str, Any]]:
    """The rows of the Ray Dataset ``results`` as they arrive. With a stall timeout, they are
    read in a thread; when none arrives for ``stall_timeout`` seconds the execution is shut down
    (its tasks cancelled, its actors killed), the rows that came meanwhile are still yielded, and
    ``_Stalled`` is raised."""
    if not stall_timeout:
        yield from results.iter_rows()
        return
    executors: list[Any] = []
    create = getattr(results, "_create_executor", None)
    if create is not None:  # Ray Data keeps its executor only after the first batch: catch it

        def capture() -> Any:
            executors.append(create())
            return executors[-1]

        results._create_executor = capture
    arrived: queue.Queue[Any] = queue.Queue()
    end = object()

    def pump() -> None:
        try:
            for row in results.iter_rows():
                arrived.put(row)
        except BaseException as exc:  # handed to the driver's thread, raised there
            arrived.put(exc)
        finally:
            arrived.put(end)

    thread = threading.Thread(target=pump, name="perturb-ray-results", daemon=True)
    thread.start()
    while True:
        try:
            item = arrived.get(timeout=stall_timeout)
        except queue.Empty:
            break
        if item is end:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
    for executor in executors:
        executor.shutdown(force=True)
    thread.join(timeout=30)
    while not arrived.empty():  # results that came in before the execution stopped
        item = arrived.get_nowait()
        if isinstance(item, dict):
            yield item
    raise _Stalled


@dataclass
class RayStats:
    retries: int = 0
    failures: int = 0
    stalls: int = 0
    images_lost: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    lost_tasks: list[list[Any]] = field(default_factory=list)


def run_ray(
    cfg: WorkerConfig,
    options: Any,
    inp: Any,
    batches: list[list[Any]],
    take: Callable[[ChunkResult, int], None],
    url: str | None = None,
) -> RayStats:
    """Run the pending images (``batches`` of the driver's plan) on Ray Data; every result goes
    to ``take`` (the journal's commit, ``perturb.generate.core.Commit.take``) as it arrives.
    Images whose worker died, raised or stalled run again, one per task, for at most
    ``options.max_retries`` more passes; those still missing become ``worker`` error rows."""
    ray = import_ray()
    p = plan(options)
    _quiet_data_context()
    threads = options.threads or (default_threads(p.workers) if not p.gpus else None)
    state = {
        "cfg": replace(cfg, device=p.device, threads=threads),
        "source": _input_source(options, inp),
        "fault": options.fault,
        "url": url,
    }
    stats = RayStats()
    remaining = [item for batch in batches for item in batch]
    reasons: dict[str, str] = {}
    for attempt in range(options.max_retries + 1):
        if not remaining:
            break
        if attempt:
            stats.retries += len(remaining)
        size = 1 if attempt else options.batch_size  # retries: isolate the image that kills
        groups = [remaining[i : i + size] for i in range(0, len(remaining), size)]
        descriptors = ray.data.from_arrow([_descriptors(g) for g in groups])
        results = _map(descriptors, attempt, size, min(p.workers, len(groups)), p.gpus, state)
        returned = _collect(results, options.stall_timeout, take, stats, reasons, remaining, groups)
        remaining = [item for item in remaining if item[0].img_id not in returned]
    stats.errors.extend(_lost(remaining, stats, reasons, options.max_retries))
    return stats


def _quiet_data_context() -> None:
    """Ray Data settings of a run: a failed batch is re-run by the next pass (not fatal), no
    progress bars or start-up lines of its own (the run has its progress bar)."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.max_errored_blocks = -1
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def _input_source(options: Any, inp: Any) -> InputSource:
    """How the workers re-open the driver's input: local paths made absolute (workers may
    start in another folder)."""
    dataset = options.dataset
    if dataset is not None and Path(dataset).exists():
        dataset = str(Path(dataset).resolve())
    images = options.images
    if images is not None and Path(images).exists():
        images = str(Path(images).resolve())
    return InputSource(
        dataset, options.split, options.image_column, options.builtin_images, images,
        inp.fingerprint, len(inp), options.id_from, options.cache_dir,
    )  # fmt: skip


def _map(descriptors: Any, attempt: int, size: int, workers: int, gpus: float, state: dict[str, Any]) -> Any:
    """One pass: the first on stateful workers (one batch in flight each), retries with each
    image as its own task (a crashing image cannot take another one along)."""
    from ray.data import ActorPoolStrategy

    with warnings.catch_warnings():  # max_restarts & co. have no named parameter yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        if attempt == 0:
            return descriptors.map_batches(
                GenerateWorker,
                batch_size=size,
                compute=ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
                fn_constructor_kwargs=state,
                num_cpus=1,
                num_gpus=gpus or None,
                # a dead worker is replaced, not restarted in place; what it held runs in the
                # next pass: retries are counted and bounded here
                max_restarts=0,
                max_task_retries=0,
            )
        return descriptors.map_batches(
            _isolated, batch_size=1, fn_kwargs=state, num_cpus=1, num_gpus=gpus or None, max_retries=0
        )


def _collect(
    results: Any,
    stall_timeout: float | None,
    take: Callable[[ChunkResult, int], None],
    stats: RayStats,
    reasons: dict[str, str],
    remaining: list[Any],
    groups: list[list[Any]],
) -> set[str]:
    """Commit a pass's results as they arrive; record why the others failed (raised, died,
    stalled). Returns the img_ids that came back."""
    returned: set[str] = set()
    raised: set[str] = set()
    lost = "the worker process died"
    try:
        for row in _rows(results, stall_timeout):
            ids = json.loads(row["img_ids"])
            if row["failure"]:
                stats.failures += 1
                reasons.update(dict.fromkeys(ids, str(row["failure"])))
                raised.update(ids)
                continue
            take(ChunkResult(**json.loads(row["result"])), int(row["tasks"]))
            returned.update(ids)
    except _Stalled:
        stats.stalls += 1
        lost = (
            f"stalled: no result for {stall_timeout:g} s, the pass was stopped "
            "(raise --stall-timeout if an image needs longer)"
        )
    died = {g[0].img_id for g in remaining} - returned - raised
    for img_id in died:
        reasons[img_id] = lost
    stats.failures += sum(1 for g in groups if any(it[0].img_id in died for it in g))
    return returned


def _lost(
    remaining: list[Any], stats: RayStats, reasons: dict[str, str], max_retries: int
) -> list[dict[str, Any]]:
    """Error rows (stage ``worker``) of the images still missing after every pass."""
    errors = []
    for group, file_id, missing in remaining:
        stats.images_lost += 1
        stats.lost_tasks.append(missing)
        errors.append(
            {
                "img_id": group.img_id,
                "file_id": file_id,
                "stage": "worker",
                "op": None,
                "severity": None,
                "variant": None,
                "qa_rows": len(group.rows),
                "reason": f"failed on {max_retries + 1} attempt(s): "
                + reasons.get(group.img_id, "no result"),
            }
        )
    return errors
