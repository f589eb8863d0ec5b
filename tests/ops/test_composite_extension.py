"""The tissue extension that spatial ops read (``perturb.ops.composite.extend_frame``): tissue
untouched, surround filled with the nearby tissue's colour, no dark rim after a protected blur."""

from __future__ import annotations

import cv2
import numpy as np
import torch

import perturb
from perturb.engine import run as engine
from perturb.ops.backend import use_backend
from perturb.ops.composite import EXT_MARGIN, scene_extension_fill
from perturb.ops.composite import extend_frame as extend_numpy
from perturb.scene import Scene
from perturb.scene.analysis import analyse
from perturb.scene.masks import text_boxes, tissue_alpha

H, W, R = 288, 360, 120


def _frame(left: tuple[int, int, int], right: tuple[int, int, int]) -> np.ndarray:
    """CHW uint8: a dark surround (level 8) around a disk field whose colour goes from ``left``
    to ``right`` across it, with a faint texture."""
    xs = np.linspace(0.0, 1.0, W, dtype=np.float32)[None, :, None]
    colour = np.asarray(left, np.float32) * (1 - xs) + np.asarray(right, np.float32) * xs
    tissue = np.broadcast_to(colour, (H, W, 3)).copy()
    tissue += np.random.default_rng(0).normal(0.0, 2.0, tissue.shape).astype(np.float32)
    mask = np.zeros((H, W), np.uint8)
    cv2.circle(mask, (W // 2, H // 2), R, 1, -1)
    img = np.where(mask[..., None] > 0, tissue, 8.0)
    return np.ascontiguousarray(np.moveaxis(np.clip(np.rint(img), 0, 255).astype(np.uint8), -1, 0))


def test_tissue_untouched_and_surround_filled_with_nearby_tissue() -> None:
    src = _frame((200, 90, 70), (110, 160, 60))
    desc = analyse(torch.from_numpy(src))
    alpha = tissue_alpha(desc)
    dst = np.empty_like(src)
    extend_numpy(src, dst, desc)
    assert (dst[:, alpha >= 1.0] == src[:, alpha >= 1.0]).all(), "tissue pixels keep their values"
    # just outside the field's left and right edges: the colour of the tissue next to them
    cy = H // 2
    for x_out, x_in in ((W // 2 - R - 6, W // 2 - R + 12), (W // 2 + R + 6, W // 2 + R - 12)):
        assert alpha[cy, x_out] == 0.0
        got, near = dst[:, cy, x_out].astype(int), src[:, cy, x_in].astype(int)
        assert np.abs(got - near).max() <= 12, f"fill {got} far from the nearby tissue {near}"
    # nothing within EXT_MARGIN of the field (beyond every PSF's reach) is as dark as the surround
    dist = cv2.distanceTransform((alpha == 0.0).astype(np.uint8), cv2.DIST_L2, 5)
    near = (alpha == 0.0) & (dist <= EXT_MARGIN * min(H, W))
    assert near.sum() > 1000
    assert int(dst[:, near].max(axis=0).min()) > 50, "dark surround left next to the field"


def test_protected_blur_has_no_dark_rim_and_keeps_the_surround() -> None:
    src = _frame((180, 120, 90), (180, 120, 90))
    x = torch.from_numpy(src)[None]
    out = perturb.apply(x, "gaussian_blur", 5, ["rim"])[0][0].numpy()
    alpha = tissue_alpha(analyse(x[0]))
    assert (out[:, alpha == 0.0] == src[:, alpha == 0.0]).all(), "the surround keeps its pixels"
    # the tissue ring within 4 px of the edge: as bright as the flat tissue (a blur over the dark
    # surround would pull it down by tens of levels)
    ring = (alpha >= 1.0) & (
        cv2.erode((alpha >= 1.0).astype(np.uint8), np.ones((9, 9), np.uint8)) == 0
    )
    assert ring.sum() > 100
    drop = np.asarray([180, 120, 90])[:, None] - out[:, ring].astype(int)
    assert np.abs(drop).mean() < 3.0 and drop.max() < 12, f"dark rim: mean drop {drop.mean():.1f}"


def _real_frames(n: int) -> list[torch.Tensor]:
    """CHW uint8 real frames at 384x288, those with text lines first."""
    from tests.scene.frames import require_frames

    picked = [
        torch.from_numpy(cv2.resize(img, (384, 288), interpolation=cv2.INTER_AREA))
        .permute(2, 0, 1)
        .contiguous()
        for _, img in require_frames()
    ]
    with_text = [x for x in picked if text_boxes(analyse(x))]
    return (with_text + [x for x in picked if not text_boxes(analyse(x))])[:n]


def test_batched_extension_gives_the_host_bytes() -> None:
    """``engine.extend_tissue`` (the torch path: fills and alphas computed once per image on
    the host, one batched blend) gives ``extend_numpy``'s bytes; a sample without a scene stays
    as it is; the fill is read-only and the same on the next call."""
    frames = _real_frames(3)
    x = torch.stack(frames)
    scenes = [Scene.of(f) for f in frames]
    got = engine.extend_tissue(x, [*scenes[:-1], None])
    for i, (f, s) in enumerate(zip(frames[:-1], scenes[:-1], strict=True)):
        want = np.empty_like(f.numpy())
        extend_numpy(f.numpy(), want, s.descriptor)
        assert np.array_equal(got[i].numpy(), want), f"frame {i}"
        assert not np.array_equal(want, f.numpy()), f"frame {i}: nothing extended (nothing checked)"
    assert torch.equal(got[-1], x[-1])
    fill = scene_extension_fill(scenes[0], frames[0].numpy())
    assert np.array_equal(scene_extension_fill(scenes[0], frames[0].numpy()), fill)
    assert not fill.flags.writeable
    floats = x.to(torch.float32) / 255.0
    got_f = engine.extend_tissue(floats, scenes)
    want_f = np.empty_like(floats[1].numpy())
    extend_numpy(floats[1].numpy(), want_f, scenes[1].descriptor)
    assert np.array_equal(got_f[1].numpy(), want_f)


def test_protected_blur_on_the_torch_path_matches_the_cpu_path() -> None:
    x = torch.stack(_real_frames(2))
    cpu, records = perturb.apply(x, "gaussian_blur", 5, ["a", "b"])
    with use_backend("torch"):
        again = perturb.replay(records, x)
    # the extension and the composite are the host's bytes; the blur itself may differ by a level
    assert int((cpu.to(torch.int16) - again.to(torch.int16)).abs().max()) <= 1
