"""Tiny local copies of VinDr-CXR-VQA, ReXVQA and MedThinkVQA in their upstream schemas, made
at test time (no files in the repository): the adapters read them exactly as they read the hub's
files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import cv2
import datasets
import numpy as np

VINDR_SIZE = (160, 128)  # (width, height) of the supplied PNGs


def write_png(path: Path, img: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img
    assert cv2.imwrite(str(path), arr)


def write_jpg(path: Path, img: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img
    assert cv2.imwrite(str(path), arr, [cv2.IMWRITE_JPEG_QUALITY, 95])


def box_image(size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """16-bit gray image: dark, with a bright rectangle on pixels [x1, x2) x [y1, y2)."""
    w, h = size
    img = np.full((h, w), 6000, np.uint16)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = 60000
    return img


@dataclass
class VinDrFixture:
    data: Path  # folder of per-image JSON files, split subfolders
    images: Path  # folder of PNGs
    boxes: dict[str, tuple[int, int, int, int]]  # image_id -> gt box in ORIGINAL pixels
    scale: dict[str, float]  # image_id -> original size / PNG size


def make_vindr(root: Path) -> VinDrFixture:
    """Two test images (one supplied at its original size, one as a half-size copy with the
    original size in the JSON) and one train image."""
    data, images = root / "VinDR-CXR-VQA", root / "pngs"
    w, h = VINDR_SIZE
    specs = {
        "a1b2c3d4e5": ("test", (50, 40, 90, 80), 1.0),
        "f6e5d4c3b2": ("test", (60, 30, 100, 66), 2.0),
        "0123456789": ("train", (20, 20, 40, 40), 1.0),
    }
    boxes, scale = {}, {}
    for image_id, (split, box_px, s) in specs.items():
        write_png(images / f"{image_id}.png", box_image(VINDR_SIZE, box_px))
        orig = tuple(int(v * s) for v in box_px)
        boxes[image_id], scale[image_id] = orig, s  # type: ignore[assignment]
        tag = "<loc_{}_{}_{}_{}>".format(*orig)
        obj = {
            "image_id": image_id,
            "num_questions": 3,
            "items": [
                {
                    "question": "Where is the nodule?",
                    "answer": f"The nodule is in the right mid lung {tag}.",
                    "reason": f"A round opacity {tag} is seen.",
                    "type": "Where",
                    "difficulty": "Medium",
                    "gt_finding": "Nodule/Mass",
                    "gt_location": tag,
                },
                {
                    "question": "Is there a nodule?",
                    "answer": "Yes.",
                    "reason": "A round opacity.",
                    "type": "Is_there",
                    "difficulty": "Easy",
                    "gt_finding": "Nodule/Mass",
                    "gt_location": tag,
                },
                {
                    "question": "How many nodules are there?",
                    "answer": "One.",
                    "reason": "Single opacity.",
                    "type": "How_many",
                    "difficulty": "Easy",
                    "gt_finding": "Nodule/Mass",
                    "gt_location": tag,
                },
            ],
        }
        if s != 1.0:
            obj["width"], obj["height"] = int(w * s), int(h * s)
        path = data / split / f"{image_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))
    return VinDrFixture(data, images, boxes, scale)


@dataclass
class RexFixture:
    json_file: Path
    images: Path
    study_a: str  # folder of study A's two views


def rex_relpath(study: str, n: int) -> str:
    return f"../deid_png/GRDN{study}/studies/1.2.{study}/series/3.4/instances/5.{n}.png"


def make_rexvqa(root: Path, *, identical_views: bool = True) -> RexFixture:
    """Study A (two views; one question on both, one on the second only) and study B (one
    view, one question). The two views of A have the same pixels when ``identical_views``."""
    images = root / "ReXGradient-160K"
    rng = np.random.default_rng(7)
    base = (rng.random((96, 80)) * 40000 + 10000).astype(np.uint16)
    paths = {"A": [rex_relpath("11", 1), rex_relpath("11", 2)], "B": [rex_relpath("22", 1)]}
    for study, rels in paths.items():
        for i, rel in enumerate(rels):
            img = base if identical_views or i == 0 else np.flipud(base).copy()
            other = np.ascontiguousarray(base[::-1])
            write_png(images / rel.removeprefix("../"), img if study == "A" else other)
    common = {
        "task_name": "Differential Diagnosis",
        "category": "Lung",
        "subcategory": "Opacity",
        "PatientAge": "64",
        "PatientSex": "F",
        "Findings": "Right lower lobe consolidation.",
        "Impression": "Pneumonia.",
        "correct_answer_explanation": "The consolidation indicates pneumonia.",
    }
    data = {
        "q-a-1": {
            **common,
            "question": "What is the most likely diagnosis?",
            "options": ["A. Pneumonia", "B. Effusion", "C. Normal", "D. Edema"],
            "correct_answer": "A",
            "ImagePath": paths["A"],
        },
        "q-a-2": {
            **common,
            "question": "Is there a pleural effusion?",
            "options": ["A. Yes", "B. No"],
            "correct_answer": "B",
            "ImagePath": paths["A"][1:],  # the lateral view only
        },
        "q-b-1": {
            **common,
            "question": "Is the heart enlarged?",
            "options": ["A. Yes", "B. No"],
            "correct_answer": "B",
            "ImagePath": paths["B"],
        },
    }
    meta = root / "ReXVQA" / "metadata"
    meta.mkdir(parents=True)
    (meta / "test_vqa_data.json").write_text(json.dumps(data))
    (meta / "train_vqa_data.json").write_text(json.dumps({"q-t": data["q-b-1"]}))
    return RexFixture(meta / "test_vqa_data.json", images, "deid_png/GRDN11/studies/1.2.11")


MED_MODALITIES = {  # case -> [(image id, modality label, sub-modality)]
    "case10001": [
        ("ct01", "CT", "Contrast-enhanced CT"),
        ("xr01", "X-ray", "Plain radiograph"),
        ("en01", "Endoscopy", "Colonoscopy"),
    ],
    "case10002": [("mr01", "MRI", "Conventional MRI"), ("nm01", "Nuclear medicine", "SPECT")],
}


def _med_image(modality: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gray = (rng.random((64, 72)) * 150 + 50).astype(np.uint8)
    if modality == "Endoscopy":
        rgb = np.stack([gray, (gray * 0.5).astype(np.uint8), (gray * 0.4).astype(np.uint8)], -1)
        return rgb
    rgb = np.repeat(gray[..., None], 3, axis=2)
    if modality == "X-ray":
        rgb[5:15, 5:30] = (255, 0, 0)  # a red arrow burned into a teaching-file image
    return rgb


def make_medthinkvqa(root: Path, fmt: str = "parquet") -> Path:
    """A local copy of MedThinkVQA (test split) with two cases and their JPEGs."""
    folder = root / "MedThinkVQA"
    cases = []
    for c, (case, imgs) in enumerate(MED_MODALITIES.items()):
        row: dict[str, object] = {
            "title": f"Case number {case.removeprefix('case')}",
            "CLINICAL_HISTORY": "A 54-year-old with abdominal pain.",
            "image_count": len(imgs),
            "options": {
                "A": "Appendicitis",
                "B": "Diverticulitis",
                "C": "Colitis",
                "D": "Ileus",
                "E": "Volvulus",
            },
            "correct_answer": "B",
            "DIAGNOSIS": "Diverticulitis",
            "DISCUSSION": "Typical diverticulitis with pericolic fat stranding.",
            # the hub's ICD fields name the diagnosis
            "ICD Category": "Diseases of the digestive system",
            "ICD Block": "K57 Diverticular disease of intestine (diverticulitis)",
        }
        for n in range(1, 50):
            for part in ("id", "path", "caption", "modality", "sub_modality"):
                row[f"image_{n:02d}_{part}"] = None
        for n, (image_id, modality, sub) in enumerate(imgs, start=1):
            rel = f"images/{case}/{image_id}.jpg"
            write_jpg(folder / rel, _med_image(modality, 100 * c + n))
            row[f"image_{n:02d}_id"] = image_id
            row[f"image_{n:02d}_path"] = rel
            row[f"image_{n:02d}_caption"] = f"{modality}: findings of diverticulitis"
            row[f"image_{n:02d}_modality"] = modality
            row[f"image_{n:02d}_sub_modality"] = sub
        cases.append(row)
    ds = datasets.Dataset.from_list(cases)
    if fmt == "parquet":
        ds.to_parquet(str(folder / "test.parquet"))
    else:
        ds.to_json(str(folder / "test.jsonl"))
    return folder
