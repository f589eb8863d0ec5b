"""VinDr-CXR-VQA (HF ``Dangindev/VinDR-CXR-VQA``): chest X-ray questions with loc-tag boxes.

Pure Python (the scorer imports it without torch). The input adapter is
:mod:`perturb.datasets.vindr_cxr_vqa.adapter` (schema there), the prediction files' nested
image objects are read by :mod:`perturb.datasets.vindr_cxr_vqa.reader` (the entry's
``prediction_readers``; helpers in ``.predictions``).
"""

from __future__ import annotations

from perturb.datasets import radiology

HUB_ID = "Dangindev/VinDR-CXR-VQA"

# item ``type`` (lower-cased, spaces and hyphens as underscores) -> question classes
VINDR_TYPES: dict[str, tuple[str, ...]] = {
    "where": ("location",),
    "what": ("finding",),
    "which": ("finding",),
    "is_there": ("presence",),
    "yes_no": ("presence",),
    "how_many": ("count",),
}


def type_classes(vindr_type: str) -> tuple[str, ...]:
    """The question classes of an item ``type`` (Where, Is_there, How many, ...)."""
    return VINDR_TYPES.get(radiology.norm_type(vindr_type), ())


DATASET = radiology.dataset_entry(
    __name__,
    "vindr",
    name="vindr-cxr-vqa",
    title="VinDr-CXR-VQA",
    modality="xray",
    hub_id=HUB_ID,
    prediction_readers={"vindr-cxr-vqa": f"{__name__}.reader:read_image_objects"},
    sample_key="image_id (one image per sample); question identity image_id#qa_idx",
)
