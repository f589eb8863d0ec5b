"""Augment analyses each source image's scene once and carries it through the chain: cached per
dataset index (checked against the pixels), moved with the crops and warps
(``perturb.augment.targets.move_scene``), stored in each border-protecting record."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

import perturb
import perturb.scene.analysis as scene_analysis
from perturb.augment import Augment, apply_plans, load_policy
from perturb.augment.module import AugmentResult
from perturb.augment.targets import move_scene
from perturb.scene import Scene
from tests.helpers import ENDOSCOPY, downscaled, require_samples, sample_tensor

CROP_THEN_COLOUR = load_policy(
    {
        "policy": "crop-colour",
        "ops": ["resized_crop", "rotation", "brightness", "contrast"],
        "num_ops": 3,
        "probability": 1.0,
        "strength": [1.0, 3.0],
    }
)


def _frames(n: int, salt: int = 0) -> torch.Tensor:
    """``n`` real uint8 frames at 144x176 (long side 176); ``salt`` flips the lowest bit of a
    few pixels so their digests are new to every cache of the process."""
    require_samples()
    frames = []
    for i in range(n):
        small = downscaled(sample_tensor(ENDOSCOPY[i % len(ENDOSCOPY)]), 176)
        u8 = (small * 255).round().to(torch.uint8)
        u8 = torch.nn.functional.interpolate(u8[None].float(), size=(144, 176)).to(torch.uint8)[0]
        u8[:, 70, : 1 + (salt % 50)] ^= 1
        frames.append(u8)
    return torch.stack(frames).contiguous()


@pytest.fixture
def analyses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, ...]]]:
    """The shapes of the images the scene analysis runs on, as it runs."""
    seen: list[tuple[int, ...]] = []
    original = scene_analysis._analyse

    def counted(rgb: np.ndarray) -> dict:
        seen.append(rgb.shape)
        return original(rgb)

    monkeypatch.setattr(scene_analysis, "_analyse", counted)
    yield seen


def test_each_source_image_is_analysed_once(analyses: list[tuple[int, ...]]) -> None:
    x = _frames(4, salt=11)
    augment = Augment(CROP_THEN_COLOUR, seed=3, return_records=True, carry_scenes=True)
    out = augment(x, [0, 1, 2, 3])
    assert isinstance(out, AugmentResult) and out.records is not None
    protecting = sum(r.protect_border for chain in out.records for r in chain)
    moved_first = sum(
        chain[0].op in ("resized_crop", "rotation") and any(r.protect_border for r in chain)
        for chain in out.records
    )
    assert moved_first >= 1, "no chain warps before a protecting op: nothing carried"
    assert len(analyses) == 4 < protecting  # the sources, never an intermediate image
    assert augment.scenes.misses == 4
    for epoch in (1, 2):  # later epochs: new crops and strengths, the same sources
        augment(x, [0, 1, 2, 3], epoch=epoch)
    assert len(analyses) == 4 and augment.scenes.hits == 8


def test_scenes_analysed_before_the_loader_reach_its_workers(
    analyses: list[tuple[int, ...]],
) -> None:
    """A DataLoader worker gets a pickled copy of the augment (every epoch when its workers are
    not persistent): the scenes analysed in the main process come with it, and the copy's
    outputs are the original's."""
    x = _frames(3, salt=15)
    augment = Augment(CROP_THEN_COLOUR, seed=2, carry_scenes=True)
    for index, chw in enumerate(x):  # tensors, as a Dataset yields them (numpy arrays too)
        augment.scenes.scene(index, chw)
    assert len(analyses) == 3
    assert augment.scenes.scene(0, x[0].numpy()) == augment.scenes.scene(0, x[0])
    assert len(analyses) == 3
    worker = pickle.loads(pickle.dumps(augment))
    assert len(worker.scenes) == 3
    out = worker(x, [0, 1, 2], epoch=4)
    assert len(analyses) == 3 and worker.scenes.misses == 0
    want = augment(x, [0, 1, 2], epoch=4)
    assert isinstance(out, torch.Tensor) and isinstance(want, torch.Tensor)
    assert torch.equal(out, want)


