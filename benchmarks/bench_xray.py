"""Throughput of every chest X-ray op beside its closest peers (albumentations, imagecorruptions).

Input: 16 chest radiographs from ``../shared/samples/xray`` (8-bit PNGs, RGBA ones reduced to
gray), resized to 1024x1024 with area/cubic interpolation in float and stored as **uint16**
(so the frames hold genuine 16-bit levels, not 8-bit values shifted up). Each op is a benchmark
group; its implementations run in the same pytest-benchmark session, side by side:

* ``perturb-u16``: a uint16 (16, 1, 1024, 1024) tensor on the bench device, uint16 out (the
  public ``perturb.apply`` path: validation, keyed records, the op). **Ratios use this row.**
* ``perturb-f32``: the same pixels as float32 in [0, 1].
* ``albumentations``: its native per-image call on float32 HxW arrays in [0, 1] (albumentations
  2.x takes uint8 or float32; several of its transforms reject or rescale uint16, so float32 is
  how it keeps 16-bit depth), one call per image, as a data loader makes them.
* ``imagecorruptions``: uint8 HxW arrays (the only depth it handles: its functions scale by 255
  and clip), one call per image; the 16-bit depth is lost there, which favours it.

Peers where an honest equivalent exists (``CASES``); ops without one run alone and the table says
why. MedMNIST-C (``medmnistc`` 0.1.0 on PyPI) is not run: it pins ``medmnist==3.0.1`` and
``scikit-image==0.23.2`` and imports ``wand`` (ImageMagick) at package import, and its chest
corruptions are imagecorruptions' functions with other severity constants (gaussian/speckle/
impulse/shot noise, blur, brightness, contrast, gamma, JPEG, pixelate), which the
imagecorruptions and albumentations rows already cover.

Device: ``PERTURB_BENCH_DEVICE`` (``cpu`` default, ``cuda``) moves our tensors there (peers stay
on the CPU, as they run); the results tag defaults to the device. Run:
``pytest benchmarks/bench_xray.py --benchmark-enable`` (see benchmarks/README.md).
"""

from __future__ import annotations

import io
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

import perturb
from benchmarks.overrides import apply_with_overrides
from benchmarks.rounds import dropping
from perturb.catalog.ops import all_ops

warnings.filterwarnings("ignore", category=UserWarning)  # pkg_resources / albumentations notices

BATCH = 16
SIZE = 1024
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "xray"
SECONDS = float(os.environ.get("PERTURB_BENCH_SECONDS", "3"))
REPEATS = int(os.environ.get("PERTURB_BENCH_REPEATS", "1"))
DEVICE = os.environ.get("PERTURB_BENCH_DEVICE", "cpu")
KEYS = [f"cxr-{i:02d}" for i in range(BATCH)]
OURS = ("perturb-u16", "perturb-f32")

Factory = Callable[["Inputs"], Callable[[], Any]]


@dataclass
class Inputs:
    f32_hw: list[np.ndarray]  # float32 HxW in [0, 1] (albumentations)
    u8_hw: list[np.ndarray]  # uint8 HxW (imagecorruptions)
    u16: torch.Tensor  # (B, 1, H, W) uint16 on DEVICE
    f32: torch.Tensor  # (B, 1, H, W) float32 in [0, 1] on DEVICE


