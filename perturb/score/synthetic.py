"""Synthetic paired predictions with a known robustness gap (tests, benchmarks, examples).

Kvasir-VQA-x1-like questions (real question classes, short answers) on ``n_images`` images.
Each image has its own difficulty (a random effect on the logit scale, which makes rows of one
image correlated: the reason the scorer resamples img_id clusters). A clean answer is correct
with probability ``expit(base_logit + image_effect)``; under a perturbation at severity ``s`` the
logit drops by ``drop_per_severity[op] * s``, and a perturbed answer is correct/wrong through a
latent variable shared with the clean answer (so clean and perturbed outcomes are positively
correlated, as for a real model). Wrong answers are other answers of the same class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TEMPLATES: list[tuple[str, str, list[str]]] = [
    ("How many polyps are in the image?", "polyp_count", ["0", "1", "2", "3"]),
    ("What color is the abnormality?", "abnormality_color", ["pink", "red", "white", "pink; red"]),
    (
        "Where in the image is the abnormality?",
        "abnormality_location",
        ["upper-left", "center", "lower-right", "center-left"],
    ),
    ("Is there text?", "text_presence", ["yes", "no"]),
    (
        "What type of procedure is the image taken from?",
        "procedure_type",
        ["colonoscopy", "gastroscopy"],
    ),
    ("Have all polyps been removed?", "polyp_removal_status", ["yes", "no", "not relevant"]),
    ("Are there any instruments in the image?", "instrument_presence", ["yes", "no"]),
    ("What type of polyp is present?", "polyp_type", ["paris is", "paris ip", "paris iia", "none"]),
    (
        "Where in the image is the anatomical landmark?",
        "landmark_location",
        ["center", "upper-center", "lower-left"],
    ),
    ("How many instruments are in the image?", "instrument_count", ["0", "1", "2"]),
    ("How many findings are present?", "finding_count", ["0", "1", "2", "3"]),
    ("What color is the anatomical landmark?", "landmark_color", ["pink", "white", "pink; white"]),
    ("Is there a green/black box artefact?", "box_artifact_presence", ["yes", "no"]),
    ("What is the size of the polyp?", "polyp_size", ["<5mm", "5-10mm", "11-20mm", "none"]),
    (
        "Are there any abnormalities in the image?",
        "abnormality_presence",
        ["polyp", "oesophagitis", "none"],
    ),
    (
        "Are there any anatomical landmarks in the image?",
        "landmark_presence",
        ["z-line", "pylorus", "cecum", "none"],
    ),
    (
        "Where in the image is the instrument?",
        "instrument_location",
        ["center-right", "lower-center", "none"],
    ),
    ("Are there any findings in the image?", "finding_presence", ["yes", "no"]),
]

_WORDS = [
    "the",
    "image",
    "shows",
    "a",
    "an",
    "of",
    "in",
    "with",
    "region",
    "mucosa",
    "visible",
    "there",
    "is",
    "are",
    "appears",
    "likely",
    "lesion",
    "polyp",
    "endoscopic",
    "view",
    "colon",
    "small",
    "large",
    "red",
    "pink",
    "area",
    "near",
    "center",
    "upper",
    "lower",
    "left",
    "right",
    "no",
    "evidence",
]

DEFAULT_RISK = {"gaussian_blur": ["may_erase_small_findings"], "color_shift": ["alters_color"]}


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def make_predictions(
    n_images: int = 40,
    questions_per_image: int = 4,
    perturbations: Mapping[str, float] | None = None,
    severities: Sequence[int] = (1, 2, 3, 4, 5),
    variants: int = 1,
    seed: int = 0,
    base_logit: float = 1.0,
    image_sd: float = 1.0,
    risk_tags: Mapping[str, Sequence[str]] | None = None,
    path_prefix: str = "/data/perturbed",
    free_text: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(clean, perturbed, manifest) tables; see the module docstring.

    ``perturbations`` maps op -> logit drop per severity level (default blur 0.25, colour 0.1).
    ``free_text`` wraps every answer in a generated sentence of random words (as generative VLMs
    answer), so nearly every prediction string is unique.
    Perturbed rows carry image paths ``{path_prefix}/{op}/s{sev}/v{variant}/{img_id}.png`` and no
    perturbation columns, so they must be matched through the manifest.
    """
    from scipy.special import ndtr

    rng = np.random.default_rng(seed)
    ops = dict(perturbations or {"gaussian_blur": 0.25, "color_shift": 0.1})
    tags = dict(risk_tags or DEFAULT_RISK)
    img_ids = np.array([f"img{i:06d}" for i in range(n_images)], dtype=object)
    effect = rng.normal(0.0, image_sd, n_images)
    qa = _questions(rng, n_images, questions_per_image)
    latent = rng.normal(size=len(qa.image))
    logit_clean = base_logit + effect[qa.image]
    # correct iff latent-based uniform < p; sharing the latent couples clean and perturbed
    clean_ok = ndtr(latent) < _expit(logit_clean)
    clean = pd.DataFrame(
        {
            "img_id": img_ids[qa.image],
            "question": qa.question,
            "answer": qa.reference,
            "prediction": _say(rng, np.where(clean_ok, qa.reference, qa.wrong), free_text),
            "question_class": [json.dumps([TEMPLATES[t][1]]) for t in qa.template],
            "complexity": 1 + (qa.template % 3),
        }
    )
    perturbed, manifest = [], []
    for op, drop in ops.items():
        for s in severities:
            for v in range(1, variants + 1):
                noise = rng.normal(0.0, 0.5, len(qa.image))
                ok = ndtr((latent + noise) / np.sqrt(1.25)) < _expit(logit_clean - drop * s)
                rel = [f"{op}/s{s}/v{v}/{img_ids[i]}.png" for i in range(n_images)]
                perturbed.append(
                    pd.DataFrame(
                        {
                            "img_id": img_ids[qa.image],
                            "question": qa.question,
                            "answer": qa.reference,
                            "prediction": _say(
                                rng, np.where(ok, qa.reference, qa.wrong), free_text
                            ),
                            "image": np.array(
                                [f"{path_prefix}/{rel[i]}" for i in qa.image], dtype=object
                            ),
                        }
                    )
                )
                manifest.append(_manifest_rows(img_ids, op, s, v, seed, tags.get(op, []), rel))
    return clean, pd.concat(perturbed, ignore_index=True), pd.concat(manifest, ignore_index=True)


