"""The uint8 CPU path of the radial exposure ops (vignetting, underexposure): scaling in the
encoded domain (``perturb.ops.exposure._scale_in_linear_u8``) against an independent float64
sRGB reference (IEC 61966-2-1) and against the torch kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import perturb
from perturb.ops.backend import use_backend
from perturb.ops.exposure import _root_field, _scale_in_linear_u8, underexposure_cpu, vignetting_cpu
from tests.helpers import ENDOSCOPY, downscaled, require_samples, sample_tensor


def _decode(levels: np.ndarray) -> np.ndarray:
    v = levels / 255.0
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def _encode_levels(lin: np.ndarray) -> np.ndarray:
    lin = np.clip(lin, 0.0, 1.0)
    enc = np.where(lin <= 0.0031308, 12.92 * lin, 1.055 * np.maximum(lin, 0.0031308) ** (1 / 2.4) - 0.055)
    return enc * 255.0


@pytest.mark.parametrize("gain", [1.0, 0.47, 0.13])
def test_every_level_and_scale_within_one_level_of_the_srgb_formula(gain: float) -> None:
    # every level against 2000 scales from 0 to 1, dense near 0 (the curve's linear foot)
    scales = np.concatenate([[0.0, 1e-13, 1e-6], np.linspace(0, 1, 1997) ** 3])
    src = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, scales.size, 256)).copy()
    root = (scales ** (1 / 2.4)).astype(np.float32)[:, None].repeat(256, axis=1)
    dst = np.zeros_like(src)
    _scale_in_linear_u8(src, dst, root, gain)
    exact = _encode_levels(_decode(np.arange(256.0))[None, :] * (gain * scales[:, None]))
    diff = np.abs(dst[1].astype(np.float64) - exact)
    assert np.array_equal(dst[0], dst[1]) and np.array_equal(dst[0], dst[2])
    assert float(diff.max()) < 1.0, "more than one level off the formula"
    # off the nearest level only where the exact value is close to a rounding boundary
    off = np.abs(dst[1] - np.rint(exact)) > 0
    assert float(np.abs(exact[off] % 1.0 - 0.5).max(initial=0.0)) < 0.06
    assert float(off.mean()) < 0.01
    assert int(dst[:, 0].max()) == 0, "scale 0 gives black"
    assert int(dst[:, 1].max()) == 0, "a scale below the floor gives black"


def test_root_field_is_the_clipped_falloff_to_the_power_one_over_2_4() -> None:
    h, w = 61, 83
    dx2 = ((np.arange(w) + 0.5 - 0.47 * w) / 40.0) ** 2
    dy2 = ((np.arange(h) + 0.5 - 0.52 * h) / 40.0) ** 2
    for strength in (0.3, 0.98):  # 0.98 clips the corners
        falloff = np.maximum(0.0, 1 - strength * (dx2[None, :] + dy2[:, None]))
        root = _root_field(dx2, dy2, strength).astype(np.float64)
        expected = falloff ** (1 / 2.4)
        assert np.abs(root - expected).max() < 2e-6 + 1.1e-5 * bool((falloff == 0).any())
        assert root.shape == (h, w) and bool((root >= 0).all())
    assert bool((falloff == 0).any()), "the strong fall-off reaches 0 in the corners"


def test_a_box_of_a_frame_gives_the_bytes_of_the_box_alone() -> None:
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, (3, 40, 50), dtype=np.uint8)
    root = rng.random((20, 30), dtype=np.float32)
    dst = np.full_like(src, 9)
    _scale_in_linear_u8(src[:, 5:25, 10:40], dst[:, 5:25, 10:40], root, 0.8)
    alone = np.zeros((3, 20, 30), np.uint8)
    _scale_in_linear_u8(np.ascontiguousarray(src[:, 5:25, 10:40]), alone, root, 0.8)
    assert np.array_equal(dst[:, 5:25, 10:40], alone)
    dst[:, 5:25, 10:40] = 9
    assert bool((dst == 9).all()), "written outside the box"


def _frame() -> torch.Tensor:
    """A real endoscopy frame (its field of view and dark surround), as uint8 (1, 3, H, W)."""
    require_samples()
    img = downscaled(sample_tensor(ENDOSCOPY[0]), 320)
    return (img * 255).round().to(torch.uint8)[None].contiguous()


@pytest.mark.parametrize("op", ["vignetting", "underexposure"])
@pytest.mark.parametrize("protect", [False, True])
def test_u8_path_within_one_level_of_the_torch_kernel(op: str, protect: bool) -> None:
    u8 = _frame()
    for severity in (1, 5):
        out, records = perturb.apply(u8, op, severity, ["frame"], protect_border=protect)
        with use_backend("torch"):
            ref = perturb.replay(records, u8.float() / 255)
        ref8 = (ref * 255).round().clamp(0, 255).to(torch.uint8)
        diff = (out.int() - ref8.int()).abs()
        assert int(diff.max()) <= 1
        assert float((diff > 0).float().mean()) < 0.01
        assert not torch.equal(out, u8)


@pytest.mark.parametrize("op", ["vignetting", "underexposure"])
def test_a_scene_bounds_the_work_to_its_bbox(op: str) -> None:
    """With a scene (border protection) the path computes the field's bbox only, the rest being
    the source, which the composite keeps there anyway; underexposure's fall-off stays the
    whole image's, so inside the bbox it is the scene-less result."""
    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, (3, 48, 64), dtype=np.uint8)
    p = {name: np.float32(v) for name, v in {"cx": 0.48, "cy": 0.53, "gain": 0.4, "falloff": 0.5, "strength": 0.9}.items()}
    fn = underexposure_cpu if op == "underexposure" else vignetting_cpu

    class Scene:
        bbox = (6, 4, 58, 45)

    whole, boxed = np.zeros_like(src), np.zeros_like(src)
    fn(src, whole, p, 0)
    fn(src, boxed, p, 0, scene=Scene())
    inside = (slice(None), slice(4, 45), slice(6, 58))
    outside = np.ones(src.shape, bool)
    outside[inside] = False
    assert np.array_equal(boxed[outside], src[outside])
    if op == "underexposure":
        assert np.array_equal(boxed[inside], whole[inside])
    else:  # vignetting's fall-off is normalised by the field box: only its bytes are the box's own
        assert not np.array_equal(boxed[inside], src[inside])
