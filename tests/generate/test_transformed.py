"""The kvasir_transformed track: parameter ranges and distributions against torchvision's
documented sampling (re-implemented here with Python's ``random``, independent of the code under
test), black fill against PIL's sequential chain, ColorJitter formulas, torch vs OpenCV path,
replay from JSON."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
from PIL import Image, ImageEnhance

from perturb.datasets.kvasir_vqa_x1.transform import (
    TransformedSpec,
    apply_transformed,
    sample_params,
    track_key,
    transformed_array,
)
from perturb.datasets.phantoms.endoscopy import render
from perturb.ops.backend import use_backend

SIZES = [(622, 529), (1920, 1080)]  # (W, H): a HyperKvasir frame and a 16:9 frame
N = 3000


def torchvision_reference(r: random.Random, width: int, height: int) -> dict[str, float]:
    """torchvision's get_params of RandomResizedCrop -> RandomRotation -> RandomAffine ->
    ColorJitter with the upstream arguments, as documented (torchvision/transforms/transforms.py)."""
    area = height * width
    aspect = width / height
    ratio = (aspect * 0.95, aspect * 1.05)
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    crop = None
    for attempt in range(1, 11):
        target_area = area * r.uniform(0.9, 1.0)
        aspect_ratio = math.exp(r.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            crop = (r.randint(0, height - h), r.randint(0, width - w), h, w, 0, attempt)
            break
    if crop is None:  # fallback: W/H lies inside the ratio range -> whole image
        crop = (0, 0, height, width, 1, 10)
    angle = r.uniform(-10, 10)
    max_dx, max_dy = 0.1 * width, 0.1 * height
    tx = round(r.uniform(-max_dx, max_dx))
    ty = round(r.uniform(-max_dy, max_dy))
    perm = list(range(4))
    r.shuffle(perm)
    b, c = r.uniform(0.8, 1.2), r.uniform(0.8, 1.2)
    i, j, h, w, fallback, attempts = crop
    return {
        "top": i,
        "left": j,
        "height": h,
        "width": w,
        "fallback": fallback,
        "attempts": attempts,
        "angle": angle,
        "tx": tx,
        "ty": ty,
        "brightness": b,
        "contrast": c,
        "brightness_first": float(perm.index(0) < perm.index(1)),
    }


def ours(seed: int, img_id: str, variant: int, width: int, height: int) -> dict[str, float]:
    p = sample_params(track_key(seed, img_id, variant), width, height)
    steps = {s["op"]: s for s in p["steps"]}
    order = [s["op"] for s in p["steps"] if s["op"] in ("brightness", "contrast")]
    crop = steps["resized_crop"]
    return {
        "top": crop["top"],
        "left": crop["left"],
        "height": crop["height"],
        "width": crop["width"],
        "fallback": float(crop["fallback"]),
        "attempts": crop["attempts"],
        "angle": steps["rotate"]["angle"],
        "tx": steps["translate"]["tx"],
        "ty": steps["translate"]["ty"],
        "brightness": steps["brightness"]["factor"],
        "contrast": steps["contrast"]["factor"],
        "brightness_first": float(order[0] == "brightness"),
    }


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def samples(
    request: pytest.FixtureRequest,
) -> tuple[tuple[int, int], dict[str, np.ndarray], dict[str, np.ndarray]]:
    width, height = request.param
    mine = [ours(0, f"img{i // 10}", 1 + i % 10, width, height) for i in range(N)]
    r = random.Random(12345)
    ref = [torchvision_reference(r, width, height) for _ in range(N)]
    cols = mine[0].keys()
    return (
        (width, height),
        {k: np.array([m[k] for m in mine], dtype=float) for k in cols},
        {k: np.array([m[k] for m in ref], dtype=float) for k in cols},
    )


def test_every_parameter_inside_the_upstream_ranges(samples: tuple) -> None:
    (width, height), mine, _ = samples
    area = mine["width"] * mine["height"]
    accepted = mine["fallback"] == 0
    # an accepted crop: area within scale (0.9, 1.0) and aspect within (0.95, 1.05) x W/H, up to rounding
    assert np.all(area[accepted] >= 0.9 * width * height * (1 - 4 / min(width, height)))
    assert np.all(mine["width"] <= width) and np.all(mine["height"] <= height)
    rel_aspect = (mine["width"] / mine["height"]) / (width / height)
    tol = 2.0 / min(width, height)
    assert np.all((rel_aspect[accepted] >= 0.95 - tol) & (rel_aspect[accepted] <= 1.05 + tol))
    assert np.all(mine["top"] + mine["height"] <= height) and np.all(
        mine["left"] + mine["width"] <= width
    )
    assert np.all(mine["top"] >= 0) and np.all(mine["left"] >= 0)
    fb = ~accepted
    assert np.all(mine["width"][fb] == width) and np.all(mine["height"][fb] == height)
    assert np.all(np.abs(mine["angle"]) <= 10.0)
    assert np.all(np.abs(mine["tx"]) <= round(0.1 * width)) and np.all(
        np.abs(mine["ty"]) <= round(0.1 * height)
    )
    assert np.all(mine["tx"] == np.round(mine["tx"]))
    for k in ("brightness", "contrast"):
        assert np.all((mine[k] >= 0.8) & (mine[k] <= 1.2))
    assert 0 < mine["brightness_first"].mean() < 1


@pytest.mark.parametrize(
    "name", ["width", "height", "top", "left", "angle", "tx", "ty", "brightness", "contrast"]
)
def test_distribution_matches_torchvision_sampling(samples: tuple, name: str) -> None:
    """Two-sample KS test of our keyed draws against the reference sampler."""
    _, mine, ref = samples
    result = scipy.stats.ks_2samp(mine[name], ref[name])
    assert result.pvalue > 1e-3, (
        f"{name}: KS statistic {result.statistic:.3f}, p = {result.pvalue:.2g}"
    )


def test_attempts_fallback_and_order_rates_match(samples: tuple) -> None:
    _, mine, ref = samples
    # how many of the 10 attempts a crop took (rejections of too-wide / too-tall crops)
    counts = [
        [int((m == k).sum()) for k in (1, 2, 3)] + [int((m > 3).sum())]
        for m in (mine["attempts"], ref["attempts"])
    ]
    assert scipy.stats.chi2_contingency(counts).pvalue > 1e-3, counts
    assert abs(mine["fallback"].mean() - ref["fallback"].mean()) < 0.01
    table = [
        [mine["brightness_first"].sum(), N - mine["brightness_first"].sum()],
        [ref["brightness_first"].sum(), N - ref["brightness_first"].sum()],
    ]
    assert scipy.stats.chi2_contingency(table).pvalue > 1e-3, table
    assert abs(mine["brightness_first"].mean() - 0.5) < 0.05  # ColorJitter's random order


def test_keyed_per_image_and_variant() -> None:
    a = sample_params(track_key(0, "a", 1), 400, 320)
    assert a == sample_params(track_key(0, "a", 1), 400, 320)
    others = [track_key(1, "a", 1), track_key(0, "b", 1), track_key(0, "a", 2)]
    assert all(sample_params(k, 400, 320) != a for k in others)


def _pil_chain(img: np.ndarray, p: dict) -> np.ndarray:
    """The upstream chain with PIL, step by step (crop+resize, rotate, affine, jitter)."""
    height, width = img.shape[:2]
    steps = {s["op"]: s for s in p["steps"]}
    c = steps["resized_crop"]
    im = Image.fromarray(img).crop(
        (c["left"], c["top"], c["left"] + c["width"], c["top"] + c["height"])
    )
    im = im.resize((width, height), Image.Resampling.BICUBIC)
    im = im.rotate(steps["rotate"]["angle"], Image.Resampling.BICUBIC, fillcolor=0)
    tx, ty = steps["translate"]["tx"], steps["translate"]["ty"]
    im = im.transform(
        (width, height),
        Image.Transform.AFFINE,
        (1, 0, -tx, 0, 1, -ty),
        Image.Resampling.BICUBIC,
        fillcolor=0,
    )
    for s in p["steps"]:
        if s["op"] == "brightness":
            im = ImageEnhance.Brightness(im).enhance(s["factor"])
        elif s["op"] == "contrast":
            im = ImageEnhance.Contrast(im).enhance(s["factor"])
    return np.asarray(im)


def _no_jitter(p: dict) -> dict:
    q = json.loads(json.dumps(p))
    for s in q["steps"]:
        if s["op"] in ("brightness", "contrast"):
            s["factor"] = 1.0
    return q


@pytest.mark.parametrize("variant", range(1, 7))
def test_black_fill_is_where_the_sequential_chain_puts_it(variant: int) -> None:
    width, height = 160, 120
    p = _no_jitter(sample_params(track_key(3, "fill", variant), width, height))
    ours_ = transformed_array(np.ones((height, width, 3), np.float32), p)
    ref = _pil_chain(np.full((height, width, 3), 255, np.uint8), p)
    assert np.array_equal(ours_[..., 0] > 0.5, ref[..., 0] > 127)
    assert (ours_[..., 0] <= 0.5).any(), "rotation/translation must leave black fill"


def test_pixels_follow_pils_sequential_chain() -> None:
    """One resampling instead of three: pixels stay within a few levels of PIL's chain."""
    img = render("chain", (320, 256)).image
    for variant in range(1, 4):
        p = sample_params(track_key(0, "chain", variant), 320, 256)
        out = np.rint(transformed_array(img.astype(np.float32) / 255, p) * 255)
        diff = np.abs(out - _pil_chain(img, p).astype(float))
        assert diff.mean() < 2.5 and np.percentile(diff, 95) < 8, (
            diff.mean(),
            np.percentile(diff, 95),
        )


