"""``perturb generate --dry-run``: what a run would make, and what it would cost, without
writing anything in DIR.

The plan counts the selected images (after --limit and --shard) and their outputs, then runs
the job function on the first image into a temporary folder outside DIR (removed again) to
measure the mean output size and the time per output; size and time of the whole run are those
times the number of outputs (time divided by the worker count). A DIR that already holds part
of the run is not read: its outputs are counted as still to make.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from perturb.generate.naming import safe_stem
from perturb.generate.progress import free_bytes, human_size


@dataclass
class Plan:
    suite: str
    input: str
    device: str
    images: int = 0  # unique images of the input
    images_selected: int = 0
    outputs: int = 0
    sample_images: int = 0  # images measured
    sample_outputs: int = 0
    mean_output_bytes: float = 0.0
    seconds_per_output: float = 0.0
    estimated_bytes: int = 0
    estimated_seconds: float = 0.0
    free_bytes: int | None = None
    fits: bool = True
    dry_run: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        eta = self.estimated_seconds
        return [
            f"plan (dry run, nothing written): suite {self.suite} on {self.input} ({self.device})",
            f"images {self.images_selected} of {self.images}, outputs {self.outputs}",
            f"measured on {self.sample_images} image(s), {self.sample_outputs} outputs: "
            f"{human_size(self.mean_output_bytes)} and {self.seconds_per_output * 1000:.0f} ms "
            "per output",
            f"estimate: {human_size(self.estimated_bytes)} on disk"
            + ("" if self.free_bytes is None else f" ({human_size(self.free_bytes)} free)")
            + f", about {eta / 60:.1f} min ({eta:.0f} s)"
            + ("" if self.fits else "; DOES NOT FIT in the free space"),
        ]


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
    from perturb.generate.core import read_jobs
    from perturb.generate.worker import WorkerConfig, default_threads, process_chunk

    plan = Plan(suite=suite.suite, input=inp.source, device=device)
    groups, _ = inp.groups()
    plan.images = len(groups)
    selected = groups if options.limit is None else groups[: options.limit]
    if shard is not None:
        selected = [g for g in selected if shard.holds(g.img_id)]
    plan.images_selected = len(selected)
    all_tasks = suite.tasks()
    pending: list[Any] = []
    for group in selected:
        tasks = suite.tasks(inp.modality(group) or "any") if suite.per_image_modality else all_tasks
        plan.outputs += len(tasks)
        if tasks and not pending:
            file_id = safe_stem(group.img_id)
            pending.append((group, file_id, [(t, t.path(suite, file_id)) for t in tasks]))
    if pending:
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
            result = process_chunk(replace(cfg), jobs)
            seconds = time.perf_counter() - start
        plan.sample_images = len(jobs)
        plan.sample_outputs = len(result.rows)
        if result.rows:
            plan.mean_output_bytes = sum(r["size_bytes"] for r in result.rows) / len(result.rows)
            plan.seconds_per_output = seconds / len(result.rows)
    plan.estimated_bytes = int(plan.outputs * plan.mean_output_bytes)
    plan.estimated_seconds = plan.outputs * plan.seconds_per_output / max(1, options.workers)
    if out is not None:
        plan.free_bytes = free_bytes(out)
        plan.fits = plan.free_bytes is None or plan.estimated_bytes <= plan.free_bytes
    return plan
