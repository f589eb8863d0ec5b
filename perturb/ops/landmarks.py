"""Chest landmarks found on a radiograph's own pixels, for placing what lies on the patient.

``chest_landmarks`` reduces a batch of films to a ``LANDMARK_GRID`` square (area means) and
finds, in one batched pass on the films' device, the midline, the lung centres, the apex, the
diaphragm domes and the body edges (``LANDMARKS``); a landmark outside its ``PLAUSIBLE`` range
keeps its ``CANONICAL`` value (an average centred PA film). Used by ``xray_support_devices``
(perturb.ops.attenuation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LANDMARK_GRID = 64  # the films are reduced to this square (area means) to find the landmarks


# landmarks (fractions of the width for x, of the height for y): midline, image-left and
# image-right lung centres, lung apex, image-left and image-right diaphragm domes, body edges
# (image left and right) at the upper and at the lower electrode rows
LANDMARKS = (
    "mid",
    "lung_left",
    "lung_right",
    "apex",
    "dome_left",
    "dome_right",
    "body_left_upper",
    "body_right_upper",
    "body_left_lower",
    "body_right_lower",
)


# an average centred PA film (the canonical frame the devices are drawn in), and the range a
# detected landmark must fall in to be used (else the canonical value stands)
CANONICAL = (0.5, 0.3, 0.7, 0.12, 0.66, 0.7, 0.04, 0.96, 0.04, 0.96)


PLAUSIBLE = (
    (0.38, 0.62),
    (0.12, 0.45),
    (0.55, 0.88),
    (0.02, 0.35),
    (0.45, 0.95),
    (0.45, 0.95),
    (0.0, 0.3),
    (0.7, 1.0),
    (0.0, 0.3),
    (0.7, 1.0),
)


def _smooth(profile: torch.Tensor, width: int = 5) -> torch.Tensor:
    """Running mean along the last axis of a (B, n) profile (replicated ends)."""
    pad = width // 2
    padded = F.pad(profile.unsqueeze(1), (pad, pad), mode="replicate")
    return F.avg_pool1d(padded, width, stride=1).squeeze(1)


def chest_landmarks(x: torch.Tensor) -> torch.Tensor:
    """The landmarks of every film of a (B, 1, H, W) batch, (B, 10) float64 in ``LANDMARKS``
    order, found from the pixels in one batched pass over a 64 x 64 reduction:

    * contrast stretched between the 2nd and 98th percentiles of each film;
    * midline: the brightest column (mediastinum and spine) of the mid-thorax rows, within the
      central 30-70 % of the width; refined in the upper thorax between the lungs;
    * lung centres: the darkest column on either side of it, 8-28 % of the width away (not
      farther: the air beside the chest or between an abducted arm and the chest is darker);
    * apex and domes: along a band through each lung centre, the dark run around its darkest
      row, bounded above by the shoulders and clavicles and below by the diaphragm;
    * body edges: along the upper and lower electrode rows, lateral to each lung, the nearest
      column brighter than air (0.22 of the stretched range: the chest wall), then the nearest
      air column beyond it (the skin's edge; black padding and the gap between an abducted arm
      and the chest wall are air); the film's edge where the body fills the film.

    A landmark outside its plausible range (``PLAUSIBLE``; a flat or featureless image) takes
    the canonical film's value (``CANONICAL``). No value is read back to the host."""
    n = LANDMARK_GRID
    b = x.shape[0]
    dev = x.device
    small = F.adaptive_avg_pool2d(x[:, :1].to(torch.float64), (n, n)).view(b, n, n)
    flat = small.view(b, n * n)
    lo = torch.quantile(flat, 0.02, dim=1).view(b, 1, 1)
    hi = torch.quantile(flat, 0.98, dim=1).view(b, 1, 1)
    s = (small - lo) / (hi - lo).clamp(min=1e-6)
    idx = torch.arange(n, device=dev, dtype=torch.float64).view(1, n)
    centre = (idx + 0.5) / n
    neg = torch.tensor(-1e9, dtype=torch.float64, device=dev)
    pos = torch.tensor(1e9, dtype=torch.float64, device=dev)

    columns = _smooth(s[:, n // 4 : 3 * n // 4].mean(dim=1))
    mid0 = centre[0][torch.where((centre > 0.3) & (centre < 0.7), columns, neg).argmax(dim=1)]
    off = centre - mid0.view(b, 1)
    left = centre[0][torch.where((off < -0.08) & (off > -0.28), columns, pos).argmin(dim=1)]
    right = centre[0][torch.where((off > 0.08) & (off < 0.28), columns, pos).argmin(dim=1)]

    def lung_run(lung: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        band = ((centre - lung.view(b, 1)).abs() < 0.05).to(torch.float64).view(b, 1, n)
        rows = _smooth((s * band).sum(dim=2) / band.sum(dim=2).clamp(min=1.0), 3)
        darkest = torch.where((centre > 0.15) & (centre < 0.7), rows, pos).argmin(dim=1)
        low = rows.gather(1, darkest.view(b, 1))
        threshold = low + 0.45 * (rows.amax(dim=1, keepdim=True) - low)
        bright = rows > threshold
        r0 = darkest.view(b, 1).to(torch.float64)
        above = torch.where(bright & (idx < r0), idx, torch.full_like(idx, -1.0)).amax(dim=1)
        below = torch.where(bright & (idx > r0), idx, torch.full_like(idx, n)).amin(dim=1)
        return (above + 1.0) / n, below / n

    apex_left, dome_left = lung_run(left)
    apex_right, dome_right = lung_run(right)
    dome = (dome_left + dome_right) / 2.0
    apex = torch.minimum(torch.minimum(apex_left, apex_right), dome - 0.42)  # lungs are tall
    upper = (centre > apex.view(b, 1)) & (centre < (apex + 0.3 * (dome - apex)).view(b, 1))
    upper_columns = _smooth(
        (s * upper.to(torch.float64).view(b, n, 1)).sum(dim=1)
        / upper.sum(dim=1).view(b, 1).clamp(min=1)
    )
    between = (centre > left.view(b, 1) + 0.04) & (centre < right.view(b, 1) - 0.04)
    mid = centre[0][torch.where(between, upper_columns, neg).argmax(dim=1)]

    def body_edges(row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Lateral to each lung: the nearest column brighter than air (the chest wall), then
        the nearest column beyond it that is air again (the skin's edge; else the film's)."""
        near = ((centre - row.view(b, 1)).abs() < 0.04).to(torch.float64).view(b, n, 1)
        profile = (s * near).sum(dim=1) / near.sum(dim=1).clamp(min=1.0)
        body = profile > 0.22
        none_left, none_right = torch.full_like(idx, -1.0), torch.full_like(idx, n)
        wall = torch.where(body & (centre < left.view(b, 1)), idx, none_left).amax(dim=1)
        edge = torch.where(~body & (idx < wall.view(b, 1)), idx, none_left).amax(dim=1)
        wall_r = torch.where(body & (centre > right.view(b, 1)), idx, none_right).amin(dim=1)
        edge_r = torch.where(~body & (idx > wall_r.view(b, 1)), idx, none_right).amin(dim=1)
        return (edge + 1.0) / n, edge_r / n

    upper_left, upper_right = body_edges(apex + 0.04)
    lower_left, lower_right = body_edges(dome + 0.06)
    found = torch.stack(
        [
            mid,
            left,
            right,
            apex,
            dome_left,
            dome_right,
            upper_left,
            upper_right,
            lower_left,
            lower_right,
        ],
        dim=1,
    )
    bounds = torch.tensor(PLAUSIBLE, dtype=torch.float64, device=dev)
    canonical = torch.tensor(CANONICAL, dtype=torch.float64, device=dev).view(1, -1)
    ok = (found >= bounds[:, 0]) & (found <= bounds[:, 1])
    ok = ok & ((hi - lo).view(b, 1) > 0.05)  # a featureless film: all canonical
    return torch.where(ok, found, canonical)
