"""Reference for the Kvasir-VQA-x1 transformed track: the upstream recipe in plain PIL, one
process, as the upstream script runs.

    python benchmarks/ref_track_pil.py FRAMES_DIR OUT_DIR

torchvision's parameter sampling re-done with Python's ``random`` (seeded once, 42, drawn in
order): RandomResizedCrop(scale 0.9-1, ratio aspect x [0.95, 1.05]) -> RandomRotation(+-10,
fill 0) -> RandomAffine(translate 0.1, 0.1) -> ColorJitter(brightness, contrast 0.8-1.2, in a
random order); PIL crop+resize, rotate, affine, all bicubic; ImageEnhance; saved with PIL's
default JPEG quality (75), ``OUT/variant_<v>/<stem>.jpg``. Prints the output count.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

VARIANTS = 10


def _torchvision_params(r: random.Random, width: int, height: int) -> dict[str, Any]:
    """torchvision's get_params for RandomResizedCrop -> RandomRotation -> RandomAffine ->
    ColorJitter with the upstream arguments."""
    area, aspect = width * height, width / height
    log_ratio = (math.log(aspect * 0.95), math.log(aspect * 1.05))
    crop = (0, 0, height, width)
    for _ in range(10):
        target = area * r.uniform(0.9, 1.0)
        ar = math.exp(r.uniform(*log_ratio))
        w, h = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
        if 0 < w <= width and 0 < h <= height:
            crop = (r.randint(0, height - h), r.randint(0, width - w), h, w)
            break
    angle = r.uniform(-10, 10)
    tx = round(r.uniform(-0.1 * width, 0.1 * width))
    ty = round(r.uniform(-0.1 * height, 0.1 * height))
    order = list(range(4))
    r.shuffle(order)
    return {
        "crop": crop,
        "angle": angle,
        "tx": tx,
        "ty": ty,
        "order": order,
        "b": r.uniform(0.8, 1.2),
        "c": r.uniform(0.8, 1.2),
    }


def _pil_weak(img: Any, p: dict[str, Any]) -> Any:
    from PIL import Image, ImageEnhance

    width, height = img.size
    i, j, h, w = p["crop"]
    out = img.crop((j, i, j + w, i + h)).resize((width, height), Image.Resampling.BICUBIC)
    out = out.rotate(p["angle"], Image.Resampling.BICUBIC, expand=False, fillcolor=0)
    out = out.transform(
        (width, height),
        Image.Transform.AFFINE,
        (1, 0, -p["tx"], 0, 1, -p["ty"]),
        Image.Resampling.BICUBIC,
        fillcolor=0,
    )
    for k in p["order"]:
        if k == 0:
            out = ImageEnhance.Brightness(out).enhance(p["b"])
        elif k == 1:
            out = ImageEnhance.Contrast(out).enhance(p["c"])
    return out


def pil_reference(files: list[Path], out: Path) -> int:
    from PIL import Image

    r = random.Random(42)
    n = 0
    for v in range(1, VARIANTS + 1):
        (out / f"variant_{v}").mkdir(parents=True, exist_ok=True)
    for path in files:
        with Image.open(path) as im:
            img = im.convert("RGB")
        for v in range(1, VARIANTS + 1):
            _pil_weak(img, _torchvision_params(r, *img.size)).save(
                out / f"variant_{v}" / f"{path.stem}.jpg"
            )
            n += 1
    return n


if __name__ == "__main__":
    frames = sorted(p for p in Path(sys.argv[1]).iterdir() if p.suffix.lower() in (".jpg", ".png"))
    print(pil_reference(frames, Path(sys.argv[2])))