@dataclass
class _QA:
    """One row per (image, question): its image index, template, question, answers."""

    image: np.ndarray
    template: np.ndarray
    question: np.ndarray
    reference: np.ndarray
    wrong: np.ndarray  # another answer of the same class


def _questions(rng: np.random.Generator, n_images: int, questions_per_image: int) -> _QA:
    """Distinct templates per image, a reference answer and a wrong one per row."""
    n_templates = len(TEMPLATES)
    if questions_per_image > n_templates:
        raise ValueError(f"questions_per_image must be <= {n_templates}")
    per_image = np.stack(
        [rng.permutation(n_templates)[:questions_per_image] for _ in range(n_images)]
    )
    template = per_image.reshape(-1)
    answers = [t[2] for t in TEMPLATES]
    answer_idx = np.array([rng.integers(0, len(answers[q])) for q in template])
    wrong = np.array(
        [
            answers[q][(a + 1 + rng.integers(0, len(answers[q]) - 1)) % len(answers[q])]
            for q, a in zip(template, answer_idx, strict=True)
        ],
        dtype=object,
    )
    return _QA(
        image=np.repeat(np.arange(n_images), questions_per_image),
        template=template,
        question=np.array([TEMPLATES[q][0] for q in template], dtype=object),
        reference=np.array(
            [answers[q][a] for q, a in zip(template, answer_idx, strict=True)], dtype=object
        ),
        wrong=wrong,
    )


def _say(rng: np.random.Generator, answers: np.ndarray, free_text: bool) -> np.ndarray:
    """The answers as given, or (``free_text``) each after a sentence of random words."""
    if not free_text:
        return answers
    lengths = rng.integers(3, 15, len(answers))
    words = rng.integers(0, len(_WORDS), (len(answers), 15))
    return np.array(
        [
            " ".join([*(_WORDS[j] for j in words[i, : lengths[i]]), "so", a])
            for i, a in enumerate(answers)
        ],
        dtype=object,
    )


def _manifest_rows(
    img_ids: np.ndarray,
    op: str,
    severity: int,
    variant: int,
    seed: int,
    risk_tags: Sequence[str],
    rel_paths: list[str],
) -> pd.DataFrame:
    """Manifest rows of one (op, severity, variant) output set."""
    return pd.DataFrame(
        {
            "img_id": img_ids,
            "suite": "synthetic",
            "op": op,
            "severity": severity,
            "variant": variant,
            "seed": seed,
            "key": [f"{i:016x}" for i in range(len(img_ids))],
            "params": "{}",
            "risk_tags": json.dumps(list(risk_tags)),
            "path": rel_paths,
            "sha256": "",
            "width": 64,
            "height": 64,
            "perturb_version": "0",
        }
    )
