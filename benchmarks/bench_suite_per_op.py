"""Per-op CPU time of the endoscopy-artifacts suite's job on two source trees, interleaved.

The job of ``bench_end_to_end.py``'s artifact suite without its decoding and PNG encoding:
the first two endoscopy sample frames (sorted names, as that benchmark takes them), every
endoscopy op of the catalog at severities 1-5, one ``perturb.apply`` per (op, severity, frame)
with the frame's scene computed once and handed to the ops that protect the border (as
``perturb generate``'s worker does), seed 0, float32 frames. One thread (torch and OpenCV).

Each tree runs in its own long-lived worker process (PYTHONPATH = the tree); the driver sends
the workers one op at a time, alternating which tree goes first, so machine load falls on both
alike. Per op: one untimed warm-up (severity 3 on each frame), then ``--repeats`` timed passes; CPU seconds of the
worker process (``time.process_time``) per pass, the median reported, with a digest of the
outputs (equal digests: the trees' outputs are bit identical).

    python benchmarks/bench_suite_per_op.py --tree r5=/tmp/r5 --tree now=. --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLES = (
    Path(os.environ["PERTURB_SAMPLES_DIR"])
    if os.environ.get("PERTURB_SAMPLES_DIR")
    else REPO.parent / "shared" / "samples"
) / "endoscopy"

WORKER = r'''
import hashlib, json, sys, time
import cv2, numpy as np, torch
torch.set_num_threads(1)
cv2.setNumThreads(1)
from perturb.catalog.ops import get_op
from perturb.catalog.specs import load_specs
from perturb.engine.run import apply
from perturb.scene import Scene
paths = json.loads(sys.argv[1])
frames = []
for p in paths:
    rgb = cv2.cvtColor(cv2.imread(p), cv2.COLOR_BGR2RGB)
    x = torch.from_numpy(rgb).permute(2, 0, 1).float().div(255.0).contiguous()
    frames.append((p.rsplit("/", 1)[-1].rsplit(".", 1)[0], x, Scene.of(x)))
ops = [n for n, s in load_specs().items() if "endoscopy" in s.modalities]
print(json.dumps({"ops": ops}), flush=True)

def run(op, severities=(1, 2, 3, 4, 5)):
    protect = get_op(op).spec.protects_border
    h = hashlib.sha256()
    for sev in severities:
        for name, x, scene in frames:
            out, _ = apply(x[None], op, sev, [name], seed=0, scenes=[scene] if protect else None)
            h.update(out.numpy().tobytes())
    return h.hexdigest()[:16]

for line in sys.stdin:
    op, repeats = line.split()
    if op not in ops:
        print(json.dumps({"op": op, "missing": True}), flush=True)
        continue
    run(op, (3,))  # warm-up: lazy imports and per-shape caches
    cpu, digest = [], ""
    for _ in range(int(repeats)):
        t0 = time.process_time()
        digest = run(op)
        cpu.append(time.process_time() - t0)
    print(json.dumps({"op": op, "cpu_s": cpu, "digest": digest}), flush=True)
'''


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()


def _versions(tree: Path) -> dict[str, int]:
    code = (
        "import json; from perturb.catalog.specs import load_specs; "
        "print(json.dumps({n: s.version for n, s in load_specs().items() if 'endoscopy' in s.modalities}))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def _shape(path: str) -> list[int]:
    import cv2

    img = cv2.imread(path)
    assert img is not None, path
    return list(img.shape[:2])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--op", action="append", help="only these ops")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    trees = {n: Path(p).resolve() for n, p in (t.split("=", 1) for t in args.tree)}
    frames = [str(p) for p in sorted(SAMPLES.glob("*.jpg"))[: args.images]]
    if not frames:
        raise SystemExit(f"no endoscopy samples under {SAMPLES} (set PERTURB_SAMPLES_DIR)")
    workers = {}
    op_lists = {}
    for name, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(frames)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(tree),
        )
        assert proc.stdout is not None
        op_lists[name] = json.loads(proc.stdout.readline())["ops"]
        workers[name] = proc
    ops = args.op or sorted(set().union(*op_lists.values()))
    load_before = os.getloadavg()
    start = time.time()
    rows: dict[str, dict[str, Any]] = {}
    names = list(trees)
    for i, op in enumerate(ops):
        order = names if i % 2 == 0 else names[::-1]
        row: dict[str, Any] = {}
        for name in order:
            proc = workers[name]
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{op} {args.repeats}\n")
            proc.stdin.flush()
            got = json.loads(proc.stdout.readline())
            if got.get("missing"):
                row[name] = None
                continue
            row[name] = {"cpu_s": round(statistics.median(got["cpu_s"]), 3),
                         "runs": [round(c, 3) for c in got["cpu_s"]], "digest": got["digest"]}
        rows[op] = row
        print(op, {n: (r["cpu_s"] if r else None) for n, r in row.items()}, flush=True)
    for proc in workers.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    totals = {n: round(sum(r[n]["cpu_s"] for r in rows.values() if r.get(n)), 3) for n in names}
    import cv2
    import numpy
    import torch

    result = {
        "job": "endoscopy-artifacts suite's op work: every endoscopy op x severities 1-5 x the first "
        f"{args.images} sample frames, perturb.apply per (op, severity, frame), scenes precomputed; "
        "no decode, no PNG encode; one thread",
        "frames": {Path(f).name: _shape(f) for f in frames},
        "repeats": args.repeats,
        "statistic": "median CPU seconds of the worker process per pass (warm: severity 3 on each frame untimed first)",
        "trees": {n: {"path": str(t), "commit": _git(t, "rev-parse", "--short", "HEAD"),
                      "op_versions": _versions(t)} for n, t in trees.items()},
        "environment": {"cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "numpy": numpy.__version__, "opencv": cv2.__version__},
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": round(time.time() - start, 1),
        "totals_cpu_s": totals,
        "ops": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
