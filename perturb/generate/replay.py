"""Replay a manifest row: the clean image + the row's record -> the same output bytes."""

from __future__ import annotations

import json
from typing import Any

import torch

from perturb.datasets.kvasir_vqa_x1 import transform as transformed
from perturb.generate.output import encode, quantize, spec_from_encoding


def replay_row(row: dict[str, Any], image: torch.Tensor) -> torch.Tensor:
    """The perturbed CHW float32 image of manifest ``row`` from its clean CHW image, on the
    device of ``image`` (bit for bit on the device the row was made on)."""
    record = json.loads(row["record"])
    x = image.unsqueeze(0)
    if "composite" in record:
        if record["composite"] != transformed.NAME:
            raise ValueError(f"unknown composite {record['composite']!r}")
        problem = composite_problem(record.get("params"), int(x.shape[-1]), int(x.shape[-2]))
        if problem is not None:
            raise ValueError(f"record of {transformed.NAME}: {problem}; not replayed")
        return transformed.apply_transformed(x, [record["params"]])[0]
    from perturb.contracts.record import Record
    from perturb.engine import replay

    if int(row.get("channels", x.shape[1])) == 3 and x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1).contiguous()
    rec = Record.from_dict(record)
    if rec.extra.get("per_channel"):  # a gray-only op run on each channel of a colour image
        c, h, w = x.shape[1:]
        return replay([rec] * c, x.reshape(c, 1, h, w)).reshape(c, h, w)
    return replay([rec], x)[0]


_STEP_LIMITS = {  # value bounds of each step's numbers (sizes are checked against the image)
    "rotate": {"angle": 360.0},
    "brightness": {"factor": 10.0},
    "contrast": {"factor": 10.0},
}


def composite_problem(params: Any, width: int, height: int) -> str | None:
    """Why a track record cannot be replayed on a ``width`` x ``height`` image (None if it can):
    its size must be the image's, the crop inside it, shifts within it, factors and angles
    finite and bounded, so a forged record cannot size buffers."""
    import math

    if not isinstance(params, dict) or not isinstance(params.get("steps"), list):
        return "params must be an object with a steps list"
    if params.get("size") != [width, height]:
        return f"size {params.get('size')!r:.40} is not the image's [{width}, {height}]"
    for step in params["steps"]:
        if not isinstance(step, dict):
            return "every step must be an object"
        op = step.get("op")
        for key, value in step.items():
            if key in ("op", "fallback"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return f"{op} {key} is {value!r:.40}, not a finite number"
            bound = _STEP_LIMITS.get(str(op), {}).get(key)
            if bound is not None and abs(value) > bound:
                return f"{op} {key} = {value} is outside [-{bound}, {bound}]"
        if op == "resized_crop":
            top, left, h, w = (step.get(k, -1) for k in ("top", "left", "height", "width"))
            inside = min(top, left) >= 0 and min(h, w) > 0
            if not (inside and top + h <= height and left + w <= width):
                return "resized_crop box is not inside the image"
        shift = (abs(step.get("tx", 0)), abs(step.get("ty", 0)))
        if op == "translate" and not (shift[0] <= width and shift[1] <= height):
            return "translate moves the image beyond its size"
    return None


def replay_bytes(row: dict[str, Any], image: torch.Tensor) -> bytes:
    """The encoded file of manifest ``row`` (compare its sha256 with the row's); ``image`` is
    the clean CHW image as decoded from the input (its bit depth is the row's)."""
    spec = spec_from_encoding(row["encoding"])
    y = replay_row(row, image).detach().cpu().permute(1, 2, 0).numpy()
    return encode(quantize(y[..., 0] if y.shape[-1] == 1 else y, spec, int(row["bit_depth"])), spec)
