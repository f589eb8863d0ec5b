"""Recorded parameters checked against an op's declared bounds before they run.

A record may come from a file (``perturb.replay`` of a manifest row): a parameter outside its
op's bounds (a blur sigma of 1e6) would size kernels and buffers from it. Parameters of the
severity table must be finite numbers (or lists of them) whose value, or magnitude for signed
draws (a brightness delta of -0.2 under bounds [0, 0.5]), lies inside the bounds; per-element
lists named after a table parameter (``sigmas`` for ``sigma``) are checked the same way; every
other value must be a finite number, a string, a bool or a short list of those.
"""

from __future__ import annotations

import math
from typing import Any

from perturb.catalog.specs import OpSpec

MAX_LIST = 4096  # elements in one recorded list parameter
_SLACK = 1e-9  # relative tolerance for draws that land on a bound


def _numbers(value: Any, depth: int = 0) -> list[float] | None:
    """The numbers of a value (nested lists flattened), or None when it holds something else."""
    if isinstance(value, bool):
        return [float(value)]
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list) and depth < 3:
        out: list[float] = []
        for item in value:
            inner = _numbers(item, depth + 1)
            if inner is None:
                return None
            out += inner
        return out
    return None


def _inside(x: float, lo: float, hi: float) -> bool:
    slack = _SLACK * max(1.0, abs(lo), abs(hi))
    return lo - slack <= x <= hi + slack or (lo >= 0 and lo - slack <= -x <= hi + slack)


def params_problem(spec: OpSpec, params: Any) -> str | None:
    """Why ``params`` cannot run under ``spec`` (None when they can)."""
    if not isinstance(params, dict):
        return f"params must be a JSON object, got {type(params).__name__}"
    for name, value in params.items():
        table = spec.params.get(name)
        if table is None and name.endswith("s"):
            table = spec.params.get(name[:-1])
        if isinstance(value, str) and table is None:
            continue
        numbers = _numbers(value)
        if numbers is None:
            return f"parameter {name!r} is {value!r:.60}, not a number or a list of numbers"
        if len(numbers) > MAX_LIST:
            return f"parameter {name!r} has {len(numbers)} values (at most {MAX_LIST})"
        if not all(math.isfinite(x) for x in numbers):
            return f"parameter {name!r} is not finite ({value!r:.60})"
        if table is None:
            continue
        lo, hi = table.bounds
        bad = [x for x in numbers if not _inside(x, lo, hi)]
        if bad:
            return (
                f"parameter {name!r} = {bad[0]!r} is outside the bounds [{lo}, {hi}] of {spec.name}"
            )
    return None
