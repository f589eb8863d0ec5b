"""Kvasir-VQA-x1 (arXiv 2506.09958): GI endoscopy images with QA rows in 18 question classes.

Pure Python (the scorer imports it without torch). The set is read by the generic table
opener (hub id, ``save_to_disk`` folder, parquet/JSONL); its rows already carry
``question_class`` and ``complexity``. Its composite, the track-2 transform (crop, rotation,
colour jitter), is :mod:`perturb.datasets.kvasir_vqa_x1.transform` (torch: imported on use).
"""

from __future__ import annotations

from perturb.datasets._entry import DatasetEntry

HUB_ID = "SimulaMet/Kvasir-VQA-x1"

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

_GEOMETRY = ("*_location", "*_count", "text_presence", "box_artifact_presence", "polyp_size")

# risk tag -> the question classes (fnmatch patterns) whose answer the tagged op may change
LABEL_RISK: dict[str, tuple[str, ...]] = {
    "alters_color": ("abnormality_color", "landmark_color", "*_color"),
    "moves_geometry": _GEOMETRY,
    "crops_border": _GEOMETRY,
    "black_fill": ("box_artifact_presence",),
    "occludes": ("*_presence",),
    "adds_overlay": ("*_presence",),
    "flips_laterality": ("*_location",),
    # blur / heavy noise can wipe out small polyps: counts and finding presence may change
    "may_erase_small_findings": (
        "finding_count",
        "polyp_count",
        "abnormality_presence",
        "finding_presence",
    ),
    # brightness / contrast changes leave Kvasir's answers intact
    "alters_intensity": (),
}

DATASET = DatasetEntry(
    name="kvasir-vqa-x1",
    title="Kvasir-VQA-x1",
    modality="endoscopy",
    hub_id=HUB_ID,
    opener="perturb.io.datasets:open_input",
    question_classes=QUESTION_CLASSES,
    label_risk=LABEL_RISK,
    sample_key="img_id (one image per sample)",
    composites={"kvasir_transformed": "perturb.datasets.kvasir_vqa_x1.transform"},
    licence=(
        "cc-by-nc-4.0",
        "Kvasir-VQA-x1 (Gautam et al., arXiv 2506.09958), SimulaMet; images from HyperKvasir "
        "and Kvasir-Instrument",
    ),
)
