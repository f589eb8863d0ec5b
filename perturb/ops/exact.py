"""Batch-invariant sums: linear maps along an axis, scatter sums and FFT correlations whose
result for a sample does not depend on the other samples of its batch, nor on the run, nor on
the machine's BLAS/FFT library.

Why: a matrix product picks its kernel, tiling and split of the reduction from the operands'
shapes, so the same row of a (B*C*H, n) @ (n, W) product is summed in another order when B
changes, and float sums in another order round differently. On an H200 (cuBLAS) the noise, fog,
smoke, fluid, glare and optics ops gave sample i of a batch of 4 other bits than sample i alone
(``benchmarks/results/gpu/tests-cuda-run2.txt``); on an AMD EPYC CPU (MKL) so did small float32
products (value noise's coarse grids), every float64 product, oneDNN's convolution and some FFT
sizes, which the Intel CPU of earlier runs had not shown. A float scatter-add on a GPU adds with
atomics in whatever order the threads arrive, so the same call gives other bits run to run.

How: every sum is made exact, so its order cannot matter. Each sample's values are rounded to
integers on a power-of-two scale of its own (``VALUE_BITS`` bits below its largest magnitude,
the precision of float32) and the matrix's weights to integers on one fixed power-of-two scale
chosen from the matrix alone, such that every partial sum of integer products stays below 2**53:
float64 represents each of them exactly, so every order of the additions, any kernel, any split,
gives the same float64 integer; scaling back by powers of two is exact too. A sample's scale is
its own maximum (``amax``: order-free), never the batch's. Scatter sums do the same in int64;
FFT correlations round their sums to the integers they must be (``fft_correlate``).

Where: on every device, the CPU included, except where autograd records the call (a rounded
sum has no gradient): there the plain float arithmetic runs, within float rounding of the exact
values. ``plain_arithmetic()`` switches to plain float products (for the tests).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

VALUE_BITS = 24  # each sample's values keep 24 bits below its largest magnitude (float32's)
_EXACT_BITS = 52  # every partial sum stays below 2**52: float64 integers are exact below 2**53
SCATTER_BITS = 32  # scatter sums: values on a 2**-32 grid, int64 accumulators

# the float64 product of the integer operands: any order of its sums gives the same bits (the
# tests put a product that orders its sums by the batch's size here to show it)
_MATMUL = torch.matmul

_PLAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("perturb_plain_sums", default=False)


@contextmanager
def plain_arithmetic() -> Iterator[None]:
    """Within the block, plain float products and scatter-adds (for tests)."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def is_exact(x: torch.Tensor) -> bool:
    """Whether sums over ``x`` take the exact arithmetic (everywhere but in ``plain_arithmetic``)."""
    del x
    return not _PLAIN.get()


def _needs_gradient(*inputs: torch.Tensor) -> bool:
    """Whether autograd records this call: then the plain float arithmetic runs (the exact one
    rounds, which has no gradient and steps under a finite difference), its values within float
    rounding of the exact ones."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


def _sample_scale(x: torch.Tensor) -> torch.Tensor:
    """float64 power of two per sample (leading dim; one for a 2-D tensor), shaped to broadcast
    over ``x``: each sample's largest magnitude divided by it is below 2**VALUE_BITS."""
    lead = x.shape[0] if x.dim() >= 3 else 1
    peak = x.detach().abs().reshape(lead, -1).amax(dim=1).to(torch.float64)
    _mantissa, exponent = torch.frexp(peak)  # peak < 2**exponent (0 for a zero sample)
    scale = torch.ldexp(torch.ones_like(peak), exponent - VALUE_BITS)
    return scale.view(lead, *([1] * (x.dim() - 1))) if x.dim() >= 3 else scale.view(())


