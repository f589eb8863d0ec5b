"""End-to-end decode + augment throughput of the DALI pipeline (``perturb.augment.dali``).

    pytest benchmarks/bench_dali.py --benchmark-enable \
        --benchmark-json benchmarks/results/dali-cpu.json

The real endoscopy JPEGs beside the repo (../shared/samples/endoscopy, 21 frames of 529-1080
lines; never copied into the repo), cycled to ``ITEMS`` dataset items, are read, decoded,
resized to 448x448, augmented and normalised to float32 BCHW in batches of 64. One round is
one epoch over the items (a new epoch each round: new keyed draws, nothing cached). Rows
(``extra_info.impl``), on each device:

* ``dali-decode-resize``: the DALI pipeline without a policy (the baseline: decode, resize,
  normalise);
* ``dali-augment-2op``: the same with a 2-op policy (every sample: rotation and brightness at
  severity 3, in a keyed order; the setting of bench_augment.py);
* ``dali-augment-endoscopy``: with the shipped ``augment-endoscopy`` policy (1-3 of 10 ops,
  probability 0.9; translation runs as DALI's fn.slice);
* ``torch-decode-resize``: OpenCV decode + ``cv2.resize`` (area: antialiased, as DALI's
  default linear resize with antialiasing) on a thread pool of
  ``THREADS`` workers, stacked to a uint8 BCHW tensor, normalised in torch;
* ``torch-augment-2op``: the same plus ``perturb.Augment`` with the 2-op policy.

``test_interleaved_rounds`` runs the five rows once each per round, in turn, so that on a
shared machine they see the same load (the summary's ``interleaved`` entry).

``cpu`` runs DALI's CPU pipeline (``num_threads=THREADS``); ``cuda`` (skipped without a GPU)
decodes with DALI's "mixed" nvJPEG decoder and runs the kernels on the GPU, the torch rows
moving the uint8 batch to the GPU before augmenting. At the end of the module a summary (img/s
per device and row, ratios to the baselines, device and versions from ``conftest.environment``
plus DALI's version) goes to ``benchmarks/results/dali-<tag>-summary.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -e '.[dali]')")

import nvidia.dali

from benchmarks.conftest import RESULTS, TAG, environment
from perturb.augment import Augment, load_policy
from perturb.augment.dali import dali_loader
from tests.helpers import DEVICES

BATCH = 64
SIZE = 448
ITEMS = int(os.environ.get("PERTURB_BENCH_DALI_ITEMS", "128"))  # 2 batches per round
ROUNDS = int(os.environ.get("PERTURB_BENCH_DALI_ROUNDS", "3"))
THREADS = int(os.environ.get("PERTURB_BENCH_DALI_THREADS", str(min(os.cpu_count() or 1, 8))))
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "endoscopy"
POLICY_2OP = load_policy(
    {
        "policy": "bench-2op",
        "ops": ["rotation", "brightness"],
        "num_ops": 2,
        "probability": 1.0,
        "severity": 3,
    }
)
POLICIES = {"2op": POLICY_2OP, "endoscopy": load_policy("augment-endoscopy")}
_RESULTS: dict[str, dict[str, dict[str, float]]] = {}  # device -> statistic -> impl -> img/s
_INTERLEAVED: dict[str, dict[str, dict[str, float]]] = {}


def _files() -> list[Path]:
    files = sorted(SAMPLES.glob("*.jpg"))
    if not files:
        pytest.skip(
            f"no sample images under {SAMPLES} (the repo expects ../shared/samples beside it)"
        )
    return [files[i % len(files)] for i in range(ITEMS)]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def dali_epoch(device: str, policy: str | None) -> Callable[[], int]:
    loader = dali_loader(
        _files(),
        None if policy is None else POLICIES[policy],
        seed=0,
        size=SIZE,
        batch_size=BATCH,
        device="gpu" if device == "cuda" else "cpu",
        num_threads=THREADS,
    )

    def run() -> int:
        n = sum(int(batch.images.shape[0]) for batch in loader)
        _sync(device)
        return n

    return run


def _decode(path: Path) -> np.ndarray:
    img = cv2.imdecode(np.fromfile(path, dtype=np.uint8), cv2.IMREAD_COLOR)
    img = cv2.resize(img, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def torch_epoch(device: str, policy: str | None) -> Callable[[], int]:
    files = _files()
    pool = ThreadPoolExecutor(THREADS)
    augment = None if policy is None else Augment(POLICIES[policy], seed=0)
    epochs: Iterator[int] = iter(range(10**9))

    def run() -> int:
        epoch, n = next(epochs), 0
        for start in range(0, len(files), BATCH):
            chunk = files[start : start + BATCH]
            frames = list(pool.map(_decode, chunk))
            x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous().to(device)
            if augment is not None:
                out = augment(x, list(range(start, start + len(chunk))), epoch=epoch)
                assert isinstance(out, torch.Tensor)
                x = out
            images = x.float().div_(255.0)
            n += int(images.shape[0])
        _sync(device)
        return n

    return run


CASES: dict[str, Callable[[str], Callable[[], int]]] = {
    "dali-decode-resize": lambda d: dali_epoch(d, None),
    "dali-augment-2op": lambda d: dali_epoch(d, "2op"),
    "dali-augment-endoscopy": lambda d: dali_epoch(d, "endoscopy"),
    "torch-decode-resize": lambda d: torch_epoch(d, None),
    "torch-augment-2op": lambda d: torch_epoch(d, "2op"),
}


@pytest.mark.parametrize("impl", list(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_decode_augment_throughput(benchmark: Any, device: str, impl: str) -> None:
    run = CASES[impl](device)
    assert run() == ITEMS  # warm-up epoch: pipeline start, imports, caches
    benchmark.group = f"dali-{device}"
    benchmark.extra_info.update(
        suite="dali", device=device, impl=impl, images=ITEMS, batch=BATCH, height=SIZE, width=SIZE
    )
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    if benchmark.stats is not None:
        stats = benchmark.stats.stats
        rates = _RESULTS.setdefault(device, {})
        rates.setdefault("median", {})[impl] = ITEMS / float(stats.median)
        rates.setdefault("best", {})[impl] = ITEMS / float(stats.min)


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_rounds(benchmark: Any, device: str) -> None:
    """Every row once per round, in turn, so that on a shared machine the rows see the same
    load; pytest-benchmark times the whole round, the rows' own times go to extra_info and
    the summary (``interleaved``)."""
    runs = {impl: make(device) for impl, make in CASES.items()}
    for run in runs.values():
        assert run() == ITEMS  # warm-up
    times: dict[str, list[float]] = {impl: [] for impl in runs}

    def round_of_all() -> None:
        for impl, run in runs.items():
            start = time.perf_counter()
            run()
            times[impl].append(time.perf_counter() - start)

    benchmark.group = f"dali-{device}-interleaved"
    benchmark.extra_info.update(
        suite="dali", device=device, impl="interleaved", images=ITEMS, batch=BATCH, seconds=times
    )
    benchmark.pedantic(round_of_all, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    _INTERLEAVED[device] = {
        "img_per_s": {k: ITEMS / float(np.median(v)) for k, v in times.items()},
        "img_per_s_best_round": {k: ITEMS / min(v) for k, v in times.items()},
    }


@pytest.fixture(scope="module", autouse=True)
def summary() -> Iterator[None]:
    start = time.time()
    yield
    if not _RESULTS and not _INTERLEAVED:
        return
    devices: dict[str, Any] = {}
    for device, by_stat in _RESULTS.items():
        rates, best = by_stat["median"], by_stat["best"]
        base = rates.get("dali-decode-resize")
        torch_rate = rates.get("torch-augment-2op")
        devices[device] = {
            "img_per_s": rates,
            "img_per_s_best_round": best,
            "ms_per_batch_of_64": {k: 1000.0 * BATCH / v for k, v in rates.items()},
            "augment_ms_per_batch_of_64": {
                k: 1000.0 * BATCH * (1 / v - 1 / rates[f"{k.split('-')[0]}-decode-resize"])
                for k, v in rates.items()
                if "augment" in k and f"{k.split('-')[0]}-decode-resize" in rates
            },
            "ratio_to_dali_decode_resize": {k: v / base for k, v in rates.items()} if base else {},
            "ratio_to_torch_augment_2op": (
                {k: v / torch_rate for k, v in rates.items()} if torch_rate else {}
            ),
        }
    for device, rows in _INTERLEAVED.items():
        devices.setdefault(device, {})["interleaved"] = rows
    env = environment()
    env["versions"]["nvidia-dali"] = nvidia.dali.__version__
    out = {
        "statistic": f"{ITEMS} images / median round (one epoch of {ITEMS} items per round)",
        "batch": BATCH,
        "height": SIZE,
        "width": SIZE,
        "items": ITEMS,
        "rounds": ROUNDS,
        "threads": THREADS,
        "inputs": f"{SAMPLES.name}/*.jpg cycled to {ITEMS} items",
        "wall_s": time.time() - start,
        **env,
        "devices": devices,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"dali-{TAG}-summary.json").write_text(json.dumps(out, indent=2) + "\n")
