"""``Augment``: a torch module applying a training policy to batches, keyed per sample.

    augment = Augment("augment-endoscopy", seed=0)
    for epoch in range(epochs):
        augment.set_epoch(epoch)
        for images, labels, indices in loader:       # indices: dataset indices of the samples
            images = augment(images.to(device), indices)

Which ops a sample gets, their order, strengths and parameters are a pure function of (policy,
seed, epoch, dataset index), so the run is reproducible whatever the DataLoader workers,
batch size, sampling order or device. ``eval()`` turns augmentation off (identity).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from perturb.augment.plan import _check_index, apply_plans, check_modality, plan_batch
from perturb.augment.policy import Policy, load_policy
from perturb.augment.targets import BoxesIn, move_boxes, move_masks
from perturb.contracts.record import Record
from perturb.engine import with_codecs
from perturb.errors import InputError


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
        raise InputError(f"indices has {len(values)} entries for a batch of {n}: pass one dataset index per image")
    return [_check_index(v, "index") for v in values]


class Augment(torch.nn.Module):
    """Apply ``policy`` to BCHW batches (float32 in [0, 1], uint8 or uint16; CPU or CUDA).

    ``seed`` keys the whole run; ``set_epoch`` (or ``forward(..., epoch=)``) moves to the
    next epoch's draws; ``variant`` gives independent draws of the same epoch (e.g. a second
    view). ``modality`` restricts the policy's ops per call of the module (e.g. a module for
    the X-ray part of a mixed dataset). Colour-only ops are left out for 1-channel batches.

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
    ) -> None:
        super().__init__()
        self.policy = load_policy(policy)
        self.seed = int(seed)
        self.return_records = bool(return_records)
        self.epoch = _check_index(epoch, "epoch")
        self.variant = _check_index(variant, "variant")
        self.modality = check_modality(modality)

    def set_epoch(self, epoch: int) -> None:
        """Draw the next samples for ``epoch`` (call at the start of each epoch)."""
        self.epoch = _check_index(epoch, "epoch")

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
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise InputError(f"images must be a BCHW tensor, got {shape}; add a batch axis with unsqueeze(0)")
        n = images.shape[0]
        idx = _indices(indices, n)
        chains: list[list[Record]]
        if not self.training:
            chains = [[] for _ in range(n)]
        elif plans is None:
            chains = self.plan(idx, epoch=epoch, channels=images.shape[1], device=images.device)
        else:
            chains = self._check_plans(plans, idx, self.epoch if epoch is None else epoch)
        chains = [with_codecs(p, images) for p in chains]
        out = apply_plans(images, chains)
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

    def _check_plans(
        self, plans: Sequence[Sequence[Record]], indices: list[int], epoch: int
    ) -> list[list[Record]]:
        """``plans`` if each record is this module's (seed, policy, variant) draw for its image's
        index at ``epoch``: plans made in DataLoader workers whose copy of the module missed a
        ``set_epoch`` (persistent workers) would otherwise repeat an old epoch's draws."""
        chains = [list(p) for p in plans]
        if len(chains) != len(indices):
            raise InputError(f"plans has {len(chains)} entries for a batch of {len(indices)}: pass one plan per image")
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
                        "(DataLoader workers keep the module as it was when they started: with "
                        "persistent_workers pass the epoch to plan(indices, epoch=...))"
                    )
        return chains

    def extra_repr(self) -> str:
        return f"policy={self.policy.policy!r}, seed={self.seed}, epoch={self.epoch}, ops={self.policy.op_names()}"
