"""The CPU cuts of the augment policy's ops give the bytes of the plain computations they
replace: the optics ops' aperture weights kept with a scene, their distortion maps, the two-pass uint8
store, the clipped highlights' headroom at the clipped pixels alone, and OpenCV's thread count
set once per DataLoader worker."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from perturb.ops import _host, backend, exposure, optics
from perturb.scene import masks
from tests.scene.frames import frames_with_overlays, small_frame


def _reference_maps(k: float, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    xs = np.arange(width, dtype=np.float64)[None, :] + 0.5
    ys = np.arange(height, dtype=np.float64)[:, None] + 0.5
    sx, sy = optics.distortion_source(xs, ys, k, width, height)
    return (sx - 0.5).astype(np.float32), (sy - 0.5).astype(np.float32)


@pytest.mark.parametrize("size", [(512, 512), (640, 480), (97, 131), (7, 1), (1, 6)])
def test_distortion_maps_match_the_source_formula(size: tuple[int, int]) -> None:
    width, height = size
    for k in np.random.default_rng(3).uniform(-0.2, 0.2, 8).astype(np.float32):
        got = optics.distortion_maps(float(k), width, height)
        want = _reference_maps(float(k), width, height)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize("size", [(512, 512), (131, 97)])
def test_scale_plane_reads_what_the_dense_remap_reads(size: tuple[int, int]) -> None:
    """The separable bicubic scale (chromatic_aberration) against ``cv2.remap`` of the same maps:
    the same kernel, positions and border, the sum in another order (float32 rounding alone)."""
    h, w = size
    plane = np.random.default_rng(5).random((h, w), dtype=np.float32)
    plane = cv2.GaussianBlur(plane, (0, 0), 1.5)  # image-like: neighbours correlate
    for m, cx, cy in ((1.02, w / 2 + 3.3, h / 2 - 7.1), (0.96, w / 3, h / 2), (1.3, 10.0, h - 5.0)):
        map_x, map_y = optics.channel_scale_maps(h, w, cx, cy, m)
        want = cv2.remap(plane, map_x, map_y, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT_101)
        got = optics.scale_plane(plane, cx, cy, m)
        assert got.dtype == np.float32 and got.shape == (h, w)
        assert np.abs(got - want).max() < 2e-6


def test_field_geometry_is_the_mean_of_the_field_pixels() -> None:
    """``field_geometry`` from per-row/column counts gives the very floats of the mean of the
    field pixels' indices."""
    rng = np.random.default_rng(7)
    for i in range(40):
        h, w = (int(n) for n in rng.integers(1, 700, 2))
        mask = rng.random((h, w)) < rng.random() if i % 2 else _disk(h, w, w * rng.random())
        ys, xs = np.nonzero(mask)
        want = (
            (float(xs.mean()) + 0.5, float(ys.mean()) + 0.5, float(np.sqrt(len(xs) / np.pi)))
            if len(xs)
            else (w / 2.0, h / 2.0, min(h, w) / 2.0)
        )
        assert _host.field_geometry(mask) == want


def _disk(h: int, w: int, r: float, shift: int = 0) -> np.ndarray:
    ys, xs = np.mgrid[:h, :w]
    return (xs - w / 2 - shift) ** 2 + (ys - h / 2) ** 2 < r * r


@pytest.mark.parametrize("framed", [False, True])
def test_aperture_of_a_scene_is_kept_with_its_masks(framed: bool) -> None:
    """The weights of a scene's field (and of the tissue of a frame without text lines) follow
    from its descriptor: kept with its masks, equal to a fresh computation; a frame whose
    tissue reads glyph strokes from the pixels computes its tissue weight each time."""
    for name in frames_with_overlays():
        small, scene = small_frame(name)
        img = np.ascontiguousarray(small.transpose(2, 0, 1), dtype=np.float32) / np.float32(255)
        view = _host.View(img, scene)
        field = optics.view_aperture(view, "field", 2.0, framed)
        assert np.array_equal(field, optics._aperture_weight(view.field, 2.0, framed))
        assert not field.flags.writeable
        assert optics.view_aperture(_host.View(img, scene), "field", 2.0, framed) is field
        tissue = optics.view_aperture(view, "tissue", 2.0, framed)
        assert np.array_equal(tissue, optics._aperture_weight(view.tissue, 2.0, framed))
        again = optics.view_aperture(_host.View(img, scene), "tissue", 2.0, framed)
        assert (again is tissue) == (not scene.reads_pixels)
        assert not np.array_equal(optics.view_aperture(view, "field", 1.0, framed), field)


def _reference_store(res: np.ndarray, dst: np.ndarray) -> None:
    scaled = res * np.float32(255)
    np.rint(scaled, out=scaled)
    np.clip(scaled, 0, 255, out=scaled)
    np.copyto(dst, scaled, casting="unsafe")


def test_store_float_uint8_rounds_as_the_engine() -> None:
    halves = ((np.arange(-3, 260) + 0.5) / np.float32(255)).astype(np.float32)
    edges = np.concatenate([halves, np.nextafter(halves, 2), np.nextafter(halves, -2)])
    noise = np.random.default_rng(0).uniform(-0.3, 1.3, 3 * 64 * 64 - edges.size)
    res = np.concatenate([noise.astype(np.float32), edges]).reshape(3, 64, 64)
    got, want = np.empty(res.shape, np.uint8), np.empty(res.shape, np.uint8)
    before = res.copy()
    backend.store_float(res, got)
    _reference_store(res, want)
    assert np.array_equal(got, want) and np.array_equal(res, before)  # res left as it was


