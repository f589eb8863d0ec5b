"""One op at explicit parameters for the benchmark rows whose case fixes a setting (e.g. blur
length, JPEG quality): the same steps as ``perturb.apply`` (validation, keyed records,
``run_records``), with the case's overrides on top of the keyed draws."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

import perturb
from perturb.catalog.ops import get_op
from perturb.engine import run as engine


def apply_with_overrides(
    x: torch.Tensor,
    name: str,
    severity: int,
    overrides: dict[str, Any],
    keys: Sequence[str],
    protect_border: bool,
    sync: Callable[[], None] = lambda: None,
) -> Callable[[], Any]:
    """A call that perturbs ``x`` with ``name`` at ``severity`` and ``overrides`` and returns
    (images, records); ``sync`` runs after the op (e.g. a CUDA synchronize)."""
    op = get_op(name)
    sampled = [r.params for r in perturb.apply(x, name, severity, keys)[1]]
    params = [{**p, **overrides} for p in sampled]

    def run() -> Any:
        engine.check_images(x, op)
        records = [
            engine.make_record(
                op,
                severity,
                key,
                seed=0,
                variant=0,
                protect_border=protect_border,
                device=x.device,
                params=p,
            )
            for key, p in zip(keys, params, strict=True)
        ]
        out = engine.run_records(x, records)
        sync()
        return out, records

    return run
