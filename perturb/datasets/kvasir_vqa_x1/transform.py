"""The Kvasir-VQA-x1 "transformed" track, keyed per (img_id, variant).

Upstream (``augmentation/generate_augmented.py`` of simula/Kvasir-VQA-x1) applies, with
torchvision on PIL images and bicubic resampling::

    RandomResizedCrop(size=(H, W), scale=(0.9, 1.0), ratio=(W/H * 0.95, W/H * 1.05))
    RandomRotation((-10, 10), fill=0)
    RandomAffine(0, translate=(0.1, 0.1), fill=0)
    ColorJitter(brightness=(0.8, 1.2), contrast=(0.8, 1.2))

and saves JPEG with PIL's defaults (quality 75, 4:2:0). It seeds once globally, so its pixels
depend on iteration order. Here every parameter is drawn from a generator keyed by
(seed, img_id, "kvasir_transformed", 0, variant), in the order and with the distributions
torchvision documents:

* crop: up to 10 attempts of ``area * U(scale)`` and aspect ``exp(U(log ratio))``,
  ``w = round(sqrt(a * r))``, ``h = round(sqrt(a / r))``, accepted when ``0 < w <= W`` and
  ``0 < h <= H``, then ``top ~ randint(0, H - h)``, ``left ~ randint(0, W - w)``; after 10
  failures the fallback central crop (the whole image when W/H lies inside the ratio range);
* rotation angle ``U(-10, 10)`` degrees, counter-clockwise, about the centre;
* translation ``tx = round(U(-0.1 W, 0.1 W))``, ``ty = round(U(-0.1 H, 0.1 H))`` pixels;
* ColorJitter: a random permutation of its four slots fixes whether brightness or contrast
  comes first, then ``b ~ U(0.8, 1.2)``, ``c ~ U(0.8, 1.2)``; brightness ``x b``, contrast
  ``c x + (1 - c) mean(luma)``, each clamped to [0, 1].

The three geometric steps are resampled once, as one affine warp (see ``perturb.ops.geometry``),
with black fill exactly where the sequential chain puts it. Differences from upstream pixels:
one interpolation instead of three (sharper), OpenCV's a = -0.75 cubic instead of PIL's
a = -0.5, no 8-bit rounding between steps, and libjpeg-turbo through OpenCV for the JPEG.
Measured on five real frames (three HyperKvasir, two PolypGen) x five variants against PIL's
step-by-step chain with the same parameters (before JPEG): ours are on average 1.33 grey levels
brighter (sd 0.12 over the 15 pairs; mean absolute difference 1.43), as PIL stores each of its
resamplings in 8 bits. Frames whose three channels happen to be
equal still come out as 3-channel JPEGs, as upstream's RGB outputs do.

``interpolation: pil_bicubic`` (the ``kvasir-vqa-x1-upstream-*`` suites) runs upstream's chain
itself instead (:func:`pil_chain`): the same keyed parameters, each step with PIL on an 8-bit RGB
image as torchvision's functional API does for PIL inputs: ``crop`` then ``resize`` (bicubic),
``rotate`` (bicubic, black fill), ``transform(AFFINE)`` with torchvision's inverse matrix
(bicubic, black fill), brightness as ``Image.blend`` with black, contrast as ``Image.blend``
with the rounded mean of ``convert("L")`` (what ``ImageEnhance`` does; PIL truncates each
blend to 8 bits). Against a reference written with torchvision's calls on the same parameters
its pixels are identical (tests/datasets/test_kvasir_upstream_chain.py). It runs on the host
whatever the device (upstream's chain is PIL's), about 2x slower than the fused warp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, model_validator

from perturb import rng as keyed
from perturb.ops import backend
from perturb.ops.geometry import (
    Warp,
    chain_warp,
    rotation_matrix,
    translation_matrix,
    warp_array,
    warp_batch,
)

NAME = "kvasir_transformed"
# how the chain is resampled: one fused OpenCV/torch warp, or upstream's PIL steps
INTERPOLATIONS = ("bicubic", "pil_bicubic")
VERSION = 1
RISK_TAGS = ["moves_geometry", "crops_border", "black_fill", "alters_intensity"]
MAX_ATTEMPTS = 10
# the catalog ops that make the same kinds of change (an Augment policy holding out this suite
# holds them out)
CATALOG_OPS = ("resized_crop", "rotation", "translation", "brightness", "contrast")


@dataclass(frozen=True)
class TransformedSpec:
    """Ranges of the track (the suite YAML may override them)."""

    scale: tuple[float, float] = (0.9, 1.0)
    ratio: tuple[float, float] = (0.95, 1.05)  # relative to the image's aspect W/H
    degrees: tuple[float, float] = (-10.0, 10.0)
    translate: tuple[float, float] = (0.1, 0.1)
    brightness: tuple[float, float] = (0.8, 1.2)
    contrast: tuple[float, float] = (0.8, 1.2)

    def __post_init__(self) -> None:
        for name in ("scale", "ratio", "degrees", "brightness", "contrast"):
            lo, hi = getattr(self, name)
            if not lo <= hi:
                raise ValueError(f"{name}: lower end {lo} above upper end {hi}")
        if not (self.scale[0] > 0 and self.scale[1] <= 1.0):
            raise ValueError(f"scale must lie in (0, 1], got {self.scale}")
        if self.ratio[0] <= 0:
            raise ValueError(f"ratio must be positive, got {self.ratio}")
        if not all(0.0 <= t <= 1.0 for t in self.translate):
            raise ValueError(f"translate must lie in [0, 1], got {self.translate}")
        if self.brightness[0] < 0 or self.contrast[0] < 0:
            raise ValueError("brightness and contrast factors must be non-negative")


class Params(BaseModel):
    """A suite job's ``params:`` of this composite (defaults: the upstream recipe); checked by
    :class:`TransformedSpec`."""

    model_config = ConfigDict(extra="forbid")

    scale: tuple[float, float] = (0.9, 1.0)
    ratio: tuple[float, float] = (0.95, 1.05)
    degrees: tuple[float, float] = (-10.0, 10.0)
    translate: tuple[float, float] = (0.1, 0.1)
    brightness: tuple[float, float] = (0.8, 1.2)
    contrast: tuple[float, float] = (0.8, 1.2)
    # bicubic: one fused warp; pil_bicubic: upstream's PIL steps (:func:`pil_chain`)
    interpolation: Literal["bicubic", "pil_bicubic"] = "bicubic"
    fill: Literal[0] = 0

    @model_validator(mode="after")
    def _check(self) -> Params:
        TransformedSpec(**self.ranges())  # raises ValueError with the reason
        return self

    def ranges(self) -> dict[str, tuple[float, float]]:
        return {
            k: getattr(self, k)
            for k in ("scale", "ratio", "degrees", "translate", "brightness", "contrast")
        }


@dataclass(frozen=True)
class ChainSpec(TransformedSpec):
    """The ranges and how the chain is resampled (:data:`INTERPOLATIONS`)."""

    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {', '.join(INTERPOLATIONS)}, "
                f"got {self.interpolation!r}"
            )


def crop_params(
    gen: np.random.Generator, width: int, height: int, spec: TransformedSpec
) -> dict[str, Any]:
    """RandomResizedCrop.get_params with a keyed generator: (top, left, height, width)."""
    area = width * height
    aspect = width / height
    ratio = (aspect * spec.ratio[0], aspect * spec.ratio[1])
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for attempt in range(1, MAX_ATTEMPTS + 1):
        target_area = area * float(gen.uniform(spec.scale[0], spec.scale[1]))
        aspect_ratio = math.exp(float(gen.uniform(log_ratio[0], log_ratio[1])))
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(gen.integers(0, height - h + 1))
            left = int(gen.integers(0, width - w + 1))
            return {
                "top": top,
                "left": left,
                "height": h,
                "width": w,
                "attempts": attempt,
                "fallback": False,
            }
    # torchvision's fallback: a central crop at the nearest allowed aspect ratio
    if aspect < min(ratio):
        w, h = width, round(width / min(ratio))
    elif aspect > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return {
        "top": (height - h) // 2,
        "left": (width - w) // 2,
        "height": h,
        "width": w,
        "attempts": MAX_ATTEMPTS,
        "fallback": True,
    }


def sample_params(
    key: int, width: int, height: int, spec: TransformedSpec | None = None
) -> dict[str, Any]:
    """All parameters of one (image, variant), drawn in upstream order from the keyed generator.

    Returns the chain as ``steps`` in the order they are applied, plus ``size`` and settings.
    """
    spec = spec or TransformedSpec()
    gen = keyed.scalar_rng(key)
    crop = crop_params(gen, width, height, spec)
    angle = float(gen.uniform(spec.degrees[0], spec.degrees[1]))
    max_dx, max_dy = spec.translate[0] * width, spec.translate[1] * height
    tx = round(float(gen.uniform(-max_dx, max_dx)))
    ty = round(float(gen.uniform(-max_dy, max_dy)))
    slots = gen.permutation(
        4
    ).tolist()  # ColorJitter's fn_idx: 0 brightness, 1 contrast, 2, 3 unused
    b = float(gen.uniform(spec.brightness[0], spec.brightness[1]))
    c = float(gen.uniform(spec.contrast[0], spec.contrast[1]))
    jitter = {0: {"op": "brightness", "factor": b}, 1: {"op": "contrast", "factor": c}}
    steps: list[dict[str, Any]] = [
        {"op": "resized_crop", **crop},
        {"op": "rotate", "angle": angle},
        {"op": "translate", "tx": tx, "ty": ty},
        *[jitter[s] for s in slots if s in jitter],
    ]
    return {
        "version": VERSION,
        "size": [width, height],
        "interpolation": getattr(spec, "interpolation", "bicubic"),
        "fill": 0,
        "steps": steps,
    }


def spec_of(params: Any) -> ChainSpec:
    """The spec of a suite's composite job (its :class:`Params`: ranges, interpolation)."""
    return ChainSpec(
        **params.ranges(), interpolation=str(getattr(params, "interpolation", "bicubic"))
    )


