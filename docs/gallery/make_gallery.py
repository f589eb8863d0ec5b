"""Write every preview grid of docs/gallery/ (clean + severities 1-5 per op, with full-resolution
crops under the endoscopy thumbnails) from the real samples in ../shared/samples, and the grid
table of docs/gallery/README.md. Every registered op that is not retired has one grid; a new op
without a row here stops the script. Run from the repository root:

    python docs/gallery/make_gallery.py [--only OP ...]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import cv2

from perturb.catalog.ops import all_ops
from perturb.cli.preview_grid import preview_grid
from perturb.io.images import read_image, to_tensor

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parents[1].parent / "shared" / "samples"
README = HERE / "README.md"

# op -> (sample file under ../shared/samples, crop centre as fractions of width and height).
# Frames chosen for the structure each op acts on (highlights, folds, overlays, devices, lungs).
ENDOSCOPY: dict[str, tuple[str, tuple[float, float]]] = {
    "brightness": ("endoscopy/polypgen_C3_EndoCV2021_00277.jpg", (0.5, 0.5)),
    "bubbles": ("endoscopy/polypgen_C3_EndoCV2021_00327.jpg", (0.55, 0.45)),
    "chromatic_aberration": ("endoscopy/polypgen_350OLCV1_100H0002.jpg", (0.8, 0.25)),
    "color_breakup": ("endoscopy/polypgen_176OLCV1_100H0889.jpg", (0.3, 0.65)),
    "color_cast": ("endoscopy/polypgen_EndoCV2021_001161.jpg", (0.5, 0.5)),
    "contrast": ("endoscopy/polypgen_176OLCV1_100H0889.jpg", (0.3, 0.65)),
    "defocus_blur": ("endoscopy/polypgen_EndoCV2021_C6_0100073.jpg", (0.55, 0.55)),
    "fluid_occlusion": ("endoscopy/polypgen_350OLCV1_100H0002.jpg", (0.5, 0.5)),
    "gamma": ("endoscopy/polypgen_EndoCV2021_001071.jpg", (0.5, 0.5)),
    "gaussian_blur": ("endoscopy/polypgen_EndoCV2021_C6_0100073.jpg", (0.55, 0.55)),
    "gaussian_noise": ("endoscopy/polypgen_100H0050.jpg", (0.4, 0.4)),
    "haze": ("endoscopy/polypgen_EndoCV2021_C5_50000138.jpg", (0.5, 0.5)),
    "hue_shift": ("endoscopy/polypgen_EndoCV2021_001161.jpg", (0.5, 0.5)),
    "interlacing": ("endoscopy/polypgen_EndoCV2021_001177.jpg", (0.5, 0.5)),
    "jpeg": ("endoscopy/polypgen_C3_EndoCV2021_007.jpg", (0.5, 0.5)),
    "lens_distortion": ("endoscopy/polypgen_EndoCV2021_C6_0100046.jpg", (0.15, 0.5)),
    "lens_droplets": ("endoscopy/polypgen_350OLCV1_100H0002.jpg", (0.5, 0.4)),
    "lens_fog": ("endoscopy/polypgen_EndoCV2021_C6_0100073.jpg", (0.5, 0.5)),
    "motion_blur": ("endoscopy/polypgen_176OLCV1_100H0889.jpg", (0.3, 0.65)),
    "overexposure": ("endoscopy/polypgen_EndoCV2021_C5_50000198.jpg", (0.5, 0.5)),
    "resized_crop": ("endoscopy/hyperkvasir_seg_cju0qkwl35piu0993l0dewei2.jpg", (0.5, 0.5)),
    "rotation": ("endoscopy/hyperkvasir_seg_cju0qkwl35piu0993l0dewei2.jpg", (0.5, 0.5)),
    "row_banding": ("endoscopy/polypgen_EndoCV2021_001352.jpg", (0.5, 0.5)),
    "saturation": ("endoscopy/polypgen_EndoCV2021_001161.jpg", (0.5, 0.5)),
    "scope_roll": ("endoscopy/polypgen_EndoCV2021_C6_0100032.jpg", (0.5, 0.5)),
    "sensor_defects": ("endoscopy/polypgen_EndoCV2021_C5_50000306.jpg", (0.5, 0.5)),
    "shot_noise": ("endoscopy/polypgen_100H0050.jpg", (0.4, 0.4)),
    "speckle_noise": ("endoscopy/polypgen_100H0050.jpg", (0.4, 0.4)),
    "specular_glare": ("endoscopy/polypgen_176OLCV1_100H0889.jpg", (0.3, 0.65)),
    "surgical_smoke": ("endoscopy/polypgen_100H0050.jpg", (0.35, 0.3)),
    "translation": ("endoscopy/hyperkvasir_seg_cju0qkwl35piu0993l0dewei2.jpg", (0.5, 0.5)),
    "underexposure": ("endoscopy/polypgen_176OLCV1_100H0889.jpg", (0.3, 0.65)),
    "video_macroblocking": ("endoscopy/polypgen_C3_EndoCV2021_00327.jpg", (0.6, 0.5)),
    "vignetting": ("endoscopy/polypgen_19_endocv2021_positive_845.jpg", (0.15, 0.2)),
}
XRAY: dict[str, str] = {
    "xray_bit_depth": "xray/nih_00008386_000.png",
    "xray_burned_text": "xray/nih_00022178_000.png",
    "xray_cardiac_motion": "xray/nih_00013911_000.png",
    "xray_collimation": "xray/nih_00015649_000.png",
    "xray_detector_defects": "xray/nih_00001369_000.png",
    "xray_double_exposure": "xray/nih_00026911_000.png",
    "xray_edge_enhancement": "xray/nih_00022084_000.png",
    "xray_exposure": "xray/nih_00001933_000.png",
    "xray_foreign_objects": "xray/nih_00004296_000.png",
    "xray_gamma": "xray/nih_00002578_000.png",
    "xray_grid_cutoff": "xray/nih_00009745_000.png",
    "xray_grid_lines": "xray/nih_00015649_000.png",
    "xray_heel_effect": "xray/nih_00001933_000.png",
    "xray_jpeg": "xray/nih_00000493_000.png",
    "xray_laterality_marker": "xray/mhh_covid_48c4542c.png",
    "xray_monochrome1": "xray/nih_00002578_000.png",
    "xray_motion_blur": "xray/nih_00013911_000.png",
    "xray_over_penetration": "xray/nih_00022084_000.png",
    "xray_patient_rotation": "xray/nih_00013125_000.png",
    "xray_quantum_noise": "xray/nih_00015649_000.png",
    "xray_scatter": "xray/nih_00026911_000.png",
    "xray_skin_fold": "xray/nih_00000493_000.png",
    "xray_support_devices": "xray/nih_00000284_000.png",
    "xray_under_penetration": "xray/nih_00022084_000.png",
    "xray_window_level": "xray/nih_00002578_000.png",
}
TABLE_START = "<!-- grid table: written by make_gallery.py -->"
TABLE_END = "<!-- end of grid table -->"


def _write_grid(op: str, source: str, crop_centre: tuple[float, float] | None, out: Path) -> None:
    image = to_tensor(read_image(SAMPLES / source))
    key = Path(source).stem
    if crop_centre is None:  # film: 200 px cells, gray
        grid, _ = preview_grid(image, [op], sample_key=key, thumb_width=200)
        grid = cv2.cvtColor(grid, cv2.COLOR_RGB2GRAY)
    else:
        grid, _ = preview_grid(image, [op], sample_key=key, thumb_width=160, crop=True, crop_centre=crop_centre)
        grid = cv2.cvtColor(grid, cv2.COLOR_RGB2BGR)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(out), grid, [cv2.IMWRITE_PNG_COMPRESSION, 9]):
        raise OSError(f"could not write {out}")


def _table(ops: dict[str, int]) -> str:
    rows = ["| Grid | Op (version) | Source frame | Crop centre |", "|---|---|---|---|"]
    for op, (source, centre) in sorted(ENDOSCOPY.items()):
        rows.append(f"| `endoscopy/{op}.png` | {op} (v{ops[op]}) | `{Path(source).name}` | {centre[0]}, {centre[1]} |")
    for op, source in sorted(XRAY.items()):
        rows.append(f"| `xray/{op}.png` | {op} (v{ops[op]}) | `{Path(source).name}` | whole film |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=None, help="regenerate these ops only")
    args = parser.parse_args()
    live = {name: op.spec.version for name, op in all_ops().items() if not op.spec.retired}
    missing = sorted(set(live) - set(ENDOSCOPY) - set(XRAY))
    if missing:
        raise SystemExit(f"no gallery row for {missing}: add one to make_gallery.py")
    if not SAMPLES.is_dir():
        raise SystemExit(f"{SAMPLES} not found: the gallery is drawn from ../shared/samples")
    todo = sorted(live) if args.only is None else args.only
    for op in todo:
        started = time.perf_counter()
        if op in ENDOSCOPY:
            source, centre = ENDOSCOPY[op]
            _write_grid(op, source, centre, HERE / "endoscopy" / f"{op}.png")
        else:
            source = XRAY[op]
            _write_grid(op, source, None, HERE / "xray" / f"{op}.png")
        print(f"{op:26s} v{live[op]}  {Path(source).name}  {time.perf_counter() - started:.1f} s", flush=True)
    text = README.read_text()
    pattern = re.compile(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{README} has no {TABLE_START} ... {TABLE_END} block")
    README.write_text(pattern.sub(lambda _: f"{TABLE_START}\n{_table(live)}\n{TABLE_END}", text))


if __name__ == "__main__":
    main()
