"""One core each: perturb-u8 (border protected and not; torch and OpenCV on one thread) beside
albumentations (outputs kept, and each output freed at once: ``-freed``), on 8 of
``bench_ops``'s frames (``FRAMES``), rounds interleaved, best round, ms per frame; the ratios
are to the faster albumentations pattern.

Run from the repo root: ``python benchmarks/onecore_pointwise.py brightness,contrast [out.json]``
(``ROUNDS``, default 7). A before/after check of our own code on a shared machine: the ratio to
albumentations comes from the same run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import torch

sys.path.insert(0, os.getcwd())

from benchmarks import bench_ops
from benchmarks.overrides import apply_with_overrides
from benchmarks.rounds import dropping

FRAMES = int(os.environ.get("FRAMES", "8"))


def measure(name: str, inputs: bench_ops.Inputs, rounds: int) -> dict[str, float]:
    """ms per frame (best round) of each implementation, and albumentations / perturb ratios."""
    case = bench_ops.CASES[name]
    keys = bench_ops.KEYS[:FRAMES]
    fns: dict[str, Callable[[], Any]] = {
        "perturb-u8": apply_with_overrides(inputs.u8, name, case.severity, case.overrides, keys, True),
        "perturb-u8-noborder": apply_with_overrides(inputs.u8, name, case.severity, case.overrides, keys, False),
        "albumentations": case.peers["albumentations"](inputs),
        "albumentations-freed": case.peers["albumentations"].freed(inputs),  # type: ignore[attr-defined]
    }
    fns = {impl: dropping(fn) for impl, fn in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for impl, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[impl] = min(best[impl], time.perf_counter() - start)
    ms = {impl: t / FRAMES * 1000 for impl, t in best.items()}
    peer = min(ms["albumentations"], ms["albumentations-freed"])
    return {
        **{impl: round(v, 3) for impl, v in ms.items()},
        "ratio": round(peer / ms["perturb-u8"], 2),
        "ratio_noborder": round(peer / ms["perturb-u8-noborder"], 2),
    }


def main() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    cv2.setNumThreads(1)
    full = bench_ops.load_inputs()
    inputs = bench_ops.Inputs(
        hwc=full.hwc[:FRAMES], u8=full.u8[:FRAMES].contiguous(), f32=full.f32[:FRAMES].contiguous()
    )
    rounds = int(os.environ.get("ROUNDS", "7"))
    results = {}
    for name in sys.argv[1].split(","):
        results[name] = measure(name, inputs, rounds)
        print(name, results[name], flush=True)
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
