"""The float32 sRGB tables of the torch kernels on a CPU device (``perturb.ops._math``).

``srgb_to_linear_lut`` / ``linear_to_srgb_lut`` replace the float64 curves in the torch kernels
of color_cast, vignetting and defocus_blur; contrast's kernel lifts its clipped pixels alone.
Checked here: the tables' error against the float64 curve, and that a value's result does not
depend on its batch, its position in it, or the thread count (the reason the curves were float64).
"""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb.ops._math import (
    linear_to_srgb,
    linear_to_srgb_lut,
    srgb_to_linear,
    srgb_to_linear_lut,
)
from perturb.ops.backend import use_backend
from tests.helpers import small_batch


def _probe() -> torch.Tensor:
    """Seeded values in [0, 1], a dense ramp and the curves' knees and ends (float32)."""
    rand = torch.rand(300_001, generator=torch.Generator().manual_seed(7))
    ramp = torch.linspace(0.0, 1.0, 65_537)
    edges = torch.tensor([0.0, 1.0, 0.04045, 0.0031308, 1e-7, 1.0 - 2**-24])
    return torch.cat([rand, ramp, edges]).to(torch.float32)


@pytest.mark.parametrize(
    ("table", "curve", "bound"),
    [(srgb_to_linear_lut, srgb_to_linear, 2e-7), (linear_to_srgb_lut, linear_to_srgb, 2e-5)],
)
def test_tables_follow_the_float64_curve(table, curve, bound) -> None:  # type: ignore[no-untyped-def]
    x = _probe()
    err = (table(x).double() - curve(x.double())).abs()
    assert float(err.max()) <= bound
    assert table(x).dtype == torch.float32


def test_encode_clips_like_the_curve() -> None:
    x = torch.tensor([-0.5, -1e-9, 1.0 + 1e-6, 3.0])
    assert torch.equal(linear_to_srgb_lut(x), torch.tensor([0.0, 0.0, 1.0, 1.0]))


@pytest.mark.parametrize("table", [srgb_to_linear_lut, linear_to_srgb_lut])
def test_a_value_does_not_depend_on_its_batch_position_or_threads(table) -> None:  # type: ignore[no-untyped-def]
    x = _probe()
    whole = table(x)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, max(2, threads)):
            torch.set_num_threads(n_threads)
            for start, size in ((0, 1), (3, 17), (1001, 4093), (5, 70_001), (12_345, 200_003)):
                part = table(x[start : start + size].clone())
                assert torch.equal(part, whole[start : start + size]), (n_threads, start, size)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("op", ["color_cast", "vignetting", "contrast", "defocus_blur"])
def test_torch_path_sample_independent_of_batch_at_odd_sizes(op: str) -> None:
    """The torch path (CPU device) gives each sample the same bits alone, inside batches of odd
    sizes at odd offsets, and at other thread counts (odd image sizes: the vectorised loops'
    scalar tails fall inside samples)."""
    n = 9
    x = small_batch(n, 37, 53, 3)
    x[::2, :, 5:12, 8:21] = 0.996  # clipped highlights in some samples (contrast lifts them)
    keys = [f"s{i}" for i in range(n)]
    with use_backend("torch"):
        full, _ = perturb.apply(x, op, 4, keys, seed=1, protect_border=False)
        for start, size in ((0, 1), (4, 1), (1, 3), (2, 7)):
            rows = slice(start, start + size)
            part, _ = perturb.apply(x[rows], op, 4, keys[rows], seed=1, protect_border=False)
            assert torch.equal(part, full[rows]), (start, size)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1 if threads > 1 else 2)
            other, _ = perturb.apply(x, op, 4, keys, seed=1, protect_border=False)
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(other, full)
