"""Batched keyed fields (perturb.ops.keyed_fields) give each sample the field perturb.rng gives
its key, bit for bit, on the NumPy (CPU) and the torch (CUDA) arithmetic alike; and the noise
kernels' Poisson inversion gives the same counts gathered (CPU) or masked (CUDA)."""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb import rng
from perturb.ops import keyed_fields, noise
from perturb.ops.backend import use_backend
from perturb.ops.noise import POISSON_EXACT_BELOW, poisson_counts
from tests.dispatch_counts import counting

KEYS = [rng.derive_key(3, f"img-{i}", "op", 0, v) for i, v in enumerate((0, 1, 2, 5))] + [
    0,
    1,
    2**64 - 1,
    0xDEADBEEFCAFEF00D,
]
SHAPES = [(3, 7, 5), (1, 40, 56), (3, 1, 1), (2, 3), (1,)]


@pytest.mark.parametrize("host", [None, False], ids=["numpy", "torch-arithmetic"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_batched_fields_equal_the_per_sample_fields(
    shape: tuple[int, ...], host: bool | None
) -> None:
    """NumPy's arithmetic (a CPU device) and torch's (forced here on the CPU: what CUDA runs)."""
    uniform = keyed_fields.uniform_fields(KEYS, "stream/u", shape, host=host)
    normal = keyed_fields.normal_fields(KEYS, "stream/z", shape, host=host)
    assert uniform.shape == normal.shape == (len(KEYS), *shape)
    assert uniform.dtype == normal.dtype == torch.float32
    for b, key in enumerate(KEYS):
        assert torch.equal(uniform[b], rng.uniform_field(key, "stream/u", shape))
        assert torch.equal(normal[b], rng.normal_field(key, "stream/z", shape))


@pytest.mark.parametrize("n", [1, 2, 97, 4096])
def test_torch_hash_equals_the_numpy_hash(n: int) -> None:
    """The int64 torch arithmetic (what CUDA runs), evaluated on the CPU, gives the bits of the
    NumPy uint32 arithmetic and of perturb.rng."""
    on_torch = keyed_fields.hash_bits_batch(KEYS, "stream/h", n, host=False)
    batched = keyed_fields.hash_bits_batch(KEYS, "stream/h", n)
    assert torch.equal(on_torch, batched)
    for b, key in enumerate(KEYS):
        assert torch.equal(batched[b], rng.hash_bits(key, "stream/h", n))
        # perturb.rng's own device formula (what its per-sample fields run on CUDA)
        k = rng.sub_key(key, "stream/h")
        counter = torch.arange(n, dtype=torch.int64)
        assert torch.equal(batched[b], rng.mix_torch(counter, k & 0xFFFFFFFF, k >> 32))
    assert int(on_torch.min()) >= 0 and int(on_torch.max()) < 2**32


def test_field_of_a_sample_does_not_depend_on_the_batch() -> None:
    alone = keyed_fields.normal_fields(KEYS[2:3], "s", (3, 9, 11))
    shuffled = keyed_fields.normal_fields([KEYS[5], KEYS[2], KEYS[0]], "s", (3, 9, 11))
    assert torch.equal(alone[0], shuffled[1])
    assert not torch.equal(shuffled[0], shuffled[1])


def test_poisson_counts_gathered_and_masked_agree() -> None:
    gen = torch.Generator().manual_seed(4)
    mean = torch.rand(3, 3, 17, 19, generator=gen) * (3 * POISSON_EXACT_BELOW)
    mean[0, 0, :4] = 0.0
    z = keyed_fields.normal_fields(KEYS[:3], "z", (3, 17, 19))
    u = keyed_fields.uniform_fields(KEYS[:3], "u", (3, 17, 19))
    gathered = poisson_counts(mean, z, u, compact=True)
    masked = poisson_counts(mean, z, u, compact=False)
    assert torch.equal(gathered, masked)
    small = mean < POISSON_EXACT_BELOW
    assert bool(small.any()) and bool((~small).any())
    assert torch.equal(
        gathered[~small], torch.floor(mean + mean.sqrt() * z + 0.5)[~small].clamp_min(0)
    )
    # the exact inversion's counts: a sample of them against a scalar walk of the CDF
    lam, uu = mean[small].double().numpy(), u[small].double().numpy()
    for i in range(0, lam.size, max(1, lam.size // 25)):
        term = cdf = float(torch.exp(torch.tensor(-lam[i], dtype=torch.float64)))
        count = 0
        for k in range(1, 49):
            count += uu[i] > cdf
            term = term * lam[i] / k
            cdf += term
        assert gathered[small][i].item() == count


@pytest.mark.parametrize("op", ["gaussian_noise", "speckle_noise", "shot_noise", "impulse_noise"])
def test_noise_on_the_grain_grid_is_one_batched_computation(op: str) -> None:
    """A frame above the grain grid (perturb.ops.grain) takes the grid's down/up sampling: still
    the same aten calls for 1 and 4 samples, and no host round trip."""
    found = {}
    for b in (1, 4):
        x = torch.rand(b, 3, 460, 500, generator=torch.Generator().manual_seed(b))
        keys = [f"grain-{i}" for i in range(b)]
        with use_backend("torch"):
            perturb.apply(x, op, 3, keys, protect_border=False)  # warm: lazy tables
            with counting() as calls:
                perturb.apply(x, op, 3, keys, protect_border=False)
        found[b] = (calls.aten_calls, calls.host_calls)
    assert found[1] == found[4] and found[1][1] == 0, found


@pytest.mark.parametrize("op", ["gaussian_noise", "speckle_noise", "shot_noise", "impulse_noise"])
def test_noise_kernels_give_the_same_pixels_with_cudas_arithmetic(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels with their fields from torch's arithmetic and the Poisson inversion masked
    (what a CUDA device runs), evaluated on the CPU: the same pixels as the CPU's torch path."""
    x = torch.rand(3, 3, 24, 40, generator=torch.Generator().manual_seed(2))
    keys = [f"cuda-{i}" for i in range(3)]
    with use_backend("torch"):
        expected, _ = perturb.apply(x, op, 5, keys, protect_border=False)
        monkeypatch.setattr(keyed_fields, "_on_host", lambda device, host: False)
        original = noise.poisson_counts
        monkeypatch.setattr(
            noise, "poisson_counts", lambda m, z, u: original(m, z, u, compact=False)
        )
        got, _ = perturb.apply(x, op, 5, keys, protect_border=False)
    assert torch.equal(got, expected)
