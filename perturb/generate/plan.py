"""``perturb generate --dry-run``: what a run would make, and what it would cost, without
writing anything in DIR, in seconds.

The plan counts the selected images (after --limit and --shard) and their outputs. It reads the
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

import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from perturb.generate.naming import safe_stem
from perturb.generate.progress import free_bytes, human_size

HEADER_SAMPLE = 32  # images whose header (size) is read
TASK_SAMPLE = 6  # tasks run on each measured image


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
    suite: Any,
    inp: Any,
    options: Any,
    seed: int,
    device: str,
    shard: Any,
    out: Path | None,
) -> Plan:
    """The plan of ``generate(suite, options)`` (see the module docstring)."""
    from perturb.generate.core import group_image, read_jobs
    from perturb.generate.worker import WorkerConfig, default_threads, process_chunk
    from perturb.io.datasets import ImageFetchError
    from perturb.io.images import ImageDecodeError, read_header

    plan = Plan(suite=suite.suite, input=inp.source, device=device)
    groups, _ = inp.groups()
    plan.images = len(groups)
    selected = groups if options.limit is None else groups[: options.limit]
    if shard is not None:
        selected = [g for g in selected if shard.holds(g.img_id)]
    plan.images_selected = len(selected)
    all_tasks = suite.tasks()

    def tasks_of(group: Any) -> list[Any]:
        return suite.tasks(inp.modality(group) or "any") if suite.per_image_modality else all_tasks

    plan.outputs = sum(len(tasks_of(g)) for g in selected)
    sized: list[tuple[int, Any]] = []  # (pixels, group) of the headers read
    for index in _spread(len(selected), HEADER_SAMPLE):
        group = selected[index]
        try:
            header = read_header(group_image(inp, group), max_pixels=options.max_pixels)
        except (ImageFetchError, ImageDecodeError):
            continue  # the run reports it; the estimate is of the images that decode
        if header.width * header.height <= options.max_pixels and tasks_of(group):
            sized.append((header.width * header.height, group))
    plan.headers_read = len(sized)
    if not sized:
        _finish(plan, options, out, 0.0, 0.0)
        return plan
    pixels = [float(p) for p, _ in sized]
    plan.mean_pixels = statistics.fmean(pixels)
    ordered = sorted(sized, key=lambda item: (item[0], item[1].img_id))
    measured = [ordered[i] for i in sorted({0, len(ordered) // 2, len(ordered) - 1})]
    pending = []
    for part, (_, group) in enumerate(measured):
        file_id = safe_stem(group.img_id)
        tasks = tasks_of(group)
        picked = [tasks[i] for i in _interleaved(len(tasks), TASK_SAMPLE, part, len(measured))]
        pending.append((group, file_id, [(t, t.path(suite, file_id)) for t in picked]))
    with tempfile.TemporaryDirectory(prefix="perturb-dry-run-") as scratch:
        cfg = WorkerConfig(
            suite=suite.model_dump(mode="json"),
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
