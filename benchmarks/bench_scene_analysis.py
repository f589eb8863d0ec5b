"""CPU cost of the endoscopy scene analysis (``perturb.scene.analysis._analyse``) per frame: this
tree's against a baseline revision of ``perturb/scene/analysis.py`` (read with ``git show``),
both in one process, interleaved repeat by repeat, one thread (torch and OpenCV), on the sample
frames as the augmentation benchmark decodes them (512 x 512) and at their stored size. Every
frame's descriptor (its JSON text) must be the same under both, or the run stops.

    python -m benchmarks.bench_scene_analysis --baseline h11-merge \\
        --out benchmarks/results/scene-analysis-cpu-r10.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import torch

from benchmarks.bench_augment_dataloader import decode
from benchmarks.bench_torch_batching import cpu_model
from perturb.calibrate.run import default_sample_dir
from perturb.io.images import read_image
from perturb.scene import analysis

REPO = Path(__file__).resolve().parents[1]


def baseline_module(ref: str) -> ModuleType:
    """``perturb/scene/analysis.py`` at git revision ``ref``, imported as its own module."""
    text = subprocess.run(
        ["git", "show", f"{ref}:perturb/scene/analysis.py"],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="scene-baseline-")) / "analysis_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("analysis_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["analysis_baseline"] = module
    spec.loader.exec_module(module)
    return module


def cpu_ms_per_frame(module: ModuleType, frames: list[np.ndarray]) -> float:
    start = time.process_time()
    for img in frames:
        module._analyse(img)
    return (time.process_time() - start) / len(frames) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", default="h11-merge", help="git revision to compare with")
    parser.add_argument("--samples", default="", help="folder of frames (default: the calibration's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    folder = Path(args.samples) if args.samples else default_sample_dir()
    paths = sorted(str(p) for p in folder.glob("*.jpg")) if folder is not None else []
    if not paths:
        raise SystemExit(f"no frames in {folder}")
    sets = {
        "512": [decode(p) for p in paths],
        "full": [np.ascontiguousarray(read_image(p)) for p in paths],
    }
    base = baseline_module(args.baseline)
    for name, frames in sets.items():
        for img in frames:  # same descriptors, and a warm-up of both
            if json.dumps(base._analyse(img)) != json.dumps(analysis._analyse(img)):
                raise SystemExit(f"descriptors differ on a {name} frame")
    load_start = list(os.getloadavg())
    results: dict[str, Any] = {}
    for name, frames in sets.items():
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            runs["before"].append(cpu_ms_per_frame(base, frames))
            runs["after"].append(cpu_ms_per_frame(analysis, frames))
        before, after = float(np.median(runs["before"])), float(np.median(runs["after"]))
        results[name] = {
            "frames": len(frames),
            "shape_first": list(frames[0].shape),
            "before_ms_per_frame_median": round(before, 3),
            "after_ms_per_frame_median": round(after, 3),
            "speedup": round(before / after, 3),
            "before_runs": [round(v, 3) for v in runs["before"]],
            "after_runs": [round(v, 3) for v in runs["after"]],
        }
        print(f"{name}: before {before:.2f} ms/frame, after {after:.2f} ms/frame, x{before / after:.2f}")
    report = {
        "what": "CPU ms per frame of perturb.scene.analysis._analyse (time.process_time), one thread, "
        "baseline and this tree interleaved per repeat in one process; descriptors checked identical",
        "baseline": args.baseline,
        "after": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "opencv": cv2.__version__,
        "torch": torch.__version__,
        "repeats": args.repeats,
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
