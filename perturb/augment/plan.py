"""Per-sample augmentation plans: which ops, in which order, how strong, with which parameters.

A plan is a pure function of (policy, seed, epoch, sample index[, variant]):

1. The plan generator is keyed by ``derive_key(seed, sample_key(epoch, index), "augment.plan",
   0, variant)``; it decides whether the sample is augmented (``probability``), how many ops
   (``num_ops``), which ops in which order (weighted draws without repetition) and each op's
   severity or continuous strength.
2. Each op's parameters come from the engine's keyed sampler under the engine's own key
   ``draw_key(seed, sample_key(epoch, index), op, variant)``, exactly as ``perturb.apply``
   draws them; a continuous strength ``s`` draws from the severity table interpolated
   linearly between levels ``floor(s)`` and ``ceil(s)`` (at an integer ``s`` the table's own
   level, so strength 3.0 gives the parameters of severity 3).

The result is a list of ``perturb.contracts.record.Record``: ``perturb.replay(records, image)`` on one
image reproduces ``apply_plans`` bit for bit. Nothing depends on the batch, the order, the
DataLoader worker or the device.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from perturb import rng
from perturb.augment.policy import OpEntry, Policy, supports_modality
from perturb.catalog.ops import get_op
from perturb.catalog.specs import MODALITIES, OpSpec
from perturb.contracts.record import Record
from perturb.engine import run as engine
from perturb.errors import InputError

PLAN_STREAM = "augment.plan"


def _check_index(value: object, name: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InputError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def sample_key(epoch: int, index: int) -> str:
    """The engine sample key of dataset item ``index`` in ``epoch``: ``e<epoch>/i<index>``."""
    return f"e{_check_index(epoch, 'epoch')}/i{_check_index(index, 'index')}"


def strength_level(spec: OpSpec, strength: float) -> dict[str, tuple[float, float]]:
    """The op's parameter ranges at a continuous ``strength`` in [1, 5]: each range's ends
    interpolated linearly between the two neighbouring severity levels (integer parameters
    rounded to whole numbers)."""
    if not (isinstance(strength, int | float) and 1.0 <= strength <= 5.0):
        raise InputError(f"strength must be a number in [1, 5], got {strength!r}")
    low = min(math.floor(strength), 4)
    frac = float(strength) - low
    level: dict[str, tuple[float, float]] = {}
    for name, table in spec.params.items():
        a, b = table.levels[low - 1], table.levels[low]
        if frac in (0.0, 1.0):  # an integer strength: that severity's level exactly
            lo, hi = a if frac == 0.0 else b  # (a + 1.0 * (b - a) can miss b by an ulp)
        else:
            lo, hi = a[0] + frac * (b[0] - a[0]), a[1] + frac * (b[1] - a[1])
        if table.integer:
            lo, hi = float(round(lo)), float(round(hi))
        level[name] = (lo, hi)
    return level


def nearest_severity(strength: float) -> int:
    """The integer severity a strength is recorded under (round half up)."""
    return min(5, max(1, math.floor(strength + 0.5)))


def check_modality(modality: str | None) -> str | None:
    """``modality`` if it is a catalog modality (or None), else an InputError listing them."""
    if modality is not None and modality not in MODALITIES:
        raise InputError(f"unknown modality {modality!r}; known: {', '.join(sorted(MODALITIES))}")
    return modality


def _candidates(policy: Policy, modality: str | None, channels: int | None) -> list[OpEntry]:
    pool = list(policy.ops)
    if modality is not None:
        pool = [e for e in pool if supports_modality(e.spec, modality)]
    if channels is not None:
        if channels not in (1, 3):
            raise InputError(f"channels must be 1 or 3, got {channels!r}")
        kept = [e for e in pool if channels in e.spec.channels]
        if len(kept) < len(pool) and (channels == 3 or not kept):  # colour ops off gray: expected
            _warn_left_out(policy.policy, channels, [e.op for e in pool if e not in kept])
        pool = kept
    return pool


_WARNED: set[tuple[str, int, tuple[str, ...]]] = set()  # (policy, channels, ops) said


def _warn_left_out(policy: str, channels: int, ops: list[str]) -> None:
    """Say once per policy and channel count which of its ops a batch of ``channels``
    channels cannot get (a gray film repeated to 3 channels for an ImageNet backbone loses
    every X-ray op), and how to keep them."""
    key = (policy, channels, tuple(ops))
    if key in _WARNED:
        return
    _WARNED.add(key)
    if channels == 3:
        fix = (
            "they take 1-channel (gray) images: augment the gray film (images[:, :1]) and repeat "
            "it to 3 channels after (out.expand(-1, 3, -1, -1))"
        )
    else:
        fix = "they take colour (3-channel) images, so no sample is augmented"
    warnings.warn(
        f"policy {policy!r} on {channels}-channel images leaves out {len(ops)} of its ops "
        f"({', '.join(ops)}): {fix}",
        UserWarning,
        stacklevel=2,
    )


def _quantile_int(u: float, lo: int, hi: int) -> int:
    return lo + min(int(u * (hi - lo + 1)), hi - lo)


def plan_sample(
    policy: Policy,
    *,
    seed: int,
    epoch: int,
    index: int,
    modality: str | None = None,
    channels: int | None = None,
    variant: int = 0,
    device: torch.device | str = "cpu",
) -> list[Record]:
    """The ordered chain of records for one sample (empty when it is not augmented).

    ``modality`` / ``channels`` restrict the draw to the policy's ops that support them (e.g.
    ``channels=1`` leaves out colour ops for gray images); ``variant`` gives independent
    draws of the same sample in the same epoch (e.g. two views). ``device`` only fills the
    records' ``device``/``backend`` fields."""
    key = sample_key(epoch, index)
    variant = _check_index(variant, "variant")
    check_modality(modality)
    seed = int(seed)
    g = rng.scalar_rng(rng.derive_key(seed, key, PLAN_STREAM, 0, variant))
    u_apply, u_count = float(g.random()), float(g.random())
    if u_apply >= policy.probability:
        return []
    pool = _candidates(policy, modality, channels)
    hi = min(policy.num_ops[1], len(pool))
    lo = min(policy.num_ops[0], hi)
    count = _quantile_int(u_count, lo, hi)
    chosen: list[OpEntry] = []
    for _ in range(count):
        chosen.append(pool.pop(_weighted_pick([e.weight for e in pool], float(g.random()))))
    dev = torch.device(device)
    records = []
    for position, entry in enumerate(chosen):
        op = get_op(entry.op)
        kind, (a, b) = policy.scale(entry)
        u = float(g.random())
        extra: dict[str, Any] = {"policy": policy.policy, "epoch": int(epoch), "index": int(index), "position": position}
        level = None
        if kind == "severity":
            severity = _quantile_int(u, int(a), int(b))
        else:
            strength = a + u * (b - a)
            severity = nearest_severity(strength)
            extra["strength"] = strength
            level = strength_level(op.spec, strength)
        protect = op.spec.protects_border if policy.protect_border is None else policy.protect_border
        records.append(
            engine.make_record(
                op, severity, key, seed=seed, variant=variant, protect_border=protect, device=dev,
                level=level, extra=extra,
            )
        )
    return records


