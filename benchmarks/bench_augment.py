"""Training-augmentation overhead per batch: perturb.Augment beside kornia.augmentation and
albumentations doing the same two ops.

A batch of 64 endoscopy frames at 448x448 (RGB) goes through a 2-op policy: every sample gets
``rotation`` and ``brightness`` at severity 3 (a keyed signed angle of 8-11 degrees, bicubic,
black corners; an additive offset of 0.12-0.14 with a keyed sign), in a keyed order. The peers
get the closest settings they have: ``Rotate(limit=11, bicubic, constant border)`` and
``RandomBrightnessContrast(brightness_limit=0.14, contrast_limit=0)`` (albumentations, per
image on uint8 HWC arrays, as a data loader calls it) and ``RandomRotation(11, bicubic)`` +
``RandomBrightness((0.86, 1.14))`` (kornia, one call on the float32 BCHW batch).

Rows (``extra_info.impl``):

* ``perturb-u8``: ``Augment`` on a uint8 BCHW batch (what a decoder gives), border not protected
  (the peers do not protect the endoscope's frame), planning included;
* ``perturb-u8-border``: the same with brightness's default field-of-view protection;
* ``perturb-f32``: float32 BCHW in [0, 1];
* ``perturb-u8-preplanned``: ``perturb-u8`` with the plans made beforehand
  (``forward(..., plans=)``; in training the DataLoader's workers make them): kernels only;
* ``perturb-plan``: only the host-side keyed plans of the 64 samples (no pixels): the floor
  that planning sets on throughput on any device;
* ``kornia`` and ``albumentations``.

Devices: ``cpu`` and ``cuda`` (skipped without a GPU; albumentations is CPU only).
Run: ``pytest benchmarks/bench_augment.py --benchmark-enable`` (JSON under
benchmarks/results/augment-<tag>.json with device and versions, summary beside it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from benchmarks.rounds import dropping
from perturb.augment import Augment, load_policy, plan_batch
from tests.helpers import DEVICES  # cpu, and cuda (skipped with the reason when absent)

BATCH = 64
SIZE = 448
SECONDS = float(os.environ.get("PERTURB_BENCH_SECONDS", "3"))
# Passes over all implementations, interleaved; the summary keeps each one's best pass (median
# of its rounds), which evens out other processes' load on a shared machine.
REPEATS = int(os.environ.get("PERTURB_BENCH_REPEATS", "1"))
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "endoscopy"
POLICY = {
    "policy": "bench-2op",
    "ops": ["rotation", "brightness"],
    "num_ops": 2,
    "probability": 1.0,
    "severity": 3,
}
def frames() -> list[np.ndarray]:
    """64 uint8 HWC RGB frames at 448x448 from the shared endoscopy samples (centre square,
    area resize; later copies mirrored so they differ)."""
    files = sorted(SAMPLES.glob("*.jpg"))
    if not files:
        pytest.skip(f"no sample images under {SAMPLES} (the repo expects ../shared/samples beside it)")
    out = []
    for i in range(BATCH):
        img = cv2.cvtColor(cv2.imread(str(files[i % len(files)])), cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        s = min(h, w)
        crop = img[(h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
        if i >= len(files):
            crop = crop[:, ::-1]
        out.append(np.ascontiguousarray(cv2.resize(crop, (SIZE, SIZE), interpolation=cv2.INTER_AREA)))
    return out


_FRAMES: list[np.ndarray] = []


def inputs() -> tuple[list[np.ndarray], torch.Tensor]:
    if not _FRAMES:
        _FRAMES.extend(frames())
    return _FRAMES, torch.from_numpy(np.stack(_FRAMES)).permute(0, 3, 1, 2).contiguous()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def ours(device: str, dtype: torch.dtype, protect: bool) -> Callable[[], Any]:
    _, u8 = inputs()
    x = u8.to(device)
    if dtype == torch.float32:
        x = x.float() / 255.0
    augment = Augment(load_policy({**POLICY, "protect_border": protect}), seed=0)
    indices = list(range(BATCH))
    epoch = iter(range(10**9))  # a new epoch each round: new draws, no caching

    def run() -> torch.Tensor:
        out = augment(x, indices, epoch=next(epoch))
        assert isinstance(out, torch.Tensor)
        _sync(device)
        return out

    return run


def preplanned(device: str) -> Callable[[], Any]:
    """Kernels only: the batch's plans made beforehand (as DataLoader workers can make them)."""
    _, u8 = inputs()
    x = u8.to(device)
    augment = Augment(load_policy({**POLICY, "protect_border": False}), seed=0)
    indices = list(range(BATCH))
    plans = augment.plan(indices, channels=3, device=device)

    def run() -> torch.Tensor:
        out = augment(x, indices, plans=plans)
        assert isinstance(out, torch.Tensor)
        _sync(device)
        return out

    return run


def plans_only(device: str) -> Callable[[], Any]:
    policy = load_policy(POLICY)
    epoch = iter(range(10**9))
    return lambda: plan_batch(policy, seed=0, epoch=next(epoch), indices=range(BATCH), channels=3, device=device)


def kornia_peer(device: str) -> Callable[[], Any]:
    import kornia.augmentation as K

    _, u8 = inputs()
    x = (u8.float() / 255.0).to(device)
    module = torch.nn.Sequential(
        K.RandomRotation(degrees=11.0, resample="BICUBIC", p=1.0),
        K.RandomBrightness(brightness=(0.86, 1.14), p=1.0),
    ).to(device)

    def run() -> torch.Tensor:
        with torch.no_grad():
            out = module(x)
        _sync(device)
        return out

    return run


def albumentations_peer(device: str) -> Callable[[], Any]:
    if device != "cpu":
        pytest.skip("albumentations runs on the CPU only")
    import albumentations as A

    hwc, _ = inputs()
    transform = A.Compose(
        [
            A.Rotate(limit=(-11, 11), interpolation=cv2.INTER_CUBIC, border_mode=cv2.BORDER_CONSTANT, p=1.0),
            A.RandomBrightnessContrast(brightness_limit=(-0.14, 0.14), contrast_limit=(0, 0), p=1.0),
        ]
    )
    return lambda: [transform(image=img)["image"] for img in hwc]


IMPLS: dict[str, Callable[[str], Callable[[], Any]]] = {
    "perturb-u8": lambda d: ours(d, torch.uint8, False),
    "perturb-u8-border": lambda d: ours(d, torch.uint8, True),
    "perturb-f32": lambda d: ours(d, torch.float32, False),
    "perturb-u8-preplanned": preplanned,
    "perturb-plan": plans_only,
    "kornia": kornia_peer,
    "albumentations": albumentations_peer,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("repeat", range(REPEATS), ids=lambda r: f"pass{r}")
def test_augment_overhead(benchmark: Any, impl: str, device: str, repeat: int) -> None:
    fn = IMPLS[impl](device)
    fn()  # warm-up (thread pools, kernels, CUDA context)
    benchmark.group = f"augment 2-op policy, batch {BATCH} at {SIZE}x{SIZE}, {device}"
    benchmark.extra_info.update(
        {
            "suite": "augment",
            "impl": impl,
            "device": device,
            "pass": repeat,
            "images": BATCH,
            "height": SIZE,
            "width": SIZE,
            "policy": POLICY,
        }
    )
    benchmark.pedantic(dropping(fn), rounds=max(3, int(SECONDS / _once(fn))), iterations=1)


def _once(fn: Callable[[], Any]) -> float:
    import time

    start = time.perf_counter()
    fn()
    return max(time.perf_counter() - start, 1e-4)