def _gray(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img.ndim == 3:
        img = cv2.cvtColor(img[..., :3], cv2.COLOR_BGR2GRAY)
    return img.astype(np.float32) / float(np.iinfo(img.dtype).max)


def load_inputs(device: str = DEVICE) -> Inputs:
    files = sorted(SAMPLES.glob("*.png"))
    if not files:
        pytest.skip(
            f"no sample images under {SAMPLES} (the repo expects ../shared/samples beside it)"
        )
    if device.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("PERTURB_BENCH_DEVICE=cuda but no CUDA device is present")
    frames = []
    for i in range(BATCH):
        g = _gray(files[i % len(files)])
        interp = cv2.INTER_AREA if min(g.shape) >= SIZE else cv2.INTER_CUBIC
        g = cv2.resize(g, (SIZE, SIZE), interpolation=interp)
        if i >= len(files):
            g = g[:, ::-1]
        frames.append(np.clip(np.rint(g * 65535.0), 0, 65535).astype(np.uint16))
    stack = np.stack(frames)[:, None]
    u16 = torch.from_numpy(stack.astype(np.int32)).to(torch.uint16).to(device)
    f32_np = stack.astype(np.float32) / 65535.0
    return Inputs(
        f32_hw=[np.ascontiguousarray(f[0]) for f in f32_np],
        u8_hw=[np.ascontiguousarray((f >> 8).astype(np.uint8)) for f in frames],
        u16=u16,
        f32=torch.from_numpy(f32_np).to(device),
    )


# ---------------------------------------------------------------------------------------------
# Peers


def albu(make: Callable[[], Any]) -> Factory:
    def factory(inputs: Inputs) -> Callable[[], Any]:
        transform = make()
        return lambda: [transform(image=img)["image"] for img in inputs.f32_hw]

    return factory


def icorr(name: str, severity: int) -> Factory:
    def factory(inputs: Inputs) -> Callable[[], Any]:
        from imagecorruptions import corrupt

        return lambda: [
            corrupt(img, severity=severity, corruption_name=name) for img in inputs.u8_hw
        ]

    return factory


def _pil_jpeg_q20(inputs: Inputs) -> Callable[[], Any]:
    # imagecorruptions.jpeg_compression is PIL JPEG at its severity's quality (25/18/15/10/7);
    # this is the same call at quality 20 (our override), on its uint8 gray input.
    from PIL import Image

    def one(img: np.ndarray) -> np.ndarray:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=20)
        return np.asarray(Image.open(buf))

    return lambda: [one(img) for img in inputs.u8_hw]


def _a() -> Any:
    import albumentations

    return albumentations


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    severity: int = 3
    overrides: dict[str, float] = field(default_factory=dict)
    peers: dict[str, Factory] = field(default_factory=dict)
    setting: str = ""
    no_peer: str = ""  # why an op runs without a peer


CASES: dict[str, Case] = {
    "xray_quantum_noise": Case(
        setting="dose 0.07-0.09, electronic 3-4 quanta (severity 3); peers: additive gaussian "
        "sigma 0.05, albumentations Poisson shot noise, imagecorruptions shot/gaussian severity 3",
        peers={
            "albumentations-gauss": albu(lambda: _a().GaussNoise(std_range=(0.05, 0.05), p=1)),
            "albumentations-shot": albu(lambda: _a().ShotNoise(scale_range=(0.01, 0.01), p=1)),
            "imagecorruptions-shot": icorr("shot_noise", 3),
            "imagecorruptions-gauss": icorr("gaussian_noise", 3),
        },
    ),
    "xray_grid_lines": Case(no_peer="no library models anti-scatter grid lines / moire"),
    "xray_scatter": Case(
        no_peer="no library models scatter haze (a wide-kernel veiling glare on linear fluence); "
        "fog ops are colour/particle models"
    ),
    "xray_exposure": Case(
        setting="2^(+/-0.65-0.8) gain on linear fluence (severity 3); peer: brightness +0.1",
        peers={
            "albumentations": albu(
                lambda: _a().RandomBrightnessContrast(
                    brightness_limit=(0.1, 0.1), contrast_limit=(0, 0), p=1
                )
            )
        },
    ),
    "xray_window_level": Case(
        setting="centre shift 0.08-0.1, width 0.62-0.68 (severity 3); peer: the same linear "
        "map with clipping, contrast x1.54 and brightness -0.41 (centre 0.59, width 0.65)",
        peers={
            "albumentations": albu(
                lambda: _a().RandomBrightnessContrast(
                    brightness_limit=(-0.41, -0.41), contrast_limit=(0.54, 0.54), p=1
                )
            )
        },
    ),
    "xray_gamma": Case(
        setting="gamma 2^(+/-0.5-0.65) (severity 3); peer gamma 1.5",
        peers={"albumentations": albu(lambda: _a().RandomGamma(gamma_limit=(150, 150), p=1))},
    ),
    "xray_bit_depth": Case(
        overrides={"bits": 5.0},
        setting="32 levels (bits 5, override); peer: albumentations Posterize to 5 bits",
        peers={"albumentations": albu(lambda: _a().Posterize(num_bits=5, p=1))},
    ),
    "xray_burned_text": Case(
        no_peer="albumentations TextImage needs a font file and boxes per call; no drop-in peer"
    ),
    "xray_laterality_marker": Case(no_peer="no library draws radiographic L/R markers"),
    "xray_collimation": Case(no_peer="no library models collimator shutters with penumbra"),
    "xray_monochrome1": Case(
        severity=5,
        overrides={"center_shift": 0.0, "width": 1.0},
        setting="full inversion, identity window (override); peer: albumentations InvertImg",
        peers={"albumentations": albu(lambda: _a().InvertImg(p=1))},
    ),
    "xray_heel_effect": Case(
        setting="fluence 1 - 0.29..0.34 t^2 along the long axis (severity 3); peer: albumentations "
        "linear illumination gradient, intensity 0.2",
        peers={
            "albumentations": albu(
                lambda: _a().Illumination(
                    mode="linear", effect_type="darken", intensity_range=(0.2, 0.2), p=1
                )
            )
        },
    ),
    "xray_motion_blur": Case(
        overrides={"length": 17.0 / SIZE},
        setting="line 17 px at the keyed angle on linear fluence; albumentations kernel 17; "
        "imagecorruptions motion_blur severity 3 (its own kernel)",
        peers={
            "albumentations": albu(lambda: _a().MotionBlur(blur_limit=(17, 17), p=1)),
            "imagecorruptions": icorr("motion_blur", 3),
        },
    ),
    "xray_jpeg": Case(
        overrides={"quality": 20},
        setting="quality 20 (libjpeg baseline; 16-bit comes back on 8-bit levels); peers quality 20",
        peers={
            "albumentations": albu(lambda: _a().ImageCompression(quality_range=(20, 20), p=1)),
            "imagecorruptions": _pil_jpeg_q20,
        },
    ),
}


