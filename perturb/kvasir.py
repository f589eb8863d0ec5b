"""Facts about Kvasir-VQA-x1 (arXiv 2506.09958) shared by the phantoms and the scorer.

Pure Python: the scorer imports it without torch.
"""

from __future__ import annotations

QUESTION_CLASSES = (
    "procedure_type",
    "text_presence",
    "polyp_removal_status",
    "box_artifact_presence",
    "instrument_count",
    "finding_count",
    "polyp_type",
    "polyp_size",
    "instrument_location",
    "instrument_presence",
    "abnormality_location",
    "polyp_count",
    "abnormality_color",
    "abnormality_presence",
    "landmark_location",
    "landmark_presence",
    "finding_presence",
    "landmark_color",
)
