"""``Augment``: a torch module applying a training policy to batches, keyed per sample.

    augment = Augment("augment-endoscopy", seed=0)
    for epoch in range(epochs):
        augment.set_epoch(epoch)
        for images, labels, indices in loader:       # indices: dataset indices of the samples
            images = augment(images.to(device), indices)

Which ops a sample gets, their order, strengths and parameters are a pure function of (policy,
seed, epoch, dataset index), so the run is reproducible whatever the DataLoader workers,
batch size, sampling order or device. ``eval()`` turns augmentation off (identity).

Border-protecting ops (colour, exposure, optics) act on the tissue layer of the frame's scene
(``perturb.scene``). The scene of each source image is analysed once, cached per dataset index (``SceneCache``: checked against a
digest of the pixels, so a changed image is analysed again) and carried through the sample's
chain: crops and warps move it with the pixels (``perturb.augment.targets.move_scene``), and
each protecting record stores the scene it runs with (``extra["scene"]``), so no intermediate
image is analysed and ``replay`` reproduces it. This is the scene model's own rule (the field
of view and the overlays belong to the source frame, not to an intermediate image: re-analysing
a vignetted frame would take its darkened corners for surround) and halves the CPU time of the
``augment-endoscopy`` policy. ``carry_scenes=False`` analyses the input of each border-protecting
op instead (the behaviour before 0.1.0's batched engine).
"""

from __future__ import annotations

import hashlib
import marshal
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from perturb.augment.plan import _check_index, apply_plans, check_modality, plan_batch
from perturb.augment.policy import Policy, load_policy
from perturb.augment.targets import BoxesIn, move_boxes, move_masks, move_scene
from perturb.contracts.record import Record
from perturb.engine.run import SUPPORTED_DTYPES, check_images, scene_kind, with_codecs
from perturb.errors import InputError
from perturb.scene import Scene

DEFAULT_SCENE_CACHE = 16384  # descriptors kept per process (0.3-0.8 kB each marshalled)


def _xxh3() -> Callable[[Any], bytes] | None:
    try:
        import xxhash
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return xxhash.xxh3_128_digest


_XXH3 = _xxh3()


def pixel_digest(buf: Any) -> bytes:
    """A 128-bit digest of an image's bytes (XXH3; BLAKE2b where xxhash is missing)."""
    if _XXH3 is not None:
        return bytes(_XXH3(buf))
    return hashlib.blake2b(buf, digest_size=16).digest()


class SceneCache:
    """Scene descriptors of source images by dataset index, at most ``size`` (least recently
    used dropped), per process. A copy sent to a DataLoader worker carries the entries it
    holds: scenes analysed in the main process before the loader starts (``scene(index,
    image)`` for each item) reach every worker, persistent or not, where otherwise each worker
    analyses each source it meets (about 13 CPU-ms a 512x512 frame) and a non-persistent one
    does so again every epoch. Each entry keeps the digest of the pixels it was analysed
    from; an index whose pixels changed (a random crop in the dataset, another dataset) is
    analysed again, so what a sample gets never depends on what the cache held."""

    def __init__(self, size: int = DEFAULT_SCENE_CACHE) -> None:
        self.size = int(size)
        self._entries: OrderedDict[tuple[int, tuple[int, ...], str], tuple[bytes, bytes]] = (
            OrderedDict()
        )
        self.hits = self.misses = 0

    def scene(self, index: int, chw: np.ndarray | torch.Tensor) -> dict[str, Any]:
        """The scene descriptor (a new dict) of the CHW image ``chw`` (a numpy array or a
        tensor, as a Dataset yields it) of dataset item ``index``."""
        if isinstance(chw, torch.Tensor):
            chw = chw.detach().cpu().numpy()
        slot = (index, chw.shape, chw.dtype.str)
        digest = pixel_digest(np.ascontiguousarray(chw).data)
        hit = self._entries.get(slot)
        if hit is not None and hit[0] == digest:
            self._entries.move_to_end(slot)
            self.hits += 1
            return dict(marshal.loads(hit[1]))
        self.misses += 1
        desc = Scene.of(torch.from_numpy(np.ascontiguousarray(chw))).descriptor
        blob = marshal.dumps(desc)
        if self.size > 0:
            self._entries[slot] = (digest, blob)
            self._entries.move_to_end(slot)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return dict(marshal.loads(blob))

    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size, "entries": list(self._entries.items())}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"])  # type: ignore[misc]
        self._entries.update(state.get("entries", []))


