"""Per-op throughput of perturb beside albumentations, imagecorruptions and kornia.augmentation.

Every op of the catalog runs on the same 32 clean endoscopy frames at 720x576 (RGB), once per
implementation, in one pytest-benchmark run; each op is a benchmark group, so peers sit side
by side. What each implementation gets:

* ``perturb-u8``: a uint8 BCHW tensor (what a decoder gives), uint8 out. **The comparison with
  the peers uses this row**: albumentations and imagecorruptions take uint8 images too.
* ``perturb-f32``: the same pixels as float32 BCHW in [0, 1], float32 out.
* ``albumentations`` / ``imagecorruptions``: their native input, 32 uint8 HWC NumPy arrays in a
  Python loop (one call per image, the outputs kept as a data loader's batch); uint8 out.
* ``albumentations-freed``: the same calls with each output dropped before the next call, as
  a loop that writes each image does. The allocator then reuses the memory just freed; kept,
  every output lands on fresh pages and pays their page faults. Both are real ways to use it,
  so both are peers: the fastest peer is the faster of them.
* ``kornia``: float32 BCHW batch of 32 in one call (``kornia.augmentation``, ``p=1``; defocus
  has no kornia augmentation and uses ``kornia.filters.filter2d`` with imagecorruptions' disk).

Our rows time the public path end to end: input validation, keyed parameter records for the 32
samples, the op and the field-of-view border protection where the op's spec asks for it. Where
a family has a reference setting (gaussian sigma = 3 px, JPEG quality 20, ...) our records carry
that exact parameter (``OVERRIDES``) and the peers are set to it; other ops run at severity 3
with the peers at the middle of that severity's range (``benchmarks/README.md``).

Run (see benchmarks/README.md): ``pytest benchmarks/bench_ops.py --benchmark-enable``.
Every round frees its outputs before it ends (``benchmarks.rounds.dropping``), so each round meets the
allocator in the same state. Throughput is ``32 / median`` of the rounds; ``benchmarks/conftest.py`` writes the JSON, the
summary and the table under ``benchmarks/results/``.
"""

from __future__ import annotations

import dataclasses
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
from perturb.catalog.ops import all_ops, get_op

warnings.filterwarnings("ignore", category=UserWarning)  # pkg_resources / albumentations notices

BATCH = 32
HEIGHT, WIDTH = 576, 720
SHORT = min(HEIGHT, WIDTH)
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "endoscopy"
SECONDS = float(os.environ.get("PERTURB_BENCH_SECONDS", "3"))  # time budget per benchmark
# Passes over the whole list; the summary keeps each implementation's best pass (median of its
# rounds), which evens out other processes' load on a shared machine.
REPEATS = int(os.environ.get("PERTURB_BENCH_REPEATS", "1"))
KEYS = [f"frame-{i:02d}" for i in range(BATCH)]

Factory = Callable[["Inputs"], Callable[[], Any]]


@dataclass
class Inputs:
    hwc: list[np.ndarray]  # 32 uint8 HWC RGB
    u8: torch.Tensor  # (32, 3, H, W) uint8
    f32: torch.Tensor  # (32, 3, H, W) float32 in [0, 1]


