"""The Augment module: reproducible whatever the DataLoader workers, batch size and order;
records for logging; eval() is the identity; inputs checked with messages naming the fix."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import perturb
from perturb.augment import Augment, AugmentResult, apply_plans, load_policy, plan_batch
from perturb.errors import InputError
from tests.helpers import small_batch

POLICY = load_policy(
    {
        "policy": "mixed",
        "ops": [
            "rotation",
            "resized_crop",
            "contrast",
            "gaussian_noise",
            "color_cast",
            "gaussian_blur",
        ],
        "num_ops": [1, 2],
        "probability": 0.9,
        "strength": [1.0, 3.0],
    }
)
N = 10


class Frames(Dataset):
    """A tiny dataset of uint8 frames; ``augment`` set: each item is augmented in the worker."""

    def __init__(self, augment: Augment | None = None) -> None:
        self.images = (small_batch(N, 32, 40) * 255).round().to(torch.uint8)
        self.augment = augment

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = self.images[i]
        if self.augment is not None:
            out = self.augment(image.unsqueeze(0), [i])
            assert isinstance(out, torch.Tensor)
            image = out[0]
        return image, i


def _run(loader: DataLoader, augment: Augment | None) -> dict[int, torch.Tensor]:
    got: dict[int, torch.Tensor] = {}
    for images, indices in loader:
        if augment is not None:
            images = augment(images, indices)
        for image, i in zip(images, indices.tolist(), strict=True):
            got[i] = image
    return got


@pytest.fixture(scope="module")
def reference() -> dict[int, torch.Tensor]:
    """Epoch 3 of seed 5, one whole batch in the main process."""
    data = Frames()
    augment = Augment(POLICY, seed=5, epoch=3)
    out = augment(data.images, list(range(N)))
    assert isinstance(out, torch.Tensor)
    return dict(enumerate(out))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_same_pixels_for_any_workers_batch_size_and_order(
    reference: dict[int, torch.Tensor], workers: int, batch_size: int
) -> None:
    augment = Augment(POLICY, seed=5)
    augment.set_epoch(3)
    order = torch.Generator().manual_seed(batch_size)  # the loader's own shuffling, not ours
    loader = DataLoader(
        Frames(), batch_size=batch_size, shuffle=True, generator=order, num_workers=workers
    )
    got = _run(loader, augment)
    assert sorted(got) == list(range(N))
    assert all(torch.equal(got[i], reference[i]) for i in range(N))


def test_same_pixels_when_augmenting_inside_workers(reference: dict[int, torch.Tensor]) -> None:
    augment = Augment(POLICY, seed=5, epoch=3)
    loader = DataLoader(Frames(pickle.loads(pickle.dumps(augment))), batch_size=3, num_workers=2)
    got = _run(loader, None)
    assert all(torch.equal(got[i], reference[i]) for i in range(N))


def _stack(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, list[int]]:
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_workers(context: str) -> None:
    """A module held by the dataset, augmenting in persistent workers: set_epoch in the main
    process reaches them (the epoch lives in shared memory), so epoch 1 is not epoch 0 again;
    the pixels equal the main process's draws of each epoch. A pickled copy keeps its own."""
    augment = Augment(POLICY, seed=5)
    loader = DataLoader(
        Frames(augment),
        batch_size=5,
        num_workers=2 if context == "fork" else 1,
        persistent_workers=True,
        multiprocessing_context=context,
        collate_fn=_stack,
    )
    images = Frames().images
    seen = []
    for epoch in (0, 1, 2):
        augment.set_epoch(epoch)
        want = Augment(POLICY, seed=5, epoch=epoch)(images, list(range(N)))
        assert isinstance(want, torch.Tensor)
        got: dict[int, torch.Tensor] = {}
        for batch, indices in loader:
            got.update(zip(indices, batch, strict=True))
        assert sorted(got) == list(range(N))
        assert all(torch.equal(got[i], want[i]) for i in range(N)), f"epoch {epoch}"
        seen.append(torch.stack([got[i] for i in range(N)]))
    assert not torch.equal(seen[0], seen[1])
    copy = pickle.loads(pickle.dumps(augment))
    augment.set_epoch(7)
    assert copy.epoch == 2 and augment.epoch == 7
    # a module pickled when the epoch was a plain attribute still unpickles, with its epoch
    old = {k: v for k, v in augment.__dict__.items() if k != "_epoch_cell"} | {"epoch": 5}
    legacy = Augment.__new__(Augment)
    legacy.__setstate__(old)
    assert legacy.epoch == 5
    with pytest.raises(InputError, match="below 2"):
        augment.set_epoch(1 << 63)


