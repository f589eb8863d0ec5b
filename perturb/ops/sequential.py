"""Colour break-up of colour-sequential video endoscopes.

* ``color_breakup``: colour-sequential ("RGB sequential") video endoscopes (e.g. the Olympus
  EVIS lines with a monochrome CCD) light the mucosa with red, green and blue in turn through a
  rotating filter wheel and read one monochrome field per colour; the processor builds a frame
  from the fields it stored. The fields are exposed at different instants, and one stored frame
  integrates several field cycles (R, G, B, R, G, B, ...: the wheel turns faster than the frame
  rate, and interlaced frames hold two video fields). When the scope moves, each field shows the
  scene displaced by the distance travelled up to its instant, so a bright structure (a clipped
  highlight, a bright edge) leaves a comb of separate copies along the motion, one per field,
  in the repeating colour order (R, G, B, R, G, B: on red mucosa the red copies barely show and
  the trail alternates green and blue/magenta), while the tissue itself, the sum of the shifted
  copies, looks motion-blurred. The real frames this models are the EAD2019 "artifact" boxes of
  moving colour-sequential scopes (benchmarks/realism/reference_set.csv rows breakup_*): trails
  of 4-6 copies spaced about a field's travel apart.

  Modelled per sample: the scene moves by ``travel`` (fraction of the shorter side) during the
  frame along a keyed direction, on the same curved, accelerating path as ``motion_blur``
  (``perturb.ops.blur.trajectory_offsets``: ``bend``, ``accel``); the frame holds ``cycles``
  (2 or 3, keyed) field cycles, field j (channel j mod 3) exposed for ``FIELD_DUTY`` of its slot
  around t = (j + 1/2) / (3 cycles); each channel is the mean of its fields, each the scene
  radiance (sRGB decoded, clipped highlights with their headroom above the sensor's clip,
  ``perturb.ops.exposure.highlight_headroom``) sampled at its offsets along the path (bilinear),
  clipped at the sensor's full well and re-encoded; the frame's own sensor noise is re-injected
  on top (``perturb.ops.blur.noise_gain``), as for ``motion_blur``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from perturb.ops import _math
from perturb.ops.blur import (
    ACCEL_RANGE,
    BEND_RANGE,
    TRAJECTORY_REACH,
    add_shot_noise,
    noise_gain,
    retained_variance,
    splat_psf,
    trajectory_offsets,
)
from perturb.ops.exposure import highlight_headroom
from perturb.ops.kernels import Level, Params, draw, register_kernel

FIELD_DUTY = 0.4  # a field's exposure: this share of its slot (the light pulse of one filter)
FIELD_POINTS = 4  # time samples per field exposure
MAX_CYCLES = 3
CYCLE_CHOICES = (2.0, 3.0)
NOISE_STREAM = "color_breakup/sensor_noise"
TRAVEL_BOUND = 0.15  # the catalog's bound of ``travel``: the comb PSF's support (noise share)


def _breakup_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "travel": draw(rng, level["travel"]),
        "direction": float(rng.uniform(0.0, 2.0 * math.pi)),
        "cycles": float(CYCLE_CHOICES[int(rng.integers(len(CYCLE_CHOICES)))]),
        "bend": float(rng.uniform(*BEND_RANGE)),
        "accel": float(rng.uniform(*ACCEL_RANGE)),
    }


def field_times(cycles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Times in [0, 1] of each sample's time points (B, 3, MAX_CYCLES * FIELD_POINTS) per
    channel (red, green, blue: fields 0, 1, 2 of each cycle) and their weights (1 / (cycles
    FIELD_POINTS) for the sample's cycles, 0 for cycles past them), float64."""
    f64 = torch.float64
    n = cycles.to(f64).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
    channel = torch.arange(3, dtype=f64, device=cycles.device).view(1, 3, 1, 1)
    cycle = torch.arange(MAX_CYCLES, dtype=f64, device=cycles.device).view(1, 1, MAX_CYCLES, 1)
    point = (torch.arange(FIELD_POINTS, dtype=f64, device=cycles.device) + 0.5) / FIELD_POINTS
    slot = 3.0 * cycle + channel + 0.5 + FIELD_DUTY * (point.view(1, 1, 1, -1) - 0.5)
    times = (slot / (3.0 * n)).clamp(0.0, 1.0)
    weight = torch.where(cycle < n, 1.0 / (n * FIELD_POINTS), torch.zeros_like(slot))
    b = cycles.shape[0]
    return times.reshape(b, 3, -1), weight.expand(b, 3, MAX_CYCLES, FIELD_POINTS).reshape(b, 3, -1)