def test_changed_pixels_at_an_index_are_analysed_again() -> None:
    x = _frames(3, salt=12)
    augment = Augment(CROP_THEN_COLOUR, seed=1, carry_scenes=True)
    augment(x, [0, 1, 2])
    other = x.roll(1, 0).contiguous()  # other images under the same indices
    warm = augment(other, [0, 1, 2])
    cold = Augment(CROP_THEN_COLOUR, seed=1, carry_scenes=True, scene_cache=0)(other, [0, 1, 2])
    assert isinstance(warm, torch.Tensor) and isinstance(cold, torch.Tensor)
    assert torch.equal(warm, cold)
    assert augment.scenes.misses == 6


def test_outputs_do_not_depend_on_the_cache_or_the_batch() -> None:
    x = _frames(4, salt=13)
    augment = Augment(CROP_THEN_COLOUR, seed=5, carry_scenes=True)
    first = augment(x, [0, 1, 2, 3])
    again = augment(x, [0, 1, 2, 3])
    alone = torch.cat([augment(x[i : i + 1], [i]) for i in (2, 0, 3, 1)])[[1, 3, 0, 2]]
    uncached = Augment(CROP_THEN_COLOUR, seed=5, carry_scenes=True, scene_cache=0)(x, [0, 1, 2, 3])
    for other in (again, alone, uncached):
        assert isinstance(other, torch.Tensor) and torch.equal(first, other)


def test_where_the_scene_is_the_source_s_the_outputs_are_unchanged() -> None:
    """Chains whose border-protecting op comes first ran with the scene of the clean input before
    the scene was carried too: the bytes are those of the engine analysing each input."""
    x = _frames(4, salt=14)
    policy = load_policy(
        {
            "policy": "colour",
            "ops": ["brightness", "contrast", "gamma"],
            "num_ops": 1,
            "probability": 1.0,
        }
    )
    augment = Augment(policy, seed=2, return_records=True, carry_scenes=True)
    out = augment(x, [0, 1, 2, 3])
    assert isinstance(out, AugmentResult) and out.records is not None
    bare = [
        [replace(r, extra={k: v for k, v in r.extra.items() if k != "scene"}) for r in c]
        for c in out.records
    ]
    assert torch.equal(out.images, apply_plans(x, bare))  # the engine analyses each input itself


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


@pytest.mark.parametrize("op", ["rotation", "resized_crop", "translation"])
def test_a_moved_scene_is_the_scene_of_the_moved_frame(op: str) -> None:
    """On frames without overlays the carried field is the field the analysis finds on the
    moved frame (on frames with a scope-position box the carried one is better: a rotated box
    is no longer a flat rectangle and the analysis merges it into the field)."""
    require_samples()
    checked = 0
    for path in ENDOSCOPY:
        x = (downscaled(sample_tensor(path), 288) * 255).round().to(torch.uint8).unsqueeze(0)
        source = Scene.of(x[0])
        if source.descriptor["overlays"] or source.descriptor.get("full"):
            continue
        height, width = x.shape[-2:]
        out, (record,) = perturb.apply(x, op, 5, [path.name])
        moved = Scene.from_descriptor(move_scene(source.descriptor, record, width, height))
        found = Scene.of(out[0])
        assert _iou(moved.field > 0.5, found.field > 0.5) > 0.97, path.name
        checked += 1
    assert checked >= 3


