"""The example room's composite ``example_mirror``: per (img_id, variant), a keyed coin decides
a left-right mirror, then a gain from ``gain`` scales the frame (clamped to [0, 1]).

It provides what :class:`perturb.datasets.Composite` asks: ``Params`` for a suite job,
``track_key`` / ``sample_params`` for the keyed draw, ``transformed_array`` (NumPy) and
``apply_transformed`` (torch) giving the same bits, and ``composite_problem`` for replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, model_validator

from perturb import rng as keyed

NAME = "example_mirror"
VERSION = 1
RISK_TAGS = ("moves_geometry", "alters_intensity")
# the catalog op making the same kind of change (a policy holding this composite out holds it)
CATALOG_OPS = ("brightness",)


class Params(BaseModel):
    """A suite job's ``params:``: the gain range."""

    model_config = ConfigDict(extra="forbid")

    gain: tuple[float, float] = (0.8, 1.2)

    @model_validator(mode="after")
    def _check(self) -> Params:
        lo, hi = self.gain
        if not 0.0 < lo <= hi <= 4.0:
            raise ValueError(f"gain must satisfy 0 < low <= high <= 4, got {self.gain}")
        return self


def spec_of(params: Any) -> Params:
    return Params.model_validate(params.model_dump() if isinstance(params, BaseModel) else params)


def track_key(seed: int, img_id: str, variant: int) -> int:
    return keyed.derive_key(seed, img_id, NAME, 0, variant)


def sample_params(key: int, width: int, height: int, spec: Params) -> dict[str, Any]:
    gen = keyed.scalar_rng(key)
    mirror = bool(gen.integers(0, 2))
    gain = float(gen.uniform(spec.gain[0], spec.gain[1]))
    return {"version": VERSION, "size": [width, height], "mirror": mirror, "gain": gain}


def transformed_array(img: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    out = img[:, ::-1] if params["mirror"] else img
    return np.clip(out * np.float32(params["gain"]), 0.0, 1.0)


def apply_transformed(x: torch.Tensor, params: Sequence[dict[str, Any]]) -> torch.Tensor:
    outs = []
    for sample, p in zip(x, params, strict=True):
        y = sample.flip(-1) if p["mirror"] else sample
        outs.append((y * torch.tensor(p["gain"], dtype=torch.float32)).clamp(0.0, 1.0))
    return torch.stack(outs)


def composite_problem(params: Any, width: int, height: int) -> str | None:
    if not isinstance(params, dict) or params.get("size") != [width, height]:
        return f"params are not for a {width}x{height} image"
    gain = params.get("gain")
    if not isinstance(gain, float) or not math.isfinite(gain) or not 0.0 < gain <= 4.0:
        return f"gain {gain!r:.40} is not a finite number in (0, 4]"
    if not isinstance(params.get("mirror"), bool):
        return "mirror must be true or false"
    return None