def load_inputs() -> Inputs:
    files = sorted(SAMPLES.glob("*.jpg"))
    if not files:
        pytest.skip(
            f"no sample images under {SAMPLES} (the repo expects ../shared/samples beside it)"
        )
    frames = []
    for i in range(BATCH):
        img = cv2.cvtColor(cv2.imread(str(files[i % len(files)])), cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        cw = min(w, round(h * WIDTH / HEIGHT))  # centre crop to 5:4, then area resize
        ch = min(h, round(cw * HEIGHT / WIDTH))
        y0, x0 = (h - ch) // 2, (w - cw) // 2
        crop = img[y0 : y0 + ch, x0 : x0 + cw]
        if i >= len(files):  # later copies differ from the first ones: mirrored
            crop = crop[:, ::-1]
        frames.append(
            np.ascontiguousarray(cv2.resize(crop, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA))
        )
    u8 = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()
    return Inputs(hwc=frames, u8=u8, f32=u8.float() / 255.0)


# ---------------------------------------------------------------------------------------------
# Peers


def albu(make: Callable[[], Any]) -> Factory:
    """One call per image; the 32 outputs are kept until the round ends, as a loader's batch."""

    def factory(inputs: Inputs) -> Callable[[], Any]:
        transform = make()
        return lambda: [transform(image=img)["image"] for img in inputs.hwc]

    factory.freed = albu_freed(make)  # type: ignore[attr-defined]
    return factory


def albu_freed(make: Callable[[], Any]) -> Factory:
    """One call per image, each output dropped before the next call, as a writer loop does.

    The allocator then hands the next call the memory just freed; in ``albu``'s pattern every
    output lands on fresh pages, whose first touch costs a page fault (on this VM the LUT ops'
    time is mostly that: ~0.7 ms a 720x576 frame kept, ~0.1 ms freed)."""

    def factory(inputs: Inputs) -> Callable[[], Any]:
        transform = make()

        def run() -> None:
            for img in inputs.hwc:
                transform(image=img)  # the result dict and its image go before the next call

        return run

    return factory


def icorr(name: str, severity: int) -> Factory:
    def factory(inputs: Inputs) -> Callable[[], Any]:
        from imagecorruptions import corrupt

        return lambda: [corrupt(img, severity=severity, corruption_name=name) for img in inputs.hwc]

    return factory


def icorr_fn(fn: Callable[[np.ndarray], np.ndarray]) -> Factory:
    """imagecorruptions' own code where its function cannot run as shipped (see notes)."""

    def factory(inputs: Inputs) -> Callable[[], Any]:
        return lambda: [fn(img) for img in inputs.hwc]

    return factory


def korn(make: Callable[[], Any]) -> Factory:
    def factory(inputs: Inputs) -> Callable[[], Any]:
        module = make()

        def run() -> torch.Tensor:
            with torch.no_grad():
                return module(inputs.f32)

        return run

    return factory


def _icorr_gaussian_blur(img: np.ndarray) -> np.ndarray:
    # imagecorruptions.gaussian_blur calls skimage's gaussian(..., multichannel=True), which
    # current scikit-image rejects; this is the same call with channel_axis (sigma 3 px).
    from skimage.filters import gaussian

    out = gaussian(img / 255.0, sigma=3, channel_axis=-1)
    return np.uint8(np.clip(out, 0, 1) * 255)


def _icorr_jpeg_q20(img: np.ndarray) -> np.ndarray:
    # imagecorruptions.jpeg_compression (PIL) at quality 20; its severities are 25/18/15/10/7.
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=20)
    return np.asarray(Image.open(buf))


