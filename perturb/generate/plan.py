"""Planning a run of ``perturb generate``: the suite planned once into jobs, and the dry run.

:func:`plan_jobs` is where the suite is read, once: the input's image groups are selected
(--limit, --shard) and each image's outputs are listed as (task, relative path), with the run's
settings and the suite as the workers take it (its JSON dump). The plan then flows down: the
driver (``perturb.generate.runner``) hands it to ``perturb.generate.core.execute``, which
subtracts what DIR already holds (resume) and hands the missing jobs to an engine, whose
workers (``perturb.generate.worker``) make them; nothing hands the suite back up. The input
is opened here too (:func:`open_run_input`: by the driver and by every Ray worker alike), and
a job's image bytes are read here (:func:`read_jobs`).

``perturb generate --dry-run`` (:func:`plan_run`): what a run would make, and what it would
cost, without writing anything in DIR, in seconds. The dry run counts the selected images (after --limit and --shard) and their outputs. It reads the
headers of up to ``HEADER_SAMPLE`` images spread over the selection (sizes, no decode), then runs
the job function into a temporary folder outside DIR (removed again) on the smallest, the median
and the largest of them, each with ``TASK_SAMPLE`` of its tasks spread over the suite's ops and
severities (interleaved, so the images together cover different tasks). Output bytes and time
scale with pixels: the estimate is outputs x the mean pixels of the header sample x the measured
bytes (and seconds) per pixel of an output, and its uncertainty is the standard error of those
two means combined (1 s.d.; the tasks differ a lot: noise compresses far worse than blur). A DIR
that already holds part of the run is not read: its outputs are counted as still to make.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perturb._version import __version__
from perturb.contracts.suite import Suite, Task
from perturb.generate.naming import safe_stem
from perturb.generate.progress import free_bytes, human_size
from perturb.generate.shard import Shard
from perturb.generate.worker import ImageJob

HEADER_SAMPLE = 32  # images whose header (size) is read
TASK_SAMPLE = 6  # tasks run on each measured image

# (group, file_id, (task, relative path) to make): one image's outputs
Pending = tuple[Any, str, list[tuple[Task, str]]]


@dataclass
class JobPlan:
    """A run's suite planned into jobs: what the driver hands down to ``core.execute``.

    ``jobs`` holds every selected image with all its outputs (DIR's resume state is not read
    here); ``suite_dump`` is the suite as the workers parse it; ``settings`` is what DIR is made
    with (a re-run with others is refused)."""

    suite_name: str
    suite_dump: dict[str, Any]
    seed: int
    device: str
    inp: Any
    settings: dict[str, Any]
    shard: str | None
    jobs: list[Pending] = field(default_factory=list)
    id_errors: list[dict[str, Any]] = field(default_factory=list)  # rows without img_id
    input_rows: int = 0
    rows_without_id: int = 0
    images: int = 0  # unique images of the input
    images_in_other_shards: int = 0
    unsafe_ids: int = 0  # img_ids whose file name had to be escaped

    @property
    def outputs(self) -> int:
        return sum(len(tasks) for _, _, tasks in self.jobs)


def run_settings(
    suite: Suite, inp: Any, seed: int, shard: Shard | None, limit: int | None, id_from: str
) -> dict[str, Any]:
    """What a DIR is made with: a re-run with other settings is refused (``OutputDir.prepare``)."""
    settings: dict[str, Any] = {
        "suite": suite.suite,
        "suite_fingerprint": suite.fingerprint(),
        "seed": seed,
        "input": inp.fingerprint,
        "perturb_version": __version__,
    }
    if shard is not None:  # absent for a whole run, so whole runs made before shards resume
        settings["shard"] = str(shard)
    if limit is not None:  # a re-run may extend it, never shrink it (stale rows)
        settings["limit"] = limit
    if id_from != "stem":
        settings["id_from"] = id_from
    return settings


def plan_jobs(
    suite: Suite, inp: Any, options: Any, seed: int, device: str, shard: Shard | None
) -> JobPlan:
    """The suite planned once over the input: the selected images (``options.limit``, then
    ``shard``) each with its outputs' (task, path), in input order."""
    groups, empty_rows = inp.groups()
    selected = groups if options.limit is None else groups[: options.limit]
    kept = selected if shard is None else [g for g in selected if shard.holds(g.img_id)]
    plan = JobPlan(
        suite_name=suite.suite,
        suite_dump=suite.model_dump(mode="json"),
        seed=seed,
        device=device,
        inp=inp,
        settings=run_settings(suite, inp, seed, shard, options.limit, options.id_from),
        shard=None if shard is None else str(shard),
        id_errors=_empty_id_errors(empty_rows, shard),
        input_rows=len(inp),
        rows_without_id=len(empty_rows),
        images=len(groups),
        images_in_other_shards=len(selected) - len(kept),
    )
    all_tasks = suite.tasks()
    for group in kept:
        file_id = safe_stem(group.img_id)
        plan.unsafe_ids += file_id != group.img_id
        # no modality label: the generic ops
        tasks = suite.tasks(inp.modality(group) or "any") if suite.per_image_modality else all_tasks
        plan.jobs.append((group, file_id, [(t, t.path(suite, file_id)) for t in tasks]))
    return plan


