"""``transform_planes``: the uint8 3x3 colour transform of a CHW sample with OpenCV, for the
importers of this module (``perturb.ops.color``). The compiled (numba) loops that lived here
were removed: measured end to end they gained nothing over the OpenCV/NumPy path."""

from __future__ import annotations

import cv2
import numpy as np


def transform_planes(src: np.ndarray, dst: np.ndarray, matrix: np.ndarray) -> bool:
    """``dst = cv2.transform``'s uint8 result of the 3x3 ``matrix`` on the 3-plane CHW sample
    ``src`` (merged to HWC, transformed, split into ``dst``'s planes). Always True: the caller's
    own OpenCV path is then not needed."""
    if (
        src.shape != dst.shape
        or src.dtype != np.uint8
        or dst.dtype != np.uint8
        or src.shape[0] != 3
    ):
        raise ValueError(
            f"transform_planes takes uint8 3-plane samples of one shape, got {src.dtype} {src.shape} "
            f"and {dst.dtype} {dst.shape}"
        )
    mixed = cv2.transform(
        cv2.merge([src[0], src[1], src[2]]), np.asarray(matrix, np.float32).reshape(3, 3)
    )
    for c, plane in enumerate(cv2.split(mixed)):
        np.copyto(dst[c], plane)
    return True
