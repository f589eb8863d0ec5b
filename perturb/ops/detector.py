"""The image receptor of projection radiography: anti-scatter grid and flat-panel detector.

Acting on the linear fluence ``I`` (perturb.ops.radiometry; after Bushberg et al. ch. 7-8 and,
for the flat-panel defects, Padgett & Kotre, Br J Radiol 77 (2004)):

* ``xray_grid_lines``: an anti-scatter grid of 40-80 lines/cm, ``I (1 - a s(x))``, point-sampled
  by the detector so frequencies above Nyquist alias into a low-frequency moire pattern (the
  shorter side spans ``FIELD_CM``).
* ``xray_grid_cutoff``: a focused grid used off focus / upside down (transmission falling with
  the lateral distance from the grid centre, both sides) or decentred (one side), as
  ``1 - loss |x - c|`` on the fluence (Bushberg 7.5: lost fraction ~ ratio x |1/f0 - 1/f1|).
* ``xray_detector_defects``: uncorrected flat-panel defects: dead (white) and hot (black)
  pixels, dead lines (a row or column without signal, or with half gain), and the seam between
  detector tiles with a gain mismatch across it.

Modality is catalog data, not this module's name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from perturb import rng
from perturb.ops import backend, keyed_fields
from perturb.ops._math import per_sample
from perturb.ops.kernels import Level, Params, draw, draw_int, draw_sign, register_kernel
from perturb.ops.radiometry import (
    ALL_DTYPES,
    FIELD_CM,
    MU,
    _apply_shift,
    _coords,
    _host_params,
    _wide,
    scale_linear,
)


def _grid_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "strength": draw(rng_, level["strength"]),
        "lines_per_cm": draw(rng_, level["lines_per_cm"]),
        "angle": draw(rng_, level["angle"]),
        "phase": float(rng_.random()),
        "vertical": float(rng_.random() < 0.5),
    }


def grid_pattern(h: int, w: int, p: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Lead-strip shadow ``s`` in [0, 1] (B,1,H,W, float64), point-sampled at pixel centres:
    ``0.5 (1 + cos 2 pi (f u + phase))`` with ``f`` in cycles/pixel (above Nyquist it aliases)."""
    side = min(h, w)
    ys = (torch.arange(h, device=device, dtype=torch.float64) + 0.5 - h / 2).view(1, 1, h, 1)
    xs = (torch.arange(w, device=device, dtype=torch.float64) + 0.5 - w / 2).view(1, 1, 1, w)
    theta = torch.deg2rad(per_sample(p["angle"]).double()) + per_sample(p["vertical"]).double() * (
        math.pi / 2
    )
    freq = per_sample(p["lines_per_cm"]).double() * (FIELD_CM / side)  # cycles per pixel
    # phase = f (x cos t + y sin t) + phase0, split into a row term and a column term (each
    # reduced mod 1) so that cos(a + b) = cos a cos b - sin a sin b costs two outer products.
    a = xs * (freq * torch.cos(theta))
    b = ys * (freq * torch.sin(theta)) + per_sample(p["phase"]).double()
    a = (a - torch.floor(a)) * (2.0 * math.pi)
    b = (b - torch.floor(b)) * (2.0 * math.pi)
    s = torch.cos(a) * torch.cos(b)  # ((1 + cos a cos b) - sin a sin b) * 0.5, in place
    return s.add_(1.0).sub_(torch.sin(a) * torch.sin(b)).mul_(0.5)


def grid_gain(h: int, w: int, p: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Transmitted fraction ``1 - a s`` of the grid (B,1,H,W, float64)."""
    return grid_pattern(h, w, p, device).mul_(per_sample(p["strength"]).double()).neg_().add_(1.0)


@register_kernel("xray_grid_lines", sampler=_grid_sampler)
def xray_grid_lines(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Kornia: own kernel: no Kornia equivalent (an analytic anti-scatter grid pattern multiplied
    on the fluence)."""
    return scale_linear(x, grid_gain(x.shape[-2], x.shape[-1], p, x.device))


@backend.register_cpu("xray_grid_lines", dtypes=ALL_DTYPES)
def xray_grid_lines_cpu(
    src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int
) -> None:
    gain = grid_gain(src.shape[-2], src.shape[-1], _host_params(p), torch.device("cpu"))
    _apply_shift(src, dst, gain.log_().div_(MU)[0, 0].numpy())


def _cutoff_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "loss": draw(rng_, level["loss"]),
        "centre": draw(rng_, level["centre"]) * draw_sign(rng_),
        "decentred": float(rng_.random() < 0.35),
    }


