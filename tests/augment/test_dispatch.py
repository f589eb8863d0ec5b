"""``Augment.forward`` and the DALI pipeline's per-batch torch stage are batched on the torch
path (what runs on CUDA): for a batch of 16 they dispatch at most 1.25x the aten calls of a
batch of 1 and no more host round trips
(``tests/dispatch_counts.py``). Planning, the scene cache and the carried scenes are host-side
work on records; the pixels see one batched kernel per op.

Each policy gives every sample the same one op, so the batch runs as one group: samples with
different ops (or orders) run one kernel per op, which is not a per-sample loop and is not
what this test measures."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perturb.augment import Augment, load_policy
from perturb.ops.backend import use_backend
from tests.dispatch_counts import Dispatch, counting

SMALL, LARGE = 1, 16
GROWTH = 1.25

CASES = {
    # op, protect_border (None: the op's spec), xfail reason
    "rotation": ("rotation", None, None),
    "resized_crop": ("resized_crop", None, None),
    "translation": ("translation", None, None),
    "brightness-kernel": ("brightness", False, None),
    "brightness-scene": ("brightness", None, None),
}


def _dispatch(op: str, protect: bool | None, b: int) -> Dispatch:
    spec = {"policy": f"one-{op}", "ops": [op], "num_ops": 1, "probability": 1.0, "severity": 3}
    if protect is not None:
        spec["protect_border"] = protect
    augment = Augment(load_policy(spec), seed=0, carry_scenes=True)
    x = torch.rand(b, 3, 96, 128, generator=torch.Generator().manual_seed(7))
    indices = list(range(b))
    with use_backend("torch"):
        augment(x, indices)  # warm: lazy tables, and the scenes of these sources cached
        with counting() as found:
            augment(x, indices, epoch=1)  # new draws, the same sources
    return found


def _cases() -> list[object]:
    out = []
    for name, (op, protect, reason) in CASES.items():
        marks = [] if reason is None else [pytest.mark.xfail(reason=reason, strict=True)]
        out.append(pytest.param(op, protect, marks=marks, id=name))
    return out


@pytest.mark.parametrize(("op", "protect"), _cases())
def test_augment_dispatch_does_not_grow_with_the_batch(op: str, protect: bool | None) -> None:
    small = _dispatch(op, protect, SMALL)
    large = _dispatch(op, protect, LARGE)
    grown = large.grown(small)
    assert large.aten_calls <= GROWTH * small.aten_calls, (
        f"{op}: {small.aten_calls} aten calls at B={SMALL}, {large.aten_calls} at B={LARGE}; "
        f"grown: {dict(sorted(grown.items(), key=lambda kv: kv[1][0] - kv[1][1])[:8])}"
    )
    assert large.host_calls <= small.host_calls, (
        f"{op}: host round trips {small.host_calls} at B={SMALL}, {large.host_calls} at B={LARGE}"
    )


def test_a_per_sample_loop_in_forward_would_be_seen() -> None:
    """The counts above are of the pixels' work: a batch of 16 through 16 single calls grows."""

    def looped(b: int) -> Dispatch:
        augment = Augment(
            load_policy({"policy": "r", "ops": ["rotation"], "num_ops": 1, "probability": 1.0})
        )
        x = torch.rand(b, 3, 32, 48, generator=torch.Generator().manual_seed(1))
        with use_backend("torch"), counting() as found:
            for i in range(b):
                augment(x[i : i + 1], [i])
        return found

    assert looped(LARGE).aten_calls >= 8 * looped(SMALL).aten_calls


def _dali_stage_dispatch(op: str, b: int, position: int) -> Dispatch:
    """The DALI pipeline's per-batch torch work (``_TorchStage``, the function DALI calls on
    each batch) for a batch of ``b`` DLPack samples, counted on its second epoch."""
    from torch.utils.dlpack import to_dlpack

    from perturb.augment.dali import Planner, _TorchStage

    policy = load_policy(
        {"policy": f"dali-{op}", "ops": [op], "num_ops": 1, "probability": 1.0, "severity": 3}
    )
    stage = _TorchStage(Planner(policy, seed=0, channels=3), position, [], cuda=False)
    hwc = (torch.rand(b, 96, 128, 3, generator=torch.Generator().manual_seed(7)) * 255).to(
        torch.uint8
    )

    def inputs(epoch: int) -> tuple[list[Any], list[Any], list[Any]]:
        """What DALI hands the stage: one DLPack capsule per sample (made outside the count)."""
        ids = torch.arange(b, dtype=torch.int64).reshape(b, 1)
        epochs = torch.full((b, 1), epoch, dtype=torch.int64)
        return (
            [to_dlpack(x) for x in hwc],
            [to_dlpack(x) for x in ids],
            [to_dlpack(x) for x in epochs],
        )

    with use_backend("torch"):
        stage(*inputs(0))  # warm: lazy tables, the planner's caches
        second = inputs(1)
        with counting() as found:
            stage(*second)
    return found


@pytest.mark.parametrize("op", ["brightness", "rotation", "gaussian_noise"])
@pytest.mark.parametrize("position", [0, 1], ids=["first-stage", "later-stage"])
def test_dali_torch_stage_dispatch_does_not_grow_with_the_batch(op: str, position: int) -> None:
    """The DALI pipeline's torch stage: at position 0 it analyses the sources' scenes and runs
    the chain's first op, at a later position (past the one-op chain) it only moves the batch
    through. Either way: one batched computation, not a per-sample loop."""
    small = _dali_stage_dispatch(op, SMALL, position)
    large = _dali_stage_dispatch(op, LARGE, position)
    assert large.aten_calls <= GROWTH * max(small.aten_calls, 8), (
        f"{op}@{position}: {small.aten_calls} aten calls at B={SMALL}, {large.aten_calls} at "
        f"B={LARGE}; grown: {large.grown(small)}"
    )
    assert large.host_calls <= small.host_calls, (
        f"{op}@{position}: host round trips {small.host_calls} -> {large.host_calls}"
    )