def _empty_id_errors(empty_rows: list[int], shard: Shard | None) -> list[dict[str, Any]]:
    """One error row per input row without img_id (reported once over the shards of a run)."""
    if shard is not None and shard.index != 0:
        return []
    return [
        {
            "img_id": None,
            "file_id": None,
            "stage": "id",
            "op": None,
            "severity": None,
            "variant": None,
            "qa_rows": 1,
            "reason": f"input row {r}: empty img_id",
        }
        for r in empty_rows
    ]


def open_run_input(
    suite: Suite,
    dataset: str | None,
    split: str | None,
    image_column: str | None,
    builtin_images: int | None,
    images: str | None,
    *,
    id_from: str = "stem",
    cache_dir: str | None = None,
) -> Any:
    """The input of a run, opened the same way by the driver and by every engine's workers:
    through the suite's dataset adapter, or ``open_input`` (built-in data of the suite's
    modality when no dataset is given). Raises ``DatasetError``."""
    from perturb.datasets import open_input
    from perturb.io.datasets import DatasetError

    if suite.input is not None:
        from perturb.datasets import open_adapter

        given = [
            flag
            for flag, value in (("--builtin-images", builtin_images), ("--image-column", image_column))
            if value is not None
        ]
        if given:
            raise DatasetError(
                f"{' and '.join(given)}: not for suite {suite.suite}, which reads its dataset "
                f"through the {suite.input.adapter} adapter (its own columns and images); pass "
                "the dataset with --dataset (its image folder with --images), or use a suite "
                "without an input section for the built-in phantoms (e.g. xray-artifacts)"
            )
        from perturb.io.datasets import using_cache

        with using_cache(cache_dir):
            return open_adapter(
                suite.input.adapter,
                dataset,
                images=images or suite.input.images,
                split=split,
                keep_leaking_fields=suite.input.keep_leaking_fields,
                min_visible=suite.input.min_visible,
            )
    if images is not None:
        from perturb.datasets import adapters

        raise DatasetError(
            "--images is for dataset adapters: use a suite with an input.adapter section "
            f"(adapters: {', '.join(adapters())}), or pass the images with --dataset"
        )
    return open_input(
        dataset,
        split,
        image_column=image_column,
        builtin_images=builtin_images,
        builtin_modality=suite.data_modality(),
        id_from=id_from,
        cache_dir=cache_dir,
    )


