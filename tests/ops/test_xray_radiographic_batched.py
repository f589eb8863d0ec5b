"""The batched torch paths of the radiographic X-ray ops (perturb/catalog/xray_radiographic.yaml):
their building blocks against the per-sample functions they replace, and every op's torch path
against its CPU path on mixed batches (several severities and films in one call)."""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb import rng
from perturb.ops import blur, detector, geometry, keyed_fields
from perturb.ops.backend import use_backend
from tests.ops.test_xray_ops import _real

OPS = [
    "xray_patient_rotation",
    "xray_under_penetration",
    "xray_over_penetration",
    "xray_support_devices",
    "xray_foreign_objects",
    "xray_detector_defects",
    "xray_edge_enhancement",
    "xray_double_exposure",
    "xray_cardiac_motion",
    "xray_skin_fold",
]
# the warp runs through Kornia's float32 bicubic sampling on the torch path, the CPU path
# through a float64 grid: they agree to a few 1e-6; every other op gives the same values
WARP_TOLERANCE = 5e-5
KEYS = [rng.derive_key(0, f"film{i}", "x", 0, 0) for i in range(4)] + [0, 1, 2**64 - 1]


@pytest.mark.parametrize("shape", [(1, 7, 9), (1, 8, 8), (3,), (1, 1, 1)])
def test_batched_fields_are_the_per_sample_fields_bit_for_bit(shape: tuple[int, ...]) -> None:
    cpu = torch.device("cpu")
    uniform = keyed_fields.uniform_fields(KEYS, "stream/a", shape, cpu)
    normal = keyed_fields.normal_fields(KEYS, "stream/a", shape, cpu)
    assert uniform.shape == normal.shape == (len(KEYS), *shape)
    for i, key in enumerate(KEYS):
        assert torch.equal(uniform[i], rng.uniform_field(key, "stream/a", shape))
        assert torch.equal(normal[i], rng.normal_field(key, "stream/a", shape))
    assert not torch.equal(uniform[0], uniform[1])  # rows are the samples' own fields


@pytest.mark.parametrize(("h", "w"), [(7, 9), (20, 5), (2, 3), (33, 40)])
def test_box_mean_with_per_sample_radii_is_the_reflected_box(h: int, w: int) -> None:
    """Every radius from 0 to size - 1 (windows that reflect at one end, at both, and
    the widest the reflection allows) against ``_box_torch`` one sample at a time."""
    gen = torch.Generator().manual_seed(h * w)
    for dim, n in ((-1, w), (-2, h)):
        radii = torch.arange(n)
        v = torch.rand(n, 2, h, w, generator=gen, dtype=torch.float64)
        got = blur.box_mean(v, radii, dim)
        for i in range(n):
            ref = blur._box_torch(v[i : i + 1], i, dim) if i else v[i : i + 1]
            assert float((got[i : i + 1] - ref).abs().max()) < 1e-13, (dim, i)


def test_batched_source_columns_invert_the_forward_shift() -> None:
    """The batched inverse of the rotation's lateral map, per sample, against the forward map:
    mapping each output column's source forward lands on the output column (monotone map, up to
    s5 and beyond), and a batch's rows equal each sample's alone."""
    degrees = torch.tensor([-15.0, -2.5, 0.0, 7.0, 14.9, 20.0])
    pivot = torch.tensor([0.03, -0.01, 0.0, 0.02, -0.03, 0.0])
    for w, h in ((240, 200), (96, 128), (1024, 1024)):
        src = geometry.source_columns(degrees, pivot, w, h)
        cols = torch.arange(w, dtype=torch.float64) + 0.5
        for i in range(len(degrees)):
            fwd = src[i] + geometry.rotation_shift(src[i], degrees[i], pivot[i], w, h)
            assert float((fwd - cols).abs().max()) < 0.05, (w, float(degrees[i]))
            alone = geometry.source_columns(degrees[i : i + 1], pivot[i : i + 1], w, h)
            assert torch.equal(alone[0], src[i])
            step = torch.diff(cols + geometry.rotation_shift(cols, degrees[i], pivot[i], w, h))
            assert float(step.min()) > 0.0  # no fold: the anatomy keeps its left-right order


def _films(h: int, w: int) -> torch.Tensor:
    """Five real films (different ones, cropped to h x w), one with a dark frame."""
    x = torch.cat([_real(max(h, w), i)[..., :h, :w] for i in range(5)]).contiguous()
    x[3, :, :4], x[3, :, :, -4:] = 0.0, 0.0
    return x


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("h", "w"), [(96, 128), (131, 90)])
def test_torch_path_matches_the_cpu_path_on_a_mixed_batch(op: str, h: int, w: int) -> None:
    """Five films at severities 1-5 in one batch: the torch path (one batched computation)
    gives the CPU path's values, and each sample what it gives alone (batch of one)."""
    x = _films(h, w)
    keys = [f"film-{i}" for i in range(5)]
    cpu, records = perturb.apply(x, op, [1, 2, 3, 4, 5], keys, seed=2)
    with use_backend("torch"):
        batched, again = perturb.apply(x, op, [1, 2, 3, 4, 5], keys, seed=2)
        alone = perturb.replay(records, x)  # one sample at a time
    assert [r.params for r in again] == [r.params for r in records]
    diff = float((batched - cpu).abs().max())
    if op == "xray_patient_rotation":
        assert diff < WARP_TOLERANCE
    else:
        assert diff == 0.0, f"{op}: torch path differs from the CPU path by {diff}"
    assert torch.equal(alone, batched), f"{op}: a sample's torch result depends on its batch"


def test_detector_defects_torch_path_where_dead_lines_cross() -> None:
    """All eight candidate lines of several films (rows and columns that cross, dead and
    half gain) on a flat field: the torch path's crossings and the CPU path's agree."""
    x = torch.full((6, 1, 64, 80), 0.4)
    keys = [f"lines-{i}" for i in range(6)]
    _, records = perturb.apply(x, "xray_detector_defects", 5, keys)
    int_keys = [rng.key_from_hex(r.key) for r in records]
    params = {
        "dead_fraction": torch.zeros(6),
        "lines": torch.full((6,), 8.0),
        "seam_gain": torch.tensor([r.params["seam_gain"] for r in records], dtype=torch.float32),
    }
    kernel = detector.xray_detector_defects
    cpu = kernel(x, params, int_keys)
    with use_backend("torch"):
        batched = kernel(x, params, int_keys)
    assert float((batched - cpu).abs().max()) < 1e-6
    no_lines = kernel(x, {**params, "lines": torch.zeros(6)}, int_keys)
    crossings = 0
    for i, key in enumerate(int_keys):
        lines = detector.defect_lines(key, 64, 80, 8)
        crossings += any(c for c, _, _ in lines) and any(not c for c, _, _ in lines)
        assert (cpu[i] != no_lines[i]).any()
    assert crossings > 0
