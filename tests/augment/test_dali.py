"""The DALI pipeline (perturb.augment.dali) against the torch module on the same keys.

Reference: DALI's own decode + resize without augmentation (the same decoder and resize as the
augmenting pipeline), then ``perturb.Augment`` on those uint8 images. On the CPU the two paths
agree exactly (0 of 255 levels): the torch stages run the same kernels on the same bytes, and
the one op DALI runs itself (translation as ``fn.slice``) is the same data movement.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -e '.[dali]')")

from perturb.augment import Augment, load_policy, plan_sample
from perturb.augment.dali import (
    DALI_OPS,
    DaliLoader,
    build_pipeline,
    check_format,
    dali_loader,
    epoch_order,
    image_source,
)
from perturb.errors import InputError
from tests.helpers import DEVICES, ENDOSCOPY, XRAY, require_samples

SIZE = (72, 96)  # small frames keep the suite fast; the benchmark runs 448x448
N = 10  # 10 items in batches of 4: the last batch is padded
SEED = 7
# Chains of 1-3 ops: geometry (incl. translation, DALI's own op), colour/exposure, noise, JPEG.
POLICY = load_policy(
    {
        "policy": "dali-test",
        "ops": [
            {"op": "translation", "weight": 2.0},
            "rotation",
            "resized_crop",
            "brightness",
            "contrast",
            "hue_shift",
            "vignetting",
            "gaussian_noise",
            "jpeg",
        ],
        "num_ops": [1, 3],
        "probability": 0.75,
        "strength": [1.0, 4.0],
    }
)


def _files() -> list[Path]:
    require_samples()
    return ENDOSCOPY[:N]


def _u8(images: torch.Tensor) -> torch.Tensor:
    """The pipeline's float output in [0, 1] (x / 255) back to the uint8 it came from."""
    return (images * 255.0).round().clamp(0, 255).to(torch.uint8)


def _collect(loader: DaliLoader, epochs: int) -> dict[tuple[int, int], tuple[torch.Tensor, list]]:
    out: dict[tuple[int, int], tuple[torch.Tensor, list]] = {}
    for _ in range(epochs):
        for batch in loader:
            records = batch.records or [[] for _ in batch.indices]
            for image, index, recs in zip(
                batch.images, batch.indices.tolist(), records, strict=True
            ):
                assert (batch.epoch, index) not in out, "an item came twice in one epoch"
                out[(batch.epoch, index)] = (image.cpu(), recs)
    return out


@pytest.fixture(scope="module")
def clean() -> dict[int, torch.Tensor]:
    """DALI decode + resize, no augmentation: uint8 CHW by dataset index."""
    loader = dali_loader(_files(), None, size=SIZE, batch_size=4)
    got = _collect(loader, 1)
    return {index: _u8(image) for (_, index), (image, _) in got.items()}


@pytest.fixture(scope="module")
def augmented() -> dict[tuple[int, int], tuple[torch.Tensor, list]]:
    """Two epochs of the augmenting pipeline (batch 4, dataset order), with records."""
    loader = dali_loader(_files(), POLICY, seed=SEED, size=SIZE, batch_size=4, return_records=True)
    return _collect(loader, 2)


def test_every_item_once_per_epoch_padding_dropped(augmented: dict) -> None:
    assert sorted(augmented) == [(e, i) for e in (0, 1) for i in range(N)]


def test_records_are_the_torch_modules(augmented: dict) -> None:
    """The keyed plan of each item, plus the scene each border-protecting record runs with
    (analysed on the decoded source image and carried through the chain, as ``Augment``
    does); the plan itself carries no scene."""
    module = Augment(POLICY, seed=SEED)
    for (epoch, index), (_, records) in augmented.items():
        assert all(("scene" in r.extra) == r.protect_border for r in records)
        drawn = [
            replace(r, extra={k: v for k, v in r.extra.items() if k != "scene"}) for r in records
        ]
        assert drawn == module.plan([index], epoch=epoch, channels=3)[0]
        assert drawn == list(plan_sample(POLICY, seed=SEED, epoch=epoch, index=index, channels=3))
    ops = {r.op for _, recs in augmented.values() for r in recs}
    assert {"translation", "jpeg"} <= ops and len(ops) >= 6, ops  # DALI's own and torch ops ran
    assert any(len(recs) == 3 for _, recs in augmented.values())
    assert any(not recs for _, recs in augmented.values())  # probability 0.75: some untouched


