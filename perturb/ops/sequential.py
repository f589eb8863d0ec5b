"""Colour break-up of colour-sequential video endoscopes.

* ``color_breakup``: colour-sequential ("RGB sequential") video endoscopes (e.g. the Olympus
  EVIS/Lucera lines with a monochrome CCD) light the mucosa with red, green and blue in turn
  through a rotating filter and read one field per colour; the processor stacks the three fields
  into one frame. The fields are exposed at different instants (a third of a frame apart), so
  when the scope or the tissue moves the three colour images no longer coincide: each is the
  scene displaced along the motion by the distance covered in its field time. Edges and above
  all clipped highlights split into separate red, green and blue copies along the motion (the
  rainbow edges clinicians know from moving the tip quickly). Modelled as the green field as the
  reference and the red and blue fields translated by ``-v`` and ``+v`` (``v = shift`` of the
  shorter side along a keyed direction; the rotating filter's order sets the sign), resampled
  bilinearly in linear light. Blur within one field is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from perturb.ops import _host, _math
from perturb.ops.kernels import Level, Params, draw, register_kernel


def _breakup_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"shift": draw(rng, level["shift"]), "direction": float(rng.uniform(0.0, 2.0 * math.pi))}


def field_offsets(p: dict[str, torch.Tensor], h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) x and y displacement in pixels of the blue field (the red field moves the other
    way): ``shift`` of the shorter side along ``direction``."""
    dist = p["shift"].to(torch.float64) * min(h, w)
    angle = p["direction"].to(torch.float64)
    return (dist * torch.cos(angle)).to(torch.float32), (dist * torch.sin(angle)).to(torch.float32)


@register_kernel("color_breakup", sampler=_breakup_sampler)
def color_breakup(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Red and blue fields displaced by ``-v`` and ``+v`` against the green one (module
    docstring): one batched remap of the red and blue planes in linear light.

    Kornia: own kernel, because the shift must resample exactly as the OpenCV path's
    ``cv2.remap`` (reflect-101 border, its linear weights), which ``_host.remap`` reproduces and
    ``kornia.geometry.transform.translate`` (``grid_sample``, other borders) does not."""
    b, c, h, w = x.shape
    if c != 3:
        return x.clone()
    dx, dy = field_offsets(p, h, w)
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, 1, w)
    lin = _math.srgb_to_linear(x)
    # output pixel q of a field shifted by s shows the scene at q - s
    sign = torch.tensor([1.0, -1.0], device=x.device).view(1, 2, 1, 1)
    off_x = (sign * dx.view(b, 1, 1, 1)).reshape(b * 2, 1, 1)
    off_y = (sign * dy.view(b, 1, 1, 1)).reshape(b * 2, 1, 1)
    planes = lin[:, [0, 2]].reshape(b * 2, 1, h, w)
    map_x, map_y = (xs + off_x).expand(b * 2, h, w), (ys + off_y).expand(b * 2, h, w)
    moved = _host.remap(planes, map_x, map_y, "linear", "reflect101").view(b, 2, h, w)
    out = torch.stack([moved[:, 0], lin[:, 1], moved[:, 1]], dim=1)
    return _math.linear_to_srgb(out).clamp(0.0, 1.0)
