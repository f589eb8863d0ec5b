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
    rng = np.random.default_rng(seed)
    ops = dict(perturbations or {"gaussian_blur": 0.25, "color_shift": 0.1})
    tags = dict(risk_tags or DEFAULT_RISK)
    img_ids = np.array([f"img{i:06d}" for i in range(n_images)], dtype=object)
    effect = rng.normal(0.0, image_sd, n_images)
    nt = len(TEMPLATES)
    if questions_per_image > nt:
        raise ValueError(f"questions_per_image must be <= {nt}")
    q_of = np.stack([rng.permutation(nt)[:questions_per_image] for _ in range(n_images)])
    rows_img = np.repeat(np.arange(n_images), questions_per_image)
    rows_q = q_of.reshape(-1)
    n = len(rows_img)
    answers = [t[2] for t in TEMPLATES]
    ans_idx = np.array([rng.integers(0, len(answers[q])) for q in rows_q])
    ref = np.array([answers[q][a] for q, a in zip(rows_q, ans_idx, strict=True)], dtype=object)
    wrong = np.array(
        [
            answers[q][(a + 1 + rng.integers(0, len(answers[q]) - 1)) % len(answers[q])]
            for q, a in zip(rows_q, ans_idx, strict=True)
        ],
        dtype=object,
    )
    questions = np.array([TEMPLATES[q][0] for q in rows_q], dtype=object)
    classes = [[TEMPLATES[q][1]] for q in rows_q]
    latent = rng.normal(size=n)
    logit_clean = base_logit + effect[rows_img]
    # correct iff latent-based uniform < p; sharing the latent couples clean and perturbed
    from scipy.special import ndtr

    u = ndtr(latent)
    clean_ok = u < _expit(logit_clean)

    def say(ans: np.ndarray) -> np.ndarray:
        if not free_text:
            return ans
        k = rng.integers(3, 15, len(ans))
        w = rng.integers(0, len(_WORDS), (len(ans), 15))
        return np.array(
            [" ".join([*(_WORDS[j] for j in w[i, : k[i]]), "so", a]) for i, a in enumerate(ans)],
            dtype=object,
        )

    clean = pd.DataFrame(
        {
            "img_id": img_ids[rows_img],
            "question": questions,
            "answer": ref,
            "prediction": say(np.where(clean_ok, ref, wrong)),
            "question_class": [json.dumps(c) for c in classes],
            "complexity": 1 + (rows_q % 3),
        }
    )
    prows, mrows = [], []
    for op, drop in ops.items():
        for s in severities:
            for v in range(1, variants + 1):
                noise = rng.normal(0.0, 0.5, n)
                u2 = ndtr((latent + noise) / np.sqrt(1.25))
                ok = u2 < _expit(logit_clean - drop * s)
                rel = [f"{op}/s{s}/v{v}/{img_ids[i]}.png" for i in range(n_images)]
                paths = np.array([f"{path_prefix}/{rel[i]}" for i in rows_img], dtype=object)
                prows.append(
                    pd.DataFrame(
                        {
                            "img_id": img_ids[rows_img],
                            "question": questions,
                            "answer": ref,
                            "prediction": say(np.where(ok, ref, wrong)),
                            "image": paths,
                        }
                    )
                )
                mrows.append(
                    pd.DataFrame(
                        {
                            "img_id": img_ids,
                            "suite": "synthetic",
                            "op": op,
                            "severity": s,
                            "variant": v,
                            "seed": seed,
                            "key": [f"{i:016x}" for i in range(n_images)],
                            "params": "{}",
                            "risk_tags": json.dumps(list(tags.get(op, []))),
                            "path": rel,
                            "sha256": "",
                            "width": 64,
                            "height": 64,
                            "perturb_version": "0",
                        }
                    )
                )
    return clean, pd.concat(prows, ignore_index=True), pd.concat(mrows, ignore_index=True)