def _integer_weights(matrix: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, float]:
    """The matrix's weights as float64 integers on a power-of-two scale 2**bits chosen so that
    any row's sum of |weight| * 2**VALUE_BITS stays below 2**_EXACT_BITS; and 2**-bits."""
    m = matrix.detach().to(device=device, dtype=torch.float64)
    row_l1 = float(m.abs().sum(dim=-1).max()) if m.numel() else 0.0
    # the rounded weights' sum per row grows by at most half a unit per entry
    room = _EXACT_BITS - VALUE_BITS - 1
    bits = room - max(0, math.ceil(math.log2(row_l1 + 1e-300))) if row_l1 > 0 else room
    bits = min(bits, room)
    assert m.shape[-1] < 2 ** (room - 1), "an axis too long for exact sums"
    return torch.round(torch.ldexp(m, torch.tensor(bits, device=device))), 2.0**-bits


def _exact_product(left: torch.Tensor, right: torch.Tensor, matrix_on_left: bool) -> torch.Tensor:
    """``left @ right`` where the non-matrix operand holds the samples: exact float64 sums of
    integers, returned as float64 values (the product to ~2**-VALUE_BITS of each sample's peak)."""
    data = right if matrix_on_left else left
    weights, unit = _integer_weights(left if matrix_on_left else right, data.device)
    scale = _sample_scale(data)
    values = torch.round(data.to(torch.float64) / scale)  # exact division by a power of two
    band = _band(weights if matrix_on_left else weights.T)
    if band is not None:
        sums = _banded_sums(values, *band, dim=-2 if matrix_on_left else -1)
    else:
        sums = _MATMUL(weights, values) if matrix_on_left else _MATMUL(values, weights)
    return sums * (scale * unit)


BAND_SHARE = 8  # a matrix whose rows' nonzero spans are at most 1/8 of a row is summed as a band
# ... and has at least this many columns: K passes over the output beat a dense product only when
# its rows are long (gaussian_noise on the CPU, one thread: at a 128 px frame, n_in 128, the dense
# product took half the band's CPU; at 1070x1348, n_in 1070-1348, the band about 0.8 of it)
BAND_MIN_IN = 256


def _band(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first column (n_out,), weights (n_out, K)) of the window of K columns that holds every
    nonzero weight of each row of an integer (n_out, n_in) matrix, where K * BAND_SHARE <= n_in
    (a resampling matrix: area, bicubic) and the window's sums stay exact; else None."""
    n_out, n_in = matrix.shape
    if n_out == 0 or n_in < max(BAND_SHARE, BAND_MIN_IN):
        return None
    nonzero = (matrix != 0).to(torch.int8)
    first = nonzero.argmax(dim=1)  # the first maximum: the first nonzero (0 for an empty row)
    last = n_in - 1 - nonzero.flip(1).argmax(dim=1)
    last = torch.where(nonzero.any(dim=1), last, first)
    k = int((last - first).max()) + 1
    if k * BAND_SHARE > n_in:
        return None
    start = first.clamp(max=n_in - k)
    taps = matrix.gather(1, start.view(n_out, 1) + torch.arange(k, device=matrix.device).view(1, k))
    if float(taps.abs().sum(dim=1).max()) * 2.0**VALUE_BITS >= 2.0**_EXACT_BITS:
        return None
    return start, taps


def _banded_sums(values: torch.Tensor, start: torch.Tensor, taps: torch.Tensor, dim: int) -> torch.Tensor:
    """The product of the banded matrix (``_band``) with integer ``values`` along ``dim`` (-2: the
    matrix on the left; -1: its transpose on the right), K multiply-adds of whole slices instead
    of the dense product's n_in: every sum an exact float64 integer (``_band`` checks the
    bound), so the same bits as ``_MATMUL``'s, from +0 as a BLAS's accumulators start."""
    if dim == -1:  # whole rows are cheaper to select than columns: along the transpose
        return _banded_sums(values.transpose(-1, -2).contiguous(), start, taps, -2).transpose(-1, -2).contiguous()
    n_out, k = taps.shape
    shape = list(values.shape)
    shape[-2] = n_out
    sums = torch.zeros(shape, dtype=torch.float64, device=values.device)
    for t in range(k):
        sums.add_(taps[:, t].reshape(n_out, 1) * values.index_select(-2, start + t))
    return sums