def _carries_scene(record: Record) -> bool:
    """Whether ``record`` runs with an endoscopy scene carried from the source image. An X-ray
    op's radiograph scene (annotation layer) is analysed by the engine on the image it gets."""
    return record.protect_border and scene_kind(record.op) == "endoscopy"


def needs_scene(chain: Sequence[Record]) -> bool:
    """Whether any record of ``chain`` runs with a carried endoscopy scene."""
    return any(_carries_scene(r) for r in chain)


def carry_scenes(
    images: torch.Tensor,
    indices: Sequence[int],
    chains: Sequence[Sequence[Record]],
    cache: SceneCache,
) -> list[list[Record]]:
    """``chains`` with each border-protecting record storing the scene it runs with: the scene
    of the sample's source image (``cache``), moved through the chain's earlier geometric ops.
    The pixels of the samples that need a scene come to the host once for the batch."""
    need = [i for i, chain in enumerate(chains) if needs_scene(chain)]
    out = [list(chain) for chain in chains]
    if not need:
        return out
    height, width = images.shape[-2:]
    rows = images.detach()
    if rows.device.type != "cpu" and len(need) < len(chains):
        rows = rows.index_select(0, torch.tensor(need, device=rows.device))
        position = {i: j for j, i in enumerate(need)}
    else:
        position = {i: i for i in need}
    host = rows.cpu().contiguous().numpy()
    for i in need:
        desc = cache.scene(indices[i], host[position[i]])
        chain = out[i]
        last = max(k for k, r in enumerate(chain) if _carries_scene(r))
        for k, r in enumerate(chain[: last + 1]):
            if _carries_scene(r):  # each record its own copy: records are handed to the caller
                chain[k] = replace(
                    r, extra={**r.extra, "scene": marshal.loads(marshal.dumps(desc))}
                )
            elif k < last:
                desc = move_scene(desc, r, width, height)
    return out


class AugmentResult(NamedTuple):
    """What ``Augment`` returns when targets or records are asked for.

    * ``images``: the augmented batch (same shape and dtype as the input);
    * ``boxes``: one float32 (N_i, 4) tensor of [x1, y1, x2, y2] per sample (None if not given);
    * ``masks``: the masks moved with the geometry (input shape and dtype; None if not given);
    * ``records``: each sample's applied chain (list of ``Record``, empty when the sample was not
      augmented), when the module has ``return_records=True``; else None.
    """

    images: torch.Tensor
    boxes: list[torch.Tensor] | None
    masks: torch.Tensor | None
    records: list[list[Record]] | None


def _shared_cell() -> torch.Tensor:
    """A CPU int64 scalar in shared memory: DataLoader workers inherit it (fork) or receive
    it by handle (spawn, torch's multiprocessing pickler), so a write in the main process reaches
    them. Where shared memory is unavailable, a plain tensor (workers then keep the epoch they
    started with)."""
    cell = torch.zeros((), dtype=torch.int64)
    try:
        return cell.share_memory_()
    except (RuntimeError, OSError):  # pragma: no cover - no /dev/shm
        return cell


def _indices(indices: object, n: int) -> list[int]:
    if isinstance(indices, torch.Tensor | np.ndarray):
        values = indices.reshape(-1).tolist()
    elif isinstance(indices, Sequence) and not isinstance(indices, str | bytes):
        values = list(indices)
    else:
        raise InputError(
            f"indices must give each image's dataset index (a sequence or tensor of {n} ints), "
            f"got {type(indices).__name__}"
        )
    if len(values) != n:
        raise InputError(
            f"indices has {len(values)} entries for a batch of {n}: pass one dataset index per image"
        )
    return [_check_index(v, "index") for v in values]


