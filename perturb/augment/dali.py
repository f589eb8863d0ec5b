"""NVIDIA DALI input pipeline with perturb's keyed training augmentation.

    from perturb.augment.dali import dali_loader
    loader = dali_loader(files, "augment-endoscopy", seed=0, size=448, batch_size=64)
    for epoch in range(3):
        for batch in loader:                  # one pass = one epoch (0, 1, 2, ...)
            batch.images, batch.indices       # float32 BCHW, int64 dataset indices

The pipeline (``build_pipeline``):

1. ``fn.external_source`` in per-sample mode: for ``SampleInfo(idx_in_epoch, epoch_idx)`` it
   returns the encoded bytes, the dataset index and the epoch (``first_epoch + epoch_idx``). The
   order is the dataset's, or a permutation keyed by (seed, epoch) with ``shuffle=True``; each
   shard of ``num_shards`` takes every ``num_shards``-th item of it. The last batch is padded
   (index -1; ``DaliLoader`` drops the padding), so every item is seen once per epoch.
2. ``fn.decoders.image``: ``device="cpu"`` decodes on the host (libjpeg-turbo / libpng through
   nvImageCodec), ``device="gpu"`` uses the "mixed" decoder (nvJPEG on the GPU); to uint8, or
   with ``bit_depth=16`` to uint16 (a 16-bit PNG film keeps its 65,536 levels; an 8-bit file's
   levels are scaled by 257).
3. ``fn.resize`` to (H, W) (linear, antialiased), uint8 (uint16) HWC.
4. The policy's ops, one chain position at a time (``policy.num_ops`` upper end positions).
   Each sample's chain is ``plan_sample(policy, seed=, epoch=, index=, channels=)``, the same
   keyed plan ``perturb.augment.Augment`` draws for that (epoch, index), so the DALI pipeline
   and the torch module give a sample the same records. At position k the sample's k-th record
   runs either

   * through the torch kernels (``apply_plans``) in ``fn.dl_tensor_python_function`` over
     DLPack (zero-copy in, on the pipeline's device), or
   * through a DALI op where that op reproduces the catalog kernel exactly (``DALI_OPS``).
     Two qualify:

     - **translation**: the catalog's integer shift ``(tx, ty) = translation_pixels(W, H,
       shift, direction)`` with black fill is the same data movement as ``fn.slice(start=
       (-ty, -tx), shape=(H, W), out_of_bounds_policy="pad", fill_values=0)``, bit-identical
       on every device;
     - **brightness**, only for records with ``protect_border`` False (a policy with
       ``protect_border: false``): the catalog's ``clamp(x + delta, 0, 1)`` on uint8 is the
       engine's table ``rint(clip(k / 255 + delta, 0, 1) * 255)``, which DALI's arithmetic
       ops compute in the same float32 steps (checked equal on all 256 levels). With the
       border protected (the op's default) the field-of-view mask is needed, so the torch
       kernel runs.

   The first torch stage sees the resized source images: it analyses the scene of each sample
   whose chain has a border-protecting op (``perturb.scene``, cached per dataset index) and
   stores the chain with that scene carried through its geometric ops, as ``Augment`` does
   (``carry_scenes``); later stages and the loader's records read that chain, so pixels and
   records equal the torch module's on the same decoded images.

   DALI ops that were checked and not used (DALI 2.4):

   * ``fn.flip``: the catalog has no flip op (flips swap laterality, see the X-ray policy);
   * ``fn.rotate`` / ``fn.warp_affine``: nearest or linear interpolation only (INTERP_CUBIC is
     refused), where ``rotation`` and ``resized_crop`` resample once bicubically and black out
     what leaves the frame through exact inside-the-frame spans;
   * ``fn.brightness_contrast``: the painting ops (contrast, gamma, colour, exposure, ...)
     leave the endoscope's dark frame untouched by default through a field-of-view mask that
     DALI does not compute, and DALI's contrast centre is a given value, not the image's mean
     Rec. 601 luma;
   * ``fn.hue`` / ``fn.saturation`` / ``fn.hsv``: a rotation / scaling about the neutral grey
     axis in RGB, where ``hue_shift`` rotates the YIQ chroma plane and ``saturation`` scales
     around Rec. 601 luma;
   * ``fn.noise.*`` and ``fn.jpeg_compression_distortion``: DALI's own random generator and
     encoder settings, not the catalog's counter-hash fields and libjpeg-turbo 4:2:0 call.

5. ``fn.crop_mirror_normalize``: float32, ``(x / 255 - mean) / std`` (``x / 65535`` with
   ``bit_depth=16``; ``mean=0, std=1`` by default: values in [0, 1]), CHW.

``fn.torch_python_function`` (DALI's torch plugin) is not used because it creates a CUDA stream
even for CPU pipelines, which fails with CPU builds of torch; ``fn.dl_tensor_python_function``
with ``torch.from_dlpack`` is the same zero-copy exchange on both devices.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perturb import rng
from perturb.augment.module import SceneCache, carry_scenes, needs_scene
from perturb.augment.plan import apply_plans, check_modality, plan_sample
from perturb.augment.policy import Policy, load_policy
from perturb.contracts.record import Record
from perturb.engine.run import with_codecs
from perturb.errors import InputError, PerturbError
from perturb.ops.geometry import translation_pixels

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
SIGNATURES = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG"}
SHUFFLE_STREAM = "augment.dali.shuffle"
OUTPUTS = ("images", "indices", "epochs")


class DaliUnavailableError(PerturbError, ImportError):
    """NVIDIA DALI is not installed (or cannot load)."""


def require_dali() -> Any:
    """The ``nvidia.dali`` module, or an error that says how to install it."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn
        import nvidia.dali.math
        import nvidia.dali.plugin.pytorch
        import nvidia.dali.types  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DaliUnavailableError(
            f"NVIDIA DALI is not available ({exc}); install it with "
            "`pip install -e '.[dali]'` (the nvidia-dali-cuda120 wheel; its CPU pipelines run "
            "without a GPU)"
        ) from None
    return dali


