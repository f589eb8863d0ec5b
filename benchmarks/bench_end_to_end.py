"""End to end, side by side, in one run: ``perturb generate`` against the plain scripts it replaces,
given the same cores.

    python benchmarks/bench_end_to_end.py [--repeats 3] [--artifact-images 4] [--track-images 8]

Two jobs on the endoscopy samples beside the repo (``../shared/samples/endoscopy``), each from a
fresh process (CLI start-up, decode, perturb, encode, write, manifest and dataset included):

* ``artifacts``: ``perturb generate endoscopy-artifacts`` (every endoscopy op x 5 severities,
  PNG) against ``ref_artifacts_albumentations.py`` (the nearest albumentations/OpenCV transform
  per op, OpenCV PNG with the suite's encoder settings: zlib level 1, default strategy);
* ``track``: ``perturb generate kvasir-vqa-x1-transformed`` (10 variants, JPEG q75) against
  ``ref_track_pil.py`` (the upstream recipe in PIL).

Each reference runs as one process and as one process per core on an equal share of the
frames (what a user does with a plain script on a multi-core machine); perturb runs with
``--workers`` = cores. Contenders alternate within each repeat (the order rotates between
repeats), after one untimed warm-up of each on one frame (it byte-compiles their modules, as
an installed package has them); the medians are kept. Per run: wall seconds, CPU-seconds (user + system of the
process tree, from ``wait4``), outputs per second and peak RSS (the largest process, and the
sum over concurrent processes). ``--growth``: perturb's peak RSS for the track at 1x, 2x and
4x the images (flat memory as the job grows). ``--baseline PATH``: ``perturb generate`` of
another checkout (its ``perturb`` on PYTHONPATH) is one more contender of the same rotation, and
the ratios of this tree's outputs per CPU-second to the baseline's are reported (an A/B of two
trees in one run). Writes ``benchmarks/results/end-to-end-<tag>.json`` with the CPU model, load
average and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# the samples beside the repo, or under $PERTURB_SAMPLES_DIR (a worktree has none beside it)
SAMPLES = (
    Path(os.environ["PERTURB_SAMPLES_DIR"])
    if os.environ.get("PERTURB_SAMPLES_DIR")
    else REPO.parent / "shared" / "samples"
) / "endoscopy"
RESULTS = REPO / "benchmarks" / "results"


LIKE_FOR_LIKE = {
    "artifacts": "PNG 8-bit RGB, OpenCV's encoder at zlib level 1 with zlib's default strategy on "
    "both sides (perturb's suite setting; the reference passes IMWRITE_PNG_COMPRESSION 1)",
    "track": "JPEG quality 75, 4:2:0, RGB, libjpeg-turbo on both sides (perturb through OpenCV, "
    "the reference through PIL), the same frame size out",
    "perturb_workers": "--workers = cores; on Linux the CLI forks its workers (they inherit the "
    "driver's imports)",
    "bytecode": "both sides run byte-compiled modules (PYTHONPYCACHEPREFIX filled by one untimed "
    "warm-up run of each on one frame), as an installed package has them",
}


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    outputs: int
    peak_rss_mib: float  # the largest single process
    sum_rss_mib: float  # summed over processes that ran at once

    @property
    def outputs_per_s(self) -> float:
        return self.outputs / self.wall_s

    @property
    def outputs_per_cpu_s(self) -> float:
        return self.outputs / self.cpu_s


# Byte-compiled modules on both sides, as an installed package has them: a source checkout
# run with PYTHONDONTWRITEBYTECODE (this machine's setting) compiles perturb's ~80 imported
# modules from source in every process (about 0.5 CPU-s a run). Each contender's modules are
# compiled into this cache by one untimed warm-up run before the timed ones.
PYCACHE = Path(tempfile.gettempdir()) / f"perturb-bench-pycache-{os.getuid()}"


def _env(repo: Path = REPO) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE")
    }
    env["PYTHONPATH"] = str(repo)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env["HF_DATASETS_OFFLINE"] = env["HF_HUB_OFFLINE"] = "1"
    return env


def _run_all(
    cmds: list[list[str]], repo: Path = REPO
) -> tuple[float, float, float, float, list[str]]:
    """Start ``cmds`` at once (in ``repo``, its modules first on PYTHONPATH); wall, CPU-seconds,
    max and summed peak RSS (MiB), stdouts."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            c, cwd=repo, env=_env(repo), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for c in cmds
    ]
    cpu, peaks, outs = 0.0, [], []
    for p, cmd in zip(procs, cmds, strict=True):
        assert p.stdout is not None and p.stderr is not None
        out, err = p.stdout.read(), p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.decode()[-2000:]}")
        cpu += usage.ru_utime + usage.ru_stime
        peaks.append(usage.ru_maxrss / 1024)
        outs.append(out.decode())
    wall = time.perf_counter() - start
    return wall, cpu, max(peaks), sum(peaks), outs


