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

import json
import math
import os
import platform
import random
import shutil
import subprocess
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
# The PIL reference of the upstream recipe


def _torchvision_params(r: random.Random, width: int, height: int) -> dict[str, Any]:
    """torchvision's get_params for RandomResizedCrop -> RandomRotation -> RandomAffine ->
    ColorJitter with the upstream arguments."""
    area, aspect = width * height, width / height
    log_ratio = (math.log(aspect * 0.95), math.log(aspect * 1.05))
    crop = (0, 0, height, width)
    for _ in range(10):
        target = area * r.uniform(0.9, 1.0)
        ar = math.exp(r.uniform(*log_ratio))
        w, h = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
        if 0 < w <= width and 0 < h <= height:
            crop = (r.randint(0, height - h), r.randint(0, width - w), h, w)
            break
    angle = r.uniform(-10, 10)
    tx = round(r.uniform(-0.1 * width, 0.1 * width))
    ty = round(r.uniform(-0.1 * height, 0.1 * height))
    order = list(range(4))
    r.shuffle(order)
    return {
        "crop": crop,
        "angle": angle,
        "tx": tx,
        "ty": ty,
        "order": order,
        "b": r.uniform(0.8, 1.2),
        "c": r.uniform(0.8, 1.2),
    }


def _pil_weak(img: Any, p: dict[str, Any]) -> Any:
    from PIL import Image, ImageEnhance

    width, height = img.size
    i, j, h, w = p["crop"]
    out = img.crop((j, i, j + w, i + h)).resize((width, height), Image.Resampling.BICUBIC)
    out = out.rotate(p["angle"], Image.Resampling.BICUBIC, expand=False, fillcolor=0)
    out = out.transform(
        (width, height),
        Image.Transform.AFFINE,
        (1, 0, -p["tx"], 0, 1, -p["ty"]),
        Image.Resampling.BICUBIC,
        fillcolor=0,
    )
    for k in p["order"]:
        if k == 0:
            out = ImageEnhance.Brightness(out).enhance(p["b"])
        elif k == 1:
            out = ImageEnhance.Contrast(out).enhance(p["c"])
    return out


def _pil_reference(files: list[Path], out: Path) -> int:
    from PIL import Image

    r = random.Random(42)
    n = 0
    for v in range(1, VARIANTS + 1):
        (out / f"variant_{v}").mkdir(parents=True, exist_ok=True)
    for path in files:
        with Image.open(path) as im:
            img = im.convert("RGB")
        for v in range(1, VARIANTS + 1):
            _pil_weak(img, _torchvision_params(r, *img.size)).save(
                out / f"variant_{v}" / f"{path.stem}.jpg"
            )
            n += 1
    return n


# ---------------------------------------------------------------------------------------------


def _perturb_run(config: str, out: Path, workers: int, limit: int | None = None) -> Any:
    from perturb.generate.runner import RunOptions, generate
    from perturb.generate.suite import load_suite

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
