"""The batched torch pieces of the X-ray kernels against the per-sample functions they replace:
shutter masks and box radii bit for bit, the fixed-point line PSFs within the splat's rounding of
``blur.line_psf`` (cropped as ``blur._crop_psf`` crops), and whole kernels on a batch equal to
each sample run alone (no dependence on the batch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import perturb
from perturb import rng
from perturb.catalog.ops import get_op
from perturb.engine import run as engine
from perturb.ops import blur, overlay
from perturb.ops.backend import use_backend
from perturb.ops.kernels import get_kernel


def test_collimation_of_a_batch_is_each_sample_alone() -> None:
    """The collimated films of a batch (blades, open blades, tilts, a second blade edge, scanned
    film edges with their rims, blur and waviness, square and rounded corners, penumbrae,
    scatter, off-focal halo,
    unsharp and equalisation low-passes at per-sample radii, transmission and its unevenness,
    display range, the band's streaks, the anatomy's trace under the blade, the film's noise
    level and the keyed grain) equal those of each sample run
    alone, bit for bit."""
    h, w = 41, 67
    p = {
        "left": [0.01, 0.2, 0.0, 0.4],
        "right": [0.03, 0.13, 0.4, 0.0],
        "top": [0.0, 0.07, 0.33, 0.01],
        "bottom": [0.2, 0.1, 0.0, 0.35],
        "white": [1.0, 0.0, 1.0, 0.0],
        "tilt": [0.5, 2.0, -1.5, -3.0],
        "penumbra": [0.002, 0.005, 0.004, 0.003],
        "spread": [0.5, 1.5, 1.0, 0.7],
        "transmission": [0.01, 0.05, 0.03, 0.02],
        "scatter": [0.05, 0.2, 0.1, 0.15],
        "reach": [0.01, 0.04, 0.03, 0.02],
        "range": [3.0, 5.0, 4.0, 3.5],
        "shade": [0.88, 0.95, 0.98, 0.93],
        "black": [0.0, 0.02, 0.01, 0.03],
        "skew_left": [0.5, -0.8, 0.0, 0.3],
        "skew_right": [-0.2, 0.4, 0.8, 0.0],
        "skew_top": [0.0, 0.1, -0.6, 0.7],
        "skew_bottom": [0.3, 0.0, -0.3, -0.8],
        "leaf": [1.0, 0.0, 1.0, 0.0],
        "leaf_side": [3.0, 0.0, 2.0, 1.0],
        "leaf_depth": [0.15, 0.1, 0.25, 0.0],
        "leaf_angle": [5.0, -3.0, -8.0, 2.0],
        "halo": [0.05, 0.1, 0.0, 0.13],
        "halo_reach": [0.015, 0.05, 0.03, 0.02],
        "texture": [0.8, 1.4, 1.0, 1.2],
        "readout": [0.03, 0.2, 0.0, 0.1],
        "rim": [0.001, 0.004, 0.002, 0.03],
        "rim_level": [0.7, 0.9, 1.0, 0.8],
        "wobble": [0.3, 2.0, 1.0, 0.0],
        "scan_blur": [1.5, 3.5, 2.0, 1.0],
        "corner": [0.0, 0.02, 0.002, 0.01],
        "band_noise": [0.0, 0.012, 0.01, 0.015],
        "enhance": [0.4, 1.2, 0.7, 0.5],
        "radius": [0.0015, 0.0055, 0.003, 0.004],
        "equalize": [0.0, 0.5, 0.2, 0.35],
        "band": [0.01, 0.05, 0.03, 0.02],
        "heel": [0.1, 0.5, 0.3, 0.2],
        "heel_dir": [0.0, 90.0, 200.0, 300.0],
        "lumps": [0.1, 0.4, 0.2, 0.3],
        "streak": [0.15, 0.6, 0.0, 0.4],
        "trace": [0.1, 0.35, 1.0, 0.2],
        "tail": [0.0, 0.2, 0.1, 0.05],
        "deep": [0.8, 0.95, 0.9, 5.0],
    }
    params = {k: torch.tensor(v) for k, v in p.items()}
    x = torch.rand(4, 1, h, w, generator=torch.Generator().manual_seed(5))
    keys = [11, 12, 13, 14]
    out = overlay.collimation(x, params, keys)
    for i in range(4):
        one = {k: v[i : i + 1] for k, v in params.items()}
        assert torch.equal(out[i : i + 1], overlay.collimation(x[i : i + 1], one, keys[i : i + 1])), i


def test_box_radii_are_box_radius_per_sample() -> None:
    sigmas = [0.0, 0.3, 1.2, 2.5, 7.49, 30.0, 500.0]
    for size in (2, 9, 64):
        got = blur.box_radii(torch.tensor(sigmas, dtype=torch.float64).view(-1, 1, 1, 1), size)
        assert got.view(-1).tolist() == [blur.box_radius(s, size) for s in sigmas]


@pytest.mark.parametrize(("h", "w"), [(2, 2), (3, 5), (7, 4), (33, 20)])
def test_box_passes_with_radii_per_sample_are_the_per_sample_passes(h: int, w: int) -> None:
    """Every radius a side allows, down to 1 and up to side - 1 (windows past both edges)."""
    x = torch.rand(3, 1, h, w, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    size = min(h, w)
    for radius in range(1, size):
        r = torch.tensor([radius, 1, size - 1]).view(-1, 1, 1, 1)
        for dim in (-1, -2):
            out = blur._box_batch(x, r, dim)
            for b in range(3):
                ref = blur._box_torch(x[b : b + 1], int(r[b]), dim)
                assert float((out[b : b + 1] - ref).abs().max()) < 1e-13


@pytest.mark.parametrize("side", [2, 3, 12, 96])
def test_line_psfs_are_line_psf_cropped_as_the_per_sample_path(side: int) -> None:
    lengths = [0.0, 0.004, 0.05, 0.15]
    angles = [0.0, 33.3, 90.0, 179.0]
    most = max(blur.MAX_MOTION_LENGTH * side, 1.0)
    radius = side + 3  # larger than any cropped PSF: the rest stays zero
    length = torch.tensor(lengths, dtype=torch.float32).double() * side
    angle = torch.tensor(angles, dtype=torch.float32).double()
    psfs = blur.line_psfs(length, angle, radius, side - 1, most)
    assert psfs.shape == (4, 2 * radius + 1, 2 * radius + 1)
    for i in range(len(lengths)):
        ref = blur.line_psf(float(np.float32(lengths[i])) * side, float(np.float32(angles[i])))
        cropped = blur._crop_psf(ref, torch.zeros(1, side, side))[0].numpy().astype(np.float64)
        r = cropped.shape[0] // 2
        got = psfs[i, radius - r : radius + r + 1, radius - r : radius + r + 1].numpy()
        assert abs(float(psfs[i].sum()) - 1.0) < 1e-12
        assert np.abs(got - cropped).max() < 1e-6, (side, i)
        assert abs(float(got.sum()) - 1.0) < 1e-12  # no tap outside the crop


def test_motion_bound_is_the_catalogs() -> None:
    assert get_op("xray_motion_blur").spec.params["length"].bounds[1] == blur.MAX_MOTION_LENGTH


@pytest.mark.parametrize(
    "op",
    [
        "xray_motion_blur",
        "xray_scatter",
        "xray_quantum_noise",
        "xray_collimation",
        "xray_burned_text",
    ],
)
def test_a_sample_in_a_batch_is_the_sample_alone(op: str) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(5, 1, 48, 72, generator=gen)
    with use_backend("torch"):
        out, records = perturb.apply(x, op, 5, [f"s{i}" for i in range(5)], seed=2)
        alone = perturb.replay(records, x)  # one sample per call
    assert torch.equal(out, alone)
    assert not torch.equal(out, x)


@pytest.mark.parametrize("op", ["xray_burned_text", "xray_laterality_marker"])
def test_overlay_kernels_from_host_params_equal_the_tensor_read_and_the_cpu_path(op: str) -> None:
    """The overlay kernels rasterise from the records' host-side parameters (what the engine
    passes): the pixels of a bare call that reads the (B,) tensors back, and the CPU path's."""
    entry = get_kernel(op)
    assert entry.host_params
    x = torch.rand(3, 1, 80, 96, generator=torch.Generator().manual_seed(3))
    keys = [rng.derive_key(2, f"overlay-{i}", op, 0, 0) for i in range(3)]
    host = [engine.sample_params(get_op(op), k, 5) for k in keys]
    params = engine.collate(host, x.device)
    with torch.no_grad():
        given = entry.kernel(x, params, keys, host_params=host)
        read = entry.kernel(x, params, keys)
    assert torch.equal(given, read)
    assert not torch.equal(given, x)
    u8 = (x * 255).round().to(torch.uint8)
    with use_backend("opencv"):
        cpu, records = perturb.apply(u8, op, 5, [f"s{i}" for i in range(3)], protect_border=False)
    with use_backend("torch"):
        replayed = perturb.replay(records, u8)
    assert torch.equal(replayed, cpu)