# ---------------------------------------------------------------------------------------------
# Encoded inputs


class ImageSource:
    """Encoded images by dataset index: files, in-memory bytes or a dataset's image column."""

    def __init__(self, read: Callable[[int], bytes], names: Callable[[int], str], length: int):
        self._read, self._names, self._length = read, names, length

    def __len__(self) -> int:
        return self._length

    def name(self, index: int) -> str:
        return self._names(index)

    def read(self, index: int) -> bytes:
        """The bytes of item ``index``, checked to be JPEG or PNG."""
        data = self._read(index)
        check_format(data, self.name(index))
        return data


def check_format(data: bytes, name: str) -> str:
    """'JPEG' or 'PNG' from the file signature; anything else is an InputError naming the fix."""
    if not data:
        raise InputError(f"{name}: empty image (0 bytes); re-export the file or leave it out")
    for signature, kind in SIGNATURES.items():
        if data.startswith(signature):
            return kind
    raise InputError(
        f"{name}: not a JPEG or PNG image (starts with {bytes(data[:8])!r}); the DALI pipeline "
        "decodes JPEG and PNG: convert it (e.g. with Pillow: Image.open(p).save('x.png')) or "
        "leave it out"
    )


def _files_source(paths: Sequence[str | os.PathLike[str]]) -> ImageSource:
    files = [Path(p) for p in paths]
    missing = [p for p in files if not p.is_file()]
    if missing:
        shown = ", ".join(str(p) for p in missing[:3])
        raise InputError(
            f"{len(missing)} of {len(files)} image files do not exist (e.g. {shown}); fix the "
            f"paths or leave them out (relative paths start at {Path.cwd()})"
        )

    def read(i: int) -> bytes:
        try:
            return files[i].read_bytes()
        except OSError as exc:
            raise InputError(
                f"cannot read image file {files[i]}: {exc.strerror or exc}; check that it is "
                "still there and readable"
            ) from None

    return ImageSource(read, lambda i: str(files[i]), len(files))


