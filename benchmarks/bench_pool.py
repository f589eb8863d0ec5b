"""How ``perturb generate --workers N`` shares its work between the pool's processes.

    python benchmarks/bench_pool.py SUITE FOLDER [--workers 2] [--repeats 1] [--tag NAME]

Runs ``perturb generate SUITE --dataset FOLDER --workers N`` from a fresh process (as
``bench_end_to_end.py`` does) and polls the process tree every 0.2 s: wall seconds and the CPU-seconds (user + system) of each
process, the driver and every pool worker, as last seen before it exited (their sum: the run's
CPU-seconds, up to the last 0.2 s of each process). On a loaded machine the wall time
says little; the per-process split says whether the workers shared the work (one busy worker and
one idle one is a pool that leaves a core unused). Prints one JSON line per run; ``--tag`` also
writes them to ``benchmarks/results/pool-<tag>.json`` with the CPU model and load averages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def run(suite: str, folder: Path, workers: int) -> dict[str, Any]:
    """One ``perturb generate`` run: wall, tree CPU-seconds, CPU-seconds per process."""
    out = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "perturb.cli", "generate", suite, "--dataset", str(folder)]
    cmd += ["--out", str(out / "o"), "--workers", str(workers), "--quiet", "--json"]
    load = os.getloadavg()
    start = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    root = psutil.Process(child.pid)
    seen: dict[int, float] = {}
    while child.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for proc in procs:
            try:
                seen[proc.pid] = _cpu_seconds(proc)
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr.decode()[-2000:]}")
    summary = json.loads(stdout)
    shutil.rmtree(out, ignore_errors=True)
    driver = seen.pop(child.pid, 0.0)
    # helpers (the resource tracker, the progress queue's feeder) take almost nothing
    per_process = sorted((round(v, 2) for v in seen.values()), reverse=True)
    return {
        "suite": suite,
        "images": len(list(folder.iterdir())),
        "workers": workers,
        "outputs": summary["outputs_written"],
        "wall_s": round(wall, 2),
        "cpu_s": round(driver + sum(per_process), 2),
        "driver_cpu_s": round(driver, 2),
        "children_cpu_s": per_process,
        "load_before": [round(v, 2) for v in load],
        "load_after": [round(v, 2) for v in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tag")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeats):
        row = run(args.suite, args.folder, args.workers)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.tag:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown",
        )
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"pool-{args.tag}.json"
        path.write_text(json.dumps({"cpu": cpu, "cores": os.cpu_count(), "runs": rows}, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
