"""Per-sample time of ops on the torch path (the code CUDA runs) at batch 1 and batch B.

A batched kernel pays its dispatch once per batch, so its time per sample falls with the batch;
a per-sample loop keeps it flat. For each op (any registered name), a seeded float32 batch of
``--size`` x ``--size`` images is perturbed at ``--severity`` with the torch backend forced, two
ways: ``apply`` (``perturb.apply``, border not protected: keyed parameters, records and kernel)
and ``kernel`` (the op's kernel alone on parameters collated beforehand). Each row is the median
of ``--repeats`` timed calls after one warm-up call, as wall time and as this process's CPU
time (``time.process_time``: on a shared, loaded machine the comparable figure); speedups are
given for both.

Run: ``python benchmarks/bench_torch_batching.py --threads 1 [--ops gaussian_blur,...]
--out benchmarks/results/torch-batching-<tag>.json`` (default ops: ``POINTWISE_FILTER_OPS``).
Two checkouts side by side, interleaved: ``python -m benchmarks.ab_trees torch --baseline
OTHER_CHECKOUT --ops ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import perturb
from perturb.catalog.ops import get_op
from perturb.engine.run import collate, draw_key, sample_params
from perturb.ops.backend import use_backend
from perturb.ops.kernels import get_kernel, kernel_names

# issue 28 item 4c: the pointwise and filter ops whose per-sample time should fall with the batch
POINTWISE_FILTER_OPS = (
    "brightness,contrast,gamma,saturation,hue_shift,color_cast,vignetting,gaussian_noise,"
    "shot_noise,gaussian_blur,defocus_blur,xray_gamma,xray_window_level,xray_exposure,"
    "xray_monochrome1,xray_bit_depth,xray_heel_effect,xray_quantum_noise,xray_edge_enhancement,"
    "xray_scatter,xray_over_penetration,xray_under_penetration"
)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _median_seconds(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of ``repeats`` calls after one warm-up call."""
    call()  # warm: lazy tables, first-call allocations
    walls, cpus = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        cpus.append(time.process_time() - start_cpu)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), statistics.median(cpus)


def _batch(op: str, b: int, size: int) -> torch.Tensor:
    channels = 3 if 3 in get_op(op).spec.channels else 1
    return torch.rand(b, channels, size, size, generator=torch.Generator().manual_seed(0))


def time_op(op: str, b: int, size: int, severity: int, repeats: int) -> dict[str, float]:
    """Median seconds per sample of ``apply`` and of the kernel alone, batch of ``b``."""
    x = _batch(op, b, size)
    names = [f"bench-{i}" for i in range(b)]
    spec_op = get_op(op)
    keys = [draw_key(0, name, op, 0) for name in names]
    params = collate([sample_params(spec_op, k, severity) for k in keys], x.device)
    entry = get_kernel(op)
    extra: dict[str, Any] = {"scenes": [None] * b} if entry.uses_scene else {}

    def run_apply() -> None:
        perturb.apply(x, op, severity, names, protect_border=False)

    def run_kernel() -> None:
        with torch.no_grad():
            entry.kernel(x, params, keys, **extra)

    with use_backend("torch"):
        apply_wall, apply_cpu = _median_seconds(run_apply, repeats)
        kernel_wall, kernel_cpu = _median_seconds(run_kernel, repeats)
    return {
        "apply_ms_per_sample": 1e3 * apply_wall / b,
        "kernel_ms_per_sample": 1e3 * kernel_wall / b,
        "apply_cpu_ms_per_sample": 1e3 * apply_cpu / b,
        "kernel_cpu_ms_per_sample": 1e3 * kernel_cpu / b,
    }


def op_row(op: str, batch: int, size: int, severity: int, repeats: int) -> dict[str, Any]:
    """One op's row: per-sample times at batch 1 and ``batch``, and the speedups per sample."""
    one = time_op(op, 1, size, severity, repeats)
    many = time_op(op, batch, size, severity, repeats)
    return _with_speedups(
        {
            "op": op,
            **{f"b1_{k}": round(v, 4) for k, v in one.items()},
            **{f"b{batch}_{k}": round(v, 4) for k, v in many.items()},
        },
        batch,
    )


def _with_speedups(row: dict[str, Any], batch: int) -> dict[str, Any]:
    """The speedups per sample, and ``apply_cpu_speedup_bound``: B=1's apply CPU time per sample
    over batch ``batch``'s kernel CPU time per sample, the most any batching could give if
    everything around the kernel (parameters, records, checks) cost nothing at that batch; an
    op whose bound is under a target cannot reach it without cheaper arithmetic in its kernel."""
    for what in ("apply", "kernel", "apply_cpu", "kernel_cpu"):
        row[f"{what}_speedup_per_sample"] = round(
            row[f"b1_{what}_ms_per_sample"] / row[f"b{batch}_{what}_ms_per_sample"], 2
        )
    row["apply_cpu_speedup_bound"] = round(
        row["b1_apply_cpu_ms_per_sample"] / row[f"b{batch}_kernel_cpu_ms_per_sample"], 2
    )
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ops",
        default=POINTWISE_FILTER_OPS,
        help="comma-separated registered op names (default: the pointwise and filter ops)",
    )
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--severity", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--label", default="", help="free text recorded with the rows (e.g. a commit)"
    )
    parser.add_argument(
        "--tune-malloc",
        action="store_true",
        help="keep freed buffers in the heap (perturb.tune_malloc, as perturb generate's workers)",
    )
    parser.add_argument("--out", type=Path, help="JSON file to write (printed either way)")
    args = parser.parse_args(argv)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = sorted(set(ops) - set(kernel_names()))
    if unknown:
        parser.error(f"unknown ops: {unknown}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tune_malloc:
        perturb.tune_malloc()
    what = (
        "per-sample time on the torch path (CPU), batch 1 vs batch "
        f"{args.batch}, {args.size}x{args.size} float32, severity {args.severity}, median of "
        f"{args.repeats}; wall ms and process CPU ms"
    )
    header = {
        "what": what,
        "label": args.label,
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tune_malloc": args.tune_malloc,
        "load_average_at_start": list(os.getloadavg()),
    }
    rows = []
    for op in ops:
        row = op_row(op, args.batch, args.size, args.severity, args.repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {**header, "perturb": str(Path(perturb.__file__).parent), "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
