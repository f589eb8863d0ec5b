"""CMOS sensor defects of a video endoscope, modelled on the sensor's pixels (the grain grid of
perturb.ops.grain: ``GRAIN_CELLS`` cells across the field of view's extent, so a defect or a
band is the same fraction of the field at any frame size) and in linear light (the raw signal,
before the processor's gamma).

* ``sensor_defects``: the fixed pattern of one device. Defective photosites (EMVA Standard
  1288, release 4.0, 2021: DSNU/PRNU outliers; Chapman et al., "Empirical formula for rates of
  hot pixel defects based on pixel size, sensor area, and ISO", Proc. SPIE 8659, 2013: hot
  pixels accumulate with a sensor's age, dark signal long-tailed): *hot* pixels add a dark
  signal (exponentially distributed, capped at 4x its mean), *stuck* pixels read a fixed
  level whatever the light, *dead* pixels barely respond (5 % of the signal). Each defect is
  one photosite behind one filter of the Bayer mosaic (R 1/4, G 1/2, B 1/4), so after
  demosaicing it shows as a red, green or blue dot, not a white one. Column fixed-pattern
  noise: each column's readout amplifier has its own offset and gain (Gow et al., "A
  comprehensive tool for modeling CMOS image-sensor-noise performance", IEEE Trans. Electron
  Devices 54(6), 2007; El Gamal and Eltoukhy, "CMOS image sensors", IEEE Circuits and Devices
  21(3), 2005): offset sigma ``column_fpn`` (linear), gain sigma ``column_fpn``: faint
  vertical stripes, clearest in the dark lumen.

  Declared exception to per-sample keying: a device's defects stay put along its video, so
  the map is keyed by a *sensor identity*, not by the frame: ``sensor`` (24 bits) derives from
  (seed, variant) (``sensor_identity``, registered as the op's ``device_params``), so every
  frame of a run (a split generated with one seed) shares one sensor and variant k is another
  endoscope. ``sensor`` is recorded among the parameters: replay needs nothing else. The
  severity scales density, dark signal and column noise of that one map; the defects at a
  lower severity are a subset of those at a higher one (the same uniforms against a higher
  density).

* ``row_banding``: rolling readout. A CMOS sensor reads its rows one after another, so an
  illumination that ripples at the mains or the LED driver's frequency is sampled at a
  different phase on each row: horizontal bands, multiplicative in linear light (Poplin, "An
  automatic flicker detection method for embedded camera systems", IEEE Trans. Consumer
  Electronics 52(2), 2006), plus the readout's temporal row noise, an additive offset per row
  (Gow et al. 2007). Both vary from frame to frame: the phase, the band period (a fraction of
  the frame height) and the row noise follow the frame's own key.

Both kernels are batched (one set of tensor operations for the batch; the sensor keys come
from the records on the host, ``host_params``, never read back from the device). The CPU path
runs the same torch arithmetic on the sample's grid (perturb.ops.grain), so both paths see the
same grid values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from perturb import rng
from perturb.ops import backend, keyed_fields
from perturb.ops._math import linear_to_srgb, per_sample, srgb_to_linear
from perturb.ops.grain import grain_cpu, grain_kernel
from perturb.ops.kernels import register_kernel

SENSOR_BITS = 24  # the recorded sensor identity is an integer float32 holds exactly
HOT_SHARE, STUCK_SHARE = 0.6, 0.15  # of the defective photosites; the rest are dead
DEAD_RESPONSE = 0.05
HOT_CAP = 4.0  # the dark signal's cap, in multiples of its mean
STUCK_RANGE = (0.3, 1.0)  # linear level a stuck photosite reads
BAYER_SHARES = (0.25, 0.75)  # cumulative: red below 0.25, green below 0.75, blue above
COLUMN_GAIN_PER_OFFSET = 1.0


def sensor_identity(seed: int, variant: int) -> dict[str, int]:
    """The sensor of a run: a 24-bit identity from (seed, variant), shared by all its frames."""
    key = rng.derive_key(int(seed), "<sensor>", "sensor_defects", 0, int(variant))
    return {"sensor": key >> (64 - SENSOR_BITS)}


def _sensor_keys(host_params: Sequence[Mapping[str, Any]]) -> list[int]:
    return [rng.sub_key(int(hp["sensor"]), "sensor_defects") for hp in host_params]


def _defect_pixels(
    x: torch.Tensor, p: dict[str, torch.Tensor], host_params: Sequence[Mapping[str, Any]]
) -> torch.Tensor:
    """Per-pixel model of ``sensor_defects`` on the grid ``x`` (B, C, gh, gw)."""
    c, gh, gw = x.shape[1:]
    keys = _sensor_keys(host_params)
    site = keyed_fields.uniform_fields(keys, "sensor_defects/site", (1, gh, gw), x.device)
    kind = keyed_fields.uniform_fields(keys, "sensor_defects/kind", (1, gh, gw), x.device)
    colour = keyed_fields.uniform_fields(keys, "sensor_defects/colour", (1, gh, gw), x.device)
    level = keyed_fields.uniform_fields(keys, "sensor_defects/level", (1, gh, gw), x.device)
    column = keyed_fields.normal_fields(keys, "sensor_defects/column", (2, 1, gw), x.device)
    fpn = per_sample(p["column_fpn"])
    lin = srgb_to_linear(x)
    lin = lin * (1.0 + COLUMN_GAIN_PER_OFFSET * fpn * column[:, 1:2]) + fpn * column[:, 0:1]
    defective = site < per_sample(p["defect_density"])
    if c == 3:
        channel = (colour >= BAYER_SHARES[0]).to(torch.int64) + (colour >= BAYER_SHARES[1]).to(torch.int64)
        index = torch.arange(3, device=x.device).view(1, 3, 1, 1)
        defective = defective & (channel == index)
    hot = defective & (kind < HOT_SHARE)
    stuck = defective & (kind >= HOT_SHARE) & (kind < HOT_SHARE + STUCK_SHARE)
    dead = defective & (kind >= HOT_SHARE + STUCK_SHARE)
    dark = per_sample(p["defect_strength"]) * (-torch.log(level)).clamp(max=HOT_CAP)
    lin = torch.where(hot, lin + dark, lin)
    lin = torch.where(stuck, STUCK_RANGE[0] + (STUCK_RANGE[1] - STUCK_RANGE[0]) * level, lin)
    lin = torch.where(dead, lin * DEAD_RESPONSE, lin)
    return linear_to_srgb(lin.clamp(0.0, 1.0))


def _banding_pixels(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Per-pixel model of ``row_banding`` on the grid ``x`` (B, C, gh, gw)."""
    gh = x.shape[-2]
    rows = (torch.arange(gh, device=x.device, dtype=torch.float32) + 0.5) / gh
    phase = rows.view(1, 1, gh, 1) / per_sample(p["period"]) + per_sample(p["phase"])
    ripple = 1.0 + per_sample(p["amplitude"]) * torch.sin(2.0 * math.pi * phase)
    row_noise = keyed_fields.normal_fields(keys, "row_banding/rows", (1, gh, 1), x.device)
    lin = srgb_to_linear(x) * ripple + per_sample(p["row_noise"]) * row_noise
    return linear_to_srgb(lin.clamp(0.0, 1.0))