def test_a_frame_without_surround_gets_its_black_fill_as_surround() -> None:
    yy, xx = torch.meshgrid(torch.arange(96.0), torch.arange(128.0), indexing="ij")
    tissue = 150 + 40 * torch.sin(xx / 9) * torch.cos(yy / 7)  # bright texture up to the edges
    x = tissue.expand(1, 3, 96, 128).round().to(torch.uint8).contiguous()
    source = Scene.of(x[0])
    assert source.field.min() == 1.0  # the field is the whole frame
    _, (rotated,) = perturb.apply(x, "rotation", 5, ["a"])
    moved = Scene.from_descriptor(move_scene(source.descriptor, rotated, 128, 96))
    assert not moved.descriptor.get("full")
    assert moved.field[0, 0] == 0 and moved.field[-1, -1] == 0 and moved.field[48, 64] == 1
    _, (cropped,) = perturb.apply(x, "resized_crop", 5, ["a"])
    zoomed = Scene.from_descriptor(move_scene(source.descriptor, cropped, 128, 96))
    assert zoomed.field.min() == 1.0  # a zoom still fills the frame
    whole = {**source.descriptor, "full": True}  # the analysis' own whole-frame form stays whole
    assert move_scene(whole, cropped, 128, 96) == whole
    assert not move_scene(whole, rotated, 128, 96).get("full")


def test_ops_that_keep_the_frame_keep_the_scene() -> None:
    x = _frames(1, salt=15)
    source = Scene.of(x[0]).descriptor
    _, (kept,) = perturb.apply(x, "lens_distortion", 4, ["a"])  # protects the border: frame kept
    _, (colour,) = perturb.apply(x, "brightness", 4, ["a"])
    assert kept.protect_border
    assert move_scene(source, kept, 176, 144) == source == move_scene(source, colour, 176, 144)
    # the same op over the whole frame bends it: its edge points move (not projective)
    out, (bent,) = perturb.apply(x, "lens_distortion", 4, ["a"], protect_border=False)
    moved = Scene.from_descriptor(move_scene(source, bent, 176, 144))
    assert moved.descriptor != source
    assert _iou(moved.field > 0.5, Scene.of(out[0]).field > 0.5) > 0.95


def test_carried_records_replay_and_are_the_plans() -> None:
    """Each border-protecting record stores the scene it ran with: replay reproduces the sample
    bit for bit from the records alone; apart from that scene the records are the plans."""
    x = _frames(4, salt=16)
    augment = Augment("augment-endoscopy", seed=2, return_records=True, carry_scenes=True)
    out = augment(x, [0, 1, 2, 3])
    assert isinstance(out, AugmentResult) and out.records is not None
    plans = augment.plan([0, 1, 2, 3], channels=3)
    bare = [
        [replace(r, extra={k: v for k, v in r.extra.items() if k != "scene"}) for r in c]
        for c in out.records
    ]
    assert bare == plans
    assert all(("scene" in r.extra) == r.protect_border for c in out.records for r in c)
    assert any(r.protect_border for c in out.records for r in c), (
        "no scene carried: nothing checked"
    )
    for i, chain in enumerate(out.records):
        replayed = perturb.replay([r.to_dict() for r in chain], x[i]) if chain else x[i]
        assert torch.equal(replayed, out.images[i])


def test_scenes_are_carried_by_default_and_analysed_per_op_when_asked() -> None:
    """The default carries each source's scene; ``carry_scenes=False`` analyses each
    border-protecting op's input instead, and each record stores the scene it ran with."""
    x = _frames(2, salt=17)
    carried = Augment(CROP_THEN_COLOUR, seed=4, return_records=True)(x, [0, 1])
    assert isinstance(carried, AugmentResult) and carried.records is not None
    assert any("scene" in r.extra for c in carried.records for r in c)
    default = Augment(CROP_THEN_COLOUR, seed=4, return_records=True, carry_scenes=False)
    out = default(x, [0, 1])
    assert isinstance(out, AugmentResult) and out.records is not None
    assert all("scene" in r.extra for c in out.records for r in c if r.protect_border)
    assert len(default.scenes) == 0  # nothing cached: each op's input analysed where it runs
    assert torch.equal(out.images, apply_plans(x, out.records))