def rows_product(matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``matrix @ x`` for a fixed (n_out, n_in) matrix and samples x (B, ..., n_in, W): the
    linear map along x's rows, in the dtype ``torch.matmul`` would give."""
    if not is_exact(x) or _needs_gradient(matrix, x):
        return torch.matmul(matrix, x)
    dtype = torch.promote_types(matrix.dtype, x.dtype)
    return _exact_product(matrix, x, matrix_on_left=True).to(dtype)


def cols_product(x: torch.Tensor, matrix_t: torch.Tensor) -> torch.Tensor:
    """``x @ matrix_t`` for samples x (B, ..., H, n_in) and a fixed (n_in, n_out) matrix: the
    linear map along x's columns, in the dtype ``torch.matmul`` would give."""
    if not is_exact(x) or _needs_gradient(matrix_t, x):
        return torch.matmul(x, matrix_t)
    dtype = torch.promote_types(matrix_t.dtype, x.dtype)
    return _exact_product(x, matrix_t, matrix_on_left=False).to(dtype)


def separable(rows: torch.Tensor, x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``rows @ x @ cols.T``: a separable linear map of every (H, W) plane of x (B, ..., H, W)
    by fixed (H_out, H) and (W_out, W) matrices."""
    return cols_product(rows_product(rows, x), cols.T)


def scatter_sum_(
    out: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, bound: float
) -> torch.Tensor:
    """``out.scatter_add_(dim, index, src)`` in place, batch- and run-invariant: ``src`` on a
    fixed 2**-SCATTER_BITS grid summed in int64 (integer additions commute), then added to
    ``out``. ``bound`` bounds |src| (a value outside it is a caller's error)."""
    if not is_exact(out) or _needs_gradient(out, src):
        return out.scatter_add_(dim, index, src)
    assert bound * 2**SCATTER_BITS * max(1, src.shape[dim]) < 2**62, "scatter sum too large"
    grid = float(2**SCATTER_BITS)
    ints = torch.round(src.to(torch.float64) * grid).to(torch.int64)
    total = torch.zeros(out.shape, dtype=torch.int64, device=out.device)
    total.scatter_add_(dim, index, ints)
    return out.add_((total.to(torch.float64) / grid).to(out.dtype))


FFT_VALUE_BITS = 20  # each sample's values on 2**20 steps below its peak for an exact FFT sum
FFT_WEIGHT_BITS = 22  # the kernel's weights (summing to 1) on 2**-22 steps


def fft_correlate(
    x: torch.Tensor, psf: torch.Tensor, correlate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``correlate(x, psf)`` (a linear FFT correlation of every sample with its own kernel
    summing to 1, such as ``kornia.filters.fft_conv``) with an exact result on every device.

    An FFT's sums are not exact and their order follows the batch (its plan, its vectorisation
    across transforms; a CPU's as well as a GPU's). Here both operands are integers: each
    sample's values on 2**FFT_VALUE_BITS steps below its peak, the weights on 2**-FFT_WEIGHT_BITS
    steps. Every true sum is then an integer below 2**42, and float64's FFT error at that size
    (about 2**42 * 2**-52 * log2(n) * a small constant, under 0.01 for any frame) is far under
    one half, so rounding gives the exact integer, whatever order the FFT summed in. The result
    is scaled back and divided by the rounded weights' own sum (their mean kept exactly)."""
    if not is_exact(x) or _needs_gradient(x, psf):
        return correlate(x, psf)
    scale = _sample_scale(x) * 2.0 ** (VALUE_BITS - FFT_VALUE_BITS)
    values = torch.round(x.to(torch.float64) / scale)
    weights = torch.round(torch.ldexp(psf.to(torch.float64), torch.tensor(FFT_WEIGHT_BITS)))
    total = weights.sum(dim=(-2, -1)).view(-1, *([1] * (x.dim() - 1)))  # exact: integers
    sums = torch.round(correlate(values, weights))
    return sums * scale / total