def test_epochs_and_seeds_change_the_draws(reference: dict[int, torch.Tensor]) -> None:
    images = Frames().images
    for augment in (Augment(POLICY, seed=5, epoch=4), Augment(POLICY, seed=6, epoch=3)):
        out = augment(images, list(range(N)))
        assert isinstance(out, torch.Tensor)
        assert sum(not torch.equal(out[i], reference[i]) for i in range(N)) >= N // 2
    again = Augment(POLICY, seed=5)(images, list(range(N)), epoch=3)
    assert isinstance(again, torch.Tensor)
    assert all(torch.equal(again[i], reference[i]) for i in range(N))


def test_records_replay_and_match_the_plans() -> None:
    images = Frames().images
    augment = Augment("augment-endoscopy", seed=2, return_records=True)
    out = augment(images, torch.arange(N))
    assert isinstance(out, AugmentResult) and out.boxes is None and out.masks is None
    # the records are the plans, plus the carried scene of each border-protecting record
    without_scenes = [
        [replace(r, extra={k: v for k, v in r.extra.items() if k != "scene"}) for r in chain]
        for chain in out.records
    ]
    assert without_scenes == plan_batch(
        augment.policy, seed=2, epoch=0, indices=range(N), channels=3
    )
    assert torch.equal(out.images, apply_plans(images, out.records))
    for i, chain in enumerate(out.records):
        replayed = perturb.replay([r.to_dict() for r in chain], images[i]) if chain else images[i]
        assert torch.equal(replayed, out.images[i])


def test_eval_mode_is_identity_and_gray_batches_skip_colour_ops() -> None:
    images = Frames().images
    augment = Augment(POLICY, seed=1, return_records=True).eval()
    out = augment(images, list(range(N)))
    assert isinstance(out, AugmentResult)
    assert torch.equal(out.images, images) and out.records == [[] for _ in range(N)]
    gray = images[:, :1].contiguous()
    res = augment.train()(gray, list(range(N)))
    assert isinstance(res, AugmentResult) and res.images.shape == gray.shape
    assert res.records is not None and all(r.op != "color_cast" for p in res.records for r in p)


def test_module_input_errors() -> None:
    augment = Augment(POLICY)
    x = torch.zeros(2, 3, 16, 16)
    with pytest.raises(InputError, match="one dataset index per image"):
        augment(x, [0])
    with pytest.raises(InputError, match="non-negative integer"):
        augment(x, [0, -1])
    with pytest.raises(InputError, match="unsqueeze"):
        augment(x[0], [0])
    with pytest.raises(InputError, match="sequence or tensor"):
        augment(x, 3)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="non-negative integer"):
        augment.set_epoch(-1)
    with pytest.raises(InputError, match=r"bfloat16 is not supported; use float32"):
        augment(x.bfloat16(), [0, 1])  # named before the scene analysis reads the pixels
    normalised = (torch.rand(2, 3, 16, 16) - 0.485) / 0.229
    with pytest.raises(InputError, match="perturb before normalising"):
        augment(normalised, [0, 1])
    assert "mixed" in repr(augment) and perturb.Augment is Augment


def test_an_empty_batch_comes_back_as_it_is() -> None:
    """The X-ray part of a mixed batch may hold no radiograph: a module with modality=xray
    returns the empty batch (and empty targets and records) instead of an error."""
    augment = Augment("augment-xray", seed=0, modality="xray")
    empty = torch.zeros(0, 1, 32, 32)
    assert augment(empty, []) is empty
    augment.return_records = True
    result = augment(empty, torch.zeros(0, dtype=torch.int64), boxes=[])
    assert isinstance(result, AugmentResult)
    assert result.images is empty and result.boxes == [] and result.records == []
    with pytest.raises(InputError, match="one dataset index per image"):
        augment(empty, [0])


