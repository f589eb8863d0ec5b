"""The X-ray CPU fast paths (uint8/uint16 read directly, per-level tables, per-sample fields) against
the torch kernels they stand in for, and 16-bit results against independent float64 formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import perturb
from perturb import rng
from perturb.ops import backend
from perturb.ops.backend import use_backend
from perturb.ops.noise import POISSON_EXACT_BELOW, poisson_small, poisson_small_by_level
from tests.ops.test_xray_ops import _real

# ops whose host path repeats the kernel's operations exactly (the others, scatter, motion blur
# and JPEG, use OpenCV filters/codecs and agree within 1/255: tests/ops/test_contract.py)
EXACT = [
    "xray_bit_depth",
    "xray_burned_text",
    "xray_collimation",
    "xray_exposure",
    "xray_gamma",
    "xray_grid_lines",
    "xray_heel_effect",
    "xray_laterality_marker",
    "xray_monochrome1",
    "xray_quantum_noise",
    "xray_window_level",
]
TOPS = {torch.uint8: 255, torch.uint16: 65535}
# The kernels round once through float32 (relative error 2^-24, about 0.004 of a 16-bit level
# near white) before rounding to a level, so a level differs from the float64 formula only for
# values within ~0.01 of a half level: at most about 1 % of pixels, and never by two levels.
NEAR_TIES = 0.01


def _batch() -> torch.Tensor:
    """Three real radiographs, 160x192 (not square), the last one with a dark 6 px frame."""
    frames = [_real(192, i)[..., 16:176, :] for i in range(3)]
    x = torch.cat(frames).contiguous()
    x[2, :, :6], x[2, :, -6:], x[2, :, :, :6], x[2, :, :, -6:] = 0.0, 0.0, 0.0, 0.0
    return x


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return x
    return (x * TOPS[dtype]).round().to(torch.int32).to(dtype)


@pytest.mark.parametrize("op", EXACT)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.float32])
def test_cpu_path_is_the_kernel_bit_for_bit(op: str, dtype: torch.dtype) -> None:
    x = _as(_batch(), dtype)
    keys = ["a", "b", "c"]
    assert backend.cpu_path(op, dtype) is not None or dtype == torch.float32
    for severity, protect in ((1, False), (5, True)):
        out, records = perturb.apply(x, op, severity, keys, seed=9, protect_border=protect)
        with use_backend("torch"):
            reference = perturb.replay(records, x)
        assert out.dtype == dtype
        assert torch.equal(out, reference), f"{op} {dtype} severity {severity}: host path differs from the kernel"


def test_lookup_paths_take_integer_batches_only() -> None:
    """Pointwise ops tabulate integer levels; a float32 batch keeps the torch kernel, and a
    uint16 batch reaches a float32-only path through per-sample conversion."""
    for op in ("xray_exposure", "xray_window_level", "xray_gamma", "xray_bit_depth", "xray_monochrome1"):
        assert backend.cpu_path(op, torch.float32) is None
        path = backend.cpu_path(op, torch.uint16)
        assert path is not None and np.dtype(np.uint16) in path[1]
    path = backend.cpu_path("jpeg", torch.uint16)  # the generic codec path: float32 and uint8 only
    assert path is not None and np.dtype(np.uint16) not in path[1]
    x = torch.zeros(1, 1, 4, 4, dtype=torch.uint16)
    with pytest.raises(TypeError, match=r"takes \[.uint8.\] batches, got uint16"):
        backend.run_cpu(path[0], x, {}, [0], [None], dtypes={np.dtype(np.uint8)})


def _levels16(x: torch.Tensor) -> np.ndarray:
    return x[0, 0].numpy().astype(np.float64) / 65535.0


def _ref16(v: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(v, 0.0, 1.0) * 65535.0)


def _pointwise_reference(op: str, v: np.ndarray, p: dict[str, float]) -> np.ndarray:
    """The display transform of each pointwise op, written out in float64 from its definition."""
    if op == "xray_exposure":  # gain 2^stops on I = exp(-4 v)
        return -np.log(np.maximum(np.exp(-4.0 * v) * 2.0 ** p["stops"], math.exp(-4.0))) / 4.0
    if op == "xray_window_level":
        return (v - (0.5 + p["center_shift"])) / p["width"] + 0.5
    if op == "xray_gamma":
        return v ** (2.0 ** p["log2_gamma"])
    if op == "xray_bit_depth":
        top = round(2.0 ** p["bits"]) - 1.0
        return np.round(v * top) / top
    assert op == "xray_monochrome1"
    return (1.0 - v - (0.5 + p["center_shift"])) / p["width"] + 0.5


@pytest.mark.parametrize(
    "op", ["xray_exposure", "xray_window_level", "xray_gamma", "xray_bit_depth", "xray_monochrome1"]
)
def test_16_bit_lookup_tables_match_float64_formulas(op: str) -> None:
    """Every one of the 65,536 levels (a ramp image), at every severity: within one level of the
    formula evaluated in float64 (the kernel rounds through float32 once)."""
    ramp = torch.arange(65536, dtype=torch.int32).to(torch.uint16).view(1, 1, 256, 256)
    v = _levels16(ramp)
    for severity in range(1, 6):
        out, records = perturb.apply(ramp, op, severity, ["ramp"], seed=4)
        p = {k: float(np.float32(val)) for k, val in records[0].params.items()}
        expected = _ref16(_pointwise_reference(op, v, p))
        diff = np.abs(out[0, 0].numpy().astype(np.float64) - expected)
        assert diff.max() <= 1.0, f"{op} severity {severity}: {diff.max()} levels off"
        if op != "xray_bit_depth":  # its steps sit exactly on half levels: ties may round either way
            assert (diff > 0).mean() < NEAR_TIES


@pytest.mark.parametrize("op", ["xray_heel_effect", "xray_grid_lines"])
def test_16_bit_gain_fields_match_float64_formulas(op: str) -> None:
    """Heel effect and grid lines on a real 16-bit radiograph against ``-ln(gain I) / MU`` with
    the gain field recomputed in float64 from the recorded parameters."""
    x = _as(_real(256, 1), torch.uint16)
    out, records = perturb.apply(x, op, 5, ["r"], seed=6, protect_border=False)  # whole film
    p = {k: float(np.float32(val)) for k, val in records[0].params.items()}
    h, w = x.shape[-2:]
    ys = (np.arange(h) + 0.5 - h / 2)[:, None]
    xs = (np.arange(w) + 0.5 - w / 2)[None, :]
    if op == "xray_heel_effect":
        theta = math.radians(p["angle"])
        sign = 1.0 - 2.0 * p["anode_top"]
        t = np.clip(((ys * math.cos(theta) + xs * math.sin(theta)) * sign / (0.5 * math.hypot(h, w)) + 1) / 2, 0, 1)
        gain = 1.0 - p["strength"] * t * t
    else:
        theta = math.radians(p["angle"]) + p["vertical"] * math.pi / 2
        f = p["lines_per_cm"] * 35.0 / min(h, w)
        s = 0.5 * (1.0 + np.cos(2 * math.pi * (f * (xs * math.cos(theta) + ys * math.sin(theta)) + p["phase"])))
        gain = 1.0 - p["strength"] * s
    expected = _ref16(_levels16(x) - np.log(gain) / 4.0)
    diff = np.abs(out[0, 0].numpy().astype(np.float64) - expected)
    assert diff.max() <= 1.0
    assert (diff > 0).mean() < NEAR_TIES


def test_poisson_inversion_by_level_matches_the_per_pixel_walk() -> None:
    """The binary search in per-level CDF rows gives the kernel's walk counts (``poisson_small``,
    the same recurrence per pixel), including means near 0 and near the exact-inversion limit,
    uniforms at both ends (counts 0 and far in the upper tail)."""
    g = np.random.default_rng(3)
    mean_lut = np.concatenate([[0.0, 1e-6], np.linspace(0.01, POISSON_EXACT_BELOW, 1000, endpoint=False)])
    mean_lut = mean_lut.astype(np.float32)
    levels = g.integers(0, mean_lut.size, 200_000).astype(np.uint16)
    u = g.random(levels.size)
    u[:50], u[50:100] = 1e-12, 1.0 - 1e-12
    expected = poisson_small(mean_lut[levels].astype(np.float64), u)
    got = poisson_small_by_level(mean_lut, levels, u)
    assert np.array_equal(got, expected)
    assert expected.max() >= 30 and expected.min() == 0


@given(
    key=st.integers(0, 2**64 - 1),
    n=st.integers(1, 5000),
    picks=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=40),
)
@settings(max_examples=30, deadline=None)
def test_uniform_field_at_selected_elements(key: int, n: int, picks: list[float]) -> None:
    """The quantum-noise path draws its uniforms only where the mean needs exact inversion:
    the values there are the field's (the torch field, flattened)."""
    index = np.unique((np.asarray(picks) * n).astype(np.int64))
    full = rng.uniform_field(key, "xray_quantum/uniform", (n,)).numpy()
    assert np.array_equal(rng.uniform_numpy_at(key, "xray_quantum/uniform", index), full[index])
