"""Every registered op is one batched computation on the torch path (the code that runs on CUDA).

For a batch of 16 an op may dispatch at most 1.25x the aten calls it dispatches for a batch of 1
(a per-sample loop would be ~16x), and no more host round trips. Run on the CPU with the torch
backend forced, so the proof needs no GPU. Two ways in: scenes given (as generation passes each
source image's scene to every op) and scenes analysed by ``apply`` itself.
"""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb.catalog.registry import get_op
from perturb.ops.backend import use_backend
from perturb.ops.registry import kernel_names
from perturb.scene import Scene
from tests.dispatch_counts import Dispatch, counting

SMALL, LARGE = 1, 16
GROWTH = 1.25
# ops whose torch path still loops over the batch: each must leave this list when batched
# (strict xfail: a listed op that passes fails the test, so the list cannot go stale)
NOT_YET_BATCHED: frozenset[str] = frozenset(
    {
        "brightness",
        "bubbles",
        "chromatic_aberration",
        "color_cast",
        "contrast",
        "defocus_blur",
        "fluid_occlusion",
        "gamma",
        "gaussian_blur",
        "gaussian_noise",
        "haze",
        "hue_shift",
        "impulse_noise",
        "interlacing",
        "lens_distortion",
        "lens_droplets",
        "lens_fog",
        "motion_blur",
        "overexposure",
        "resized_crop",
        "rotation",
        "saturation",
        "shot_noise",
        "speckle_noise",
        "specular_glare",
        "surgical_smoke",
        "translation",
        "underexposure",
        "vignetting",
        "xray_burned_text",
        "xray_cardiac_motion",
        "xray_collimation",
        "xray_detector_defects",
        "xray_double_exposure",
        "xray_edge_enhancement",
        "xray_foreign_objects",
        "xray_laterality_marker",
        "xray_motion_blur",
        "xray_over_penetration",
        "xray_patient_rotation",
        "xray_quantum_noise",
        "xray_scatter",
        "xray_skin_fold",
        "xray_support_devices",
        "xray_under_penetration",
    }
)


def _images(op: str, b: int) -> torch.Tensor:
    channels = 1 if tuple(get_op(op).spec.channels) == (1,) else 3
    gen = torch.Generator().manual_seed(7)
    return torch.rand(b, channels, 96, 128, generator=gen)


def _dispatch(op: str, b: int, scenes_given: bool) -> Dispatch:
    x = _images(op, b)
    keys = [f"frame{i}" for i in range(b)]
    scenes = None
    if scenes_given and get_op(op).spec.protects_border:
        scenes = [Scene.of(x[i]) for i in range(b)]
    with use_backend("torch"):
        perturb.apply(x, op, 3, keys, scenes=scenes)  # warm: lazy tables, caches
        with counting() as found:
            perturb.apply(x, op, 3, keys, scenes=scenes)
    return found


def _marks(op: str) -> list[pytest.MarkDecorator]:
    if op in NOT_YET_BATCHED:
        return [pytest.mark.xfail(reason="torch path still loops over the batch", strict=True)]
    return []


@pytest.mark.parametrize("scenes_given", [True, False], ids=["scenes-given", "scenes-analysed"])
@pytest.mark.parametrize("op", [pytest.param(n, marks=_marks(n)) for n in kernel_names()])
def test_dispatch_does_not_grow_with_the_batch(op: str, scenes_given: bool) -> None:
    small = _dispatch(op, SMALL, scenes_given)
    large = _dispatch(op, LARGE, scenes_given)
    grown = large.grown(small)
    assert large.aten_calls <= GROWTH * small.aten_calls, (
        f"{op}: {small.aten_calls} aten calls at B={SMALL}, {large.aten_calls} at B={LARGE}; "
        f"grown: {dict(sorted(grown.items(), key=lambda kv: kv[1][0] - kv[1][1])[:8])}"
    )
    assert large.host_calls <= small.host_calls, (
        f"{op}: host round trips {small.host_calls} at B={SMALL}, {large.host_calls} at B={LARGE}: "
        f"{ {k: v for k, v in grown.items() if k.startswith('host:')} }"
    )


def test_every_registered_op_is_checked() -> None:
    assert set(kernel_names()) >= NOT_YET_BATCHED, sorted(NOT_YET_BATCHED - set(kernel_names()))


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
