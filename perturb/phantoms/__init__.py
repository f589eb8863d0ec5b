"""Built-in synthetic data: endoscopy-like phantoms with QA rows whose answers are known.

    from perturb.phantoms import builtin_dataset, phantom_image
    ds = builtin_dataset(n_images=8)      # datasets.Dataset in the Kvasir-VQA-x1 schema
    x = phantom_image("preview")          # CHW float32 in [0, 1]

Used by ``perturb generate`` without ``--dataset`` and by ``perturb preview`` without an image:
no network, no files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perturb.phantoms.endoscopy import (
    DEFAULT_SIZE,
    QUESTION_CLASSES,
    Phantom,
    Truth,
    qa_rows,
    render,
)

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    import torch

BUILTIN_IMAGES = 16

__all__ = [
    "BUILTIN_IMAGES",
    "DEFAULT_SIZE",
    "QUESTION_CLASSES",
    "Phantom",
    "Truth",
    "builtin_dataset",
    "builtin_rows",
    "phantom_id",
    "phantom_image",
    "qa_rows",
    "render",
]


def phantom_id(index: int) -> str:
    return f"phantom_{index:04d}"


def phantom_image(key: str | int = 0, size: tuple[int, int] = DEFAULT_SIZE) -> torch.Tensor:
    """One phantom frame as a CHW float32 tensor in [0, 1]."""
    from perturb.io.images import to_tensor

    return to_tensor(render(key, size).image)


def builtin_rows(
    n_images: int = BUILTIN_IMAGES, size: tuple[int, int] = DEFAULT_SIZE
) -> list[dict[str, Any]]:
    """QA rows of ``n_images`` phantoms in the Kvasir-VQA-x1 schema, each with its phantom's
    PNG as ``image`` = {"bytes", "path"} (the form of an HF ``Image`` cell)."""
    from perturb.phantoms._rows import phantom_rows

    ids = [phantom_id(i) for i in range(n_images)]
    return phantom_rows(ids, lambda img_id: render(img_id, size), qa_rows)


def builtin_dataset(
    n_images: int = BUILTIN_IMAGES, size: tuple[int, int] = DEFAULT_SIZE
) -> datasets.Dataset:
    """The built-in sample as a ``datasets.Dataset`` in the Kvasir-VQA-x1 schema (image,
    img_id, complexity, question, answer, original, question_class); six QA rows per image."""
    import datasets

    features = datasets.Features(
        {
            "image": datasets.Image(),
            "img_id": datasets.Value("string"),
            "complexity": datasets.Value("int64"),
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "original": datasets.Value("string"),
            "question_class": datasets.Sequence(datasets.Value("string")),
        }
    )
    rows = builtin_rows(n_images, size)
    columns = {name: [r[name] for r in rows] for name in features}
    return datasets.Dataset.from_dict(columns, features=features)
