"""The torch path's batched PSFs (perturb.ops.blur): each sample's taps in the (B, K, K) stack
are the CPU path's (``gaussian_taps``, ``disk_psf``, ``line_psf``) centred in the support, the
support covers every parameter the catalog's bounds allow, and the FFT correlation (CUDA's
path for large PSFs) gives the direct sums."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perturb.catalog.ops import get_op
from perturb.ops import blur

SIDE = 96
IMAGE = torch.zeros(1, 1, SIDE, 128)


def _centre(taps: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size`` taps of a 1-D tap row or ``size`` x ``size`` of a 2-D PSF."""
    r, k = size // 2, taps.shape[-1] // 2
    window = slice(k - r, k + r + 1)
    return taps[window] if taps.dim() == 1 else taps[window, window]


@pytest.mark.parametrize(
    ("op", "param", "bound"),
    [
        ("gaussian_blur", "sigma", blur.SIGMA_BOUND),
        ("defocus_blur", "radius", blur.RADIUS_BOUND),
        ("motion_blur", "length", blur.LENGTH_BOUND),
    ],
)
def test_support_bounds_are_the_catalogs(op: str, param: str, bound: float) -> None:
    assert get_op(op).spec.params[param].bounds[1] == bound


def test_gaussian_taps_equal_the_cpu_taps() -> None:
    sigma = torch.tensor([0.0, 0.0008, 0.004, 0.014, blur.SIGMA_BOUND], dtype=torch.float32)
    support = blur._support(3.0 * blur.SIGMA_BOUND * SIDE, IMAGE)
    taps = blur.gaussian_taps_batch(sigma, SIDE, support)
    assert taps.shape == (5, 2 * support + 1) and taps.dtype == torch.float32
    for b in range(5):
        ref = torch.from_numpy(blur.gaussian_taps(float(sigma[b]) * SIDE))
        assert torch.equal(_centre(taps[b], ref.shape[0]), ref)
        assert int(torch.count_nonzero(taps[b])) == int(torch.count_nonzero(ref))  # none outside


def test_disk_psfs_equal_the_cpu_psfs() -> None:
    radius = torch.tensor([0.0, 0.0013, 0.0068, 0.028, blur.RADIUS_BOUND], dtype=torch.float32)
    support = blur._support(blur.RADIUS_BOUND * SIDE, IMAGE)
    psfs = blur.disk_psf_batch(radius, SIDE, support)
    for b in range(5):
        ref = torch.from_numpy(blur.disk_psf(float(radius[b]) * SIDE))
        assert torch.equal(_centre(psfs[b], ref.shape[0]), ref)
        assert int(torch.count_nonzero(psfs[b])) == int(torch.count_nonzero(ref))


def test_line_psfs_equal_the_cpu_psfs() -> None:
    length = torch.tensor([0.0, 0.003, 0.015, 0.055, 0.1, blur.LENGTH_BOUND], dtype=torch.float32)
    angle = torch.tensor([0.0, 33.0, 90.0, 135.5, 179.9, 61.0], dtype=torch.float32)
    support = blur._support(blur.LENGTH_BOUND * SIDE / 2.0 + 1.0, IMAGE)
    psfs = blur.line_psf_batch(length, angle, SIDE, support)
    for b in range(length.shape[0]):
        ref = blur.line_psf(float(length[b]) * SIDE, float(angle[b]))
        got = _centre(psfs[b], ref.shape[0]).double().numpy()
        # bilinear weights from tents about the centre: float64 rounding, then float32
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-7)
        assert abs(float(psfs[b].double().sum()) - float(got.sum())) < 1e-6  # none outside


def test_a_parameter_past_the_support_is_cropped_and_renormalised() -> None:
    image = torch.zeros(1, 1, 12, 20)
    support = blur._support(blur.LENGTH_BOUND * 12 / 2.0 + 1.0, image)
    psfs = blur.line_psf_batch(torch.tensor([0.9]), torch.tensor([0.0]), 12, support)
    assert psfs.shape[-1] == 2 * support + 1
    assert abs(float(psfs.sum()) - 1.0) < 1e-6
    disks = blur.disk_psf_batch(
        torch.tensor([0.9]), 12, blur._support(blur.RADIUS_BOUND * 12, image)
    )
    assert abs(float(disks.sum()) - 1.0) < 1e-6 and bool((disks > 0).all())


@pytest.mark.parametrize(("h", "w", "k"), [(40, 56, 9), (96, 128, 23), (7, 5, 7), (33, 64, 1)])
def test_fft_correlation_equals_the_direct_sums(h: int, w: int, k: int) -> None:
    gen = torch.Generator().manual_seed(h * w + k)
    x = torch.rand(3, 3, h, w, generator=gen)
    psfs = torch.rand(3, k, k, generator=gen)
    psfs = psfs / psfs.sum((-2, -1), keepdim=True)
    direct = blur.correlate_batch(x, psfs, fft=False)
    fft = blur.correlate_batch(x, psfs, fft=True)
    assert fft.shape == direct.shape
    assert float((fft - direct).abs().max()) < 4e-6


def test_the_cpu_device_keeps_direct_sums() -> None:
    """On the CPU the per-sample sums must not depend on the batch: no FFT there."""
    assert not blur.use_fft(IMAGE, 10**6)
