"""Guessed scenes on the lookup-table path: a frame seen before is recognised from a fingerprint
of its middle, run with the remembered scene while its full digest is taken in the same pass,
and kept only where that digest is the remembered frame's; otherwise it runs again with its own
scene. The bytes and records are those of analysing every frame afresh."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

import perturb
from perturb import engine
from perturb.ops import _math
from perturb.scene import analysis, masks, native
from tests.scene.frames import overlay_batch

pytest.importorskip("numba", reason="the fused lookup pass needs numba (a core dependency)")


@pytest.fixture
def fresh_caches() -> None:
    """No frame remembered from other tests."""
    from perturb.ops import color

    with analysis._CACHE_LOCK:
        analysis._CACHE.clear()
        analysis._PRINTS.clear()
    with color._MEANS_LOCK:
        color._MEANS.clear()


class _Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.guessed: list[int] = []
        self.confirmed: list[int] = []
        guess, confirm = engine._RecordScenes.guess, engine._RecordScenes.confirm

        def spy_guess(scenes: Any, i: int) -> Any:
            found = guess(scenes, i)
            if found is not None:
                self.guessed.append(i)
            return found

        def spy_confirm(scenes: Any, i: int, scene: Any) -> None:
            self.confirmed.append(i)
            confirm(scenes, i, scene)

        monkeypatch.setattr(engine._RecordScenes, "guess", spy_guess)
        monkeypatch.setattr(engine._RecordScenes, "confirm", spy_confirm)


def test_hasher_is_available_and_agrees() -> None:
    hasher = native.stream_hasher()
    assert hasher is not None, "xxhash is installed (datasets brings it): the streaming digest must load"
    assert native._hasher_agrees(hasher)


def test_hasher_probe_catches_a_wrong_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    hasher = native.stream_hasher()
    assert hasher is not None
    monkeypatch.setattr(hasher, "digest", lambda state: bytes(16))
    assert not native._hasher_agrees(hasher)


@pytest.mark.parametrize("name_index", [0, 1])
def test_hashed_lookup_gives_the_digest_and_the_bytes(name_index: int) -> None:
    x = overlay_batch()
    sample = x[name_index % x.shape[0]].numpy()
    scene = perturb.scene(torch.from_numpy(sample))
    table = np.clip(np.arange(256) * 1.3 - 20, 0, 255).astype(np.uint8)
    lookup = _math.lookup_function()
    plain = np.zeros_like(sample)
    assert masks.compose_lookup(sample, plain, table, lookup, scene.descriptor)
    hashed = np.zeros_like(sample)
    digest = masks.compose_lookup_hashed(sample, hashed, table, lookup, scene.descriptor)
    assert digest == analysis._digest(sample.data)
    assert np.array_equal(hashed, plain)


def test_unseen_frames_are_not_guessed(fresh_caches: None) -> None:
    x = overlay_batch()
    assert all(analysis.guess(x[i]) is None for i in range(x.shape[0]))


@pytest.mark.parametrize("op", ["brightness", "gamma", "color_cast"])
def test_a_frame_seen_before_is_guessed_with_the_same_bytes_and_records(
    op: str, fresh_caches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = overlay_batch()
    keys = [f"k{i}" for i in range(x.shape[0])]
    spy = _Spy(monkeypatch)
    first, first_records = perturb.apply(x, op, 4, keys)
    assert spy.guessed == []  # nothing remembered yet: every scene analysed
    second, second_records = perturb.apply(x, op, 4, keys)
    assert sorted(spy.confirmed) == list(range(x.shape[0]))
    assert torch.equal(first, second)
    assert [r.to_dict() for r in first_records] == [r.to_dict() for r in second_records]
    assert torch.equal(perturb.replay(second_records, x), second)


def _wrong_guess(op: str, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Two frames that agree in the fingerprinted middle but differ elsewhere: the second is
    guessed to be the first (``op`` ran on it), its digest says otherwise, and it gets its own
    scene and bytes. Returns both frames."""
    x = overlay_batch(limit=1)[:1]
    other = x.clone()
    other[:, :, :40, :] = 255 - other[:, :, :40, :]  # the top rows: the middle is untouched
    assert analysis._fingerprint(other[0].numpy()) == analysis._fingerprint(x[0].numpy())
    perturb.apply(x, op, 5, ["a"])  # remembers x's scene and fingerprint (and contrast's mean)
    spy = _Spy(monkeypatch)
    out, records = perturb.apply(other, op, 5, ["a"])
    assert spy.guessed == [0] and spy.confirmed == []
    own = perturb.scene(other[0])
    want, _ = perturb.apply(other, op, 5, ["a"], scenes=[own])
    assert torch.equal(out, want)
    assert records[0].extra["scene"] == own.descriptor
    return x, other