def _ops() -> list[str]:
    """Every op of the catalog that runs on X-rays and takes 1-channel input."""
    return [
        n for n, op in all_ops().items() if "xray" in op.spec.modalities and 1 in op.spec.channels
    ]


def _cases() -> list[tuple[int, str, str]]:
    pairs = []
    for name in _ops():
        pairs += [(name, impl) for impl in OURS]
        pairs += [(name, peer) for peer in CASES.get(name, Case()).peers]
    return [(rep, name, impl) for rep in range(REPEATS) for name, impl in pairs]


def _sync(x: torch.Tensor) -> None:
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)


def ours(name: str, x: torch.Tensor) -> Callable[[], Any]:
    """``perturb.apply`` at the case's severity, or the same steps with the case's overrides."""
    case = CASES.get(name, Case())
    if not case.overrides:

        def plain() -> Any:
            out = perturb.apply(x, name, case.severity, KEYS)
            _sync(x)
            return out

        return plain
    return apply_with_overrides(
        x, name, case.severity, case.overrides, KEYS, False, sync=lambda: _sync(x)
    )


def _rounds(fn: Callable[[], Any]) -> int:
    start = time.perf_counter()
    fn()  # warm-up (imports, tables, kernels)
    once = time.perf_counter() - start
    return max(3, min(30, math.ceil(SECONDS / max(once, 1e-6))))


def _input_kind(impl: str) -> str:
    if impl == "perturb-u16":
        return f"uint16 (B,1,H,W) tensor on {DEVICE}"
    if impl == "perturb-f32":
        return f"float32 (B,1,H,W) tensor on {DEVICE}"
    if impl.startswith("imagecorruptions"):
        return "uint8 HxW arrays, one call per image"
    return "float32 HxW arrays in [0, 1], one call per image"


@pytest.fixture(scope="session")
def inputs() -> Inputs:
    return load_inputs()


@pytest.mark.parametrize(("rep", "op", "impl"), _cases())
def test_xray_throughput(benchmark: Any, inputs: Inputs, rep: int, op: str, impl: str) -> None:
    case = CASES.get(op, Case())
    if impl == "perturb-u16":
        fn = ours(op, inputs.u16)
    elif impl == "perturb-f32":
        fn = ours(op, inputs.f32)
    else:
        fn = case.peers[impl](inputs)
    benchmark.group = op
    benchmark.extra_info.update(
        suite="xray",
        op=op,
        impl=impl,
        rep=rep,
        images=BATCH,
        height=SIZE,
        width=SIZE,
        device=DEVICE if impl in OURS else "cpu",
        input=_input_kind(impl),
        severity=case.severity,
        overrides=dict(case.overrides),
        setting=case.setting,
        no_peer=case.no_peer,
    )
    benchmark.pedantic(dropping(fn), rounds=_rounds(fn), iterations=1, warmup_rounds=0)