def read_jobs(inp: Any, batch: list[Pending]) -> tuple[list[ImageJob], list[dict[str, Any]]]:
    """Jobs of a batch with their image bytes; images that cannot be read become error rows."""
    from perturb.io.datasets import ImageFetchError

    jobs, errs = [], []
    for group, file_id, missing in batch:
        try:
            data = group_image(inp, group)
        except ImageFetchError as exc:
            errs.append(
                {
                    "img_id": group.img_id,
                    "file_id": file_id,
                    "stage": "read",
                    "op": None,
                    "severity": None,
                    "variant": None,
                    "qa_rows": len(group.rows),
                    "reason": str(exc),
                }
            )
            continue
        param_key = inp.sample_key(group) if inp.sample_key_column else None
        jobs.append(
            ImageJob(
                group.img_id, file_id, data, missing, qa_rows=len(group.rows),
                param_key=param_key, input_sha256=hashlib.sha256(data).hexdigest(),
            )
        )  # fmt: skip
    return jobs, errs


def group_image(inp: Any, group: Any) -> bytes:
    """The bytes of one unique image, every row of its img_id checked to carry the same image."""
    if hasattr(inp, "group_bytes"):
        return bytes(inp.group_bytes(group))
    return bytes(inp.image_bytes(group.rows[0]))


@dataclass
class Plan:
    suite: str
    input: str
    device: str
    images: int = 0  # unique images of the input
    images_selected: int = 0
    outputs: int = 0
    headers_read: int = 0  # images whose size was read (spread over the selection)
    mean_pixels: float = 0.0  # mean pixels of those images
    sample_images: int = 0  # images measured (smallest, median, largest of the headers read)
    sample_outputs: int = 0  # outputs made to measure
    mean_output_bytes: float = 0.0  # estimated mean size of an output of the run
    seconds_per_output: float = 0.0  # estimated mean time of an output of the run
    estimated_bytes: int = 0
    estimated_seconds: float = 0.0
    relative_uncertainty: float = 0.0  # 1 s.d. of the size estimate, as a fraction of it
    free_bytes: int | None = None
    fits: bool = True
    dry_run: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        eta = self.estimated_seconds
        spread = self.relative_uncertainty
        return [
            f"plan (dry run, nothing written): suite {self.suite} on {self.input} ({self.device})",
            f"images {self.images_selected} of {self.images}, outputs {self.outputs}",
            f"sizes read from {self.headers_read} image headers (mean {self.mean_pixels / 1e6:.2f} "
            f"Mpx); measured {self.sample_outputs} outputs on {self.sample_images} image(s) "
            f"across that size range: {human_size(self.mean_output_bytes)} and "
            f"{self.seconds_per_output * 1000:.0f} ms per output",
            f"estimate: {human_size(self.estimated_bytes)} on disk (+/- {spread:.0%}, 1 s.d.: "
            f"{human_size(self.estimated_bytes * max(0.0, 1 - spread))} to "
            f"{human_size(self.estimated_bytes * (1 + spread))})"
            + ("" if self.free_bytes is None else f" ({human_size(self.free_bytes)} free)")
            + f", about {eta / 60:.1f} min ({eta:.0f} s, start-up included)"
            + ("" if self.fits else "; DOES NOT FIT in the free space"),
        ]


