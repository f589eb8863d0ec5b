"""The cheap paths of border protection give the bytes of the plain ones: the soft-edge blend
without a clip, the descriptor key cached on a scene, scenes analysed on the worker pool or in
each sample's worker, the analysis cache handing out copies, strided outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import perturb
from perturb.engine import run as engine
from perturb.ops import composite
from perturb.scene import Scene, masks
from perturb.scene.analysis import analyse
from tests.scene.frames import require_frames, small_frame


def _reference_blend(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``src + alpha (dst - src)`` at ``index`` in float32, rounded half to even and clipped."""
    out = dst.reshape(-1).copy()
    base = src.reshape(-1)[index].astype(np.float32)
    mixed = base + alpha * (dst.reshape(-1)[index].astype(np.float32) - base)
    if dst.dtype != np.float32:
        mixed = np.clip(np.rint(mixed), 0, np.iinfo(dst.dtype).max)
    out[index] = mixed.astype(dst.dtype)
    return out.reshape(dst.shape)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_blend_without_clip_matches_the_clipped_reference(dtype: type) -> None:
    rng = np.random.default_rng(7)
    shape = (3, 64, 96)
    if dtype == np.float32:
        src, dst = (rng.random(shape, dtype=np.float32) for _ in range(2))
    else:
        top = np.iinfo(dtype).max
        # the extremes, where a mix could leave the range if it did not lie between its levels
        src = rng.choice(np.array([0, 1, top - 1, top, top // 2], dtype), shape)
        dst = rng.choice(np.array([0, 1, top - 1, top, top // 3], dtype), shape)
    index = np.sort(rng.choice(src.size, 5000, replace=False))
    alpha = np.concatenate(
        [
            np.array([np.float32(1e-7), np.nextafter(np.float32(1), np.float32(0)), np.float32(0.5)], np.float32),
            rng.random(index.size - 3, dtype=np.float32),
        ]
    )
    want = _reference_blend(src, dst, index, alpha)
    got = dst.copy()
    composite._blend_at(src, got, index, alpha)
    assert np.array_equal(got, want)
    strided = np.zeros((*shape[:-1], shape[-1] + 5), dtype)[..., :-5]
    strided[...] = dst
    composite._blend_at(src, strided, index, alpha)
    assert np.array_equal(strided, want)


def _frames(n: int) -> list[tuple[np.ndarray, Scene]]:
    picked = [small_frame(name) for name, _img in require_frames()[:n]]
    return picked


def test_scene_key_is_the_descriptor_key() -> None:
    small, _scene = _frames(1)[0]
    chw = torch.from_numpy(np.ascontiguousarray(small)).permute(2, 0, 1).contiguous()
    desc = analyse(chw)
    assert Scene.of(chw).key == masks.descriptor_key(desc)
    assert Scene.from_descriptor(desc).key == masks.descriptor_key(desc)
    assert Scene.of(chw).descriptor == desc
    other = {**desc, "overlays": []}
    assert dataclasses.replace(Scene.of(chw), descriptor=other).key == masks.descriptor_key(other)


def test_analysis_cache_hands_out_copies() -> None:
    small, _scene = _frames(1)[0]
    x = torch.from_numpy(np.ascontiguousarray(small)).permute(2, 0, 1)[None].contiguous()
    first = analyse(x[0])
    first["bbox"][0] = -5
    first["overlays"].append([0, 0, 1, 1, "glyph"])
    assert analyse(x[0]) != first
    out, records = perturb.apply(x, "brightness", 3, ["k"], protect_border=True)
    records[0].extra["scene"]["field"].clear()  # a caller changing its record changes nothing else
    again, records_again = perturb.apply(x, "brightness", 3, ["k"], protect_border=True)
    assert torch.equal(out, again)
    assert records_again[0].extra["scene"] == analyse(x[0])


@pytest.mark.parametrize("op", ["brightness", "gaussian_blur"])
def test_scenes_analysed_in_workers_give_the_same_bytes(op: str) -> None:
    frames = _frames(4)
    h, w = min(s.shape[0] for s, _ in frames), min(s.shape[1] for s, _ in frames)
    x = torch.stack([torch.from_numpy(np.ascontiguousarray(s[:h, :w])).permute(2, 0, 1) for s, _ in frames])
    keys = [f"k{i}" for i in range(len(frames))]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial, records = perturb.apply(x, op, 4, keys, protect_border=True)
        torch.set_num_threads(2)
        pooled, records_pooled = perturb.apply(x, op, 4, keys, protect_border=True)
        # records without a stored scene: analysed where each sample runs
        bare = [dataclasses.replace(r, extra={k: v for k, v in r.extra.items() if k != "scene"}) for r in records]
        lazy = engine.run_records(x, bare)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(serial, pooled)
    assert [r.to_json() for r in records] == [r.to_json() for r in records_pooled]
    assert torch.equal(serial, lazy)
    assert torch.equal(serial, perturb.replay(records, x))


@pytest.mark.parametrize("fn", [composite.compose_frame, composite.extend_frame])
def test_strided_outputs_get_the_contiguous_bytes(fn: object) -> None:
    for small, scene in _frames(3):
        src = np.ascontiguousarray(np.moveaxis(small, -1, 0))
        start = np.clip(src.astype(np.int16) * 2 - 40, 0, 255).astype(np.uint8)
        flat = start.copy()
        strided = np.zeros((*src.shape[:-1], src.shape[-1] + 3), np.uint8)
        view = strided[..., :-3]
        view[...] = start
        fn(src, flat, scene.descriptor)  # type: ignore[operator]
        fn(src, view, scene.descriptor)  # type: ignore[operator]
        assert np.array_equal(view, flat)
        assert not strided[..., -3:].any()
