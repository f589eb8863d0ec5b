"""The sensor-defect ops (perturb.ops.sensor) against their physics: a fixed defect map per
sensor identity (not per frame), single-photosite colour defects, column offsets; row banding
as a row-wise ripple of the light in linear light that changes every frame."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import perturb
from perturb.contracts.record import Record
from perturb.ops import sensor
from perturb.ops._math import srgb_to_linear
from perturb.ops.grain import GRAIN_CELLS


def _flat(value: float, h: int = GRAIN_CELLS, w: int = 560) -> torch.Tensor:
    return torch.full((1, 3, h, w), value)


def _defects(x: torch.Tensor, key: str, seed: int = 0, variant: int = 0) -> tuple[torch.Tensor, Record]:
    out, rec = perturb.apply(x, "sensor_defects", 5, [key], seed=seed, variant=variant, protect_border=False)
    return out, rec[0]


def test_defect_map_stays_put_across_frames_of_one_sensor_and_changes_with_the_device() -> None:
    x = _flat(0.2)
    a, rec_a = _defects(x, "frame-0001")
    b, rec_b = _defects(x, "frame-0002")
    assert rec_a.key != rec_b.key and rec_a.params["sensor"] == rec_b.params["sensor"]
    assert rec_a.params["sensor"] == sensor.sensor_identity(0, 0)["sensor"]
    sites_a = (a - x).abs().amax(1) > 0.05
    sites_b = (b - x).abs().amax(1) > 0.05
    assert int(sites_a.sum()) > 50
    assert torch.equal(sites_a, sites_b), "the same sensor puts its defects at the same pixels"
    for seed, variant in ((1, 0), (0, 1)):
        c, rec_c = _defects(x, "frame-0001", seed=seed, variant=variant)
        assert rec_c.params["sensor"] != rec_a.params["sensor"]
        overlap = (sites_a & ((c - x).abs().amax(1) > 0.05)).sum() / sites_a.sum()
        assert float(overlap) < 0.1, "another seed or variant is another sensor"
    # bit-exact replay from the record alone (the sensor identity travels in the params)
    again = perturb.replay([Record.from_json(json.dumps(json.loads(rec_a.to_json())))], x)
    assert torch.equal(again, a)


def test_defects_are_single_photosites_of_the_bayer_mosaic_at_the_tabled_density() -> None:
    """On a frame of the sensor's size with the column noise off: the defective fraction is the
    density, each defect changes one colour channel (R:G:B about 1:2:1), hot pixels add light in
    linear light, dead ones take it away."""
    x = _flat(0.4)
    params = {"defect_density": 0.004, "defect_strength": 0.3, "column_fpn": 0.0, "sensor": 12345}
    out = sensor.sensor_defects(x, {k: torch.tensor([float(v)]) for k, v in params.items()}, [0], host_params=[params])
    lin_in, lin_out = srgb_to_linear(x), srgb_to_linear(out)
    changed = (lin_out - lin_in).abs() > 1e-4
    per_pixel = changed.sum(1)
    n = per_pixel.numel()
    assert int(per_pixel.max()) == 1, "a defect is one photosite: one channel"
    assert float((per_pixel > 0).float().mean()) == pytest.approx(0.004, abs=4 * np.sqrt(0.004 / n))
    shares = changed.sum((0, 2, 3)).double() / changed.sum()
    assert shares.tolist() == pytest.approx([0.25, 0.5, 0.25], abs=0.06)
    delta = (lin_out - lin_in)[changed]
    brighter = float((delta > 0).double().mean())
    assert brighter == pytest.approx(sensor.HOT_SHARE + sensor.STUCK_SHARE * 0.75, abs=0.08)
    dead = delta[delta < 0]
    assert torch.allclose(dead, torch.full_like(dead, float(lin_in.flatten()[0]) * (sensor.DEAD_RESPONSE - 1)), atol=1e-5)


def test_column_noise_is_a_fixed_offset_and_gain_per_column() -> None:
    x = _flat(0.1)
    params = {"defect_density": 0.0, "defect_strength": 0.1, "column_fpn": 0.004, "sensor": 99}
    p = {k: torch.tensor([float(v)]) for k, v in params.items()}
    out = sensor.sensor_defects(x, p, [0], host_params=[params])
    diff = (srgb_to_linear(out) - srgb_to_linear(x))[0, 0].double()
    assert float(diff.std(0).max()) < 1e-6, "constant down each column"
    level = float(srgb_to_linear(x).flatten()[0])
    expected = 0.004 * np.sqrt(1 + level**2)  # offset sigma f plus gain sigma f times the level
    assert float(diff[0].std()) == pytest.approx(expected, rel=0.1)
    other = sensor.sensor_defects(x, p, [0], host_params=[{**params, "sensor": 100}])
    assert not torch.equal(other, out)


def test_row_banding_ripples_the_light_row_by_row_and_changes_per_frame() -> None:
    """Without row noise each row's linear light is the clean light times 1 + A sin(2 pi (y /
    period + phase)) (y the row centre as a fraction of the height); the phase follows the frame."""
    x = _flat(0.5)
    out, recs = perturb.apply(
        torch.cat([x, x]), "row_banding", 5, ["frame-a", "frame-b"], protect_border=False
    )
    assert recs[0].params["phase"] != recs[1].params["phase"]
    assert not torch.equal(out[0], out[1])
    p = {k: torch.tensor([float(v)]) for k, v in recs[0].params.items()}
    p["row_noise"] = torch.tensor([0.0])
    pixel = sensor.row_banding(x, p, [0])
    ratio = (srgb_to_linear(pixel) / srgb_to_linear(x))[0, 0, :, 0].double().numpy()
    rows = (np.arange(x.shape[-2]) + 0.5) / x.shape[-2]
    prm = recs[0].params
    model = 1 + prm["amplitude"] * np.sin(2 * np.pi * (rows / prm["period"] + prm["phase"]))
    assert np.allclose(ratio, model, atol=2e-5)
    # with row noise: each row shifted by one offset, the rows' offsets of sigma row_noise
    noisy = sensor.row_banding(x, {**p, "amplitude": torch.tensor([0.0]), "row_noise": torch.tensor([0.002])}, [3])
    shift = (srgb_to_linear(noisy) - srgb_to_linear(x))[0, 0].double()
    assert float(shift.std(1).max()) < 1e-6
    assert float(shift[:, 0].std()) == pytest.approx(0.002, rel=0.1)


@pytest.mark.parametrize("op", ["sensor_defects", "row_banding"])
def test_sensor_ops_keep_their_strength_when_the_frame_is_resized(op: str) -> None:
    """Defects and bands live on the sensor's pixels: a 1080x1440 frame perturbed then averaged to
    448 px changes as much as the frame perturbed at 448 px."""
    big = torch.full((1, 3, 1080, 1440), 0.15)
    small = torch.full((1, 3, 448, 597), 0.15)
    out_big, _ = perturb.apply(big, op, 5, ["k"], protect_border=False)
    out_small, _ = perturb.apply(small, op, 5, ["k"], protect_border=False)
    seen = torch.nn.functional.interpolate(out_big, size=(448, 597), mode="area")
    assert float((seen - 0.15).abs().mean()) == pytest.approx(float((out_small - 0.15).abs().mean()), rel=0.15)
