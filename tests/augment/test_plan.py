"""Keyed plans: pure functions of (policy, seed, epoch, index); outputs independent of the
batch (size, order, composition), replayable bit for bit, strengths interpolating the tables."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import perturb
from perturb.augment import apply_plans, load_policy, plan_batch, plan_sample, sample_key
from perturb.augment.plan import strength_level
from perturb.catalog.ops import get_op
from perturb.catalog.specs import get_spec, op_names
from perturb.contracts.record import Record
from perturb.engine import run as engine
from perturb.errors import InputError
from tests.helpers import small_batch

# Every endoscopy op (noise fields, glare, JPEG, geometry, colour): the widest coverage.
WIDE = load_policy(
    {
        "policy": "wide",
        "ops": op_names("endoscopy"),
        "num_ops": [0, 3],
        "probability": 0.9,
        "strength": [1.0, 4.0],
    }
)
N = 12


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    scale = {torch.uint8: 255.0, torch.uint16: 65535.0}.get(dtype)
    return x if scale is None else (x * scale).round().to(dtype)


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return small_batch(N, 40, 56)


def test_sample_key() -> None:
    assert sample_key(3, 17) == "e3/i17"
    assert sample_key(np.int64(0), torch.tensor(5)) == "e0/i5"  # type: ignore[arg-type]
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(InputError, match="non-negative integer"):
            sample_key(0, bad)  # type: ignore[arg-type]


def test_plan_is_a_pure_function_of_the_key() -> None:
    a = plan_batch(WIDE, seed=7, epoch=2, indices=range(50))
    assert a == plan_batch(WIDE, seed=7, epoch=2, indices=range(50))
    assert a[::-1] == plan_batch(WIDE, seed=7, epoch=2, indices=range(49, -1, -1))
    assert a[10:20] == plan_batch(WIDE, seed=7, epoch=2, indices=torch.arange(10, 20))
    for other in (
        plan_batch(WIDE, seed=8, epoch=2, indices=range(50)),
        plan_batch(WIDE, seed=7, epoch=3, indices=range(50)),
        plan_batch(WIDE, seed=7, epoch=2, indices=range(50), variant=1),
    ):
        assert sum(x != y for x, y in zip(a, other, strict=True)) > 25
    # records carry the engine key of (seed, sample key, op, variant)
    for i, chain in enumerate(a):
        for r in chain:
            assert r.sample_key == sample_key(2, i)
            assert r.key == f"{engine.draw_key(7, r.sample_key, r.op, 0):016x}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.uint16])
def test_output_independent_of_batch_size_order_and_composition(
    batch: torch.Tensor, dtype: torch.dtype
) -> None:
    x = _as(batch, dtype)
    indices = list(range(100, 100 + N))
    plans = plan_batch(WIDE, seed=1, epoch=0, indices=indices)
    assert len({r.op for p in plans for r in p}) >= 8  # the batch mixes many ops
    full = apply_plans(x, plans)
    assert full.dtype == dtype and full.shape == x.shape
    assert not torch.equal(full, x)
    perm = torch.tensor([5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6])
    shuffled = apply_plans(x[perm], [plans[int(i)] for i in perm])
    assert torch.equal(shuffled, full[perm])
    for part in ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11], [3]):
        sub = apply_plans(x[part], [plans[i] for i in part])
        assert torch.equal(sub, full[part])


def test_input_not_modified(batch: torch.Tensor) -> None:
    x = batch.clone()
    plans = plan_batch(WIDE, seed=1, epoch=0, indices=range(N))
    apply_plans(x, plans)
    assert torch.equal(x, batch)
    assert apply_plans(x, [[] for _ in range(N)]) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_replay_of_each_chain_is_bit_exact(batch: torch.Tensor, dtype: torch.dtype) -> None:
    x = _as(batch, dtype)
    plans = plan_batch(WIDE, seed=3, epoch=4, indices=range(N))
    out = apply_plans(x, plans)
    for i, chain in enumerate(plans):
        logged = [Record.from_json(r.to_json()) for r in chain]  # as a training log keeps them
        again = perturb.replay(logged, x[i]) if logged else x[i]
        assert torch.equal(again, out[i]), [r.op for r in chain]


@pytest.mark.parametrize("op", ["gaussian_blur", "contrast", "specular_glare", "jpeg", "rotation"])
@pytest.mark.parametrize("level", [1, 3, 5])
def test_integer_strength_is_that_severity(batch: torch.Tensor, op: str, level: int) -> None:
    """Strength k draws exactly what ``perturb.apply`` draws at severity k for the same key."""
    policy = load_policy({"ops": [op], "strength": float(level)})
    plans = plan_batch(policy, seed=5, epoch=1, indices=range(4))
    keys = [sample_key(1, i) for i in range(4)]
    ref, ref_records = perturb.apply(batch[:4], op, level, keys, seed=5)
    assert [p[0].params for p in plans] == [r.params for r in ref_records]
    assert [p[0].severity for p in plans] == [level] * 4
    assert torch.equal(apply_plans(batch[:4], plans), ref)


@settings(max_examples=40, deadline=None)
@given(strength=st.floats(1.0, 5.0), index=st.integers(0, 10_000))
def test_fractional_strength_interpolates_the_table(strength: float, index: int) -> None:
    """Common random numbers: for one key, a parameter at strength s lies between its values at
    the neighbouring severities, and inside the interpolated ranges."""
    for op in ("gaussian_blur", "overexposure", "jpeg", "underexposure"):
        spec = get_spec(op)
        rec = plan_sample(
            load_policy({"ops": [op], "strength": strength}), seed=0, epoch=0, index=index
        )[0]
        level = strength_level(spec, strength)
        lo_s, hi_s = math.floor(strength), min(math.floor(strength) + 1, 5)
        key = engine.draw_key(0, rec.sample_key, op, 0)
        low = engine.sample_params(get_op(op), key, lo_s)
        high = engine.sample_params(get_op(op), key, hi_s)
        for name, (lo, hi) in level.items():
            v = rec.params[name]
            assert lo - 1e-9 <= v <= hi + 1e-9
            a, b = sorted((low[name], high[name]))
            assert a - 1e-9 <= v <= b + 1e-9
        assert rec.severity == min(5, math.floor(strength + 0.5))
        assert rec.extra["strength"] == strength


def test_choice_frequencies_follow_weights_and_probability() -> None:
    policy = load_policy(
        {
            "ops": {"rotation": 1, "contrast": 2, "brightness": 3},
            "num_ops": 1,
            "probability": 0.4,
            "severity": [2, 4],
        }
    )
    plans = plan_batch(policy, seed=0, epoch=0, indices=range(6000))
    augmented = [p for p in plans if p]
    rate = len(augmented) / len(plans)
    assert abs(rate - 0.4) < 4 * math.sqrt(0.24 / 6000)
    counts = Counter(p[0].op for p in augmented)
    n = len(augmented)
    for op, w in (("rotation", 1), ("contrast", 2), ("brightness", 3)):
        p = w / 6
        assert abs(counts[op] / n - p) < 4 * math.sqrt(p * (1 - p) / n), counts
    sev = Counter(p[0].severity for p in augmented)
    assert set(sev) == {2, 3, 4} and min(sev.values()) > n / 3 - 4 * math.sqrt(n * 2 / 9)


def test_num_ops_range_order_and_no_repeats() -> None:
    policy = load_policy(
        {"ops": ["rotation", "contrast", "brightness", "gamma"], "num_ops": [0, 4]}
    )
    plans = plan_batch(policy, seed=2, epoch=0, indices=range(4000))
    lengths = Counter(len(p) for p in plans)
    assert set(lengths) == {0, 1, 2, 3, 4} and min(lengths.values()) > 650
    assert all(len({r.op for r in p}) == len(p) for p in plans)
    firsts = Counter(p[0].op for p in plans if len(p) == 4)
    assert len(firsts) == 4 and min(firsts.values()) > 120  # random order, not the listed one
    assert all([r.extra["position"] for r in p] == list(range(len(p))) for p in plans)


def test_channels_and_modality_filter_the_draw() -> None:
    policy = load_policy(
        {"ops": ["color_cast", "hue_shift", "contrast", "specular_glare"], "num_ops": 2}
    )
    gray = plan_batch(policy, seed=0, epoch=0, indices=range(300), channels=1)
    assert {r.op for p in gray for r in p} == {"contrast", "specular_glare"}
    xray = plan_batch(policy, seed=0, epoch=0, indices=range(300), modality="xray")
    assert {r.op for p in xray for r in p} == {"contrast"}  # the only one tagged 'any'
    assert all(len(p) == 1 for p in xray)
    with pytest.raises(InputError, match="channels=1"):
        apply_plans(
            small_batch(2, channels=1), plan_batch(policy, seed=0, epoch=0, indices=range(2))
        )


def test_apply_plans_errors(batch: torch.Tensor) -> None:
    with pytest.raises(InputError, match="one plan per image"):
        apply_plans(batch, [[]])
    with pytest.raises(InputError, match="float images must lie in"):
        apply_plans(batch * 2, [[] for _ in range(N)])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 1000),
    index=st.integers(0, 10**9),
    lo=st.integers(0, 3),
    extra=st.integers(0, 2),
    probability=st.floats(0.0, 1.0),
)
def test_plan_properties(
    seed: int, epoch: int, index: int, lo: int, extra: int, probability: float
) -> None:
    hi = min(lo + extra, 5)
    policy = load_policy(
        {
            "ops": ["rotation", "contrast", "gaussian_noise", "jpeg", "gamma"],
            "num_ops": [lo, hi],
            "probability": probability,
            "severity": [2, 4],
        }
    )
    plan = plan_sample(policy, seed=seed, epoch=epoch, index=index)
    assert plan == plan_sample(policy, seed=seed, epoch=epoch, index=index)
    if probability == 0.0:
        assert plan == []
    if plan:
        assert lo <= len(plan) <= hi
    assert len({r.op for r in plan}) == len(plan)
    assert all(2 <= r.severity <= 4 and r.seed == seed for r in plan)


def test_devices_agree(device: str, batch: torch.Tensor) -> None:
    """Plans are host-side and identical for every device; pixels on CUDA are within 1/255 of
    the CPU's (the engine's cross-device contract)."""
    cpu_plans = plan_batch(WIDE, seed=9, epoch=1, indices=range(N))
    plans = plan_batch(WIDE, seed=9, epoch=1, indices=range(N), device=device)
    assert [[(r.op, r.params, r.key) for r in p] for p in plans] == [
        [(r.op, r.params, r.key) for r in p] for p in cpu_plans
    ]
    out = apply_plans(batch.to(device), plans).cpu()
    ref = apply_plans(batch, cpu_plans)
    if device == "cpu":
        assert torch.equal(out, ref)
    else:
        # JPEG codecs differ between devices; compare the other chains
        keep = [i for i, p in enumerate(plans) if all(r.op != "jpeg" for r in p)]
        assert (out[keep] - ref[keep]).abs().max() <= 1 / 255 + 1e-6


def test_integer_strength_is_the_table_level_exactly() -> None:
    """Strength k gives severity k's ranges bit for bit, also at k = 5 where the interpolation
    a + 1.0 * (b - a) misses b by an ulp for some tables (here 0.195 -> 0.737)."""
    from perturb.catalog.specs import ParamTable

    table = ParamTable(
        unit="fraction",
        direction="increasing",
        bounds=(0.0, 1.0),
        levels=[(0.1, 0.15), (0.15, 0.2), (0.18, 0.3), (0.195, 0.4), (0.737, 0.8)],
    )
    assert 0.195 + 1.0 * (0.737 - 0.195) != 0.737  # the case this test is about
    spec = get_spec("gaussian_blur").model_copy(update={"params": {"sigma": table}})
    for severity in range(1, 6):
        assert strength_level(spec, float(severity)) == {"sigma": table.levels[severity - 1]}