def _highlights(seed: int) -> np.ndarray:
    """A uint8 CHW frame with clipped highlights of several sizes on textured tissue."""
    rng = np.random.default_rng(seed)
    img = rng.integers(60, 200, (3, 96, 128), dtype=np.uint8)
    for _ in range(12):
        cx, cy, r = int(rng.integers(0, 128)), int(rng.integers(0, 96)), int(rng.integers(1, 14))
        for c in range(3):
            cv2.circle(img[c], (cx, cy), r, int(rng.integers(235, 256)), -1)
    return img


@pytest.mark.parametrize("seed", range(4))
def test_clipped_pixels_give_the_headroom_of_the_frame(seed: int) -> None:
    src = _highlights(seed)
    clipped = (src.max(axis=0) >= 250) & (src.min(axis=0) >= 220)
    found = exposure.clipped_pixels(src)
    assert found is not None
    ys, xs, head = found
    want_ys, want_xs = np.nonzero(clipped)
    assert np.array_equal(ys, want_ys) and np.array_equal(xs, want_xs)
    assert np.array_equal(head, exposure.headroom_np(clipped)[want_ys, want_xs])
    assert head.max() > 1.0  # the cores of the larger highlights are above the clip


@pytest.mark.parametrize("seed", range(6))
def test_headroom_of_a_local_cluster_is_that_of_the_frame(seed: int) -> None:
    """Highlights in one part of the frame (a corner, an edge, the middle): the local maximum
    of the distance taken on their bounding box alone gives the frame's headroom."""
    rng = np.random.default_rng(100 + seed)
    h, w = 120, 160
    clipped = np.zeros((h, w), bool)
    x0, y0 = [(0, 0), (w - 40, h - 30), (50, 0), (0, 60), (60, 40), (w - 25, 0)][seed]
    for _ in range(5):
        cx, cy = x0 + int(rng.integers(0, 40)), y0 + int(rng.integers(0, 30))
        r = int(rng.integers(1, 12))
        cv2.circle(clipped.view(np.uint8), (cx, cy), r, 1, -1)
    clipped |= (rng.random((h, w)) < 0.002) & (np.arange(w)[None, :] >= x0)
    points = cv2.findNonZero(clipped.view(np.uint8)).reshape(-1, 2)
    xs, ys = points[:, 0], points[:, 1]
    got = exposure._headroom_at(clipped, ys, xs)
    assert np.array_equal(got, exposure.headroom_np(clipped)[ys, xs])


def test_median_of_levels_is_numpy_median() -> None:
    """``masks._median`` (glyph_strokes' medians) against ``np.median`` on 8-bit levels and on
    half and quarter levels (a difference of a median and a level), odd and even counts."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 4, 5, 10, 63, 64, 255, 1000):
        for _ in range(20):
            levels = rng.integers(0, 256, n).astype(np.uint8)
            assert masks._median(levels) == float(np.median(levels))
            assert int(masks._median(levels)) == int(np.median(levels))
            halves = (levels.astype(np.float32) - np.float32(rng.integers(0, 512) / 4)).astype(
                np.float32
            )
            assert masks._median(halves) == float(np.median(halves))
            assert np.float32(masks._median(halves)) == np.float32(np.median(halves))


def test_soft_mask_is_the_plain_ramp() -> None:
    """``_host.soft_mask`` computed in place: the bits of ``clip(dist / inset - 1, 0, 1)``."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        h, w = (int(v) for v in rng.integers(8, 200, 2))
        mask = cv2.dilate((rng.random((h, w)) < 0.2).astype(np.uint8), np.ones((5, 5), np.uint8))
        inset = float(rng.uniform(1.0, 30.0))
        dist = cv2.distanceTransform(mask, cv2.DIST_L2, 3)
        want = np.clip(dist / np.float32(inset) - 1.0, 0.0, 1.0).astype(np.float32)
        got = _host.soft_mask(mask.astype(bool), inset)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_tissue_alpha_is_the_field_alpha_off_the_overlay_mask() -> None:
    """The tissue alpha, its overlays zeroed rectangle by rectangle, against the field alpha
    with the whole overlay mask zeroed, on real frames with overlays."""
    names = frames_with_overlays()
    if not names:
        pytest.skip("no real frame with overlays and a dark surround in the sample set")
    for name in names:
        desc = small_frame(name)[1].descriptor
        want = masks.field_alpha(desc).copy()
        want[masks.overlay_mask(desc)] = 0.0
        assert np.array_equal(masks.tissue_alpha(desc), want)


def test_no_clipped_pixels() -> None:
    assert exposure.clipped_pixels(np.full((3, 16, 16), 100, np.uint8)) is None


def test_opencv_threads_set_once_in_a_dataloader_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    threads = {"n": 4}

    def set_threads(n: int) -> None:
        calls.append(n)
        threads["n"] = n

    monkeypatch.setattr(backend.cv2, "setNumThreads", set_threads)
    monkeypatch.setattr(backend.cv2, "getNumThreads", lambda: threads["n"])
    monkeypatch.setattr(backend, "_CV2_WORKER_SET", False)
    monkeypatch.setattr(backend, "_CV2_OWN_PROCESS", True)
    monkeypatch.setattr(backend, "_in_dataloader_worker", lambda: True)
    for _ in range(5):
        backend.map_samples(lambda i: None, 3)
    assert calls == [1] and threads["n"] == 1  # once, and left at one thread

    monkeypatch.setattr(backend, "_CV2_WORKER_SET", False)
    monkeypatch.setattr(backend, "_in_dataloader_worker", lambda: False)
    threads["n"] = 4
    calls.clear()
    backend.map_samples(lambda i: None, 3)
    assert calls == [1, 4]  # elsewhere: one thread while the batch runs, restored after