def _kornia_defocus() -> Any:
    import kornia
    from imagecorruptions.corruptions import disk

    kernel = torch.from_numpy(disk(radius=6, alias_blur=0.5)).float()[None]

    class Defocus(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return kornia.filters.filter2d(x, kernel, border_type="reflect")

    return Defocus()


def _a() -> Any:
    import albumentations

    return albumentations


def _k() -> Any:
    import kornia.augmentation

    return kornia.augmentation


# ---------------------------------------------------------------------------------------------
# Cases: per op, its severity, exact parameter overrides and the peers' equivalents


@dataclass
class Case:
    severity: int = 3
    overrides: dict[str, float] = field(default_factory=dict)
    peers: dict[str, Factory] = field(default_factory=dict)
    setting: str = ""
    family: str = ""  # the reference family of the targets, where the op is one


CASES: dict[str, Case] = {
    "gaussian_blur": Case(
        overrides={"sigma": 3.0 / SHORT},
        setting="sigma 3 px (radius 9)",
        family="gaussian blur sigma=3 px",
        peers={
            "albumentations": albu(
                lambda: _a().GaussianBlur(blur_limit=(19, 19), sigma_limit=(3, 3), p=1)
            ),
            "imagecorruptions": icorr_fn(_icorr_gaussian_blur),
            "kornia": korn(lambda: _k().RandomGaussianBlur((19, 19), (3.0, 3.0), p=1.0)),
        },
    ),
    "defocus_blur": Case(
        overrides={"radius": 6.0 / SHORT},
        setting="disk radius 6 px (imagecorruptions severity 3: radius 6, alias blur 0.5)",
        family="defocus",
        peers={
            "albumentations": albu(lambda: _a().Defocus(radius=(6, 6), alias_blur=(0.5, 0.5), p=1)),
            "imagecorruptions": icorr("defocus_blur", 3),
            "kornia": korn(_kornia_defocus),
        },
    ),
    "motion_blur": Case(
        overrides={"length": 17.0 / SHORT},
        setting="line 17 px at the keyed angle; albumentations/kornia kernel 17; imagecorruptions severity 3 (its own 31-tap gaussian-weighted line)",
        family="motion blur",
        peers={
            "albumentations": albu(lambda: _a().MotionBlur(blur_limit=(17, 17), p=1)),
            "imagecorruptions": icorr("motion_blur", 3),
            "kornia": korn(lambda: _k().RandomMotionBlur(17, (0.0, 180.0), 0.0, p=1.0)),
        },
    ),
    "gaussian_noise": Case(
        setting="sigma 0.06-0.07 (severity 3); peers sigma 0.065, imagecorruptions severity 1 (0.08)",
        family="gaussian noise",
        peers={
            "albumentations": albu(lambda: _a().GaussNoise(std_range=(0.065, 0.065), p=1)),
            "imagecorruptions": icorr("gaussian_noise", 1),
            "kornia": korn(lambda: _k().RandomGaussianNoise(std=0.065, p=1.0)),
        },
    ),
    "shot_noise": Case(
        setting="90-110 photons at white (severity 3); imagecorruptions severity 1 (60), albumentations scale 0.01",
        family="shot noise",
        peers={
            "albumentations": albu(lambda: _a().ShotNoise(scale_range=(0.01, 0.01), p=1)),
            "imagecorruptions": icorr("shot_noise", 1),
        },
    ),
    "speckle_noise": Case(
        setting="sigma 0.12-0.14 (severity 3); imagecorruptions severity 1",
        peers={
            "albumentations": albu(
                lambda: _a().MultiplicativeNoise(
                    multiplier=(0.87, 1.13), per_channel=True, elementwise=True, p=1
                )
            ),
            "imagecorruptions": icorr("speckle_noise", 1),
        },
    ),
    "impulse_noise": Case(
        setting="2-2.5 % of pixels (severity 3); imagecorruptions severity 1 (3 %)",
        peers={
            "albumentations": albu(lambda: _a().SaltAndPepper(amount=(0.0225, 0.0225), p=1)),
            "imagecorruptions": icorr("impulse_noise", 1),
            "kornia": korn(lambda: _k().RandomSaltAndPepperNoise(amount=(0.0225, 0.0225), p=1.0)),
        },
    ),
    "jpeg": Case(
        overrides={"quality": 20},
        setting="quality 20, 4:2:0 (kornia's RandomJPEG is a differentiable approximation)",
        family="JPEG q=20",
        peers={
            "albumentations": albu(lambda: _a().ImageCompression(quality_range=(20, 20), p=1)),
            "imagecorruptions": icorr_fn(_icorr_jpeg_q20),
            "kornia": korn(lambda: _k().RandomJPEG(jpeg_quality=(20.0, 20.0), p=1.0)),
        },
    ),
    "color_cast": Case(
        setting="von Kries gains, strength 0.09-0.10 (severity 3); peers: per-channel shift / Planckian jitter",
        family="colour shift",
        peers={
            "albumentations": albu(
                lambda: _a().RGBShift(
                    r_shift_limit=(15, 15), g_shift_limit=(-10, -10), b_shift_limit=(-5, -5), p=1
                )
            ),
            "albumentations-planckian": albu(lambda: _a().PlanckianJitter(p=1)),
            "kornia": korn(lambda: _k().RandomRGBShift(0.06, 0.04, 0.02, p=1.0)),
            "kornia-planckian": korn(lambda: _k().RandomPlanckianJitter(p=1.0)),
        },
    ),
    "hue_shift": Case(
        setting="14-17 degrees (severity 3); peers 15 degrees",
        family="colour shift",
        peers={
            "albumentations": albu(
                lambda: _a().HueSaturationValue(
                    hue_shift_limit=(15, 15), sat_shift_limit=(0, 0), val_shift_limit=(0, 0), p=1
                )
            ),
            "kornia": korn(lambda: _k().RandomHue(hue=(15 / 360, 15 / 360), p=1.0)),
        },
    ),
    "saturation": Case(
        setting="factor 1 -/+ 0.45-0.50 (severity 3); peers factor 0.525, imagecorruptions severity 1 (HSV x0.3)",
        family="colour shift",
        peers={
            "albumentations": albu(
                lambda: _a().ColorJitter(
                    brightness=(1, 1), contrast=(1, 1), saturation=(0.525, 0.525), hue=(0, 0), p=1
                )
            ),
            "imagecorruptions": icorr("saturate", 1),
            "kornia": korn(lambda: _k().RandomSaturation(saturation=(0.525, 0.525), p=1.0)),
        },
    ),
    "brightness": Case(
        setting="offset +/-0.12-0.14 (severity 3); peers +0.13, imagecorruptions severity 1 (HSV V +0.1)",
        family="brightness/contrast",
        peers={
            "albumentations": albu(
                lambda: _a().RandomBrightnessContrast(
                    brightness_limit=(0.13, 0.13), contrast_limit=(0, 0), p=1
                )
            ),
            "imagecorruptions": icorr("brightness", 1),
            "kornia": korn(lambda: _k().RandomBrightness(brightness=(1.13, 1.13), p=1.0)),
        },
    ),
    "contrast": Case(
        setting="factor 0.60-0.63 around the mean luma (severity 3); peers 0.615, imagecorruptions severity 1 (0.4)",
        family="brightness/contrast",
        peers={
            "albumentations": albu(
                lambda: _a().RandomBrightnessContrast(
                    brightness_limit=(0, 0), contrast_limit=(-0.385, -0.385), p=1
                )
            ),
            "imagecorruptions": icorr("contrast", 1),
            "kornia": korn(lambda: _k().RandomContrast(contrast=(0.615, 0.615), p=1.0)),
        },
    ),
    "gamma": Case(
        setting="gamma exp(+/-0.32-0.37) (severity 3); peers gamma 1.4",
        peers={
            "albumentations": albu(lambda: _a().RandomGamma(gamma_limit=(140, 140), p=1)),
            "kornia": korn(lambda: _k().RandomGamma(gamma=(1.4, 1.4), p=1.0)),
        },
    ),
    "vignetting": Case(
        setting="1 - 0.45..0.50 r^2 in linear light (severity 3); peers: gaussian illumination fall-off",
        peers={
            "albumentations": albu(
                lambda: _a().Illumination(
                    mode="gaussian", effect_type="darken", intensity_range=(0.2, 0.2), p=1
                )
            ),
            "kornia": korn(
                lambda: _k().RandomGaussianIllumination(gain=(0.2, 0.2), sign=(-1.0, -1.0), p=1.0)
            ),
        },
    ),
    "underexposure": Case(
        setting="gain 0.30-0.33 with fall-off (severity 3); peers: gaussian illumination fall-off",
        peers={
            "albumentations": albu(
                lambda: _a().Illumination(
                    mode="gaussian", effect_type="darken", intensity_range=(0.2, 0.2), p=1
                )
            ),
            "kornia": korn(
                lambda: _k().RandomGaussianIllumination(gain=(0.2, 0.2), sign=(-1.0, -1.0), p=1.0)
            ),
        },
    ),
    "haze": Case(
        setting="transmission 0.60-0.64 (severity 3); peers: albumentations fog (imagecorruptions' fog fails on NumPy 2: np.float_)",
        peers={"albumentations": albu(lambda: _a().RandomFog(fog_coef_range=(0.3, 0.3), p=1))},
    ),
    "specular_glare": Case(
        setting="3-5 clusters (severity 3); peer: albumentations sun flare (a lens flare, the nearest available op)",
        peers={
            "albumentations": albu(
                lambda: _a().RandomSunFlare(flare_roi=(0.2, 0.2, 0.8, 0.8), src_radius=100, p=1)
            )
        },
    ),
}

IMPLS = ("perturb-u8", "perturb-f32")
NO_BORDER = "perturb-u8-noborder"  # same op with protect_border=False: what the border costs
FREED = "-freed"  # suffix of a per-image peer's row run with each output dropped at once


def _ops() -> list[str]:
    """Every endoscopy op of the catalog (RGB frames)."""
    return [
        name
        for name, op in all_ops().items()
        if "endoscopy" in op.spec.modalities and 3 in op.spec.channels
    ]


def _cases() -> list[tuple[int, str, str]]:
    """(pass, op, implementation) in run order: the whole list once per pass, so each
    implementation is measured at several moments (see REPEATS)."""
    pairs = []
    for name in _ops():
        case = CASES.get(name, Case())
        pairs += [(name, impl) for impl in IMPLS]
        if get_op(name).spec.protects_border:
            pairs.append((name, NO_BORDER))
        for peer, factory in case.peers.items():
            pairs.append((name, peer))
            if hasattr(factory, "freed"):
                pairs.append((name, peer + FREED))
    return [(rep, name, impl) for rep in range(REPEATS) for name, impl in pairs]


def ours(name: str, x: torch.Tensor, protect_border: bool | None = None) -> Callable[[], Any]:
    """perturb on ``x``: ``perturb.apply`` at the case's severity, or, with parameter
    overrides, the same steps (validation, records, run_records) with those parameters.
    ``protect_border`` None keeps the op's spec (the real default)."""
    case = CASES.get(name, Case())
    op = get_op(name)
    protect = op.spec.protects_border if protect_border is None else protect_border
    if not case.overrides:
        return lambda: perturb.apply(x, name, case.severity, KEYS, protect_border=protect)
    return apply_with_overrides(x, name, case.severity, case.overrides, KEYS, protect)


def _rounds(fn: Callable[[], Any]) -> int:
    start = time.perf_counter()
    fn()  # warm-up (also fills caches: tables, imports)
    once = time.perf_counter() - start
    return max(3, min(40, math.ceil(SECONDS / max(once, 1e-6))))


def _input_kind(impl: str) -> str:
    if impl in ("perturb-u8", NO_BORDER):
        return "uint8 BCHW tensor"
    if impl == "perturb-f32" or impl.startswith("kornia"):
        return "float32 BCHW tensor"
    if impl.endswith(FREED):
        return "uint8 HWC arrays, one call per image, each output dropped before the next call"
    return "uint8 HWC arrays, one call per image, outputs kept until the round ends"


@pytest.fixture(scope="session")
def inputs() -> Inputs:
    return load_inputs()


@pytest.mark.parametrize(("rep", "op", "impl"), _cases())
def test_throughput(benchmark: Any, inputs: Inputs, rep: int, op: str, impl: str) -> None:
    case = CASES.get(op, Case())
    if impl == "perturb-u8":
        fn = ours(op, inputs.u8)
    elif impl == "perturb-f32":
        fn = ours(op, inputs.f32)
    elif impl == NO_BORDER:
        fn = ours(op, inputs.u8, protect_border=False)
    elif impl.endswith(FREED):
        fn = case.peers[impl.removesuffix(FREED)].freed(inputs)  # type: ignore[attr-defined]
    else:
        fn = case.peers[impl](inputs)
    fn = dropping(fn)
    benchmark.group = op
    benchmark.extra_info.update(
        suite="ops",
        op=op,
        impl=impl,
        rep=rep,
        images=BATCH,
        height=HEIGHT,
        width=WIDTH,
        input=_input_kind(impl),
        severity=case.severity,
        overrides=dataclasses.asdict(case)["overrides"],
        setting=case.setting,
        family=case.family,
    )
    benchmark.pedantic(fn, rounds=_rounds(fn), iterations=1, warmup_rounds=0)