def test_color_jitter_formulas_and_order() -> None:
    """brightness x b; contrast c x + (1 - c) mean(luma), each clamped, in the recorded order."""
    rng = np.random.default_rng(0)
    img = rng.uniform(0.1, 0.9, (40, 50, 3)).astype(np.float32)
    base = sample_params(track_key(0, "c", 1), 50, 40)
    geo = [
        {
            "op": "resized_crop",
            "top": 0,
            "left": 0,
            "height": 40,
            "width": 50,
            "attempts": 1,
            "fallback": False,
        },
        {"op": "rotate", "angle": 0.0},
        {"op": "translate", "tx": 0, "ty": 0},
    ]
    for order in (("brightness", "contrast"), ("contrast", "brightness")):
        p = {
            **base,
            "steps": [
                *geo,
                *({"op": o, "factor": 1.15 if o == "brightness" else 0.85} for o in order),
            ],
        }
        out = transformed_array(img.copy(), p)
        x = img.astype(np.float64)
        for o in order:
            if o == "brightness":
                x = np.clip(x * 1.15, 0, 1)
            else:
                m = (x @ np.array([0.299, 0.587, 0.114])).mean()
                x = np.clip(0.85 * x + 0.15 * m, 0, 1)
        assert np.abs(out - x).max() < 2e-5
    # PIL's ImageEnhance agrees within its 8-bit truncation
    u8 = (img * 255).round().astype(np.uint8)
    p = {
        **base,
        "steps": [*geo, {"op": "contrast", "factor": 0.8}, {"op": "brightness", "factor": 1.2}],
    }
    ours_ = np.rint(transformed_array(u8.astype(np.float32) / 255, p) * 255)
    ref = np.asarray(
        ImageEnhance.Brightness(ImageEnhance.Contrast(Image.fromarray(u8)).enhance(0.8)).enhance(
            1.2
        )
    )
    assert np.abs(ours_ - ref).max() <= 2