def test_a_wrong_guess_runs_the_frame_again_with_its_own_scene(
    fresh_caches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, other = _wrong_guess("brightness", monkeypatch)
    # two frames share that fingerprint now: neither is guessed again
    assert analysis.guess(x[0]) is None and analysis.guess(other[0]) is None


def test_contrast_guesses_once_its_mean_is_cached(fresh_caches: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """contrast's table reads the scene (its tissue mean): from a guessed scene it declines
    until the frame's mean is cached under its checked digest, then the guess is used."""
    from perturb.ops import color

    x = overlay_batch()
    keys = [f"k{i}" for i in range(x.shape[0])]
    with color._MEANS_LOCK:
        color._MEANS.clear()
    perturb.apply(x, "brightness", 3, keys)  # frames and fingerprints remembered, no means
    spy = _Spy(monkeypatch)
    first, _ = perturb.apply(x, "contrast", 3, keys)
    assert sorted(spy.guessed) == list(range(x.shape[0])) and spy.confirmed == []  # declined
    second, records = perturb.apply(x, "contrast", 3, keys)
    assert sorted(spy.confirmed) == list(range(x.shape[0]))
    assert torch.equal(first, second)
    assert torch.equal(perturb.replay(records, x), second)
    digests = {analysis._digest(x[i].numpy().data) for i in range(x.shape[0])}
    assert {slot[0] for slot in color._MEANS} <= digests  # every mean under its own frame's digest


def test_contrast_with_a_wrong_guess_gets_its_own_mean(fresh_caches: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from perturb.ops import color

    x, other = _wrong_guess("contrast", monkeypatch)
    digests = {analysis._digest(t[0].numpy().data) for t in (x, other)}
    assert {slot[0] for slot in color._MEANS} <= digests


def test_contrast_mean_evicted_after_the_check_is_not_cached_under_the_guess(
    fresh_caches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mean a guessed scene's table checks for may leave the cache before the table reads it
    (the other worker fills the cache in between): the table must then use the mean it checked,
    not compute one from this sample and cache it under the guessed frame's unchecked digest."""
    from perturb.ops import color

    x = overlay_batch(limit=1)[:1]
    other = x.clone()
    other[:, 0] = 255 - other[:, 0]  # the red plane: x's fingerprint (the middle), another tissue mean
    assert analysis._fingerprint(other[0].numpy()) == analysis._fingerprint(x[0].numpy())
    want_x, _ = perturb.apply(x, "contrast", 5, ["a"])  # x's scene, fingerprint and mean cached
    digest_x = analysis._digest(x[0].numpy().data)
    (slot_x,) = [slot for slot in color._MEANS if slot[0] == digest_x]
    mean_x = color._MEANS[slot_x]
    cached_mean = color._cached_mean

    def evicted_after_first_look(slot: Any) -> Any:
        hit = cached_mean(slot)
        if slot == slot_x:  # as if the other worker's inserts evicted it right after this look
            with color._MEANS_LOCK:
                color._MEANS.pop(slot, None)
        return hit

    monkeypatch.setattr(color, "_cached_mean", evicted_after_first_look)
    spy = _Spy(monkeypatch)
    out, _ = perturb.apply(other, "contrast", 5, ["a"])
    assert spy.guessed == [0] and spy.confirmed == []
    assert color._MEANS.get(slot_x, mean_x) == mean_x  # never another frame's mean under x's digest
    monkeypatch.setattr(color, "_cached_mean", cached_mean)
    own = perturb.scene(other[0])
    want_other, _ = perturb.apply(other, "contrast", 5, ["a"], scenes=[own])
    assert torch.equal(out, want_other)
    again, _ = perturb.apply(x, "contrast", 5, ["a"])
    assert torch.equal(again, want_x)


def test_descriptor_copies_are_fresh_json_equal_dicts() -> None:
    x = overlay_batch(limit=1)
    _, text, _, _ = analysis.analysed_with_digest(x[0])
    first = analysis.descriptor_copy(text)
    assert first == json.loads(text) and _types(first) == _types(json.loads(text))
    first["overlays"].append([0, 0, 1, 1, "text"])
    first["bbox"][0] = -1
    second = analysis.descriptor_copy(text)
    assert second == json.loads(text)  # the first copy's changes did not reach the next


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def test_a_threads_digest_state_is_freed_when_the_thread_ends() -> None:
    import ctypes
    import gc
    import threading

    import xxhash._xxhash as library

    hasher = native.StreamHasher(ctypes.CDLL(library.__file__))
    freed: list[int] = []
    real_free = hasher._free

    def spy(address: int) -> int:
        freed.append(address)
        return int(real_free(address))

    hasher._free = spy  # type: ignore[assignment]
    made: list[int] = []
    worker = threading.Thread(target=lambda: made.append(hasher.state()))
    worker.start()
    worker.join()
    del worker
    gc.collect()
    assert made and freed == made
