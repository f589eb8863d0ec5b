"""A record's parameters: ``rng.scalar_rng`` is ``Generator(PCG64(key))`` exactly (the
generator state every recorded draw depends on), and ``engine.as_json`` is
``json.loads(json.dumps(...))``."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb import rng
from perturb.engine import run as engine

EDGE_KEYS = [0, 1, 2, 0xFFFFFFFF, 1 << 32, (1 << 32) + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def _numpy_rng(key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(key))


@pytest.mark.parametrize("key", EDGE_KEYS)
def test_edge_keys_match_numpy(key: int) -> None:
    ours, theirs = rng.scalar_rng(key), _numpy_rng(key)
    assert ours.bit_generator.state == theirs.bit_generator.state
    assert ours.uniform(size=4).tolist() == theirs.uniform(size=4).tolist()


def test_many_keys_match_numpy() -> None:
    draw = random.Random(20261125)
    keys = [draw.getrandbits(64) for _ in range(3000)] + [draw.getrandbits(32) for _ in range(300)]
    for key in keys:
        assert rng.scalar_rng(key).bit_generator.state == _numpy_rng(key).bit_generator.state, key


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_any_64_bit_key_matches_numpy(key: int) -> None:
    ours, theirs = rng.scalar_rng(key), _numpy_rng(key)
    assert ours.bit_generator.state == theirs.bit_generator.state
    assert ours.normal() == theirs.normal()


@pytest.mark.parametrize("key", [1 << 64, (1 << 80) + 3, -1])
def test_keys_outside_64_bits_take_numpys_path(key: int) -> None:
    if key < 0:
        with pytest.raises(ValueError):
            rng.scalar_rng(key)
        return
    assert rng.scalar_rng(key).bit_generator.state == _numpy_rng(key).bit_generator.state


def test_seed_sequence_answers_requests_as_numpy() -> None:
    key = 0x9E3779B97F4A7C15
    seq = rng.scalar_rng(key).bit_generator.seed_seq
    want = np.random.SeedSequence(key)
    assert np.array_equal(seq.generate_state(8), want.generate_state(8))
    assert np.array_equal(seq.generate_state(3, np.uint64), want.generate_state(3, np.uint64))


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=False).map(np.float64),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=6), inner, max_size=4),
    ),
    max_leaves=20,
)


def _same(a: object, b: object) -> bool:
    """Equal, with NaN equal to NaN, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b  # type: ignore[arg-type]
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)  # type: ignore[attr-defined,index]
    return a == b


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_as_json_is_the_json_round_trip(value: object) -> None:
    assert _same(engine.as_json(value), json.loads(json.dumps(value)))


def test_as_json_copies_rather_than_shares() -> None:
    params = {"centres": [[0.1, 0.2]], "k": 3}
    out = engine.as_json(params)
    out["centres"][0][0] = 9.0
    assert params["centres"][0][0] == 0.1


@pytest.mark.parametrize(
    "value",
    [{1: 0.5}, {"a": np.float32(0.5)}, {"a": np.int64(3)}, {"a": {"b": (np.float32(1.0),)}}],
)
def test_as_json_defers_to_json_for_other_types(value: object) -> None:
    try:
        want = json.loads(json.dumps(value))
    except TypeError:
        with pytest.raises(TypeError):
            engine.as_json(value)
        return
    assert _same(engine.as_json(value), want)


@pytest.mark.parametrize("key", [0, 0xFFFFFFFF, (1 << 64) - 1])
def test_generator_spawns_and_shows_its_seed_sequence_as_numpys(key: int) -> None:
    """``Generator.spawn`` and ``bit_generator.seed_seq`` work as on ``Generator(PCG64(key))``:
    the children are NumPy's, a second spawn continues from the first."""
    ours, theirs = rng.scalar_rng(key), _numpy_rng(key)
    for n in (2, 1):
        got, want = ours.spawn(n), theirs.spawn(n)
        assert [g.bit_generator.state for g in got] == [g.bit_generator.state for g in want]
    assert ours.bit_generator.seed_seq.entropy == theirs.bit_generator.seed_seq.entropy == key
    assert ours.bit_generator.seed_seq.n_children_spawned == 3