class Augment(torch.nn.Module):
    """Apply ``policy`` to BCHW batches (float32 in [0, 1], uint8 or uint16; CPU or CUDA).

    ``seed`` keys the whole run; ``set_epoch`` (or ``forward(..., epoch=)``) moves to the
    next epoch's draws; ``variant`` gives independent draws of the same epoch (e.g. a second
    view). ``modality`` restricts the policy's ops per call of the module (e.g. a module for
    the X-ray part of a mixed dataset). Colour-only ops are left out for 1-channel batches;
    1-channel (X-ray) ops are left out of 3-channel batches, with a warning naming them: augment
    a gray film at 1 channel and repeat it to 3 after.

    ``carry_scenes``: analyse each source image's scene once and carry it through the chain
    (see the module docstring) instead of analysing the input of each border-protecting op;
    ``scene_cache``: how many source images' scenes (``SceneCache``) this process then keeps
    (0: none; each source's scene is still analysed once per forward).

    ``forward(images, indices, *, epoch=None, boxes=None, masks=None)`` returns the augmented
    images alone when no targets are passed and ``return_records`` is False; otherwise an
    ``AugmentResult(images, boxes, masks, records)`` (fields not asked for are None).
    """

    def __init__(
        self,
        policy: Policy | str | Path,
        *,
        seed: int = 0,
        return_records: bool = False,
        epoch: int = 0,
        variant: int = 0,
        modality: str | None = None,
        carry_scenes: bool = True,
        scene_cache: int = DEFAULT_SCENE_CACHE,
    ) -> None:
        super().__init__()
        self.carry_scenes = bool(carry_scenes)
        self.scenes = SceneCache(scene_cache)
        self.policy = load_policy(policy)
        self.seed = int(seed)
        self.return_records = bool(return_records)
        self._epoch_cell = _shared_cell()
        self.epoch = epoch
        self.variant = _check_index(variant, "variant")
        self.modality = check_modality(modality)

    @property
    def epoch(self) -> int:
        """The epoch whose draws ``forward`` applies (``set_epoch``)."""
        return int(self._epoch_cell)

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        value = _check_index(epoch, "epoch")
        if value >= 1 << 63:
            raise InputError(f"epoch must be below 2**63, got {value}")
        self._epoch_cell.fill_(value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle; a module pickled before the epoch moved to shared memory (``epoch`` a
        plain attribute) gets a cell holding that epoch."""
        old_epoch = state.pop("epoch", None)
        super().__setstate__(state)
        if "_epoch_cell" not in self.__dict__:
            self._epoch_cell = _shared_cell()
            self.epoch = 0 if old_epoch is None else old_epoch

    def set_epoch(self, epoch: int) -> None:
        """Draw the next samples for ``epoch`` (call at the start of each epoch, before the
        loader's next pass: a worker reads the epoch when it makes a batch, so batches it
        prefetched from one iterator that spans epochs may carry either). The epoch lives in
        shared memory (one file descriptor per module): DataLoader workers holding this module
        (in the dataset or the collate_fn, persistent or not, fork or spawn) see it from their
        next batch on, as the main process does. A copy made with ``pickle``/``copy.deepcopy``
        has its own."""
        self.epoch = epoch

    def plan(
        self,
        indices: Sequence[int] | torch.Tensor,
        *,
        epoch: int | None = None,
        channels: int | None = None,
        device: torch.device | str = "cpu",
    ) -> list[list[Record]]:
        """The chains this module applies to the samples ``indices`` (nothing is run)."""
        return plan_batch(
            self.policy,
            seed=self.seed,
            epoch=self.epoch if epoch is None else epoch,
            indices=indices,
            modality=self.modality,
            channels=channels,
            variant=self.variant,
            device=device,
        )

    def forward(
        self,
        images: torch.Tensor,
        indices: Sequence[int] | torch.Tensor,
        *,
        epoch: int | None = None,
        boxes: BoxesIn | None = None,
        masks: torch.Tensor | None = None,
        plans: Sequence[Sequence[Record]] | None = None,
    ) -> torch.Tensor | AugmentResult:
        """Augment ``images`` (BCHW) whose dataset indices are ``indices``.

        ``plans``: chains made beforehand by ``self.plan(indices, channels=C)`` (e.g. in the
        DataLoader's workers, so host-side planning overlaps the GPU); they must be this
        module's plans of these indices."""
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            shape = (
                tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            )
            raise InputError(
                f"images must be a BCHW tensor, got {shape}; add a batch axis with unsqueeze(0)"
            )
        if images.dtype not in SUPPORTED_DTYPES:  # before the scenes read the pixels
            check_images(images)
        n = images.shape[0]
        idx = _indices(indices, n)
        if n == 0:  # e.g. the X-ray part of a mixed batch that holds no radiograph
            return self._empty(images, boxes, masks)
        chains: list[list[Record]]
        if not self.training:
            chains = [[] for _ in range(n)]
        elif plans is None:
            chains = self.plan(idx, epoch=epoch, channels=images.shape[1], device=images.device)
        else:
            chains = self._check_plans(plans, idx, self.epoch if epoch is None else epoch)
        chains = [with_codecs(p, images) for p in chains]
        if self.carry_scenes:
            chains = carry_scenes(images, idx, chains, self.scenes)
        if self.return_records:  # records handed out say which scene each ran with
            chains = [[replace(r, extra=dict(r.extra)) for r in chain] for chain in chains]
        out = apply_plans(images, chains, record_scenes=self.return_records)
        if boxes is None and masks is None and not self.return_records:
            return out
        height, width = images.shape[-2:]
        if masks is not None and tuple(masks.shape[-2:]) != (height, width):
            raise InputError(
                f"masks are {tuple(masks.shape[-2:])} (H, W) but images are {(height, width)}; "
                "resize them to the images first"
            )
        return AugmentResult(
            images=out,
            boxes=None if boxes is None else move_boxes(boxes, chains, (width, height)),
            masks=None if masks is None else move_masks(masks, chains),
            records=chains if self.return_records else None,
        )

    def _empty(
        self, images: torch.Tensor, boxes: BoxesIn | None, masks: torch.Tensor | None
    ) -> torch.Tensor | AugmentResult:
        """What ``forward`` returns for a batch of no images: the batch itself."""
        if boxes is not None and len(boxes):
            raise InputError(f"boxes has {len(boxes)} entries for a batch of 0: pass one list per image")
        if masks is not None and masks.shape[0]:
            raise InputError(f"masks has {masks.shape[0]} entries for a batch of 0")
        if boxes is None and masks is None and not self.return_records:
            return images
        return AugmentResult(
            images=images,
            boxes=None if boxes is None else [],
            masks=masks,
            records=[] if self.return_records else None,
        )

    def _check_plans(
        self, plans: Sequence[Sequence[Record]], indices: list[int], epoch: int
    ) -> list[list[Record]]:
        """``plans`` if each record is this module's (seed, policy, variant) draw for its image's
        index at ``epoch``: plans made by a copy of the module that missed a ``set_epoch`` (one
        pickled by hand into a dataset) would otherwise repeat an old epoch's draws."""
        chains = [list(p) for p in plans]
        if len(chains) != len(indices):
            raise InputError(
                f"plans has {len(chains)} entries for a batch of {len(indices)}: pass one plan per image"
            )
        want = {
            "seed": self.seed,
            "policy": self.policy.policy,
            "epoch": epoch,
            "variant": self.variant,
        }
        for i, chain in zip(indices, chains, strict=True):
            for r in chain:
                got = {
                    "seed": r.seed,
                    "policy": r.extra.get("policy"),
                    "epoch": r.extra.get("epoch"),
                    "variant": r.variant,
                }
                if r.extra.get("index") != i:
                    raise InputError(
                        f"plans do not belong to this batch: a record of index {r.extra.get('index')} "
                        f"for index {i}; make them with this module's plan(indices) in the same "
                        "order as the images"
                    )
                if got != want:
                    raise InputError(
                        f"plans do not belong to this batch: a record made with {got} for a module "
                        f"at {want}; make them with this module's plan(indices) after set_epoch "
                        "(a pickled or deep-copied module keeps its own epoch: call its set_epoch "
                        "too, or pass the epoch to plan(indices, epoch=...))"
                    )
        return chains

    def extra_repr(self) -> str:
        return (
            f"policy={self.policy.policy!r}, seed={self.seed}, epoch={self.epoch}, "
            f"carry_scenes={self.carry_scenes}, ops={self.policy.op_names()}"
        )
