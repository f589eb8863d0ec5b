"""MedThinkVQA (HF ``bio-nlp-umass/MedThinkVQA``): multi-image, multi-modality diagnosis MCQ.

Pure Python (the scorer imports it without torch). The input adapter (schema, case ids) is
:mod:`perturb.datasets.medthinkvqa.adapter`; rows of its prediction files (``image_NN_path``
slots) are read by :mod:`perturb.datasets.medthinkvqa.reader` (the entry's
``prediction_readers``; helpers in ``.predictions``).
"""

from __future__ import annotations

from perturb.datasets import radiology

HUB_ID = "bio-nlp-umass/MedThinkVQA"
BASE_CLASSES = ("diagnosis",)  # every row is a diagnosis question

DATASET = radiology.dataset_entry(
    __name__,
    "medthinkvqa",
    name="medthinkvqa",
    title="MedThinkVQA",
    modality="any",
    hub_id=HUB_ID,
    prediction_readers={"medthinkvqa": f"{__name__}.reader:read_slot_rows"},
    sample_key="the case (caseN): sample and question",
)
