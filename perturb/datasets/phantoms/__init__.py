"""Built-in synthetic data, one more dataset: endoscopy-like phantoms in the Kvasir-VQA-x1
schema (:mod:`.endoscopy`) and chest X-ray phantoms in the VinDr-CXR-VQA schema (:mod:`.xray`),
with QA rows whose answers are known.

    from perturb.datasets.phantoms import builtin_dataset, phantom_image
    ds = builtin_dataset(n_images=8)      # datasets.Dataset in the Kvasir-VQA-x1 schema
    x = phantom_image("preview")          # CHW float32 in [0, 1]

Used by ``perturb generate`` without ``--dataset`` and by ``perturb preview`` without an image:
no network, no files. This module is light (the registry imports it); the renderers load on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perturb.datasets import kvasir_vqa_x1, radiology
from perturb.datasets._entry import DatasetEntry, merge_label_risk
from perturb.datasets.phantoms._sizes import BUILTIN_IMAGES, DEFAULT_SIZE

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    import torch

    from perturb.io.datasets import InputDataset


__all__ = [
    "BUILTIN_IMAGES",
    "DATASET",
    "DEFAULT_SIZE",
    "builtin_dataset",
    "builtin_rows",
    "open_builtin",
    "phantom_id",
    "phantom_image",
]

DATASET = DatasetEntry(
    name="phantoms",
    title="built-in phantoms",
    modality="any",  # endoscopy or xray, by the suite's data modality
    hub_id=None,
    opener="perturb.datasets.phantoms:open_builtin",
    question_classes=(*kvasir_vqa_x1.QUESTION_CLASSES, *radiology.QUESTION_CLASSES),
    label_risk=merge_label_risk(kvasir_vqa_x1.LABEL_RISK, radiology.LABEL_RISK),
    sample_key="img_id (phantom_NNNN / xray_NNNN)",
)


def phantom_id(index: int) -> str:
    return f"phantom_{index:04d}"


def phantom_image(key: str | int = 0, size: tuple[int, int] = DEFAULT_SIZE) -> torch.Tensor:
    """One phantom frame as a CHW float32 tensor in [0, 1]."""
    from perturb.datasets.phantoms.endoscopy import render
    from perturb.io.images import to_tensor

    return to_tensor(render(key, size).image)


def builtin_rows(
    n_images: int = BUILTIN_IMAGES, size: tuple[int, int] = DEFAULT_SIZE
) -> list[dict[str, Any]]:
    """QA rows of ``n_images`` phantoms in the Kvasir-VQA-x1 schema, each with its phantom's
    PNG as ``image`` = {"bytes", "path"} (the form of an HF ``Image`` cell)."""
    from perturb.datasets.phantoms._rows import phantom_rows
    from perturb.datasets.phantoms.endoscopy import qa_rows, render

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


def open_builtin(
    builtin_images: int | None = None,
    modality: str = "endoscopy",
    *,
    image_column: str | None = None,
    id_column: str = "img_id",
    id_from: str = "stem",
) -> InputDataset:
    """The built-in sample of ``modality`` (endoscopy or xray) as a run's input."""
    from perturb.io.datasets import _quiet, input_from_dataset

    if modality == "xray":
        from perturb.datasets.phantoms.xray import builtin_xray_input

        return builtin_xray_input(builtin_images)
    n = BUILTIN_IMAGES if builtin_images is None else builtin_images
    with _quiet():
        ds = builtin_dataset(n)
    return input_from_dataset(
        ds,
        "built-in phantoms",
        f"builtin:{n}",
        None,
        image_column=image_column,
        id_column=id_column,
        id_from=id_from,
    )