def test_torch_path_matches_opencv_path_and_replays_from_json() -> None:
    imgs = [render(f"t{i}", (160, 128)).image for i in range(3)]
    x = torch.stack([torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in imgs])
    params = [sample_params(track_key(0, f"t{i}", 2), 160, 128) for i in range(3)]
    cpu = apply_transformed(x, params)
    with use_backend("torch"):
        torch_path = apply_transformed(x, params)
    assert float((cpu - torch_path).abs().max()) <= 1.0 / 255
    again = apply_transformed(x, [json.loads(json.dumps(p)) for p in params])
    assert torch.equal(cpu, again)
    # one sample alone equals the same sample in the batch
    assert torch.equal(apply_transformed(x[1:2], params[1:2])[0], cpu[1])
    # the array path (what generation runs on CPU) gives the same bits
    arr = transformed_array(imgs[0].astype(np.float32) / np.float32(255), params[0])
    assert np.array_equal(arr, cpu[0].permute(1, 2, 0).numpy())


def test_gray_and_wrong_size_and_bad_spec() -> None:
    gray = np.random.default_rng(1).uniform(0, 1, (60, 80)).astype(np.float32)
    p = sample_params(track_key(0, "g", 1), 80, 60)
    assert transformed_array(gray.copy(), p).shape == (60, 80)
    with pytest.raises(ValueError, match="80x60"):
        transformed_array(np.zeros((61, 80), np.float32), p)
    with pytest.raises(ValueError, match="scale"):
        TransformedSpec(scale=(0.5, 1.5))


def test_rgb_frame_with_equal_channels_stays_three_channel(tmp_path: Path) -> None:
    """Upstream works on PIL RGB images and writes RGB JPEGs; a frame whose channels happen to
    be equal (decoded as gray by perturb.io) must still come out with three channels."""
    import datasets
    from PIL import Image

    from perturb.datasets.phantoms import builtin_dataset
    from perturb.generate import generate_split

    ds = builtin_dataset(1, size=(96, 64))
    gray = Image.fromarray(np.asarray(ds[0]["image"].convert("L"))).convert("RGB")
    ds = ds.cast_column("image", datasets.Image()).map(lambda row: {"image": gray})
    src = tmp_path / "in"
    ds.save_to_disk(str(src))
    generate_split("kvasir-vqa-x1-transformed", tmp_path / "out", dataset=str(src), limit=1)
    outputs = sorted((tmp_path / "out").rglob("*.jpg"))
    assert outputs
    for path in outputs:
        with Image.open(path) as im:
            assert im.mode == "RGB", f"{path.name}: {im.mode}"