def _shards(frames: list[Path], n: int, tmp: Path) -> list[Path]:
    folders = []
    for i in range(n):
        folder = tmp / f"shard{n}-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in frames[i::n]:
            if not (folder / f.name).exists():
                shutil.copy(f, folder / f.name)
        folders.append(folder)
    return folders


def reference(script: str, frames: list[Path], processes: int, tmp: Path) -> Run:
    folders = _shards(frames, processes, tmp)
    outs = [tmp / f"ref-out-{processes}-{i}" for i in range(processes)]
    cmds = [
        [sys.executable, str(REPO / "benchmarks" / script), str(f), str(o)]
        for f, o in zip(folders, outs, strict=True)
    ]
    wall, cpu, peak, total, stdouts = _run_all(cmds)
    count = sum(int(s.strip().splitlines()[-1]) for s in stdouts)
    for o in outs:
        shutil.rmtree(o, ignore_errors=True)
    return Run(wall, cpu, count, peak, total)


def perturb_run(
    suite: str, frames: list[Path], workers: int, tmp: Path, repo: Path = REPO
) -> Run:
    """``perturb generate`` of the checkout ``repo`` (default: this one)."""
    (folder,) = _shards(frames, 1, tmp)
    out = tmp / "perturb-out"
    cmd = [
        sys.executable,
        "-m",
        "perturb.cli",
        "generate",
        suite,
        "--dataset",
        str(folder),
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--quiet",
        "--json",
    ]
    wall, cpu, peak, total, (stdout,) = _run_all([cmd], repo)
    summary = json.loads(stdout)
    if summary.get("errors"):
        raise SystemExit(f"perturb generate {suite}: {summary['errors']} errors")
    shutil.rmtree(out, ignore_errors=True)
    return Run(wall, cpu, int(summary["outputs_written"]), peak, total)


def _median(runs: list[Run]) -> dict[str, Any]:
    def med(key: str) -> float:
        return round(statistics.median(getattr(r, key) for r in runs), 3)

    return {
        "wall_s": med("wall_s"),
        "cpu_s": med("cpu_s"),
        "outputs": runs[0].outputs,
        "outputs_per_s": med("outputs_per_s"),
        "outputs_per_cpu_s": med("outputs_per_cpu_s"),
        "peak_rss_mib": med("peak_rss_mib"),
        "sum_rss_mib": med("sum_rss_mib"),
        "runs": [asdict(r) for r in runs],
    }


