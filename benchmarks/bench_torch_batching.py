"""Per-sample time of ops on the torch path (the code CUDA runs) at batch 1 and batch B.

A batched kernel pays its dispatch once per batch, so its time per sample falls with the batch;
a per-sample loop keeps it flat. For each op (any registered name), a seeded float32 batch of
``--size`` x ``--size`` images is perturbed at ``--severity`` with the torch backend forced, two
ways: ``apply`` (``perturb.apply``, border not protected: keyed parameters, records and kernel)
and ``kernel`` (the op's kernel alone on parameters collated beforehand). Each row is the median
of ``--repeats`` timed calls after one warm-up call.

Run: ``python benchmarks/bench_torch_batching.py --ops gaussian_blur,gaussian_noise
--out benchmarks/results/torch-batching-<tag>.json``
"""

from __future__ import annotations

import argparse
import json
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


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _median_seconds(call: Callable[[], Any], repeats: int) -> float:
    call()  # warm: lazy tables, first-call allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
        return {
            "apply_ms_per_sample": 1e3 * _median_seconds(run_apply, repeats) / b,
            "kernel_ms_per_sample": 1e3 * _median_seconds(run_kernel, repeats) / b,
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", required=True, help="comma-separated registered op names")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--severity", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--label", default="", help="free text recorded with the rows (e.g. a commit)"
    )
    parser.add_argument("--out", type=Path, help="JSON file to write (printed either way)")
    args = parser.parse_args(argv)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = sorted(set(ops) - set(kernel_names()))
    if unknown:
        parser.error(f"unknown ops: {unknown}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for op in ops:
        one = time_op(op, 1, args.size, args.severity, args.repeats)
        many = time_op(op, args.batch, args.size, args.severity, args.repeats)
        row = {
            "op": op,
            **{f"b1_{k}": round(v, 4) for k, v in one.items()},
            **{f"b{args.batch}_{k}": round(v, 4) for k, v in many.items()},
            "apply_speedup_per_sample": round(
                one["apply_ms_per_sample"] / many["apply_ms_per_sample"], 2
            ),
            "kernel_speedup_per_sample": round(
                one["kernel_ms_per_sample"] / many["kernel_ms_per_sample"], 2
            ),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "what": "per-sample time on the torch path (CPU), batch 1 vs batch "
        f"{args.batch}, {args.size}x{args.size} float32, severity {args.severity}, median of {args.repeats}",
        "label": args.label,
        "perturb": str(Path(perturb.__file__).parent),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