def image_source(source: Any, *, image_column: str | None = None) -> ImageSource:
    """An ``ImageSource`` from a folder of .jpg/.jpeg/.png files, a list of file paths, a list
    of encoded bytes, an ``InputDataset`` (``perturb.io.datasets.open_input``) or a Hugging
    Face ``datasets.Dataset`` (``image_column`` as in ``open_input``). Dataset indices are the
    list positions / dataset rows."""
    if isinstance(source, ImageSource):
        return source
    if isinstance(source, str | os.PathLike):
        folder = Path(source)
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise InputError(f"{folder}: no {'/'.join(IMAGE_SUFFIXES)} files in this folder")
            return _files_source(files)
        return _files_source([folder])
    if isinstance(source, Sequence) and not source:
        raise InputError("the image list is empty: pass at least one JPEG/PNG path or bytes")
    if isinstance(source, Sequence):
        items = list(source)
        if all(isinstance(x, bytes | bytearray | memoryview) for x in items):
            blobs = [bytes(x) for x in items]
            return ImageSource(lambda i: blobs[i], lambda i: f"image {i}", len(blobs))
        if all(isinstance(x, str | os.PathLike) for x in items):
            return _files_source(items)
    # datasets (~1.4 s to import) only for dataset sources
    from perturb.io.datasets import InputDataset

    if not isinstance(source, InputDataset):
        import datasets

        if isinstance(source, datasets.Dataset):
            from perturb.io.datasets import _find_image_column

            column = _find_image_column(source, image_column, "dataset")
            feature = source.features.get(column)
            if isinstance(feature, datasets.Image) and feature.decode:
                source = source.cast_column(column, datasets.Image(decode=False))
            source = InputDataset(source, column, None, "dataset", source._fingerprint)
    if isinstance(source, InputDataset):
        ds = source
        return ImageSource(ds.image_bytes, lambda i: f"{ds.source} row {i}", len(ds))
    raise InputError(
        f"cannot read images from {type(source).__name__}: pass a folder, a list of JPEG/PNG "
        "paths or encoded bytes, perturb.io.datasets.open_input(...) or a datasets.Dataset"
    )


def epoch_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Dataset indices in the order of ``epoch``: 0..n-1, or a permutation keyed by (seed,
    epoch) through perturb.rng (the same on every shard, worker and machine)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    key = rng.derive_key(seed, f"e{int(epoch)}", SHUFFLE_STREAM, 0, 0)
    return rng.scalar_rng(key).permutation(n).astype(np.int64)


