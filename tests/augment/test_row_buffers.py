"""``engine.run_records_into`` and ``apply_plans``' two batch buffers: writing each sample's
result into its row of another batch gives the bytes of running its rows as a batch of their
own, on the CPU path (rows read and written in place) and on the torch path (gathered and put
back); the other rows and the input are left as they are."""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb.augment import Augment
from perturb.augment.plan import apply_plans
from perturb.engine import run as engine
from perturb.ops.backend import use_backend

ROWS = [4, 0, 2]
OPS = ["brightness", "rotation", "contrast", "lens_distortion", "translation"]


def _batch(dtype: torch.dtype) -> torch.Tensor:
    x = torch.rand(6, 3, 40, 56, generator=torch.Generator().manual_seed(11))
    if dtype == torch.uint8:
        return (x * 255).round().to(torch.uint8)
    return x


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("op", OPS)
def test_rows_into_another_batch_match_a_batch_of_those_rows(
    op: str, dtype: torch.dtype, backend: str
) -> None:
    x = _batch(dtype)
    rows_batch = x[ROWS].clone()
    with use_backend(backend):  # type: ignore[arg-type]
        want, records = perturb.apply(rows_batch, op, 3, [f"s{i}" for i in ROWS], seed=5)
        dst = torch.full_like(x, 7 if dtype == torch.uint8 else 0.25)
        before = x.clone()
        engine.run_records_into(x, dst, ROWS, records)
    assert torch.equal(x, before)
    assert torch.equal(dst[ROWS], want)
    untouched = [i for i in range(x.shape[0]) if i not in ROWS]
    assert bool((dst[untouched] == (7 if dtype == torch.uint8 else 0.25)).all())


def test_rows_into_the_same_batch_are_refused() -> None:
    x = _batch(torch.uint8)
    _, records = perturb.apply(x[:2], "brightness", 2, ["a", "b"])
    with pytest.raises(ValueError, match="share memory"):
        engine.run_records_into(x, x, [0, 1], records)


def test_apply_plans_leaves_the_input_and_returns_it_when_nothing_runs() -> None:
    x = _batch(torch.uint8)
    before = x.clone()
    augment = Augment("augment-endoscopy", seed=1)
    plans = augment.plan(list(range(6)), channels=3)
    out = apply_plans(x, plans)
    assert torch.equal(x, before)
    assert out is not x
    assert apply_plans(x, [[] for _ in range(6)]) is x


def test_chains_of_different_lengths_match_their_replay() -> None:
    x = _batch(torch.uint8)
    augment = Augment("augment-endoscopy", seed=2, return_records=True)
    result = augment(x, list(range(6)))
    assert not isinstance(result, torch.Tensor)
    lengths = {len(chain) for chain in result.records or []}
    assert len(lengths) > 1, "the draw should mix chain lengths"
    for i, chain in enumerate(result.records or []):
        again = perturb.replay(chain, x[i]) if chain else x[i]
        assert torch.equal(again, result.images[i]), i
