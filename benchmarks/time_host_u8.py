"""ms per frame of ``perturb.apply`` on the bench frames (``load_inputs``: 32, uint8, 720x576, protected by
the op's default), one thread, best of ROUNDS; ops from argv (comma separated)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

import perturb

torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("_bench_ops", Path(__file__).with_name("bench_ops.py"))
assert spec is not None and spec.loader is not None
bench = sys.modules["_bench_ops"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
x = bench.load_inputs().u8
keys = [f"k{i}" for i in range(x.shape[0])]
rounds = int(os.environ.get("ROUNDS", "3"))
for op in sys.argv[1].split(","):
    perturb.apply(x, op, 3, keys)  # warm (scene cache, imports)
    best = min(
        (lambda t0: (perturb.apply(x, op, 3, keys), time.perf_counter() - t0)[1])(time.perf_counter())
        for _ in range(rounds)
    )
    print(f"{op}: {1000 * best / x.shape[0]:.2f} ms/frame", flush=True)
