"""Write the X-ray preview grids of docs/gallery/xray/ (clean + severities 1-5 per op) from the
NIH ChestX-ray14 sample films in ../shared/samples/xray. Run from the repository root:

    python docs/gallery/make_xray_gallery.py
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from perturb.cli.preview_grid import preview_grid
from perturb.io.images import read_image, to_tensor

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT.parent / "shared" / "samples" / "xray"
OUT = Path(__file__).resolve().parent / "xray"

# op -> NIH film it is shown on (films with devices, dense mediastinum or clear lungs)
GALLERY = {
    "xray_patient_rotation": "nih_00013125_000",
    "xray_under_penetration": "nih_00022084_000",
    "xray_over_penetration": "nih_00022084_000",
    "xray_support_devices": "nih_00000284_000",
    "xray_foreign_objects": "nih_00004296_000",
    "xray_detector_defects": "nih_00001369_000",
    "xray_grid_cutoff": "nih_00009745_000",
    "xray_edge_enhancement": "nih_00022084_000",
    "xray_double_exposure": "nih_00026911_000",
    "xray_cardiac_motion": "nih_00013911_000",
    "xray_skin_fold": "nih_00000493_000",
    "xray_monochrome1": "nih_00002578_000",
    "xray_quantum_noise": "nih_00015649_000",
    "xray_bit_depth": "nih_00008386_000",
    "xray_heel_effect": "nih_00001933_000",
    "xray_jpeg": "nih_00000493_000",
    "xray_burned_text": "nih_00022178_000",
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for op, film in GALLERY.items():
        image = to_tensor(read_image(SAMPLES / f"{film}.png"))
        grid, _ = preview_grid(image, [op], sample_key=film, thumb_width=200)
        gray = cv2.cvtColor(grid, cv2.COLOR_RGB2GRAY)
        cv2.imwrite(str(OUT / f"{op}.png"), gray, [cv2.IMWRITE_PNG_COMPRESSION, 9])
        print(op, film, gray.shape, np.round((OUT / f"{op}.png").stat().st_size / 1024, 1), "KiB")


if __name__ == "__main__":
    main()