def _spread(n: int, k: int) -> list[int]:
    """``k`` indices (or fewer when n < k) spread evenly over range(n), first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def _interleaved(n: int, k: int, part: int, parts: int) -> list[int]:
    """``k`` indices spread evenly over range(n), shifted for ``part`` of ``parts`` so that the
    measured images together cover ``parts x k`` different tasks."""
    if n <= k:
        return list(range(n))
    return sorted({int((j + part / parts) * n / k) % n for j in range(k)})


def _rel_se(values: list[float], population: int | None = None) -> float:
    """Standard error of the mean of ``values`` relative to the mean (finite-population
    corrected when they are a sample of ``population`` items)."""
    if len(values) < 2 or statistics.fmean(values) == 0:
        return 0.0
    se = statistics.stdev(values) / math.sqrt(len(values))
    if population is not None and population > 1:
        se *= math.sqrt(max(0.0, (population - len(values)) / (population - 1)))
    return se / statistics.fmean(values)


def plan_run(
    suite: Suite,
    inp: Any,
    options: Any,
    seed: int,
    device: str,
    shard: Shard | None,
    out: Path | None,
) -> Plan:
    """The plan of ``generate(suite, options)`` (see the module docstring)."""
    from perturb.generate.worker import WorkerConfig, default_threads, process_chunk
    from perturb.io.datasets import ImageFetchError
    from perturb.io.images import ImageDecodeError, read_header

    planned = plan_jobs(suite, inp, options, seed, device, shard)
    plan = Plan(suite=suite.suite, input=inp.source, device=device)
    plan.images = planned.images
    plan.images_selected = len(planned.jobs)
    plan.outputs = planned.outputs
    selected = planned.jobs
    sized: list[tuple[int, Any]] = []  # (pixels, group) of the headers read
    for index in _spread(len(selected), HEADER_SAMPLE):
        group, file_id, tasks = selected[index]
        try:
            header = read_header(group_image(inp, group), max_pixels=options.max_pixels)
        except (ImageFetchError, ImageDecodeError):
            continue  # the run reports it; the estimate is of the images that decode
        if header.width * header.height <= options.max_pixels and tasks:
            sized.append((header.width * header.height, (group, file_id, tasks)))
    plan.headers_read = len(sized)
    if not sized:
        _finish(plan, options, out, 0.0, 0.0)
        return plan
    pixels = [float(p) for p, _ in sized]
    plan.mean_pixels = statistics.fmean(pixels)
    ordered = sorted(sized, key=lambda item: (item[0], item[1][0].img_id))
    measured = [ordered[i] for i in sorted({0, len(ordered) // 2, len(ordered) - 1})]
    pending: list[Pending] = []
    for part, (_, (group, file_id, tasks)) in enumerate(measured):
        picked = [tasks[i] for i in _interleaved(len(tasks), TASK_SAMPLE, part, len(measured))]
        pending.append((group, file_id, picked))
    with tempfile.TemporaryDirectory(prefix="perturb-dry-run-") as scratch:
        cfg = WorkerConfig(
            suite=planned.suite_dump,
            seed=seed,
            device=device,
            max_pixels=options.max_pixels,
            out=scratch,
            threads=options.threads or default_threads(options.workers),
        )
        jobs, _ = read_jobs(inp, pending)
        start = time.perf_counter()
        result = process_chunk(cfg, jobs)
        seconds = time.perf_counter() - start
    plan.sample_images = len(jobs)
    plan.sample_outputs = len(result.rows)
    if not result.rows:
        _finish(plan, options, out, 0.0, 0.0)
        return plan
    per_pixel = [r["size_bytes"] / (r["width"] * r["height"]) for r in result.rows]
    output_pixels = sum(r["width"] * r["height"] for r in result.rows)
    plan.relative_uncertainty = math.hypot(_rel_se(per_pixel), _rel_se(pixels, len(selected)))
    _finish(
        plan,
        options,
        out,
        plan.mean_pixels * statistics.fmean(per_pixel),
        plan.mean_pixels * seconds / output_pixels,
    )
    return plan


def _finish(plan: Plan, options: Any, out: Path | None, mean_bytes: float, seconds: float) -> None:
    """The run's estimates from the mean size and time of an output, and the free space."""
    plan.mean_output_bytes = mean_bytes
    plan.seconds_per_output = seconds
    plan.estimated_bytes = int(plan.outputs * mean_bytes)
    plan.estimated_seconds = plan.outputs * seconds / max(1, options.workers)
    if out is not None:
        plan.free_bytes = free_bytes(out)
        plan.fits = plan.free_bytes is None or plan.estimated_bytes <= plan.free_bytes
