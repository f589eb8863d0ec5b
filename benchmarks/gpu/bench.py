"""GPU benchmarks of perturb beside kornia.augmentation, torchvision.transforms.v2, CV-CUDA and DALI.

    python benchmarks/gpu/bench.py --device cuda            # the full run (run.sh calls it)
    python benchmarks/gpu/bench.py --device cpu --smoke     # tiny sizes: proves the path end to end

One run, one JSON (``benchmarks/results/gpu-<tag>.json``, tag ``cuda`` or ``cpu-smoke``):

* ``ops``: per endoscopy op, per size (720x576 and 1920x1080 RGB, batch 64, uint8 in and out),
  images/s of ``perturb.apply`` (keyed records included) and of each peer that has the op, at a
  comparable setting (``PEERS`` below names each). Peers take their native input: kornia a float32
  batch (the uint8 -> float -> uint8 conversions are timed with it, as a uint8 pipeline pays
  them), torchvision v2 the uint8 batch, CV-CUDA an NHWC uint8 tensor, DALI an HWC uint8 batch
  fed through ``external_source`` on the same device. A peer that is not importable is listed
  under ``peers`` with the reason, never silently left out; a row that fails keeps its error.
* ``generate``: end-to-end generation (decode, ops, encode, write, manifest) of the
  ``kvasir-vqa-x1-transformed`` (track 2) and ``endoscopy-artifacts`` suites, outputs/s.
* ``augment``: ``perturb.Augment`` (the built-in augment-endoscopy policy) per batch of 64 at 448x448,
  ms per batch, with planning and with plans made beforehand.
* ``jpeg_codec``: which JPEG codec the device path uses and its round-trip throughput.
* environment: device name, driver, CUDA, versions of every library, commit, load average.

Timing: each row runs ``warmup`` calls, then calls until ``seconds`` have passed (at least
``min_iters``), synchronising the device after every call; the median call time is reported.
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
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
# the shared sample frames beside the repository, else the real frames shipped in tests/data
SAMPLES = next(
    (d for d in (REPO.parent / "shared" / "samples" / "endoscopy", REPO / "tests" / "data" / "endoscopy") if any(d.glob("*.jpg"))),
    REPO.parent / "shared" / "samples" / "endoscopy",
)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FULL_SIZES = [(720, 576), (1920, 1080)]
SMOKE_SIZES = [(96, 72)]
SMOKE_OPS = ["gaussian_blur", "motion_blur", "brightness", "contrast", "hue_shift", "rotation", "jpeg", "gaussian_noise"]
SEVERITY = 3
SLOW_CALL_S = 5.0


# ---------------------------------------------------------------------------------------------
# Environment


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(module: str) -> str | None:
    try:
        mod = __import__(module, fromlist=["_"])
    except Exception as exc:
        return f"unavailable ({type(exc).__name__}: {str(exc)[:120]})"
    return str(getattr(mod, "__version__", "installed"))


def environment(device: str) -> dict[str, Any]:
    import cv2

    import perturb

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env: dict[str, Any] = {
        "device": device,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "versions": {
            "perturb": perturb.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "opencv": cv2.__version__,
            "kornia": _version("kornia"),
            "kornia_rs": _version("kornia_rs"),
            "torchvision": _version("torchvision"),
            "nvidia.dali": _version("nvidia.dali"),
            "nvidia.nvimgcodec": _version("nvidia.nvimgcodec"),
            "cvcuda": _version("cvcuda"),
        },
        "commit": _run(["git", "-C", str(REPO), "rev-parse", "HEAD"]) or "unknown",
        "dirty": bool(_run(["git", "-C", str(REPO), "status", "--porcelain"])),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda_runtime=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "unknown",
            nvidia_smi=_run(["nvidia-smi", "--query-gpu=name,clocks.max.sm,power.limit", "--format=csv,noheader"]),
        )
    return env


# ---------------------------------------------------------------------------------------------
# Inputs and timing


def _cycled(files: list[Path], n: int, load: Callable[[Path], np.ndarray]) -> list[np.ndarray]:
    """``n`` images (HW or HWC) loaded from ``files``, cycled when there are fewer files than
    ``n``; the repeats flipped (left-right, then up-down) so that every image is distinct."""
    out = []
    for i in range(n):
        img = load(files[i % len(files)])
        if i >= len(files):
            img = img[:, ::-1] if (i // len(files)) % 2 else img[::-1]
        out.append(np.ascontiguousarray(img))
    return out


def frames(width: int, height: int, n: int) -> torch.Tensor:
    """``n`` uint8 RGB frames (BCHW, CPU) from the endoscopy samples, resized to width x height
    (cycled when there are fewer samples than ``n``)."""
    import cv2

    files = sorted(SAMPLES.glob("*.jpg"))
    if not files:
        raise SystemExit(f"no sample images under {SAMPLES}: the benchmark needs ../shared/samples beside the repo or tests/data")

    def load(path: Path) -> np.ndarray:
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        return cv2.cvtColor(cv2.resize(bgr, (width, height), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)

    return torch.stack([torch.from_numpy(rgb).permute(2, 0, 1) for rgb in _cycled(files, n, load)]).contiguous()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timeit(fn: Callable[[], Any], device: str, seconds: float, warmup: int, min_iters: int) -> dict[str, float]:
    """Median and best wall time of ``fn`` (device synchronised after each call). A call that
    takes over ``SLOW_CALL_S`` (host-side sampling of a big batch, say) ends the warm-up and is
    timed twice only, so one slow op cannot use up a leased machine's time."""
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        sync(device)
        if time.perf_counter() - t0 > SLOW_CALL_S:
            min_iters, seconds = 2, 0.0
            break
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return {"median_s": statistics.median(times), "best_s": min(times), "calls": len(times)}


