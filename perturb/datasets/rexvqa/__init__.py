"""ReXVQA (HF ``rajpurkarlab/ReXVQA``): chest X-ray MCQ over studies of several views.

Pure Python (the scorer imports it without torch). The input adapter (schema, study keys) is
:mod:`perturb.datasets.rexvqa.adapter`.
"""

from __future__ import annotations

from perturb.datasets import radiology

HUB_ID = "rajpurkarlab/ReXVQA"

# ``task_name``: (keyword, class), matched case-insensitively anywhere in the name
REXVQA_TASKS: tuple[tuple[str, str], ...] = (
    ("presence", "presence"),
    ("locat", "location"),
    ("negat", "negation"),
    ("differential", "diagnosis"),
    ("diagnos", "diagnosis"),
    ("geometr", "size"),
)


def task_classes(task_name: str) -> set[str]:
    """The question classes of a ``task_name``."""
    low = task_name.lower()
    return {cls for key, cls in REXVQA_TASKS if key in low}


DATASET = radiology.dataset_entry(
    __name__,
    "rexvqa",
    name="rexvqa",
    title="ReXVQA",
    modality="xray",
    hub_id=HUB_ID,
    sample_key="the study (study field, studies/<uid> folder, shared folder, else question id)",
)