class _Feeder:
    """The per-sample ``external_source`` callback: (bytes, index, epoch) per ``SampleInfo``."""

    def __init__(
        self,
        source: ImageSource,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool,
        first_epoch: int,
        shard_id: int,
        num_shards: int,
    ):
        self.source, self.seed, self.shuffle = source, seed, shuffle
        self.first_epoch, self.shard_id, self.num_shards = first_epoch, shard_id, num_shards
        per_shard = math.ceil(len(source) / num_shards)
        self.samples = math.ceil(per_shard / batch_size) * batch_size  # padded, equal per shard
        self._order: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """This shard's dataset indices in ``epoch``."""
        cached = self._order
        if cached is None or cached[0] != epoch:
            full = epoch_order(len(self.source), seed=self.seed, epoch=epoch, shuffle=self.shuffle)
            cached = (epoch, full[self.shard_id :: self.num_shards])
            self._order = cached
        return cached[1]

    def __call__(self, info: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if info.idx_in_epoch >= self.samples:
            raise StopIteration
        epoch = self.first_epoch + int(info.epoch_idx)
        order = self.order(epoch)
        position = int(info.idx_in_epoch)
        index = int(order[position]) if position < len(order) else -1
        data = self.source.read(index if index >= 0 else int(order[-1]))  # padding: any image
        return (
            np.frombuffer(data, dtype=np.uint8),
            np.array([index], dtype=np.int64),
            np.array([epoch], dtype=np.int64),
        )


# ---------------------------------------------------------------------------------------------
# Plans and stages


class Planner:
    """Keyed plans of a policy, cached per (epoch, index): the DALI stages and the loader's
    records read the same plans; padding (index -1) gets an empty plan."""

    def __init__(
        self,
        policy: Policy,
        *,
        seed: int,
        channels: int,
        modality: str | None = None,
        variant: int = 0,
        device: str = "cpu",
    ):
        self.policy, self.seed, self.channels = policy, int(seed), channels
        self.modality, self.variant, self.device = check_modality(modality), variant, device
        # a batch on this device: codec ops record the codec that runs there, as in ``Augment``
        self._probe = torch.empty((1, channels, 2, 2), device=device)
        self._plan = lru_cache(maxsize=1 << 14)(self._plan_uncached)
        # chains with their scenes attached (``carry_scenes``), by (epoch, index), newest last
        self.scenes = SceneCache()
        self._carried: OrderedDict[tuple[int, int], tuple[Record, ...]] = OrderedDict()

    def _plan_uncached(self, epoch: int, index: int) -> tuple[Record, ...]:
        if index < 0:
            return ()
        plan = plan_sample(
            self.policy,
            seed=self.seed,
            epoch=epoch,
            index=index,
            modality=self.modality,
            channels=self.channels,
            variant=self.variant,
            device=self.device,
        )
        return tuple(with_codecs(plan, self._probe))

    def plans(self, epochs: Sequence[int], indices: Sequence[int]) -> list[tuple[Record, ...]]:
        """Each sample's chain: with its scenes once ``attach_scenes`` saw the sample."""
        out = []
        for e, i in zip(epochs, indices, strict=True):
            slot = (int(e), int(i))
            carried = self._carried.get(slot)
            out.append(carried if carried is not None else self._plan(*slot))
        return out

    def attach_scenes(
        self, sources: torch.Tensor, epochs: Sequence[int], indices: Sequence[int]
    ) -> None:
        """Analyse the scene of each source image (BCHW, before the chain) and store each chain
        with the scenes its border-protecting records run with (``carry_scenes``, as
        ``Augment`` does), so every stage and the loader's records read the same chain."""
        slots = [(int(e), int(i)) for e, i in zip(epochs, indices, strict=True)]
        chains = [self._plan(*slot) for slot in slots]
        keep = [
            k
            for k, (slot, chain) in enumerate(zip(slots, chains, strict=True))
            if slot[1] >= 0 and slot not in self._carried and needs_scene(chain)
        ]
        if not keep:
            return
        rows = sources if len(keep) == len(slots) else sources[keep]
        carried = carry_scenes(
            rows, [slots[k][1] for k in keep], [chains[k] for k in keep], self.scenes
        )
        for k, chain in zip(keep, carried, strict=True):
            self._carried[slots[k]] = tuple(chain)
        while len(self._carried) > 1 << 14:
            self._carried.popitem(last=False)


def _always(_: Any) -> bool:
    return True


@dataclass(frozen=True)
class DaliOp:
    """A catalog op that a DALI op reproduces exactly: its per-sample argument (identity when
    the sample does not run it), the DALI call, which records it takes (``accepts``) and
    whether a policy can produce any (``usable``: else the graph leaves the op out)."""

    name: str
    params: Callable[[Record | None, int, int], np.ndarray]
    build: Callable[[Any, Any, int, int], Any]
    accepts: Callable[[Record], bool] = _always
    usable: Callable[[Policy], bool] = _always
    bit_depths: tuple[int, ...] = (8, 16)  # decoded depths on which it equals the kernel


def _translation_start(record: Record | None, height: int, width: int) -> np.ndarray:
    if record is None:
        return np.zeros(2, dtype=np.int32)
    tx, ty = translation_pixels(width, height, record.params["shift"], record.params["direction"])
    return np.array([-ty, -tx], dtype=np.int32)


def _translation_slice(images: Any, start: Any, height: int, width: int) -> Any:
    fn: Any = require_dali().fn
    return fn.slice(
        images,
        start=start,
        shape=[height, width],
        axis_names="HW",
        out_of_bounds_policy="pad",
        fill_values=0,
    )


def _brightness_delta(record: Record | None, height: int, width: int) -> np.ndarray:
    return np.array([0.0 if record is None else record.params["delta"]], dtype=np.float32)


def _brightness_add(images: Any, delta: Any, height: int, width: int) -> Any:
    """uint8 -> float32 ``x / 255 + delta`` clamped to [0, 1] -> ``* 255`` rounded to uint8:
    the engine's uint8 brightness (its table on the 256 levels), in the same float32 steps."""
    dali = require_dali()
    fn: Any = dali.fn
    x = fn.cast(images, dtype=dali.types.FLOAT) / 255.0
    x = dali.math.clamp(x + delta, 0.0, 1.0) * 255.0
    return fn.cast(x, dtype=dali.types.UINT8)


DALI_OPS: dict[str, DaliOp] = {
    "translation": DaliOp("translation", _translation_start, _translation_slice),
    # only where the field of view is not protected (policy ``protect_border: false``)
    "brightness": DaliOp(
        "brightness",
        _brightness_delta,
        _brightness_add,
        accepts=lambda r: not r.protect_border,
        usable=lambda policy: policy.protect_border is False,
        bit_depths=(8,),  # checked on the 256 uint8 levels; uint16 runs the torch kernel
    ),
}


def _values(batch: Sequence[Any]) -> list[int]:
    """The first value of each DLPack sample (indices, epochs), read in one host transfer."""
    stacked = torch.stack([torch.from_dlpack(x) for x in batch])
    return [int(v) for v in stacked.reshape(len(batch), -1)[:, 0].tolist()]


class _TorchStage:
    """Chain position ``position`` of each sample through the torch kernels (``apply_plans``),
    except records one of DALI's own ops runs; HWC uint8 (uint16) DLPack samples in and out."""

    def __init__(self, planner: Planner, position: int, dali_steps: Sequence[DaliOp], cuda: bool):
        self.planner, self.position, self.cuda = planner, position, cuda
        self.dali_steps = {op.name: op for op in dali_steps}

    def step(self, plan: Sequence[Record]) -> list[Record]:
        k = self.position
        if k >= len(plan):
            return []
        dali_op = self.dali_steps.get(plan[k].op)
        return [] if dali_op is not None and dali_op.accepts(plan[k]) else [plan[k]]

    def __call__(self, images: Sequence[Any], indices: Sequence[Any], epochs: Sequence[Any]) -> Any:
        batch = torch.stack([torch.from_dlpack(x) for x in images])  # B, H, W, C
        chw = batch.permute(0, 3, 1, 2).contiguous()
        epoch_list, index_list = _values(epochs), _values(indices)  # DLPack: read once
        if self.position == 0:  # the source images: their scenes travel with the chain
            self.planner.attach_scenes(chw, epoch_list, index_list)
        plans = [self.step(p) for p in self.planner.plans(epoch_list, index_list)]
        if any(plans):
            # the planner's records store the scene each ran with, as ``Augment``'s do
            batch = apply_plans(chw, plans, record_scenes=True).permute(0, 2, 3, 1).contiguous()
        if self.cuda:
            torch.cuda.current_stream().synchronize()  # DALI reads the outputs on its stream
        return [torch.utils.dlpack.to_dlpack(x) for x in batch]


class _DaliArgs:
    """Per-sample arguments of the DALI's own ops at one chain position (one output each)."""

    def __init__(
        self, planner: Planner, position: int, ops: Sequence[DaliOp], height: int, width: int
    ):
        self.planner, self.position, self.ops = planner, position, list(ops)
        self.height, self.width = height, width

    def __call__(self, indices: Sequence[Any], epochs: Sequence[Any]) -> tuple[list[Any], ...]:
        k = self.position
        plans = self.planner.plans(_values(epochs), _values(indices))
        out: list[list[Any]] = []
        for op in self.ops:
            records = [
                p[k] if k < len(p) and p[k].op == op.name and op.accepts(p[k]) else None
                for p in plans
            ]
            args = [op.params(r, self.height, self.width) for r in records]
            out.append([torch.utils.dlpack.to_dlpack(torch.from_numpy(a)) for a in args])
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# Pipeline


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    hw = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(hw) != 2 or min(hw) < 2:
        raise InputError(f"size must be an int or (height, width) of at least 2, got {size!r}")
    return hw[0], hw[1]


def _device(device: str) -> str:
    if device in ("gpu", "cuda"):
        return "gpu"
    if device != "cpu":
        raise InputError(f"device must be 'cpu' or 'gpu', got {device!r}")
    return "cpu"


def _norm(values: float | Sequence[float], channels: int, name: str) -> list[float]:
    vals = (
        [float(values)] * channels
        if isinstance(values, int | float)
        else [float(v) for v in values]
    )
    if len(vals) not in (1, channels):
        raise InputError(f"{name} needs 1 or {channels} values, got {len(vals)}")
    if name == "std" and min(vals) <= 0:
        raise InputError(f"std must be positive, got {vals}")
    return vals


def build_pipeline(
    source: Any,
    policy: Policy | str | Path | Mapping[str, Any] | None,
    *,
    seed: int = 0,
    size: int | Sequence[int] = 448,
    batch_size: int = 64,
    device: str = "cpu",
    num_threads: int = 2,
    device_id: int | None = None,
    channels: int = 3,
    mean: float | Sequence[float] = 0.0,
    std: float | Sequence[float] = 1.0,
    shuffle: bool = False,
    first_epoch: int = 0,
    shard_id: int = 0,
    num_shards: int = 1,
    modality: str | None = None,
    variant: int = 0,
    dali_ops: bool = True,
    image_column: str | None = None,
    prefetch_queue_depth: int = 2,
    bit_depth: int = 8,
) -> Any:
    """A DALI pipeline (built) that decodes, resizes to ``size`` (H, W), augments with
    ``policy`` (None: no augmentation) keyed by (seed, epoch, dataset index), and normalises
    to float32 CHW ``(x/255 - mean) / std``. ``bit_depth=16`` decodes to uint16 and augments
    and normalises from there (``x/65535``): 16-bit PNG films keep their levels (at 8, the
    decoder reduces them to 256; checked on the CPU pipeline, not yet on a GPU). Outputs:
    images, indices (int64, -1 for padding),
    epochs. ``device="gpu"`` decodes with the "mixed" decoder and runs the torch kernels on
    CUDA (``device_id`` defaults to 0 there). ``dali_ops=False`` runs every op through the
    torch kernels. See the module docstring for the graph."""
    dali = require_dali()
    dev = _device(device)
    height, width = _size(size)
    _check_arguments(dev, channels, batch_size, num_threads, shard_id, num_shards)
    if bit_depth not in (8, 16):
        raise InputError(f"bit_depth must be 8 or 16, got {bit_depth!r}")
    mean_v, std_v = _norm(mean, channels, "mean"), _norm(std, channels, "std")
    images_in = _checked_source(source, image_column, num_shards)
    graph = _Graph(
        dev=dev,
        height=height,
        width=width,
        channels=channels,
        mean=mean_v,
        std=std_v,
        feeder=_Feeder(
            images_in,
            batch_size,
            seed=int(seed),
            shuffle=shuffle,
            first_epoch=int(first_epoch),
            shard_id=shard_id,
            num_shards=num_shards,
        ),
        policy=None if policy is None else load_policy(policy),
        dali_ops=dali_ops,
        bit_depth=bit_depth,
    )
    if graph.policy is not None:
        graph.planner = Planner(
            graph.policy,
            seed=seed,
            channels=channels,
            modality=modality,
            variant=variant,
            device="cuda" if dev == "gpu" else "cpu",
        )

    @dali.pipeline_def(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=(0 if device_id is None else device_id) if dev == "gpu" else None,
        prefetch_queue_depth=prefetch_queue_depth,
    )
    def pipeline() -> tuple[Any, Any, Any]:
        return graph.define(dali)

    pipe = pipeline()
    pipe.build()
    pipe.perturb_planner = graph.planner  # the loader's records come from the same plans
    pipe.perturb_batches = graph.feeder.samples // batch_size  # per epoch, for len(loader)
    return pipe


def _check_arguments(
    dev: str, channels: int, batch_size: int, num_threads: int, shard_id: int, num_shards: int
) -> None:
    """``build_pipeline``'s scalar arguments, with the fix in each error."""
    if channels not in (1, 3):
        raise InputError(f"channels must be 1 (gray) or 3 (RGB), got {channels!r}")
    if batch_size < 1 or num_threads < 1:
        raise InputError(
            f"batch_size and num_threads must be >= 1, got {batch_size}, {num_threads}"
        )
    if not (0 <= shard_id < num_shards):
        raise InputError(f"shard_id must lie in 0..num_shards-1, got {shard_id} of {num_shards}")
    if dev == "gpu" and not torch.cuda.is_available():
        raise InputError(
            "device='gpu' needs a CUDA GPU and a CUDA build of torch; use device='cpu'"
        )


def _checked_source(source: Any, image_column: str | None, num_shards: int) -> ImageSource:
    """The image source, with at least one image per shard."""
    images_in = image_source(source, image_column=image_column)
    if len(images_in) == 0:
        raise InputError("the image source is empty: pass at least one image")
    if len(images_in) < num_shards:
        raise InputError(
            f"{len(images_in)} image(s) for {num_shards} shards: every shard needs at least one "
            "image; use at most as many shards as images"
        )
    return images_in


@dataclass
class _Graph:
    """What ``build_pipeline``'s DALI graph is made of; ``define`` adds its nodes (inside the
    pipeline definition): source, decode, resize, one augmentation stage per op slot of the
    policy, normalisation."""

    dev: str
    height: int
    width: int
    channels: int
    mean: list[float]
    std: list[float]
    feeder: _Feeder
    policy: Policy | None
    dali_ops: bool
    planner: Planner | None = None
    bit_depth: int = 8

    @property
    def full_scale(self) -> float:
        """The decoded images' white level."""
        return 65535.0 if self.bit_depth == 16 else 255.0

    def define(self, dali: Any) -> tuple[Any, Any, Any]:
        fn: Any = dali.fn
        types: Any = dali.types
        encoded, indices, epochs = fn.external_source(
            source=self.feeder,
            num_outputs=3,
            batch=False,
            dtype=[types.UINT8, types.INT64, types.INT64],
        )
        images = fn.decoders.image(
            encoded,
            device="mixed" if self.dev == "gpu" else "cpu",
            output_type=types.RGB if self.channels == 3 else types.GRAY,
            dtype=types.UINT16 if self.bit_depth == 16 else types.UINT8,
        )
        images = fn.resize(images, resize_x=self.width, resize_y=self.height)
        if self.policy is not None and self.planner is not None:
            images = self._augment(fn, images, indices, epochs, self.policy, self.planner)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[self.full_scale * m for m in self.mean],
            std=[self.full_scale * s for s in self.std],
        )
        return images, indices, epochs

    def _augment(
        self, fn: Any, images: Any, indices: Any, epochs: Any, pol: Policy, planner: Planner
    ) -> Any:
        """One stage per op slot: the torch kernels (a DLPack python function on the
        pipeline's device), then the slot's DALI's own ops with their keyed arguments."""
        names = {e.op for e in pol.ops}
        dali_steps = [
            op
            for name, op in DALI_OPS.items()
            if self.dali_ops and name in names and op.usable(pol) and self.bit_depth in op.bit_depths
        ]
        gpu = self.dev == "gpu"
        on_dev = (indices.gpu(), epochs.gpu()) if gpu else (indices, epochs)
        for position in range(pol.num_ops[1]):
            images = fn.dl_tensor_python_function(
                images,
                *on_dev,
                function=_TorchStage(planner, position, dali_steps, gpu),
                batch_processing=True,
                num_outputs=1,
                device=self.dev,
            )
            if dali_steps:
                args = fn.dl_tensor_python_function(
                    indices,
                    epochs,
                    function=_DaliArgs(planner, position, dali_steps, self.height, self.width),
                    batch_processing=True,
                    num_outputs=len(dali_steps),
                )
                args = args if isinstance(args, list) else [args]
                for op, arg in zip(dali_steps, args, strict=True):
                    images = op.build(images, arg, self.height, self.width)
        return images