def row(fn_factory: Callable[[], Callable[[], Any]], batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Time one implementation; its failure (import, unsupported op, ...) becomes the row's error."""
    try:
        fn = fn_factory()
        t = timeit(fn, args.device, args.seconds, args.warmup, args.min_iters)
    except Exception as exc:
        text = str(exc).strip()
        return {"error": f"{type(exc).__name__}: {text[:200]}{' ... ' + text[-400:] if len(text) > 600 else text[200:600]}"}
    return {
        "images_per_second": round(batch / t["median_s"], 1),
        "images_per_second_best": round(batch / t["best_s"], 1),
        "ms_per_batch": round(1e3 * t["median_s"], 3),
        "calls": int(t["calls"]),
    }


# ---------------------------------------------------------------------------------------------
# Peers: which library has which op, at what setting


def kornia_peers() -> dict[str, tuple[str, Callable[[int, int], Any]]]:
    """op -> (setting, factory(width, height) -> nn.Module on float32 BCHW)."""
    import kornia.augmentation as K

    def k(make: Callable[[], Any]) -> Callable[[int, int], Any]:
        return lambda w, h: make()

    return {
        "gaussian_blur": ("RandomGaussianBlur 19x19 sigma 3", k(lambda: K.RandomGaussianBlur((19, 19), (3.0, 3.0), p=1.0))),
        "motion_blur": ("RandomMotionBlur kernel 17", k(lambda: K.RandomMotionBlur(17, (0.0, 180.0), 0.0, p=1.0))),
        "gaussian_noise": ("RandomGaussianNoise std 0.065", k(lambda: K.RandomGaussianNoise(std=0.065, p=1.0))),
        "impulse_noise": ("RandomSaltAndPepperNoise 0.0225", k(lambda: K.RandomSaltAndPepperNoise(amount=(0.0225, 0.0225), p=1.0))),
        "jpeg": ("RandomJPEG q20 (a differentiable approximation, not a codec)", k(lambda: K.RandomJPEG(jpeg_quality=(20.0, 20.0), p=1.0))),
        "color_cast": ("RandomRGBShift", k(lambda: K.RandomRGBShift(0.06, 0.04, 0.02, p=1.0))),
        "hue_shift": ("RandomHue 15 deg", k(lambda: K.RandomHue(hue=(15 / 360, 15 / 360), p=1.0))),
        "saturation": ("RandomSaturation 0.525", k(lambda: K.RandomSaturation(saturation=(0.525, 0.525), p=1.0))),
        "brightness": ("RandomBrightness 1.13", k(lambda: K.RandomBrightness(brightness=(1.13, 1.13), p=1.0))),
        "contrast": ("RandomContrast 0.615", k(lambda: K.RandomContrast(contrast=(0.615, 0.615), p=1.0))),
        "gamma": ("RandomGamma 1.4", k(lambda: K.RandomGamma(gamma=(1.4, 1.4), p=1.0))),
        "rotation": ("RandomRotation 11 deg bicubic", k(lambda: K.RandomRotation(degrees=11.0, resample="BICUBIC", p=1.0))),
        "translation": ("RandomAffine translate 0.1", k(lambda: K.RandomAffine(0.0, translate=(0.1, 0.1), p=1.0))),
        "resized_crop": (
            "RandomResizedCrop scale 0.9-1 bicubic",
            lambda w, h: K.RandomResizedCrop((h, w), scale=(0.9, 1.0), resample="BICUBIC", p=1.0),
        ),
    }


def torchvision_peers() -> dict[str, tuple[str, Callable[[int, int], Any]]]:
    """op -> (setting, factory(width, height) -> transform on the uint8 BCHW batch; one draw per
    batch, as v2 transforms a batch)."""
    from torchvision.transforms import InterpolationMode, v2

    bicubic = InterpolationMode.BICUBIC
    return {
        "gaussian_blur": ("GaussianBlur 19 sigma 3", lambda w, h: v2.GaussianBlur(19, 3.0)),
        "brightness": ("ColorJitter brightness 1.13", lambda w, h: v2.ColorJitter(brightness=(1.13, 1.13))),
        "contrast": ("ColorJitter contrast 0.615", lambda w, h: v2.ColorJitter(contrast=(0.615, 0.615))),
        "saturation": ("ColorJitter saturation 0.525", lambda w, h: v2.ColorJitter(saturation=(0.525, 0.525))),
        "hue_shift": ("ColorJitter hue 15 deg", lambda w, h: v2.ColorJitter(hue=(15 / 360, 15 / 360))),
        "rotation": ("RandomRotation 11 bicubic", lambda w, h: v2.RandomRotation(11.0, interpolation=bicubic)),
        "translation": ("RandomAffine translate 0.1", lambda w, h: v2.RandomAffine(0.0, translate=(0.1, 0.1))),
        "resized_crop": ("RandomResizedCrop 0.9-1 bicubic", lambda w, h: v2.RandomResizedCrop((h, w), (0.9, 1.0), interpolation=bicubic)),
        "gamma": ("functional adjust_gamma 1.4", lambda w, h: (lambda x: v2.functional.adjust_gamma(x, 1.4))),
        "jpeg": ("JPEG q20 (per image through libjpeg-turbo on the host)", lambda w, h: v2.JPEG(20)),
    }


def cvcuda_peers() -> dict[str, tuple[str, Callable[[torch.Tensor], Callable[[], Any]]]]:
    """op -> (setting, factory(nhwc uint8 CUDA tensor) -> call). CV-CUDA runs on CUDA only."""
    import cvcuda

    def wrap(x: torch.Tensor) -> Any:
        return cvcuda.as_tensor(x, "NHWC")

    def per_sample(x: torch.Tensor, values: list[float]) -> Any:
        return cvcuda.as_tensor(torch.tensor(values * x.shape[0], dtype=torch.float32, device=x.device), "N")

    def brightness(x: torch.Tensor) -> Callable[[], Any]:
        src = wrap(x)
        b, c = per_sample(x, [1.13]), per_sample(x, [1.0])
        return lambda: cvcuda.brightness_contrast(src, brightness=b, contrast=c)

    def contrast(x: torch.Tensor) -> Callable[[], Any]:
        src = wrap(x)
        b, c = per_sample(x, [1.0]), per_sample(x, [0.615])
        return lambda: cvcuda.brightness_contrast(src, brightness=b, contrast=c)

    def gaussian(x: torch.Tensor) -> Callable[[], Any]:
        src = wrap(x)
        return lambda: cvcuda.gaussian(src, (19, 19), (3.0, 3.0), cvcuda.Border.REFLECT101)

    def rotate(x: torch.Tensor) -> Callable[[], Any]:
        src = wrap(x)
        h, w = x.shape[1:3]
        import cv2

        m = cv2.getRotationMatrix2D((w / 2, h / 2), 11.0, 1.0).reshape(-1).tolist()
        return lambda: cvcuda.warp_affine(src, m, cvcuda.Interp.CUBIC, border_mode=cvcuda.Border.CONSTANT, border_value=[0])

    def hue(x: torch.Tensor) -> Callable[[], Any]:
        src = wrap(x)
        return lambda: cvcuda.color_twist(src, cvcuda.as_tensor(torch.eye(3, 4, device=x.device).contiguous(), "HW"))

    def jpeg(x: torch.Tensor) -> Callable[[], Any]:
        src = wrap(x)
        q = cvcuda.as_tensor(torch.full((x.shape[0],), 20, dtype=torch.int32, device=x.device), "N")
        return lambda: cvcuda.jpeg_compression_distortion(src, q)

    return {
        "brightness": ("brightness_contrast gain 1.13", brightness),
        "contrast": ("brightness_contrast contrast 0.615", contrast),
        "gaussian_blur": ("gaussian 19x19 sigma 3 reflect101", gaussian),
        "rotation": ("warp_affine 11 deg cubic", rotate),
        "hue_shift": ("color_twist 3x4 (identity matrix: the cost, not the hue)", hue),
        "jpeg": ("jpeg_compression_distortion q20", jpeg),
    }


def dali_peers() -> dict[str, tuple[str, Callable[[Any, int, int], Any]]]:
    """op -> (setting, graph(images, width, height) -> DALI node) on HWC uint8."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    return {
        "brightness": ("brightness_contrast brightness 1.13", lambda x, w, h: fn.brightness_contrast(x, brightness=1.13)),
        "contrast": ("brightness_contrast contrast 0.615", lambda x, w, h: fn.brightness_contrast(x, contrast=0.615)),
        "hue_shift": ("hsv hue 15", lambda x, w, h: fn.hsv(x, hue=15.0)),
        "saturation": ("hsv saturation 0.525", lambda x, w, h: fn.hsv(x, saturation=0.525)),
        "gaussian_blur": ("gaussian_blur window 19 sigma 3", lambda x, w, h: fn.gaussian_blur(x, window_size=19, sigma=3.0)),
        # DALI's warps take nearest and linear interpolation only (cubic is rejected)
        "rotation": ("rotate 11 deg LINEAR (DALI warps have no cubic), keep size", lambda x, w, h: fn.rotate(x, angle=11.0, interp_type=types.INTERP_LINEAR, size=(h, w), fill_value=0)),
        "jpeg": ("jpeg_compression_distortion q20", lambda x, w, h: fn.jpeg_compression_distortion(x, quality=20)),
        "gaussian_noise": ("noise.gaussian stddev 16.6", lambda x, w, h: fn.noise.gaussian(x, stddev=0.065 * 255)),
        "shot_noise": ("noise.shot factor 1", lambda x, w, h: fn.noise.shot(x, factor=1.0)),
        "impulse_noise": ("noise.salt_and_pepper 0.0225", lambda x, w, h: fn.noise.salt_and_pepper(x, prob=0.0225)),
        "resized_crop": ("random_resized_crop 0.9-1 cubic", lambda x, w, h: fn.random_resized_crop(x, size=(h, w), random_area=(0.9, 1.0), interp_type=types.INTERP_CUBIC)),
    }


def peer_table(device: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Available peer tables and, for each peer, 'available' or why not."""
    tables: dict[str, dict[str, Any]] = {}
    status: dict[str, str] = {}
    builders: dict[str, Callable[[], dict[str, Any]]] = {
        "kornia": kornia_peers,
        "torchvision": torchvision_peers,
        "cvcuda": cvcuda_peers,
        "dali": dali_peers,
    }
    for name, build in builders.items():
        if name == "cvcuda" and device != "cuda":
            status[name] = "not run: CV-CUDA runs on CUDA devices only"
            continue
        try:
            tables[name] = build()
            status[name] = "available"
        except Exception as exc:
            status[name] = f"unavailable: {type(exc).__name__}: {str(exc)[:160]}"
    return tables, status


def _kornia_call(module: Any, x: torch.Tensor) -> Callable[[], Any]:
    def run() -> torch.Tensor:
        with torch.no_grad():
            out = module(x.float().div_(255.0))
        return out.mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)

    return run