def sensor_defects(
    x: torch.Tensor,
    p: dict[str, torch.Tensor],
    keys: Sequence[int],
    host_params: Sequence[Mapping[str, Any]] = (),
) -> torch.Tensor:
    """Kornia: own kernel: Kornia has no sensor defect model; the map is keyed per sensor."""
    return _defect_pixels(x, p, host_params)


def row_banding(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Kornia: own kernel: Kornia has no rolling-readout model; the row noise is keyed per frame."""
    return _banding_pixels(x, p, keys)


def _host_sample(src: np.ndarray, p: dict[str, np.ndarray]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = torch.from_numpy(np.ascontiguousarray(src, dtype=np.float32)).unsqueeze(0)
    return x, {k: torch.tensor([float(v)], dtype=torch.float32) for k, v in p.items()}


def sensor_defects_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """One float32 sample on its grid, with the kernel's torch arithmetic (the identity comes
    from the sample's own ``sensor`` parameter)."""
    x, tp = _host_sample(src, p)
    out = _defect_pixels(x, tp, [{"sensor": int(p["sensor"])}])
    np.copyto(dst, out[0].numpy())


def row_banding_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """One float32 sample on its grid, with the kernel's torch arithmetic."""
    x, tp = _host_sample(src, p)
    np.copyto(dst, _banding_pixels(x, tp, [key])[0].numpy())


register_kernel("sensor_defects", host_params=True, device_params=sensor_identity)(grain_kernel(sensor_defects))
backend.register_cpu("sensor_defects")(grain_cpu(sensor_defects_cpu))
register_kernel("row_banding")(grain_kernel(row_banding))
backend.register_cpu("row_banding")(grain_cpu(row_banding_cpu))
