"""The per-sample CPU paths of the geometric ops give the same bytes as the batched kernel
path (the one CUDA's grid_sample path is checked against in the contract tests)."""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb import engine
from perturb.ops import backend
from tests.helpers import small_batch


@pytest.mark.parametrize("op", ["rotation", "resized_crop", "translation"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.uint16])
@pytest.mark.parametrize("channels", [1, 3])
def test_fast_path_is_bit_identical_to_the_batched_path(
    op: str, dtype: torch.dtype, channels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = small_batch(6, 45, 61, channels=channels)
    x[:, :, :, :4] = 0.0  # a dark frame edge
    scale = {torch.uint8: 255.0, torch.uint16: 65535.0}.get(dtype)
    if scale is not None:
        x = (x * scale).round().to(dtype)
    assert backend.cpu_path(op, dtype) is not None
    for severity in (1, 5):
        fast, records = perturb.apply(x, op, severity, [f"s{i}" for i in range(6)], seed=severity)
        with monkeypatch.context() as m:
            m.setattr(backend, "cpu_path", lambda name, dtype: None)
            batched = engine.run_records(x, records)
        assert fast.dtype == dtype
        assert torch.equal(fast, batched)