def _weighted_pick(weights: list[float], u: float) -> int:
    """The index whose cumulative-weight interval holds ``u`` times the total weight."""
    target = u * sum(weights)
    total = 0.0
    for i, w in enumerate(weights):
        total += w
        if target < total:
            return i
    return len(weights) - 1


def plan_batch(
    policy: Policy,
    *,
    seed: int,
    epoch: int,
    indices: Sequence[int] | torch.Tensor | np.ndarray,
    modality: str | None = None,
    channels: int | None = None,
    variant: int = 0,
    device: torch.device | str = "cpu",
) -> list[list[Record]]:
    """``plan_sample`` for each dataset index of a batch."""
    if isinstance(indices, torch.Tensor | np.ndarray):
        indices = indices.reshape(-1).tolist()
    return [
        plan_sample(
            policy,
            seed=seed,
            epoch=epoch,
            index=i,
            modality=modality,
            channels=channels,
            variant=variant,
            device=device,
        )
        for i in indices
    ]


def apply_plans(
    images: torch.Tensor, plans: Sequence[Sequence[Record]], record_scenes: bool = False
) -> torch.Tensor:
    """Run each sample's chain over a BCHW batch (float32 in [0, 1], uint8 or uint16; same
    dtype out). At each chain position the samples that share an op run together through
    ``perturb.engine.run.run_records`` (the batched kernel); a sample's output depends only on its
    own image and records. The input tensor is not modified (it is returned when no sample
    has an op).

    Positions alternate between two batch buffers: the samples of each op read their rows of
    one and write their rows of the other (``perturb.engine.run.run_records_into``; on the CPU path without
    gathering or scattering the rows); a sample whose chain has ended stays where its last
    result is and is copied into the returned batch once, at the end.
    ``record_scenes``: each border-protecting record without a stored scene (an X-ray op's
    annotation layer) gets the scene it ran with in ``extra["scene"]`` (records are changed)."""
    engine.check_images(images)
    if len(plans) != images.shape[0]:
        raise InputError(f"{len(plans)} plans for a batch of {images.shape[0]} images: pass one plan per image")
    channels = images.shape[1]
    for plan in plans:
        for r in plan:
            spec = get_op(r.op).spec
            if channels not in spec.channels:
                raise InputError(
                    f"op {r.op!r} needs {' or '.join(map(str, spec.channels))}-channel images, got "
                    f"{channels}; plan with channels={channels} so such ops are left out"
                )
    out = images
    spare: list[torch.Tensor] = []  # buffers of ours (their rows of ended chains stay put)
    # the tensor each ended chain's result lives in (its row there): written to no more, since
    # a buffer taken again from ``spare`` is written only at the rows of chains still running
    ended_in: dict[int, torch.Tensor] = {}
    depth = max((len(p) for p in plans), default=0)
    for position in range(depth):
        groups: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            if position < len(plan):
                groups.setdefault(plan[position].op, []).append(i)
            elif i not in ended_in:
                ended_in[i] = out
        if len(groups) == 1:
            idx = next(iter(groups.values()))
            if len(idx) == out.shape[0]:  # the whole batch under one op: one call
                prev = out
                out = engine.run_records(
                    prev, [plans[i][position] for i in idx], record_scenes=record_scenes
                )
                if prev is not images and not _shares_storage(prev, out):
                    spare.append(prev)
                continue
        nxt = spare.pop() if spare else torch.empty_like(images, memory_format=torch.contiguous_format)
        for idx in groups.values():
            engine.run_records_into(
                out, nxt, idx, [plans[i][position] for i in idx], record_scenes=record_scenes
            )
        if out is not images:
            spare.append(out)
        out = nxt
    # each ended chain's row copied once into the result (not along every later position)
    for held in {id(t): t for t in ended_in.values()}.values():
        if held is not out:
            copy_rows(held, out, [i for i, t in ended_in.items() if t is held])
    return out


def copy_rows(src: torch.Tensor, dst: torch.Tensor, rows: Sequence[int]) -> None:
    """``dst[rows] = src[rows]`` in place, row by row (no gathered copy)."""
    if src.device.type == "cpu" and not src.requires_grad and not dst.requires_grad:
        s, d = src.numpy(), dst.numpy()
        for i in rows:
            d[i] = s[i]
        return
    for i in rows:
        dst[i].copy_(src[i])


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


take_rows = engine.take_rows
put_rows = engine.put_rows