def _dali_call(graph: Callable[[Any, int, int], Any], x: torch.Tensor, device: str) -> Callable[[], Any]:
    from nvidia.dali import fn, pipeline_def

    batch, _, h, w = x.shape
    hwc = x.permute(0, 2, 3, 1).contiguous()
    dali_device = "gpu" if device == "cuda" else "cpu"
    samples = list(hwc) if device == "cuda" else [s.numpy() for s in hwc]

    @pipeline_def(batch_size=batch, num_threads=max(1, min(4, os.cpu_count() or 1)), device_id=0 if device == "cuda" else None, seed=0)
    def pipe() -> Any:
        images = fn.external_source(source=lambda: samples, device=dali_device, layout="HWC", batch=True)
        return graph(images, w, h)

    p = pipe()
    p.build()
    return lambda: p.run()


def _peer_factory(peer: str, make: Any, x: torch.Tensor, size: tuple[int, int], device: str) -> Callable[[], Callable[[], Any]]:
    width, height = size
    if peer == "kornia":
        return lambda: _kornia_call(make(width, height).to(device), x)
    if peer == "torchvision":

        def torchvision_call() -> Callable[[], Any]:
            transform = make(width, height)
            return lambda: transform(x)

        return torchvision_call
    if peer == "cvcuda":
        return lambda: make(x.permute(0, 2, 3, 1).contiguous())
    return lambda: _dali_call(make, x, device)


