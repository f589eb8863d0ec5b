"""The batched torch kernels of the scene ops (``_host.DEVICE_KERNELS``) against their host
functions (the CPU path, whose bytes the golden digests pin), on real frames.

Bounds. The geometric ops (interlacing, chromatic_aberration, lens_distortion) read the same
positions with the same interpolation kernel and border rule as OpenCV 5's float remap/warp: the
two differ by float32 rounding of the weights and the sum order alone (a few 1e-7 per value), so
the torch path must agree within 1e-4 everywhere (0.026 of an 8-bit level: no byte can differ
by more than one level, and only where a value sits on a rounding boundary). The building blocks
are checked exactly: the tissue estimate equals ``tissue_mask`` pixel for pixel, ``remap`` equals
``cv2.remap`` within 2e-6.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import perturb
from perturb.ops import _host
from perturb.ops.backend import use_backend
from tests.helpers import ENDOSCOPY, downscaled, require_samples, sample_tensor

GEOMETRIC = ("interlacing", "chromatic_aberration", "lens_distortion")
# (mean |diff|, 99th percentile |diff|, max |diff|) allowed between the torch and CPU paths
BOUNDS = {op: (1e-5, 1e-5, 1e-4) for op in GEOMETRIC}
# lens_fog: the same smooth fields as linear maps (gaussian and noise resizes as per-axis
# matrices; sums in another order, float32): a few 1e-6 per value, 1e-5 on the mean
BOUNDS["lens_fog"] = (2e-6, 1e-5, 1e-4)
# surgical_smoke: those fields, the canvas read by the batched remap, the field's soft edge as a
# relaxed chamfer distance and the 98th percentile of the light from a sort: float32 rounding only
BOUNDS["surgical_smoke"] = (2e-6, 2e-5, 1e-4)
# specular_glare: the lobe is (N . V)^shininess, so a float32 rounding of N . V (sqrt, gradient,
# the 98th percentile) is raised to the shininess (tens to hundreds), and the lobe's floor and the
# clipping are thresholds: a highlight pixel may move by a few 1e-4 (a tenth of a level)
BOUNDS["specular_glare"] = (2e-6, 2e-5, 1e-3)
# fluid_occlusion: the pool is a threshold of a noise field at a quantile and its components, its
# depth a chamfer distance: the same pixels on both paths (a pixel at the threshold within float32
# rounding would flip, none does on the frames), then float32 rounding of smooth fields
BOUNDS["fluid_occlusion"] = (2e-6, 2e-5, 1e-4)
# bubbles: the analytic disk cover, refraction and film of each bubble are the host's own
# formulas over the whole frame (not a window), the tissue behind read by the batched remap;
# version 8's darker, thinner rims of keyed depth (steeper edges) and its glints raise the worst
# pixel's float32 rounding to about 1.5e-4 (0.04 of a level)
BOUNDS["bubbles"] = (2e-6, 2e-5, 2e-4)
# lens_droplets: each drop's formulas over the whole frame cut to its box, the defocus a gaussian
# of the drop's own sigma from one spectrum of the frame's reflect-101 extension (OpenCV's float32
# kernel; FFT rounding, a few 1e-7), the tissue behind read by the batched remap
BOUNDS["lens_droplets"] = (2e-6, 2e-5, 1e-4)
# chromatic_aberration, lens_distortion, scope_roll: the remap as above, of the tissue behind the
# aperture, whose fills are lens_fog's smooth gaussians (matrix products) and the rim's soft mask a
# relaxed chamfer distance: float32 rounding only
BOUNDS["chromatic_aberration"] = BOUNDS["lens_distortion"] = (2e-6, 1e-5, 1e-4)
BOUNDS["scope_roll"] = (2e-6, 1e-5, 1e-4)
# video_macroblocking: the coder in float64 as on the host (the DC prediction summed in NumPy's
# pairwise order; the transforms, colour matrices and chroma resizes as matrix products whose sums
# may round differently in the last bit): float32 outputs equal but for a few 1e-6 on odd sizes
BOUNDS["video_macroblocking"] = (2e-6, 2e-5, 1e-4)


def _frames(side: int, count: int = 6) -> list[torch.Tensor]:
    require_samples()
    return [downscaled(sample_tensor(p), side) for p in ENDOSCOPY[:count]]


def test_every_device_kernel_has_bounds() -> None:
    assert set(BOUNDS) == _host.DEVICE_KERNELS


@pytest.mark.parametrize("op", sorted(BOUNDS))
@pytest.mark.parametrize("protect", [False, True], ids=["kernel", "protected"])
def test_torch_kernel_matches_the_cpu_path_on_real_frames(op: str, protect: bool) -> None:
    """Protected: the engine's scenes give the masks; not protected: the kernel estimates the
    field of view from the pixels on its device (``estimate_tissue``)."""
    mean_bound, p99_bound, max_bound = BOUNDS[op]
    frames = _frames(256, 4)
    for i, x in enumerate(frames):
        cpu, records = perturb.apply(x[None], op, 5, [f"frame-{i}"], seed=2, protect_border=protect)
        with use_backend("torch"):
            dev = perturb.replay(records, x[None])
        diff = (cpu - dev).abs().flatten()
        mean, p99, worst = (
            float(diff.mean()),
            float(torch.quantile(diff[::7], 0.99)),
            float(diff.max()),
        )
        assert mean <= mean_bound and p99 <= p99_bound and worst <= max_bound, (
            f"{op} frame {i}: mean {mean:.3g}, p99 {p99:.3g}, max {worst:.3g}"
        )
        assert float((cpu - x).abs().max()) > 0.05, f"{op} frame {i}: the op changed nothing"


def test_a_batch_equals_its_samples_one_by_one() -> None:
    """One batched pass over frames of one size gives each sample's own output."""
    x = torch.stack([f[:, :140, :180] for f in _frames(256, 4)])
    keys = [f"k{i}" for i in range(len(x))]
    with use_backend("torch"):
        for op in sorted(_host.DEVICE_KERNELS):
            whole, _ = perturb.apply(x, op, 4, keys, protect_border=False)
            for i in range(len(x)):
                alone, _ = perturb.apply(x[i : i + 1], op, 4, [keys[i]], protect_border=False)
                assert torch.equal(whole[i : i + 1], alone), (
                    f"{op}: sample {i} depends on its batch"
                )


