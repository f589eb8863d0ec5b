"""The probe model: right on clean phantoms, wrong under strong perturbations, pixels only."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from perturb.datasets.phantoms import phantom_id
from perturb.datasets.phantoms.endoscopy import Phantom, atomic_questions, qa_rows, render
from perturb.probe import ProbeModel, classify, split_question

N_IMAGES = 24
# minimum accuracy on clean phantoms per question class (size classes sit on thresholds of
# the drawn radius before its random stretch, so they are the hardest)
CLEAN_THRESHOLDS: dict[str, float] = {
    "polyp_count": 0.9,
    "finding_count": 0.9,
    "abnormality_presence": 0.9,
    "finding_presence": 0.9,
    "abnormality_color": 0.9,
    "abnormality_location": 0.9,
    "polyp_type": 0.85,
    "polyp_size": 0.6,
    "polyp_removal_status": 0.9,
    "box_artifact_presence": 0.95,
    "text_presence": 0.95,
    "instrument_presence": 0.95,
    "instrument_count": 0.95,
    "procedure_type": 0.95,
    "landmark_presence": 0.95,
}


@pytest.fixture(scope="module")
def phantoms() -> list[Phantom]:
    return [render(phantom_id(i)) for i in range(N_IMAGES)]


def accuracy(images: list[np.ndarray], phantoms: list[Phantom]) -> dict[str, float]:
    model = ProbeModel()
    hits: dict[str, list[bool]] = defaultdict(list)
    for image, ph in zip(images, phantoms, strict=True):
        obs = model.observe(image)
        for question, answer, cls in atomic_questions(ph.truth):
            hits[cls].append(model.answer_observation(obs, question) == answer)
            hits["all"].append(hits[cls][-1])
    return {c: float(np.mean(v)) for c, v in hits.items()}


def test_clean_accuracy_per_class(phantoms: list[Phantom]) -> None:
    acc = accuracy([p.image for p in phantoms], phantoms)
    low = {c: acc[c] for c, t in CLEAN_THRESHOLDS.items() if acc[c] < t}
    assert not low, f"below threshold on clean phantoms: {low}"
    assert acc["all"] >= 0.95


def test_joined_questions_use_the_phantom_phrasing(phantoms: list[Phantom]) -> None:
    model = ProbeModel()
    rows = [r for i, p in enumerate(phantoms) for r in qa_rows(phantom_id(i), p.truth)]
    hits = []
    for r in rows:
        assert all(classify(q) is not None for q in split_question(r["question"]))
        pred = model.answer(phantoms[int(r["img_id"][-4:])].image, r["question"])
        hits.append(pred == r["answer"])
    by_complexity = {
        k: np.mean([h for h, r in zip(hits, rows, strict=True) if r["complexity"] == k])
        for k in (1, 2, 3)
    }
    assert min(by_complexity.values()) >= 0.85, by_complexity


def test_answers_come_from_pixels() -> None:
    model = ProbeModel()
    black = np.zeros((320, 400, 3), np.uint8)
    assert model.answer(black, "How many polyps are in the image?") == "0"
    assert model.answer(black, "Is there text?") == "no"
    assert model.answer(black, "What color is the abnormality?") == "none"
    assert model.answer(black, "Is there a green/black box artefact?") == "no"
    assert model.answer(black, "What is the weather?") == "unknown"
    ph = render("phantom_0000")
    blank_text = ph.image.copy()
    blank_text[: int(0.1 * 320), : int(0.55 * 400)] = 0
    if ph.truth.text is not None:
        assert model.answer(ph.image, "Is there text?") == "yes"
    assert model.answer(blank_text, "Is there text?") == "no"


@pytest.mark.parametrize(
    ("op", "classes", "drop", "class_drop", "mild_gap"),
    [
        # burned-in text is an overlay drawn after the optics: blur leaves it readable; blur and
        # noise act on the tissue layer only and are calibrated to field SSIM (issue 14): at
        # severity 5 they cost the probe a little less than before. gaussian_blur v4's severity 5
        # (a 13-15 px sigma at 1080p, was 26-29 px) blurs the polyp's outline enough to cost its
        # size estimate (0.90 -> 0.74) but no longer its count: 0.99 -> 0.97 over all questions
        ("gaussian_blur", ("polyp_size",), 0.02, 0.1, 0.02),
        # (gaussian_noise left out: since grain v3 noise is defined on a 448-cell sensor across
        # the field and integrated over each frame pixel, so on these 400x320 phantoms its s5
        # per-pixel sigma is what the sensor's noise becomes at 320 px, which the probe's
        # colour and size estimates average away (0.99 -> 0.98); its strength is held on real
        # frames by the calibration instead: field SSIM 0.60 at s5)
        ("hue_shift", ("polyp_count", "abnormality_color"), 0.1, 0.15, 0.05),
        ("saturation", ("abnormality_color",), 0.1, 0.15, 0.05),
        # specular_glare v8 puts clusters of small specks in wet patches (the real highlights'
        # sizes) instead of v3's long streaks over every facing surface, which the probe took for
        # extra polyps: over all questions 0.994 -> 0.967 at severity 5 (0.991 at severity 1),
        # polyp_count 1.0 -> 0.958, abnormality_location unchanged; polyp_type 1.0 -> 0.842
        # (specks on the polyp's dome). Even wet patches over the whole field (coverage 2.0-2.4)
        # only reach 0.946 overall: the specks, not their spread, are what the probe ignores
        ("specular_glare", ("polyp_type",), 0.02, 0.1, 0.02),
    ],
)
def test_degrades_at_severity_5(
    phantoms: list[Phantom], op: str, classes: tuple[str, ...], drop: float, class_drop: float, mild_gap: float
) -> None:
    import torch

    import perturb

    x = torch.from_numpy(np.stack([p.image for p in phantoms])).permute(0, 3, 1, 2).contiguous()
    keys = [phantom_id(i) for i in range(len(phantoms))]
    clean = accuracy([p.image for p in phantoms], phantoms)
    mild_x, _ = perturb.apply(x, op, 1, keys, seed=0)
    strong_x, _ = perturb.apply(x, op, 5, keys, seed=0)
    mild = accuracy(list(mild_x.permute(0, 2, 3, 1).numpy()), phantoms)
    strong = accuracy(list(strong_x.permute(0, 2, 3, 1).numpy()), phantoms)
    assert strong["all"] <= clean["all"] - drop, (clean["all"], strong["all"])
    assert mild["all"] >= strong["all"] + mild_gap, (mild["all"], strong["all"])
    for cls in classes:
        assert strong[cls] <= clean[cls] - class_drop, (cls, clean[cls], strong[cls])
