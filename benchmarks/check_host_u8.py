"""Check that host ops' uint8 CPU path gives the bytes of the torch-kernel route.

Run once on main (``PYTHONPATH=<main export>``) and once on a branch with ``OUT=<json>``: each
run records a sha256 of every output (8 bench frames as one batch, 4 real frames at their own
size, severities 1/3/5, protect_border True/False, seeds 0 and 7). On a branch where
``perturb.ops.backend.use_backend`` forces the torch route, ``--torch`` also compares the default
route with it in-process and prints the max abs difference. Compare two runs with
``--compare a.json b.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import cv2
import numpy as np
import torch

OPS = os.environ.get(
    "OPS",
    "surgical_smoke,bubbles,fluid_occlusion,lens_fog,lens_droplets,chromatic_aberration,"
    "lens_distortion,interlacing,video_macroblocking",
).split(",")
REAL = Path("/work/shared/samples/endoscopy")


def batches() -> list[tuple[str, torch.Tensor]]:
    import importlib.util

    # the bench's loader from this file's checkout (main's export has no samples beside it)
    spec = importlib.util.spec_from_file_location("_bench_ops", Path(__file__).with_name("bench_ops.py"))
    assert spec is not None and spec.loader is not None
    bench = sys.modules["_bench_ops"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = [("bench32", bench.load_inputs().u8)]
    for f in sorted(REAL.glob("*.jpg"))[-4:]:
        img = cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB)
        out.append((f.stem, torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).unsqueeze(0).contiguous()))
    return out


def run(torch_too: bool) -> dict[str, str]:
    import perturb
    from perturb.ops import backend

    digests: dict[str, str] = {}
    worst: dict[str, int] = {}
    for op in OPS:
        for name, x in batches():
            keys = [f"{name}-{i}" for i in range(x.shape[0])]
            for sev in (1, 3, 5):
                for protect in (True, False):
                    for seed in (0, 7):
                        y, _ = perturb.apply(x, op, sev, keys, seed=seed, protect_border=protect)
                        for i in range(y.shape[0]):
                            tag = f"{op}|{name}|{i}|s{sev}|p{int(protect)}|seed{seed}"
                            digests[tag] = hashlib.sha256(y[i].numpy().tobytes()).hexdigest()
                        if torch_too:
                            with backend.use_backend("torch"):
                                t, _ = perturb.apply(x, op, sev, keys, seed=seed, protect_border=protect)
                            d = int((y.int() - t.int()).abs().max())
                            worst[op] = max(worst.get(op, 0), d)
                            if d:
                                n = int((y != t).sum())
                                print(f"DIFF {op} {name} sev{sev} protect={protect} seed{seed}: max {d}, {n} values", flush=True)
        print(f"{op}: done" + (f", max |cpu - torch| = {worst[op]}" if torch_too else ""), flush=True)
    return digests


def main() -> None:
    if sys.argv[1:2] == ["--compare"]:
        a, b = (json.loads(Path(p).read_text()) for p in sys.argv[2:4])
        bad: dict[str, int] = {}
        for k in a:
            if a[k] != b.get(k):
                bad[k.split("|")[0]] = bad.get(k.split("|")[0], 0) + 1
        ops = sorted({k.split("|")[0] for k in a})
        for op in ops:
            n = sum(1 for k in a if k.startswith(op + "|"))
            print(f"{op}: {n - bad.get(op, 0)}/{n} identical")
        return
    digests = run("--torch" in sys.argv)
    Path(os.environ["OUT"]).write_text(json.dumps(digests, indent=0))


if __name__ == "__main__":
    main()
