"""Chest landmarks found on a radiograph's own pixels, for placing what lies on the patient.

``chest_landmarks`` reduces a batch of films to a ``LANDMARK_GRID`` square (area means) and
finds, in one batched pass on the films' device, the midline, the lung centres, the apex, the
diaphragm domes and the body edges (``LANDMARKS``); a landmark outside its ``PLAUSIBLE`` range
keeps its ``CANONICAL`` value (an average centred PA film). ``skin_sites`` finds, on the same
reduction, the body outline (everything not connected to the film's edge through air) and the
points inside it where ECG electrodes and a pacemaker generator sit. Used by
``xray_support_devices`` (perturb.ops.attenuation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DOME_LEVEL = 0.6  # fraction of a lung band's range above its darkest row that is diaphragm
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


def _stretched(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The films reduced to ``LANDMARK_GRID`` squares (area means), contrast stretched between
    each film's 2nd and 98th percentiles ((B, n, n) float64), and each film's range (B,)."""
    n = LANDMARK_GRID
    b = x.shape[0]
    small = F.adaptive_avg_pool2d(x[:, :1].to(torch.float64), (n, n)).view(b, n, n)
    flat = small.view(b, n * n)
    lo = torch.quantile(flat, 0.02, dim=1).view(b, 1, 1)
    hi = torch.quantile(flat, 0.98, dim=1).view(b, 1, 1)
    return (small - lo) / (hi - lo).clamp(min=1e-6), (hi - lo).view(b)


AIR = 0.25  # stretched value below which a cell may be air outside the body
FLOOD_STEPS = 40  # dilations of the air seeded at the film's edge (enough for a 64 grid)