def job(
    name: str,
    suite: str,
    script: str,
    frames: list[Path],
    repeats: int,
    cores: int,
    tmp: Path,
    rotate: int = 0,
    warm_up: bool = True,
    baseline: Path | None = None,
) -> dict[str, Any]:
    contenders: dict[str, Any] = {
        "perturb": lambda: perturb_run(suite, frames, cores, tmp),
        "reference_1_process": lambda: reference(script, frames, 1, tmp),
        f"reference_{cores}_processes": lambda: reference(script, frames, cores, tmp),
    }
    if baseline is not None:
        contenders["perturb_baseline"] = lambda: perturb_run(
            suite, frames, cores, tmp / "baseline", baseline
        )
    runs: dict[str, list[Run]] = {k: [] for k in contenders}
    names = list(contenders)
    # untimed warm-up on one frame: byte-compiles each side's modules (PYCACHE), warms the
    # page cache
    if warm_up:
        perturb_run(suite, frames[:1], cores, tmp / "warm")
        reference(script, frames[:1], 1, tmp / "warm")
        if baseline is not None:
            perturb_run(suite, frames[:1], cores, tmp / "warm-baseline", baseline)
    load_before = os.getloadavg()
    for r in range(repeats):
        first = (r + rotate) % len(names)
        order = names[first:] + names[:first]
        for k in order:
            runs[k].append(contenders[k]())
            print(
                f"{name} repeat {r + 1}/{repeats} {k}: {runs[k][-1]}", file=sys.stderr, flush=True
            )
    out: dict[str, Any] = {
        "images": len(frames),
        "suite": suite,
        "reference": script,
        "repeats": repeats,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    out.update({k: _median(v) for k, v in runs.items()})
    if baseline is not None:
        out["baseline"] = {"path": str(baseline), "commit": _commit(baseline)}
    ours = out["perturb"]
    for k in names[1:]:
        ref = out[k]
        out[f"ratio_vs_{k}"] = {
            "outputs_per_s": round(ours["outputs_per_s"] / ref["outputs_per_s"], 3),
            "outputs_per_cpu_s": round(ours["outputs_per_cpu_s"] / ref["outputs_per_cpu_s"], 3),
        }
    if baseline is not None:  # the baseline against the references, as this tree is above
        base = out["perturb_baseline"]
        for k in names[1:3]:
            out[f"baseline_ratio_vs_{k}"] = {
                "outputs_per_s": round(base["outputs_per_s"] / out[k]["outputs_per_s"], 3),
                "outputs_per_cpu_s": round(
                    base["outputs_per_cpu_s"] / out[k]["outputs_per_cpu_s"], 3
                ),
            }
    return out


def growth(frames: list[Path], cores: int, tmp: Path) -> dict[str, Any]:
    """perturb's peak RSS for the track at 1x, 2x, 4x the frames (flat as the job grows)."""
    rows = {}
    for factor in (1, 2, 4):
        many = tmp / f"growth{factor}"
        many.mkdir(parents=True)
        for k in range(factor):
            for f in frames:
                shutil.copy(f, many / f"{f.stem}_{k}{f.suffix}")
        run = perturb_run(
            "kvasir-vqa-x1-transformed", sorted(many.iterdir()), cores, tmp / f"g{factor}"
        )
        rows[str(len(frames) * factor)] = {
            "peak_rss_mib": round(run.peak_rss_mib, 1),
            "wall_s": round(run.wall_s, 2),
        }
    return rows


def _commit(repo: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()


def environment() -> dict[str, Any]:
    import albumentations
    import cv2
    import numpy
    import PIL
    import torch

    import perturb

    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    commit = _commit(REPO)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {
            "perturb": perturb.__version__,
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "opencv": cv2.__version__,
            "pillow": PIL.__version__,
            "albumentations": albumentations.__version__,
        },
        "commit": commit,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--artifact-images", type=int, default=4)
    parser.add_argument("--track-images", type=int, default=8)
    parser.add_argument("--jobs", default="artifacts,track")
    parser.add_argument("--growth", action="store_true")
    parser.add_argument("--tag", default="cpu")
    parser.add_argument(
        "--rotate", type=int, default=0, help="start the contenders' order this far along"
    )
    parser.add_argument(
        "--no-warm-up", action="store_true", help="the bytecode cache is already filled"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout whose perturb generate joins the rotation (an A/B of two trees)",
    )
    args = parser.parse_args()
    frames = sorted(SAMPLES.glob("*.jpg"))
    if not frames:
        raise SystemExit(f"no endoscopy samples under {SAMPLES}")
    cores = os.cpu_count() or 1
    # versions are read after the runs: importing torch here first would raise this process's
    # peak RSS, which a child inherits across fork+exec in its ru_maxrss
    result: dict[str, Any] = {"load_before": os.getloadavg(), "like_for_like": LIKE_FOR_LIKE}
    jobs = set(args.jobs.split(","))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "artifacts" in jobs:
            result["artifacts"] = job(
                "artifacts",
                "endoscopy-artifacts",
                "ref_artifacts_albumentations.py",
                frames[: args.artifact_images],
                args.repeats,
                cores,
                tmp / "a",
                args.rotate,
                not args.no_warm_up,
                args.baseline,
            )
        if "track" in jobs:
            result["track"] = job(
                "track",
                "kvasir-vqa-x1-transformed",
                "ref_track_pil.py",
                frames[: args.track_images],
                args.repeats,
                cores,
                tmp / "t",
                args.rotate,
                not args.no_warm_up,
                args.baseline,
            )
        if args.growth:
            result["track_memory_growth"] = growth(frames[:4], cores, tmp / "g")
    result["load_after"] = os.getloadavg()
    result["environment"] = environment()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"end-to-end-{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1)[:4000])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
