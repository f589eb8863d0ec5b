"""Every registered op is one batched computation on the torch path (the code that runs on CUDA).

For a batch of 16 an op may dispatch at most 1.25x the aten calls it dispatches for a batch of 1
(a per-sample loop would be ~16x), and no more host round trips. Run on the CPU with the torch
backend forced, so the proof needs no GPU. Two ways in: scenes given (as generation passes each
source image's scene to every op), scenes analysed by ``apply`` itself, and the kernel alone
(``protect_border=False``: no scene, no composite).
"""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb.catalog.ops import get_op
from perturb.engine.run import scene_kind
from perturb.ops.backend import use_backend
from perturb.ops.kernels import kernel_names
from perturb.scene import Scene
from tests.dispatch_counts import Dispatch, counting

SMALL, LARGE = 1, 16
GROWTH = 1.25
# ops whose torch path still loops over the batch: each must leave this list when batched
# (strict xfail: a listed op that passes fails the test, so the list cannot go stale)
NOT_YET_BATCHED: frozenset[str] = frozenset()


# ops whose torch kernel runs on the host (the batch copied to NumPy and back): on the torch path
# a non-codec kernel makes no host round trip at all (the X-ray text and marker overlays
# rasterise with OpenCV from the records' host-side parameters, ``register_kernel(...,
# host_params=True)``, and only upload their masks)
HOST_BOUND: frozenset[str] = frozenset()
MODES = ("kernel", "scenes-given", "scenes-analysed")


def _images(op: str, b: int) -> torch.Tensor:
    channels = 1 if tuple(get_op(op).spec.channels) == (1,) else 3
    gen = torch.Generator().manual_seed(7)
    return torch.rand(b, channels, 96, 128, generator=gen)


def _dispatch(op: str, b: int, mode: str) -> Dispatch:
    x = _images(op, b)
    keys = [f"frame{i}" for i in range(b)]
    scenes = None
    if mode == "scenes-given" and get_op(op).spec.protects_border:
        scenes = [Scene.of(x[i]) for i in range(b)]
    protect = False if mode == "kernel" else None
    with use_backend("torch"):
        perturb.apply(x, op, 3, keys, scenes=scenes, protect_border=protect)  # warm: lazy tables
        with counting() as found:
            perturb.apply(x, op, 3, keys, scenes=scenes, protect_border=protect)
    return found


def _cases() -> list[object]:
    cases = []
    for op in kernel_names():
        for mode in MODES:
            marks = []
            if op in NOT_YET_BATCHED or (mode == "kernel" and op in HOST_BOUND):
                marks = [
                    pytest.mark.xfail(
                        reason="torch kernel not yet one device-resident batched computation",
                        strict=True,
                    )
                ]
            cases.append(pytest.param(op, mode, marks=marks, id=f"{op}-{mode}"))
    return cases


@pytest.mark.parametrize(("op", "mode"), _cases())
def test_dispatch_does_not_grow_with_the_batch(op: str, mode: str) -> None:
    small = _dispatch(op, SMALL, mode)
    large = _dispatch(op, LARGE, mode)
    grown = large.grown(small)
    assert large.aten_calls <= GROWTH * small.aten_calls, (
        f"{op}: {small.aten_calls} aten calls at B={SMALL}, {large.aten_calls} at B={LARGE}; "
        f"grown: {dict(sorted(grown.items(), key=lambda kv: kv[1][0] - kv[1][1])[:8])}"
    )
    if mode == "kernel" and get_op(op).codec is None:
        assert small.host_calls == 0, (
            f"{op}: the torch kernel makes host round trips: {dict(small.host)}"
        )
    spec = get_op(op).spec
    if (
        mode == "scenes-given"
        and spec.protects_border
        and not spec.spatial
        and get_op(op).codec is None
        and scene_kind(op) == "endoscopy"  # the given scenes are endoscopy frames' scenes
    ):
        # the scenes (no text lines on these frames) were used once already: their alphas are
        # on the device, so the composite copies nothing to the host (spatial ops still read
        # their tissue extension's fill from the clean pixels)
        assert large.host_calls == 0, (
            f"{op}: the composite with known scenes makes host round trips: {dict(large.host)}"
        )
    assert large.host_calls <= small.host_calls, (
        f"{op}: host round trips {small.host_calls} at B={SMALL}, {large.host_calls} at B={LARGE}: "
        f"{ {k: v for k, v in grown.items() if k.startswith('host:')} }"
    )


def test_every_registered_op_is_checked() -> None:
    listed = NOT_YET_BATCHED | HOST_BOUND
    assert set(kernel_names()) >= listed, sorted(listed - set(kernel_names()))


def test_the_counter_sees_a_per_sample_loop() -> None:
    """The counter itself: a loop over the batch grows, a batched call does not."""

    def looped(x: torch.Tensor) -> torch.Tensor:
        return torch.stack([s * float(s.mean().item()) for s in x])

    counts = {}
    for b in (SMALL, LARGE):
        x = torch.rand(b, 3, 8, 8)
        with counting() as found:
            looped(x)
        counts[b] = found
    assert counts[LARGE].aten_calls >= 8 * counts[SMALL].aten_calls
    assert counts[LARGE].host_calls == LARGE * counts[SMALL].host_calls
    with counting() as batched:
        x = torch.rand(LARGE, 3, 8, 8)
        _ = x * x.mean(dim=(1, 2, 3), keepdim=True)
    assert batched.aten_calls <= 4 and batched.host_calls == 0