def cutoff_gain(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Transmitted fraction (B,1,1,W float64) of a misused focused grid with vertical lead
    strips, ``u`` the lateral position in [-1, 1]: off focus / upside down
    ``1 - loss |u - centre|`` (both sides), decentred ``1 - loss (u - centre + 1) / 2``
    (one side); at least 0.05."""
    _, xs = _coords(x)
    u = xs / (x.shape[-1] / 2.0)
    c = per_sample(p["centre"]).double()
    both = (u - c).abs()
    one = ((u - c) + 1.0) / 2.0
    dec = per_sample(p["decentred"]).double()
    shape = both * (1.0 - dec) + one * dec
    return (1.0 - per_sample(p["loss"]).double() * shape).clamp_(min=0.05)


@register_kernel("xray_grid_cutoff", sampler=_cutoff_sampler)
def xray_grid_cutoff(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Grid cut-off: lateral density fall-off on the fluence (see ``cutoff_gain``).

    Kornia: own kernel: no Kornia equivalent (an analytic lateral fall-off of the fluence)."""
    return scale_linear(x, cutoff_gain(x, p))


def _defects_sampler(rng_: np.random.Generator, level: Level) -> Params:
    return {
        "dead_fraction": draw(rng_, level["dead_fraction"]),
        "lines": draw_int(rng_, level["lines"]),
        "seam_gain": draw(rng_, level["seam_gain"]) * draw_sign(rng_),
    }


MAX_LINES = 8  # candidate dead lines drawn per film (the catalog's bound on ``lines``)


def defect_lines(key: int, h: int, w: int, n: int) -> list[tuple[bool, int, bool]]:
    """The film's first ``n`` dead lines: (is a column, index, dead rather than half gain)."""
    g = rng.scalar_rng(rng.sub_key(key, "xray_detector_defects/lines"))
    out = []
    for _ in range(MAX_LINES):
        column = bool(g.random() < 0.6)
        index = int(g.integers(0, w if column else h))
        out.append((column, index, bool(g.random() < 0.5)))
    return out[:n]


@register_kernel("xray_detector_defects", sampler=_defects_sampler)
def xray_detector_defects(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """Uncorrected flat-panel defects. The panel is two tiles side by side with a seam at the
    centre column: the right tile's gain is ``1 + seam_gain`` (a display step of
    ``-ln(1 + g) / MU``) and the seam column has no signal. Dead lines: a row or column with no
    signal (white) or half gain. Dead pixels: a keyed ``dead_fraction`` of pixels, half without
    signal (white), half saturated (hot, black).

    Kornia: own kernel: no Kornia equivalent (keyed dead lines and tile seams)."""
    return backend.by_path(
        x, host=lambda: _defects_host(x, p, keys), device=lambda: _defects_batched(x, p, keys)
    )


def _defects_host(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """The CPU path of ``xray_detector_defects``, one sample at a time (its bytes are pinned)."""
    h, w = x.shape[-2:]
    out = []
    for i, k in enumerate(keys):
        v = _wide(x[i])
        seam = w // 2
        step = math.log1p(float(p["seam_gain"][i])) / MU
        v = torch.cat([v[..., :seam], v[..., seam:] - step], dim=-1)
        v[..., seam] = 1.0
        for column, index, dead in defect_lines(int(k), h, w, round(float(p["lines"][i]))):
            line = v[..., index] if column else v[..., index, :]
            line.copy_(torch.ones_like(line) if dead else line + math.log(2.0) / MU)
        u = rng.uniform_field(
            int(k), "xray_detector_defects/pixels", tuple(x.shape[1:]), x.device
        ).double()
        frac = float(p["dead_fraction"][i])
        v = torch.where(u < frac / 2, torch.ones_like(v), v)
        v = torch.where((u >= frac / 2) & (u < frac), torch.zeros_like(v), v)
        out.append(v.clamp_(0.0, 1.0).to(x.dtype))
    return torch.stack(out)


def _defects_batched(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]
) -> torch.Tensor:
    """``_defects_host`` for the whole batch at once. Each film's candidate dead lines come
    from its key on the host (``defect_lines``) as a (B, MAX_LINES) table; the first ``lines``
    are valid. A pixel on any valid dead line is white; otherwise each half-gain line through
    it adds ``ln 2 / MU`` (the host applies them one after the other: the same values, up to
    float64 rounding where two half-gain lines cross)."""
    b = x.shape[0]
    h, w = x.shape[-2:]
    dev = x.device
    v = _wide(x)
    seam = w // 2
    cols = torch.arange(w, device=dev).view(1, 1, 1, w)
    step = per_sample(torch.log1p(p["seam_gain"].double()) / MU)
    v = torch.where(cols >= seam, v - step, v)
    v = torch.where(cols == seam, torch.ones_like(v), v)
    table = torch.tensor(
        [defect_lines(int(k), h, w, MAX_LINES) for k in keys], dtype=torch.int64, device=dev
    ).view(b, MAX_LINES, 3)
    valid = torch.arange(MAX_LINES, device=dev).view(1, -1) < torch.round(p["lines"]).view(b, 1)
    column, index, dead = table[..., 0] > 0, table[..., 1], table[..., 2] > 0

    def hits(is_axis: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, size) dead-line cover and half-gain line count along one axis."""
        on = (valid & is_axis).unsqueeze(-1) & (
            index.unsqueeze(-1) == torch.arange(size, device=dev).view(1, 1, size)
        )
        return (on & dead.unsqueeze(-1)).any(dim=1), (on & ~dead.unsqueeze(-1)).sum(dim=1)

    dead_rows, half_rows = hits(~column, h)
    dead_cols, half_cols = hits(column, w)
    white = dead_rows.view(b, 1, h, 1) | dead_cols.view(b, 1, 1, w)
    halves = half_rows.view(b, 1, h, 1) + half_cols.view(b, 1, 1, w)
    v = torch.where(white, torch.ones_like(v), v + halves.to(v.dtype) * (math.log(2.0) / MU))
    u = keyed_fields.uniform_fields(keys, "xray_detector_defects/pixels", tuple(x.shape[1:]), dev).double()
    frac = per_sample(p["dead_fraction"].double())
    v = torch.where(u < frac / 2, torch.ones_like(v), v)
    v = torch.where((u >= frac / 2) & (u < frac), torch.zeros_like(v), v)
    return v.clamp_(0.0, 1.0).to(x.dtype)