def _step(params: dict[str, Any], name: str) -> dict[str, Any]:
    for step in params["steps"]:
        if step["op"] == name:
            return dict(step)
    raise KeyError(f"{NAME} params have no {name!r} step")


def geometry_warp(params: dict[str, Any]) -> Warp:
    """The composed crop -> resize -> rotate -> translate warp of one sample."""
    width, height = (int(v) for v in params["size"])
    crop = _step(params, "resized_crop")
    rotate = _step(params, "rotate")
    shift = _step(params, "translate")
    return chain_warp(
        (width, height),
        (int(crop["left"]), int(crop["top"]), int(crop["width"]), int(crop["height"])),
        [
            rotation_matrix(float(rotate["angle"]), width, height),
            translation_matrix(float(shift["tx"]), float(shift["ty"])),
        ],
    )


LUMA = (0.299, 0.587, 0.114)  # Rec. 601, as PIL's convert("L") and torchvision's rgb_to_grayscale


def _jitter_steps(params: dict[str, Any]) -> list[tuple[str, float]]:
    return [
        (s["op"], float(s["factor"]))
        for s in params["steps"]
        if s["op"] in ("brightness", "contrast")
    ]


def color_array(img: np.ndarray, steps: Sequence[tuple[str, float]]) -> np.ndarray:
    """Brightness ``x b`` / contrast ``c x + (1 - c) mean(luma)`` on one HWC (or HW) float32
    image, in order, each clamped to [0, 1] (ColorJitter's formulas). In place."""
    for name, f in steps:
        if name == "brightness":
            img *= np.float32(f)
        else:
            means = cv2.mean(img)  # per-channel means, accumulated in double
            if img.ndim == 3:
                mean = float(sum(w * m for w, m in zip(LUMA, means[:3], strict=True)))
            else:
                mean = float(means[0])
            img *= np.float32(f)
            img += np.float32(mean) * np.float32(1.0 - f)
        np.clip(img, 0.0, 1.0, out=img)
    return img