# ---------------------------------------------------------------------------------------------
# PyTorch iterator


@dataclass
class DaliBatch:
    """One batch: images (float32 BCHW on the pipeline's device), dataset indices (int64, on
    the CPU), the epoch, and each sample's records when asked for."""

    images: torch.Tensor
    indices: torch.Tensor
    epoch: int
    records: list[list[Record]] | None = None


class DaliLoader:
    """A PyTorch iterator over a pipeline from ``build_pipeline``: each ``for`` loop is one
    epoch (``first_epoch``, then +1 per pass) and must run to its end (a loop left early
    continues the same epoch); padding of the last batch is dropped. ``len()`` is the number
    of batches per epoch."""

    def __init__(self, pipeline: Any, *, return_records: bool = False):
        require_dali()
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        self.pipeline = pipeline
        self.planner: Planner | None = getattr(pipeline, "perturb_planner", None)
        self.return_records = return_records
        # No work before the first pass, and the next epoch starts when the next pass does
        # (not in the background at the end of this one).
        self._iterator = DALIGenericIterator(
            pipeline, list(OUTPUTS), auto_reset=False, prepare_first_batch=False
        )
        self._ended = False

    def __len__(self) -> int:
        batches = getattr(self.pipeline, "perturb_batches", None)
        if batches is None:
            raise TypeError(
                "batches per epoch unknown: the pipeline was not made by build_pipeline"
            )
        return int(batches)

    def __iter__(self) -> Iterator[DaliBatch]:
        if self._ended:
            self._iterator.reset()
            self._ended = False
        for (out,) in self._iterator:
            indices = out["indices"].reshape(-1).cpu()
            epochs = out["epochs"].reshape(-1).cpu()
            keep = indices >= 0
            images = out["images"]
            if not bool(keep.all()):
                images, indices, epochs = (
                    images[keep.to(images.device)],
                    indices[keep],
                    epochs[keep],
                )
            if indices.numel() == 0:
                continue
            records = None
            if self.return_records and self.planner is not None:
                plans = self.planner.plans(epochs.tolist(), indices.tolist())
                records = [list(p) for p in plans]
            yield DaliBatch(images, indices, int(epochs[0]), records)
        self._ended = True


def dali_loader(
    source: Any,
    policy: Policy | str | Path | Mapping[str, Any] | None,
    *,
    return_records: bool = False,
    **options: Any,
) -> DaliLoader:
    """``build_pipeline(source, policy, **options)`` wrapped as a PyTorch iterator."""
    return DaliLoader(build_pipeline(source, policy, **options), return_records=return_records)
