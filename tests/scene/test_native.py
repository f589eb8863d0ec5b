"""The compiled composite (``perturb.scene.native``, numba) gives the NumPy path's bytes: the
copy of the source outside the tissue, the soft-edge blend, the glyph cover of text lines, and
the lookup fused with the composite for the lookup-table ops, on real frames at every severity
and on synthetic cases; without numba (or stringzilla) the engine falls back to the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import perturb
from perturb.ops import _math, backend
from perturb.scene import masks, native
from tests.scene.frames import frames_with_overlays, overlay_batch, small_frame

pytest.importorskip("numba", reason="the compiled composite needs numba (a core dependency)")

TABLE_OPS = ["brightness", "contrast", "gamma", "color_cast", "overexposure"]


@pytest.fixture
def numpy_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The composite's NumPy path: no compiled kernels."""
    monkeypatch.setattr(masks, "_compiled", lambda: None)
    monkeypatch.setattr(masks, "lookup_kernel", lambda lookup: None)


def test_kernels_compile_and_agree_with_numpy() -> None:
    k = native.kernels()
    assert k is not None, "numba is installed, so the kernels must compile and pass their probe"
    assert _math.lookup_function() is not None
    assert native.lookup_kernel(_math.lookup_function()) is not None


def test_probe_catches_a_kernel_that_rounds_otherwise() -> None:
    """The probe is not a formality: a blend that truncates instead of rounding fails it."""
    k = native.kernels()
    assert k is not None

    def truncating(src: np.ndarray, dst: np.ndarray, index: np.ndarray, alpha: np.ndarray) -> None:
        base = src[index].astype(np.float32)
        dst[index] = ((dst[index].astype(np.float32) - base) * alpha + base).astype(dst.dtype)

    assert native._agrees(k)
    assert not native._agrees(native.Kernels(k.compose, truncating, k.lookup_compose))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_compose_matches_numpy_on_random_planes(dtype: type) -> None:
    rng = np.random.default_rng(5)
    top = np.iinfo(dtype).max
    src = rng.integers(0, top + 1, (3, 61, 83), dtype=dtype)
    dst = rng.integers(0, top + 1, (3, 61, 83), dtype=dtype)
    keep = (rng.random((61, 83)) < 0.3).astype(np.uint8)
    edges = np.flatnonzero(np.diff(keep.reshape(-1), prepend=np.uint8(0), append=np.uint8(0)))
    starts, stops = edges[0::2].astype(np.int64), edges[1::2].astype(np.int64)
    part = np.flatnonzero((keep.reshape(-1) == 0) & (rng.random(61 * 83) < 0.2)).astype(np.int64)
    alpha = rng.random(part.size, dtype=np.float32)
    alpha[::7] = 0.5  # ties: half to even
    want = dst.copy()
    for c in range(3):
        np.copyto(want[c], src[c], where=keep.astype(bool))
    index = np.concatenate([part + c * 61 * 83 for c in range(3)])
    masks._blend_at(src, want, index, np.tile(alpha, 3))
    got = dst.copy()
    k = native.kernels()
    assert k is not None
    k.compose(src.reshape(-1), got.reshape(-1), starts, stops, *native.runs_of(part), alpha, 3)
    assert np.array_equal(got, want)


def _frames() -> list[str]:
    names = frames_with_overlays(limit=3)
    if not names:
        pytest.skip("no real frame with overlays and a dark surround in the sample set")
    return names


@pytest.mark.parametrize("op", [*TABLE_OPS, "saturation", "hue_shift", "vignetting"])
def test_engine_bytes_with_and_without_compiled_composite(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Protected outputs on real frames (with text, overlays, a dark surround) are the same bytes
    through the compiled composite (fused with the lookup for table ops) and the NumPy one."""
    x = overlay_batch()
    keys = [f"f{i}" for i in range(x.shape[0])]
    fused: list[bool] = []

    def spy(*args: object, **kwargs: object) -> bool:
        fused.append(masks.compose_lookup(*args, **kwargs))  # type: ignore[arg-type]
        return fused[-1]

    def hashed_spy(*args: object, **kwargs: object) -> bytes | None:
        digest = masks.compose_lookup_hashed(*args, **kwargs)  # type: ignore[arg-type]
        fused.append(digest is not None)
        return digest

    monkeypatch.setattr(backend, "compose_lookup", spy)
    monkeypatch.setattr(backend, "compose_lookup_hashed", hashed_spy)  # a frame seen before
    for severity in (1, 5):
        fused.clear()
        fast, _ = perturb.apply(x, op, severity, keys, protect_border=True)
        # every sample through a fused pass (a wrong guess adds a second, plain one)
        if op in TABLE_OPS:
            assert all(fused) and len(fused) >= x.shape[0], "the fused pass runs for table ops"
        else:
            assert fused == []
        with monkeypatch.context() as m:
            m.setattr(masks, "_compiled", lambda: None)
            m.setattr(masks, "lookup_kernel", lambda lookup: None)
            plain, _ = perturb.apply(x, op, severity, keys, protect_border=True)
        assert torch.equal(fast, plain), (op, severity)


@pytest.mark.parametrize("op", TABLE_OPS)
def test_protected_table_ops_without_stringzilla(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without stringzilla's lookup the fused pass is skipped: OpenCV's paths and the compiled
    composite give the same protected bytes."""
    name = _frames()[0]
    img, _scene = small_frame(name)
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].contiguous()
    fast, _ = perturb.apply(x, op, 4, ["a"], protect_border=True)
    monkeypatch.setattr(_math, "lookup_function", lambda: None)
    slow, _ = perturb.apply(x, op, 4, ["a"], protect_border=True)
    assert torch.equal(fast, slow)