def test_pixels_equal_torch_module_on_same_decoded_images(
    clean: dict[int, torch.Tensor], augmented: dict
) -> None:
    module = Augment(POLICY, seed=SEED, return_records=True)
    for epoch in (0, 1):
        indices = list(range(N))
        batch = torch.stack([clean[i] for i in indices])
        result = module(batch, indices, epoch=epoch)
        for row, index in enumerate(indices):
            image, records = augmented[(epoch, index)]
            assert result.records[row] == records
            diff = (_u8(image).int() - result.images[row].int()).abs().max().item()
            assert diff == 0, f"epoch {epoch} item {index} {[r.op for r in records]}: {diff} levels"
    # augmentation changed something, and epochs draw differently
    changed = [not torch.equal(_u8(augmented[(0, i)][0]), clean[i]) for i in range(N)]
    assert sum(changed) >= N // 2
    assert any(augmented[(0, i)][1] != augmented[(1, i)][1] for i in range(N))


def test_same_outputs_for_other_batch_size_order_and_shards(augmented: dict) -> None:
    """Batch 3, keyed shuffling and two shards: every (epoch, index) gets the same pixels."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    for shard in (0, 1):
        loader = dali_loader(
            _files(),
            POLICY,
            seed=SEED,
            size=SIZE,
            batch_size=3,
            shuffle=True,
            shard_id=shard,
            num_shards=2,
            first_epoch=1,
        )
        assert len(loader) == 2  # 5 items per shard in batches of 3
        got = _collect(loader, 1)
        assert len(got) == N // 2 and not set(got) & set(seen)
        seen.update({k: v[0] for k, v in got.items()})
    assert sorted(seen) == [(1, i) for i in range(N)]
    for key, image in seen.items():
        assert torch.equal(image, augmented[key][0]), key


def test_dali_ops_equal_torch_kernels() -> None:
    """translation (DALI's fn.slice) and unprotected brightness (DALI arithmetic) give the
    same bytes as the torch kernels; with the border protected brightness is not run by DALI."""
    policy = load_policy(
        {
            "policy": "native",
            "ops": ["translation", "brightness", "contrast"],
            "num_ops": [1, 3],
            "strength": [4.0, 5.0],
            "protect_border": False,
        }
    )
    assert {"translation", "brightness"} <= set(DALI_OPS)
    assert DALI_OPS["brightness"].usable(policy) and not DALI_OPS["brightness"].usable(POLICY)
    outs = []
    for own in (True, False):
        loader = dali_loader(
            _files(),
            policy,
            seed=1,
            size=SIZE,
            batch_size=4,
            dali_ops=own,
            return_records=True,
        )
        outs.append(_collect(loader, 1))
    assert outs[0].keys() == outs[1].keys()
    for key in outs[0]:
        assert torch.equal(outs[0][key][0], outs[1][key][0]), (key, outs[0][key][1])
    records = [r for _, recs in outs[0].values() for r in recs]
    assert {r.op for r in records} == {"translation", "brightness", "contrast"}
    assert not any(r.protect_border for r in records)
    black = [(outs[0][k][0] == 0).all(dim=0).float().mean().item() for k in outs[0]]
    assert max(black) > 0.05  # shifts of 14-18 % uncover black fill


def test_gray_png_xray_policy() -> None:
    """8-bit gray PNGs decoded as 1 channel, the X-ray policy's ops: equal to the module too."""
    require_samples()
    files = XRAY[:4]
    clean = _collect(dali_loader(files, None, size=SIZE, batch_size=4, channels=1), 1)
    aug = _collect(
        dali_loader(
            files, "augment-xray", seed=2, size=SIZE, batch_size=4, channels=1, return_records=True
        ),
        1,
    )
    module = Augment("augment-xray", seed=2, return_records=True)
    batch = torch.stack([_u8(clean[(0, i)][0]) for i in range(4)])
    assert batch.shape == (4, 1, *SIZE)
    result = module(batch, list(range(4)), epoch=0)
    assert any(result.records)
    for i in range(4):
        image, records = aug[(0, i)]
        assert records == result.records[i]
        assert torch.equal(_u8(image), result.images[i]), [r.op for r in records]


def test_16_bit_png_films_keep_their_levels(tmp_path: Path) -> None:
    """bit_depth=16 decodes 16-bit PNG films to uint16: at their own size the pipeline gives the
    file's 65,536-level values back (x / 65535), where the default 8-bit decode keeps 256 levels;
    augmented, the pixels equal the torch module's on the same uint16 images."""
    import cv2

    require_samples()
    rng = np.random.default_rng(0)
    files = []
    for k, src in enumerate(XRAY[:3]):
        gray = cv2.imread(str(src), cv2.IMREAD_GRAYSCALE)[: SIZE[0], : SIZE[1]]
        film = (gray.astype(np.uint16) * 257 + rng.integers(0, 257, gray.shape)).astype(np.uint16)
        files.append(tmp_path / f"film{k}.png")
        cv2.imwrite(str(files[-1]), film)
    (wide,) = list(dali_loader(files, None, size=SIZE, batch_size=3, channels=1, bit_depth=16))
    u16 = (wide.images * 65535.0).round().to(torch.int64)
    for k, path in enumerate(files):
        want = torch.from_numpy(cv2.imread(str(path), cv2.IMREAD_UNCHANGED).astype(np.int64))
        assert torch.equal(u16[k, 0], want)
    assert torch.unique(u16).numel() > 4 * 256
    (narrow,) = list(dali_loader(files, None, size=SIZE, batch_size=3, channels=1))
    assert torch.unique(narrow.images).numel() <= 256
    (aug,) = list(
        dali_loader(
            files, "augment-xray", seed=2, size=SIZE, batch_size=3, channels=1, bit_depth=16,
            return_records=True,
        )
    )
    module = Augment("augment-xray", seed=2, return_records=True)
    result = module(u16.to(torch.uint16), list(range(3)), epoch=0)
    assert aug.records == result.records and any(result.records)
    assert torch.equal((aug.images * 65535.0).round().to(torch.uint16), result.images)
    with pytest.raises(InputError, match="bit_depth must be 8 or 16"):
        dali_loader(files, None, size=SIZE, bit_depth=12)


def test_keyed_epoch_order() -> None:
    a = epoch_order(50, seed=3, epoch=2, shuffle=True)
    assert np.array_equal(a, epoch_order(50, seed=3, epoch=2, shuffle=True))
    assert sorted(a.tolist()) == list(range(50))
    assert not np.array_equal(a, epoch_order(50, seed=3, epoch=3, shuffle=True))
    assert np.array_equal(epoch_order(5, seed=3, epoch=2, shuffle=False), np.arange(5))


def test_normalisation_and_no_policy(clean: dict[int, torch.Tensor]) -> None:
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    loader = dali_loader(_files()[:4], None, size=SIZE, batch_size=4, mean=mean, std=std)
    (batch,) = list(loader)
    assert batch.images.shape == (4, 3, *SIZE) and batch.images.dtype == torch.float32
    m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    for image, index in zip(batch.images, batch.indices.tolist(), strict=True):
        ref = (clean[index].float() / 255.0 - m) / s
        assert torch.allclose(image, ref, atol=1e-5)


def test_sources_bytes_and_folder(tmp_path: Path) -> None:
    files = _files()[:2]
    blobs = [p.read_bytes() for p in files]
    assert image_source(blobs).read(1) == blobs[1]
    for p in files:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "notes.txt").write_text("not an image")
    folder = image_source(tmp_path)
    assert len(folder) == 2 and folder.read(0) == blobs[0]
    assert check_format(blobs[0], "x") == "JPEG"


