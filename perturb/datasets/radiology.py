"""What the radiology VQA sets (VinDr-CXR-VQA, ReXVQA, MedThinkVQA) share: the question-class
vocabulary and keyword rules of the scorer's label-risk check, their label-risk mapping, the
shape of their registry entries (:func:`dataset_entry`) and the sample rules of image paths.
Pure Python: the scorer imports it without torch.

None of the three sets labels questions with the classes a perturbation can put at risk, so a
row's classes are the union of

* its dataset's own field, mapped by the dataset's room: VinDr-CXR-VQA ``type``
  (:data:`perturb.datasets.vindr_cxr_vqa.VINDR_TYPES`), ReXVQA ``task_name``
  (:data:`perturb.datasets.rexvqa.REXVQA_TASKS`, matched by keyword), MedThinkVQA rows are
  diagnosis questions (``diagnosis``); :func:`perturb.datasets.questions.question_classes`
  takes the union;
* keyword rules (:data:`KEYWORDS`, whole-word, case-insensitive) on the question text, the
  ReXVQA ``category`` and the option texts (so "Where is the effusion? A. Left base ..." is a
  laterality and costophrenic question too).

Vocabulary (:data:`QUESTION_CLASSES`):

=============== ===========================================================================
laterality      which side: left / right / bilateral / unilateral
location        where: lobe, zone, hilum, "where", "located"
apex            apices, apical, upper zones' tips (cut by collimation / crops)
costophrenic    costophrenic angles, blunting, lung bases (cut by collimation / crops)
marker          radiographic markers, burned-in text and labels
small_finding   nodules, calcification, granuloma, pneumothorax, fractures (subtle findings)
presence        is there / yes-no presence of a finding
finding         what / which finding
count           how many
size            size, measurement, enlargement, cardiomegaly, cardiothoracic ratio
negation        ReXVQA negation assessment
diagnosis       differential or most likely diagnosis
device          support devices and foreign bodies: tubes, lines, catheters, pacemakers, ECG
                leads, clips, "foreign body" (added by device and object overlays)
mediastinum     mediastinal shift or widening, tracheal deviation, midline structures (a rotated
                patient shifts them)
=============== ===========================================================================

The names carry no ``_location`` / ``_count`` / ``_presence`` suffix on purpose: the Kvasir
patterns of :data:`perturb.datasets.kvasir_vqa_x1.LABEL_RISK` (``*_location``, ...) stay
Kvasir's and the radiology risks (:data:`LABEL_RISK`) are listed class by class.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

from perturb.datasets._entry import DatasetEntry

QUESTION_CLASSES = (
    "laterality",
    "location",
    "apex",
    "costophrenic",
    "marker",
    "small_finding",
    "presence",
    "finding",
    "count",
    "size",
    "negation",
    "diagnosis",
    "device",
    "mediastinum",
)


def _words(*patterns: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(patterns) + r")\b", re.IGNORECASE)


KEYWORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("laterality", _words("left", "right", "bilateral", "unilateral", "laterality", "side")),
    (
        "location",
        _words(
            "where",
            "located",
            "location",
            "lobes?",
            "zones?",
            "hil(?:um|ar|a)",
            "perihilar",
            "retrocardiac",
            "lingula",
        ),
    ),
    ("apex", _words("ap(?:ex|ices)", "apical")),
    ("costophrenic", _words("costophrenic", "cp angles?", "blunt(?:ed|ing)?", "bases?", "basal")),
    ("marker", _words("markers?", "burned[- ]in", "text", "labels?", "annotations?")),
    (
        "small_finding",
        _words(
            "nodules?",
            "nodular",
            "micronodul\\w*",
            "calcifi\\w*",
            "granulomas?",
            "pneumothora(?:x|ces)",
            "fractures?",
        ),
    ),
    ("count", _words("how many", "number of")),
    (
        "size",
        _words(
            "size",
            "measure\\w*",
            "diameter",
            "enlarge\\w*",
            "cardiomegaly",
            "cardiothoracic",
            "ratio",
            "cm",
            "mm",
        ),
    ),
    ("diagnosis", _words("diagnos[ie]s", "most likely")),
    (
        "device",
        _words(
            "tubes?",
            "(?:central|venous|arterial|picc|midline|jugular|subclavian) lines?",
            "lines? (?:and|or) tubes?",
            "catheters?",
            "cvc",
            "picc",
            "ports?",
            "pacemakers?",
            "pacers?",
            "icd",
            "(?:pacing|pacemaker|ecg|ekg) leads?",
            "electrodes?",
            "ecg",
            "ekg",
            "drains?",
            "(?:support|medical) devices?",
            "devices?",
            "foreign bod(?:y|ies)",
            "wires?",
            "clips?",
            "sternotomy",
            "endotracheal",
            "nasogastric",
            "ett",
            "ng tube",
        ),
    ),
    (
        "mediastinum",
        _words(
            "mediastin\\w*",
            "trache\\w*",
            "midline",
            "shift(?:ed)?",
            "deviat\\w*",
            "rotat\\w*",
        ),
    ),
)


def norm_type(value: str) -> str:
    """A dataset's question-type label lower-cased, spaces and hyphens as underscores."""
    return re.sub(r"[\s\-]+", "_", value.strip().lower())


