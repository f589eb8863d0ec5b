"""The per-sample CPU paths of the geometric ops give the same bytes as the batched OpenCV path
(``perturb.ops.geometry.warp_batch`` on the ``opencv`` backend; the torch kernels, which CUDA
runs, are checked against it in the contract tests)."""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb.contracts.record import Record
from perturb.engine import run as engine
from perturb.ops import backend, geometry
from tests.helpers import small_batch


def _batched(op: str, x: torch.Tensor, records: list[Record]) -> torch.Tensor:
    """The op on the whole float32 batch at once (OpenCV warps; translation's exact shift),
    rounded back to the batch's dtype as the engine rounds."""
    scale = {torch.uint8: 255.0, torch.uint16: 65535.0}.get(x.dtype)
    xf = x.to(torch.float32) / scale if scale is not None else x
    p = engine.collate([r.params for r in records], x.device)
    height, width = x.shape[-2:]
    if op == "translation":
        out = geometry.shift_torch(
            xf, torch.tensor(geometry.translation_shifts(p, width, height)).reshape(-1, 2)
        )
    else:
        warps = geometry.crop_warps if op == "resized_crop" else geometry.rotation_warps
        with backend.use_backend("opencv"):
            out = geometry.warp_batch(xf, warps(p, width, height))
    return out if scale is None else (out * scale).round_().clamp_(0, scale).to(x.dtype)


@pytest.mark.parametrize("op", ["rotation", "resized_crop", "translation"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.uint16])
@pytest.mark.parametrize("channels", [1, 3])
def test_fast_path_is_bit_identical_to_the_batched_path(
    op: str, dtype: torch.dtype, channels: int
) -> None:
    x = small_batch(6, 45, 61, channels=channels)
    x[:, :, :, :4] = 0.0  # a dark frame edge
    scale = {torch.uint8: 255.0, torch.uint16: 65535.0}.get(dtype)
    if scale is not None:
        x = (x * scale).round().to(dtype)
    assert backend.cpu_path(op, dtype) is not None
    for severity in (1, 5):
        fast, records = perturb.apply(x, op, severity, [f"s{i}" for i in range(6)], seed=severity)
        batched = _batched(op, x, records)
        assert fast.dtype == dtype
        assert torch.equal(fast, batched)


@pytest.mark.parametrize("channels", [1, 3])
def test_crop_resize_reads_what_warp_affine_reads(channels: int) -> None:
    """A warp that is its crop resized and nothing else runs as ``cv2.resize``: the same cubic
    at the same source positions as ``cv2.warpAffine`` (clamped taps), equal to float32
    rounding; a warp with a rotation or black fill does not take that path."""
    import cv2
    import numpy as np

    img = small_batch(1, 45, 61, channels=channels)[0].permute(1, 2, 0).numpy().copy()
    img = np.ascontiguousarray(img[..., 0] if channels == 1 else img)
    height, width = img.shape[:2]
    for scale, log_ratio, u, v in ((0.81, 0.04, 0.3, 0.7), (0.97, -0.05, 0.6, 0.4), (1.0, 0.0, 0.5, 0.5)):
        warp = geometry.crop_warp(width, height, scale, log_ratio, u, v)
        assert geometry._is_resize(warp, width, height)
        x0, y0, x1, y1 = warp.crop
        affine = cv2.warpAffine(
            img[y0:y1, x0:x1],
            geometry._index_matrix(warp),
            (width, height),
            flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REPLICATE,
        )
        fast = geometry.warp_array(img, warp)
        assert fast.shape == img.shape
        assert float(np.abs(fast - np.clip(affine, 0.0, 1.0)).max()) < 1e-5
    assert not geometry._is_resize(geometry.rotation_warp(width, height, 7.0), width, height)