def _reflect101(index: torch.Tensor, size: int) -> torch.Tensor:
    """OpenCV's BORDER_REFLECT_101 of integer pixel indices (any distance outside)."""
    if size == 1:
        return torch.zeros_like(index)
    period = 2 * (size - 1)
    folded = torch.remainder(index, period)
    return torch.where(folded >= size, period - folded, folded)


def translate_planes(planes: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """(N, H, W) planes, each read at (x - dx[n], y - dy[n]) with bilinear weights and
    reflect-101 borders (as ``cv2.remap`` of a translation): a translation is separable, so one
    linear interpolation along x (two gathers of columns) and one along y (two reads of whole
    rows)."""
    n, h, w = planes.shape
    xs = torch.arange(w, device=planes.device, dtype=torch.float64).view(1, w) - dx.view(n, 1).double()
    ys = torch.arange(h, device=planes.device, dtype=torch.float64).view(1, h) - dy.view(n, 1).double()
    x0, y0 = torch.floor(xs), torch.floor(ys)
    fx = (xs - x0).to(planes.dtype).view(n, 1, w)
    fy = (ys - y0).to(planes.dtype).view(n, h, 1)
    ix0, iy0 = x0.to(torch.int64), y0.to(torch.int64)

    def cols(index: torch.Tensor) -> torch.Tensor:
        return planes.gather(2, _reflect101(index, w).view(n, 1, w).expand(n, h, w))

    along = cols(ix0).mul_(1.0 - fx).add_(cols(ix0 + 1).mul_(fx))  # in place: the same sums

    plane = torch.arange(n, device=planes.device).view(n, 1)

    def rows(index: torch.Tensor) -> torch.Tensor:
        # whole rows by advanced indexing (the same values as a gather along dim 1 with the
        # index expanded over the columns, about 3x cheaper on a CPU)
        return along[plane, _reflect101(index, h)]

    return rows(iy0).mul_(1.0 - fy).add_(rows(iy0 + 1).mul_(fy))


@register_kernel("color_breakup", sampler=_breakup_sampler)
def color_breakup(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Each channel the mean of its fields along the keyed path (module docstring): one batched
    remap of the three planes per time point (``MAX_CYCLES * FIELD_POINTS`` of them, whatever
    the batch), radiance with highlight headroom, clipped, re-encoded, the frame's noise on top.

    Kornia: own kernel, because the per-field shifts are separable bilinear translations with
    reflect-101 borders (``translate_planes``: two row/column gathers per shift, per-sample
    offsets in one call), cheaper than ``kornia.geometry.transform.translate``'s full
    ``grid_sample`` per shift, whose borders differ."""
    b, c, h, w = x.shape
    if c != 3:
        return x.clone()
    side = min(h, w)
    times, weights = field_times(p["cycles"])
    angle = torch.rad2deg(p["direction"].to(torch.float64))
    off_x, off_y = trajectory_offsets(
        times.reshape(b, -1), p["travel"].to(torch.float64) * side, angle, p["bend"], p["accel"]
    )
    steps = times.shape[-1]
    off_x, off_y = off_x.view(b, 3, steps), off_y.view(b, 3, steps)
    weights = weights.to(x.dtype)
    lin = _math.srgb_to_linear(x) * highlight_headroom(x).to(x.dtype)
    planes = lin.reshape(b * 3, h, w)
    acc = torch.zeros_like(lin)
    for i in range(steps):  # time points of the field sequence, not samples
        # output pixel q of a field in which the scene has moved by s shows the scene at q - s
        moved = translate_planes(planes, off_x[:, :, i].reshape(-1), off_y[:, :, i].reshape(-1))
        acc.add_(moved.view(b, 3, h, w).mul_(weights[:, :, i].view(b, 3, 1, 1)))  # in place
    sensed = acc.clamp(0.0, 1.0)
    # the share of the frame's own (correlated) noise the mean of the shifted copies keeps: that
    # of the comb's PSF, the copies' points splatted (``retained_variance``)
    reach = TRAJECTORY_REACH * TRAVEL_BOUND * side + 1.0
    support = max(1, math.ceil(reach))
    comb = splat_psf(off_x.reshape(b * 3, steps), off_y.reshape(b * 3, steps),
                     (weights > 0).reshape(b * 3, steps).double(), support)
    retained = retained_variance(comb).view(b, 3)
    noisy = add_shot_noise(sensed, noise_gain(x, retained), keys, NOISE_STREAM)
    return _math.linear_to_srgb(noisy).clamp(0.0, 1.0)