def _color_torch(x: torch.Tensor, steps: Sequence[tuple[str, float]]) -> torch.Tensor:
    """``color_array`` for one CHW tensor (the CUDA path), same float32 operations."""
    out = x.clone()
    for name, f in steps:
        if name == "brightness":
            out.mul_(f)
        else:
            means = out.double().mean(dim=(1, 2))
            weights = torch.tensor(
                LUMA if out.shape[0] == 3 else (1.0,), dtype=torch.float64, device=out.device
            )
            mean = torch.tensor(
                float((means * weights).sum()), dtype=torch.float32, device=out.device
            )
            out.mul_(f).add_(mean * torch.tensor(1.0 - f, dtype=torch.float32, device=out.device))
        out.clamp_(0.0, 1.0)
    return out


def _pil(params: dict[str, Any]) -> bool:
    return params.get("interpolation") == "pil_bicubic"


def pil_chain(image: Any, params: dict[str, Any]) -> Any:
    """Upstream's chain on an 8-bit RGB PIL image, step by step as torchvision's functional
    API runs it on PIL inputs (see the module docstring); returns the PIL image."""
    from PIL import Image, ImageStat

    bicubic = Image.Resampling.BICUBIC
    width, height = (int(v) for v in params["size"])
    black = (0,) * len(image.getbands())
    for step in params["steps"]:
        op = step["op"]
        if op == "resized_crop":
            left, top = int(step["left"]), int(step["top"])
            box = (left, top, left + int(step["width"]), top + int(step["height"]))
            image = image.crop(box).resize((width, height), bicubic)
        elif op == "rotate":
            image = image.rotate(float(step["angle"]), resample=bicubic, fillcolor=black)
        elif op == "translate":
            # torchvision's inverse affine matrix of a pure shift about the centre
            matrix = (1.0, 0.0, -float(step["tx"]), 0.0, 1.0, -float(step["ty"]))
            image = image.transform(
                image.size, Image.Transform.AFFINE, matrix, resample=bicubic, fillcolor=black
            )
        elif op == "brightness":
            image = Image.blend(Image.new(image.mode, image.size, 0), image, float(step["factor"]))
        elif op == "contrast":
            mean = int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5)
            grey = Image.new("L", image.size, mean).convert(image.mode)
            image = Image.blend(grey, image, float(step["factor"]))
        else:
            raise ValueError(f"{NAME}: unknown step {op!r}")
    return image