@pytest.mark.parametrize("side", [256, None], ids=["downscaled", "full"])
def test_tissue_estimate_equals_the_host_mask(side: int | None) -> None:
    frames = _frames(side or 10_000, 4 if side else 1)
    for i, x in enumerate(frames):
        want = _host.tissue_mask(x.numpy())
        got = _host.estimate_tissue(x[None])[0, 0].numpy()
        assert np.array_equal(want, got), f"frame {i}: {int((want != got).sum())} pixels differ"


def test_tissue_estimate_of_a_frame_without_field_is_everything() -> None:
    dark = torch.zeros(2, 3, 24, 32)
    assert bool(_host.estimate_tissue(dark).all())


def test_tissue_estimate_keeps_the_largest_of_two_regions() -> None:
    x = torch.zeros(1, 3, 60, 80)
    x[..., 10:50, 30:75] = 0.6  # the field (the opening rounds its corners)
    x[..., 20:30, 5:15] = 0.9  # a label on the frame, apart from it
    got = _host.estimate_tissue(x)[0, 0]
    assert bool(got[11:49, 31:74].all()) and not bool(got[20:30, 5:15].any())
    assert np.array_equal(got.numpy(), _host.tissue_mask(x[0].numpy()))


@pytest.mark.parametrize("interp", ["linear", "cubic"])
@pytest.mark.parametrize("border", ["reflect101", "replicate", "constant"])
def test_remap_equals_opencv(interp: str, border: str) -> None:
    rs = np.random.default_rng(0)
    img = rs.random((2, 3, 37, 53), dtype=np.float32)
    h, w = img.shape[-2:]
    map_x = (rs.random((2, h, w)) * (w + 10) - 5).astype(np.float32)
    map_y = (rs.random((2, h, w)) * (h + 10) - 5).astype(np.float32)
    flags = {"linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC}[interp]
    mode = {
        "reflect101": cv2.BORDER_REFLECT_101,
        "replicate": cv2.BORDER_REPLICATE,
        "constant": cv2.BORDER_CONSTANT,
    }[border]
    want = np.stack(
        [
            np.stack(
                [
                    cv2.remap(c, map_x[b], map_y[b], flags, borderMode=mode, borderValue=0.25)
                    for c in img[b]
                ]
            )
            for b in range(2)
        ]
    )
    got = _host.remap(
        torch.from_numpy(img),
        torch.from_numpy(map_x),
        torch.from_numpy(map_y),
        interp,
        border,
        0.25,
    )  # type: ignore[arg-type]
    assert float(np.abs(got.numpy() - want).max()) <= 2e-6


@pytest.mark.parametrize(("h", "w"), [(37, 53), (256, 341), (1080, 1350)])
def test_batched_gaussian_equals_the_host_blur(h: int, w: int) -> None:
    """Direct, downscaled by an integer and by a fractional factor (area in, bilinear out)."""
    img = np.random.default_rng(1).random((2, h, w), dtype=np.float32)
    for sigma in (0.2, 2.3, 15.36, 64.8):
        got = _host.gauss_t(torch.from_numpy(img), sigma).numpy()
        for i in range(2):
            assert float(np.abs(got[i] - _host.gauss(img[i], sigma)).max()) <= 2e-6, (sigma, i)


@pytest.mark.parametrize(("h", "w"), [(37, 53), (256, 341), (1080, 1350)])
def test_batched_value_noise_equals_the_host_field(h: int, w: int) -> None:
    keys = [5, 77, 2**63 + 11]
    for cell in (0.2 * min(h, w), 3.3):
        got = _host.fractal_noise_t(keys, "s", h, w, cell, 2, torch.zeros(1)).numpy()
        for i, key in enumerate(keys):
            want = _host.fractal_noise(key, "s", h, w, cell, 2)
            assert float(np.abs(got[i] - want).max()) <= 1e-4, (cell, i)


def test_soft_edge_equals_the_host_ramp() -> None:
    """The relaxed chamfer distance gives ``soft_mask``'s ramp (OpenCV's 3x3 distance)."""
    frames = _frames(256, 3)
    masks = [_host.tissue_mask(f.numpy()) for f in frames]
    for mask in masks:
        for inset in (0.5, 2.56, 9.0):
            got = _host.soft_mask_t(torch.from_numpy(mask)[None, None], inset)[0, 0].numpy()
            assert float(np.abs(got - _host.soft_mask(mask, inset)).max()) <= 1e-6, inset


def test_masked_quantile_is_numpys() -> None:
    gen = np.random.default_rng(4)
    values = gen.random((3, 20, 30), dtype=np.float32)
    mask = gen.random((3, 20, 30)) < np.array([0.5, 0.02, 0.0])[:, None, None]
    got = _host.masked_quantile(torch.from_numpy(values), torch.from_numpy(mask), 0.98)
    for i in range(2):
        assert abs(float(got[i]) - float(np.quantile(values[i][mask[i]], 0.98))) <= 1e-7
    assert bool(torch.isnan(got[2]))


@pytest.mark.parametrize("op", ["bubbles", "fluid_occlusion"])
def test_a_padded_batch_matches_the_cpu_path(op: str) -> None:
    """Samples with different object counts in one batch (zero-padded slots): each matches its
    CPU output and nothing turns NaN."""
    x = torch.stack([f[:, :140, :180] for f in _frames(256, 4)])
    keys = [f"pad-{i}" for i in range(len(x))]
    cpu, records = perturb.apply(x, op, 3, keys, protect_border=False)
    with use_backend("torch"):
        dev = perturb.replay(records, x)
    assert bool(torch.isfinite(dev).all())
    assert float((cpu - dev).abs().max()) <= BOUNDS[op][2]


@pytest.mark.parametrize("steps", [_host.CHAMFER3, _host.CHAMFER5])
def test_chamfer_on_the_masks_pixels_equals_the_whole_frame_rounds(
    steps: tuple[tuple[int, int, float], ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sparse relaxation (a mask of at most a quarter of the frame) gives every bit of the
    whole-frame rounds, including pixels left infinite past the reach and masks at the border."""
    gen = torch.Generator().manual_seed(7)
    for trial in range(12):
        b, h, w = 1 + trial % 2, 5 + 7 * trial, 9 + 5 * trial
        mask = torch.rand(b, 1, h, w, generator=gen) < 0.15
        if trial % 3:
            mask = torch.nn.functional.max_pool2d(mask.float(), 5, 1, 2) > 0  # blobs
        reach = 1.0 + 3.0 * trial
        monkeypatch.setattr(_host, "SPARSE_CHAMFER", 0)  # always sparse
        sparse = _host.chamfer_t(mask, steps, reach)
        monkeypatch.setattr(_host, "SPARSE_CHAMFER", 10**9)  # whole frame unless empty
        whole = _host.chamfer_t(mask, steps, reach)
        assert torch.equal(sparse, whole), trial


@pytest.mark.parametrize("size", [1, 3, 7, 33, 101])
def test_window_max_is_max_pool(size: int) -> None:
    gen = torch.Generator().manual_seed(size)
    x = torch.rand(2, 1, 45, 70, generator=gen) * (torch.rand(2, 1, 45, 70, generator=gen) > 0.8)
    pad = size // 2
    assert torch.equal(_host.window_max(x, size, 2), torch.nn.functional.max_pool2d(x, (size, 1), 1, (pad, 0)))
    assert torch.equal(_host.window_max(x, size, 3), torch.nn.functional.max_pool2d(x, (1, size), 1, (0, pad)))


def _edge_runs_by_scans(dark: np.ndarray) -> np.ndarray:
    """The definition: running minima of ``dark`` from each of the four edges."""
    d = dark.astype(np.uint8)
    left = np.minimum.accumulate(d, axis=1)
    right = np.minimum.accumulate(d[:, ::-1], axis=1)[:, ::-1]
    top = np.minimum.accumulate(d, axis=0)
    bottom = np.minimum.accumulate(d[::-1], axis=0)[::-1]
    return (left | right | top | bottom).astype(bool)


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        bool,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=24),
        elements=st.booleans(),
    )
)
def test_dark_runs_from_edges_are_the_running_minima_from_each_edge(dark: np.ndarray) -> None:
    """``dark_runs_from_edges`` (first and last lit pixel per row and column) marks exactly the
    pixels the four running minima from the edges mark, on any mask, all-dark and all-lit
    rows and columns included."""
    assert np.array_equal(_host.dark_runs_from_edges(dark), _edge_runs_by_scans(dark))
