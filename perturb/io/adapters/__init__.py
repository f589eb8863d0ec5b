"""Adapters for radiology VQA datasets: each turns a dataset (a hub id, or a local copy in the
hub's schema) into image-level rows that ``perturb generate`` runs like any input.

    from perturb.io.adapters import open_adapter
    inp = open_adapter("rexvqa", "rexvqa/test_vqa_data.json", images="ReXGradient-160K/")

Every adapter returns a ``perturb.io.datasets.InputDataset`` whose rows carry

* ``img_id``: one image (the manifest's key); ``image_path``: its file;
* ``sample_key``: the sample the image belongs to (VinDr image, ReXVQA study, MedThinkVQA
  case): the generator draws scalar parameters from it, so a sample's images share them;
* ``view`` / ``n_views``: the image's position in its sample and the sample's image count;
* ``modality``: the catalog modality (``xray``, ``ct``, ``mri``, ``ultrasound``, ``pathology``,
  ``photo``, ``endoscopy`` or ``any``) for suites with ``modality: from_image``;
* the dataset's question fields, less those that give the answer away (unless
  ``keep_leaking_fields``).

Suites name their adapter in an ``input:`` section (``adapter``, ``images``); ``perturb
generate --dataset SRC --images DIR`` supplies the source and the image folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from perturb.io.adapters._common import (
    IMAGE_PATH,
    MODALITY,
    N_VIEWS,
    SAMPLE_KEY,
    VIEW,
    normalize_modality,
)
from perturb.io.adapters.medthinkvqa import open_medthinkvqa
from perturb.io.adapters.rexvqa import open_rexvqa
from perturb.io.adapters.vindr import open_vindr
from perturb.io.datasets import DatasetError, InputDataset

ADAPTERS: dict[str, Callable[..., InputDataset]] = {
    "vindr-cxr-vqa": open_vindr,
    "rexvqa": open_rexvqa,
    "medthinkvqa": open_medthinkvqa,
}


def open_adapter(
    name: str,
    source: str | os.PathLike[str] | None = None,
    *,
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    keep_leaking_fields: bool = False,
    min_visible: float = 0.5,
) -> InputDataset:
    """Open ``source`` (default: the dataset's hub id) with the adapter ``name``."""
    if name not in ADAPTERS:
        raise DatasetError(f"unknown adapter {name!r}; known: {', '.join(sorted(ADAPTERS))}")
    return ADAPTERS[name](
        source,
        images=images,
        split=split,
        keep_leaking_fields=keep_leaking_fields,
        min_visible=min_visible,
    )


__all__ = [
    "ADAPTERS",
    "IMAGE_PATH",
    "MODALITY",
    "N_VIEWS",
    "SAMPLE_KEY",
    "VIEW",
    "normalize_modality",
    "open_adapter",
    "open_medthinkvqa",
    "open_rexvqa",
    "open_vindr",
]
