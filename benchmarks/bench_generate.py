"""End-to-end generation throughput (decode -> perturb -> encode -> write), images/s.

    python -m pytest benchmarks/bench_generate.py --benchmark-enable -s

Runs on the endoscopy samples beside the repo (../shared/samples/endoscopy, never copied into
the repo), side by side in one run:

* ``track_pil_reference``: a per-image PIL re-implementation of the upstream Kvasir-VQA-x1
  recipe (torchvision's parameter sampling with Python's ``random``; PIL crop+resize, rotate,
  affine, all bicubic; ImageEnhance brightness/contrast in ColorJitter's random order; JPEG q75
  save), one process, as the upstream script runs;
* ``track_perturb_w1`` / ``track_perturb_w2``: ``perturb generate kvasir-vqa-x1-transformed``
  with 1 and 2 worker processes (everything included: dataset, manifest, dataset/ build);
* ``artifacts_perturb_w2``: ``endoscopy-artifacts`` (every endoscopy op x 5 severities, PNG) on
  the first images of the folder.

Writes benchmarks/results/generate-<device>.json with the device, versions and commit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SAMPLES = Path(__file__).parents[1].parent / "shared/samples"
ENDOSCOPY = SAMPLES / "endoscopy"
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
VARIANTS = 10
ARTIFACT_IMAGES = 3
TRACK_IMAGES = 8


def _images() -> list[Path]:
    files = sorted(ENDOSCOPY.glob("*.jpg"))
    if not files:
        pytest.skip(f"no sample images under {ENDOSCOPY}")
    return files


def _device() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    info["kind"] = "cuda" if torch.cuda.is_available() else "cpu"
    return info


def _versions() -> dict[str, str]:
    import cv2
    import datasets
    import numpy
    import PIL
    import torch

    import perturb

    return {
        "python": platform.python_version(),
        "perturb": perturb.__version__,
        "torch": torch.__version__,
        "opencv": cv2.__version__,
        "pillow": PIL.__version__,
        "numpy": numpy.__version__,
        "datasets": datasets.__version__,
    }


def _commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def merge_results(path: Path, data: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """(commit/date stamp, the results already in ``path`` updated with ``data``, stamped): a
    run of some of the benchmarks updates their entries only."""
    stamp = {"commit": _commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    merged: dict[str, Any] = {}
    if path.exists():
        merged = json.loads(path.read_text()).get("results", {})
    merged.update({k: {**v, **stamp} for k, v in data.items()})
    return stamp, merged


@pytest.fixture(scope="module")
def results() -> Iterator[dict[str, Any]]:
    data: dict[str, Any] = {}
    yield data
    if not data:
        return
    device = _device()
    path = RESULTS / f"generate-{device['kind']}.json"
    stamp, merged = merge_results(path, data)
    ref = merged.get("track_pil_reference", {}).get("images_per_second")
    for name in ("track_perturb_w1", "track_perturb_w2"):
        if ref and name in merged:
            merged[name]["speedup_vs_pil"] = round(merged[name]["images_per_second"] / ref, 2)
    payload = {
        "benchmark": "bench_generate",
        "device": device,
        "versions": _versions(),
        **stamp,
        "samples": "../shared/samples/endoscopy",
        "results": merged,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path}\n{json.dumps(merged, indent=2)}")


# ---------------------------------------------------------------------------------------------
# The references: standalone scripts beside this file


def _reference(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pil_reference(files: list[Path], out: Path) -> int:
    return int(_reference("ref_track_pil").pil_reference(files, out))


# ---------------------------------------------------------------------------------------------


def _perturb_run(config: str, out: Path, workers: int, limit: int | None = None) -> Any:
    from perturb.configs.suites import load_suite
    from perturb.generate.core import RunOptions
    from perturb.generate.runner import generate

    suite = load_suite(config)  # a built-in suite name
    shutil.rmtree(out, ignore_errors=True)
    options = RunOptions(
        out=out, dataset=str(ENDOSCOPY), workers=workers, batch_size=4, limit=limit, progress=False
    )
    return generate(suite, options)


def _record(
    results: dict[str, Any], name: str, outputs: int, seconds: float, pixels: int, **extra: Any
) -> None:
    results[name] = {
        "outputs": outputs,
        "seconds": round(seconds, 3),
        "images_per_second": round(outputs / seconds, 2),
        "megapixels_per_second": round(pixels / seconds / 1e6, 2),
        **extra,
    }


def _pixels(files: list[Path]) -> list[int]:
    from PIL import Image

    sizes = []
    for f in files:
        with Image.open(f) as im:
            sizes.append(im.size[0] * im.size[1])
    return sizes


def test_track_pil_reference(benchmark: Any, results: dict[str, Any], tmp_path: Path) -> None:
    files = _images()
    timing: dict[str, float] = {}

    def go() -> None:
        start = time.perf_counter()
        timing["n"] = _pil_reference(files, tmp_path / "pil")
        timing["s"] = time.perf_counter() - start

    benchmark.pedantic(go, rounds=1, iterations=1)
    _record(
        results,
        "track_pil_reference",
        int(timing["n"]),
        timing["s"],
        sum(_pixels(files)) * VARIANTS,
        images=len(files),
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_track_perturb(
    benchmark: Any, results: dict[str, Any], tmp_path: Path, workers: int
) -> None:
    files = _images()
    _perturb_run(
        "kvasir-vqa-x1-transformed", tmp_path / "warm", workers=1, limit=1
    )  # imports, caches
    timing: dict[str, Any] = {}

    def go() -> None:
        start = time.perf_counter()
        timing["summary"] = _perturb_run(
            "kvasir-vqa-x1-transformed", tmp_path / "out", workers=workers
        )
        timing["s"] = time.perf_counter() - start

    benchmark.pedantic(go, rounds=1, iterations=1)
    summary = timing["summary"]
    assert summary.errors == 0 and summary.outputs_written == len(files) * VARIANTS
    _record(
        results,
        f"track_perturb_w{workers}",
        summary.outputs_written,
        timing["s"],
        sum(_pixels(files)) * VARIANTS,
        images=len(files),
        workers=workers,
    )


def test_artifacts_perturb(benchmark: Any, results: dict[str, Any], tmp_path: Path) -> None:
    files = _images()[:ARTIFACT_IMAGES]
    timing: dict[str, Any] = {}

    def go() -> None:
        start = time.perf_counter()
        timing["summary"] = _perturb_run(
            "endoscopy-artifacts", tmp_path / "out", workers=2, limit=ARTIFACT_IMAGES
        )
        timing["s"] = time.perf_counter() - start

    benchmark.pedantic(go, rounds=1, iterations=1)
    summary = timing["summary"]
    assert summary.errors == 0
    per_image = summary.outputs_written // max(1, len(files))
    _record(
        results,
        "artifacts_perturb_w2",
        summary.outputs_written,
        timing["s"],
        sum(_pixels(files)) * per_image,
        images=len(files),
        workers=2,
    )


# ---------------------------------------------------------------------------------------------
# Side by side, CLI start-up included: each side is one process started from the shell


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _frames(tmp: Path, n: int) -> Path:
    """The first ``n`` sample frames in a folder of their own (both sides read the same)."""
    folder = tmp / f"frames{n}"
    folder.mkdir()
    for f in _images()[:n]:
        shutil.copy(f, folder / f.name)
    return folder


def _timed(cmd: list[str]) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # default threads
    env["PYTHONPATH"] = str(REPO)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def _size_of(folder: Path, suffix: str) -> int:
    return sum(p.stat().st_size for p in folder.rglob(f"*{suffix}"))


def _side_by_side(
    results: dict[str, Any],
    name: str,
    frames: Path,
    reference: str,
    config: str,
    ext: str,
    tmp: Path,
) -> None:
    """Reference script and ``perturb generate`` (one process each), ``REPEATS`` times in
    alternation; each side's best wall time is kept."""
    repeats = int(os.environ.get("PERTURB_BENCH_REPEATS", "2"))
    best: dict[str, float] = {}
    info: dict[str, Any] = {"load_before": _load()}
    for r in range(repeats):
        ref_out, our_out = tmp / f"ref{r}", tmp / f"ours{r}"
        seconds, stdout = _timed(
            [sys.executable, str(Path(__file__).with_name(reference)), str(frames), str(ref_out)]
        )
        best["reference"] = min(best.get("reference", 1e9), seconds)
        info["reference_outputs"] = int(stdout.strip().splitlines()[-1])
        info["reference_bytes"] = _size_of(ref_out, ext)
        seconds, stdout = _timed(
            [
                sys.executable,
                "-m",
                "perturb.cli",
                "generate",
                config,
                "--dataset",
                str(frames),
                "--out",
                str(our_out),
                "--quiet",
                "--json",
            ]
        )
        best["perturb"] = min(best.get("perturb", 1e9), seconds)
        summary = json.loads(stdout)
        assert summary["errors"] == 0
        info["perturb_outputs"] = summary["outputs_written"]
        info["perturb_bytes"] = summary["bytes_written"]
        info["perturb_dataset_bytes"] = sum(
            p.stat().st_size for p in (our_out / "dataset").rglob("*") if p.is_file()
        )
        shutil.rmtree(ref_out)
        shutil.rmtree(our_out)
    info["load_after"] = _load()
    ref_rate = info["reference_outputs"] / best["reference"]
    our_rate = info["perturb_outputs"] / best["perturb"]
    results[name] = {
        "images": len(list(frames.iterdir())),
        "repeats": repeats,
        "reference_seconds": round(best["reference"], 2),
        "perturb_seconds": round(best["perturb"], 2),
        "reference_outputs_per_second": round(ref_rate, 2),
        "perturb_outputs_per_second": round(our_rate, 2),
        "ratio": round(our_rate / ref_rate, 2),
        **info,
    }


def test_artifacts_side_by_side(results: dict[str, Any], tmp_path: Path) -> None:
    """endoscopy-artifacts (22 ops x 5 severities, PNG) vs albumentations + OpenCV PNG."""
    frames = _frames(tmp_path, ARTIFACT_IMAGES)
    _side_by_side(
        results,
        "artifacts_vs_albumentations",
        frames,
        "ref_artifacts_albumentations.py",
        "endoscopy-artifacts",
        ".png",
        tmp_path,
    )


def test_track_side_by_side(results: dict[str, Any], tmp_path: Path) -> None:
    """kvasir-vqa-x1-transformed (10 variants, JPEG q75) vs the upstream recipe in PIL."""
    frames = _frames(tmp_path, TRACK_IMAGES)
    _side_by_side(
        results,
        "track_vs_pil",
        frames,
        "ref_track_pil.py",
        "kvasir-vqa-x1-transformed",
        ".jpg",
        tmp_path,
    )
