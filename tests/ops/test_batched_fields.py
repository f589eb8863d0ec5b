"""The batched pieces of the colour/exposure kernels against the per-sample functions they
replace: keyed fields of a whole batch (``perturb.ops._fields``) equal ``perturb.rng``'s field of
each key bit for bit; vignetting's batched fall-off equals ``field_falloff_np`` bit for bit; the
tissue-weighted mean of contrast equals the float64 NumPy sum it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perturb import rng
from perturb.ops import _fields, color, exposure

KEYS = [0, 1, 123456789, (1 << 64) - 1, 0xDEADBEEFCAFEF00D]


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 5, 7), (3, 4, 4), (1, 6, 6), (3, 33, 17)])
def test_batched_fields_are_each_keys_own_field(shape: tuple[int, ...]) -> None:
    u = _fields.uniform_fields(KEYS, "stream/u", shape, "cpu")
    z = _fields.normal_fields(KEYS, "stream/z", shape, "cpu")
    n = int(np.prod(shape))
    bits = _fields.hash_bits_batch(KEYS, "stream/b", n, "cpu")
    assert u.shape == z.shape == (len(KEYS), *shape) and bits.shape == (len(KEYS), n)
    for i, key in enumerate(KEYS):
        assert torch.equal(u[i], rng.uniform_field(key, "stream/u", shape))
        assert torch.equal(z[i], rng.normal_field(key, "stream/z", shape))
        assert torch.equal(bits[i], rng.hash_bits(key, "stream/b", n))
        # the device formula of perturb.rng (what runs on CUDA), evaluated on the host
        k = rng.sub_key(key, "stream/b")
        ref = rng._hash_torch(torch.arange(n, dtype=torch.int64), k & 0xFFFFFFFF, k >> 32)
        assert torch.equal(bits[i], ref)


def test_a_keys_field_does_not_depend_on_the_batch() -> None:
    alone = _fields.normal_fields([KEYS[2]], "s", (1, 9, 11), "cpu")
    among = _fields.normal_fields(KEYS, "s", (1, 9, 11), "cpu")
    assert torch.equal(alone[0], among[2])
    assert not torch.equal(among[0], among[1])


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
