"""A scene carries no pixels: used on other pixels (a frame reused under several ops, a batch
buffer refilled) it gives the bytes a fresh scene gives, and the work buffers are per name
and shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import perturb
from perturb.ops import color
from perturb.ops._math import scratch
from perturb.scene import Scene, masks
from tests.scene.frames import require_frames, small_frame


def _batch(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].contiguous()


def _text_frame() -> tuple[np.ndarray, Scene]:
    for name, _img in require_frames():
        small, scene = small_frame(name)
        if masks.text_boxes(scene.descriptor):
            return small, scene
    pytest.skip("no sample frame with a burned-in text line (the glyph cover cache is about them)")


def test_contrast_of_a_reused_scene_reads_the_pixels_it_gets() -> None:
    name, _img = require_frames()[0]
    small, scene = small_frame(name)
    x = _batch(small)
    darker = x // 2
    first, _ = perturb.apply(x, "contrast", 3, ["k"], scenes=[scene])
    kept, _ = perturb.apply(darker, "contrast", 3, ["k"], scenes=[scene])
    fresh_scene = Scene.keyed(scene.descriptor, scene.key)  # nothing kept on it yet
    fresh, _ = perturb.apply(darker, "contrast", 3, ["k"], scenes=[fresh_scene])
    assert torch.equal(kept, fresh)
    weight = color.tissue_weight(scene)
    assert weight is not None
    assert color.tissue_mean_luma(darker[0].numpy(), scene, weight) < color.tissue_mean_luma(
        x[0].numpy(), scene, weight
    )
    again, _ = perturb.apply(x, "contrast", 3, ["k"], scenes=[scene])
    assert torch.equal(first, again)


def test_glyph_cover_of_a_reused_scene_reads_the_window_pixels() -> None:
    small, scene = _text_frame()
    x = _batch(small)
    other = 255 - x  # the same scene, other glyph windows
    perturb.apply(x, "brightness", 3, ["k"], protect_border=True, scenes=[scene])
    cached, _ = perturb.apply(other, "brightness", 3, ["k"], protect_border=True, scenes=[scene])
    fresh_scene = Scene.keyed(scene.descriptor, scene.key)
    fresh, _ = perturb.apply(
        other, "brightness", 3, ["k"], protect_border=True, scenes=[fresh_scene]
    )
    assert torch.equal(cached, fresh)


def test_scratch_is_reused_per_name_and_shape() -> None:
    a = scratch("test", (4, 5), np.float32)
    assert scratch("test", (4, 5), np.float32) is a
    assert scratch("test", (4, 6), np.float32).shape == (4, 6)
    assert scratch("test", (4, 6), np.float64).dtype == np.float64
