"""The exact sums (``perturb.ops.exact``): any summation order gives the same bits, a sample's
result does not depend on its batch, and the values agree with plain float products. A BLAS's
or a GPU's matrix product sums in an order chosen from the operands' shapes; here a product that
chooses its order from the batch's size stands in for it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perturb.ops import exact
from tests.ops.test_kernels import OPS, _inputs, _torch_kernel


def _shape_ordered_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` summed over K in chunks whose size and order follow the operands' total size
    (as a GPU picks its split of the reduction from the shapes), in float64."""
    k = a.shape[-1]
    parts = 2 + (a.numel() + b.numel()) % 3  # 2-4 partial sums, by the operands' sizes
    chunk = max(1, -(-k // parts))
    starts = list(range(0, k, chunk))
    if (a.numel() // max(1, k)) % 2:
        starts.reverse()
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    total = torch.zeros((*lead, a.shape[-2], b.shape[-1]), dtype=torch.float64)
    for s in starts:
        total = total + torch.matmul(a[..., s : s + chunk], b[..., s : s + chunk, :])
    return total


@pytest.fixture
def gpu_like(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The exact arithmetic with a product whose order of sums changes with the batch."""
    monkeypatch.setattr(exact, "_MATMUL", _shape_ordered_matmul)
    yield


def _matrix(rng: np.random.Generator, n_out: int, n_in: int) -> torch.Tensor:
    m = rng.normal(size=(n_out, n_in)) * np.exp(rng.uniform(-8, 2, size=(n_out, 1)))
    return torch.from_numpy(m.astype(np.float32))


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    b=st.integers(2, 5),
    h=st.integers(2, 40),
    w=st.integers(2, 40),
    log_peak=st.floats(-30, 30),
)
@example(seed=181718, b=2, h=2, w=2, log_peak=0.0)  # a sum that cancels to 6% of its terms
def test_a_sample_alone_and_in_any_batch_gives_the_same_bits(
    seed: int, b: int, h: int, w: int, log_peak: float
) -> None:
    rng = np.random.default_rng(seed)
    rows, cols = _matrix(rng, h + 3, h), _matrix(rng, w + 1, w)
    x = torch.from_numpy(rng.normal(size=(b, 2, h, w)).astype(np.float32))
    x[0] *= float(np.exp(log_peak))  # another sample of another magnitude shares the batch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exact, "_MATMUL", _shape_ordered_matmul)
        batch = exact.separable(rows, x, cols)
        for i in range(b):
            alone = exact.separable(rows, x[i : i + 1], cols)
            assert torch.equal(alone[0], batch[i])
        flipped = exact.separable(rows, x.flip(0), cols).flip(0)
    assert torch.equal(flipped, batch)
    reference = torch.matmul(torch.matmul(rows.double(), x.double()), cols.double().T)
    # the rounding of a sum is bounded by its terms' magnitudes, not by the sum (which may cancel
    # to far below them: seed 181718, b=h=w=2 gave a peak of 0.06 from terms near 1)
    terms = torch.matmul(torch.matmul(rows.double().abs(), x.double().abs()), cols.double().abs().T)
    peak = terms.amax(dim=(1, 2, 3), keepdim=True).clamp(min=1e-30)
    # each sample to float32's precision of its own largest terms (two roundings of 2**-24)
    assert float(((batch.double() - reference).abs() / peak).max()) < 2e-6


def test_plain_arithmetic_is_the_float_product_and_a_differentiable_call_takes_it() -> None:
    rng = np.random.default_rng(3)
    rows, cols = _matrix(rng, 9, 7).double(), _matrix(rng, 5, 6).double()
    x = torch.rand(3, 7, 6, dtype=torch.float64)
    plain = torch.matmul(torch.matmul(rows, x), cols.T)
    assert exact.is_exact(x)
    with exact.plain_arithmetic():
        assert not exact.is_exact(x)
        assert torch.equal(exact.separable(rows, x, cols), plain)
    assert not torch.equal(exact.separable(rows, x, cols), plain)  # rounded to 2**-24 steps
    x.requires_grad_(True)
    out = exact.separable(rows, x, cols)
    assert torch.equal(out, torch.matmul(torch.matmul(rows, x), cols.T))
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.allclose(grad, (rows.sum(dim=0)[:, None] * cols.sum(dim=0)[None, :]).expand(3, 7, 6))


def test_scatter_sums_do_not_depend_on_the_order_of_the_sources() -> None:
    rng = np.random.default_rng(4)
    n, slots = 5000, 37
    index = torch.from_numpy(rng.integers(0, slots, size=(2, n)))
    src = torch.from_numpy(rng.normal(size=(2, n)).astype(np.float32))
    perm = torch.from_numpy(rng.permutation(n))
    a = exact.scatter_sum_(torch.zeros(2, slots), 1, index, src, 8.0)
    b = exact.scatter_sum_(torch.zeros(2, slots), 1, index[:, perm], src[:, perm], 8.0)
    assert torch.equal(a, b)
    plain = torch.zeros(2, slots).scatter_add_(1, index, src)
    assert float((a - plain).abs().max()) < 1e-4


@pytest.mark.parametrize("op", OPS)
def test_every_kernel_is_batch_invariant_with_a_batch_ordered_product(op: str, gpu_like: None) -> None:
    """Each registered kernel: sample i alone and in the batch give the same bits though the
    product sums in a batch-dependent order, and the result stays within 1/255 of plain float
    arithmetic's."""
    del gpu_like
    x, params, keys = _inputs(op)
    run = _torch_kernel(op, "torch")
    out = run(x, params, keys)
    for i in range(x.shape[0]):
        alone = run(x[i : i + 1], {k: v[i : i + 1] for k, v in params.items()}, keys[i : i + 1])
        assert torch.equal(alone[0], out[i]), f"sample {i} depends on the other samples"
    with exact.plain_arithmetic():
        cpu = run(x, params, keys)
    assert out.dtype == cpu.dtype
    assert float((out.float() - cpu.float()).abs().max()) <= 1.0 / 255.0


def test_fft_sums_round_to_their_exact_integers() -> None:
    """The FFT correlation's float64 sums of integers lie far closer to their integers than one
    half (so rounding recovers them whatever the FFT's order), and the result is the plain
    correlation to float32 precision."""
    import kornia

    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.uniform(0.02, 1.0, size=(2, 1, 300, 257)))
    psf = torch.from_numpy(rng.uniform(0, 1, size=(2, 41, 41)))
    psf = psf / psf.sum(dim=(1, 2), keepdim=True)
    seen: list[torch.Tensor] = []

    def correlate(v: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        out = kornia.filters.fft_conv(v, k, border_type="reflect")
        seen.append(out)
        return out

    result = exact.fft_correlate(x, psf, correlate)
    raw = seen[0]
    assert float((raw - torch.round(raw)).abs().max()) < 0.05
    plain = kornia.filters.fft_conv(x, psf, border_type="reflect")
    assert float((result - plain).abs().max()) < 2e-5  # the weights on 2**-22 steps
    alone = exact.fft_correlate(x[1:], psf[1:], correlate)
    assert torch.equal(alone[0], result[1])


@pytest.mark.parametrize("n_in, n_out", [(529, 448), (1348, 565), (100, 448), (61, 23)])
def test_a_banded_matrix_summed_as_a_band_gives_the_dense_products_bits(
    n_in: int, n_out: int, gpu_like: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resampling matrix (area down, bicubic up: each row's weights within a few columns)
    takes the banded sums (``_band``), which must give every bit of the dense product, zeros'
    signs included, along rows and along columns."""
    del gpu_like
    from perturb.ops.grain import area_matrix, cubic_matrix

    m = area_matrix(n_in, n_out) if n_out < n_in else cubic_matrix(n_in, n_out)
    matrix = torch.from_numpy(np.array(m, dtype=np.float32))
    rng = np.random.default_rng(n_in)
    x = torch.from_numpy(rng.normal(size=(2, 3, n_in, 29)).astype(np.float32))
    x[0] *= 1e-6  # a sample of another magnitude
    x[1, 0, :7] = -0.0  # all-zero sums: +0 from both
    weights, _ = exact._integer_weights(matrix, x.device)
    monkeypatch.setattr(exact, "BAND_MIN_IN", 0)  # short rows too: the bits, not the speed rule
    assert exact._band(weights) is not None, "the resampling matrix should take the band"
    along_rows = exact.rows_product(matrix, x)
    along_cols = exact.cols_product(x.transpose(-1, -2).contiguous(), matrix.T)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exact, "_band", lambda _m: None)
        dense_rows = exact.rows_product(matrix, x)
        dense_cols = exact.cols_product(x.transpose(-1, -2).contiguous(), matrix.T)
    for got, want in ((along_rows, dense_rows), (along_cols, dense_cols)):
        assert torch.equal(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_a_dense_matrix_does_not_take_the_band() -> None:
    rng = np.random.default_rng(6)
    weights, _ = exact._integer_weights(_matrix(rng, 12, 40), torch.device("cpu"))
    assert exact._band(weights) is None


def test_a_short_resampling_matrix_keeps_the_dense_product() -> None:
    """Rows shorter than BAND_MIN_IN (a 128 px frame's grain matrix) take the dense product, which
    is the cheaper of the two there; the long rows of a full-size frame take the band."""
    from perturb.ops.grain import area_matrix, cubic_matrix

    short = torch.from_numpy(np.array(cubic_matrix(128, 448), dtype=np.float32))
    long = torch.from_numpy(np.array(area_matrix(1070, 448), dtype=np.float32))
    short_w, _ = exact._integer_weights(short, torch.device("cpu"))
    long_w, _ = exact._integer_weights(long, torch.device("cpu"))
    assert exact._band(short_w) is None
    assert exact._band(long_w) is not None
