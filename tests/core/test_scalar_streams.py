"""``rng.scalar_streams``: the streams of a batch of keys, seeded in one NumPy pass, draw the
same numbers as ``rng.scalar_rng`` per key (every record's parameters depend on it), and
``engine.make_records`` makes the records ``engine.make_record`` makes one by one."""

from __future__ import annotations

import random

import pytest
import torch

from perturb import rng
from perturb.catalog.ops import get_op
from perturb.engine import run as engine
from perturb.ops.kernels import kernel_names

EDGE_KEYS = [0, 1, 2, 0xFFFFFFFF, 1 << 32, (1 << 32) + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def _keys() -> list[int]:
    draw = random.Random(20261129)
    return (
        EDGE_KEYS
        + [draw.getrandbits(64) for _ in range(2000)]
        + [draw.getrandbits(32) for _ in range(200)]
    )


def test_random_and_uniform_match_scalar_rng() -> None:
    keys = _keys()
    for key, stream in zip(keys, rng.scalar_streams(keys), strict=True):
        ref = rng.scalar_rng(key)
        ours = [
            stream.random(),
            stream.uniform(0.25, 1.75),
            stream.uniform(-3.0, -3.0),
            stream.random(),
        ]
        theirs = [ref.random(), ref.uniform(0.25, 1.75), ref.uniform(-3.0, -3.0), ref.random()]
        assert ours == theirs, key


def test_other_methods_continue_the_same_sequence() -> None:
    """After draws made natively, ``normal``, ``integers`` and sized draws run on a real
    generator advanced past them; later ``random()`` calls follow that generator."""
    keys = _keys()[:300]
    for key, stream in zip(keys, rng.scalar_streams(keys), strict=True):
        ref = rng.scalar_rng(key)
        ours = [stream.random(), stream.normal(), stream.integers(0, 7), stream.random()]
        ours += [*stream.uniform(0.0, 2.0, size=3).tolist(), stream.uniform(1.0, 2.0)]
        theirs = [ref.random(), ref.normal(), ref.integers(0, 7), ref.random()]
        theirs += [*ref.uniform(0.0, 2.0, size=3).tolist(), ref.uniform(1.0, 2.0)]
        assert ours == theirs, key


def test_streams_do_not_depend_on_the_batch() -> None:
    keys = _keys()[:64]
    alone = [rng.scalar_streams([k])[0].random() for k in keys]
    together = [s.random() for s in rng.scalar_streams(keys)]
    reversed_ = [s.random() for s in rng.scalar_streams(keys[::-1])][::-1]
    assert alone == together == reversed_


@pytest.mark.parametrize("name", sorted(kernel_names()))
def test_make_records_equals_make_record(name: str) -> None:
    op = get_op(name)
    keys = [f"img-{i}" for i in range(10)]
    severities = [1 + i % 5 for i in range(10)]
    variants = [i % 3 for i in range(10)]
    groups = [f"study-{i // 2}" if i % 3 else keys[i] for i in range(10)]
    cpu = torch.device("cpu")
    batch = engine.make_records(
        op,
        severities,
        keys,
        seed=5,
        variants=variants,
        protect_border=True,
        device=cpu,
        param_keys=groups,
    )
    one_by_one = [
        engine.make_record(
            op, s, k, seed=5, variant=v, protect_border=True, device=cpu, param_key=g
        )
        for s, k, v, g in zip(severities, keys, variants, groups, strict=True)
    ]
    assert batch == one_by_one