def test_a_batch_that_requires_grad_is_augmented_without_warnings() -> None:
    import warnings

    x = torch.rand(2, 3, 16, 16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = Augment(POLICY, seed=0)(x, [0, 1])
    assert isinstance(out, torch.Tensor) and out.shape == x.shape


def test_module_on_each_device(device: str) -> None:
    """Same records on every device; the batch stays on its device and keeps its dtype."""
    images = Frames().images
    augment = Augment(POLICY, seed=3, return_records=True)
    out = augment(images.to(device), list(range(N)))
    ref = augment(images, list(range(N)))
    assert isinstance(out, AugmentResult) and isinstance(ref, AugmentResult)
    assert out.images.device.type == device and out.images.dtype == torch.uint8
    assert out.records is not None and ref.records is not None
    assert [[(r.op, r.params) for r in p] for p in out.records] == [
        [(r.op, r.params) for r in p] for p in ref.records
    ]
    assert all(r.device == device for p in out.records for r in p)


def _plan_in_worker(
    batch: list[tuple[torch.Tensor, int]], augment: Augment
) -> tuple[torch.Tensor, list[int], list]:
    images = torch.stack([b[0] for b in batch])
    indices = [b[1] for b in batch]
    return images, indices, augment.plan(indices, channels=images.shape[1])


def test_plans_made_in_workers_give_the_same_pixels(reference: dict[int, torch.Tensor]) -> None:
    """Host-side planning can run in the DataLoader's workers (collate_fn); forward(plans=)
    then only runs the kernels."""
    import functools

    augment = Augment(POLICY, seed=5, epoch=3)
    collate = functools.partial(_plan_in_worker, augment=augment)
    loader = DataLoader(
        Frames(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(1),
    )
    seen = 0
    for images, indices, plans in loader:
        out = augment(images, indices, plans=plans)
        assert isinstance(out, torch.Tensor)
        for image, i in zip(out, indices, strict=True):
            assert torch.equal(image, reference[i])
            seen += 1
    assert seen == N
    plans = augment.plan([0, 1], channels=3)
    with pytest.raises(InputError, match="do not belong to this batch"):
        augment(Frames().images[:2], [1, 0], plans=plans)
    with pytest.raises(InputError, match="one plan per image"):
        augment(Frames().images[:2], [0, 1], plans=plans[:1])


def test_plans_of_another_epoch_or_variant_are_refused() -> None:
    """Plans made by a copy of the module that missed set_epoch (persistent DataLoader workers)
    would silently repeat an old epoch's augmentations: forward(plans=) refuses them."""
    augment = Augment(POLICY, seed=5, epoch=3)
    images = Frames().images[:4]
    stale = augment.plan([0, 1, 2, 3], channels=3)
    assert any(stale), "no sample augmented: the check below would not run"
    augment.set_epoch(4)
    with pytest.raises(InputError, match="set_epoch"):
        augment(images, [0, 1, 2, 3], plans=stale)
    with pytest.raises(InputError, match="set_epoch"):
        augment(images, [0, 1, 2, 3], epoch=2, plans=stale)
    fresh = augment.plan([0, 1, 2, 3], channels=3)
    assert torch.equal(augment(images, [0, 1, 2, 3], plans=fresh), augment(images, [0, 1, 2, 3]))
    assert torch.equal(
        augment(images, [0, 1, 2, 3], epoch=3, plans=stale), augment(images, [0, 1, 2, 3], epoch=3)
    )
    other = Augment(POLICY, seed=5, epoch=4, variant=1)
    with pytest.raises(InputError, match="set_epoch"):
        other(images, [0, 1, 2, 3], plans=fresh)


def test_ops_left_out_by_the_channel_count_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gray film repeated to 3 channels loses every X-ray op of augment-xray: a warning names
    them and the fix (augment 1 channel, repeat after); the 1-channel film warns nothing, nor
    does a mixed policy's colour ops left out of a gray batch (documented), unless none is left."""
    import warnings

    from perturb.augment import plan

    monkeypatch.setattr(plan, "_WARNED", set())  # said once per process: not by earlier tests
    film = torch.rand(6, 1, 40, 32)
    with pytest.warns(UserWarning, match=r"leaves out 10 of its ops \(xray_exposure.*images\[:, :1\]"):
        Augment("augment-xray", seed=0)(film.expand(-1, 3, -1, -1).contiguous(), list(range(6)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Augment("augment-xray", seed=0)(film, list(range(6)))
        Augment(POLICY, seed=0)(film, list(range(6)))
    colour = load_policy({"policy": "colour", "ops": ["hue_shift", "saturation"], "probability": 1.0})
    with pytest.warns(UserWarning, match="no sample is augmented"):
        out = Augment(colour, seed=0)(film, list(range(6)))
    assert torch.equal(out, film)
    with warnings.catch_warnings(record=True) as again:  # once per process, whatever the filters
        warnings.simplefilter("always")
        Augment("augment-xray", seed=0)(film.expand(-1, 3, -1, -1).contiguous(), list(range(6, 12)))
    assert not [w for w in again if "leaves out" in str(w.message)]


def test_unknown_modality_is_refused() -> None:
    """A misspelt modality would silently keep only the policy's generic ('any') ops."""
    with pytest.raises(InputError, match=r"unknown modality 'endoscopie'; known: .*endoscopy"):
        Augment(POLICY, modality="endoscopie")
    with pytest.raises(InputError, match="unknown modality"):
        plan_batch(POLICY, seed=0, epoch=0, indices=[0], modality="x-ray")
    assert Augment(POLICY, modality="endoscopy").modality == "endoscopy"