def test_hf_dataset_source_by_row() -> None:
    """A datasets.Dataset with an Image column: rows are the dataset indices, bytes undecoded."""
    import datasets

    files = _files()[:3]
    ds = datasets.Dataset.from_dict({"image": [str(p) for p in files], "label": [0, 1, 2]})
    ds = ds.cast_column("image", datasets.Image())
    source = image_source(ds)
    assert len(source) == 3 and source.read(2) == files[2].read_bytes()
    (batch,) = list(dali_loader(ds, None, size=SIZE, batch_size=4))
    assert batch.indices.tolist() == [0, 1, 2]


def test_bad_inputs_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"1 of 2 image files do not exist .*fix the paths"):
        build_pipeline([_files()[0], tmp_path / "missing.jpg"], None)
    with pytest.raises(InputError, match=r"no \.jpg/\.jpeg/\.png files"):
        build_pipeline(tmp_path, None)
    gif = tmp_path / "clip.gif"
    gif.write_bytes(b"GIF89a" + bytes(64))
    with pytest.raises(InputError, match=r"clip.gif: not a JPEG or PNG image .*convert it"):
        list(dali_loader([gif], None, size=SIZE, batch_size=1))
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty image"):
        list(dali_loader([empty], None, size=SIZE, batch_size=1))
    with pytest.raises(InputError, match="the image list is empty"):
        build_pipeline([], None)
    gone = tmp_path / "gone.jpg"
    gone.write_bytes(_files()[0].read_bytes())
    loader = dali_loader([gone], None, size=SIZE, batch_size=1)
    gone.unlink()  # removed after the pipeline was built
    with pytest.raises(InputError, match=r"cannot read image file .*gone.jpg.*still there"):
        list(loader)
    with pytest.raises(InputError, match="size must be"):
        build_pipeline(_files(), None, size=(1, 5))
    with pytest.raises(InputError, match="shard_id"):
        build_pipeline(_files(), None, shard_id=2, num_shards=2)
    with pytest.raises(InputError, match="every shard needs at least one image"):
        build_pipeline(_files()[:1], None, shard_id=1, num_shards=2)  # an empty shard
    with pytest.raises(InputError, match="cannot read images from int"):
        build_pipeline(3, None)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="device='gpu' needs a CUDA GPU"):
            build_pipeline(_files(), None, device="gpu")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "device", [d for d in DEVICES if d.id == "cuda"]
)  # skips without a GPU, saying so
def test_gpu_pipeline_matches_torch_module_on_cuda(device: str, clean: dict) -> None:
    """Mixed (nvJPEG) decoding differs from the CPU decoder by a few levels, so the reference
    is the GPU pipeline's own clean output; the torch module runs on CUDA; within 1/255."""
    files = _files()
    base = _collect(dali_loader(files, None, size=SIZE, batch_size=4, device="gpu"), 1)
    aug = _collect(
        dali_loader(
            files, POLICY, seed=SEED, size=SIZE, batch_size=4, device="gpu", return_records=True
        ),
        1,
    )
    module = Augment(POLICY, seed=SEED, return_records=True)
    batch = torch.stack([_u8(base[(0, i)][0]) for i in range(N)]).cuda()
    result = module(batch, list(range(N)), epoch=0)
    for i in range(N):
        image, records = aug[(0, i)]
        assert records == result.records[i]
        diff = (_u8(image).int() - result.images[i].cpu().int()).abs().max().item()
        assert diff <= 1, (i, diff)


def test_readme_example_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The README's DALI example, run from the repo root as a fresh clone has it (the frames
    shipped in tests/data; at 64x64 instead of 448 for speed)."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    section = text.split("## Training input with NVIDIA DALI", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "size=448" in code and "(3, 448, 448)" in code
    code = code.replace("size=448", "size=64").replace("(3, 448, 448)", "(3, 64, 64)")
    shipped = sorted((root / "tests" / "data" / "endoscopy").glob("*.jpg"))
    assert 'Path("tests/data/endoscopy")' in code and shipped
    monkeypatch.chdir(root)
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * -(-len(shipped) // 8)  # batches of 8 over two epochs