def pil_array(img: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """:func:`pil_chain` on one HWC (or HW: made RGB, as upstream opens frames) float32 image
    in [0, 1] holding 8-bit values; HWC float32 out, in steps of 1/255."""
    from PIL import Image

    rgb = img if img.ndim == 3 else np.repeat(img[..., None], 3, axis=2)
    u8 = np.clip(np.rint(rgb * np.float32(255.0)), 0, 255).astype(np.uint8)
    out = pil_chain(Image.fromarray(u8, "RGB"), params)
    return np.asarray(out, dtype=np.float32) / np.float32(255.0)


def transformed_array(img: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """The track on one HWC (or HW) float32 image in [0, 1] with OpenCV and NumPy (the CPU
    path; ``apply_transformed`` gives the same bits for CPU tensors), or with PIL's steps
    (``interpolation: pil_bicubic``)."""
    _check(params, img.shape[1], img.shape[0])
    if _pil(params):
        return pil_array(img, params)
    return color_array(warp_array(img, geometry_warp(params)), _jitter_steps(params))


def _check(p: dict[str, Any], width: int, height: int) -> None:
    if int(p.get("version", -1)) != VERSION:
        raise ValueError(
            f"{NAME} params of version {p.get('version')} cannot be run by version {VERSION}"
        )
    if [int(v) for v in p["size"]] != [width, height]:
        raise ValueError(
            f"params are for a {p['size'][0]}x{p['size'][1]} image, got {width}x{height}"
        )


def apply_transformed(x: torch.Tensor, params: Sequence[dict[str, Any]]) -> torch.Tensor:
    """Run the track on a BCHW float32 batch, one params dict per sample (as ``sample_params``
    returns and the manifest stores). Each sample's result depends only on it and its params."""
    if len(params) != x.shape[0]:
        raise ValueError(f"{len(params)} params for a batch of {x.shape[0]} images")
    for p in params:
        _check(p, x.shape[-1], x.shape[-2])
    if any(_pil(p) for p in params):  # upstream's PIL chain runs on the host
        images = backend.to_hwc(x.cpu())
        outs = [transformed_array(img, p) for img, p in zip(images, params, strict=True)]
        if any(o.ndim != i.ndim for o, i in zip(outs, images, strict=True)):
            outs = [o if o.ndim == 3 else np.repeat(o[..., None], 3, axis=2) for o in outs]
        return backend.from_hwc(outs, x).to(x.device)
    if backend.opencv_path(x):
        images = backend.to_hwc(x)
        return backend.from_hwc(
            [transformed_array(img, p) for img, p in zip(images, params, strict=True)], x
        )
    warped = warp_batch(x, [geometry_warp(p) for p in params])
    return torch.stack(
        [_color_torch(w, _jitter_steps(p)) for w, p in zip(warped, params, strict=True)]
    )


_STEP_LIMITS = {  # value bounds of each step's numbers (sizes are checked against the image)
    "rotate": {"angle": 360.0},
    "brightness": {"factor": 10.0},
    "contrast": {"factor": 10.0},
}


def composite_problem(params: Any, width: int, height: int) -> str | None:
    """Why a track record cannot be replayed on a ``width`` x ``height`` image (None if it can):
    its size must be the image's, the crop inside it, shifts within it, factors and angles
    finite and bounded, so a forged record cannot size buffers."""
    if not isinstance(params, dict) or not isinstance(params.get("steps"), list):
        return "params must be an object with a steps list"
    if params.get("size") != [width, height]:
        return f"size {params.get('size')!r:.40} is not the image's [{width}, {height}]"
    for step in params["steps"]:
        if not isinstance(step, dict):
            return "every step must be an object"
        op = step.get("op")
        for key, value in step.items():
            if key in ("op", "fallback"):
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                return f"{op} {key} is {value!r:.40}, not a finite number"
            bound = _STEP_LIMITS.get(str(op), {}).get(key)
            if bound is not None and abs(value) > bound:
                return f"{op} {key} = {value} is outside [-{bound}, {bound}]"
        if op == "resized_crop":
            top, left, h, w = (step.get(k, -1) for k in ("top", "left", "height", "width"))
            inside = min(top, left) >= 0 and min(h, w) > 0
            if not (inside and top + h <= height and left + w <= width):
                return "resized_crop box is not inside the image"
        shift = (abs(step.get("tx", 0)), abs(step.get("ty", 0)))
        if op == "translate" and not (shift[0] <= width and shift[1] <= height):
            return "translate moves the image beyond its size"
    return None


def track_key(seed: int, img_id: str, variant: int) -> int:
    """Key of one (image, variant) of the track."""
    return keyed.derive_key(seed, img_id, NAME, 0, variant)
