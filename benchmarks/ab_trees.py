"""Two checkouts of perturb side by side in one run: interleaved A/B repeats, medians, CPU time.

Each repeat runs one fresh process per tree (the order alternates every repeat), each
importing perturb from its own tree (``PYTHONPATH``), and times one job in it:

* ``augment``: ``Augment("augment-endoscopy")`` forward on 4 batches of 32 uint8 512x512 frames
  (``bench_augment_dataloader.decode`` of the shared endoscopy samples), one thread (as in a
  DataLoader worker), after a warm-up epoch: CPU-ms and wall-ms per image over ``--epochs``
  epochs, and the process's peak RSS;
* ``torch``: ``perturb.apply`` on the torch path (``use_backend("torch")``), 128x128 float32,
  severity 3, border not protected, one thread, at B=1 and B=32 for each op of ``--ops``, and
  the op's kernel alone on parameters collated beforehand: CPU-ms per sample (median of 5
  timed loops after a warm-up call);
* ``frame``: ``perturb.apply`` of each op of ``--ops`` on one full-size real endoscopy frame
  (``--frame``, uint8, the CPU path) at severities 3 and 5, one thread: CPU-ms per frame (median
  of 5 calls, each under a new sample name, after a warm-up call).

CPU time is what these runs compare: the machine they were written on is shared, so wall time
follows the other users' load (recorded at each row). Run from the repository root:

    python -m benchmarks.ab_trees augment --baseline /path/to/other/checkout [--repeats 5]
    python -m benchmarks.ab_trees torch --baseline ... --ops brightness,gaussian_blur
    python -m benchmarks.ab_trees frame --baseline ... --ops specular_glare
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
RESULTS = HERE / "benchmarks" / "results"


def job_augment(epochs: int) -> dict[str, Any]:
    """CPU-ms and wall-ms per image of ``Augment.forward`` (see the module docstring)."""
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    from benchmarks.bench_augment_dataloader import (
        POLICY,
        _files,
        decode,
        fixed_batches,
        warm_scenes,
    )
    from perturb.augment import Augment

    frames = [decode(f) for f in _files()]
    augment = Augment(POLICY, seed=0)
    batches = fixed_batches(frames)
    warm_scenes(augment, frames, 128)  # every item's scene, as a long training run holds them
    for x, idx in batches:
        augment(x, idx, epoch=0)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for epoch in range(1, 1 + epochs):
        for x, idx in batches:
            augment(x, idx, epoch=epoch)
    n = 128 * epochs
    return {
        "cpu_ms_per_image": 1e3 * (time.process_time() - cpu0) / n,
        "wall_ms_per_image": 1e3 * (time.perf_counter() - wall0) / n,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def job_torch(ops: list[str]) -> dict[str, Any]:
    """CPU-ms per sample of ``perturb.apply`` on the torch path at B=1 and B=32, per op."""
    import torch

    torch.set_num_threads(1)
    import perturb
    from perturb.catalog.ops import get_op
    from perturb.engine.run import collate, draw_key, sample_params
    from perturb.ops.backend import use_backend
    from perturb.ops.kernels import get_kernel

    def per_sample(call: Any, loops: int, b: int) -> float:
        call()  # warm
        times = []
        for _ in range(5):
            start = time.process_time()
            for _ in range(loops):
                call()
            times.append((time.process_time() - start) / loops / b)
        return 1e3 * statistics.median(times)

    out: dict[str, Any] = {}
    for op in ops:
        spec = get_op(op)
        channels = 3 if 3 in spec.spec.channels else 1
        entry = get_kernel(op)
        row = {}
        for b, loops in ((1, 60), (32, 4)):
            x = torch.rand(b, channels, 128, 128, generator=torch.Generator().manual_seed(0))
            names = [f"bench-{i}" for i in range(b)]
            keys = [draw_key(0, name, op, 0) for name in names]
            params = collate([sample_params(spec, k, 3) for k in keys], x.device)
            extra: dict[str, Any] = {"scenes": [None] * b} if entry.uses_scene else {}

            def run_apply(x: torch.Tensor = x, names: list[str] = names, op: str = op) -> None:
                perturb.apply(x, op, 3, names, protect_border=False)

            def run_kernel(
                x: torch.Tensor = x,
                params: Any = params,
                keys: Any = keys,
                kernel: Any = entry.kernel,
                extra: dict[str, Any] = extra,
            ) -> None:
                with torch.no_grad():
                    kernel(x, params, keys, **extra)

            with use_backend("torch"):
                row[f"b{b}_apply_cpu_ms_per_sample"] = per_sample(run_apply, loops, b)
                row[f"b{b}_kernel_cpu_ms_per_sample"] = per_sample(run_kernel, loops, b)
        for what in ("apply", "kernel"):
            row[f"{what}_speedup_per_sample"] = (
                row[f"b1_{what}_cpu_ms_per_sample"] / row[f"b32_{what}_cpu_ms_per_sample"]
            )
        out[op] = row
    return out


def job_frame(ops: list[str], frame: str) -> dict[str, Any]:
    """CPU-ms per full-size frame of ``perturb.apply`` on the CPU path, per op and severity."""
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    import perturb

    img = cv2.imread(frame, cv2.IMREAD_COLOR)
    if img is None:
        raise FileNotFoundError(frame)
    x = torch.from_numpy(img[:, :, ::-1].copy()).permute(2, 0, 1).contiguous().unsqueeze(0)
    out: dict[str, Any] = {"frame_hw": list(img.shape[:2])}
    for op in ops:
        row = {}
        for sev in (3, 5):
            perturb.apply(x, op, sev, ["bench-warm"])
            times = []
            for i in range(5):
                start = time.process_time()
                perturb.apply(x, op, sev, [f"bench-{i}"])
                times.append(time.process_time() - start)
            row[f"s{sev}_cpu_ms_per_frame"] = 1e3 * statistics.median(times)
        out[op] = row
    return out


def _run_tree(tree: Path, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = (  # this file's jobs, the tree's perturb (and its benchmarks' frame decoding)
        "import importlib.util, json, sys; sys.path.insert(0, sys.argv[1]); import perturb; "
        "assert perturb.__file__.startswith(sys.argv[1]), perturb.__file__; "
        "spec = importlib.util.spec_from_file_location('ab_trees_child', sys.argv[2]); "
        "ab = importlib.util.module_from_spec(spec); spec.loader.exec_module(ab); "
        "print(json.dumps(ab.child(sys.argv[3:])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tree), __file__, *args],
        cwd=HERE,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def child(argv: list[str]) -> dict[str, Any]:
    """The job named by ``argv`` (run in a child process importing its tree's perturb)."""
    if argv[0] == "augment":
        return job_augment(int(argv[1]))
    if argv[0] == "frame":
        return job_frame(argv[1].split(","), argv[2])
    return job_torch(argv[1].split(","))


def _git(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric leaf over ``rows`` (same structure)."""
    first = rows[0]
    out: dict[str, Any] = {}
    for k, v in first.items():
        if isinstance(v, dict):
            out[k] = _medians([r[k] for r in rows])
        elif isinstance(v, int | float):
            out[k] = statistics.median(r[k] for r in rows)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("job", choices=["augment", "torch", "frame"])
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout (A)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--ops",
        default="brightness,contrast,gamma,saturation,hue_shift,gaussian_noise,gaussian_blur",
    )
    parser.add_argument(
        "--frame",
        type=Path,
        default=Path(os.environ.get("PERTURB_SAMPLES_DIR", "samples"))
        / "endoscopy"
        / "polypgen_C3_EndoCV2021_00277.jpg",
        help="the frame of the frame job (1080x1440)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from benchmarks.bench_torch_batching import cpu_model

    trees = {"baseline": args.baseline.resolve(), "this": HERE}
    job = {
        "augment": ["augment", str(args.epochs)],
        "torch": ["torch", args.ops],
        "frame": ["frame", args.ops, str(args.frame.resolve())],
    }[args.job]
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    load_start = list(os.getloadavg())
    for r in range(args.repeats):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            row = _run_tree(trees[name], job)
            row["load_average_1min"] = os.getloadavg()[0]
            rows[name].append(row)
            print(f"repeat {r} {name:8s} {json.dumps(row)[:200]}", flush=True)
    result = {
        "benchmark": f"ab-{args.job}",
        "what": {
            "augment": __doc__.split("\n\n")[1].strip(),
            "torch": "torch path",
            "frame": f"CPU path, one full-size frame ({args.frame.name}), ops {args.ops}",
        }[args.job],
        "trees": {k: {"path": str(v), "commit": _git(v)} for k, v in trees.items()},
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "repeats": args.repeats,
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "median": {k: _medians(v) for k, v in rows.items()},
        "rows": rows,
    }
    out = args.out or RESULTS / f"ab-{args.job}-cpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    return result


if __name__ == "__main__":
    main()
