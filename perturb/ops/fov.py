"""The endoscope's field of view: the dark frame around it stays untouched by painting ops."""

from __future__ import annotations

import torch

DARK_THRESHOLD = 0.07


def border_mask(x: torch.Tensor, threshold: float = DARK_THRESHOLD) -> torch.Tensor:
    """Bool mask (B,1,H,W) of the dark frame: dark pixels reached in a straight dark run from an
    image edge (left, right, top or bottom). Handles octagonal and circular fields of view and
    black side bars, and never takes a dark lumen inside the field of view."""
    dark = (x.amax(dim=1) < threshold).to(torch.uint8)  # (B,H,W)
    from_left = dark.cummin(dim=2).values
    from_right = dark.flip(2).cummin(dim=2).values.flip(2)
    from_top = dark.cummin(dim=1).values
    from_bottom = dark.flip(1).cummin(dim=1).values.flip(1)
    mask = (from_left | from_right | from_top | from_bottom).bool()
    return mask.unsqueeze(1)
