"""Calibration metrics between a clean and a perturbed image (HWC uint8 RGB), measured where a
VQA model sees them: both resized to a 448 px shorter side (INTER_AREA), scored inside the
tissue layer of the scene (field of view minus overlays, eroded by the SSIM window).

* field_ssim: SSIM (Wang et al. 2004: gaussian window sigma 1.5, K1 0.01, K2 0.03, data range
  1) of Rec. 601 luma, averaged over the eroded tissue mask; ssim: the same over the whole image.
* delta_e: mean CIE76 colour difference in CIELAB (D65, via OpenCV) over the tissue mask;
  delta_e_whole: over the whole image.
* region_ssim: SSIM averaged over the footprint of a local artifact, the pixels the op's
  severity-5 output moves by more than ``FOOTPRINT_LEVELS`` gray levels at the measuring size,
  grown by the SSIM window (one region for all five severities, so they stay comparable): a thin
  edge or a small object is graded where it is instead of being diluted by the whole image.
* mean_shift: mean absolute luma change in gray levels (of 255) over the whole image, for
  smooth fluence gradients whose visibility is the brightness change itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

MEASURE_SHORT = 448
SSIM_SIGMA = 1.5
_C1 = (0.01 * 1.0) ** 2
_C2 = (0.03 * 1.0) ** 2
FOOTPRINT_LEVELS = 2  # gray levels (of 255) a pixel must move at severity 5 to be in the footprint


def resize_short(img: np.ndarray, short: int = MEASURE_SHORT) -> np.ndarray:
    """``img`` resized (INTER_AREA) so its shorter side is ``short`` (never enlarged)."""
    h, w = img.shape[:2]
    s = short / min(h, w)
    if s >= 1.0:
        return img
    return cv2.resize(img, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)


def luma(rgb: np.ndarray) -> np.ndarray:
    x = rgb.astype(np.float32) / 255.0
    return (0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]).astype(np.float32)


def ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-pixel SSIM of two single-channel images in [0, 1], moments filtered in float64 (the
    variances are small differences of large terms)."""

    def blur(z: np.ndarray) -> np.ndarray:
        return np.asarray(cv2.GaussianBlur(z, (11, 11), SSIM_SIGMA, borderType=cv2.BORDER_REFLECT), np.float64)

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    mu_a, mu_b = blur(a64), blur(b64)
    saa = blur(a64 * a64) - mu_a * mu_a
    sbb = blur(b64 * b64) - mu_b * mu_b
    sab = blur(a64 * b64) - mu_a * mu_b
    num = (2 * mu_a * mu_b + _C1) * (2 * sab + _C2)
    den = (mu_a**2 + mu_b**2 + _C1) * (saa + sbb + _C2)
    return num / den


def lab(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(cv2.cvtColor(rgb.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab), np.float64)


@dataclass
class Reference:
    """A clean image prepared once for scoring many perturbed versions."""

    rgb: np.ndarray  # resized clean, HWC uint8
    mask: np.ndarray  # bool: eroded tissue mask at the measuring size
    luma: np.ndarray
    lab: np.ndarray
    short: int | None = MEASURE_SHORT

    @classmethod
    def of(cls, clean: np.ndarray, tissue: np.ndarray | None, short: int | None = MEASURE_SHORT) -> Reference:
        """``short`` None: measure at the stored size."""
        small = clean if short is None else resize_short(clean, short)
        h, w = small.shape[:2]
        if tissue is None:
            mask = np.ones((h, w), bool)
        else:
            t = cv2.resize(tissue.astype(np.float32), (w, h), interpolation=cv2.INTER_AREA)
            inner = (t >= 0.999).astype(np.uint8)
            mask = cv2.erode(inner, np.ones((11, 11), np.uint8)).astype(bool)
            if mask.sum() < 100:
                mask = inner.astype(bool) if inner.sum() >= 100 else np.ones((h, w), bool)
        return cls(small, mask, luma(small), lab(small), short)

    def _measured(self, perturbed: np.ndarray) -> np.ndarray:
        small = perturbed if self.short is None else resize_short(perturbed, self.short)
        if small.shape != self.rgb.shape:
            raise ValueError(f"perturbed image of shape {perturbed.shape} does not match the clean one")
        return small

    def footprint(self, strongest: np.ndarray) -> np.ndarray:
        """Where ``strongest`` (the severity-5 output) differs from the clean image by more than
        FOOTPRINT_LEVELS gray levels in luma, grown by the 11 px SSIM window, inside the mask;
        the whole mask when nothing moved."""
        moved = np.abs(luma(self._measured(strongest)) - self.luma) > FOOTPRINT_LEVELS / 255.0
        grown = cv2.dilate(moved.astype(np.uint8), np.ones((11, 11), np.uint8)).astype(bool) & self.mask
        return grown if grown.any() else self.mask

    def score(self, metric: str, perturbed: np.ndarray, region: np.ndarray | None = None) -> float:
        """``metric`` between the clean image and ``perturbed``; ``region`` (bool at the
        measuring size, from ``footprint``) is required by ``region_ssim``."""
        small = self._measured(perturbed)
        whole = metric in ("ssim", "delta_e_whole")
        mask = np.ones(self.mask.shape, bool) if whole else self.mask
        if metric == "region_ssim":
            if region is None:
                raise ValueError("region_ssim needs the artifact's footprint (Reference.footprint)")
            return float(ssim_map(self.luma, luma(small))[region].mean())
        if metric in ("field_ssim", "ssim"):
            return float(ssim_map(self.luma, luma(small))[mask].mean())
        if metric == "mean_shift":
            return float(np.abs(luma(small) - self.luma).mean() * 255.0)
        if metric in ("delta_e", "delta_e_whole"):
            d = np.sqrt(((lab(small) - self.lab) ** 2).sum(axis=2))
            return float(d[mask].mean())
        raise ValueError(f"unknown metric {metric!r}")
