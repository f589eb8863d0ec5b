"""Track-2 pixels against upstream's chain (issue 30 item 5).

The reference is upstream's ``generate_augmented.py`` chain written here with PIL the way
torchvision's functional API runs it on PIL images (torchvision itself is not installed):
``F.resized_crop`` = crop + resize, ``F.rotate`` = ``Image.rotate``, ``F.affine`` =
``Image.transform(AFFINE)`` with the inverse matrix from torchvision's
``_get_inverse_affine_matrix`` (written out below, general angle/scale/shear), ``ColorJitter``
= ``ImageEnhance.Brightness`` / ``ImageEnhance.Contrast``. Both get the same keyed parameters.
Bound (the issue): mean difference <= 0.1 grey level and mean absolute difference <= 0.5 before
encoding, measured on real endoscopy frames x variants. The fused warp of
``kvasir-vqa-x1-transformed`` is measured too: it misses the bound (the +1.3 the issue found),
which shows the measure can fail.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from perturb.configs.suites import load_suite
from perturb.datasets.kvasir_vqa_x1 import transform as tr

FRAMES = sorted((Path(__file__).resolve().parents[1] / "data" / "endoscopy").glob("*.jpg"))[:3]
VARIANTS = 2


def _inverse_affine(
    center: tuple[float, float],
    angle: float,
    translate: tuple[float, float],
    scale: float,
    shear: tuple[float, float],
) -> list[float]:
    """torchvision.transforms.functional._get_inverse_affine_matrix, written out."""
    rot = math.radians(angle)
    sx, sy = (math.radians(s) for s in shear)
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d, -b, 0.0, -c, a, 0.0]
    m = [x / scale for x in m]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def reference(img: Image.Image, params: dict) -> Image.Image:
    """Upstream's chain on a PIL RGB image, as torchvision runs it, with ``params``' values."""
    width, height = params["size"]
    bicubic = Image.Resampling.BICUBIC
    for step in params["steps"]:
        if step["op"] == "resized_crop":  # F.resized_crop: F.crop, then F.resize
            t, le, h, w = step["top"], step["left"], step["height"], step["width"]
            img = img.crop((le, t, le + w, t + h)).resize((width, height), bicubic)
        elif step["op"] == "rotate":  # F.rotate, expand=False, center=None, fill=0
            img = img.rotate(step["angle"], bicubic, expand=False, center=None, fillcolor=(0, 0, 0))
        elif step["op"] == "translate":  # F.affine(angle=0, translate, scale=1, shear=0)
            m = _inverse_affine(
                (width * 0.5, height * 0.5), 0.0, (step["tx"], step["ty"]), 1.0, (0.0, 0.0)
            )
            img = img.transform(
                (width, height), Image.Transform.AFFINE, m, bicubic, fillcolor=(0, 0, 0)
            )
        elif step["op"] == "brightness":  # F.adjust_brightness on PIL
            img = ImageEnhance.Brightness(img).enhance(step["factor"])
        elif step["op"] == "contrast":  # F.adjust_contrast on PIL
            img = ImageEnhance.Contrast(img).enhance(step["factor"])
    return img


@lru_cache(maxsize=2)
def _pairs(interpolation: str) -> list[tuple[np.ndarray, np.ndarray]]:
    spec = tr.ChainSpec(interpolation=interpolation)
    out = []
    for path in FRAMES:
        rgb = Image.open(path).convert("RGB")
        arr = np.asarray(rgb, dtype=np.float32) / np.float32(255.0)
        for v in range(1, VARIANTS + 1):
            params = tr.sample_params(tr.track_key(42, path.stem, v), rgb.width, rgb.height, spec)
            ours = tr.transformed_array(arr, params) * 255.0
            ref = np.asarray(reference(rgb, params), dtype=np.float32)
            out.append((ours, ref))
    return out


def test_pil_chain_meets_the_bound_against_upstreams_chain() -> None:
    assert len(FRAMES) == 3
    diffs = [float((o - r).mean()) for o, r in _pairs("pil_bicubic")]
    mads = [float(np.abs(o - r).mean()) for o, r in _pairs("pil_bicubic")]
    print(f"pil_bicubic vs upstream: mean diff {np.mean(diffs):+.4f}, MAD {np.mean(mads):.4f}")
    assert abs(float(np.mean(diffs))) <= 0.1 and max(abs(d) for d in diffs) <= 0.1
    assert float(np.mean(mads)) <= 0.5 and max(mads) <= 0.5


def test_fused_warp_misses_the_bound() -> None:
    """The default track's single warp, against the same reference: brighter by over 1 grey
    level on every pair (why the upstream suites exist)."""
    diffs = [float((o - r).mean()) for o, r in _pairs("bicubic")]
    print(f"fused bicubic vs upstream: mean diff {np.mean(diffs):+.3f} (min {min(diffs):+.3f})")
    assert min(diffs) > 0.5


def test_torch_path_and_gray_frames_take_the_same_chain() -> None:
    import torch

    rgb = Image.open(FRAMES[0]).convert("RGB")
    arr = np.asarray(rgb, dtype=np.float32) / np.float32(255.0)
    spec = tr.ChainSpec(interpolation="pil_bicubic")
    params = [
        tr.sample_params(tr.track_key(42, f"x{i}", 1), rgb.width, rgb.height, spec)
        for i in range(2)
    ]
    x = torch.from_numpy(np.stack([arr, arr])).permute(0, 3, 1, 2).contiguous()
    from perturb.ops.backend import use_backend

    with use_backend("torch"):
        batch = tr.apply_transformed(x, params)
    for i, p in enumerate(params):
        one = tr.transformed_array(arr, p)
        assert np.array_equal(batch[i].permute(1, 2, 0).numpy(), one)
    gray = arr.mean(axis=2)
    out = tr.transformed_array(gray, params[0])
    assert out.shape == arr.shape and np.array_equal(out[..., 0], out[..., 1])
    assert params[0]["interpolation"] == "pil_bicubic"
    with pytest.raises(ValueError, match="interpolation"):
        tr.ChainSpec(interpolation="lanczos")


def test_both_upstream_generators_are_named_suites() -> None:
    script = load_suite("kvasir-vqa-x1-upstream-script")
    recipe = load_suite("kvasir-vqa-x1-upstream-recipe")
    assert len(script.tasks()) == 10 and len(recipe.tasks()) == 1
    assert script.output.layout == "variant_{variant}/{img_id}.{ext}"
    assert recipe.output.layout == "image_weak_augmented/{img_id}.{ext}"
    for suite in (script, recipe):
        assert suite.composite_params("kvasir_transformed").interpolation == "pil_bicubic"
        assert suite.output.jpeg_quality == 75
        assert "--split" in suite.description
    # the fused default is unchanged
    fused = load_suite("kvasir-vqa-x1-transformed")
    assert fused.composite_params("kvasir_transformed").interpolation == "bicubic"
    assert tr.spec_of(fused.composite_params("kvasir_transformed")).interpolation == "bicubic"


def test_recipe_suite_generates_one_pil_variant_per_image(tmp_path: Path) -> None:
    import json

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from perturb.cli import app

    out = tmp_path / "recipe"
    r = CliRunner().invoke(
        app,
        [
            "generate",
            "kvasir-vqa-x1-upstream-recipe",
            "--out",
            str(out),
            "--builtin-images",
            "2",
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "manifest.parquet").to_pylist()
    assert [row["path"] for row in rows] == [
        "image_weak_augmented/phantom_0000.jpg",
        "image_weak_augmented/phantom_0001.jpg",
    ]
    assert all(json.loads(row["params"])["interpolation"] == "pil_bicubic" for row in rows)
