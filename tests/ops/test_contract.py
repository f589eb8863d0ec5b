"""The kernel contract, run over every registered op.

A new op is covered automatically; ``test_every_op_has_a_reference_check`` additionally makes
its author name the independent reference/physics test of the op in tests/ops/test_references.py.
The same contract on the bare kernels (no engine) is tests/ops/test_kernels.py; the gradients
of the ops declared differentiable are checked in tests/ops/test_gradcheck.py.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from threadpoolctl import threadpool_limits

import perturb
from perturb.catalog.ops import all_ops, get_op
from perturb.contracts.record import Record
from perturb.errors import InputError
from perturb.ops.backend import use_backend
from tests.helpers import small_batch
from tests.ops.test_references import REFERENCE_CHECKS

OPS = sorted(all_ops())


def _batch_for(op: str, n: int, h: int = 40, w: int = 56) -> torch.Tensor:
    channels = 3 if 3 in get_op(op).spec.channels else 1
    return small_batch(n, h, w, channels)


def _keys(n: int) -> list[str]:
    return [f"sample-{i:03d}" for i in range(n)]


def test_every_op_has_a_reference_check() -> None:
    missing = sorted(set(OPS) - set(REFERENCE_CHECKS))
    assert not missing, f"ops without an entry in tests/ops/test_references.py REFERENCE_CHECKS: {missing}"
    extra = sorted(set(REFERENCE_CHECKS) - set(OPS))
    assert not extra, f"REFERENCE_CHECKS names ops that are not registered: {extra}"
    for op, target in REFERENCE_CHECKS.items():
        module_name, _, function = target.rpartition("::")
        module = importlib.import_module(module_name or "tests.ops.test_references")
        assert callable(getattr(module, function, None)), f"{op}: reference test {target} does not exist"


@pytest.mark.parametrize("op", OPS)
def test_shape_dtype_device_range_and_no_mutation(op: str, device: str) -> None:
    x = _batch_for(op, 4).to(device)
    before = x.clone()
    for severity in (1, 3, 5):
        out, records = perturb.apply(x, op, severity, _keys(4), seed=7)
        assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
        assert torch.isfinite(out).all()
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert torch.equal(x, before), "the kernel mutated its input"
        assert len(records) == 4 and all(r.severity == severity for r in records)
        if severity == 5:  # at 40x56 pixels a severity-1 PSF can be below a pixel
            assert not torch.equal(out, x), "the op changed nothing"


@pytest.mark.parametrize("op", OPS)
def test_sample_output_independent_of_batch_size_order_and_position(op: str) -> None:
    n = 64
    x = _batch_for(op, n)
    keys = _keys(n)
    full, _ = perturb.apply(x, op, 4, keys, seed=3)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    shuffled, _ = perturb.apply(x[perm], op, 4, [keys[i] for i in perm.tolist()], seed=3)
    assert torch.equal(shuffled, full[perm])
    for size in (1, 7):
        idx = perm[:size]
        part, _ = perturb.apply(x[idx], op, 4, [keys[i] for i in idx.tolist()], seed=3)
        assert torch.equal(part, full[idx]), f"batch of {size} differs from the batch of {n}"


@pytest.mark.parametrize("op", OPS)
def test_independent_of_thread_count(op: str) -> None:
    x = _batch_for(op, 3, 64, 80)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = perturb.apply(x, op, 5, _keys(3))
        torch.set_num_threads(max(2, threads))
        many, _ = perturb.apply(x, op, 5, _keys(3))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


@pytest.mark.parametrize("op", OPS)
def test_independent_of_blas_thread_count(op: str) -> None:
    """The host path's bits do not depend on how many threads NumPy's BLAS runs (a float32
    product sums in an order set by its kernel and thread count: the grain field gave other
    bytes with one OpenBLAS thread than with two). A frame larger than the grain grid, so its
    products are large enough for the BLAS to split them."""
    x = _batch_for(op, 2, 240, 304)
    with threadpool_limits(limits=1, user_api="blas"):
        one, _ = perturb.apply(x, op, 5, _keys(2))
    with threadpool_limits(limits=4, user_api="blas"):
        many, _ = perturb.apply(x, op, 5, _keys(2))
    assert torch.equal(one, many)


@pytest.mark.parametrize("op", OPS)
def test_replay_from_json_is_bit_identical(op: str, device: str) -> None:
    x = _batch_for(op, 3).to(device)
    out, records = perturb.apply(x, op, 2, _keys(3), seed=11, variant=4)
    restored = [Record.from_json(json.dumps(json.loads(r.to_json()))) for r in records]
    assert torch.equal(perturb.replay(restored, x), out)
    assert torch.equal(perturb.replay(records[1], x[1]), out[1])


@pytest.mark.parametrize("op", OPS)
def test_keyed_by_seed_key_and_variant(op: str) -> None:
    x = _batch_for(op, 1)
    base, rec = perturb.apply(x, op, 3, ["a"], seed=0, variant=0)
    again, rec2 = perturb.apply(x, op, 3, ["a"], seed=0, variant=0)
    assert torch.equal(base, again) and rec[0].params == rec2[0].params
    others = [
        perturb.apply(x, op, 3, ["b"], seed=0)[1][0],
        perturb.apply(x, op, 3, ["a"], seed=1)[1][0],
        perturb.apply(x, op, 3, ["a"], seed=0, variant=1)[1][0],
    ]
    for other in others:
        assert other.key != rec[0].key


@pytest.mark.parametrize("op", OPS)
def test_torch_path_matches_opencv_path(op: str) -> None:
    """The torch path (what runs on CUDA) agrees with the CPU path within 1/255."""
    x = _batch_for(op, 4, 72, 96)
    cpu, records = perturb.apply(x, op, 5, _keys(4))
    with use_backend("torch"):
        torch_path = perturb.replay(records, x)
    assert float((cpu - torch_path).abs().max()) <= 1.0 / 255.0 + 1e-6


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("op", OPS)
def test_cuda_matches_cpu(op: str) -> None:
    x = _batch_for(op, 4, 72, 96)
    cpu, cpu_records = perturb.apply(x, op, 5, _keys(4))
    cuda, cuda_records = perturb.apply(x.cuda(), op, 5, _keys(4))
    assert [r.params for r in cpu_records] == [r.params for r in cuda_records]
    assert float((cpu - cuda.cpu()).abs().max()) <= 1.0 / 255.0 + 1e-6


@pytest.mark.parametrize("op", OPS)
def test_integer_inputs_keep_their_depth(op: str) -> None:
    x = _batch_for(op, 2)
    u8 = (x * 255).round().to(torch.uint8)
    out8, _ = perturb.apply(u8, op, 3, _keys(2))
    assert out8.dtype == torch.uint8 and out8.shape == u8.shape
    u16 = (x * 65000 + 300).round().to(torch.uint16)  # levels that 8 bits cannot hold
    out16, _ = perturb.apply(u16, op, 5, _keys(2))
    assert out16.dtype == torch.uint16
    reference, _ = perturb.apply(u16.float() / 65535, op, 5, _keys(2))
    if op == "jpeg":  # JPEG is an 8-bit codec: its output has 8-bit levels by nature
        assert bool(((out16.to(torch.int32) % 257) == 0).all())
    else:
        assert torch.equal(out16, (reference * 65535).round().to(torch.uint16)), "16 bits not kept"


@pytest.mark.parametrize("op", OPS)
def test_bad_inputs_raise_errors_that_name_the_fix(op: str) -> None:
    x = _batch_for(op, 2)
    keys = _keys(2)
    cases: list[tuple[object, str]] = [
        (x[:0], "empty batch"),
        (x[0], "unsqueeze"),
        (x.double(), "float32"),
        (x * 2.0 + 0.5, "scale"),
        (torch.where(torch.rand_like(x) > 0.5, torch.full_like(x, float("nan")), x), "NaN"),
        (x.numpy(), "torch.Tensor"),
        (torch.cat([x, x[:, :1]], 1), "alpha"),
    ]
    for bad, hint in cases:
        with pytest.raises(InputError, match=hint):
            perturb.apply(bad, op, 1, keys)  # type: ignore[arg-type]
    for bad_severity in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match="severity must be an integer from 1 to 5"):
            perturb.apply(x, op, bad_severity, keys)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="one stable id per image"):
        perturb.apply(x, op, 1, ["only-one"])
    other = 1 if 3 in get_op(op).spec.channels and 1 not in get_op(op).spec.channels else None
    if other == 1:
        with pytest.raises(InputError, match="3-channel"):
            perturb.apply(x[:, :1], op, 1, keys)


def test_unknown_op_lists_the_valid_ones() -> None:
    x = small_batch(1)
    with pytest.raises(KeyError, match=r"did you mean gaussian_blur.*valid: .*gaussian_blur"):
        perturb.apply(x, "gausian_blur", 1, ["a"])
