"""Host ops that read uint8 batches on their per-sample CPU path (``host_op(dtypes=...)``) give
the bytes of the torch-kernel route (whole batch to float32, torch kernel, torch rounding and
composite): the fast path is an implementation detail, never a change of output. Where the torch
kernel is a batched device kernel (``_host.DEVICE_KERNELS``: the same model in other float
arithmetic, checked against the host function in tests/ops/test_host_kernels.py) a value may round
to the neighbouring level: at most one level, on at most 0.1 % of the values. Real frames,
downscaled so the file runs in seconds; protected (composited, spatial ops on the extended
tissue) and not."""

from __future__ import annotations

import pytest
import torch

import perturb
from perturb.ops import _host, backend
from tests.helpers import ENDOSCOPY, downscaled, require_samples, sample_tensor

U8_HOST_OPS = [
    "specular_glare",
    "surgical_smoke",
    "bubbles",
    "fluid_occlusion",
    "lens_fog",
    "lens_droplets",
    "chromatic_aberration",
    "lens_distortion",
    "scope_roll",
    "interlacing",
    "video_macroblocking",
]


def _batch() -> list[torch.Tensor]:
    """Two real uint8 frames of different sizes and aspect ratios (one sample each)."""
    require_samples()
    frames = []
    for path, side in ((ENDOSCOPY[0], 240), (ENDOSCOPY[-1], 200)):
        small = downscaled(sample_tensor(path), side)
        frames.append((small * 255).round().to(torch.uint8).unsqueeze(0).contiguous())
    return frames


@pytest.mark.parametrize("op", U8_HOST_OPS)
def test_uint8_cpu_path_gives_the_bytes_of_the_torch_route(op: str) -> None:
    assert backend.cpu_path(op, torch.uint8) is not None, (
        f"{op} no longer reads uint8 on its CPU path"
    )
    for i, x in enumerate(_batch()):
        for severity, protect in ((2, True), (5, True), (5, False)):
            fast, _ = perturb.apply(x, op, severity, [f"f{i}"], seed=3, protect_border=protect)
            with backend.use_backend("torch"):
                slow, _ = perturb.apply(x, op, severity, [f"f{i}"], seed=3, protect_border=protect)
            assert fast.dtype == torch.uint8
            diff = (fast.int() - slow.int()).abs()
            if op in _host.DEVICE_KERNELS:
                assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 1e-3, (
                    f"{op} sev {severity} protect={protect} frame {i}: {int((diff > 0).sum())} values "
                    f"differ, max {int(diff.max())} levels"
                )
            else:
                assert torch.equal(fast, slow), (
                    f"{op} sev {severity} protect={protect} frame {i}: {int((diff > 0).sum())} values differ, "
                    f"max {int(diff.max())} levels"
                )
            if severity == 5:
                assert not torch.equal(fast, x), (
                    f"{op} sev 5: output equals the input (nothing checked)"
                )
