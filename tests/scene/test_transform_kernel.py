"""The compiled 3x3 colour transform (``perturb.scene.native.transform_kernel``) gives
``cv2.transform``'s uint8 bytes (its 10-bit fixed point), alone and fused with the border
composite, for saturation and hue_shift; coefficients OpenCV computes otherwise fall back."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.ops import backend, color
from perturb.scene import masks, native
from tests.scene.frames import overlay_batch

pytest.importorskip("numba", reason="the compiled transform needs numba (a core dependency)")

LUMA = np.array([0.299, 0.587, 0.114])


def _saturation(f: float) -> np.ndarray:
    return ((1 - f) * np.tile(LUMA, (3, 1)) + f * np.eye(3)).astype(np.float32)


def _cv2(img_chw: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    hwc = np.ascontiguousarray(img_chw.transpose(1, 2, 0))
    return np.ascontiguousarray(cv2.transform(hwc, matrix).transpose(2, 0, 1))


def _kernel(img: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    out = np.zeros_like(img)
    assert native.transform_planes(img, out, matrix)
    return out


def test_kernel_compiles_and_passes_its_probe() -> None:
    assert native.transform_kernel() is not None


def test_probe_catches_a_kernel_that_rounds_otherwise() -> None:
    kernel = native.transform_kernel()
    assert kernel is not None

    def truncating(src: np.ndarray, dst: np.ndarray, steps: np.ndarray, *rest: Any) -> None:
        kernel(src, dst, steps, *rest)
        dst[::97] = dst[::97] // 2 * 2  # an arithmetic that differs on some pixels

    assert not native._transform_agrees(truncating)


@pytest.mark.parametrize("factor", [0.0, 0.13, 0.52, 1.47, 1.9, 3.0])
def test_every_colour_matches_opencv_for_saturation(factor: float) -> None:
    """All 16.7 M RGB colours, as a 3 x 4096 x 4096 image."""
    levels = np.arange(256, dtype=np.uint8)
    r, g, b = np.meshgrid(levels, levels, levels, indexing="ij")
    img = np.stack([r.reshape(4096, 4096), g.reshape(4096, 4096), b.reshape(4096, 4096)])
    matrix = _saturation(factor)
    assert np.array_equal(_kernel(img, matrix), _cv2(img, matrix))


@pytest.mark.parametrize("seed", range(12))
def test_random_matrices_and_odd_sizes_match_opencv(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(1, 40)), int(rng.integers(1, 700))
    img = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
    scale = float(rng.choice([0.1, 1.0, 4.0, 20.0]))
    matrix = (rng.uniform(-1.0, 1.0, (3, 3)) * scale).astype(np.float32)
    assert np.array_equal(_kernel(img, matrix), _cv2(img, matrix))


def test_large_coefficients_leave_the_compiled_path() -> None:
    """OpenCV computes coefficients of 32 or more in floating point: not this kernel's work."""
    matrix = np.eye(3, dtype=np.float32) * 0.01
    matrix[0, 0] = 40.0
    assert native.matrix_steps(matrix) is None
    assert native.matrix_steps(np.full((3, 3), np.nan, np.float32)) is None
    img = np.random.default_rng(0).integers(0, 256, (3, 9, 31), dtype=np.uint8)
    out = np.zeros_like(img)
    color._transform(img, out, matrix)  # the OpenCV path
    assert np.array_equal(out, _cv2(img, matrix))


@pytest.mark.parametrize("factor", [0.3, 1.6])
def test_fused_pass_is_transform_then_composite(factor: float) -> None:
    x = overlay_batch()
    matrix = _saturation(factor)
    for i in range(x.shape[0]):
        sample = x[i].numpy()
        scene = perturb.scene(x[i])
        want = _cv2(sample, matrix)
        masks.compose_numpy(sample, want, scene.descriptor)
        got = np.zeros_like(sample)
        assert masks.compose_transform(sample, got, matrix, scene.descriptor)
        assert np.array_equal(got, want)
        hashed = np.zeros_like(sample)
        digest = masks.compose_transform_hashed(sample, hashed, matrix, scene.descriptor)
        assert np.array_equal(hashed, want)
        from perturb.scene.analysis import _digest

        assert digest == _digest(sample.data)


@pytest.mark.parametrize("op", ["saturation", "hue_shift"])
def test_engine_runs_the_fused_pass_with_the_same_bytes(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = overlay_batch()
    keys = [f"t{i}" for i in range(x.shape[0])]
    calls: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> bool:
        calls.append(masks.compose_transform(*args, **kwargs))
        return calls[-1]

    def hashed_spy(*args: Any, **kwargs: Any) -> bytes | None:
        digest = masks.compose_transform_hashed(*args, **kwargs)
        calls.append(digest is not None)
        return digest

    monkeypatch.setattr(backend, "compose_transform", spy)
    monkeypatch.setattr(backend, "compose_transform_hashed", hashed_spy)
    for severity in (1, 5):
        calls.clear()
        fast, records = perturb.apply(x, op, severity, keys)
        assert calls and all(calls) and len(calls) >= x.shape[0]
        with monkeypatch.context() as m:  # OpenCV's transform and the NumPy composite
            m.setattr(masks, "_compiled", lambda: None)
            m.setattr(color, "transform_planes", lambda src, dst, matrix: False)
            plain, plain_records = perturb.apply(x, op, severity, keys)
        assert torch.equal(fast, plain), (op, severity)
        assert [r.to_dict() for r in records] == [r.to_dict() for r in plain_records]
        assert torch.equal(perturb.replay(records, x), fast)


def test_probe_catches_a_kernel_that_does_not_digest() -> None:
    """The probe also runs the kernel's digest: a kernel that skips it is not used."""
    kernel = native.transform_kernel()
    assert kernel is not None and native.stream_hasher() is not None

    def forgetful(*args: Any) -> None:
        kernel(*args[:-2], 0, 0)

    assert not native._transform_agrees(forgetful)
