"""Reference for the artifact suite: a plain albumentations + OpenCV script, one process.

    python benchmarks/ref_artifacts_albumentations.py FRAMES_DIR OUT_DIR

For every frame (``*.jpg`` / ``*.png`` in FRAMES_DIR): 22 transforms, one per endoscopy op of
perturb's catalog (the nearest albumentations transform; the peers of ``bench_ops.py`` where it
has one), at 5 strengths each = 110 PNG outputs per frame, written with ``cv2.imwrite``,
``OUT/<op>/s<k>/<stem>.png``. Seeded once (``random.seed``/``np.random.seed``), no manifest, no
records. Prints the output count.

PNG settings, like for like: the encoder settings of perturb's ``endoscopy-artifacts`` suite
(zlib level 1, zlib's default strategy: ``IMWRITE_PNG_COMPRESSION 1``), so both sides pay the
same encode for the same pixels. OpenCV's defaults when no setting is passed (level 1 with the
RLE strategy) encode about a third faster and write about 8% larger files; ``--opencv-defaults``
writes with them.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import albumentations as A
import cv2
import numpy as np


def _vignette(strength: float) -> Callable[[np.ndarray], np.ndarray]:
    def apply(img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        yy, xx = np.ogrid[:h, :w]
        r2 = ((xx - w / 2) / (w / 2)) ** 2 + ((yy - h / 2) / (h / 2)) ** 2
        gain = np.clip(1 - strength * r2 / 2, 0, 1).astype(np.float32)[..., None]
        return np.clip(img * gain, 0, 255).astype(np.uint8)

    return apply


MOTION_PX = (5, 9, 15, 29, 55)
GAUSS_SIGMA_PX = (1.0, 2.0, 4.0, 7.2, 14.0)
DEFOCUS_RADIUS_PX = (2, 3, 7, 14, 28)


def transforms(k: int) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """op name -> callable at strength k (1..5)."""
    aug: dict[str, Any] = {
        # perturb's gaussian_blur v4 and defocus_blur v5 ladders at 1080p (sigma 0.9-1.2 ... 13-15 px;
        # radius 1.4-1.8 ... 26-30 px, whole pixels here)
        "gaussian_blur": A.GaussianBlur(
            blur_limit=(0, 0), sigma_limit=(GAUSS_SIGMA_PX[k - 1], GAUSS_SIGMA_PX[k - 1]), p=1
        ),
        "defocus_blur": A.Defocus(
            radius=(DEFOCUS_RADIUS_PX[k - 1], DEFOCUS_RADIUS_PX[k - 1]), alias_blur=(0.5, 0.5), p=1
        ),
        # perturb's motion_blur v5 ladder at 1080p (3-4, 6-9, 13-16, 25-30, 49-59 px), odd sizes
        "motion_blur": A.MotionBlur(blur_limit=(MOTION_PX[k - 1], MOTION_PX[k - 1]), p=1),
        "specular_glare": A.RandomSunFlare(num_flare_circles_range=(k, k + 2), p=1),
        "overexposure": A.RandomBrightnessContrast(
            brightness_limit=(0.2 * k, 0.2 * k), contrast_limit=0, p=1
        ),
        "underexposure": A.RandomBrightnessContrast(
            brightness_limit=(-0.15 * k, -0.15 * k), contrast_limit=0, p=1
        ),
        "haze": A.RandomFog(fog_coef_range=(0.1 * k, 0.1 * k), p=1),
        "gaussian_noise": A.GaussNoise(std_range=(0.025 * k, 0.025 * k), p=1),
        "shot_noise": A.ShotNoise(scale_range=(0.005 * k, 0.005 * k), p=1),
        "speckle_noise": A.MultiplicativeNoise(multiplier=(1 - 0.08 * k, 1 + 0.08 * k), p=1),
        "impulse_noise": A.SaltAndPepper(amount=(0.01 * k, 0.01 * k), p=1),
        "jpeg": A.ImageCompression(quality_range=(90 - 15 * k, 90 - 15 * k), p=1),
        "color_cast": A.RGBShift(
            r_shift_limit=8 * k, g_shift_limit=8 * k, b_shift_limit=8 * k, p=1
        ),
        "hue_shift": A.HueSaturationValue(
            hue_shift_limit=(3 * k, 3 * k), sat_shift_limit=0, val_shift_limit=0, p=1
        ),
        "saturation": A.HueSaturationValue(
            hue_shift_limit=0, sat_shift_limit=(-12 * k, -12 * k), val_shift_limit=0, p=1
        ),
        "brightness": A.RandomBrightnessContrast(
            brightness_limit=(0.06 * k, 0.06 * k), contrast_limit=0, p=1
        ),
        "contrast": A.RandomBrightnessContrast(
            brightness_limit=0, contrast_limit=(-0.1 * k, -0.1 * k), p=1
        ),
        "gamma": A.RandomGamma(gamma_limit=(100 + 15 * k, 100 + 15 * k), p=1),
        "rotation": A.Rotate(limit=(3 * k, 3 * k), border_mode=cv2.BORDER_CONSTANT, p=1),
        "translation": A.Affine(
            translate_percent={"x": (0.03 * k, 0.03 * k), "y": (0.0, 0.0)},
            border_mode=cv2.BORDER_CONSTANT,
            p=1,
        ),
    }
    out: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        name: (lambda img, t=t: t(image=img)["image"]) for name, t in aug.items()
    }
    out["vignetting"] = _vignette(0.16 * k)
    scale = 1 - 0.05 * k

    def resized_crop(img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        return A.RandomResizedCrop(size=(h, w), scale=(scale, scale), ratio=(w / h, w / h), p=1)(
            image=img
        )["image"]

    out["resized_crop"] = resized_crop
    return out


# perturb's endoscopy-artifacts output (png_compression: 1); passing a level also sets zlib's
# default strategy, as perturb's encoder does
LIKE_FOR_LIKE_PNG = [cv2.IMWRITE_PNG_COMPRESSION, 1]


def main(frames: Path, out: Path, png_params: list[int] | None = None) -> int:
    random.seed(0)
    np.random.seed(0)
    files = sorted(p for p in frames.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    levels = {k: transforms(k) for k in range(1, 6)}
    n = 0
    for path in files:
        rgb = cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        for k, ops in levels.items():
            for name, fn in ops.items():
                target = out / name / f"s{k}" / f"{path.stem}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                params = LIKE_FOR_LIKE_PNG if png_params is None else png_params
                cv2.imwrite(str(target), cv2.cvtColor(fn(rgb), cv2.COLOR_RGB2BGR), params)
                n += 1
    return n


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--opencv-defaults"]
    defaults = "--opencv-defaults" in sys.argv[1:]
    print(main(Path(args[0]), Path(args[1]), [] if defaults else None))
