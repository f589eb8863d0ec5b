"""``Augment.forward`` is batched on the torch path (what runs on CUDA): for a batch of 16 it
dispatches at most 1.25x the aten calls of a batch of 1 and no more host round trips
(``tests/dispatch_counts.py``). Planning, the scene cache and the carried scenes are host-side
work on records; the pixels see one batched kernel per op.

Each policy gives every sample the same one op, so the batch runs as one group: samples with
different ops (or orders) run one kernel per op, which is not a per-sample loop and is not
what this test measures."""

from __future__ import annotations

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
    "brightness-scene": (
        "brightness",
        None,
        "the border composite (perturb.engine.compose_tissue) still builds each sample's alpha "
        "on the host: batched on the engine branch (COMPOSITE_BATCHED)",
    ),
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
