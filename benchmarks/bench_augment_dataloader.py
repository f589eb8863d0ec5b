"""Training augmentation inside a torch DataLoader: perturb.Augment("augment-endoscopy") beside an
albumentations pipeline of the same kinds of transforms, on the same endoscopy JPEGs.

Every pipeline reads the same items: the sample JPEGs (``tests.helpers.ENDOSCOPY``, cycled to
``--items`` dataset indices), decoded with OpenCV, the shorter side resized to 512 (area) and
the centre 512x512 cropped, in the DataLoader's workers (2, ``spawn``, batches of 32,
persistent). Each worker keeps the decoded frames (one per source JPEG) after it first decodes
them, so the timed epochs measure augmentation, collation and the transfer to the main process,
not the JPEG decoder (1920x1080 frames take 40-90 ms each to decode and resize here, more than
either augmentation; the warm-up epoch includes it).

* ``decode``: no augmentation (the floor every pipeline pays);
* ``perturb``: ``collate_fn`` stacks the uint8 batch and runs ``Augment("augment-endoscopy",
  carry_scenes=True)`` on it (keyed per (seed, epoch, index); each border-protecting op
  composites into the frame's scene, analysed once per source image and cached per worker);
* ``perturb-whole-frame``: the same policy with ``protect_border: false``, like for like with
  albumentations: every op acts on the whole frame (no scene, no composite into the tissue
  layer, no fill of the tissue behind the aperture for the optics ops), the same ops, order,
  strengths and parameters otherwise;
* ``albumentations``: each item through an ``A.Compose`` in ``__getitem__`` (how it is used),
  mirroring the policy: with probability 0.9, 1 to 3 of RandomResizedCrop (scale 0.88-0.97),
  Rotate (+-11 deg, bicubic, black), Affine translate (+-9 %), brightness, contrast, gamma,
  RGB shift (colour cast), hue shift, saturation, Illumination (darkening, vignetting-like),
  OpticalDistortion and ChromaticAberration at the policy's strength 1-3 ranges. It has no
  field-of-view protection (perturb composites each colour op into the frame's tissue layer;
  contrast also keeps clipped highlights white, which albumentations has no counterpart for).
  Its ``SomeOf`` picks its 12 transforms uniformly (each in 1/6 of the augmented images on
  average), the policy by weight (geometry 2.5 of 7.8, the optics ops 0.8: lens distortion
  and chromatic aberration run less often in perturb, crops and rotations more often).

* ``albumentations-cubic-optics``: the same, with OpticalDistortion and ChromaticAberration
  resampling bicubic (``interpolation=cv2.INTER_CUBIC``) instead of their bilinear default:
  perturb's ``lens_distortion`` and ``chromatic_aberration`` are bicubic remaps (Rotate is set
  to bicubic above for the same reason). perturb's translation is an exact integer shift where
  Affine resamples bilinear: that difference favours perturb and is left as it is.

Epoch 0 of each pipeline starts its workers and warms caches (reported, not in the medians);
then ``REPEATS`` epochs per pipeline, interleaved (the order rotates each repeat), each timed
for wall time, CPU-seconds (the main process by ``resource.getrusage(RUSAGE_SELF)``, the
persistent workers by their ``/proc/<pid>/stat`` utime + stime: ``RUSAGE_CHILDREN`` counts only
children that have exited, so it is recorded once at the end, after the workers exit, as a
cross-check of the whole run including start-up) and peak RSS (``VmHWM`` of each worker,
``ru_maxrss`` of the main process). OpenCV runs single-threaded in every worker (2 workers
on the 2-core machine this was written on); torch runs 1 thread per worker (DataLoader's
default).

Run from the repository root (about 4 minutes on 2 loaded cores):

    python -m benchmarks.bench_augment_dataloader [--repeats 3] [--items 128] [--out PATH]

``--attribute`` instead splits ``Augment.forward``'s CPU time in one process by op, planning,
carried scenes and the rest, and writes ``results/augment-attribution-cpu.json``.

``--per-op`` instead times each op of the policy and each albumentations transform alone, one
thread, on 32 such frames (CPU-ms per image; perturb through ``perturb.apply`` with the frames'
scenes given, at severity 2), and writes ``results/augment-per-op-cpu.json``: what bounds the
DataLoader ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

SIZE = 512
BATCH = 32
WORKERS = 2
POLICY = "augment-endoscopy"
OUT = Path(__file__).resolve().parent / "results" / "augment-dataloader-cpu.json"
_TICKS = os.sysconf("SC_CLK_TCK")


def fixed_batches(frames: list[np.ndarray], count: int = 128) -> list[tuple[torch.Tensor, list[int]]]:
    """``count`` samples of ``frames`` (cycled) as BCHW uint8 batches of ``BATCH`` with their
    dataset indices: the same input for every timed pass."""
    batches = []
    for start in range(0, count, BATCH):
        idx = list(range(start, start + BATCH))
        stack = np.stack([frames[i % len(frames)] for i in idx])
        batches.append((torch.from_numpy(stack).permute(0, 3, 1, 2).contiguous(), idx))
    return batches


def _files() -> list[str]:
    from tests.helpers import ENDOSCOPY

    if not ENDOSCOPY:
        raise SystemExit(
            "no endoscopy samples (set PERTURB_SAMPLES_DIR or put ../shared/samples beside the repo)"
        )
    return [str(p) for p in ENDOSCOPY]


def decode(path: str) -> np.ndarray:
    """HWC uint8 RGB: the JPEG decoded, its shorter side resized to ``SIZE`` (area), the centre
    ``SIZE`` x ``SIZE`` cropped."""
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise SystemExit(f"cannot read {path}")
    img = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    h, w = img.shape[:2]
    s = SIZE / min(h, w)
    nh, nw = max(SIZE, round(h * s)), max(SIZE, round(w * s))
    img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)
    y, x = (nh - SIZE) // 2, (nw - SIZE) // 2
    return np.ascontiguousarray(img[y : y + SIZE, x : x + SIZE])


def albumentations_pipeline(cubic_optics: bool = False) -> Any:
    """The policy's kinds of transforms, as albumentations has them (see the module docstring).
    ``cubic_optics``: OpticalDistortion and ChromaticAberration resample bicubic, as perturb's
    ``lens_distortion`` and ``chromatic_aberration`` do (and as Rotate is set here); their
    default is bilinear, about half the cost of a bicubic remap."""
    import albumentations as A

    optics_interpolation = cv2.INTER_CUBIC if cubic_optics else cv2.INTER_LINEAR

    ops = [
        A.RandomResizedCrop(
            size=(SIZE, SIZE),
            scale=(0.88, 0.97),
            ratio=(0.95, 1.05),
            interpolation=cv2.INTER_CUBIC,
            p=1.0,
        ),
        A.Rotate(
            limit=(-11, 11), interpolation=cv2.INTER_CUBIC, border_mode=cv2.BORDER_CONSTANT, p=1.0
        ),
        A.Affine(translate_percent=(-0.09, 0.09), border_mode=cv2.BORDER_CONSTANT, p=1.0),
        A.RandomBrightnessContrast(brightness_limit=0.17, contrast_limit=0.0, p=1.0),
        A.RandomBrightnessContrast(brightness_limit=0.0, contrast_limit=(-0.52, -0.16), p=1.0),
        A.RandomGamma(gamma_limit=(64, 156), p=1.0),
        A.RGBShift(r_shift_limit=20, g_shift_limit=20, b_shift_limit=20, p=1.0),
        A.HueSaturationValue(hue_shift_limit=8, sat_shift_limit=0, val_shift_limit=0, p=1.0),
        A.HueSaturationValue(hue_shift_limit=0, sat_shift_limit=40, val_shift_limit=0, p=1.0),
        A.Illumination(mode="gaussian", effect_type="darken", intensity_range=(0.1, 0.2), p=1.0),
        A.OpticalDistortion(
            distort_limit=(-0.03, 0.03), interpolation=optics_interpolation, p=1.0
        ),
        A.ChromaticAberration(
            primary_distortion_limit=0.02,
            secondary_distortion_limit=0.0,
            interpolation=optics_interpolation,
            p=1.0,
        ),
    ]
    return A.Compose([A.OneOf([A.SomeOf(ops, n=n) for n in (1, 2, 3)], p=0.9)])


class Items(Dataset):
    """Dataset item ``index`` of ``epoch``: the decoded frame (CHW uint8), optionally through an
    albumentations pipeline, with its index and epoch. Indices come as (epoch, index) pairs
    from ``EpochSampler`` so persistent workers see each epoch."""

    def __init__(
        self, files: list[str], items: int, albumentations: bool, cubic_optics: bool = False
    ) -> None:
        self.files, self.items, self.albumentations = files, items, albumentations
        self.cubic_optics = cubic_optics
        self.transform: Any = None
        self.decoded: dict[int, np.ndarray] = {}  # per worker: each source frame decoded once

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int, int]:
        epoch, index = key
        source = index % len(self.files)
        if source not in self.decoded:
            self.decoded[source] = decode(self.files[source])
        img = self.decoded[source]
        if self.albumentations:
            if self.transform is None:
                self.transform = albumentations_pipeline(self.cubic_optics)
            img = self.transform(image=img)["image"]
        return torch.from_numpy(np.array(img)).permute(2, 0, 1), index, epoch  # a copy: ours


class EpochSampler:
    """Batches of (epoch, index) for the epoch set by ``set_epoch``, in index order."""

    def __init__(self, items: int) -> None:
        self.items, self.epoch = items, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for start in range(0, self.items, BATCH):
            yield [(self.epoch, i) for i in range(start, min(start + BATCH, self.items))]

    def __len__(self) -> int:
        return (self.items + BATCH - 1) // BATCH


class Stack:
    """``collate_fn``: the uint8 BCHW batch, augmented by ``augment`` when given."""

    def __init__(self, augment: torch.nn.Module | None) -> None:
        self.augment = augment

    def __call__(self, batch: list[tuple[torch.Tensor, int, int]]) -> torch.Tensor:
        images = torch.stack([b[0] for b in batch])
        if self.augment is None:
            return images
        out = self.augment(images, [b[1] for b in batch], epoch=batch[0][2])
        assert isinstance(out, torch.Tensor)
        return out


def _single_threaded_opencv(_: int) -> None:
    cv2.setNumThreads(1)


SCENE_ANALYSIS_MS: dict[str, float] = {}  # per perturb pipeline: warm_scenes' CPU-ms per item


def warm_scenes(augment: Any, frames: list[np.ndarray], items: int) -> float:
    """Analyse every item's scene once in this process (``Augment.scenes``), as a training run
    does before it builds its loader (the workers receive the filled cache with the augment):
    the timed epochs then measure the steady state of a long run, whatever each epoch's chains
    need. Returns the CPU-ms per item this took (the first epoch's extra cost when the scenes
    are not analysed beforehand). ``frames``: the decoded source frames (HWC, ``decode``), item
    ``i`` being ``frames[i % len(frames)]``."""
    chw = [np.ascontiguousarray(f.transpose(2, 0, 1)) for f in frames]
    start = time.process_time()
    for index in range(items):
        augment.scenes.scene(index, chw[index % len(chw)])
    return 1e3 * (time.process_time() - start) / items


def make_loader(kind: str, files: list[str], items: int) -> tuple[DataLoader, EpochSampler]:
    sampler = EpochSampler(items)
    augment = None
    if kind.startswith("perturb"):
        from perturb.augment import Augment, load_policy

        policy = load_policy(POLICY)
        if kind == "perturb-whole-frame":
            policy = policy.model_copy(update={"protect_border": False})
        augment = Augment(policy, seed=0, carry_scenes=True)
        SCENE_ANALYSIS_MS[kind] = warm_scenes(augment, [decode(f) for f in files], items)
    loader = DataLoader(
        Items(
            files,
            items,
            albumentations=kind.startswith("albumentations"),
            cubic_optics=kind == "albumentations-cubic-optics",
        ),
        batch_sampler=sampler,
        collate_fn=Stack(augment),
        num_workers=WORKERS,
        multiprocessing_context="spawn",
        persistent_workers=True,
        worker_init_fn=_single_threaded_opencv,
        prefetch_factor=2,
    )
    return loader, sampler


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def _proc_peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _worker_pids(loader: DataLoader) -> list[int]:
    it = loader._iterator  # the persistent workers' iterator
    return [w.pid for w in it._workers] if it is not None else []  # type: ignore[attr-defined]


def run_epoch(loader: DataLoader, sampler: EpochSampler, epoch: int) -> dict[str, Any]:
    sampler.set_epoch(epoch)
    pids = _worker_pids(loader)
    before = {p: _proc_cpu(p) for p in pids}
    main0, wall0 = _self_cpu(), time.perf_counter()
    n = 0
    checksum = 0
    for images in loader:
        n += images.shape[0]
        checksum += int(images[:, :, ::64, ::64].sum())
    wall = time.perf_counter() - wall0
    main = _self_cpu() - main0
    pids = pids or _worker_pids(loader)
    workers = sum(_proc_cpu(p) - before.get(p, 0.0) for p in pids)
    return {
        "epoch": epoch,
        "images": n,
        "wall_s": wall,
        "cpu_s": main + workers,
        "cpu_main_s": main,
        "cpu_workers_s": workers,
        "images_per_s": n / wall,
        "cpu_ms_per_image": 1000 * (main + workers) / n,
        "worker_peak_rss_mb": [_proc_peak_rss_mb(p) for p in pids],
        "checksum": checksum,
    }


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


PER_OP_OUT = OUT.with_name("augment-per-op-cpu.json")


def per_op(files: list[str], rounds: int = 3) -> dict[str, Any]:
    """CPU-ms per image of each policy op (``perturb.apply``, severity 2, scenes given, the CPU
    path) and of each transform of ``albumentations_pipeline`` (per image), one thread."""
    import perturb
    from perturb.augment import load_policy
    from perturb.scene import Scene

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    frames = [decode(files[i % len(files)]) for i in range(BATCH)]
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()
    scenes = [Scene.of(x[i]) for i in range(BATCH)]
    keys = [f"frame{i}" for i in range(BATCH)]
    ours = {}
    for entry in load_policy(POLICY).ops:
        perturb.apply(x, entry.op, 2, keys, scenes=scenes)  # warm
        start = time.process_time()
        for seed in range(rounds):
            perturb.apply(x, entry.op, 2, keys, seed=seed + 1, scenes=scenes)
        ours[entry.op] = {
            "weight": entry.weight,
            "cpu_ms_per_image": 1000 * (time.process_time() - start) / rounds / BATCH,
        }
    peer = {}
    for i, transform in enumerate(albumentations_pipeline().transforms[0].transforms[0].transforms):
        transform(image=frames[0])
        start = time.process_time()
        for _ in range(rounds):
            for img in frames:
                transform(image=img)
        peer[f"{i:02d} {type(transform).__name__}"] = (
            1000 * (time.process_time() - start) / rounds / BATCH
        )
    return {"perturb": ours, "albumentations": peer}


ATTRIBUTION_OUT = OUT.with_name("augment-attribution-cpu.json")


def attribute(files: list[str], epochs: int = 3) -> dict[str, Any]:
    """Where ``Augment.forward``'s CPU time goes, in one process, one thread (a DataLoader
    worker's setting), over ``epochs`` epochs of 4 batches of 32 frames after a warm-up epoch:
    each op's calls (kernel, border protection, scene masks: CPU-ms per image of the epoch and
    per sample it ran on), planning, the carried scenes, and the rest (batch buffers, records)."""
    from collections import Counter, defaultdict

    from perturb.augment import Augment
    from perturb.augment import module as augment_module
    from perturb.engine import run as engine

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    frames = [decode(f) for f in files]
    augment = Augment(POLICY, seed=0)
    batches = fixed_batches(frames)
    warm_scenes(augment, frames, 128)
    spent: defaultdict[str, float] = defaultdict(float)
    samples: Counter[str] = Counter()

    def timed(name: str | None, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            records = args[-1]
            key = name or f"op {records[0].op}"
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.process_time() - start
                if name is None:
                    samples[key] += len(records)

        return run

    saved = {
        (engine, "run_records"): engine.run_records,
        (engine, "run_records_into"): getattr(engine, "run_records_into", None),
        (augment_module, "carry_scenes"): augment_module.carry_scenes,
        (augment_module, "plan_batch"): augment_module.plan_batch,
    }
    try:
        for (mod, attr), fn in saved.items():
            if fn is not None:
                label = None if attr.startswith("run_records") else attr
                setattr(mod, attr, timed(label, fn))
        for x, idx in batches:
            augment(x, idx, epoch=0)
        spent.clear()
        samples.clear()
        began = time.process_time()
        for epoch in range(1, 1 + epochs):
            for x, idx in batches:
                augment(x, idx, epoch=epoch)
        total = time.process_time() - began
    finally:
        for (mod, attr), fn in saved.items():
            if fn is not None:
                setattr(mod, attr, fn)
    images = 128 * epochs
    parts = {
        k: {
            "cpu_ms_per_image": 1e3 * v / images,
            **(
                {"samples": samples[k], "cpu_ms_per_sample": 1e3 * v / samples[k]}
                if samples[k]
                else {}
            ),
        }
        for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
    }
    rest = total - sum(spent.values())
    return {
        "cpu_ms_per_image": 1e3 * total / images,
        "parts": parts,
        "rest_cpu_ms_per_image": 1e3 * rest / images,
    }


def environment() -> dict[str, Any]:
    from benchmarks.conftest import environment as env

    out = env()
    out["device"]["load_average_end"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=int(os.environ.get("PERTURB_BENCH_REPEATS", "5"))
    )
    parser.add_argument("--items", type=int, default=128, help="dataset items per epoch")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--per-op", action="store_true", help="time each op alone (see the docstring)"
    )
    parser.add_argument(
        "--attribute", action="store_true", help="where Augment's CPU time goes (docstring)"
    )
    args = parser.parse_args(argv)
    load_start = list(os.getloadavg())
    files = _files()
    if args.attribute:
        found = {"benchmark": "augment-attribution", "policy": POLICY, "size": SIZE, "batch": BATCH}
        found.update(attribute(files))
        found["environment"] = environment()
        found["load_average_start"] = load_start
        out = args.out or ATTRIBUTION_OUT
        out.write_text(json.dumps(found, indent=2) + "\n")
        print(json.dumps(found["parts"], indent=2), found["cpu_ms_per_image"])
        return found
    if args.per_op:
        costs = {
            "benchmark": "augment-per-op",
            "policy": POLICY,
            "carry_scenes": True,
            "size": SIZE,
            "batch": BATCH,
            "severity": 2,
        }
        costs.update(per_op(files))
        costs["environment"] = environment()
        costs["load_average_start"] = load_start
        out = args.out or PER_OP_OUT
        out.write_text(json.dumps(costs, indent=2) + "\n")
        print(json.dumps({k: costs[k] for k in ("perturb", "albumentations")}, indent=2))
        return costs
    kinds = ["decode", "perturb", "perturb-whole-frame", "albumentations", "albumentations-cubic-optics"]
    loaders = {k: make_loader(k, files, args.items) for k in kinds}
    warmup = {}
    for k in kinds:  # epoch 0: workers start (spawn: imports), caches fill
        start = time.perf_counter()
        warmup[k] = run_epoch(*loaders[k], epoch=0)
        warmup[k]["wall_with_start_s"] = time.perf_counter() - start
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(args.repeats):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        for k in order:
            rows[k].append(run_epoch(*loaders[k], epoch=1 + r))
            print(
                f"repeat {r} {k:15s} {rows[k][-1]['images_per_s']:7.1f} img/s  {rows[k][-1]['cpu_ms_per_image']:7.1f} CPU-ms/img",
                flush=True,
            )
    peak_workers = {k: max(max(x["worker_peak_rss_mb"]) for x in rows[k]) for k in kinds}
    for loader, _ in loaders.values():
        loader._iterator._shutdown_workers()  # type: ignore[union-attr]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = {
        k: {
            "median_wall_s": _median(rows[k], "wall_s"),
            "median_images_per_s": _median(rows[k], "images_per_s"),
            "median_cpu_s": _median(rows[k], "cpu_s"),
            "median_cpu_ms_per_image": _median(rows[k], "cpu_ms_per_image"),
            "worker_peak_rss_mb": peak_workers[k],
        }
        for k in kinds
    }
    ours, peer, floor = summary["perturb"], summary["albumentations"], summary["decode"]
    like = summary["perturb-whole-frame"]
    ratios = {
        "throughput_perturb_over_albumentations": ours["median_images_per_s"]
        / peer["median_images_per_s"],
        "cpu_per_image_albumentations_over_perturb": peer["median_cpu_ms_per_image"]
        / ours["median_cpu_ms_per_image"],
        "throughput_whole_frame_over_albumentations": like["median_images_per_s"]
        / peer["median_images_per_s"],
        "cpu_per_image_albumentations_over_whole_frame": peer["median_cpu_ms_per_image"]
        / like["median_cpu_ms_per_image"],
        "augment_cpu_ms_per_image_whole_frame": like["median_cpu_ms_per_image"]
        - floor["median_cpu_ms_per_image"],
        "augment_cpu_ms_per_image_perturb": ours["median_cpu_ms_per_image"]
        - floor["median_cpu_ms_per_image"],
        "augment_cpu_ms_per_image_albumentations": peer["median_cpu_ms_per_image"]
        - floor["median_cpu_ms_per_image"],
        "cpu_per_image_albumentations_cubic_optics_over_perturb": summary[
            "albumentations-cubic-optics"
        ]["median_cpu_ms_per_image"]
        / ours["median_cpu_ms_per_image"],
        "throughput_perturb_over_albumentations_cubic_optics": ours["median_images_per_s"]
        / summary["albumentations-cubic-optics"]["median_images_per_s"],
    }
    result = {
        "benchmark": "augment-dataloader",
        "setup": {
            "policy": POLICY,
            "size": SIZE,
            "batch": BATCH,
            "workers": WORKERS,
            "multiprocessing_context": "spawn",
            "items_per_epoch": args.items,
            "repeats": args.repeats,
            "source_frames": len(files),
            "albumentations_pipeline": repr(albumentations_pipeline()),
            "albumentations_cubic_optics": "the same with OpticalDistortion and "
            "ChromaticAberration at interpolation=cv2.INTER_CUBIC (perturb's optics ops are "
            "bicubic; albumentations' default for both is bilinear)",
        },
        "environment": environment(),
        "load_average_start": load_start,
        "summary": summary,
        "ratios": ratios,
        "warmup_epoch": warmup,
        "scene_analysis_cpu_ms_per_item": {
            "values": SCENE_ANALYSIS_MS,
            "note": "every item's scene analysed once in the main process before the loader "
            "starts (warm_scenes; the workers receive them): not in the timed epochs. Without "
            "it a worker analyses each source it meets, and a non-persistent worker again every "
            "epoch",
        },
        "rows": rows,
        "main_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "children_rusage_total": {
            "cpu_s": children.ru_utime + children.ru_stime,
            "peak_rss_mb": children.ru_maxrss / 1024,
            "note": "every worker of the run, start-up and warm-up epochs included (counted once they exit)",
        },
    }
    out = args.out or OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "ratios": ratios}, indent=2))
    return result


if __name__ == "__main__":
    main()