def op_rows(
    name: str, x: torch.Tensor, keys: list[str], size: tuple[int, int], tables: dict[str, dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """perturb and every peer that has ``name`` on the batch ``x``."""
    import perturb

    entry: dict[str, Any] = {"perturb": row(lambda: (lambda: perturb.apply(x, name, SEVERITY, keys)), args.batch, args)}
    for peer, table in tables.items():
        if name in table:
            setting, make = table[name]
            entry[peer] = {"setting": setting, **row(_peer_factory(peer, make, x, size, args.device), args.batch, args)}
    return entry


def bench_ops(args: argparse.Namespace, tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from perturb.catalog.ops import all_ops

    names = [n for n, op in all_ops().items() if "endoscopy" in op.spec.modalities]
    if args.ops:
        names = [n for n in args.ops.split(",") if n]
    elif args.smoke:
        names = [n for n in SMOKE_OPS if n in names]
    results: dict[str, Any] = {}
    for width, height in args.sizes:
        host = frames(width, height, args.batch)
        x = host.to(args.device)
        if args.device == "cuda":
            x = host.pin_memory().to(args.device, non_blocking=True)
        keys = [f"frame-{i}" for i in range(args.batch)]
        size = f"{width}x{height}"
        for name in names:
            entry = op_rows(name, x, keys, (width, height), tables, args)
            ours = entry["perturb"].get("images_per_second")
            peers = {k: v["images_per_second"] for k, v in entry.items() if k != "perturb" and "images_per_second" in v}
            if ours and peers:
                entry["ratio_to_fastest_peer"] = round(ours / max(peers.values()), 2)
                if "kornia" in peers:
                    entry["ratio_to_kornia"] = round(ours / peers["kornia"], 2)
            results.setdefault(size, {})[name] = entry
            print(f"  {size} {name}: " + ", ".join(f"{k} {v.get('images_per_second', v.get('error', '-'))}" for k, v in entry.items() if isinstance(v, dict)), flush=True)
        del x
    return results


# ---------------------------------------------------------------------------------------------
# Kernels on pre-made parameters, timed with CUDA events (CV-CUDA's method)

XRAY_SAMPLES = next(
    (d for d in (REPO.parent / "shared" / "samples" / "xray", REPO / "tests" / "data" / "xray") if any(d.glob("*.png"))),
    REPO / "tests" / "data" / "xray",
)


def films(side: int, n: int) -> torch.Tensor:
    """``n`` uint16 chest films (B, 1, side, side, CPU) from the X-ray samples, cycled and flipped
    as ``frames`` does."""
    import cv2

    files = sorted(XRAY_SAMPLES.glob("*.png"))
    if not files:
        raise SystemExit(f"no sample films under {XRAY_SAMPLES}")

    def load(path: Path) -> np.ndarray:
        img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if img.ndim == 3:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
        scale = 65535.0 / (65535.0 if img.dtype == np.uint16 else 255.0)
        g = cv2.resize(img.astype(np.float32) * scale, (side, side), interpolation=cv2.INTER_AREA)
        return np.clip(np.rint(g), 0, 65535).astype(np.int32)

    return torch.stack([torch.from_numpy(g)[None] for g in _cycled(files, n, load)]).to(torch.uint16)


def time_events(fn: Callable[[], Any], device: str, warmup: int, iters: int) -> dict[str, float]:
    """Median and best milliseconds of ``fn`` between two CUDA events on the current stream
    (host work inside the call, e.g. a sync, counts as the stream waits for it); on CPU, wall
    time."""
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        sync(device)
        if time.perf_counter() - t0 > SLOW_CALL_S:
            iters = 1
            break
    ms: list[float] = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            ms.append(1e3 * (time.perf_counter() - t0))
    return {"median_ms": statistics.median(ms), "best_ms": min(ms), "calls": len(ms)}


def bench_kernels(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Each op's batched call on parameters drawn beforehand (``run_records`` on records whose
    scenes were analysed and stored once): what the device does per batch once sampling and
    scene analysis are out of the way. Endoscopy ops on RGB uint8 frames at every ``--sizes``,
    X-ray ops on uint16 films at 1024x1024; batches ``args.kernel_batches`` (the largest is
    ``--batch``). ``per_sample_speedup``: per-sample time at batch 1 over that at the largest
    batch (the proof of batching: a per-sample loop gives about 1)."""
    import copy

    from perturb.catalog.ops import all_ops
    from perturb.engine.run import make_records, record_scene, run_records

    ops = all_ops()
    wanted = set(filter(None, args.ops.split(","))) if args.ops else None
    batches = args.kernel_batches
    big = max(batches)
    device = torch.device(args.device)
    results: dict[str, Any] = {"method": "CUDA events around run_records on pre-made records and scenes" if args.device == "cuda" else "wall time (CPU)", "batches": batches}
    drawn: dict[str, Any] = {}
    plan = [("endoscopy", size) for size in args.sizes] + [("xray", (1024, 1024) if not args.smoke else (96, 96))]
    for modality, (width, height) in plan:
        names = [n for n, op in ops.items() if modality in op.spec.modalities and (wanted is None or n in wanted)]
        if args.smoke:
            names = names[:4]
        host = frames(width, height, big) if modality == "endoscopy" else films(width, big)
        x = host.to(device)
        size = f"{width}x{height}" if modality == "endoscopy" else f"{width}x{height} uint16"
        for name in names:
            op = ops[name]
            entry: dict[str, Any] = {}
            try:
                t0 = time.perf_counter()
                if name not in drawn:
                    drawn[name] = make_records(
                        op, [SEVERITY] * big, [f"frame-{i}" for i in range(big)], seed=0,
                        variants=[0] * big, protect_border=op.spec.protects_border, device=device,
                    )
                entry["sampling_s_per_batch"] = round(time.perf_counter() - t0, 3)
                records = copy.deepcopy(drawn[name])
                t0 = time.perf_counter()
                run_records(x, records, record_scenes=True)  # the scenes, analysed once and stored
                sync(args.device)
                entry["first_call_s"] = round(time.perf_counter() - t0, 3)
                # one Scene object per image, reused by every call, as generation reuses one per
                # source image for all its ops: what a scene derives from its frame is made once
                scenes = [record_scene(r, x[i]) if r.protect_border else None for i, r in enumerate(records)]
                for b in batches:
                    xb, rb, sb = x[:b].contiguous(), records[:b], scenes[:b]
                    t = time_events(lambda xb=xb, rb=rb, sb=sb: run_records(xb, rb, scenes=sb), args.device, args.warmup, args.min_iters)
                    entry[f"b{b}"] = {"ms_per_batch": round(t["median_ms"], 3), "best_ms": round(t["best_ms"], 3), "ms_per_sample": round(t["median_ms"] / b, 4), "calls": int(t["calls"])}
                lo, hi = entry[f"b{min(batches)}"], entry[f"b{big}"]
                entry["per_sample_speedup"] = round(lo["ms_per_sample"] / hi["ms_per_sample"], 2) if hi["ms_per_sample"] else None
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            results.setdefault(size, {})[name] = entry
            emit(results)
            print(f"  kernels {size} {name}: " + (entry.get("error") or f"b{big} {entry.get(f'b{big}', {}).get('ms_per_batch')} ms, speedup {entry.get('per_sample_speedup')}"), flush=True)
        del x
    return results


# ---------------------------------------------------------------------------------------------
# Codec, generation, augmentation


def bench_jpeg_codec(args: argparse.Namespace) -> dict[str, Any]:
    from perturb.ops import jpeg as jpeg_ops

    width, height = args.sizes[0]
    x = frames(width, height, args.batch).to(args.device)
    codec = jpeg_ops.jpeg_backend(x.float())
    quality = torch.full((args.batch,), 75.0, device=args.device)
    call = lambda: jpeg_ops.jpeg(x.float().div_(255.0), {"quality": quality}, list(range(args.batch)))  # noqa: E731
    return {"codec": codec, "size": f"{width}x{height}", "quality": 75, **row(lambda: call, args.batch, args)}


def bench_generate(args: argparse.Namespace) -> dict[str, Any]:
    from perturb.configs.suites import load_suite
    from perturb.generate.core import RunOptions
    from perturb.generate.runner import generate

    results: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="perturb-gpu-bench-"))
    dataset = SAMPLES
    if args.smoke:  # tiny copies of the samples: the path end to end, in seconds
        import cv2

        dataset = work / "input"
        dataset.mkdir()
        for path in sorted(SAMPLES.glob("*.jpg"))[: args.generate_images]:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            cv2.imwrite(str(dataset / path.name), cv2.resize(image, SMOKE_SIZES[0], interpolation=cv2.INTER_AREA))
    try:
        for suite_name in ("kvasir-vqa-x1-transformed", "endoscopy-artifacts"):
            suite = load_suite(suite_name)  # a built-in suite, by name
            out = work / suite_name
            options = RunOptions(
                out=out, dataset=str(dataset), limit=args.generate_images, batch_size=args.generate_batch,
                workers=1, device=args.device, progress=False,
            )
            try:
                t0 = time.perf_counter()
                summary = generate(suite, options)
                seconds = time.perf_counter() - t0
            except Exception as exc:
                results[suite_name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "traceback": traceback.format_exc()[-2000:]}
                continue
            outputs = sum(1 for p in out.rglob("*") if p.suffix in (".jpg", ".png") and "dataset" not in p.parts)
            results[suite_name] = {
                "images": args.generate_images, "input": "tiny copies (smoke)" if args.smoke else "samples at native size", "outputs": outputs, "seconds": round(seconds, 3),
                "outputs_per_second": round(outputs / seconds, 2), "summary": str(summary)[:300],
            }
            print(f"  generate {suite_name}: {results[suite_name]['outputs_per_second']} outputs/s", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def bench_augment(args: argparse.Namespace) -> dict[str, Any]:
    from perturb.augment import Augment

    side = args.augment_size
    x = frames(side, side, args.batch).to(args.device)
    indices = list(range(args.batch))
    augment = Augment("augment-endoscopy", seed=0)
    epochs = iter(range(10**9))
    plans = augment.plan(indices, channels=3, device=args.device)
    return {
        "policy": "augment-endoscopy",
        "size": f"{side}x{side}",
        "with_planning": row(lambda: (lambda: augment(x, indices, epoch=next(epochs))), args.batch, args),
        "preplanned": row(lambda: (lambda: augment(x, indices, plans=plans)), args.batch, args),
    }


# ---------------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and iterations: proves the path end to end")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every endoscopy op)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--tag", default="", help="results name (default: cuda, or cpu-smoke)")
    ap.add_argument("--tests", type=Path, default=None, help="JSON of the test run to include")
    ap.add_argument("--peers-install", type=Path, default=None, help="JSON of run.sh's install step")
    ap.add_argument("--seconds", type=float, default=None, help="time per row (default 2, smoke 0)")
    ap.add_argument("--sizes", default="", help="WxH list, e.g. 720x576 (default 720x576,1920x1080; smoke 96x72)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: kernels,ops,jpeg,generate,augment")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA GPU and a CUDA build of torch; use --device cpu")
    smoke = args.smoke
    try:
        sizes = [tuple(int(v) for v in item.lower().split("x")) for item in args.sizes.split(",") if item]
    except ValueError:
        sizes = [()]
    if any(len(size) != 2 or min(size) < 8 for size in sizes):
        ap.error(f"--sizes takes WxH items of at least 8x8, e.g. 720x576,1920x1080; got {args.sizes!r}")
    args.sizes = sizes or (SMOKE_SIZES if smoke else FULL_SIZES)
    args.batch = 4 if smoke else 64
    args.kernel_batches = [1, 4] if smoke else [1, 64]
    args.seconds = args.seconds if args.seconds is not None else (0.0 if smoke else 2.0)
    args.warmup = 1 if smoke else 3
    args.min_iters = 1 if smoke else 5
    args.generate_images = 1 if smoke else 64
    args.generate_batch = 4 if smoke else 64
    args.augment_size = 64 if smoke else 448
    args.tag = args.tag or ("cpu-smoke" if smoke and args.device == "cpu" else args.device + ("-smoke" if smoke else ""))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.perf_counter()
    payload: dict[str, Any] = {"benchmark": "gpu", "smoke": args.smoke, "environment": environment(args.device)}
    payload["settings"] = {
        "sizes": [f"{w}x{h}" for w, h in args.sizes], "batch": args.batch, "dtype": "uint8", "severity": SEVERITY,
        "seconds_per_row": args.seconds, "warmup": args.warmup, "min_iters": args.min_iters,
    }
    for name, path in (("tests", args.tests), ("peers_install", args.peers_install)):
        if path is not None and path.exists():
            payload[name] = json.loads(path.read_text())
    tables, payload["peers"] = peer_table(args.device)
    print(f"peers: {json.dumps(payload['peers'], indent=1)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu-{args.tag}.json"

    def write() -> None:  # after every section (and kernel row): a run cut short keeps what it measured
        payload["seconds"] = round(time.perf_counter() - t0, 1)
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")

    def emit_kernels(partial: dict[str, Any]) -> None:
        payload["kernels"] = partial
        write()

    sections: list[tuple[str, Callable[[], Any]]] = [
        ("kernels", lambda: bench_kernels(args, emit_kernels)),
        ("ops", lambda: bench_ops(args, tables)),
        ("jpeg_codec", lambda: bench_jpeg_codec(args)),
        ("generate", lambda: bench_generate(args)),
        ("augment", lambda: bench_augment(args)),
    ]
    failed = []
    for name, run in sections:
        if name in skip or (name == "jpeg_codec" and "jpeg" in skip):
            payload[name] = "skipped (--skip)"
            continue
        print(f"== {name}", flush=True)
        try:
            payload[name] = run()
        except Exception as exc:
            failed.append(name)
            payload[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            print(payload[name]["traceback"], file=sys.stderr)
        write()
    write()
    print(f"wrote {path} in {payload['seconds']} s")
    if failed:
        print(f"sections that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