def test_compose_lookup_declines_what_it_cannot_do(numpy_only: None) -> None:
    """Without the kernel ``compose_lookup`` writes nothing and says so (other dtypes, layouts
    and table counts: ``test_compose_lookup_declines_other_dtypes_layouts_and_table_counts``)."""
    name = _frames()[0]
    img, scene = small_frame(name)
    src = np.ascontiguousarray(np.moveaxis(img, -1, 0))
    dst = np.zeros_like(src)
    table = np.arange(256, dtype=np.uint8)
    assert not masks.compose_lookup(src, dst, table, _math.lookup_function(), scene.descriptor)
    assert not dst.any()


def test_only_the_engine_marks_a_scene_with_its_pixels_digest() -> None:
    """A scene from the public constructors carries no pixel digest (handed on to another image
    it would key that image's per-frame caches by the wrong frame); the engine's own scenes do,
    and contrast's mean keyed by it gives the bytes of hashing the frame again."""
    from perturb.ops import color
    from perturb.scene import Scene

    name = _frames()[0]
    img, scene = small_frame(name)
    assert scene.pixels_ is None
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).contiguous()
    assert Scene.of(x).pixels_ is None
    batch = x[None].contiguous()
    with_digest, _ = perturb.apply(batch, "contrast", 3, ["a"], protect_border=True)
    color._MEANS.clear()
    seen: list[object] = []
    real_slot = color._mean_slot

    def rehash(src: np.ndarray, s: object) -> object:
        from perturb.scene.analysis import _digest

        digest = getattr(s, "pixels_", None)
        seen.append(digest)
        assert digest == _digest(np.ascontiguousarray(src)), "the scene's digest is of this very sample"
        plain = Scene.keyed(s.descriptor, s.key)  # type: ignore[attr-defined]
        return real_slot(src, plain)

    import unittest.mock

    with unittest.mock.patch.object(color, "_mean_slot", rehash):
        rehashed, _ = perturb.apply(batch, "contrast", 3, ["a"], protect_border=True)
    assert seen and all(isinstance(d, bytes) for d in seen), "the engine's scene carries the digest"
    assert torch.equal(with_digest, rehashed)


def test_kernels_compile_in_memory_where_numba_has_no_cache_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only install whose user has no writable home (nor ``NUMBA_CACHE_DIR``): numba finds
    no folder for its on-disk cache and raises for ``cache=True`` when the kernels module is
    imported. The kernels then compile in memory instead of failing every protected op."""
    import importlib.util

    from numba.core import caching

    from perturb.scene import _compiled

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in numba 0.59
    monkeypatch.delenv("NUMBA_CACHE_LOCATOR_CLASSES", raising=False)
    monkeypatch.setattr(impl, "_locator_classes", [])  # what numba sees there: no folder at all
    spec = importlib.util.spec_from_file_location("perturb_scene_compiled_uncached", _compiled.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # a fresh import of the kernels, not this process's
    assert native._agrees(native.Kernels(fresh.compose, fresh.blend, fresh.lookup_compose))


def test_compose_lookup_declines_other_dtypes_layouts_and_table_counts() -> None:
    """With the kernel available: a uint16 or non-contiguous sample, or two tables for three
    planes (the kernel would read a third table past the end), is declined, nothing written."""
    name = _frames()[0]
    img, scene = small_frame(name)
    src = np.ascontiguousarray(np.moveaxis(img, -1, 0))
    lookup = _math.lookup_function()
    assert native.lookup_kernel(lookup) is not None
    tables = np.tile(np.arange(256, dtype=np.uint8), (3, 1))
    cases = [
        (src.astype(np.uint16), tables),
        (np.moveaxis(img, -1, 0), tables),  # a view of the HWC frame: not C-contiguous
        (src, tables[:2]),
    ]
    for sample, luts in cases:
        dst = np.zeros(sample.shape, sample.dtype)
        assert not masks.compose_lookup(sample, dst, luts, lookup, scene.descriptor)
        assert not dst.any()
    dst = np.zeros_like(src)
    assert masks.compose_lookup(src, dst, tables[:1], lookup, scene.descriptor)
    assert masks.compose_lookup(src, dst, tables, lookup, scene.descriptor)
