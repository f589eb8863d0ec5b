"""Reference checks of the geometry ops (perturb/ops/geometry.py, catalog/geometry.yaml):
resized_crop equals OpenCV's resize of the crop, rotation follows PIL's rotate (sign, centre,
black corners), translation is an exact integer shift; severities are monotone on real frames."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

import perturb
from perturb.catalog.specs import get_spec
from perturb.datasets.phantoms.endoscopy import render
from perturb.ops.backend import use_backend
from perturb.ops.geometry import (
    chain_warp,
    crop_box,
    rotation_matrix,
    row_spans,
    translation_matrix,
    translation_pixels,
    warp_batch,
)
from tests.helpers import ENDOSCOPY, require_samples, sample_tensor


def _phantom(size: tuple[int, int] = (160, 128)) -> torch.Tensor:
    return (
        torch.from_numpy(render("geo", size).image).permute(2, 0, 1).float().div(255).unsqueeze(0)
    )


def test_catalog_tags_and_modalities() -> None:
    for name in ("resized_crop", "rotation", "translation"):
        spec = get_spec(name)
        assert (
            spec.family == "geometry"
            and "endoscopy" in spec.modalities
            and "any" in spec.modalities
        )
        assert "moves_geometry" in spec.risk_tags and "crops_border" in spec.risk_tags
    assert (
        "black_fill" in get_spec("rotation").risk_tags
        and "black_fill" in get_spec("translation").risk_tags
    )
    assert "black_fill" not in get_spec("resized_crop").risk_tags


def test_resized_crop_equals_opencv_resize_of_the_crop() -> None:
    x = _phantom()
    out, records = perturb.apply(x, "resized_crop", 4, ["a"])
    p = records[0].params
    h, w = x.shape[-2:]
    x0, y0, cw, ch = crop_box(
        w,
        h,
        np.float32(p["scale"]).item(),
        np.float32(p["log_ratio"]).item(),
        np.float32(p["u"]).item(),
        np.float32(p["v"]).item(),
    )
    assert cw * ch < w * h
    crop = x[0].permute(1, 2, 0).numpy()[y0 : y0 + ch, x0 : x0 + cw]
    ref = np.clip(
        cv2.resize(np.ascontiguousarray(crop), (w, h), interpolation=cv2.INTER_CUBIC), 0, 1
    )
    assert np.abs(out[0].permute(1, 2, 0).numpy() - ref).max() < 1e-4


def test_rotation_follows_pil_rotate() -> None:
    """Positive degrees rotate counter-clockwise about the centre; corners are black where PIL's
    rotate (fill 0) puts black."""
    x = _phantom()
    for key in ("a", "b"):
        out, records = perturb.apply(x, "rotation", 5, [key])
        deg = float(np.float32(records[0].params["degrees"]))
        img = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        ref = np.asarray(
            Image.fromarray(img).rotate(deg, Image.Resampling.BICUBIC, fillcolor=0)
        ).astype(float)
        ours = out[0].permute(1, 2, 0).numpy() * 255
        white = np.asarray(
            Image.fromarray(np.full_like(img, 255)).rotate(
                deg, Image.Resampling.BICUBIC, fillcolor=0
            )
        )
        ones = perturb.replay(records, torch.ones_like(x))[0, 0].numpy()
        assert np.array_equal(ones > 0.5, white[..., 0] > 127)
        assert np.abs(ours - ref).mean() < 2.0


def test_translation_is_an_exact_shift_with_black_fill() -> None:
    x = _phantom()
    out, records = perturb.apply(x, "translation", 5, ["k"])
    p = records[0].params
    h, w = x.shape[-2:]
    tx, ty = translation_pixels(
        w, h, float(np.float32(p["shift"])), float(np.float32(p["direction"]))
    )
    assert max(abs(tx), abs(ty)) >= 0.14 * min(w, h) * 0.5
    ref = torch.zeros_like(x)
    ys, xs = slice(max(ty, 0), h + min(ty, 0)), slice(max(tx, 0), w + min(tx, 0))
    ref[..., ys, xs] = x[..., max(-ty, 0) : h - max(ty, 0), max(-tx, 0) : w - max(tx, 0)]
    assert torch.equal(out, ref)
    assert translation_pixels(40, 40, 0.001, 10.0) == (1, 0)  # always moves at least a pixel


def test_row_spans_match_a_per_pixel_check() -> None:
    w, h = 97, 61
    warp = chain_warp(
        (w, h), (3, 2, 90, 57), [rotation_matrix(-8.5, w, h), translation_matrix(-6, 4)]
    )
    lo, hi = row_spans(warp.constraints, w, h)
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    ok = np.ones((h, w), bool)
    for a, b, c, low, high in warp.constraints:
        v = a * xs + b * ys + c
        ok &= (v >= low) & (v < high)
    cols = np.arange(w)
    assert np.array_equal(ok, (cols >= lo[:, None]) & (cols < hi[:, None]))


@pytest.mark.parametrize("op", ["resized_crop", "rotation"])
def test_torch_path_agrees_on_a_full_frame(op: str) -> None:
    require_samples()
    x = sample_tensor(ENDOSCOPY[0]).unsqueeze(0)
    out, records = perturb.apply(x, op, 5, ["frame"])
    with use_backend("torch"):
        other = perturb.replay(records, x)
    assert float((out - other).abs().max()) < 0.5 / 255


def _ssim(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    return float(structural_similarity(a, b, channel_axis=2, data_range=1.0))


@pytest.mark.parametrize("op", ["resized_crop", "rotation", "translation"])
def test_severity_is_monotone_on_real_frames(op: str) -> None:
    require_samples()
    frames = []
    for path in ENDOSCOPY:  # the mean over every sample frame
        img = sample_tensor(path).permute(1, 2, 0).numpy()
        frames.append(cv2.resize(img, (192, 160), interpolation=cv2.INTER_AREA))
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).clamp(0, 1).contiguous()
    keys = [f"f{i}" for i in range(len(frames))]
    scores = []
    for severity in range(1, 6):
        out, _ = perturb.apply(x, op, severity, keys)
        scores.append(
            np.mean([_ssim(frames[i], out[i].permute(1, 2, 0).numpy()) for i in range(len(frames))])
        )
    assert all(a > b for a, b in itertools.pairwise(scores)), scores


def test_warp_batch_is_per_sample() -> None:
    x = torch.cat([_phantom(), _phantom().flip(-1)])
    warps = [chain_warp((160, 128), None, [rotation_matrix(d, 160, 128)]) for d in (5.0, -12.0)]
    both = warp_batch(x, warps)
    assert torch.equal(both[1:], warp_batch(x[1:], warps[1:]))


@pytest.mark.parametrize("op", ["resized_crop", "rotation", "translation"])
def test_torch_path_is_one_batch_whatever_its_size(op: str) -> None:
    """The batched torch kernel (per-sample matrices, crops and shifts as tensors) gives each
    sample what it gives that sample alone, and its label-map warp does the same."""
    x = torch.cat([_phantom(), _phantom().flip(-1), _phantom().flip(-2)])
    keys = ["a", "b", "c"]
    with use_backend("torch"):
        both, records = perturb.apply(x, op, 5, keys)
        alone = torch.cat([perturb.replay([r], x[i : i + 1]) for i, r in enumerate(records)])
    assert torch.equal(both, alone)
    geometry = perturb.catalog.ops.get_op(op).geometry
    assert geometry is not None
    params = perturb.engine.run.collate([r.params for r in records], x.device)
    for dtype in (torch.uint8, torch.uint16, torch.bool):  # gather has no uint16 kernel: a twin
        labels = ((x[:, :1] > 0.5) * 7).to(dtype)
        moved = geometry.label_maps(labels, params)
        assert moved.dtype == dtype and bool(moved.to(torch.int32).sum() > 0)
        for i, r in enumerate(records):
            one = perturb.engine.run.collate([r.params], x.device)
            assert torch.equal(moved[i : i + 1], geometry.label_maps(labels[i : i + 1], one))