def body_mask(s: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """(B, n, n) bool: the body on stretched reductions ``s``: not air connected to the film's
    edge. Air is grown from the edge cells darker than ``AIR`` through dark cells (a flood fill
    by ``FLOOD_STEPS`` 3 x 3 dilations: a fixed count, whatever the batch); black padding and
    the gap between an abducted arm and the chest are air. The lungs are dark too, walled off
    by the chest wall, which a 64-cell reduction can thin to nothing over a shoulder: the
    thorax between the lung centres (``lm``, 4 % beyond them) from the apex to the domes is
    never air."""
    n = s.shape[-1]
    dev = s.device
    centre = (torch.arange(n, device=dev, dtype=torch.float64) + 0.5) / n
    b = s.shape[0]
    left, right, apex = lm[:, 1].view(b, 1, 1), lm[:, 2].view(b, 1, 1), lm[:, 3].view(b, 1, 1)
    dome = torch.maximum(lm[:, 4], lm[:, 5]).view(b, 1, 1)
    cols, rows = centre.view(1, 1, n), centre.view(1, n, 1)
    thorax = (cols > left - 0.04) & (cols < right + 0.04) & (rows > apex) & (rows < dome)
    dark = ((s < AIR) & ~thorax).unsqueeze(1).to(torch.float64)
    edge = torch.ones_like(dark)
    edge[:, :, 1:-1, 1:-1] = 0.0
    air = dark * edge
    for _ in range(FLOOD_STEPS):
        air = F.max_pool2d(air, 3, 1, 1) * dark
    return (air < 0.5).squeeze(1)


# where the skin sites go on the canonical film, and (as offsets from the found landmarks)
# where they are sought: the upper ECG pair below the shoulders lateral to the lungs, the
# lower pair on the lower chest wall below the domes, the pacemaker pocket below the lateral
# clavicle (image right: the patient's left; image left: the right)
SITES = ("ecg0", "ecg1", "ecg2", "ecg3", "pocket_left", "pocket_right")
CANONICAL_SITES = (
    (0.16, 0.15),
    (0.84, 0.15),
    (0.24, 0.75),
    (0.76, 0.75),
    (0.28, 0.25),
    (0.72, 0.25),
)
SITE_MARGIN = (4, 4, 4, 4, 5, 5)  # grid cells a site keeps from the body's edge (its size)


def skin_sites(x: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """(B, 6, 2) (x, y) fractions of the film, in ``SITES`` order: for each site, the point of
    the body (``body_mask``, eroded by the site's ``SITE_MARGIN`` so the whole electrode or
    generator lies on the patient) nearest to where it is sought from the landmarks ``lm``
    ((B, 10), ``chest_landmarks``): the upper ECG electrodes on the shoulders (14 % of the
    width lateral to the lung centres, 3 % below the apex), the lower ones 6 % lateral to the
    lung centres 5 % below the higher dome, the pacemaker pockets infraclavicular (2 % lateral
    to the lung centres, 13 % below the apex). A featureless film or one with no body room
    left keeps
    the ``CANONICAL_SITES``. No value is read back to the host."""
    n = LANDMARK_GRID
    b = x.shape[0]
    dev = x.device
    s, spread = _stretched(x)
    body = body_mask(s, lm).unsqueeze(1).to(torch.float64)
    left, right, apex = lm[:, 1], lm[:, 2], lm[:, 3]
    low = torch.minimum(lm[:, 4], lm[:, 5])  # the higher dome
    targets = torch.stack(
        [
            torch.stack([left - 0.14, apex + 0.03], dim=1),
            torch.stack([right + 0.14, apex + 0.03], dim=1),
            torch.stack([left - 0.06, low + 0.05], dim=1),
            torch.stack([right + 0.06, low + 0.05], dim=1),
            torch.stack([left - 0.02, apex + 0.13], dim=1),
            torch.stack([right + 0.02, apex + 0.13], dim=1),
        ],
        dim=1,
    )  # (B, 6, 2)
    centre = (torch.arange(n, device=dev, dtype=torch.float64) + 0.5) / n
    gy, gx = torch.meshgrid(centre, centre, indexing="ij")
    cells = torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1)  # (n*n, 2)
    found = []
    canonical = torch.tensor(CANONICAL_SITES, dtype=torch.float64, device=dev)
    for j, margin in enumerate(SITE_MARGIN):  # six sites: a fixed count, not the batch
        room = 1.0 - F.max_pool2d(1.0 - body, 2 * margin + 1, 1, margin)  # eroded body
        d2 = ((cells.view(1, -1, 2) - targets[:, j].view(b, 1, 2)) ** 2).sum(dim=2)
        d2 = d2 + 1e3 * (room.view(b, -1) < 0.5)
        best = d2.argmin(dim=1)
        ok = (d2.gather(1, best.view(b, 1)).view(b) < 1e3) & (spread > 0.05)
        found.append(torch.where(ok.view(b, 1), cells[best], canonical[j].view(1, 2)))
    return torch.stack(found, dim=1)


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
    s, spread = _stretched(x)
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
        span = rows.amax(dim=1, keepdim=True) - low
        r0 = darkest.view(b, 1).to(torch.float64)
        above = torch.where((rows > low + 0.45 * span) & (idx < r0), idx, -1.0).amax(dim=1)
        # the lung bases lie under more soft tissue than the apices: the dark run may be
        # brighter below its darkest row than above it (DOME_LEVEL), by at most 5 cells:
        # beyond, the run has gone on into a dark abdomen or the air beside it
        below = torch.where((rows > low + DOME_LEVEL * span) & (idx > r0), idx, n).amin(dim=1)
        strict = torch.where((rows > low + 0.45 * span) & (idx > r0), idx, n).amin(dim=1)
        below = torch.minimum(below, strict + 5.0)
        return (above + 1.0) / n, below / n

    apex_left, dome_left = lung_run(left)
    apex_right, dome_right = lung_run(right)
    # the domes are level within a few cm (the right usually higher): a run that ends far
    # below the other side's has run on through a gas-filled stomach or bowel
    dome_left, dome_right = (
        torch.minimum(dome_left, dome_right + 0.06),
        torch.minimum(dome_right, dome_left + 0.06),
    )
    # ... and a run that ends far above the other side's has stopped at a white base
    # (effusion, consolidation, a raised soft-tissue shadow): the aerated side's dome stands,
    # the left (image-right) dome usually 1-2 cm lower than the right, never far higher
    low_l, low_r = PLAUSIBLE[4][0], PLAUSIBLE[5][0]  # an implausible run keeps the canonical
    dome_left, dome_right = (
        torch.where(dome_left >= low_l, torch.maximum(dome_left, dome_right - 0.06), dome_left),
        torch.where(dome_right >= low_r, torch.maximum(dome_right, dome_left), dome_right),
    )
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
    ok = ok & (spread.view(b, 1) > 0.05)  # a featureless film: all canonical
    return torch.where(ok, found, canonical)


BUBBLE_CONTRAST = 0.15  # stretched units a gastric gas cell is darker than its surroundings
BUBBLE_SURROUND = 0.45  # the upper abdomen around it is soft tissue (not lung, not air)


def gastric_bubble(x: torch.Tensor, lm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The stomach's gas bubble under the left (image-right) dome, on the ``LANDMARK_GRID``
    reduction: the cell darkest against its 9 x 9 neighbourhood mean (that mean soft
    tissue, ``BUBBLE_SURROUND``) between the midline and 4 % beyond the left lung's centre,
    from 2 % to 30 % below that dome, above the film's lowest 6 % ((B, 2)
    (x, y) fractions), and (B,) bool whether it is at least ``BUBBLE_CONTRAST`` darker (else
    none is seen: a supine film, a fluid-filled stomach). An upright film's fundus holds the
    gas, so a nasogastric tube's tip lies there; a white lung base can hide the dome but not
    the bubble below it. No value is read back to the host."""
    n = LANDMARK_GRID
    b = x.shape[0]
    dev = x.device
    s, spread = _stretched(x)
    local = F.avg_pool2d(s.unsqueeze(1), 9, 1, 4, count_include_pad=False).squeeze(1)
    contrast = local - s
    centre = (torch.arange(n, device=dev, dtype=torch.float64) + 0.5) / n
    cols, rows = centre.view(1, 1, n), centre.view(1, n, 1)
    mid, right, dome = lm[:, 0].view(b, 1, 1), lm[:, 2].view(b, 1, 1), lm[:, 5].view(b, 1, 1)
    region = (cols > mid + 0.03) & (cols < right + 0.04) & (rows > dome + 0.02)
    region = region & (rows < torch.clamp(dome + 0.3, max=0.94)) & (local > BUBBLE_SURROUND)
    score = torch.where(region, contrast, torch.full_like(contrast, -1e9)).view(b, -1)
    best = score.argmax(dim=1)
    seen = (score.gather(1, best.view(b, 1)).view(b) > BUBBLE_CONTRAST) & (spread > 0.05)
    where = torch.stack([centre[best % n], centre[best // n]], dim=1)
    return where, seen
