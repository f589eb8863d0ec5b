"""The batched pieces of the colour/exposure kernels against the per-sample functions they
replace (the batched keyed fields: tests/ops/test_keyed_fields.py): vignetting's batched
fall-off equals ``field_falloff_np`` bit for bit; the tissue-weighted mean of contrast equals
the float64 NumPy sum it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perturb.ops import color, exposure


class _Box:
    def __init__(self, bbox: tuple[int, int, int, int]) -> None:
        self.bbox = bbox


def test_batched_field_falloff_is_the_host_fall_off_bit_for_bit() -> None:
    h, w = 37, 53
    scenes = [None, _Box((4, 2, 50, 35)), _Box((10, 0, 30, 37)), _Box((5, 5, 6, 30))]
    cx = torch.tensor([0.45, 0.5, 0.55, 0.51])
    cy = torch.tensor([0.55, 0.47, 0.5, 0.49])
    strength = torch.tensor([0.33, 0.98, 0.6, 1.0])
    frames = [exposure.field_frame(h, w, s) for s in scenes]
    batched = exposure.field_falloff(torch.zeros(4, 3, h, w), cx, cy, strength, frames)
    for i, scene in enumerate(scenes):
        ref = exposure.field_falloff_np(h, w, float(cx[i]), float(cy[i]), float(strength[i]), scene)
        assert np.array_equal(batched[i, 0].to(torch.float32).numpy(), ref), i


def test_tissue_mean_is_the_weighted_float64_mean() -> None:
    gen = torch.Generator().manual_seed(5)
    y = torch.rand(3, 1, 20, 30, generator=gen)
    weight = torch.rand(3, 1, 20, 30, generator=gen)
    weight[1] = 1.0
    weight[2, :, :10] = 0.0
    means = color.tissue_mean(y, weight)
    for i in range(3):
        yy, ww = y[i, 0].numpy().astype(np.float64), weight[i, 0].numpy().astype(np.float64)
        expected = np.float32((yy * ww).sum() / ww.sum())
        assert abs(float(means[i]) - float(expected)) <= 1e-7
    assert float(means[1]) == pytest.approx(float(y[1].double().mean()), abs=1e-7)
