"""The tissue fills behind the aperture run on a coarser grid on frames of 250 px and more
(``perturb.ops.optics.fill_factor``): the CPU path and the torch path (what CUDA runs) still
agree within 1/255 there, and the coarse fill changes only the rim band of the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import perturb
from perturb.ops import optics
from perturb.ops.backend import use_backend
from tests.helpers import ENDOSCOPY, downscaled, require_samples, sample_tensor


def _frames(n: int, side: int) -> torch.Tensor:
    """``n`` whole real endoscopy frames (field of view, surround, overlays) as side x side."""
    require_samples()
    out = []
    for path in ENDOSCOPY[:n]:
        img = downscaled(sample_tensor(path), round(side * 1.25))
        _c, h, w = img.shape
        small = min(h, w)
        y, x = (h - small) // 2, (w - small) // 2
        square = img[:, y : y + small, x : x + small][None]
        out.append(torch.nn.functional.interpolate(square, size=(side, side), mode="area")[0])
    return torch.stack(out).clamp(0, 1).contiguous()


def test_fill_factor_keeps_the_finest_fill_one_and_a_half_cells_wide() -> None:
    assert optics.fill_factor(200, 300) == 1  # small frames: the fills on the frame's own grid
    assert optics.fill_factor(288, 384) == 2
    assert optics.fill_factor(512, 512) == 4
    assert optics.fill_factor(1080, 1920) == 8
    for side in (512, 777, 1080, 2160):  # a coarser grid never makes the finest fill narrower
        factor = optics.fill_factor(side, side)
        assert factor > 1
        assert optics.FILL_SIGMAS[0] * side / factor >= optics.FILL_GRID_PX


@pytest.mark.parametrize("op", ["lens_distortion", "chromatic_aberration", "scope_roll"])
def test_torch_path_matches_cpu_path_on_the_coarse_fill_grid(op: str) -> None:
    x = _frames(2, 512)
    assert optics.fill_factor(512, 512) > 1
    cpu, records = perturb.apply(x, op, 5, ["a", "b"])
    with use_backend("torch"):
        torch_path = perturb.replay(records, x)
    assert float((cpu - torch_path).abs().max()) <= 1.0 / 255.0 + 1e-6
    assert not torch.equal(cpu, x)  # the op did act


def test_coarse_fill_matches_the_full_grid_inside_the_clear_aperture() -> None:
    """Where the aperture is clear the radiance is the frame itself; the grid only changes the
    fill beyond it (rim, surround, overlays)."""
    x = _frames(1, 512)[0].numpy()
    from perturb.scene import Scene

    scene = Scene.of(torch.from_numpy(x))
    field = np.asarray(scene.field) > 0.5
    weight = optics.aperture_weight(field, optics.RADIANCE_REACH, framed=True)
    radiance = optics.tissue_radiance(x, weight)
    clear = weight >= 1.0
    assert clear.mean() > 0.5
    assert float(abs(radiance[:, clear] - x[:, clear]).max()) < 1e-6
