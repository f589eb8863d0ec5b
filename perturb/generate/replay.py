"""Replay a manifest row: the clean image + the row's record -> the same output bytes."""

from __future__ import annotations

import json
from typing import Any

import torch

from perturb.datasets import composite
from perturb.errors import UnknownNameError
from perturb.generate.output import encode, quantize, spec_from_encoding


def replay_row(row: dict[str, Any], image: torch.Tensor) -> torch.Tensor:
    """The perturbed CHW float32 image of manifest ``row`` from its clean CHW image, on the
    device of ``image`` (bit for bit on the device the row was made on)."""
    record = json.loads(row["record"])
    x = image.unsqueeze(0)
    if "composite" in record:
        try:  # the dataset that declares it, through the registry
            transformed = composite(str(record["composite"]))
        except UnknownNameError as exc:
            raise ValueError(str(exc)) from None
        problem = transformed.composite_problem(
            record.get("params"), int(x.shape[-1]), int(x.shape[-2])
        )
        if problem is not None:
            raise ValueError(f"record of {transformed.NAME}: {problem}; not replayed")
        return transformed.apply_transformed(x, [record["params"]])[0]
    from perturb.contracts.record import Record
    from perturb.engine.run import replay

    if int(row.get("channels", x.shape[1])) == 3 and x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1).contiguous()
    rec = Record.from_dict(record)
    if rec.extra.get("per_channel"):  # a gray-only op run on each channel of a colour image
        c, h, w = x.shape[1:]
        return replay([rec] * c, x.reshape(c, 1, h, w)).reshape(c, h, w)
    return replay([rec], x)[0]


def replay_bytes(row: dict[str, Any], image: torch.Tensor) -> bytes:
    """The encoded file of manifest ``row`` (compare its sha256 with the row's); ``image`` is
    the clean CHW image as decoded from the input (its bit depth is the row's)."""
    spec = spec_from_encoding(row["encoding"])
    y = replay_row(row, image).detach().cpu().permute(1, 2, 0).numpy()
    return encode(quantize(y[..., 0] if y.shape[-1] == 1 else y, spec, int(row["bit_depth"])), spec)
