"""Scale-out: ``perturb generate --engine ray`` with 1 and 2 CPU workers (and 1 GPU worker where
CUDA exists), the local engine beside them, and the per-stage times of one output (decode,
perturb, encode, write) per device.

    python -m pytest benchmarks/bench_generate_ray.py --benchmark-enable -s

Input: the endoscopy samples beside the repo (../shared/samples/endoscopy, never copied into
the repo), suite kvasir-vqa-x1-transformed (10 JPEG variants per image); per-stage times also
for endoscopy-artifacts (every endoscopy op x 5 severities, PNG) on the first images. A local
Ray instance (``ray.init(num_cpus=2)``) is started once; each engine run includes starting its
workers (actors import torch and open the input), so the results also give a steady-state rate
from a run over all images minus a run over one image. The load average before and after each
run is recorded: the machine may be shared.

Writes benchmarks/results/generate-ray-<device>.json with the device, versions and commit.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.bench_generate import ENDOSCOPY, RESULTS, _device, _images, _versions, merge_results
from tests.helpers import DEVICES

REPO = Path(__file__).resolve().parents[1]
TRACK = "kvasir-vqa-x1-transformed"
ARTIFACTS = "endoscopy-artifacts"
ARTIFACT_IMAGES = 2


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


@pytest.fixture(scope="module")
def results() -> Iterator[dict[str, Any]]:
    data: dict[str, Any] = {}
    load_start = _load()
    yield data
    if not data:
        return
    device = _device()
    path = RESULTS / f"generate-ray-{device['kind']}.json"
    stamp, merged = merge_results(path, data)
    one, two = merged.get("ray_cpu_w1"), merged.get("ray_cpu_w2")
    scaling: dict[str, Any] = {}
    if one and two:
        for key in ("images_per_second", "steady_images_per_second"):
            if one.get(key) and two.get(key):
                speedup = two[key] / one[key]
                scaling[key] = {"speedup_2_vs_1": round(speedup, 2), "efficiency": round(speedup / 2, 2)}
    payload = {
        "benchmark": "bench_generate_ray",
        "device": device,
        "versions": {**_versions(), "ray": _ray_version()},
        **stamp,
        "load_average_start": load_start,
        "load_average_end": _load(),
        "shared_machine_note": "2-core machine shared with other jobs during the run; see load averages",
        "samples": "../shared/samples/endoscopy",
        "scaling_cpu_workers": scaling,
        "results": merged,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path}\n{json.dumps({'scaling': scaling, 'results': merged}, indent=2)}")


def _ray_version() -> str | None:
    try:
        import ray

        return str(ray.__version__)
    except ImportError:
        return None


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'perturb-medvqa[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed")
    ray.init(
        num_cpus=2,
        num_gpus=1 if torch.cuda.is_available() else 0,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
    )
    yield
    ray.shutdown()


def _generate(out: Path, limit: int | None = None, **options: Any) -> Any:
    from perturb.configs.suites import load_suite
    from perturb.generate.core import RunOptions
    from perturb.generate.runner import generate

    shutil.rmtree(out, ignore_errors=True)
    suite = load_suite(TRACK)  # a built-in suite name
    return generate(
        suite, RunOptions(out=out, dataset=str(ENDOSCOPY), limit=limit, progress=False, **options)
    )


def _timed_run(benchmark: Any, out: Path, **options: Any) -> dict[str, Any]:
    """One engine run over all images (its rate, and its rate after the workers' first batches
    came back: the steady state without start-up), and one over a single image (start-up + 10
    outputs)."""
    files = _images()
    start = time.perf_counter()
    _generate(out / "one", limit=1, **options)
    t_one = time.perf_counter() - start
    timing: dict[str, Any] = {}

    def go() -> None:
        timing["load_before"] = _load()
        start = time.perf_counter()
        timing["summary"] = _generate(out / "all", **options)
        timing["s"] = time.perf_counter() - start
        timing["load_after"] = _load()

    benchmark.pedantic(go, rounds=1, iterations=1)
    summary = timing["summary"]
    assert summary.errors == 0 and summary.outputs_written == len(files) * 10
    n = summary.outputs_written
    first = summary.seconds_to_first_output
    # after the first batch is back: the rate once the workers are up
    # outputs of every worker's first batch, which arrive together after start-up
    workers = int(options.get("concurrency") or options.get("workers") or 1)
    first_batches = int(options.get("batch_size", 8)) * 10 * workers
    steady = (
        (n - first_batches) / (summary.seconds - first) if first and n > first_batches else None
    )
    return {
        "outputs": n,
        "images": len(files),
        "seconds": round(timing["s"], 3),
        "images_per_second": round(n / timing["s"], 2),
        "one_image_run_seconds": round(t_one, 3),
        "seconds_to_first_output": round(first, 3) if first else None,
        "steady_images_per_second": round(steady, 2) if steady else None,
        "load_average_before": timing["load_before"],
        "load_average_after": timing["load_after"],
    }


@pytest.mark.parametrize(("workers", "threads"), [(1, 1), (2, 1), (1, None)])
def test_ray_cpu_workers(
    benchmark: Any,
    results: dict[str, Any],
    ray_local: None,
    tmp_path: Path,
    workers: int,
    threads: int | None,
) -> None:
    """1 and 2 single-threaded workers (the scaling pair), and 1 worker with every core's
    threads (the default for one worker)."""
    row = _timed_run(
        benchmark,
        tmp_path,
        engine="ray",
        concurrency=workers,
        gpus_per_worker=0,
        batch_size=4,
        threads=threads,
    )
    name = f"ray_cpu_w{workers}" + ("" if threads else "_all_threads")
    results[name] = {
        **row,
        "engine": "ray",
        "workers": workers,
        "threads_per_worker": threads or os.cpu_count(),
        "batch_size": 4,
    }


def test_local_engine_beside(benchmark: Any, results: dict[str, Any], tmp_path: Path) -> None:
    row = _timed_run(benchmark, tmp_path, engine="local", workers=1, batch_size=4)
    results["local_w1"] = {**row, "engine": "local", "workers": 1, "batch_size": 4}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_ray_one_gpu_worker(
    benchmark: Any, results: dict[str, Any], ray_local: None, tmp_path: Path
) -> None:
    row = _timed_run(
        benchmark, tmp_path, engine="ray", concurrency=1, gpus_per_worker=1, batch_size=16
    )
    results["ray_gpu_w1"] = {**row, "engine": "ray", "workers": 1, "gpus_per_worker": 1}


# ---------------------------------------------------------------------------------------------
# Per-stage times of the job function's steps, one worker, one thread pool (as a Ray worker)


def _stages(config: str, files: list[Path], device: str, out: Path) -> dict[str, Any]:
    from perturb.configs.suites import load_suite
    from perturb.generate.output import encode, quantize
    from perturb.generate.worker import ImageJob, _Decoded, _run_task
    from perturb.io.images import decode_image, write_atomic

    suite = load_suite(config)  # a built-in suite name
    tasks = suite.tasks()
    dev = torch.device(device)
    t = {"read": 0.0, "decode": 0.0, "perturb": 0.0, "encode": 0.0, "write": 0.0}
    outputs, pixels = 0, 0
    for path in files:
        start = time.perf_counter()
        data = path.read_bytes()
        t["read"] += time.perf_counter() - start
        start = time.perf_counter()
        arr = decode_image(data)
        t["decode"] += time.perf_counter() - start
        d = _Decoded(ImageJob(path.stem, path.stem, data, []), arr)
        for task in tasks:
            start = time.perf_counter()
            ys, _, _ = _run_task(task, [d], suite, suite.seed, dev)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t["perturb"] += time.perf_counter() - start
            start = time.perf_counter()
            blob = encode(quantize(ys[0], suite.output, d.bit_depth), suite.output)
            t["encode"] += time.perf_counter() - start
            start = time.perf_counter()
            write_atomic(out / task.path(suite, path.stem), blob)
            t["write"] += time.perf_counter() - start
            outputs += 1
            pixels += arr.shape[0] * arr.shape[1]
    per_output_ms = {k: round(1000 * v / outputs, 3) for k, v in t.items()}
    total = sum(t.values())
    return {
        "images": len(files),
        "outputs": outputs,
        "format": suite.output.format,
        "megapixels_per_output": round(pixels / outputs / 1e6, 3),
        "ms_per_output": per_output_ms,
        "share": {k: round(v / total, 3) for k, v in t.items()},
        "images_per_second_one_worker": round(outputs / total, 2),
        "torch_threads": torch.get_num_threads(),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [TRACK, ARTIFACTS])
def test_stage_times(
    benchmark: Any, results: dict[str, Any], tmp_path: Path, device: str, config: str
) -> None:
    files = _images() if config == TRACK else _images()[:ARTIFACT_IMAGES]
    _stages(config, files[:1], device, tmp_path / "warm")  # imports, caches, kernels
    row: dict[str, Any] = {}

    def go() -> None:
        row["load_before"] = _load()
        row.update(_stages(config, files, device, tmp_path / "out"))
        row["load_after"] = _load()

    benchmark.pedantic(go, rounds=1, iterations=1)
    results[f"stages_{config}_{device}"] = {**row, "device": device}