def keyword_classes(texts: Iterable[object]) -> set[str]:
    """The classes whose keyword rules (:data:`KEYWORDS`) match any of ``texts``."""
    blob = " \n ".join(str(t) for t in texts)
    return {cls for cls, pattern in KEYWORDS if pattern.search(blob)}


# risk tag -> radiology classes it puts at risk (see perturb.score.risk)
_EDGES = ("apex", "costophrenic")  # what leaves the frame at its edges
LABEL_RISK: dict[str, tuple[str, ...]] = {
    "moves_geometry": (*_EDGES, "size"),
    "crops_border": _EDGES,
    "occludes": ("marker",),
    "adds_overlay": ("marker",),
    "flips_laterality": ("laterality", "location"),
    "may_erase_small_findings": ("small_finding",),
    # devices drawn on the film answer "is there a tube / line / pacemaker"
    "adds_devices": ("device",),
    # a rotated patient: mediastinal shift, lucency asymmetry, positions, cardiothoracic ratio
    "alters_projection": ("mediastinum", "laterality", "location", "size"),
}


def dataset_entry(
    room: str,
    reader: str,
    *,
    name: str,
    title: str,
    modality: str,
    hub_id: str,
    sample_key: str,
    prediction_readers: Mapping[str, str] | None = None,
) -> DatasetEntry:
    """The registry entry of the radiology set of room (package) ``room``: the shared
    vocabulary and label risk, an adapter suites may name, ``<room>.adapter:open_<reader>``,
    and a native writer, ``<room>.native:write_<reader>``."""
    return DatasetEntry(
        name=name,
        title=title,
        modality=modality,
        hub_id=hub_id,
        opener=f"{room}.adapter:open_{reader}",
        question_classes=QUESTION_CLASSES,
        label_risk=LABEL_RISK,
        adapter=True,
        native_writer=f"{room}.native:write_{reader}",
        sample_key=sample_key,
        prediction_readers=dict(prediction_readers or {}),
    )


# ----------------------------------------------------------------------------- samples of images

_CASE = re.compile(r"^(case\d+)(?:_|$)", re.IGNORECASE)


def image_path_parts(path: str) -> list[str]:
    """The components of an image path, '/'-separated, with the file name's percent-encoding
    undone: ``perturb generate`` writes an img_id ``a/b/x`` as ``a%2Fb%2Fx.png``
    (:func:`perturb.generate.naming.safe_stem`), so clean and generated paths of one image end
    in the same components."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if parts and "%" in parts[-1]:
        parts[-1:] = [p for p in unquote(parts[-1]).split("/") if p not in ("", ".")]
    return parts


def study_folder(parts: list[str]) -> int | None:
    """Index of the ``studies`` folder of a DICOM-style image path (``.../studies/<uid>/...``,
    the uid a folder, not the file), or None: the study is ``parts[i:i + 2]``."""
    for i in range(len(parts) - 3, -1, -1):
        if parts[i] == "studies":
            return i
    return None


def sample_of_image_paths(paths: Iterable[str]) -> str | None:
    """The radiology sample of a row's image paths, the same for the dataset's own paths and
    for the outputs ``perturb generate`` wrote from them (any output folder and layout):
    ``studies/<uid>`` (ReXVQA / DICOM-style study folders) when every path names the same
    study, else the MedThinkVQA case ``caseN`` (the images' ``caseN`` folder, or a ``caseN_``
    file-name prefix: the adapter's img_id) when every path names the same case; else None."""
    found: set[str] = set()
    for path in paths:
        parts = image_path_parts(path)
        i = study_folder(parts)
        if i is not None:
            found.add(f"studies/{parts[i + 1]}")
            continue
        case = next((m.group(1) for p in parts[-2:] if (m := _CASE.match(p))), None)
        if case is None:
            return None
        found.add(case)
    return found.pop() if len(found) == 1 else None
